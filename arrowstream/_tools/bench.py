"""``arrowstream bench``: a loader's throughput on your data against the raw pyarrow loop.

1. The raw loop: pyarrow's own reader, file after file in this process (Parquet
   ``iter_batches``, ORC stripes, IPC record batches; an Iceberg table's ``scan`` batch reader),
   each batch converted to tensors the way the loader does for numeric and fixed-size list
   columns (other columns to Python lists). No shuffling, no workers: the speed of decoding.
2. The loader: one epoch with the given ``--num-workers`` and options, a progress bar while it
   runs, and its metrics (:meth:`ArrowStreamDataLoader.metrics`) sampled every ``--sample-every``
   seconds, which ``--plot`` draws: each worker's throughput and idle share over time.

Both loops read the same rows and touch every batch. The report ends with the ratio and the
per-worker table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch

from .cli_args import check_plot
from .inspect import open_dataset

if TYPE_CHECKING:
    from .._loader.dataset import ArrowStreamDataLoader
    from ..dataset import StructuredDataset


def _numeric(type_: pa.DataType) -> bool:
    return bool(pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_))


def raw_convert(batch: pa.RecordBatch) -> dict[str, Any]:
    """Numeric columns to tensors, fixed-size lists of numbers to 2-D tensors, the rest to lists."""
    out: dict[str, Any] = {}
    for field, column in zip(batch.schema, batch.columns):
        if _numeric(field.type) and column.null_count == 0:
            out[field.name] = torch.from_numpy(column.to_numpy(zero_copy_only=False))
        elif pa.types.is_fixed_size_list(field.type) and _numeric(field.type.value_type) and column.null_count == 0:
            values = column.flatten().to_numpy(zero_copy_only=False)
            out[field.name] = torch.from_numpy(values.reshape(len(column), field.type.list_size))
        else:
            out[field.name] = column.to_pylist()
    return out


def raw_batches(dataset: StructuredDataset, batch_size: int) -> Iterator[pa.RecordBatch]:
    """The rows of ``dataset`` through its source's own readers: files one after the other through each
    format's ``baseline_batches``, an Iceberg table through pyiceberg's scan of the pinned snapshot."""
    yield from dataset.baseline_batches(batch_size)


TEXT_BAR_SECONDS = 30.0   # a progress line in a log at least this often


def progress_bar(total: int | None, label: str, quiet: bool = False) -> Any:
    """A tqdm bar on stderr when it is a terminal; else (piped to a log, tqdm missing) plain lines every
    tenth of the way, since a bar redrawn with carriage returns is one endless line in a file; nothing
    when ``quiet``."""
    if quiet:
        return _TextBar(total, label, quiet=True)
    if not _is_terminal(sys.stderr):
        return _TextBar(total, label)
    try:
        from tqdm import tqdm
    except ImportError:  # the cli extra is not installed: a line every tenth of the way
        return _TextBar(total, label)
    return tqdm(total=total, desc=label, unit=" batches", file=sys.stderr, dynamic_ncols=True, leave=True)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):   # no isatty, or closed
        return False


class _TextBar:
    """What a progress bar says, as a line on stderr every tenth of ``total`` (every 1,000 batches without
    one) or every :data:`TEXT_BAR_SECONDS`, whichever comes first, and the last count at the end."""

    def __init__(self, total: int | None, label: str, quiet: bool = False) -> None:
        self.total, self.label, self.quiet = total, label, quiet
        self.count, self.postfix, self._printed = 0, "", 0
        self._every = max(total // 10, 1) if total else 1000
        self._last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.count += n
        if self.count % self._every == 0 or time.monotonic() - self._last >= TEXT_BAR_SECONDS:
            self._print()

    def _print(self) -> None:
        if not self.quiet:
            of = f"/{self.total}" if self.total else ""
            print(f"{self.label}: {self.count}{of} batches {self.postfix}".rstrip(), file=sys.stderr, flush=True)
        self._printed, self._last = self.count, time.monotonic()

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def close(self) -> None:
        if self.count != self._printed:
            self._print()


def _rows_of(batch: Any) -> int:
    if isinstance(batch, pa.RecordBatch):
        return int(batch.num_rows)
    first = next(iter(batch.values()))
    return len(first)


def time_raw(dataset: StructuredDataset, batch_size: int, quiet: bool) -> dict[str, Any]:
    bar = progress_bar(None, "pyarrow", quiet)
    rows, batches, began = 0, 0, time.perf_counter()
    for record in raw_batches(dataset, batch_size):
        converted = raw_convert(record)
        rows += _rows_of(converted)
        batches += 1
        bar.update()
    seconds = time.perf_counter() - began
    bar.close()
    return {"rows": rows, "batches": batches, "seconds": seconds, "rows_per_s": rows / seconds if seconds else 0.0}


SAMPLES_PER_EPOCH = 100     # metrics samples a plot gets over an epoch of known length
DEFAULT_SAMPLE_S = 0.1      # seconds between samples when the epoch's length is unknown (a filter)


def sample_step(total: int | None, num_workers: int) -> int:
    """Batches between metrics samples, for about :data:`SAMPLES_PER_EPOCH` samples over an epoch of
    ``total`` batches: a multiple of the workers, so that each interval holds the same number of
    batches of every worker (workers take turns) and the plot shows rates, not turns."""
    turn = max(num_workers, 1)
    if not total:
        return turn
    return turn * max(total // (SAMPLES_PER_EPOCH * turn), 1)


def time_loader(loader: ArrowStreamDataLoader, dataset: StructuredDataset, sample_every: float | None, quiet: bool) -> dict[str, Any]:
    """One epoch of ``loader``, its metrics sampled every ``sample_every`` seconds or, when None, every
    :func:`sample_step` batches (every :data:`DEFAULT_SAMPLE_S` seconds when the length is unknown)."""
    dataset.set_epoch(0)
    try:
        total: int | None = len(loader)
    except TypeError:  # a filter: unknown before reading
        total = None
    if sample_every is None and total is None:
        sample_every = DEFAULT_SAMPLE_S
    step = sample_step(total, loader.num_workers) if sample_every is None else 0
    bar = progress_bar(total, "arrowstream", quiet)
    samples: list[dict[str, Any]] = []
    rows, batches, began = 0, 0, time.perf_counter()
    next_sample = began
    first_s, first_rows = 0.0, 0
    for batch in loader:
        rows += _rows_of(batch)
        batches += 1
        bar.update()
        now = time.perf_counter()
        if batches == 1:
            first_s, first_rows = now - began, rows
        due = (batches == 1 or batches % step == 0) if step else now >= next_sample
        if due:
            samples.append({"t": now - began, "batches": batches, "metrics": loader.metrics()})
            bar.set_postfix_str(f"{rows / max(now - began, 1e-9):,.0f} rows/s")
            if sample_every is not None:
                next_sample = now + sample_every
    seconds = time.perf_counter() - began
    bar.close()
    final = loader.metrics()
    if len(samples) > 1 and _too_close(samples[-1], seconds, batches, sample_every):
        samples.pop()  # too short an interval to make a rate of
    samples.append({"t": seconds, "batches": batches, "metrics": final})
    steady = (rows - first_rows) / (seconds - first_s) if seconds > first_s else 0.0
    return {"rows": rows, "batches": batches, "seconds": seconds, "rows_per_s": rows / seconds if seconds else 0.0,
            "first_batch_s": first_s, "rows_per_s_after_first": steady, "metrics": final, "samples": samples}


def _too_close(last: dict[str, Any], seconds: float, batches: int, sample_every: float | None) -> bool:
    """Whether the last sample leaves too short an interval before the final one."""
    if sample_every is None:
        return bool(last["batches"] == batches)
    return bool(seconds - last["t"] < sample_every / 2)


def worker_table(metrics: dict[str, Any]) -> str:
    """One line per worker; a ``leases`` column when the workers took leases (``assignment="dynamic"``)."""
    leased = any(w["leases"] for w in metrics["workers"])
    lines = ["worker      rows  batches  splits      MiB  read s  convert s  idle s  busy  rows/s"
             + ("  leases" if leased else "")]
    for w in metrics["workers"]:
        lines.append(f"{w['worker']:>6}  {w['rows']:>8,}  {w['batches']:>7,}  {w['splits_done']:>6,}  "
                     f"{w['bytes'] / 2**20:>7.1f}  {w['read_s']:>6.2f}  {w['convert_s']:>9.2f}  {w['idle_s']:>6.2f}  "
                     f"{w['utilization']:>4.0%}  {w['rows_per_s']:>6,.0f}" + (f"  {w['leases']:>6,}" if leased else ""))
    return "\n".join(lines)


def series(samples: list[dict[str, Any]]) -> dict[int, dict[str, list[float]]]:
    """Per worker: sample times, rows/s and idle share over each interval between samples."""
    out: dict[int, dict[str, list[float]]] = {}
    for before, after in itertools.pairwise(samples):
        span = after["t"] - before["t"]
        if span <= 0:
            continue
        for old, new in zip(before["metrics"]["workers"], after["metrics"]["workers"]):
            line = out.setdefault(new["worker"], {"t": [], "rows_per_s": [], "idle_share": []})
            line["t"].append(after["t"])
            line["rows_per_s"].append((new["rows"] - old["rows"]) / span)
            idle, busy = new["idle_s"] - old["idle_s"], (new["read_s"] + new["convert_s"]) - (
                old["read_s"] + old["convert_s"])
            line["idle_share"].append(idle / (idle + busy) if idle + busy > 0 else float("nan"))
    return out


MIN_MOVING_INTERVALS = 5   # intervals in which each worker's rows moved, for its line to show a rate over time


def plot_note(samples: list[dict[str, Any]], seconds: float) -> str | None:
    """Why the plot shows little (a short epoch: zeros between bursts) and what to do, or None when each
    worker's rows moved in at least :data:`MIN_MOVING_INTERVALS` of the sampled intervals."""
    lines = series(samples)
    moving = min((sum(rate > 0 for rate in line["rows_per_s"]) for line in lines.values()), default=0)
    if moving >= MIN_MOVING_INTERVALS:
        return None
    intervals = max((len(line["rows_per_s"]) for line in lines.values()), default=0)
    return (f"the plot has little to show: the epoch took {seconds:.2f} s and a worker's rows moved in only "
            f"{moving} of {intervals} sampled intervals (workers read ahead of the loop and count rows as they read "
            "them, a row group at a time), so its line is zeros between bursts, not a rate; bench a longer epoch "
            "(more data: seconds per worker, not fractions of one), or sample less often with --sample-every SECONDS")


def plot(samples: list[dict[str, Any]], path: str, title: str, note: str | None = None) -> None:
    """Two panels over the epoch: each worker's rows/s, and the share of its time spent idle; ``note`` (what
    :func:`plot_note` says) is written under them."""
    check_plot(path)
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = series(samples)
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.8 if note else 6), sharex=True)
    for worker, line in sorted(lines.items()):
        top.plot(line["t"], line["rows_per_s"], marker=".", label=f"worker {worker}")
        bottom.plot(line["t"], np.array(line["idle_share"]) * 100, marker=".", label=f"worker {worker}")
    top.set_ylabel("rows/s")
    top.set_title(title)
    top.legend(loc="best")
    top.grid(alpha=0.3)
    bottom.set_ylabel("idle, % of the worker's time")
    bottom.set_ylim(-5, 105)
    bottom.set_xlabel("seconds since the loader was started")
    bottom.grid(alpha=0.3)
    if note:
        figure.text(0.01, 0.01, textwrap.fill(f"Note: {note}", 130), fontsize=8, color="tab:red", va="bottom")
        figure.tight_layout(rect=(0, 0.09, 1, 1))
    else:
        figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def run(args: argparse.Namespace) -> int:
    import warnings

    from .._loader.dataset import ArrowStreamDataLoader
    from .._worker.convert import passthrough_collate

    # pyarrow's buffers are read-only; neither loop writes to the tensors it makes
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

    dataset = open_dataset(args, shuffle=args.shuffle, seed=args.seed, assignment=args.assignment)
    raw = time_raw(dataset, args.batch_size, args.quiet)
    extra: dict[str, Any] = {}
    if args.num_workers > 0:
        extra["persistent_workers"] = False
    if args.num_workers > 0 and not dataset.policy.in_order:   # as create_dataloader: batches as they are ready
        extra["in_order"] = False
    loader = ArrowStreamDataLoader(dataset, batch_size=None, num_workers=args.num_workers,
                                   collate_fn=passthrough_collate, **extra)
    ours = time_loader(loader, dataset, args.sample_every, args.quiet)
    ratio = ours["rows_per_s"] / raw["rows_per_s"] if raw["rows_per_s"] else 0.0
    note = plot_note(ours["samples"], ours["seconds"]) if args.plot else None
    if args.plot:
        plot(ours["samples"], args.plot,
             f"arrowstream, {args.num_workers} workers, batch_size={args.batch_size}: {ours['rows_per_s']:,.0f} rows/s",
             note)
    if note and args.json:   # stdout is the JSON
        print(f"arrowstream: note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps({"raw": raw, "arrowstream": {k: v for k, v in ours.items() if k != "samples"},
                          "ratio": ratio, "samples": ours["samples"]}))
        return 0
    print(f"pyarrow loop:  {raw['rows']:,} rows in {raw['seconds']:.2f} s = {raw['rows_per_s']:,.0f} rows/s")
    print(f"arrowstream:   {ours['rows']:,} rows in {ours['seconds']:.2f} s = {ours['rows_per_s']:,.0f} rows/s "
          f"({args.num_workers} workers, shuffle={args.shuffle}, assignment={args.assignment})")
    print(f"               first batch after {ours['first_batch_s']:.2f} s (workers starting, first reads); "
          f"after it {ours['rows_per_s_after_first']:,.0f} rows/s")
    print(f"ratio:         {ratio:.2f}x the pyarrow loop over the whole epoch")
    print(f"tail:          {ours['metrics']['tail_s']:.2f} s from the first worker's last batch to the last one's")
    print()
    print(worker_table(ours["metrics"]))
    if args.plot:
        print(f"\nplot written to {args.plot}" + (f"\nnote: {note}" if note else ""))
    return 0
