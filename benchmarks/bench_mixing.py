"""Weighted mixing (issue #20): a 3-source ``Mixture`` against one ``StructuredDataset`` of the same rows.

Run from the repository root:

    .venv/bin/python benchmarks/bench_mixing.py            # the real run (about 3 min on 2 busy cores)
    .venv/bin/python benchmarks/bench_mixing.py --quick    # smoke run (small tables, 1 round), prints only

Options: ``--numeric-rows``, ``--mixed-rows``, ``--repeats``, ``--resume-repeats``, ``--no-shuffle``,
``--out PATH`` (default ``benchmarks/results/<YYYY-MM-DD>-mixing.md``; ``--quick`` writes only with ``--out``).

Data: two seeded tables, each written as three source folders ``a``, ``b``, ``c`` holding 50% / 30% / 20% of
its rows (5 / 3 / 2 Parquet files, row groups of 65,536 rows, snappy), and a folder ``all`` of hard links to
the same ten files: the single source reads exactly the files the mixture reads. ``id`` is unique across the
sources. *numeric*: 8 float32, ``id``, ``user`` (int64), ``label`` (int8); *mixed*: the same plus ``name`` (a
string of 4 to 12 characters) and ``emb`` (``fixed_size_list<float32, 4>``). Both have 4,000,000 rows by
default (the mixed one had 1,000,000 until 2026-11-27: an epoch of half a second with 2 workers, of which a
mixture's first batch, three sources' first windows, took 7%; the resume goal measures the first batch).
Everything lives in a temporary folder under ``benchmarks/data/`` (git-ignored), deleted at the end.

Both loaders: ``batch_size=1024``, ``shuffle=True, seed=0`` (``--no-shuffle``), ``output_format="torch"``,
``plan_cache=False``. The mixture: weights 0.5 / 0.3 / 0.2 and ``epoch_rows`` = all rows, so each source's
quota is its row count and both loaders yield every row once per epoch (checked: row count and sum of ``id``).

1. **Throughput**: one epoch, ``num_workers`` 0 and 2, in this process; an untimed warm-up epoch of each
   loader with 0 workers, then ``--repeats`` rounds whose order rotates. Rows/s from ``iter()`` to the last
   batch (construction timed apart). Ratio mixture / single on the medians (the goal, >= 0.9x) and on the bests;
   the raw pyarrow loop over the same files (``iter_batches``, no shuffle) in the same rounds, as the baseline.
2. **Resume**: the parent takes a loader's state at 50% of an epoch (``num_workers=2``, numeric table) and notes
   the batch that follows; a fresh Python process (imports before the clock) builds the loader, loads the state
   and takes one batch, which is checked to be that batch. A fresh process without a state is the reference.
   Goal: mixture <= 1.5x single, on the medians of construction + ``load_state_dict`` + first batch.
3. **Profiles**: cProfile of one ``num_workers=0`` epoch of each loader (numeric table), and of the main process
   of the mixture with 2 workers for its first batches: where the mixture's time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import gc
import itertools
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from bench_suite import loadavg, run_header
from suite.common import emit_report, log
from suite.tables import names as random_names

from arrowstream import Mixture, Source, StructuredDataset
from arrowstream._tools.bench import raw_convert

RESULT_PREFIX = "MIX_RESULT "
BATCH = 1024
ROW_GROUP_ROWS = 65536
WEIGHTS = {"a": 0.5, "b": 0.3, "c": 0.2}
FILES = {"a": 5, "b": 3, "c": 2}   # files per source, in proportion to its rows
EMB_SIZE = 4
WORKER_COUNTS = (0, 2)
RESUME_WORKERS = 2
RESUME_AT = 0.5
THROUGHPUT_GOAL = 0.9   # mixture rows/s >= 0.9 x single, medians
RESUME_GOAL = 1.5       # mixture resume <= 1.5 x single, medians
PROFILE_TOP = 12
PROFILE_WORKER_BATCHES = 300   # the 2-worker profile covers this many batches (the epoch can be slow)
SINGLE, MIXTURE = "single source", "mixture (3 sources)"
RAW = "raw pyarrow loop"   # the baseline: pyarrow's reader over the same files, no shuffle, in this process
_STARTED = time.perf_counter()

warnings.filterwarnings("ignore", message=".*not writable.*")


def progress(message: str) -> None:
    log(f"{time.perf_counter() - _STARTED:6.0f} s  {message}")


# == data ======================================================================================


@dataclass(frozen=True)
class Layout:
    """One table written as three source folders and one folder of links to all their files."""

    kind: str
    root: str
    rows: int
    id_sum: int
    source_rows: dict[str, int]
    bytes: int

    def folder(self, name: str) -> str:
        return str(Path(self.root) / name)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "root": self.root, "rows": self.rows, "id_sum": self.id_sum,
                "source_rows": self.source_rows, "bytes": self.bytes}


def make_part(kind: str, rng: np.random.Generator, start: int, rows: int) -> pa.Table:
    columns: dict[str, Any] = {f"f{i}": rng.standard_normal(rows, dtype=np.float32) for i in range(8)}
    columns["id"] = np.arange(start, start + rows, dtype=np.int64)
    columns["user"] = rng.integers(0, 1 << 40, size=rows, dtype=np.int64)
    columns["label"] = rng.integers(0, 10, size=rows, dtype=np.int8)
    if kind == "mixed":
        columns["name"] = random_names(rng, rows)
        values = pa.array(rng.standard_normal(rows * EMB_SIZE, dtype=np.float32))
        columns["emb"] = pa.FixedSizeListArray.from_arrays(values, EMB_SIZE)
    return pa.table(columns)


def source_sizes(rows: int) -> dict[str, int]:
    """Rows per source in the weights' proportions; the last takes the rounding."""
    sizes = {name: int(rows * weight) for name, weight in list(WEIGHTS.items())[:-1]}
    sizes[list(WEIGHTS)[-1]] = rows - sum(sizes.values())
    return sizes


def write_layout(root: Path, kind: str, rows: int, seed: int) -> Layout:
    """Sources ``a``, ``b``, ``c`` (ids run on across them) and ``all``: hard links to the same files."""
    rng = np.random.default_rng([seed, 0 if kind == "numeric" else 1])
    everything = root / "all"
    everything.mkdir(parents=True)
    start, size = 0, 0
    sizes = source_sizes(rows)
    for name, count in sizes.items():
        folder = root / name
        folder.mkdir()
        bounds = np.linspace(0, count, FILES[name] + 1).astype(np.int64).tolist()
        for index, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            path = folder / f"part-{index:03d}.parquet"
            pq.write_table(make_part(kind, rng, start + lo, hi - lo), path, row_group_size=ROW_GROUP_ROWS,
                           compression="snappy")
            os.link(path, everything / f"{name}-part-{index:03d}.parquet")
            size += path.stat().st_size
        start += count
    return Layout(kind, str(root), rows, rows * (rows - 1) // 2, sizes, size)


# == the two loaders ===========================================================================


def build_loader(variant: str, layout: Layout, num_workers: int, shuffle: bool) -> tuple[Any, Any]:
    """``(loader, dataset)`` of the variant; the dataset is set to epoch 0."""
    common: dict[str, Any] = {"batch_size": BATCH, "num_workers": num_workers, "shuffle": shuffle, "seed": 0,
                              "output_format": "torch", "plan_cache": False}
    if variant == SINGLE:
        loader, dataset = StructuredDataset.create_dataloader(path=layout.folder("all"), **common)
    else:
        sources = {name: Source(layout.folder(name)) for name in WEIGHTS}
        loader, dataset = Mixture.create_dataloader(sources=sources, weights=WEIGHTS, epoch_rows=layout.rows, **common)
        if dataset.quotas() != layout.source_rows:
            raise RuntimeError(f"mixture quotas {dataset.quotas()} differ from the sources' rows {layout.source_rows}")
    dataset.set_epoch(0)
    return loader, dataset


def shutdown(iterator: Any) -> None:
    """Stop a multi-process iterator's workers now (the loader keeps a reference to it)."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if stop is not None:
        stop()


def batch_facts(batch: dict[str, Any]) -> dict[str, int]:
    ids = batch["id"]
    return {"rows": len(ids), "first_id": int(ids[0]), "id_sum": int(ids.sum())}


# == 1. throughput =============================================================================


@dataclass(frozen=True)
class Epoch:
    build_s: float
    first_s: float
    total_s: float
    cpu_s: float   # CPU time of this process (all its threads) over the epoch: with 0 workers, the whole cost
    rows: int
    first_rows: int
    workers_cpu_s: float   # CPU time (user + system) of the epoch's worker processes, all of them

    @property
    def rps(self) -> float:
        return self.rows / self.total_s

    @property
    def steady_rps(self) -> float:
        """Rows/s after the first batch: the rate once the workers run, without their start-up and the first
        windows' fill (which the resume goal measures)."""
        return (self.rows - self.first_rows) / (self.total_s - self.first_s)


def time_epoch(variant: str, layout: Layout, num_workers: int, shuffle: bool) -> Epoch:
    start = time.perf_counter()
    loader, _ = build_loader(variant, layout, num_workers, shuffle)
    built, cpu_start, children = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    iterator = iter(loader)
    first = next(iterator)
    first_at = time.perf_counter()
    rows, id_sum = len(first["id"]), int(first["id"].sum())
    for batch in iterator:
        rows += len(batch["id"])
        id_sum += int(batch["id"].sum())
    end, cpu_end = time.perf_counter(), time.process_time()
    shutdown(iterator)   # the workers exit (they have, at the end of an epoch) and are counted below
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    workers_cpu = after.ru_utime - children.ru_utime + after.ru_stime - children.ru_stime
    if (rows, id_sum) != (layout.rows, layout.id_sum):
        raise RuntimeError(f"{variant}, num_workers={num_workers}, {layout.kind}: {rows} rows (id sum {id_sum}), "
                           f"expected every row once: {layout.rows} (id sum {layout.id_sum})")
    return Epoch(built - start, first_at - built, end - built, cpu_end - cpu_start, rows, len(first["id"]), workers_cpu)


def time_raw(layout: Layout) -> Epoch:
    """The raw pyarrow loop over the files of ``all``: ``iter_batches(batch_size=1024)`` file after file, each
    batch converted as ``arrowstream bench`` does (numbers to tensors); what decoding alone costs here."""
    start = time.perf_counter()
    cpu_start = time.process_time()
    paths = sorted(Path(layout.folder("all")).iterdir())
    rows, id_sum, first_at, first_rows = 0, 0, 0.0, 0
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
            ids = raw_convert(batch)["id"]
            rows += len(ids)
            id_sum += int(ids.sum())
            if not first_at:
                first_at, first_rows = time.perf_counter(), len(ids)
    end, cpu_end = time.perf_counter(), time.process_time()
    if (rows, id_sum) != (layout.rows, layout.id_sum):
        raise RuntimeError(f"{RAW}, {layout.kind}: {rows} rows (id sum {id_sum}), expected {layout.rows} ({layout.id_sum})")
    return Epoch(0.0, first_at - start, end - start, cpu_end - cpu_start, rows, first_rows, 0.0)


def rotate(names: list[Any], round_index: int) -> list[Any]:
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def run_throughput(layout: Layout, repeats: int, shuffle: bool) -> dict[tuple[str, int], list[Epoch]]:
    keys = [(RAW, 0)] + [(variant, workers) for workers in WORKER_COUNTS for variant in (SINGLE, MIXTURE)]
    time_raw(layout)
    for variant in (SINGLE, MIXTURE):   # warm-up: imports, page cache, allocator
        time_epoch(variant, layout, 0, shuffle)
    samples: dict[tuple[str, int], list[Epoch]] = {key: [] for key in keys}
    for round_index in range(repeats):
        for variant, workers in rotate(keys, round_index):
            gc.collect()
            epoch = time_raw(layout) if variant == RAW else time_epoch(variant, layout, workers, shuffle)
            samples[(variant, workers)].append(epoch)
            progress(f"{layout.kind} round {round_index + 1}/{repeats}, {variant}, num_workers={workers}: "
                     f"{epoch.total_s:.2f} s, {epoch.rps / 1e6:.2f} M rows/s")
    return samples


# == 2. resume in a fresh process ==============================================================


@dataclass(frozen=True)
class Checkpoint:
    variant: str
    state_file: str | None      # None: a fresh start, for reference
    batches_before: int
    batches_total: int
    state_bytes: int
    expected: dict[str, int]    # the batch that follows


def take_checkpoint(variant: str, layout: Layout, shuffle: bool, work: Path) -> list[Checkpoint]:
    """The first batch of the epoch (for the fresh start), and the state at RESUME_AT with its next batch."""
    loader, _ = build_loader(variant, layout, RESUME_WORKERS, shuffle)
    total = len(loader)
    before = max(1, round(total * RESUME_AT))
    iterator = iter(loader)
    first = batch_facts(next(iterator))
    for _ in range(before - 1):
        next(iterator)
    state = loader.state_dict()
    following = batch_facts(next(iterator))
    shutdown(iterator)
    text = json.dumps(state)
    path = work / f"state-{'single' if variant == SINGLE else 'mixture'}.json"
    path.write_text(text)
    return [Checkpoint(variant, None, 0, total, 0, first),
            Checkpoint(variant, str(path), before, total, len(text), following)]


def child_resume(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: build the loader, load the state (if any), take one batch."""
    layout = Layout(**spec["layout"])
    state = None if spec["state_file"] is None else json.loads(Path(spec["state_file"]).read_text())
    start = time.perf_counter()
    loader, _ = build_loader(spec["variant"], layout, RESUME_WORKERS, spec["shuffle"])
    built = time.perf_counter()
    if state is not None:
        loader.load_state_dict(state)
    loaded = time.perf_counter()
    iterator = iter(loader)
    batch = next(iterator)
    first = time.perf_counter()
    shutdown(iterator)
    return {"build_s": built - start, "load_s": loaded - built, "first_s": first - loaded, "total_s": first - start,
            "batch": batch_facts(batch)}


@dataclass
class ResumeSeries:
    checkpoint: Checkpoint
    runs: list[dict[str, Any]] = field(default_factory=list)

    def values(self, key: str) -> list[float]:
        return [float(run[key]) for run in self.runs]

    @property
    def exact(self) -> bool:
        return all(run["batch"] == self.checkpoint.expected for run in self.runs)


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                          check=False, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"resume child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {**json.loads(lines[-1][len(RESULT_PREFIX):]), "process_s": time.perf_counter() - started}


def run_resume(layout: Layout, repeats: int, shuffle: bool, work: Path) -> list[ResumeSeries]:
    series = [ResumeSeries(c) for variant in (SINGLE, MIXTURE) for c in take_checkpoint(variant, layout, shuffle, work)]
    progress("resume: checkpoints taken")
    for round_index in range(repeats + 1):   # round 0 is a warm-up
        for entry in rotate(series, round_index):
            spec = {"variant": entry.checkpoint.variant, "state_file": entry.checkpoint.state_file,
                    "layout": layout.to_json(), "shuffle": shuffle}
            run = run_child(spec)
            if round_index:
                entry.runs.append(run)
        progress(f"resume round {round_index}/{repeats}{' (warm-up)' if not round_index else ''}")
    return series


# == 3. profiles ===============================================================================


@dataclass(frozen=True)
class ProfileRow:
    function: str
    calls: int
    own_s: float
    cumulative_s: float


@dataclass(frozen=True)
class Profile:
    label: str
    total_s: float
    rows: int
    entries: list[ProfileRow]

    def top_own(self, count: int = PROFILE_TOP) -> list[ProfileRow]:
        return sorted(self.entries, key=lambda r: r.own_s, reverse=True)[:count]

    def top_cumulative(self, needle: str, count: int = PROFILE_TOP) -> list[ProfileRow]:
        return sorted((r for r in self.entries if needle in r.function), key=lambda r: r.cumulative_s,
                      reverse=True)[:count]


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


def profile_epoch(label: str, variant: str, layout: Layout, num_workers: int, shuffle: bool,
                  max_batches: int | None = None) -> Profile:
    loader, _ = build_loader(variant, layout, num_workers, shuffle)
    profiler = cProfile.Profile()
    rows = 0
    iterator = iter(loader)
    profiler.enable()
    for index, batch in enumerate(iterator):
        rows += len(batch["id"])
        if max_batches is not None and index + 1 >= max_batches:
            break
    profiler.disable()
    shutdown(iterator)
    stats = pstats.Stats(profiler)
    entries = [ProfileRow(describe(key), calls, own, cumulative)
               for key, (_, calls, own, cumulative, _) in stats.stats.items()]  # type: ignore[attr-defined]
    return Profile(label, stats.total_tt, rows, entries)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Profiles:
    epochs: dict[str, tuple[Profile, Profile]]   # per table: (single, mixture), one num_workers=0 epoch each
    workers: Profile                               # the mixture's main process with 2 workers


def run_profiles(layouts: list[Layout], shuffle: bool) -> Profiles:
    epochs = {layout.kind: (profile_epoch(f"{layout.kind} table, {SINGLE}, num_workers=0, one epoch", SINGLE,
                                          layout, 0, shuffle),
                            profile_epoch(f"{layout.kind} table, {MIXTURE}, num_workers=0, one epoch", MIXTURE,
                                          layout, 0, shuffle))
              for layout in layouts}
    workers = profile_epoch(f"{layouts[0].kind} table, {MIXTURE}, num_workers=2, main process, first "
                            f"{PROFILE_WORKER_BATCHES} batches", MIXTURE, layouts[0], 2, shuffle,
                            PROFILE_WORKER_BATCHES)
    return Profiles(epochs, workers)


# == report ====================================================================================


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join([" --- "] + [" ---: "] * (len(header) - 1)) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def throughput_ratio(samples: dict[tuple[str, int], list[Epoch]], workers: int,
                     steady: bool = False) -> tuple[float, float]:
    """Mixture / single rows/s (over the epoch, or after its first batch): (median / median, best / best)."""
    single, mixed = ([e.steady_rps if steady else e.rps for e in samples[(v, workers)]] for v in (SINGLE, MIXTURE))
    return median(mixed) / median(single), max(mixed) / max(single)


def cpu_ratio(samples: dict[tuple[str, int], list[Epoch]], workers: int, of_workers: bool = False) -> float:
    """Mixture / single CPU time per epoch (medians) of this process (with 0 workers, the loader's whole cost,
    less blurred by the neighbours' load than wall time) or of the worker processes."""
    single, mixed = ([e.workers_cpu_s if of_workers else e.cpu_s for e in samples[(v, workers)]]
                     for v in (SINGLE, MIXTURE))
    return median(mixed) / median(single)


def throughput_section(layout: Layout, samples: dict[tuple[str, int], list[Epoch]]) -> list[str]:
    rows = []
    raw_rps = median([e.rps for e in samples[(RAW, 0)]])
    for (variant, workers), epochs in samples.items():
        rps = [e.rps for e in epochs]
        ratio = "–" if variant in (SINGLE, RAW) else "{:.2f}x / {:.2f}x".format(*throughput_ratio(samples, workers))
        steady = "–" if variant in (SINGLE, RAW) else f"{throughput_ratio(samples, workers, steady=True)[0]:.2f}x"
        built = "–" if variant == RAW else f"{median([e.build_s * 1e3 for e in epochs]):,.0f}"
        rows.append([variant, str(workers), built,
                     f"{median([e.first_s * 1e3 for e in epochs]):,.1f}",
                     f"{median([e.total_s for e in epochs]):.2f} ({min(e.total_s for e in epochs):.2f})",
                     f"{median(rps) / 1e6:.2f} M ({max(rps) / 1e6:.2f} M)", f"{median(rps) / raw_rps:.2f}x", ratio,
                     f"{median([e.steady_rps for e in epochs]) / 1e6:.2f} M", steady,
                     f"{median([e.cpu_s for e in epochs]):.2f}",
                     f"{median([e.workers_cpu_s for e in epochs]):.2f}" if workers else "–"])
    kind = ("8 float32, `id` and `user` int64, `label` int8" if layout.kind == "numeric" else
            "8 float32, `id` and `user` int64, `label` int8, `name` string (4-12 chars), "
            f"`emb` fixed_size_list<float32, {EMB_SIZE}>")
    sizes = " / ".join(f"{n:,}" for n in layout.source_rows.values())
    return [f"### {layout.kind.capitalize()} table", "",
            (f"{layout.rows:,} rows ({sizes} in sources a / b / c; {layout.bytes / 2**20:,.0f} MiB of Parquet); "
             f"columns: {kind}."), "",
            *table(["loader", "num_workers", "construction ms", "first batch ms", "epoch s (best)",
                    "rows/s (best)", "/ raw pyarrow loop (medians)", "mixture / single: median (best)", "rows/s after the first batch",
                    "mixture / single after the first batch", "CPU s of this process", "CPU s of the workers"],
                  rows), ""]


def resume_section(series: list[ResumeSeries]) -> list[str]:
    rows = []
    for entry in series:
        c = entry.checkpoint
        label = "fresh start (no state)" if c.state_file is None else f"{c.batches_before:,} of {c.batches_total:,} batches"
        rows.append([c.variant, label, f"{c.state_bytes:,}" if c.state_file else "–",
                     f"{median(entry.values('build_s')) * 1e3:,.0f}",
                     f"{median(entry.values('load_s')) * 1e3:,.1f}",
                     f"{median(entry.values('first_s')) * 1e3:,.0f}",
                     f"{median(entry.values('total_s')) * 1e3:,.0f} ({min(entry.values('total_s')) * 1e3:,.0f})",
                     f"{median(entry.values('process_s')):.2f}", "yes" if entry.exact else "**no**"])
    return table(["loader", "checkpoint", "state bytes", "construction ms", "load_state_dict ms",
                  "iter() to first batch ms", "total ms (best)", "process s, with imports", "expected batch"], rows)


def resume_ratio(series: list[ResumeSeries], state: bool) -> tuple[float, float]:
    """Mixture / single total: (median / median, best / best)."""
    pick = {e.checkpoint.variant: e.values("total_s") for e in series if (e.checkpoint.state_file is not None) == state}
    return median(pick[MIXTURE]) / median(pick[SINGLE]), min(pick[MIXTURE]) / min(pick[SINGLE])


def profile_section(profile: Profile) -> list[str]:
    rows = [[f"`{r.function}`", f"{r.calls:,}", f"{r.own_s:.3f}", f"{r.own_s / profile.total_s:.0%}",
             f"{r.cumulative_s:.3f}", f"{r.cumulative_s / profile.total_s:.0%}"] for r in profile.top_own()]
    cumulative = [[f"`{r.function}`", f"{r.calls:,}", f"{r.cumulative_s:.3f}", f"{r.cumulative_s / profile.total_s:.0%}"]
                  for r in profile.top_cumulative("arrowstream/")]
    return [f"#### {profile.label}", "",
            f"{profile.total_s:.2f} s under the profiler, {profile.rows:,} rows. By own time:", "",
            *table(["function", "calls", "own s", "own %", "cumulative s", "cumulative %"], rows), "",
            "arrowstream functions by cumulative time:", "",
            *table(["function", "calls", "cumulative s", "cumulative %"], cumulative), ""]


def matching(profile: Profile, needles: tuple[str, ...]) -> list[ProfileRow]:
    return [r for r in profile.entries if all(needle in r.function for needle in needles)]


def share_of(profile: Profile, *needles: str, own: bool = False) -> float:
    """The largest cumulative (or own) share of a function whose name holds every needle (0 if none)."""
    return max(((r.own_s if own else r.cumulative_s) / profile.total_s for r in matching(profile, needles)),
               default=0.0)


def seconds_in(profile: Profile, *needles: str, own: bool = False) -> float:
    """The largest cumulative (or own) seconds of a function whose name holds every needle (0 if none)."""
    return share_of(profile, *needles, own=own) * profile.total_s


def calls_of(profile: Profile, *needles: str) -> int:
    return sum(r.calls for r in matching(profile, needles))


@dataclass(frozen=True)
class Breakdown:
    """A profiled num_workers=0 epoch in microseconds per batch: reading, conversion, and all the rest
    (the loader, cutting batches, bookkeeping); for a mixture, the parts of the rest that only it has."""

    batches: int
    read_us: float
    convert_us: float
    rest_us: float
    shares_us: float        # shares_after: each source's rows in the batch (integers)
    takes_us: float         # SourceRows.take_marked, reading excluded: each source's rows of a span, one pass
    cut_us: float           # MixStream.next_span's own time: planning the span's batches

    @classmethod
    def of(cls, profile: Profile) -> Breakdown:
        batches = -(-profile.rows // BATCH)
        per = 1e6 / batches
        read, convert = seconds_in(profile, "(_read_once)"), seconds_in(profile, "(to_torch)")
        take = seconds_in(profile, "arrowstream/_mixing/stream.py", "(take_marked)")   # 0 for the single source
        takes = max(0.0, take - seconds_in(profile, "arrowstream/_core/stream.py", "(fill)")) if take else 0.0
        return cls(batches, read * per, convert * per, (profile.total_s - read - convert) * per,
                   seconds_in(profile, "(shares_after)") * per, takes * per,
                   seconds_in(profile, "_mix_stream.py", "(next_span)", own=True) * per)


def breakdown_section(profiles: Profiles) -> list[str]:
    rows = []
    for kind, pair in profiles.epochs.items():
        for variant, profile in zip((SINGLE, MIXTURE), pair, strict=True):
            b = Breakdown.of(profile)
            extra = (f"{b.shares_us:.0f} / {b.takes_us:.0f} / {b.cut_us:.0f}" if variant == MIXTURE else "–")
            rows.append([kind, variant, f"{b.batches:,}", f"{profile.total_s:.2f}", f"{b.read_us:.0f}",
                         f"{b.convert_us:.0f}", f"{b.rest_us:.0f}", extra])
    return table(["table", "loader", "batches", "profiled s", "reading + decoding", "to_torch", "the rest",
                  "of the rest: shares_after / SourceRows.take_marked without reading / MixStream.next_span own"], rows)


def reading(throughput: dict[str, dict[tuple[str, int], list[Epoch]]], resume: list[ResumeSeries],
            profiles: Profiles | None) -> list[str]:
    lines = []
    for kind, samples in throughput.items():
        raw = median([e.rps for e in samples[(RAW, 0)]])
        against = ", ".join(f"{variant} with {workers} workers {median([e.rps for e in samples[(variant, workers)]]) / raw:.2f}x"
                            for workers in WORKER_COUNTS for variant in (SINGLE, MIXTURE))
        lines.append(f"- The raw pyarrow loop over the {kind} table's files (no shuffle, this process): {raw / 1e6:.2f} M "
                     f"rows/s; against it (medians): {against}")
        for workers in WORKER_COUNTS:
            ratio, best = throughput_ratio(samples, workers)
            steady, _ = throughput_ratio(samples, workers, steady=True)
            cpu = (f"; CPU time of the process per epoch, mixture / single: {cpu_ratio(samples, 0):.2f}x"
                   if workers == 0 else
                   f"; CPU time of the workers per epoch, mixture / single: {cpu_ratio(samples, workers, True):.2f}x")
            lines.append(f"- Throughput, {kind} table, `num_workers={workers}`: mixture / single = {ratio:.2f}x "
                         f"over the epoch (rows/s, medians; bests {best:.2f}x), {steady:.2f}x after the first batch"
                         f"{cpu}; goal >= {THROUGHPUT_GOAL}x: over the epoch {verdict(ratio >= THROUGHPUT_GOAL)}, "
                         f"after the first batch {verdict(steady >= THROUGHPUT_GOAL)}")
    if resume:
        ratio, best = resume_ratio(resume, state=True)
        fresh, _ = resume_ratio(resume, state=False)
        exact = all(entry.exact for entry in resume)
        lines.append(f"- Resume at {RESUME_AT:.0%} in a fresh process, `num_workers={RESUME_WORKERS}`: mixture / "
                     f"single = {ratio:.2f}x (medians of construction + load_state_dict + first batch; bests "
                     f"{best:.2f}x; a fresh start without a state: {fresh:.2f}x); goal <= {RESUME_GOAL}x "
                     f"{verdict(ratio <= RESUME_GOAL)}. Every resumed process "
                     + ("took exactly the batch that followed its checkpoint." if exact else
                        "**did not take the batch that followed its checkpoint** (see the table)."))
    if profiles is not None:
        for kind, (single, mixture) in profiles.epochs.items():
            a, b = Breakdown.of(single), Breakdown.of(mixture)
            lines.append(
                f"- Where a `num_workers=0` epoch goes, {kind} table (cProfile, microseconds per batch, single / "
                f"mixture): reading and decoding {a.read_us:.0f} / {b.read_us:.0f}, conversion to tensors "
                f"{a.convert_us:.0f} / {b.convert_us:.0f}, the rest {a.rest_us:.0f} / {b.rest_us:.0f}; of the "
                f"mixture's rest, `shares_after` (each source's rows per batch, integers) {b.shares_us:.0f}, "
                f"`SourceRows.take_marked` without the reading (each source's rows of a span) {b.takes_us:.0f}, "
                f"`MixStream.next_span`'s own time (planning the span's batches) {b.cut_us:.0f} (section 3).")
        nw2 = profiles.workers
        lines.append(
            f"- Where the mixture's main process goes with 2 workers (numeric table, first "
            f"{PROFILE_WORKER_BATCHES} batches): unpickling batches (`_pickle.loads`) "
            f"{share_of(nw2, '_pickle.loads'):.0%}, of which `resource_sharer.get_connection` "
            f"{share_of(nw2, 'resource_sharer.py', '(get_connection)'):.0%}: a new connection per tensor to receive "
            f"its shared-memory file descriptor ({calls_of(nw2, 'resource_sharer.py', '(get_connection)'):,} "
            f"connections for {nw2.rows:,} rows). Like `StructuredDataset`'s, the mixture's workers send "
            f"`batches_per_transfer` batches per message through a shared buffer (`arrowstream/_worker/transport.py`); "
            f"the first version sent each batch's tensors on their own, a connection per tensor (0.04x).")
    return lines


def report(args: argparse.Namespace, layouts: list[Layout], throughput: dict[str, dict[tuple[str, int], list[Epoch]]],
           resume: list[ResumeSeries], profiles: Profiles | None, seconds: float, load_before: str) -> str:
    lines = [*run_header("Weighted mixing against one source", "bench_mixing.py", load_before, seconds),
             (f"- Both loaders: `batch_size={BATCH}`, `shuffle={args.shuffle}`, `seed=0`, `output_format=\"torch\"`, "
             "`plan_cache=False`. Mixture: `weights={'a': 0.5, 'b': 0.3, 'c': 0.2}`, `epoch_rows` = all rows "
             "(each quota is its source's rows); single: `StructuredDataset` over a folder of hard links to the "
             "same ten files. Every timed epoch is checked to yield every row once (count and sum of `id`)."), "",
             "## Goals on this run", "", *reading(throughput, resume, profiles), "",
             "## 1. Throughput, one epoch", "",
             (f"Medians of {args.repeats} rounds (bests in brackets), after an untimed warm-up epoch of each loader "
              "with 0 workers; the rounds rotate the order of the four loaders and the raw pyarrow loop (pyarrow's "
              "`iter_batches(batch_size=1024)` over the same files one after the other in this process, numbers "
              "made tensors as `arrowstream bench` does, no shuffle: the speed of decoding, measured in the same "
              "rounds; the loaders shuffle, so they gather every row once more). An epoch is timed from `iter()` to "
              "the last batch (worker start-up included); construction (listing, footers, plan) is timed apart; "
              "\"after the first batch\" divides the rows after it by the time after it: the rate once the workers "
              "run, without their start-up and the first shuffle windows' fill (a mixture fills one per source; "
              "section 2 measures that wait). "
              "The ratio column divides the mixture's rows/s by the single source's: median by median, best by "
              "best; the goals are judged on the medians. \"CPU s\" is this process's CPU time over the epoch "
              "(all its threads; the median): with 0 workers it is the loader's whole cost, and the neighbours' "
              "load blurs it less than wall time; \"CPU s of the workers\" is their user and system time over the epoch "
              "(both workers, from `getrusage` of the children once they exited). The files sit in the page cache."), ""]
    for layout in layouts:
        lines += throughput_section(layout, throughput[layout.kind])
    if resume:
        lines += ["## 2. Resume to the first batch in a fresh process", "",
                  (f"Numeric table, `num_workers={RESUME_WORKERS}`. The parent iterates {RESUME_AT:.0%} of an epoch, "
                   "saves `json.dumps(loader.state_dict())` and notes the next batch; then a fresh Python process "
                   "(numpy, pyarrow, torch and arrowstream imported before the clock) builds the loader, calls "
                   "`load_state_dict` and takes one batch, checked (row count, first `id`, sum of `id`) against the "
                   f"batch that followed. Medians of {args.resume_repeats} rounds after a warm-up round (best of "
                   "the totals in brackets); \"fresh start\" is the same process without a state."), "",
                  *resume_section(resume), ""]
    if profiles is not None:
        lines += ["## 3. Profiles", "",
                  ("cProfile in this process (which inflates Python-level costs), one `num_workers=0` epoch of each "
                   "loader per table, and the mixture's main process with 2 workers. cProfile does not see inside "
                   "pyarrow's Cython code: Parquet decoding shows as the own time of `read_units`, "
                   "`pa.concat_batches` as the own time of its caller. Workers are not profiled. In microseconds per "
                   "batch: reading + decoding is the cumulative time of `SplitReader._read_once`, `to_torch` that of "
                   "the conversion, the rest everything else (the loader, cutting batches, bookkeeping)."), "",
                  *breakdown_section(profiles), ""]
        for single, mixture in profiles.epochs.values():
            lines += profile_section(single) + profile_section(mixture)
        lines += profile_section(profiles.workers)
    return "\n".join(lines).rstrip() + "\n"


# == main ======================================================================================


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small tables, 1 round; prints only")
    parser.add_argument("--numeric-rows", type=int, default=None, help="rows of the numeric table (default 4,000,000)")
    parser.add_argument("--mixed-rows", type=int, default=None, help="rows of the mixed table (default 4,000,000)")
    parser.add_argument("--repeats", type=int, default=None, help="throughput rounds (default 3)")
    parser.add_argument("--resume-repeats", type=int, default=None, help="resume rounds (default 5)")
    parser.add_argument("--no-shuffle", dest="shuffle", action="store_false", help="shuffle=False (default True)")
    parser.add_argument("--skip", default="", help="parts to leave out: resume,profiles")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated data (default 0)")
    parser.add_argument("--out", type=Path, default=None, help="report path (default results/<date>-mixing.md)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    quick = args.quick
    args.numeric_rows = args.numeric_rows or (200_000 if quick else 4_000_000)
    args.mixed_rows = args.mixed_rows or (100_000 if quick else 4_000_000)
    args.repeats = args.repeats or (1 if quick else 3)
    args.resume_repeats = args.resume_repeats or (1 if quick else 5)
    args.skip = {s for s in args.skip.split(",") if s}
    if args.skip - {"resume", "profiles"}:
        parser.error(f"--skip: unknown parts {sorted(args.skip - {'resume', 'profiles'})}")
    if min(args.numeric_rows, args.mixed_rows) < 10 * BATCH:
        parser.error(f"--numeric-rows and --mixed-rows: at least {10 * BATCH:,} rows")
    if args.out is None and not quick:
        args.out = BENCH_DIR / "results" / f"{dt.date.today().isoformat()}-mixing.md"
    return args


def main() -> int:
    args = parse_args()
    if args.child is not None:
        print(RESULT_PREFIX + json.dumps(child_resume(json.loads(args.child))), flush=True)
        return 0
    start, load_before = time.perf_counter(), loadavg()
    data_root = BENCH_DIR / "data"
    data_root.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-mixing-", dir=data_root) as tmp:
        work = Path(tmp)
        layouts = []
        for kind, rows in (("numeric", args.numeric_rows), ("mixed", args.mixed_rows)):
            progress(f"writing the {kind} table, {rows:,} rows")
            layouts.append(write_layout(work / kind, kind, rows, args.seed))
        throughput = {}
        for layout in layouts:
            throughput[layout.kind] = run_throughput(layout, args.repeats, args.shuffle)
        resume = [] if "resume" in args.skip else run_resume(layouts[0], args.resume_repeats, args.shuffle, work)
        progress("profiles")
        profiles = None if "profiles" in args.skip else run_profiles(layouts, args.shuffle)
    emit_report(report(args, layouts, throughput, resume, profiles, time.perf_counter() - start, load_before),
                args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
