"""``order="canonical"`` against the default ``order="topology"``: throughput and resume (issue #39, point 5).

Run from the repository root:

    .venv/bin/python benchmarks/bench_canonical.py            # the real run: 2,000,000 rows per table, world sizes 1 and 8
    .venv/bin/python benchmarks/bench_canonical.py --quick    # smoke run: 100,000 rows, 1 round, prints only
    .venv/bin/python benchmarks/bench_canonical.py --world-size 8   # rank 0 of 8 only

The suite's two tables (``suite/tables.py``: *numeric*, *mixed*; 8 Parquet files, row groups of 65,536 rows),
written into ``benchmarks/data/`` (git-ignored) and reused by later runs. Every arrowstream loader has
``batch_size=1024`` (per rank), ``output_format="torch"``, ``seed=0``, epoch 0, ``plan_cache=False`` (cold planning
included) and is rank 0 of ``W`` (``rank=0, world_size=W``) for each world size ``W`` of ``--world-size`` (default:
both 1 and 8). The throughput of ``order="canonical", canonical_slots=64`` depends on its chunk, the rows each
canonical slot gives a global batch: ``batch_size x W / 64``, 16 rows on 1 rank, 128 on 8 (a real job's: 8 GPUs x
1024). On ``W`` > 1 rank 0 reads its share of the epoch (about 1/W of the rows), planning the whole epoch as every
rank does; the other ranks are not run.

1. **Throughput**: one epoch of each table, in this process, of the suite's raw pyarrow loop (``iter_batches`` file
   after file over the whole table, numeric columns to tensors, the others to lists) and of ``order="topology"`` and
   ``order="canonical", canonical_slots=64``, each with ``num_workers`` 0 and 2, ``shuffle=True`` (the default
   buffer) and ``shuffle=False``, on each world size. Rows/s (the rows rank 0 yields; the raw loop's: the whole
   table) from before ``create_dataloader`` to the last batch, and after the first batch. Every epoch is checked to
   yield each of its rows once: the raw loop every row of the table, a loader rank 0's rows of the epoch
   (``dataset.rank_yields(num_workers)``: that many rows in ``len(loader)`` batches), the ``id`` values distinct and
   in the table. Rounds run every loader of every world size and the raw loop once, the order rotated per round,
   after an untimed warm-up round; medians of ``--repeats`` rounds (default 3).
2. **Resume**: a state of rank 0 of ``W`` taken at 50% of its epoch of the numeric table (``shuffle=True``), saved
   as JSON; then a fresh Python process (imports before the clock) builds the same loader (rank 0 of ``W``), and the
   clock runs from ``loader.load_state_dict(state)`` to the first batch, which is checked to be the batch that
   followed the checkpoint. Topology and canonical, ``num_workers`` 0 and 2, each world size; beside them, the raw
   pyarrow loop's first batch at the row 50% into the table in a fresh process (open the file, ``iter_batches`` of
   the row group holding it). Medians of ``--resume-repeats`` rounds (default 5) after a warm-up round.
3. **Profile**: cProfile of one ``order="canonical"`` epoch with ``num_workers=0`` (numeric table, ``shuffle=True``,
   rank 0 of the first world size: 1 by default), the functions with the most own time, and the read calls of both
   orders.

Goals (issue #39): canonical / topology throughput >= 0.9x, resume time <= 1.5x (medians), reported for each world
size side by side. The report goes to stdout and to ``benchmarks/results/<date>-canonical.md`` (``--out`` to
change; ``--quick`` writes only with ``--out``); progress goes to stderr. ``--skip resume,profile`` leaves parts out.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import functools
import gc
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_suite import RESULTS, loadavg, run_header
from suite import tables
from suite.baselines import convert, raw_batches
from suite.common import RESULT_PREFIX, emit_report, log
from suite.report import fmt_ms, fmt_ratio, fmt_rps

from arrowstream import StructuredDataset

BATCH = 1024            # per rank
SLOTS = 64
WORKERS = (0, 2)
WORLD_SIZES = (1, 8)    # rank 0 of each
RESUME_AT = 0.5
RAW = "raw pyarrow loop"
THROUGHPUT_GOAL = 0.9   # canonical / topology rows/s, medians
RESUME_GOAL = 1.5       # canonical / topology time from load_state_dict to the first batch, medians
PROFILE_TOP = 15


def chunk_rows(world_size: int) -> int:
    """Rows each canonical slot gives a global batch of ``BATCH x world_size`` rows."""
    return BATCH * world_size // SLOTS


@dataclass(frozen=True)
class Loader:
    """One arrowstream configuration (``order`` "topology" or "canonical"), rank 0 of ``world_size``."""

    order: str
    num_workers: int
    shuffle: bool
    world_size: int = 1

    @property
    def label(self) -> str:
        order = f'order="canonical", canonical_slots={SLOTS}' if self.order == "canonical" else 'order="topology"'
        rank = f", rank=0, world_size={self.world_size}" if self.world_size > 1 else ""
        return f"{order}, num_workers={self.num_workers}, shuffle={self.shuffle}{rank}"

    def build(self, files: list[str], slots: int = SLOTS) -> tuple[Any, Any]:
        extra: dict[str, Any] = {"canonical_slots": slots} if self.order == "canonical" else {}
        loader, dataset = StructuredDataset.create_dataloader(
            path=files, batch_size=BATCH, num_workers=self.num_workers, shuffle=self.shuffle, seed=0,
            output_format="torch", plan_cache=False, order=self.order, rank=0, world_size=self.world_size, **extra)
        dataset.set_epoch(0)
        return loader, dataset


def loaders(world_sizes: tuple[int, ...]) -> list[Loader]:
    return [Loader(order, workers, shuffle, world_size) for world_size in world_sizes for shuffle in (True, False)
            for workers in WORKERS for order in ("topology", "canonical")]


def shutdown(iterator: Any) -> None:
    """Stop a multi-process iterator's workers now (the loader keeps a reference to it)."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if stop is not None:
        stop()


def batch_facts(batch: dict[str, Any]) -> dict[str, int]:
    ids = batch["id"]
    return {"rows": len(ids), "first_id": int(ids[0]), "id_sum": int(ids.sum())}


def rotate(items: list[Any], round_index: int) -> list[Any]:
    shift = round_index % len(items)
    return items[shift:] + items[:shift]


def median(values: list[float]) -> float:
    return statistics.median(values)


def table_lines(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1),
            *("| " + " | ".join(row) + " |" for row in rows)]


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


# == 1. throughput =============================================================================


@dataclass(frozen=True)
class Epoch:
    first_s: float   # from before create_dataloader to the first batch
    total_s: float   # ... to the last batch
    rows: int
    first_rows: int

    @property
    def rps(self) -> float:
        return self.rows / self.total_s

    @property
    def steady_rps(self) -> float:
        return (self.rows - self.first_rows) / (self.total_s - self.first_s)


@dataclass(frozen=True)
class Share:
    """What one epoch must yield: ``rows`` rows, each once, in ``batches`` batches (None: any number)."""

    rows: int
    batches: int | None


def check_epoch(what: str, table: tables.Table, ids: list[torch.Tensor], share: Share) -> None:
    """Raise unless ``ids`` (one tensor per batch) are ``share.rows`` distinct ids of the table in ``share.batches``
    batches: a lost or a repeated row fails it."""
    every = torch.cat(ids)
    rows, distinct = every.numel(), torch.unique(every).numel()
    low, high = int(every.min()), int(every.max())
    if (rows, distinct) != (share.rows, share.rows) or low < 0 or high >= table.spec.rows or (
            share.batches is not None and len(ids) != share.batches):
        raise RuntimeError(f"{table.spec.kind}, {what}: {rows} rows ({distinct} distinct ids, {low} to {high}) in "
                           f"{len(ids)} batches, expected every row of the epoch once: {share.rows} distinct ids "
                           f"of 0 to {table.spec.rows - 1} in {share.batches or 'any number of'} batches")


Batches = tuple[Iterator[dict[str, Any]], Callable[[], Share]]


def time_batches(what: str, make: Callable[[], Batches], table: tables.Table) -> Epoch:
    """One epoch of ``make()`` (an iterator of batches and, asked after the clock, what it must yield), checked to
    hold each of its rows once."""
    start = time.perf_counter()
    iterator, share = make()
    first = next(iterator)
    first_at = time.perf_counter()
    ids = [first["id"].clone()]
    for batch in iterator:
        ids.append(batch["id"].clone())
    end = time.perf_counter()
    shutdown(iterator)
    check_epoch(what, table, ids, share())
    return Epoch(first_at - start, end - start, sum(len(i) for i in ids), len(ids[0]))


def whole_table(files: list[str], table: tables.Table) -> Batches:
    return raw_batches(files, BATCH), lambda: Share(table.spec.rows, None)


def loader_batches(config: Loader, files: list[str]) -> Batches:
    loader, dataset = config.build(files)

    def share() -> Share:   # rank 0's rows of the epoch, in len(loader) batches
        _, batches, rows = dataset.rank_yields(config.num_workers)[0]
        if batches != len(loader):
            raise RuntimeError(f"{config.label}: rank_yields says {batches} batches, len(loader) {len(loader)}")
        return Share(rows, batches)

    return iter(loader), share


def run_throughput(table: tables.Table, repeats: int, world_sizes: tuple[int, ...]) -> dict[Any, list[Epoch]]:
    files = [str(f) for f in table.files]
    keys: list[Any] = [RAW, *loaders(world_sizes)]
    samples: dict[Any, list[Epoch]] = {key: [] for key in keys}
    for round_index in range(repeats + 1):   # round 0 is a warm-up
        for key in rotate(keys, round_index):
            gc.collect()
            make: Callable[[], Batches] = (functools.partial(whole_table, files, table) if key == RAW else
                                           functools.partial(loader_batches, key, files))
            label = RAW if key == RAW else key.label
            epoch = time_batches(label, make, table)
            if round_index:
                samples[key].append(epoch)
            log(f"{table.spec.kind} round {round_index}/{repeats}{' (warm-up)' if not round_index else ''}, "
                f"{label}: {epoch.rows:,} rows, {epoch.total_s:.2f} s, {epoch.rps / 1e6:.2f} M rows/s")
    return samples


def rps_of(samples: dict[Any, list[Epoch]], key: Any) -> float:
    return median([e.rps for e in samples[key]])


def throughput_cells(epochs: list[Epoch], raw: float, base: float | None) -> list[str]:
    """One world size's columns of a line: rows/s, spread, after the first batch, vs raw, vs topology, first ms."""
    rps = median([e.rps for e in epochs])
    return [fmt_rps(rps), f"{fmt_rps(min(e.rps for e in epochs))} – {fmt_rps(max(e.rps for e in epochs))}",
            fmt_rps(median([e.steady_rps for e in epochs])), fmt_ratio(rps / raw),
            "–" if base is None else fmt_ratio(rps / base), fmt_ms(median([e.first_s for e in epochs]))]


def throughput_section(table: tables.Table, samples: dict[Any, list[Epoch]],
                       world_sizes: tuple[int, ...]) -> list[str]:
    raw = rps_of(samples, RAW)
    rows = [[RAW, "–", "–", *(throughput_cells(samples[RAW], raw, None) * len(world_sizes))]]
    for config in loaders(world_sizes[:1]):
        cells = []
        for world_size in world_sizes:
            ranked = Loader(config.order, config.num_workers, config.shuffle, world_size)
            base = rps_of(samples, Loader("topology", config.num_workers, config.shuffle, world_size))
            cells += throughput_cells(samples[ranked], raw, base if config.order == "canonical" else None)
        order = f"canonical, {SLOTS} slots" if config.order == "canonical" else "topology"
        rows.append([order, str(config.num_workers), str(config.shuffle), *cells])
    spec = table.spec
    shares = []
    for world_size in world_sizes:
        counts = sorted({e.rows for config in loaders((world_size,)) for e in samples[config]})
        held = " – ".join(f"{n:,}" for n in (counts[0], counts[-1])) if len(counts) > 1 else f"{counts[0]:,}"
        shares.append(f"W={world_size}: rank 0 of {world_size} yields {held} rows, canonical chunks of "
                      f"{chunk_rows(world_size)} rows")
    heading = (f"### {spec.kind} table ({spec.rows:,} rows, {table.row_groups} row groups, "
               f"{table.bytes / 2**20:,.0f} MiB)")
    header = ["loader", "num_workers", "shuffle"]
    for world_size in world_sizes:
        header += [f"W={world_size} rows/s (median)", f"W={world_size} min – max",
                   f"W={world_size} rows/s after 1st batch", f"W={world_size} vs raw",
                   f"W={world_size} canonical / topology", f"W={world_size} first batch ms"]
    return [heading, "", "; ".join(shares) + " (the raw loop: the whole table, the same line under every W).", "",
            *table_lines(header, rows), ""]


def throughput_ratio(samples: dict[Any, list[Epoch]], workers: int, shuffle: bool,
                     world_size: int) -> tuple[float, float, float]:
    """Canonical / topology rows/s (medians), and each / the raw loop."""
    canonical = rps_of(samples, Loader("canonical", workers, shuffle, world_size))
    topology = rps_of(samples, Loader("topology", workers, shuffle, world_size))
    raw = rps_of(samples, RAW)
    return canonical / topology, canonical / raw, topology / raw


# == 2. resume in a fresh process ==============================================================


@dataclass(frozen=True)
class Checkpoint:
    key: str                    # "raw" or a Loader's label
    config: Loader | None       # None: the raw pyarrow loop
    state_file: str | None
    row: int                    # the raw loop: the global row the first batch starts at
    batches_before: int
    batches_total: int
    state_bytes: int
    expected: dict[str, int]    # the batch that follows


def take_checkpoint(config: Loader, files: list[str], work: Path) -> Checkpoint:
    loader, _ = config.build(files)
    total = len(loader)
    before = max(1, round(total * RESUME_AT))
    iterator = iter(loader)
    for _ in range(before):
        next(iterator)
    state = loader.state_dict()
    following = batch_facts(next(iterator))
    shutdown(iterator)
    text = json.dumps(state)
    path = work / f"state-{config.order}-{config.num_workers}-w{config.world_size}.json"
    path.write_text(text)
    return Checkpoint(config.label, config, str(path), 0, before, total, len(text), following)


def raw_checkpoint(table: tables.Table) -> Checkpoint:
    """The raw loop's reference: its first batch at the row RESUME_AT into the table."""
    row = int(table.spec.rows * RESUME_AT)
    return Checkpoint(RAW, None, None, row, 0, 0, 0, {"first_id": row})


def child_resume(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: build the loader (rank 0 of its world size), then time ``load_state_dict`` (rank 0's
    own loader state) to the first batch."""
    files = spec["files"]
    if spec["config"] is None:   # the raw loop: open the file holding the row, the row group holding it
        start = time.perf_counter()
        row = spec["row"]
        for path in files:
            parquet = pq.ParquetFile(path)
            if row < parquet.metadata.num_rows:
                break
            row -= parquet.metadata.num_rows
        group = 0
        while row >= parquet.metadata.row_group(group).num_rows:
            row -= parquet.metadata.row_group(group).num_rows
            group += 1
        for batch in parquet.iter_batches(batch_size=BATCH, row_groups=[group]):
            if row < batch.num_rows:
                out = convert(batch.slice(row, min(BATCH, batch.num_rows - row)))
                break
            row -= batch.num_rows
        first = time.perf_counter()
        return {"build_s": 0.0, "load_first_s": first - start, "batch": {"first_id": int(out["id"][0])}}
    config = Loader(**spec["config"])
    state = json.loads(Path(spec["state_file"]).read_text())
    start = time.perf_counter()
    loader, _ = config.build(files)
    built = time.perf_counter()
    loader.load_state_dict(state)
    iterator = iter(loader)
    batch = next(iterator)
    first = time.perf_counter()
    shutdown(iterator)
    return {"build_s": built - start, "load_first_s": first - built, "batch": batch_facts(batch)}


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
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                          check=False, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"resume child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads(lines[-1][len(RESULT_PREFIX):]))


def run_resume(table: tables.Table, repeats: int, work: Path, world_sizes: tuple[int, ...]) -> list[ResumeSeries]:
    files = [str(f) for f in table.files]
    series = [ResumeSeries(raw_checkpoint(table))]
    series += [ResumeSeries(take_checkpoint(Loader(order, workers, True, world_size), files, work))
               for world_size in world_sizes for workers in WORKERS for order in ("topology", "canonical")]
    log("resume: checkpoints taken")
    for round_index in range(repeats + 1):   # round 0 is a warm-up
        for entry in rotate(series, round_index):
            c = entry.checkpoint
            spec = {"files": files, "state_file": c.state_file, "row": c.row,
                    "config": None if c.config is None else {"order": c.config.order,
                                                             "num_workers": c.config.num_workers,
                                                             "shuffle": c.config.shuffle,
                                                             "world_size": c.config.world_size}}
            run = run_child(spec)
            if round_index:
                entry.runs.append(run)
        log(f"resume round {round_index}/{repeats}{' (warm-up)' if not round_index else ''}")
    return series


def resume_of(series: list[ResumeSeries], order: str, workers: int, world_size: int) -> ResumeSeries:
    return next(s for s in series if s.checkpoint.config == Loader(order, workers, True, world_size))


def resume_section(series: list[ResumeSeries]) -> list[str]:
    raw = median(series[0].values("load_first_s"))
    rows = []
    for entry in series:
        c = entry.checkpoint
        first = median(entry.values("load_first_s"))
        where = f"row {c.row:,}" if c.config is None else f"{c.batches_before:,} of {c.batches_total:,} batches"
        ratio = "–"
        if c.config is not None and c.config.order == "canonical":
            ratio = fmt_ratio(first / median(resume_of(series, "topology", c.config.num_workers,
                                                       c.config.world_size).values("load_first_s")))
        rows.append([RAW if c.config is None else c.config.label, "–" if c.config is None else
                     f"rank 0 of {c.config.world_size}", where,
                     f"{c.state_bytes:,}" if c.state_bytes else "–",
                     fmt_ms(median(entry.values("build_s"))) if c.config is not None else "–",
                     fmt_ms(first), f"{min(entry.values('load_first_s')) * 1e3:,.1f}",
                     f"{first / raw:.1f}x", ratio, "yes" if entry.exact else "**no**"])
    return table_lines(["loader", "rank", "checkpoint", "state bytes", "build ms", "load_state_dict to 1st batch ms (median)",
                        "best ms", "vs raw", "canonical / topology", "batch as expected"], rows)


# == 3. profile ================================================================================


def profile_epoch(config: Loader, files: list[str]) -> tuple[pstats.Stats, int]:
    """The profile of one epoch and its batches."""
    loader, _ = config.build(files)
    batches = 0
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in loader:
        batches += 1
    profiler.disable()
    return pstats.Stats(profiler), batches


def where(key: tuple[str, int, str]) -> str:
    filename, line, name = key
    if filename == "~":
        return name
    parts = Path(filename).parts
    for anchor in ("arrowstream", "torch", "pyarrow"):
        if anchor in parts:
            index = len(parts) - 1 - parts[::-1].index(anchor)
            return f"{'/'.join(parts[index:])}:{line}({name})"
    return f"{Path(filename).name}:{line}({name})"


def top_table(stats: pstats.Stats, batches: int) -> list[str]:
    entries = stats.stats   # type: ignore[attr-defined]
    total = stats.total_tt  # type: ignore[attr-defined]
    ranked = sorted(entries.items(), key=lambda item: item[1][2], reverse=True)[:PROFILE_TOP]
    rows = [[f"`{where(key)}`", f"{calls:,}", f"{own:.3f}", f"{own / total:.0%}", f"{cumulative:.3f}",
             f"{own / batches * 1e6:,.0f}"] for key, (_, calls, own, cumulative, _) in ranked]
    return table_lines(["function", "calls", "own s", "share", "cumulative s", "own us / batch"], rows)


def profile_section(table: tables.Table, world_size: int) -> list[str]:
    files = [str(f) for f in table.files]
    runs = {(order, workers): profile_epoch(Loader(order, workers, True, world_size), files)
            for workers in WORKERS for order in ("topology", "canonical")}
    profiles = {key: stats for key, (stats, _) in runs.items()}
    rank = "" if world_size == 1 else f", rank 0 of {world_size} (canonical chunks of {chunk_rows(world_size)} rows)"
    reads = {}
    for order in ("topology", "canonical"):
        stats = profiles[order, 0]
        found = [(v[1], v[3]) for k, v in stats.stats.items() if k[2] == "read_units"]   # type: ignore[attr-defined]
        reads[order] = (sum(c for c, _ in found), sum(s for _, s in found), stats.total_tt)  # type: ignore[attr-defined]
    lines = []
    for workers in WORKERS:
        canonical, topology = profiles["canonical", workers], profiles["topology", workers]
        batches = runs["canonical", workers][1]
        where_ = "the process that reads (no workers)" if workers == 0 else "the trainer's process only (workers unprofiled)"
        lines += [(f"cProfile of one epoch, `num_workers={workers}`, `shuffle=True`, {table.spec.kind} table, "
                   f'`order="canonical", canonical_slots={SLOTS}`{rank}, {where_}: '
                   f"{canonical.total_tt:.2f} s under the profiler (topology: {topology.total_tt:.2f} s), "   # type: ignore[attr-defined]
                   f"{batches:,} batches; the {PROFILE_TOP} functions with the most own time (cProfile adds its own "
                   "cost per call, so functions called per chunk weigh more here than in the timed epochs; a "
                   "generator counts a call per item it yields)."), "", *top_table(canonical, batches), ""]
    lines += [(f"`read_units` (a generator: about two calls per row group read), `num_workers=0`: topology "
               f"{reads['topology'][0]:,} calls, {reads['topology'][1]:.2f} s of {reads['topology'][2]:.2f} s; "
               f"canonical {reads['canonical'][0]:,} calls, {reads['canonical'][1]:.2f} s of "
               f"{reads['canonical'][2]:.2f} s ({table.row_groups} row groups in the table)."), ""]
    return lines


# == report ====================================================================================


def at_world_sizes(world_sizes: tuple[int, ...], ratios: list[float], goal_met: Callable[[float], bool]) -> str:
    """``W=1`` (16-row chunks) 0.23x **not met**, ``W=8`` (128-row chunks) ...: one goal's line, world sizes side by
    side."""
    return ", ".join(f"`W={w}` ({chunk_rows(w)}-row chunks) {ratio:.2f}x {verdict(goal_met(ratio))}"
                     for w, ratio in zip(world_sizes, ratios, strict=True))


def goals(throughput: dict[str, dict[Any, list[Epoch]]], resume: list[ResumeSeries],
          world_sizes: tuple[int, ...]) -> list[str]:
    lines = []
    for kind, samples in throughput.items():
        for shuffle in (True, False):
            for workers in WORKERS:
                figures = [throughput_ratio(samples, workers, shuffle, w) for w in world_sizes]
                sides = at_world_sizes(world_sizes, [f[0] for f in figures], lambda r: r >= THROUGHPUT_GOAL)
                canonical = " / ".join(f"{f[1]:.2f}x" for f in figures)
                topology = " / ".join(f"{f[2]:.2f}x" for f in figures)
                lines.append(f"- Throughput, {kind}, `num_workers={workers}`, `shuffle={shuffle}`: canonical / "
                             f"topology (goal >= {THROUGHPUT_GOAL}x) {sides}; vs the raw pyarrow loop: canonical "
                             f"{canonical}, topology {topology}.")
    if resume:
        raw = median(resume[0].values("load_first_s"))
        for workers in WORKERS:
            canonical_s = [median(resume_of(resume, "canonical", workers, w).values("load_first_s"))
                         for w in world_sizes]
            topology_s = [median(resume_of(resume, "topology", workers, w).values("load_first_s"))
                        for w in world_sizes]
            sides = at_world_sizes(world_sizes, [c / t for c, t in zip(canonical_s, topology_s, strict=True)],
                                   lambda r: r <= RESUME_GOAL)
            times = ", ".join(f"{c * 1e3:,.0f} ms against {t * 1e3:,.0f} ms"
                              for c, t in zip(canonical_s, topology_s, strict=True))
            lines.append(f"- Resume at {RESUME_AT:.0%}, `num_workers={workers}`: canonical / topology (goal <= "
                         f"{RESUME_GOAL}x) {sides}; {times}; the raw loop's first batch at the row "
                         f"{RESUME_AT:.0%} into the table {raw * 1e3:,.1f} ms.")
        exact = all(entry.exact for entry in resume)
        lines.append("- Every resumed process yielded the batch that followed its checkpoint." if exact else
                     "- **A resumed process yielded another batch than the one that followed its checkpoint.**")
    return lines


def report(args: argparse.Namespace, used: list[tables.Table], throughput: dict[str, dict[Any, list[Epoch]]],
           resume: list[ResumeSeries], profile: list[str], seconds: float, load_before: str) -> str:
    lines = [*run_header('order="canonical" against order="topology"', "bench_canonical.py", load_before, seconds), "",
             "## Goals on this run", "", *goals(throughput, resume, args.world_sizes), "",
             "## 1. Throughput", "",
             (f"One epoch, `batch_size={BATCH}` per rank, torch output, `seed=0`, `plan_cache=False`, each loader "
              "rank 0 of `W` (`rank=0, world_size=W`; *W=8*: rank 0's share of the epoch, about 1/8 of the rows, "
              "the global batch 8 x 1,024 and canonical chunks of "
              f"{chunk_rows(8)} rows against {chunk_rows(1)} on 1 rank); rows/s of the rows rank 0 yields, from "
              "before `create_dataloader` to the last batch (planning of the whole epoch and worker start-up "
              "included), and after the first batch. Median of "
              f"{args.repeats} rounds after an untimed warm-up round; each round runs every loader of every world "
              "size once, the order rotated per round. Every epoch was checked to yield each of its rows once: "
              "rank 0's rows of the epoch (`rank_yields(num_workers)`, in `len(loader)` batches), the raw loop's "
              "every row of the table, the `id` values distinct. *vs raw*: against the suite's raw pyarrow loop "
              "over the whole table (no shuffle, one process) of the same run, rows/s against rows/s; *canonical / "
              "topology*: against `order=\"topology\"` with the same `num_workers`, `shuffle` and world size."), ""]
    for table in used:
        lines += throughput_section(table, throughput[table.spec.kind], args.world_sizes)
    if resume:
        lines += ["## 2. Resume: `load_state_dict` to the first batch, in a fresh process", "",
                  (f"The state of rank 0 of `W` after {RESUME_AT:.0%} of its batches of an epoch of the "
                   f"{used[0].spec.kind} table (`shuffle=True`), saved with `json.dumps`; a fresh Python process "
                   "(imports before the clock) builds the same loader, rank 0 of `W` (*build ms*, planning "
                   "included), then the clock runs from "
                   "`load_state_dict(state)` through `iter()` to the first batch, checked to be the batch that "
                   f"followed the checkpoint. Median of {args.resume_repeats} rounds after a warm-up round, the order "
                   "rotated per round. The raw pyarrow loop's line: a fresh process opens the file holding the row "
                   f"{RESUME_AT:.0%} into the table and takes the first batch of `iter_batches` over the row group "
                   "holding it, sliced at that row: what reaching that row costs pyarrow alone."), "",
                  *resume_section(resume), ""]
    if profile:
        lines += ["## 3. Where the canonical path spends its time", "", *profile]
    return "\n".join(lines).rstrip() + "\n"


# == main ======================================================================================


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 100,000 rows, 1 round; prints only")
    parser.add_argument("--rows", type=int, default=None, help="rows per table (default 2,000,000; 100,000 --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="throughput rounds (default 3; 1 with --quick)")
    parser.add_argument("--resume-repeats", type=int, default=None, help="resume rounds (default 5; 1 with --quick)")
    parser.add_argument("--tables", default="numeric,mixed", help="which tables (default numeric,mixed)")
    parser.add_argument("--skip", default="", help="parts to leave out: resume,profile")
    parser.add_argument("--world-size", type=int, default=None,
                        help="every loader is rank 0 of this world size (default: run both 1 and 8)")
    parser.add_argument("--out", type=Path, default=None, help="report path (default results/<date>-canonical.md)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.rows = args.rows or (100_000 if args.quick else 2_000_000)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.resume_repeats = args.resume_repeats or (1 if args.quick else 5)
    args.table_list = [t.strip() for t in args.tables.split(",") if t.strip()]
    args.skip = {s for s in args.skip.split(",") if s}
    if args.skip - {"resume", "profile"}:
        parser.error(f"--skip: unknown parts {sorted(args.skip - {'resume', 'profile'})}")
    if not args.table_list or set(args.table_list) - set(tables.KINDS):
        parser.error(f"--tables: choose from {','.join(tables.KINDS)}")
    args.world_sizes = WORLD_SIZES if args.world_size is None else (args.world_size,)
    fitting = [w for w in range(1, SLOTS + 1) if SLOTS % (w * max(WORKERS)) == 0]
    if args.world_size is not None and args.world_size not in fitting:
        parser.error(f"--world-size {args.world_size}: canonical_slots={SLOTS} must be a multiple of world_size x "
                     f"{max(WORKERS)} workers (the most this benchmark runs per rank); choose one of {fitting}")
    least = max(4 * SLOTS * BATCH // 8, 4 * SLOTS * chunk_rows(max(args.world_sizes)))
    if args.rows < least:
        parser.error(f"--rows {args.rows:,}: at least {least:,} with world size {max(args.world_sizes)} "
                     "(a few chunks of every canonical slot)")
    if args.out is None and not args.quick:
        args.out = RESULTS / f"{dt.date.today().isoformat()}-canonical.md"
    return args


def main() -> int:
    args = parse_args()
    if args.child is not None:
        print(RESULT_PREFIX + json.dumps(child_resume(json.loads(args.child))), flush=True)
        return 0
    start, load_before = time.perf_counter(), loadavg()
    used = [tables.ensure(tables.TableSpec(kind, args.rows, 8, 65_536, 0)) for kind in args.table_list]
    throughput = {table.spec.kind: run_throughput(table, args.repeats, args.world_sizes) for table in used}
    resume: list[ResumeSeries] = []
    if "resume" not in args.skip:
        with tempfile.TemporaryDirectory(prefix="bench-canonical-", dir=tables.DATA_ROOT) as work:
            resume = run_resume(used[0], args.resume_repeats, Path(work), args.world_sizes)
    profile = [] if "profile" in args.skip else profile_section(used[0], args.world_sizes[0])
    emit_report(report(args, used, throughput, resume, profile, time.perf_counter() - start, load_before), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
