"""Record-level shuffle buffer and interleave: throughput, memory and shuffle quality.

Run from the repository root:

    .venv/bin/python benchmarks/bench_shuffle.py           # the real run (about 2 min on 2 cores)
    .venv/bin/python benchmarks/bench_shuffle.py --quick   # smoke run (about 30 s), prints only

The tables come from the suite's generator (``suite/tables.py``), written into ``benchmarks/data/``
(git-ignored) and reused by later runs. Every arrowstream read uses ``shuffle=True, seed=0``, epoch 0.

1. Throughput: one epoch of the numeric table (2,000,000 rows) through ``create_dataloader(
   output_format="torch", batch_size=1024)``, ``num_workers`` 0 and 2, ``shuffle_buffer_size``
   0 / 10,000 / 100,000, ``interleave`` 1 / 4, and the suite's raw pyarrow loop
   (``suite/baselines.py``), in this process. Rounds run every configuration once (rotating the
   order), after an untimed warm-up round; medians of ``--repeats`` rounds.
2. Memory: peak RSS (``ru_maxrss``) of one epoch with ``num_workers=0``, each configuration in a
   fresh process, buffers of 0 to 1,000,000 rows, on the numeric and the mixed table.
3. Quality: a 1,000,000-row table whose ``id`` is the row's file position (10 files, so that each
   of the 100 row groups holds exactly 10,000 rows and ``id // 10,000`` is the row group), read by
   ``StructuredDataset(output_format="numpy", columns=["id"])``; displacement and per-batch spread
   over the first and the last tenth of the epoch, next to a random permutation (``default_rng(0)``).

The report goes to stdout and to ``benchmarks/results/<date>-shuffle.md`` (``--out`` to change;
``--quick`` writes a file only with ``--out``); progress goes to stderr.

``--default`` measures the default instead (``shuffle=True`` with ``shuffle_buffer_size`` left out, a buffer
sized by memory), against split order only (``shuffle_buffer_size=0``), in a smaller run (about 5 min):
quality on the sorted numeric table and on a sorted mixed table of the same shape; throughput of a
1,000,000-row numeric table with ``num_workers`` 0 and 2 against the raw pyarrow loop; peak RSS with
``num_workers=0``. Report: ``benchmarks/results/<date>-default-shuffle.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_suite import RESULTS, arrowstream_commit, loadavg, main_versions
from suite import runner, tables
from suite.baselines import raw_batches
from suite.common import log, run_main, time_epoch
from suite.ours import source_hash
from suite.report import fmt_ms, fmt_ratio, fmt_rps, machine, table_line

from arrowstream import StructuredDataset

BATCH = 1024
RAW = "raw pyarrow loop"
LOGS = tables.DATA_ROOT / "shuffle-work" / "logs"
# A process's ru_maxrss starts at the peak RSS of the process it was exec'd from (Linux keeps the
# replaced memory's high-water mark), here this big one: a bare python forks the measured process.
LAUNCHER = [sys.executable, "-S", "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"]
QUALITY_SPEC = tables.TableSpec("numeric", 1_000_000, 10, 10_000, 0)
QUALITY_ORDERS = [(0, 1), (1_000, 1), (10_000, 1), (100_000, 1), (0, 4), (10_000, 4), (100_000, 4)]
PERFECT = "perfect shuffle (random permutation)"


@dataclass(frozen=True)
class Config:
    """One arrowstream read: workers, shuffle buffer (rows), splits open at a time."""

    num_workers: int
    buffer: int | None   # None: left out, the default buffer sized by memory
    interleave: int

    def loader(self, files: list[str]) -> Iterator[Any]:
        loader, dataset = StructuredDataset.create_dataloader(
            path=files, batch_size=BATCH, num_workers=self.num_workers, output_format="torch", shuffle=True,
            seed=0, shuffle_buffer_size=self.buffer, interleave=self.interleave, plan_cache=False)
        dataset.set_epoch(0)
        return iter(loader)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 200,000 rows, 1 repeat, prints only")
    parser.add_argument("--repeats", type=int, default=None, help="rounds of parts 1 and 2 (default 3; 1 quick)")
    parser.add_argument("--out", type=Path, default=None, help="report path (default results/<date>-shuffle.md)")
    parser.add_argument("--default", action="store_true",
                        help="measure the default buffer (shuffle_buffer_size left out) against split order only")
    parser.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)  # internal: one memory measurement
    args = parser.parse_args()
    args.rows = 200_000 if args.quick else (1_000_000 if args.default else 2_000_000)
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.out is None and not args.quick:
        args.out = RESULTS / f"{dt.date.today().isoformat()}-{'default-shuffle' if args.default else 'shuffle'}.md"
    return args


def markdown_table(header: list[str], rows: list[list[str]], right_from: int = 1) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    return ["| " + " | ".join(line) + " |" for line in [header, align, *rows]]


# -- 1. throughput ---------------------------------------------------------------------------------


def measure_throughput(table: tables.Table, repeats: int,
                       configs: list[Config] | None = None) -> dict[Any, list[dict[str, Any]]]:
    """Epoch results per loader (``RAW`` or a :class:`Config`; by default every workers x interleave x
    buffer of section 1), the first round left out (warm-up); the rounds rotate the loaders' order."""
    files = [str(f) for f in table.files]
    if configs is None:
        configs = [Config(workers, buffer, interleave) for workers in (0, 2) for interleave in (1, 4)
                   for buffer in (0, 10_000, 100_000)]
    makers: dict[Any, Callable[[], Iterator[Any]]] = {RAW: lambda: raw_batches(files, BATCH)}
    for config in configs:
        makers[config] = lambda config=config: config.loader(files)
    keys, samples = list(makers), {key: [] for key in makers}
    for round_ in range(repeats + 1):
        for key in keys[round_ % len(keys):] + keys[:round_ % len(keys)]:
            result = time_epoch(makers[key])
            if result["rows"] != table.spec.rows:
                raise RuntimeError(f"{key}: {result['rows']} rows, the table holds {table.spec.rows}")
            if round_:
                samples[key].append(result)
        log(f"throughput: round {round_} of {repeats} done" + (" (warm-up)" if round_ == 0 else ""))
    return samples


def throughput_section(samples: dict[Any, list[dict[str, Any]]], repeats: int) -> tuple[list[str], dict[Any, float]]:
    rps = {key: statistics.median(r["epoch_rps"] for r in results) for key, results in samples.items()}
    rows = []
    for key, results in samples.items():
        low, high = min(r["epoch_rps"] for r in results), max(r["epoch_rps"] for r in results)
        base = rps[Config(key.num_workers, 0, key.interleave)] if key != RAW else None
        cells = [RAW, "–", "–", "–"] if key == RAW else \
            ["arrowstream", str(key.num_workers), f"{key.buffer:,}", str(key.interleave)]
        rows.append([*cells, fmt_rps(rps[key]), f"{fmt_rps(low)} – {fmt_rps(high)}", fmt_ratio(rps[key] / rps[RAW]),
                     fmt_ratio(rps[key] / base) if base else "–",
                     fmt_ms(statistics.median(r["first_s"] for r in results))])
    header = ["loader", "num_workers", "buffer rows", "interleave", "rows/s (median)", "min – max", "vs raw",
              "vs buffer 0", "first batch ms"]
    lines = ["## 1. Throughput", "",
             (f"One epoch, `batch_size={BATCH}`, torch output, `shuffle=True`; median of {repeats} rounds, each round "
             "runs every loader once (order rotated per round) after an untimed warm-up round. Rows/s count from "
             "before `create_dataloader` (planning and worker start-up included) to the last batch; *vs buffer 0* "
             "compares with the same `num_workers` and `interleave` without a buffer."), "",
             *markdown_table(header, rows, right_from=1)]
    return lines, rps


# -- 2. memory ---------------------------------------------------------------------------------------


def rss_epoch(spec: dict[str, Any]) -> dict[str, Any]:
    """The child's work: one epoch with ``num_workers=0`` (``run_main`` adds ``ru_maxrss``)."""
    config = Config(0, spec["buffer"], spec["interleave"])
    return time_epoch(lambda: config.loader(spec["files"]))


def bytes_per_row(table: tables.Table) -> float:
    decoded = pq.read_table(table.files[0])
    return decoded.nbytes / decoded.num_rows


def measure_memory(plan: list[tuple[tables.Table, int, int]], repeats: int) -> dict[tuple[str, int, int], float]:
    """Median peak RSS (MiB) per (table kind, buffer rows, interleave), each run in a fresh process."""
    samples: dict[tuple[str, int, int], list[float]] = {}
    for _ in range(repeats):
        for table, buffer, interleave in plan:
            spec = {"files": [str(f) for f in table.files], "buffer": buffer, "interleave": interleave}
            name = f"rss-{table.spec.kind}-b{buffer}-k{interleave}"
            child = [sys.executable, str(Path(__file__).resolve()), "--rss-child", json.dumps(spec)]
            outcome = runner.run(name, [*LAUNCHER, *child], timeout_s=300, logs=LOGS)
            if not outcome.ok or outcome.result["rows"] != table.spec.rows:
                raise RuntimeError(f"{name}: {outcome.error or outcome.result}")
            key = (table.spec.kind, buffer, interleave)
            samples.setdefault(key, []).append(outcome.result["self_maxrss_kib"] / 1024)
    return {key: statistics.median(values) for key, values in samples.items()}


def memory_section(peaks: dict[tuple[str, int, int], float], row_bytes: dict[str, float],
                   repeats: int) -> list[str]:
    rows = []
    for (kind, buffer, interleave), peak in peaks.items():
        added = peak - peaks[(kind, 0, interleave)]
        buffer_mib = buffer * row_bytes[kind] / 2**20
        rows.append([kind, str(interleave), f"{buffer:,}", f"{buffer_mib:,.1f}", f"{peak:,.0f}", f"{added:+,.0f}",
                     f"{added / buffer_mib:.1f}x" if buffer >= 100_000 else "–"])
    header = ["table", "interleave", "buffer rows", "buffer MiB (rows x bytes/row)", "peak RSS MiB (median)",
              "increase over buffer 0, MiB", "increase / buffer MiB"]
    sizes = ", ".join(f"{kind} {value:.0f}" for kind, value in row_bytes.items())
    return ["## 2. Memory", "",
            (f"Peak RSS (`getrusage(RUSAGE_SELF).ru_maxrss`) of a fresh process that builds the loader "
             f"(`num_workers=0`, torch output, the same tables as part 1) and reads one full epoch; median of "
             f"{repeats}. Each process is forked by a bare `python -S`, because a process's `ru_maxrss` starts at "
             "the peak of the process it was exec'd from. Decoded bytes per row (Arrow `nbytes` of one file / its "
             f"rows): {sizes}. The last column is left out below 100,000 rows, where the buffer is smaller than "
             "the run-to-run noise of RSS (a few MiB)."), "",
            *markdown_table(header, rows, right_from=1)]


# -- 3. quality --------------------------------------------------------------------------------------


def order_name(buffer: int, interleave: int) -> str:
    return f"buffer={buffer:,}, interleave={interleave}"


def epoch_ids(table: tables.Table, buffer: int | None, interleave: int) -> np.ndarray:
    dataset = StructuredDataset([str(f) for f in table.files], batch_size=BATCH, shuffle=True, seed=0,
                                shuffle_buffer_size=buffer, interleave=interleave, output_format="numpy",
                                columns=["id"], plan_cache=False)
    dataset.set_epoch(0)
    return np.concatenate([batch["id"] for batch in dataset])


def tenth_metrics(ids: np.ndarray, base_position: np.ndarray, last: bool, group_rows: int) -> list[float]:
    """File displacement / N, displacement added over the buffer-0 order (rows), batch spread,
    row groups per batch; over the first or last tenth of the epoch (batches: full ones starting in it)."""
    n = len(ids)
    lo, hi = (n - n // 10, n) if last else (0, n // 10)
    position = np.arange(lo, hi)
    starts = np.arange(-(-lo // BATCH) * BATCH, min(hi, n - BATCH + 1), BATCH)
    batches = ids[starts[:, None] + np.arange(BATCH)]
    groups = np.sort(batches // group_rows, axis=1)
    return [float(np.abs(position - ids[lo:hi]).mean() / n),
            float(np.abs(position - base_position[ids[lo:hi]]).mean()),
            float(batches.std(axis=1).mean() / (n / math.sqrt(12))),
            float(((np.diff(groups, axis=1) != 0).sum(axis=1) + 1).mean())]


def measure_quality(table: tables.Table) -> dict[str, list[list[float]]]:
    """Per order: [first tenth, last tenth] metrics (see :func:`tenth_metrics`)."""
    orders = {order_name(buffer, k): epoch_ids(table, buffer, k) for buffer, k in QUALITY_ORDERS}
    orders[PERFECT] = np.random.default_rng(0).permutation(table.spec.rows)
    base = next(iter(orders.values()))
    base_position = np.empty_like(base)
    base_position[base] = np.arange(len(base))
    for name, ids in orders.items():
        if not np.array_equal(np.sort(ids), np.arange(table.spec.rows)):
            raise RuntimeError(f"{name}: the epoch is not a permutation of the rows")
    return {name: [tenth_metrics(ids, base_position, last, table.spec.row_group_rows) for last in (False, True)]
            for name, ids in orders.items()}


def quality_section(metrics: dict[str, list[list[float]]], table: tables.Table) -> list[str]:
    formats = ["{:.3f}", "{:,.0f}", "{:.3f}", "{:.1f}"]
    rows = [[name, *(f"{fmt.format(first[i])} / {fmt.format(last[i])}" for i, fmt in enumerate(formats))]
            for name, (first, last) in metrics.items()]
    header = ["order (shuffle=True, seed=0, epoch 0)", "mean \\|pos - id\\| / N", "moved vs buffer 0, rows",
              "batch spread of id", "row groups per batch"]
    n, groups = table.spec.rows, table.row_groups
    return ["## 3. Shuffle quality", "",
            (f"{n:,} rows, `id` = file position, {len(table.files)} files, {groups} row groups (splits) of "
            f"{table.spec.row_group_rows:,} rows; `StructuredDataset` iterated directly (`num_workers=0`, "
            f"`batch_size={BATCH}`). Each cell: **first tenth / last tenth** of the epoch by output position "
            "(per-batch columns: the full batches that start in that tenth)."), "",
            "- *mean \\|pos - id\\| / N*: how far rows move from their place in the files (a fraction of N);",
            ("- *moved vs buffer 0*: mean \\|pos - position of the same row in the buffer=0, interleave=1 order\\| "
             "(the displacement the buffer adds; with interleave=4 it includes what interleaving moves);"),
            ("- *batch spread*: mean over batches of std(id in the batch) / (N / sqrt(12)); 1.0 = as spread as a "
            "uniformly random batch;"),
            f"- *row groups per batch*: distinct `id // {table.spec.row_group_rows:,}` per batch, mean.", "",
            ("A tenth holds 100,000 rows, so 10 of the 100 row groups: which ones the split-level shuffle puts "
             "there moves the first/last values of the first column and, with few row groups per batch, of the "
             "spread; those differences are the same with and without a buffer."), "",
            *markdown_table(header, rows, right_from=1)]


# -- report ------------------------------------------------------------------------------------------


def recommendation(rps: dict[Any, float], peaks: dict[tuple[str, int, int], float], row_bytes: dict[str, float],
                   quality: dict[str, list[list[float]]]) -> list[str]:
    def cost(buffer: int) -> str:
        return ", ".join(f"{fmt_ratio(rps[Config(w, buffer, k)] / rps[Config(w, 0, k)])} (workers={w}, interleave={k})"
                         for w in (0, 2) for k in (1, 4))

    def mix(buffer: int | None, interleave: int = 1) -> str:
        first, last = quality[PERFECT if buffer is None else order_name(buffer, interleave)]
        return f"spread {first[2]:.2f} / {last[2]:.2f}, {first[3]:.1f} / {last[3]:.1f} row groups per batch"

    drift = max(abs(last[1] / first[1] - 1) for name, (first, last) in quality.items() if first[1] and name != PERFECT)
    multiples = [(peak - peaks[(kind, 0, k)]) * 2**20 / (b * row_bytes[kind])
                 for (kind, b, k), peak in peaks.items() if b >= 100_000]
    interleave_mib = peaks[("numeric", 0, 4)] - peaks[("numeric", 0, 1)]
    interleave_rps = rps[Config(0, 0, 4)] / rps[Config(0, 0, 1)]
    return ["## Recommendation", "",
            (f"- **No late-epoch decay**: the displacement the buffer adds differs by at most {drift:.1%} between the "
            "first and the last tenth, and the per-batch spread and row-group counts match too (each window is "
            "permuted on its own). The first/last differences left (distance from the file position; spread with "
            "few row groups per batch) are the same with and without a buffer: they come from which row groups the "
            "split-level shuffle put in each tenth. Every buffer here divides the epoch, so the last window is "
            "full; in general a worker's last window holds (its rows mod the buffer) rows and mixes less."),
            ("- **Size the buffer in row groups, not rows**: a row moves at most one window, so a buffer of one "
            f"split or less (1,000 and 10,000 rows here, windows aligned on 10,000-row splits) only reorders rows "
            f"inside their row group: 10,000 rows give {mix(10_000)} (first / last tenth), no buffer {mix(0)}. "
            f"100,000 rows (10 row groups) give {mix(100_000)}; a random permutation {mix(None)}."),
            (f"- **Cost of a buffer**, rows/s vs buffer 0: 10,000 rows {cost(10_000)}; 100,000 rows {cost(100_000)}. "
            f"Peak RSS grows by {min(multiples):.1f}-{max(multiples):.1f}x the decoded size of the buffered rows "
            f"(buffers of 100,000 rows and more; {row_bytes['numeric']:.0f} B/row numeric, "
            f"{row_bytes['mixed']:.0f} B/row mixed), linear in the buffer and independent of the epoch's length."),
            (f"- **Interleave** mixes splits inside each batch without a buffer: K=4 gives {mix(0, 4)}; with "
            f"10,000 rows {mix(10_000, 4)}, with 100,000 rows {mix(100_000, 4)}. It is not free: K readers each "
            f"hold a row group's read (+{interleave_mib:,.0f} MiB peak RSS at K=4 with 65,536-row row groups) and "
            f"batches are assembled from K blocks ({fmt_ratio(interleave_rps)} rows/s at workers=0, buffer 0)."), ""]


# -- the default buffer (--default) -----------------------------------------------------------------------


DEFAULT_QUALITY_SPECS = [QUALITY_SPEC, tables.TableSpec("mixed", 1_000_000, 10, 10_000, 0)]
SPLIT_ONLY, DEFAULT = "split order only (`shuffle_buffer_size=0`)", "the default (left out)"


def default_rows(table: tables.Table) -> tuple[int, float]:
    """The default buffer's rows for ``table`` and the bytes per row it was sized by (from the plan)."""
    from arrowstream._planning.auto_buffer import row_bytes

    dataset = StructuredDataset([str(f) for f in table.files], batch_size=BATCH, shuffle=True, plan_cache=False)
    return dataset._options.shuffle_buffer_size, row_bytes(dataset._plan)


def default_quality(table: tables.Table) -> dict[str, list[list[float]]]:
    """:func:`measure_quality` for split order only, the default and a random permutation."""
    orders = {SPLIT_ONLY: epoch_ids(table, 0, 1), DEFAULT: epoch_ids(table, None, 1),
              PERFECT: np.random.default_rng(0).permutation(table.spec.rows)}
    base = orders[SPLIT_ONLY]
    base_position = np.empty_like(base)
    base_position[base] = np.arange(len(base))
    for name, ids in orders.items():
        if not np.array_equal(np.sort(ids), np.arange(table.spec.rows)):
            raise RuntimeError(f"{name}: the epoch is not a permutation of the rows")
    return {name: [tenth_metrics(ids, base_position, last, table.spec.row_group_rows) for last in (False, True)]
            for name, ids in orders.items()}


def default_throughput(table: tables.Table, repeats: int) -> dict[Any, list[dict[str, Any]]]:
    """Epoch results of the raw loop and of split order / the default with 0 and 2 workers (warm-up left out)."""
    return measure_throughput(table, repeats, [Config(workers, buffer, 1) for workers in (0, 2) for buffer in (0, None)])


def default_memory(plan: list[tuple[tables.Table, int | None]], repeats: int) -> dict[tuple[str, Any], float]:
    """Median peak RSS (MiB) per (table kind, buffer), ``num_workers=0``, each run in a fresh process."""
    samples: dict[tuple[str, Any], list[float]] = {}
    for _ in range(repeats):
        for table, buffer in plan:
            spec = {"files": [str(f) for f in table.files], "buffer": buffer, "interleave": 1}
            name = f"rss-{table.spec.kind}-b{buffer}"
            child = [sys.executable, str(Path(__file__).resolve()), "--rss-child", json.dumps(spec)]
            outcome = runner.run(name, [*LAUNCHER, *child], timeout_s=300, logs=LOGS)
            if not outcome.ok or outcome.result["rows"] != table.spec.rows:
                raise RuntimeError(f"{name}: {outcome.error or outcome.result}")
            samples.setdefault((table.spec.kind, buffer), []).append(outcome.result["self_maxrss_kib"] / 1024)
    return {key: statistics.median(values) for key, values in samples.items()}


WINDOW_SIZES = [0, 65_536, 131_072, 262_144, 1_048_576]


def window_speed(table: tables.Table, repeats: int) -> dict[int, float]:
    """Median rows/s of one epoch of ``StructuredDataset`` (``num_workers=0``, no loader) per buffer size: what
    the window's size costs, which bounds the default."""
    files = [str(f) for f in table.files]
    samples: dict[int, list[float]] = {size: [] for size in WINDOW_SIZES}
    for round_ in range(repeats + 1):
        for size in WINDOW_SIZES[round_ % len(WINDOW_SIZES):] + WINDOW_SIZES[:round_ % len(WINDOW_SIZES)]:
            dataset = StructuredDataset(files, batch_size=BATCH, shuffle=True, seed=0, shuffle_buffer_size=size,
                                        plan_cache=False)
            started = time.perf_counter()
            rows = sum(len(batch["id"]) for batch in dataset)
            if round_:
                samples[size].append(rows / (time.perf_counter() - started))
    return {size: statistics.median(values) for size, values in samples.items()}


def default_report(args: argparse.Namespace) -> list[str]:
    from arrowstream._planning.auto_buffer import BUDGET_BYTES, MAX_ROWS, MIN_BATCHES

    quality_tables = [tables.ensure(spec) for spec in DEFAULT_QUALITY_SPECS]
    numeric = tables.ensure(tables.TableSpec("numeric", args.rows, 8, 65536, 0))
    mixed = tables.ensure(tables.TableSpec("mixed", args.rows, 8, 65536, 0))
    lines = ["Tables (the suite's generator, `benchmarks/suite/tables.py`; files in the page cache):", "",
             *(table_line(t) + " `id` is the row's position in the files." for t in quality_tables),
             table_line(numeric), table_line(mixed), "",
             (f"The default buffer: {BUDGET_BYTES // 2**20} MiB of decoded rows per worker over the bytes per row of "
              f"the plan's metadata, at least {MIN_BATCHES} batches, at most {MAX_ROWS:,} rows. For these tables:"),
             ""]
    sizes = {}
    for table in [*quality_tables, numeric, mixed]:
        rows, per_row = default_rows(table)
        sizes[table.spec] = (rows, per_row)
        lines.append(f"- {table.spec.kind}, {table.spec.rows:,} rows, row groups of {table.spec.row_group_rows:,}: "
                     f"{per_row:.1f} bytes per row from the metadata -> **{rows:,} rows** "
                     f"({rows * per_row / 2**20:.1f} MiB)")
    log("default: quality")
    lines += ["", "## 1. Shuffle quality", "",
              (f"`StructuredDataset(shuffle=True, seed=0, output_format='numpy', columns=['id'])`, epoch 0, "
               f"`num_workers=0`, `batch_size={BATCH}`; measures as in `benchmarks/results/2026-11-21-shuffle.md` "
               "(first tenth / last tenth of the epoch; *moved* is against split order only)."), ""]
    formats = ["{:.3f}", "{:,.0f}", "{:.3f}", "{:.1f}"]
    header = ["table", "order", "mean \\|pos - id\\| / N", "moved vs split order, rows", "batch spread of id",
              "row groups per batch"]
    rows_out = []
    for table in quality_tables:
        for name, (first, last) in default_quality(table).items():
            rows_out.append([f"{table.spec.kind} ({table.row_groups} row groups)", name,
                             *(f"{fmt.format(first[i])} / {fmt.format(last[i])}" for i, fmt in enumerate(formats))])
    lines += markdown_table(header, rows_out, right_from=2)
    log("default: throughput")
    samples = default_throughput(numeric, args.repeats)
    rps = {key: statistics.median(r["epoch_rps"] for r in results) for key, results in samples.items()}
    rows_out = []
    for key, results in samples.items():
        low, high = min(r["epoch_rps"] for r in results), max(r["epoch_rps"] for r in results)
        name = RAW if key == RAW else (SPLIT_ONLY if key.buffer == 0 else DEFAULT)
        split = rps[Config(key.num_workers, 0, 1)] if key != RAW else None
        rows_out.append([name, "–" if key == RAW else str(key.num_workers), fmt_rps(rps[key]),
                         f"{fmt_rps(low)} – {fmt_rps(high)}", fmt_ratio(rps[key] / rps[RAW]),
                         fmt_ratio(rps[key] / split) if split else "–",
                         fmt_ms(statistics.median(r["first_s"] for r in results))])
    lines += ["", "## 2. Throughput", "",
              (f"One epoch of the numeric table ({numeric.spec.rows:,} rows), `batch_size={BATCH}`, torch output, "
               f"`shuffle=True`; median of {args.repeats} rounds after an untimed warm-up round, the order of the "
               "loaders rotated per round. Rows/s from before `create_dataloader` to the last batch."), "",
              *markdown_table(["loader", "num_workers", "rows/s (median)", "min – max", "vs raw",
                               "vs split order", "first batch ms"], rows_out)]
    log("default: memory")
    peaks = default_memory([(t, b) for t in (numeric, mixed) for b in (0, None)], args.repeats)
    rows_out = []
    for (kind, buffer), peak in peaks.items():
        spec = numeric.spec if kind == "numeric" else mixed.spec
        rows, per_row = sizes[spec]
        window = min(rows, spec.rows)   # the one worker's epoch may be shorter than a window
        added = peak - peaks[(kind, 0)]
        rows_out.append([kind, SPLIT_ONLY if buffer == 0 else DEFAULT, f"{peak:,.0f}", f"{added:+,.0f}",
                         "–" if buffer == 0 else f"{window:,} rows, {window * per_row / 2**20:.1f} MiB"])
    lines += ["", "## 3. Memory", "",
              (f"Peak RSS of a fresh process reading one epoch with `num_workers=0` (each worker process holds its "
               f"own buffer); median of {args.repeats}."), "",
              *markdown_table(["table", "order", "peak RSS MiB", "over split order, MiB",
                               "window (by the plan's bytes per row)"], rows_out)]
    log("default: window sizes")
    speed = window_speed(numeric, args.repeats)
    lines += ["", "## 4. Window size and speed", "",
              (f"One epoch of the numeric table ({numeric.spec.rows:,} rows) through `StructuredDataset` itself "
               f"(`num_workers=0`, torch output, `shuffle=True`), per `shuffle_buffer_size`; median of {args.repeats} "
               "rounds after a warm-up round. Larger windows gather their rows into shuffled order by random access "
               "over more memory than the CPU caches hold: what bounds the default's rows."), "",
              *markdown_table(["buffer rows", "rows/s (median)", "vs no buffer"],
                              [[f"{size:,}", fmt_rps(rate), fmt_ratio(rate / speed[0])] for size, rate in speed.items()])]
    return lines


def main() -> int:
    args = parse_args()
    if args.rss_child is not None:
        run_main(lambda: rss_epoch(json.loads(args.rss_child)))
    if args.default:
        return default_main(args)
    started, load_start, commit, sources = time.perf_counter(), loadavg(), arrowstream_commit(), source_hash()
    numeric = tables.ensure(tables.TableSpec("numeric", args.rows, 8, 65536, 0))
    mixed = tables.ensure(tables.TableSpec("mixed", args.rows, 8, 65536, 0))
    sorted_table = tables.ensure(QUALITY_SPEC)
    log("part 1: throughput")
    throughput_lines, rps = throughput_section(measure_throughput(numeric, args.repeats), args.repeats)
    log("part 2: memory")
    buffers = [0, 10_000, 100_000] if args.quick else [0, 1_000, 10_000, 100_000, 1_000_000]
    plan = [(numeric, b, k) for k in (1, 4) for b in buffers]
    plan += [(mixed, b, 1) for b in sorted({0, 100_000, buffers[-1]})]
    row_bytes = {"numeric": bytes_per_row(numeric), "mixed": bytes_per_row(mixed)}
    peaks = measure_memory(plan, args.repeats)
    log("part 3: quality")
    quality = measure_quality(sorted_table)
    versions = main_versions()
    text = "\n".join([
        f"# Shuffle buffer and interleave ({dt.date.today().isoformat()})", "",
        f"- Date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {machine()}",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + f" ({commit})",
        f"- arrowstream sources (hash of `arrowstream/**/*.py`): {sources} at the start, {source_hash()} at the end",
        f"- Load average (1/5/15 min) at the start: {load_start}; at the end: {loadavg()} (the machine is shared)",
        f"- Command: `{shlex.join(sys.orig_argv)}`",
        f"- Wall time: {(time.perf_counter() - started) / 60:.1f} min", "",
        "Tables (the suite's generator, `benchmarks/suite/tables.py`; files in the page cache):", "",
        table_line(numeric), table_line(mixed),
        table_line(sorted_table) + " Used for quality: `id` is the row's position in the files.", "",
        *throughput_lines, "", *memory_section(peaks, row_bytes, args.repeats), "",
        *quality_section(quality, sorted_table), "",
        *recommendation(rps, peaks, row_bytes, quality)])
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        log(f"wrote {args.out}")
    return 0


def default_main(args: argparse.Namespace) -> int:
    from bench_suite import run_header

    started, load_start = time.perf_counter(), loadavg()
    body = default_report(args)
    text = "\n".join([*run_header("The default shuffle buffer", "bench_shuffle.py", load_start,
                                  time.perf_counter() - started), "", *body, ""])
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
