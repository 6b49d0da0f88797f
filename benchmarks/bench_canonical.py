"""``order="canonical"`` against the default ``order="topology"``: throughput and resume (issue #39, point 5).

Run from the repository root:

    .venv/bin/python benchmarks/bench_canonical.py            # the real run: 2,000,000 rows per table, ~10 min on 2 cores
    .venv/bin/python benchmarks/bench_canonical.py --quick    # smoke run: 100,000 rows, 1 round, prints only

The suite's two tables (``suite/tables.py``: *numeric*, *mixed*; 8 Parquet files, row groups of 65,536 rows),
written into ``benchmarks/data/`` (git-ignored) and reused by later runs. Every arrowstream loader has
``batch_size=1024``, ``output_format="torch"``, ``seed=0``, epoch 0, ``plan_cache=False`` (cold planning included).

1. **Throughput**: one epoch of each table, in this process, of the suite's raw pyarrow loop (``iter_batches`` file
   after file, numeric columns to tensors, the others to lists) and of ``order="topology"`` and ``order="canonical",
   canonical_slots=64``, each with ``num_workers`` 0 and 2, ``shuffle=True`` (the default buffer) and
   ``shuffle=False``. Rows/s from before ``create_dataloader`` to the last batch, and after the first batch; every
   epoch is checked to yield each row once (count and sum of ``id``). Rounds run every loader once, the order rotated
   per round, after an untimed warm-up round; medians of ``--repeats`` rounds (default 3).
2. **Resume**: a state taken at 50% of an epoch of the numeric table (``shuffle=True``), saved as JSON; then a fresh
   Python process (imports before the clock) builds the same loader, and the clock runs from
   ``loader.load_state_dict(state)`` to the first batch, which is checked to be the batch that followed the
   checkpoint. Topology and canonical, ``num_workers`` 0 and 2; beside them, the raw pyarrow loop's first batch at
   the same row in a fresh process (open the file, ``iter_batches`` of the row group holding it). Medians of
   ``--resume-repeats`` rounds (default 5) after a warm-up round.
3. **Profile**: cProfile of one ``order="canonical"`` epoch with ``num_workers=0`` (numeric table, ``shuffle=True``),
   the functions with the most own time, and the read calls of both orders.

Goals (issue #39): canonical / topology throughput >= 0.9x, resume time <= 1.5x (medians). The report goes to stdout
and to ``benchmarks/results/<date>-canonical.md`` (``--out`` to change; ``--quick`` writes only with ``--out``);
progress goes to stderr. ``--skip resume,profile`` leaves parts out.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import gc
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_suite import RESULTS, loadavg, run_header
from suite import tables
from suite.baselines import convert, raw_batches
from suite.common import RESULT_PREFIX, emit_report, log
from suite.report import fmt_ms, fmt_ratio, fmt_rps

from arrowstream import StructuredDataset

BATCH = 1024
SLOTS = 64
WORKERS = (0, 2)
RESUME_AT = 0.5
RAW = "raw pyarrow loop"
THROUGHPUT_GOAL = 0.9   # canonical / topology rows/s, medians
RESUME_GOAL = 1.5       # canonical / topology time from load_state_dict to the first batch, medians
PROFILE_TOP = 15


@dataclass(frozen=True)
class Loader:
    """One arrowstream configuration (``order`` "topology" or "canonical")."""

    order: str
    num_workers: int
    shuffle: bool

    @property
    def label(self) -> str:
        order = f'order="canonical", canonical_slots={SLOTS}' if self.order == "canonical" else 'order="topology"'
        return f"{order}, num_workers={self.num_workers}, shuffle={self.shuffle}"

    def build(self, files: list[str], slots: int = SLOTS) -> tuple[Any, Any]:
        extra: dict[str, Any] = {"canonical_slots": slots} if self.order == "canonical" else {}
        loader, dataset = StructuredDataset.create_dataloader(
            path=files, batch_size=BATCH, num_workers=self.num_workers, shuffle=self.shuffle, seed=0,
            output_format="torch", plan_cache=False, order=self.order, **extra)
        dataset.set_epoch(0)
        return loader, dataset


LOADERS = [Loader(order, workers, shuffle) for shuffle in (True, False) for workers in WORKERS
           for order in ("topology", "canonical")]


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


def time_batches(make: Any, table: tables.Table) -> Epoch:
    """One epoch of ``make()`` (an iterator of batches), checked to hold every row once."""
    id_sum = table.spec.rows * (table.spec.rows - 1) // 2
    start = time.perf_counter()
    iterator: Iterator[dict[str, Any]] = make()
    first = next(iterator)
    first_at = time.perf_counter()
    rows, total = len(first["id"]), int(first["id"].sum())
    for batch in iterator:
        rows += len(batch["id"])
        total += int(batch["id"].sum())
    end = time.perf_counter()
    shutdown(iterator)
    if (rows, total) != (table.spec.rows, id_sum):
        raise RuntimeError(f"{table.spec.kind}: {rows} rows (id sum {total}), expected every row once: "
                           f"{table.spec.rows} (id sum {id_sum})")
    return Epoch(first_at - start, end - start, rows, len(first["id"]))


def loader_batches(config: Loader, files: list[str]) -> Iterator[dict[str, Any]]:
    loader, _ = config.build(files)
    return iter(loader)


def run_throughput(table: tables.Table, repeats: int) -> dict[Any, list[Epoch]]:
    files = [str(f) for f in table.files]
    keys: list[Any] = [RAW, *LOADERS]
    samples: dict[Any, list[Epoch]] = {key: [] for key in keys}
    for round_index in range(repeats + 1):   # round 0 is a warm-up
        for key in rotate(keys, round_index):
            gc.collect()
            make = (lambda: raw_batches(files, BATCH)) if key == RAW else (
                lambda key=key: loader_batches(key, files))
            epoch = time_batches(make, table)
            if round_index:
                samples[key].append(epoch)
            log(f"{table.spec.kind} round {round_index}/{repeats}{' (warm-up)' if not round_index else ''}, "
                f"{key if key == RAW else key.label}: {epoch.total_s:.2f} s, {epoch.rps / 1e6:.2f} M rows/s")
    return samples


def throughput_section(table: tables.Table, samples: dict[Any, list[Epoch]]) -> list[str]:
    raw = median([e.rps for e in samples[RAW]])
    spread = f"{fmt_rps(min(e.rps for e in samples[RAW]))} – {fmt_rps(max(e.rps for e in samples[RAW]))}"
    rows = [[RAW, "–", "–", fmt_rps(raw), spread, fmt_rps(median([e.steady_rps for e in samples[RAW]])),
             "1.00x", "–", fmt_ms(median([e.first_s for e in samples[RAW]]))]]
    for config in LOADERS:
        epochs = samples[config]
        rps = median([e.rps for e in epochs])
        base = median([e.rps for e in samples[Loader("topology", config.num_workers, config.shuffle)]])
        order = f"canonical, {SLOTS} slots" if config.order == "canonical" else "topology"
        rows.append([order, str(config.num_workers), str(config.shuffle), fmt_rps(rps),
                     f"{fmt_rps(min(e.rps for e in epochs))} – {fmt_rps(max(e.rps for e in epochs))}",
                     fmt_rps(median([e.steady_rps for e in epochs])), fmt_ratio(rps / raw),
                     fmt_ratio(rps / base) if config.order == "canonical" else "–",
                     fmt_ms(median([e.first_s for e in epochs]))])
    spec = table.spec
    heading = (f"### {spec.kind} table ({spec.rows:,} rows, {table.row_groups} row groups, "
               f"{table.bytes / 2**20:,.0f} MiB)")
    return [heading, "",
            *table_lines(["loader", "num_workers", "shuffle", "rows/s (median)", "min – max", "rows/s after 1st batch",
                          "vs raw", "canonical / topology", "first batch ms"], rows), ""]


def throughput_ratio(samples: dict[Any, list[Epoch]], workers: int, shuffle: bool) -> tuple[float, float, float]:
    """Canonical / topology rows/s (medians), and each / the raw loop."""
    canonical = median([e.rps for e in samples[Loader("canonical", workers, shuffle)]])
    topology = median([e.rps for e in samples[Loader("topology", workers, shuffle)]])
    raw = median([e.rps for e in samples[RAW]])
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
    path = work / f"state-{config.order}-{config.num_workers}.json"
    path.write_text(text)
    return Checkpoint(config.label, config, str(path), 0, before, total, len(text), following)


def raw_checkpoint(table: tables.Table) -> Checkpoint:
    """The raw loop's reference: its first batch at the row RESUME_AT into the table."""
    row = int(table.spec.rows * RESUME_AT)
    return Checkpoint(RAW, None, None, row, 0, 0, 0, {"first_id": row})


def child_resume(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: build the loader, then time ``load_state_dict`` to the first batch."""
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


def run_resume(table: tables.Table, repeats: int, work: Path) -> list[ResumeSeries]:
    files = [str(f) for f in table.files]
    series = [ResumeSeries(raw_checkpoint(table))]
    series += [ResumeSeries(take_checkpoint(Loader(order, workers, True), files, work))
               for workers in WORKERS for order in ("topology", "canonical")]
    log("resume: checkpoints taken")
    for round_index in range(repeats + 1):   # round 0 is a warm-up
        for entry in rotate(series, round_index):
            c = entry.checkpoint
            spec = {"files": files, "state_file": c.state_file, "row": c.row,
                    "config": None if c.config is None else {"order": c.config.order,
                                                             "num_workers": c.config.num_workers,
                                                             "shuffle": c.config.shuffle}}
            run = run_child(spec)
            if round_index:
                entry.runs.append(run)
        log(f"resume round {round_index}/{repeats}{' (warm-up)' if not round_index else ''}")
    return series


def resume_of(series: list[ResumeSeries], order: str, workers: int) -> ResumeSeries:
    return next(s for s in series if s.checkpoint.config == Loader(order, workers, True))


def resume_section(series: list[ResumeSeries]) -> list[str]:
    raw = median(series[0].values("load_first_s"))
    rows = []
    for entry in series:
        c = entry.checkpoint
        first = median(entry.values("load_first_s"))
        where = f"row {c.row:,}" if c.config is None else f"{c.batches_before:,} of {c.batches_total:,} batches"
        ratio = "–"
        if c.config is not None and c.config.order == "canonical":
            ratio = fmt_ratio(first / median(resume_of(series, "topology", c.config.num_workers).values(
                "load_first_s")))
        rows.append([RAW if c.config is None else c.config.label, where,
                     f"{c.state_bytes:,}" if c.state_bytes else "–",
                     fmt_ms(median(entry.values("build_s"))) if c.config is not None else "–",
                     fmt_ms(first), f"{min(entry.values('load_first_s')) * 1e3:,.1f}",
                     f"{first / raw:.1f}x", ratio, "yes" if entry.exact else "**no**"])
    return table_lines(["loader", "checkpoint", "state bytes", "build ms", "load_state_dict to 1st batch ms (median)",
                        "best ms", "vs raw", "canonical / topology", "batch as expected"], rows)


# == 3. profile ================================================================================


def profile_epoch(config: Loader, files: list[str]) -> pstats.Stats:
    loader, _ = config.build(files)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in loader:
        pass
    profiler.disable()
    return pstats.Stats(profiler)


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


def profile_section(table: tables.Table) -> list[str]:
    files = [str(f) for f in table.files]
    profiles = {(order, workers): profile_epoch(Loader(order, workers, True), files)
                for workers in WORKERS for order in ("topology", "canonical")}
    batches = -(-table.spec.rows // BATCH)
    reads = {}
    for order in ("topology", "canonical"):
        stats = profiles[order, 0]
        found = [(v[1], v[3]) for k, v in stats.stats.items() if k[2] == "read_units"]   # type: ignore[attr-defined]
        reads[order] = (sum(c for c, _ in found), sum(s for _, s in found), stats.total_tt)  # type: ignore[attr-defined]
    lines = []
    for workers in WORKERS:
        canonical, topology = profiles["canonical", workers], profiles["topology", workers]
        where_ = "the process that reads (no workers)" if workers == 0 else "the trainer's process only (workers unprofiled)"
        lines += [(f"cProfile of one epoch, `num_workers={workers}`, `shuffle=True`, {table.spec.kind} table, "
                   f'`order="canonical", canonical_slots={SLOTS}`, {where_}: '
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


def goals(throughput: dict[str, dict[Any, list[Epoch]]], resume: list[ResumeSeries]) -> list[str]:
    lines = []
    for kind, samples in throughput.items():
        for shuffle in (True, False):
            for workers in WORKERS:
                ratio, canonical, topology = throughput_ratio(samples, workers, shuffle)
                lines.append(f"- Throughput, {kind}, `num_workers={workers}`, `shuffle={shuffle}`: canonical / "
                             f"topology {ratio:.2f}x (goal >= {THROUGHPUT_GOAL}x: {verdict(ratio >= THROUGHPUT_GOAL)}); "
                             f"vs the raw pyarrow loop: canonical {canonical:.2f}x, topology {topology:.2f}x.")
    if resume:
        raw = median(resume[0].values("load_first_s"))
        for workers in WORKERS:
            canonical = median(resume_of(resume, "canonical", workers).values("load_first_s"))
            topology = median(resume_of(resume, "topology", workers).values("load_first_s"))
            lines.append(f"- Resume at {RESUME_AT:.0%}, `num_workers={workers}`: canonical / topology "
                         f"{canonical / topology:.2f}x (goal <= {RESUME_GOAL}x: "
                         f"{verdict(canonical / topology <= RESUME_GOAL)}); {canonical * 1e3:,.0f} ms against "
                         f"{topology * 1e3:,.0f} ms; the raw loop's first batch at that row {raw * 1e3:,.1f} ms.")
        exact = all(entry.exact for entry in resume)
        lines.append("- Every resumed process yielded the batch that followed its checkpoint." if exact else
                     "- **A resumed process yielded another batch than the one that followed its checkpoint.**")
    return lines


def report(args: argparse.Namespace, used: list[tables.Table], throughput: dict[str, dict[Any, list[Epoch]]],
           resume: list[ResumeSeries], profile: list[str], seconds: float, load_before: str) -> str:
    lines = [*run_header('order="canonical" against order="topology"', "bench_canonical.py", load_before, seconds), "",
             "## Goals on this run", "", *goals(throughput, resume), "",
             "## 1. Throughput", "",
             (f"One epoch, `batch_size={BATCH}`, torch output, `seed=0`, `plan_cache=False`; rows/s from before "
              "`create_dataloader` to the last batch (planning and worker start-up included), and after the first "
              f"batch. Median of {args.repeats} rounds after an untimed warm-up round; each round runs every loader "
              "once, the order rotated per round. Every epoch was checked to yield each row once (count and sum of "
              "`id`). *vs raw*: against the suite's raw pyarrow loop (no shuffle, one process) of the same run; "
              "*canonical / topology*: against `order=\"topology\"` with the same `num_workers` and `shuffle`."), ""]
    for table in used:
        lines += throughput_section(table, throughput[table.spec.kind])
    if resume:
        lines += ["## 2. Resume: `load_state_dict` to the first batch, in a fresh process", "",
                  (f"The state after {RESUME_AT:.0%} of the batches of an epoch of the {used[0].spec.kind} table "
                   "(`shuffle=True`), saved with `json.dumps`; a fresh Python process (imports before the clock) "
                   "builds the same loader (*build ms*, planning included), then the clock runs from "
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
    if args.rows < 4 * SLOTS * BATCH // 8:
        parser.error(f"--rows: at least {4 * SLOTS * BATCH // 8:,} (a few batches of every canonical slot)")
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
    throughput = {table.spec.kind: run_throughput(table, args.repeats) for table in used}
    resume: list[ResumeSeries] = []
    if "resume" not in args.skip:
        with tempfile.TemporaryDirectory(prefix="bench-canonical-", dir=tables.DATA_ROOT) as work:
            resume = run_resume(used[0], args.resume_repeats, Path(work))
    profile = [] if "profile" in args.skip else profile_section(used[0])
    emit_report(report(args, used, throughput, resume, profile, time.perf_counter() - start, load_before), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
