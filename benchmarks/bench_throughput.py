"""Throughput and resume benchmark of arrowstream against a raw pyarrow loop (issue #2, point 11).

Run from the repository root:

    .venv/bin/python benchmarks/bench_throughput.py            # 2,000,000 rows, 3 repeats
    .venv/bin/python benchmarks/bench_throughput.py --quick    # small smoke run, prints only

Options: ``--rows N``, ``--repeats N``, ``--out PATH`` (default
``benchmarks/results/<YYYY-MM-DD>-throughput.md``; ``--quick`` writes a file only when
``--out`` is given).

What it does, in one process (plus the loader's workers):

1. writes a seeded numeric Parquet table (8 float32, 2 int64, 1 int8 column; 8 files, row
   groups of 65,536 rows, snappy) into a temporary folder under ``benchmarks/data/``
   (git-ignored, deleted at the end);
2. times one epoch, ``batch_size=1024``, of the raw pyarrow loop
   (``ParquetFile.iter_batches`` + ``torch.from_numpy`` per column), of a reference pyarrow
   loop that reads 65,536-row batches like arrowstream and slices them, and of arrowstream with
   ``num_workers=0`` and ``2`` (``output_format="torch"``, ``shuffle=False``): loader
   construction, time to first batch, rows/s over the whole epoch and after the first batch;
3. times the first batch after a resume from a checkpoint taken at 5% and at 90% of the
   epoch (``num_workers=0`` and ``2``), and checks that the batch is the expected one;
4. profiles one epoch of each arrowstream variant (main process) with cProfile;
5. prints a markdown report and writes it to ``--out``.

The files are read from the page cache (they were just written), so this measures decoding,
conversion and loader overhead, not the disk. Measurements are interleaved across repeats
(raw, reference, workers=0, workers=2, raw, ...) after one untimed warm-up round, so that a noisy
neighbour slows every variant alike.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import gc
import os
import platform
import pstats
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from suite.common import cpu_model  # benchmarks/ is on sys.path when run as a script

import arrowstream
from arrowstream import StructuredDataset
from arrowstream._worker.runtime import READ_BATCH_ROWS

HERE = Path(__file__).resolve().parent
DATA_ROOT = HERE / "data"
RESULTS = HERE / "results"

FLOAT_COLUMNS = [f"f{i}" for i in range(8)]
ID_COLUMN = "id"  # int64, the global row number: identifies a batch after a resume
USER_COLUMN = "user"  # int64, random
LABEL_COLUMN = "label"  # int8

RAW = "raw pyarrow"
SLICED = f"pyarrow, {READ_BATCH_ROWS:,}-row reads sliced (reference)"
CHECKPOINT_FRACTIONS = (0.05, 0.90)
NW0_GOAL = 0.9          # arrowstream num_workers=0 rows/s >= 90% of the raw loop
FLAT_FACTOR = 1.25      # resume at 90% within 25% of resume at 5% ...
FLAT_SLACK_S = 0.002    # ... plus 2 ms, on the medians
MIN_RESUME_REPEATS = 7  # resumes are cheap: take at least this many samples
PROFILE_TOP = 15

warnings.filterwarnings("ignore", message=".*not writable.*")  # torch.from_numpy on Arrow buffers


# -- configuration --------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    rows: int
    files: int
    row_group_rows: int
    batch_size: int
    repeats: int
    seed: int
    worker_counts: tuple[int, ...]


def parse_args(argv: list[str] | None = None) -> tuple[Config, Path | None, bool]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=None, help="rows in the table (default 2,000,000; 200,000 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats of each measurement (default 3; 2 with --quick)")
    parser.add_argument("--out", type=Path, default=None,
                        help="markdown report path (default benchmarks/results/<date>-throughput.md)")
    parser.add_argument("--quick", action="store_true", help="a small smoke run; writes a report only with --out")
    parser.add_argument("--files", type=int, default=8, help="Parquet files (default 8)")
    parser.add_argument("--row-group-rows", type=int, default=65536, help="rows per row group (default 65,536)")
    parser.add_argument("--batch-size", type=int, default=1024, help="rows per batch (default 1,024)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated data (default 0)")
    args = parser.parse_args(argv)
    rows = args.rows if args.rows is not None else (200_000 if args.quick else 2_000_000)
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 3)
    if rows < args.files or repeats < 1:
        parser.error("--rows must be >= --files and --repeats >= 1")
    out = args.out
    if out is None and not args.quick:
        out = RESULTS / f"{dt.date.today().isoformat()}-throughput.md"
    config = Config(rows=rows, files=args.files, row_group_rows=args.row_group_rows,
                    batch_size=args.batch_size, repeats=repeats, seed=args.seed, worker_counts=(0, 2))
    return config, out, args.quick


# -- data -----------------------------------------------------------------------------------


def make_table(rng: np.random.Generator, start: int, rows: int) -> pa.Table:
    columns: dict[str, Any] = {name: rng.standard_normal(rows, dtype=np.float32) for name in FLOAT_COLUMNS}
    columns[ID_COLUMN] = np.arange(start, start + rows, dtype=np.int64)
    columns[USER_COLUMN] = rng.integers(0, 1 << 40, size=rows, dtype=np.int64)
    columns[LABEL_COLUMN] = rng.integers(0, 10, size=rows, dtype=np.int8)
    return pa.table(columns)


def write_data(folder: Path, config: Config) -> list[Path]:
    """``config.files`` Parquet files of about equal size; ids run on across files."""
    rng = np.random.default_rng(config.seed)
    bounds = np.linspace(0, config.rows, config.files + 1).astype(np.int64)
    paths = []
    for index, (start, stop) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist())):
        path = folder / f"part-{index:03d}.parquet"
        pq.write_table(make_table(rng, start, stop - start), path, row_group_size=config.row_group_rows)
        paths.append(path)
    return paths


# -- one timed epoch ------------------------------------------------------------------------


@dataclass(frozen=True)
class Epoch:
    """One timed pass: seconds from ``iter()`` to the first batch and to the end."""

    build_s: float          # loader construction (planning); 0 for the raw loop
    first_s: float
    total_s: float
    rows: int
    first_rows: int

    @property
    def epoch_rps(self) -> float:
        return self.rows / self.total_s

    @property
    def steady_rps(self) -> float:
        return (self.rows - self.first_rows) / (self.total_s - self.first_s)


def batch_rows(batch: dict[str, torch.Tensor]) -> int:
    return len(batch[ID_COLUMN])


def time_epoch(make_iterator: Callable[[], Iterator[dict[str, torch.Tensor]]], build_s: float = 0.0) -> Epoch:
    start = time.perf_counter()
    iterator = make_iterator()
    first_rows = rows = batch_rows(next(iterator))
    first = time.perf_counter()
    for batch in iterator:
        rows += batch_rows(batch)
    end = time.perf_counter()
    return Epoch(build_s, first - start, end - start, rows, first_rows)


def to_tensors(batch: pa.RecordBatch) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(column.to_numpy()) for name, column in zip(batch.schema.names, batch.columns)}


def raw_batches(files: list[Path], batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """The baseline: pyarrow's own batch iterator, every column made a tensor (one process)."""
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
            yield to_tensors(batch)


def sliced_batches(files: list[Path], batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """A reference: read as arrowstream does (large batches), slice; batches may come short at read ends."""
    for path in files:
        for read in pq.ParquetFile(path).iter_batches(batch_size=READ_BATCH_ROWS):
            for start in range(0, read.num_rows, batch_size):
                yield to_tensors(read.slice(start, batch_size))


def build_loader(folder: Path, config: Config, num_workers: int) -> tuple[Any, StructuredDataset]:
    return StructuredDataset.create_dataloader(
        path=str(folder), batch_size=config.batch_size, num_workers=num_workers,
        shuffle=False, output_format="torch", plan_cache=False)


def shutdown(iterator: Any) -> None:
    """Stop a multi-process iterator's workers now (the loader keeps a reference to it)."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if stop is not None:
        stop()


def measure_raw(files: list[Path], config: Config) -> Epoch:
    return time_epoch(lambda: raw_batches(files, config.batch_size))


def measure_sliced(files: list[Path], config: Config) -> Epoch:
    return time_epoch(lambda: sliced_batches(files, config.batch_size))


def measure_arrowstream(folder: Path, config: Config, num_workers: int) -> Epoch:
    start = time.perf_counter()
    loader, dataset = build_loader(folder, config, num_workers)
    build_s = time.perf_counter() - start
    dataset.set_epoch(0)
    epoch = time_epoch(lambda: iter(loader), build_s)  # workers stop by themselves at the end
    if epoch.rows != dataset.num_rows:
        raise RuntimeError(f"arrowstream num_workers={num_workers} yielded {epoch.rows} rows, expected {dataset.num_rows}")
    return epoch


def variant_name(num_workers: int) -> str:
    return f"arrowstream num_workers={num_workers}"


def run_throughput(folder: Path, files: list[Path], config: Config) -> dict[str, list[Epoch]]:
    """One untimed warm-up round, then ``repeats`` interleaved rounds of every variant."""
    variants: dict[str, Callable[[], Epoch]] = {RAW: partial(measure_raw, files, config),
                                                SLICED: partial(measure_sliced, files, config)}
    for num_workers in config.worker_counts:
        variants[variant_name(num_workers)] = partial(measure_arrowstream, folder, config, num_workers)
    for measure in variants.values():
        measure()
    samples: dict[str, list[Epoch]] = {name: [] for name in variants}
    for round_index in range(config.repeats):
        for name, measure in variants.items():
            gc.collect()
            samples[name].append(measure())
            log(f"round {round_index + 1}/{config.repeats} {name}: {samples[name][-1].epoch_rps / 1e6:.2f} M rows/s")
    return samples


# -- resume ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    label: str
    batches_before: int
    state: dict[str, Any] | None       # None: a fresh start, for reference
    expected_first_id: int             # ``id`` of the first row of the next batch


@dataclass(frozen=True)
class Resume:
    build_s: float
    load_s: float
    first_s: float
    exact: bool


def take_checkpoints(folder: Path, config: Config, num_workers: int) -> list[Checkpoint]:
    """One pass: the states after 5% and 90% of the batches, and which batch comes next."""
    loader, dataset = build_loader(folder, config, num_workers)
    dataset.set_epoch(0)
    total = len(loader)
    stops = {max(1, round(f * total)): f"{f:.0%}" for f in CHECKPOINT_FRACTIONS}
    checkpoints = []
    pending: tuple[str, int, dict[str, Any]] | None = None
    first_id: int | None = None
    iterator = iter(loader)
    for index, batch in enumerate(iterator):
        if index == 0:
            first_id = int(batch[ID_COLUMN][0])
        if pending is not None:
            checkpoints.append(Checkpoint(pending[0], pending[1], pending[2], int(batch[ID_COLUMN][0])))
            pending = None
        if index + 1 in stops:
            pending = (stops[index + 1], index + 1, loader.state_dict())
        if len(checkpoints) == len(stops):
            break
    shutdown(iterator)
    if first_id is None or len(checkpoints) != len(stops):
        raise RuntimeError(f"too few batches ({total}) for checkpoints at {CHECKPOINT_FRACTIONS}")
    return [Checkpoint("0% (fresh)", 0, None, first_id), *checkpoints]


def time_resume(folder: Path, config: Config, num_workers: int, checkpoint: Checkpoint) -> Resume:
    start = time.perf_counter()
    loader, dataset = build_loader(folder, config, num_workers)
    built = time.perf_counter()
    if checkpoint.state is not None:
        loader.load_state_dict(checkpoint.state)
    else:
        dataset.set_epoch(0)
    loaded = time.perf_counter()
    iterator = iter(loader)
    batch = next(iterator)
    first = time.perf_counter()
    shutdown(iterator)
    return Resume(built - start, loaded - built, first - loaded,
                  int(batch[ID_COLUMN][0]) == checkpoint.expected_first_id)


def run_resume(folder: Path, config: Config) -> dict[int, list[tuple[Checkpoint, list[Resume]]]]:
    """Per num_workers: each checkpoint with ``resume_repeats`` timed resumes (interleaved)."""
    out: dict[int, list[tuple[Checkpoint, list[Resume]]]] = {}
    for num_workers in config.worker_counts:
        checkpoints = take_checkpoints(folder, config, num_workers)
        for checkpoint in checkpoints:  # warm-up
            time_resume(folder, config, num_workers, checkpoint)
        samples: list[list[Resume]] = [[] for _ in checkpoints]
        for _ in range(resume_repeats(config)):
            for checkpoint, bucket in zip(checkpoints, samples):
                gc.collect()
                bucket.append(time_resume(folder, config, num_workers, checkpoint))
        out[num_workers] = list(zip(checkpoints, samples))
        log(f"resume num_workers={num_workers}: " + ", ".join(
            f"{c.label} {statistics.median(r.first_s for r in rs) * 1e3:.1f} ms" for c, rs in out[num_workers]))
    return out


# -- profile --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileRow:
    function: str
    calls: int
    own_s: float
    cumulative_s: float


@dataclass(frozen=True)
class Profile:
    """cProfile of one epoch, in the main process only (workers are not profiled)."""

    num_workers: int
    total_s: float
    rows: list[ProfileRow]              # every function, by own time
    by_package: dict[str, float]        # own time by package

    def top(self, count: int = PROFILE_TOP) -> list[ProfileRow]:
        return self.rows[:count]

    def find(self, needle: str) -> ProfileRow | None:
        return next((r for r in self.rows if needle in r.function), None)


def profile_epoch(folder: Path, config: Config, num_workers: int) -> Profile:
    loader, dataset = build_loader(folder, config, num_workers)
    dataset.set_epoch(0)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in loader:
        pass
    profiler.disable()
    stats = pstats.Stats(profiler)
    entries = stats.stats  # type: ignore[attr-defined]
    rows = sorted((ProfileRow(describe(key), calls, own, cumulative)
                   for key, (_, calls, own, cumulative, _) in entries.items()),
                  key=lambda r: r.own_s, reverse=True)
    by_package: dict[str, float] = {}
    for key, (_, _, own, _, _) in entries.items():
        package = package_of(key)
        by_package[package] = by_package.get(package, 0.0) + own
    return Profile(num_workers, stats.total_tt, rows, by_package)  # type: ignore[attr-defined]


def describe(key: tuple[str, int, str]) -> str:
    """``package/module.py:line(function)``, or the builtin's name."""
    filename, line, name = key
    if filename == "~":
        return name
    parts = Path(filename).parts
    for anchor in ("arrowstream", "torchdata", "torch", "pyarrow", "multiprocessing"):
        if anchor in parts:
            index = len(parts) - 1 - parts[::-1].index(anchor)
            return f"{'/'.join(parts[index:])}:{line}({name})"
    return f"{Path(filename).name}:{line}({name})"


def package_of(key: tuple[str, int, str]) -> str:
    filename, _, name = key
    text = name if filename == "~" else filename
    for package in ("arrowstream", "torchdata", "pyarrow", "torch", "numpy"):
        if f"/{package}/" in text or f"{package}." in text or f"'{package}" in text:
            return package
    return "other (builtins, stdlib)"


# -- report ---------------------------------------------------------------------------------


def resume_repeats(config: Config) -> int:
    return max(config.repeats, MIN_RESUME_REPEATS)


def usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values)


def mrows(value: float) -> str:
    return f"{value / 1e6:.2f} M"


def ms(value: float) -> str:
    return f"{value * 1e3:.1f}"


def environment() -> list[tuple[str, str]]:
    import torchdata

    return [
        ("Date", dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")),
        ("Machine", f"{platform.platform()}; {cpu_model()}; {os.cpu_count()} cores ({usable_cores()} usable)"),
        ("Python", platform.python_version()),
        ("torch", torch.__version__),
        ("torchdata", getattr(torchdata, "__version__", "unknown")),
        ("pyarrow", pa.__version__),
        ("numpy", np.__version__),
        ("arrowstream", arrowstream.__version__),
        ("Command", f"`{shlex.join(sys.orig_argv)}`"),
    ]


def data_description(config: Config, files: list[Path]) -> str:
    size = sum(p.stat().st_size for p in files)
    groups = sum(pq.ParquetFile(p).metadata.num_row_groups for p in files)
    return (f"{config.rows:,} rows in {len(files)} Parquet files ({size / 2**20:.0f} MiB, snappy, "
            f"{groups} row groups of up to {config.row_group_rows:,} rows); columns: 8 float32, "
            f"2 int64, 1 int8; batch_size={config.batch_size}; {config.repeats} repeats, interleaved, "
            "after an untimed warm-up round; files in the page cache.")


def throughput_table(samples: dict[str, list[Epoch]]) -> list[str]:
    raw = samples[RAW]
    lines = [
        ("| loader | construction ms (median) | first batch ms (best / median) | epoch s (best / median) "
        "| rows/s, whole epoch (best / median) | rows/s, after first batch (best / median) "
        "| vs raw, whole epoch (best / median) | vs raw, after first batch (best / median) |"),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, epochs in samples.items():
        epoch_rps = [e.epoch_rps for e in epochs]
        steady_rps = [e.steady_rps for e in epochs]
        firsts = [e.first_s for e in epochs]
        totals = [e.total_s for e in epochs]
        ratio_epoch = ratio_pair(epoch_rps, [e.epoch_rps for e in raw])
        ratio_steady = ratio_pair(steady_rps, [e.steady_rps for e in raw])
        construction = "–" if name in (RAW, SLICED) else ms(median([e.build_s for e in epochs]))
        lines.append(
            f"| {name} | {construction} | {ms(min(firsts))} / {ms(median(firsts))} "
            f"| {min(totals):.2f} / {median(totals):.2f} "
            f"| {mrows(max(epoch_rps))} / {mrows(median(epoch_rps))} "
            f"| {mrows(max(steady_rps))} / {mrows(median(steady_rps))} "
            f"| {ratio_epoch[0]:.2f} / {ratio_epoch[1]:.2f} | {ratio_steady[0]:.2f} / {ratio_steady[1]:.2f} |")
    return lines


def ratio_pair(values: list[float], raw: list[float]) -> tuple[float, float]:
    """(best / best, median / median)."""
    return max(values) / max(raw), median(values) / median(raw)


def resume_table(resumes: dict[int, list[tuple[Checkpoint, list[Resume]]]]) -> list[str]:
    lines = [
        ("| num_workers | checkpoint | batches before | construction ms (median) | load_state_dict ms (median) "
        "| iter() to first batch ms (best / median) | next batch is the expected one |"),
        "| ---: | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for num_workers, entries in resumes.items():
        for checkpoint, samples in entries:
            firsts = [r.first_s for r in samples]
            lines.append(
                f"| {num_workers} | {checkpoint.label} | {checkpoint.batches_before} "
                f"| {ms(median([r.build_s for r in samples]))} | {ms(median([r.load_s for r in samples]))} "
                f"| {ms(min(firsts))} / {ms(median(firsts))} "
                f"| {'yes' if all(r.exact for r in samples) else '**no**'} |")
    return lines


@dataclass(frozen=True)
class Flatness:
    """Resume at 90% against resume at 5%: flat when the 90% median is within the allowance.

    Allowance: FLAT_FACTOR x the 5% median + FLAT_SLACK_S (worker start-up alone varies by tens
    of milliseconds on a shared machine).
    """

    num_workers: int
    early: list[float]
    late: list[float]

    @property
    def ratio_best(self) -> float:
        return min(self.late) / min(self.early)

    @property
    def ratio_median(self) -> float:
        return median(self.late) / median(self.early)

    @property
    def flat(self) -> bool:
        return median(self.late) <= FLAT_FACTOR * median(self.early) + FLAT_SLACK_S


def flatness(num_workers: int, entries: list[tuple[Checkpoint, list[Resume]]]) -> Flatness:
    by_label = {checkpoint.label: samples for checkpoint, samples in entries}
    early, late = (by_label[f"{f:.0%}"] for f in CHECKPOINT_FRACTIONS)
    return Flatness(num_workers, [r.first_s for r in early], [r.first_s for r in late])


def package_shares(profile: Profile) -> str:
    shares = sorted(profile.by_package.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{name} {own / profile.total_s:.0%}" for name, own in shares if own / profile.total_s >= 0.01)


def profile_lines(profile: Profile) -> list[str]:
    lines = [
        f"### Main process, `num_workers={profile.num_workers}`",
        "",
        (f"{profile.total_s:.2f} s under the profiler (which inflates Python-level costs). "
        f"Own time by package: {package_shares(profile)}."),
        "",
        "| function | calls | own s | cumulative s |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| `{r.function}` | {r.calls:,} | {r.own_s:.3f} | {r.cumulative_s:.3f} |" for r in profile.top()]
    return lines + [""]


def per_batch_us(variant: list[Epoch], baseline: list[Epoch], batch_size: int) -> float:
    """Extra microseconds per batch of ``variant`` over ``baseline`` (medians, whole epoch)."""
    return (1 / median([e.epoch_rps for e in variant]) - 1 / median([e.epoch_rps for e in baseline])) * batch_size * 1e6


def reading_throughput(samples: dict[str, list[Epoch]], config: Config, profile0: Profile) -> list[str]:
    raw, sliced, nw0 = samples[RAW], samples[SLICED], samples[variant_name(0)]
    epoch_best, epoch_median = ratio_pair([e.epoch_rps for e in nw0], [e.epoch_rps for e in raw])
    steady_best, steady_median = ratio_pair([e.steady_rps for e in nw0], [e.steady_rps for e in raw])
    reference = ratio_pair([e.epoch_rps for e in nw0], [e.epoch_rps for e in sliced])[1]
    met = epoch_median >= NW0_GOAL
    parts = [
        (f"With `num_workers=0` arrowstream reaches {epoch_median:.2f}x the raw pyarrow loop's rows/s over the "
         f"whole epoch (median; best {epoch_best:.2f}x) and {steady_median:.2f}x after the first batch "
         f"(best {steady_best:.2f}x), {per_batch_us(nw0, raw, config.batch_size):+.0f} us per batch of "
         f"{config.batch_size} rows: the goal (>= {NW0_GOAL}x, on the median) is **{'met' if met else 'not met'}**."),
        (f"Against the reference loop that reads {READ_BATCH_ROWS:,}-row batches as arrowstream does and "
         f"slices them, it reaches {reference:.2f}x ({per_batch_us(nw0, sliced, config.batch_size):+.0f} us "
         "per batch: arrowstream's own batch assembly, conversion and loader bookkeeping)."),
    ]
    if median([e.epoch_rps for e in sliced]) > median([e.epoch_rps for e in raw]):
        parts.append(f"The raw loop is the slower of the two pyarrow loops because pyarrow decodes batches of "
                     f"{config.batch_size} rows there; arrowstream's lead over it comes from its larger reads.")
    if not met:
        top = ", ".join(f"`{r.function}` ({r.own_s:.2f} s own)" for r in profile0.top(5))
        parts.append(f"What bounds it (profile below, own time): {top}.")
    return parts


def reading_workers(samples: dict[str, list[Epoch]], config: Config, profiles: dict[int, Profile]) -> list[str]:
    raw_median = median([e.epoch_rps for e in samples[RAW]])
    parts = []
    for num_workers in (n for n in config.worker_counts if n > 0):
        ratio = median([e.epoch_rps for e in samples[variant_name(num_workers)]]) / raw_median
        parts.append(f"With `num_workers={num_workers}` the ratio is {ratio:.2f}x (median) on "
                     f"{usable_cores()} usable cores.")
        profile = profiles.get(num_workers)
        loads = profile.find("_pickle.loads") if profile else None
        if profile is None or loads is None:
            continue
        sharer = profile.find("resource_sharer.py")
        how = (f"; it opens {sharer.calls:,} resource-sharer connections, one per tensor, to receive "
               "each tensor's shared-memory file descriptor" if sharer else "")
        parts.append(f"Its main process spends {loads.cumulative_s / profile.total_s:.0%} of the epoch "
                     f"unpickling batches (`_pickle.loads`, {loads.cumulative_s:.2f} s of "
                     f"{profile.total_s:.2f} s){how}.")
    return parts


def reading_resume(flats: list[Flatness], exact: bool) -> list[str]:
    parts = [
        f"Resume, `num_workers={f.num_workers}`: first batch in {ms(min(f.early))} ms (best; median "
        f"{ms(median(f.early))}) after a checkpoint at 5% and {ms(min(f.late))} ms (median "
        f"{ms(median(f.late))}) at 90%, ratio {f.ratio_best:.2f} (best) / {f.ratio_median:.2f} (median): "
        f"**{'flat' if f.flat else 'not flat'}**." for f in flats]
    parts.append("Every resumed loader yielded exactly the batch that followed its checkpoint." if exact else
                 "**A resumed loader yielded a batch other than the one that followed its checkpoint** "
                 "(see the table).")
    return parts


def render(config: Config, files: list[Path], samples: dict[str, list[Epoch]],
           resumes: dict[int, list[tuple[Checkpoint, list[Resume]]]], profiles: dict[int, Profile]) -> str:
    flats = [flatness(n, entries) for n, entries in resumes.items()]
    exact = all(r.exact for entries in resumes.values() for _, rs in entries for r in rs)
    lines = [f"# arrowstream throughput benchmark ({dt.date.today().isoformat()})", ""]
    lines += [f"- {key}: {value}" for key, value in environment()]
    lines += ["", f"Data: {data_description(config, files)}", "", "## Throughput (one epoch)", ""]
    lines += throughput_table(samples)
    lines += ["", ("Rows/s over the whole epoch count from `iter()` (worker start-up included) to the last "
              "batch; \"after first batch\" leaves the time to the first batch out. Construction (file "
              "listing and footer planning) is timed apart and counted in neither; the raw loop opens each "
              "file (and reads its footer) inside its epoch. Ratios: best/best and median/median."),
              "", "## Time to first batch after a resume", ""]
    lines += resume_table(resumes)
    lines += ["", ("A fresh loader with the same arguments, `load_state_dict(state)`, then `iter()` and `next()`; "
              f"{resume_repeats(config)} repeats each. \"0% (fresh)\" is a loader started without a state, "
              f"for reference. Flat means median(90%) <= {FLAT_FACTOR} x median(5%) + {ms(FLAT_SLACK_S)} ms."), "",
              "| num_workers | 90% / 5% (best) | 90% / 5% (median) | flat |", "| ---: | ---: | ---: | --- |"]
    lines += [f"| {f.num_workers} | {f.ratio_best:.2f} | {f.ratio_median:.2f} | {'yes' if f.flat else 'no'} |"
              for f in flats]
    paragraph = (reading_throughput(samples, config, profiles[0]) + reading_workers(samples, config, profiles)
                 + reading_resume(flats, exact))
    lines += ["", "## Reading", "", " ".join(paragraph), "", "## Profiles", "",
              ("cProfile of one epoch in the main process. cProfile does not see inside pyarrow's Cython "
              "iterators, so the own time of the generator that drives `iter_batches` (`_read_once`) is "
              "mostly Parquet decoding. Workers are not profiled."), ""]
    for profile in profiles.values():
        lines += profile_lines(profile)
    return "\n".join(lines).rstrip() + "\n"


# -- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    config, out, quick = parse_args(argv)
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="throughput-", dir=DATA_ROOT) as tmp:
        folder = Path(tmp)
        log(f"writing {config.rows:,} rows into {folder}")
        files = write_data(folder, config)
        log("throughput")
        samples = run_throughput(folder, files, config)
        log("resume")
        resumes = run_resume(folder, config)
        log("profiles")
        profiles = {n: profile_epoch(folder, config, n) for n in config.worker_counts}
        report = render(config, files, samples, resumes, profiles)
    print(report)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
        log(f"wrote {out}")
    elif quick:
        log("quick run: no report written (pass --out to keep one)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
