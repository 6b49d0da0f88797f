"""Per-worker metrics: throughput with and without them, and the cost of the instrumentation alone.

Run from the repository root:

    .venv/bin/python benchmarks/bench_metrics.py --out benchmarks/results/<date>-metrics.md   # ~2.5 min on 2 cores
    .venv/bin/python benchmarks/bench_metrics.py --quick                                      # smoke run, prints only

The issue asks for a metrics overhead within 2% of throughput. Two measurements answer it:

1. **End to end.** A git worktree of ``--baseline`` (default c243d52, the last revision without metrics) is made
   in a temporary folder; "without metrics" is its package, "with metrics" the package of this repository's
   working tree. Each epoch runs in a fresh process with ``PYTHONPATH`` set to that package's root (the process
   checks that ``arrowstream.__file__`` lies under it): ``StructuredDataset.create_dataloader(path=folder,
   batch_size=1024, num_workers=W, shuffle=False, output_format="torch")``, ``set_epoch(0)``, every batch touched
   (``len(batch["id"])`` added up). Rows/s over the whole epoch (from before the loader is built, imports
   excluded, to the last batch) and after the first batch, and the CPU time of the process and its workers over
   the same span. Cases: ``num_workers`` 0 and 2, on a numeric and a mixed table. One untimed warm-up epoch per
   case and variant, then ``--rounds`` rounds in which the two variants of a case run back to back, in
   alternating order (AB, BA, AB, ...); medians per variant. The overhead is ``1 - with / without`` on rows/s;
   the spread is ``(max - min) / median`` of a variant's rows/s.
2. **The instrumentation alone**, which noise cannot blur: in this process, the lines that
   ``SlotIterator.__next__`` adds per batch (three ``perf_counter()`` calls, ``record.num_rows`` and one
   ``Meter.batch(...)``, with and without a shared board row) against the same method without them, over
   ``--iterations`` calls; and ``Meter.split_done`` (once per split, in ``_reader.py``). Divided by the time per
   batch of the ``num_workers=0`` epoch without metrics, this is the overhead's upper bound in percent (for
   the instructions run: in a hot loop; between real batches cold caches make the same lines dearer, which
   the report's reading checks with a profile).

Data (seeded, written once into ``benchmarks/data/metrics/``, git-ignored, reused by later runs): ``numeric``, 8
Parquet files of 500,000 rows (``id`` int64, ``f0..f7`` float32, ``label`` int8), and ``mixed``, 4 files of
500,000 rows with a ``name`` string (4 to 12 characters) besides, so that the per-batch conversion to Python
objects is covered too; row groups of 50,000 rows, snappy.

The markdown report goes to stdout (and to ``--out`` when given); progress goes to stderr. The worktree is
removed at the end, also on failure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from time import perf_counter
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

from bench_suite import loadavg, main_versions
from suite.common import emit_report, log
from suite.report import fmt_ms, fmt_rps, machine

DATA_ROOT = BENCH_DIR / "data" / "metrics"
MANIFEST = "_manifest.json"   # a leading "_": arrowstream skips it when it lists a folder
RESULT_PREFIX = "METRICS_RESULT "
BATCH = 1024
GOAL = 0.02
WITHOUT, WITH = "without metrics", "with metrics"
VARIANTS = (WITHOUT, WITH)


@dataclass(frozen=True)
class DataSpec:
    """One generated table: ``files`` Parquet files of ``file_rows`` rows each."""

    kind: str
    files: int
    file_rows: int
    row_group_rows: int = 50_000
    seed: int = 0

    @property
    def rows(self) -> int:
        return self.files * self.file_rows

    @property
    def folder(self) -> Path:
        return DATA_ROOT / f"{self.kind}-f{self.files}-r{self.file_rows}-rg{self.row_group_rows}-s{self.seed}"


@dataclass(frozen=True)
class Case:
    kind: str
    num_workers: int


# -- data ----------------------------------------------------------------------------------------


def names(rng: np.random.Generator, n: int) -> pa.Array:
    """``n`` strings of 4 to 12 lowercase letters, built from buffers (no Python objects)."""
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(rng.integers(4, 13, n), out=offsets[1:])
    chars = rng.integers(ord("a"), ord("z") + 1, int(offsets[-1]), dtype=np.uint8)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars))


def file_table(spec: DataSpec, index: int, rng: np.random.Generator) -> pa.Table:
    n, offset = spec.file_rows, index * spec.file_rows
    columns: dict[str, Any] = {"id": np.arange(offset, offset + n, dtype=np.int64)}
    columns.update({f"f{i}": rng.random(n, dtype=np.float32) for i in range(8)})
    columns["label"] = rng.integers(0, 10, n, dtype=np.int8)
    if spec.kind == "mixed":
        columns["name"] = names(rng, n)
    return pa.table(columns)


def ensure(spec: DataSpec) -> list[Path]:
    """The table's files, written when missing or written with other parameters."""
    files = [spec.folder / f"part-{index:05d}.parquet" for index in range(spec.files)]
    done = spec.folder / MANIFEST
    if done.exists() and json.loads(done.read_text()) == asdict(spec) and all(f.exists() for f in files):
        return files
    log(f"writing {spec.kind}: {spec.rows:,} rows into {spec.folder}")
    spec.folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    for index, path in enumerate(files):
        pq.write_table(file_table(spec, index, rng), path, row_group_size=spec.row_group_rows, compression="snappy")
    done.write_text(json.dumps(asdict(spec)))
    return files


# -- one epoch, in a fresh process ---------------------------------------------------------------


def cpu_seconds() -> float:
    """User and system time of this process and of its children that have ended (the loader's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def child(folder: str, num_workers: int, rows_expected: int, root: str) -> int:
    """One epoch of the package under ``root``; prints one ``METRICS_RESULT {json}`` line."""
    import arrowstream
    from arrowstream import StructuredDataset

    where = Path(arrowstream.__file__).resolve()
    if not where.is_relative_to(Path(root).resolve()):
        raise RuntimeError(f"arrowstream was imported from {where}, not from under PYTHONPATH={root}; "
                           "check that nothing earlier on sys.path provides it")
    cpu_start = cpu_seconds()
    start = perf_counter()
    loader, dataset = StructuredDataset.create_dataloader(path=folder, batch_size=BATCH, num_workers=num_workers,
                                                          shuffle=False, output_format="torch", plan_cache=False)
    dataset.set_epoch(0)
    iterator = iter(loader)
    batch = next(iterator)
    first_s = perf_counter() - start
    first_rows = rows = len(batch["id"])
    batches = 1
    for batch in iterator:
        rows += len(batch["id"])
        batches += 1
    total_s = perf_counter() - start
    if rows != rows_expected:
        raise RuntimeError(f"read {rows:,} rows, the table holds {rows_expected:,}")
    result: dict[str, Any] = {
        "file": str(where), "rows": rows, "batches": batches, "first_s": first_s, "total_s": total_s,
        "epoch_rps": rows / total_s, "steady_rps": (rows - first_rows) / (total_s - first_s),
        "batches_per_transfer": getattr(loader, "batches_per_transfer", 1), "has_metrics": hasattr(loader, "metrics")}
    if result["has_metrics"]:
        metrics = loader.metrics()
        result.update(metrics_rows=metrics["rows"], metrics_batches=metrics["batches"],
                      splits_done=metrics["splits_done"])
    del iterator, loader   # joins the workers, so that their CPU time is counted
    result["cpu_s"] = cpu_seconds() - cpu_start
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


def run_epoch(root: Path, variant: str, case: Case, spec: DataSpec) -> dict[str, Any]:
    """One epoch of ``case`` in a fresh process with ``PYTHONPATH=root``; its result, checked."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}   # no __pycache__ in the trees
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(spec.folder), str(case.num_workers),
               str(spec.rows), str(root)]
    proc = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or len(lines) != 1:
        raise RuntimeError(f"{variant}, {case}: the epoch process exited with {proc.returncode}; "
                           f"its stderr ends with:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[0][len(RESULT_PREFIX):])
    if result["has_metrics"] != (variant == WITH):
        raise RuntimeError(f"{variant}: the loader from {result['file']} "
                           f"{'has' if result['has_metrics'] else 'lacks'} metrics(); wrong baseline or package")
    if variant == WITH and (result["metrics_rows"], result["metrics_batches"]) != (result["rows"], result["batches"]):
        raise RuntimeError(f"{case}: metrics() counted {result['metrics_rows']:,} rows in "
                           f"{result['metrics_batches']:,} batches, the epoch had {result['rows']:,} in "
                           f"{result['batches']:,}")
    return result


def measure(roots: dict[str, Path], cases: list[Case], specs: dict[str, DataSpec],
            rounds: int) -> dict[tuple[Case, str], list[dict[str, Any]]]:
    """A warm-up epoch per case and variant, then ``rounds`` rounds, each variant once, alternating orders."""
    for case in cases:
        for variant in VARIANTS:
            log(f"warm-up: {case.kind}, num_workers={case.num_workers}, {variant}")
            run_epoch(roots[variant], variant, case, specs[case.kind])
    samples: dict[tuple[Case, str], list[dict[str, Any]]] = {(c, v): [] for c in cases for v in VARIANTS}
    for round_index in range(rounds):
        order = VARIANTS if round_index % 2 == 0 else VARIANTS[::-1]
        for case in cases:
            for variant in order:
                result = run_epoch(roots[variant], variant, case, specs[case.kind])
                samples[case, variant].append(result)
                log(f"round {round_index + 1}/{rounds}: {case.kind}, num_workers={case.num_workers}, {variant}: "
                    f"{fmt_rps(result['epoch_rps'])} rows/s")
    return samples


# -- the instrumentation alone -------------------------------------------------------------------


class Probe:
    """The lines ``SlotIterator.__next__`` adds per batch, on stand-ins for its attributes.

    ``instrumented`` is ``bare`` plus exactly those lines (``dataset.py``: ``entered``/``read``/``done`` from
    ``perf_counter``, ``record.num_rows``, the ``assert``, ``Meter.batch`` and ``_left_at``); both are method
    calls, so the call itself cancels out in the difference.
    """

    def __init__(self, meter: Any, record: pa.RecordBatch) -> None:
        self._dataset = SimpleNamespace(_meter=meter)
        self._record = record
        self._left_at = 0.0

    def bare(self) -> pa.RecordBatch:
        return self._record

    def instrumented(self) -> pa.RecordBatch:
        entered = perf_counter()
        record = self._record
        read = perf_counter()
        rows, batches = record.num_rows, 1
        done = perf_counter()
        assert self._dataset._meter is not None
        self._dataset._meter.batch(rows, batches, read - entered, done - read,
                                   entered - self._left_at if self._left_at else 0.0, done)
        self._left_at = done
        return record

    def split_done(self) -> pa.RecordBatch:
        meter = self._dataset._meter
        if meter is not None:
            meter.split_done(1_000_000)
        return self._record


def time_calls(step: Any, iterations: int) -> float:
    start = perf_counter()
    for _ in range(iterations):
        step()
    return perf_counter() - start


def instrumentation_cost(iterations: int, repeats: int = 5) -> dict[str, dict[str, float]]:
    """Microseconds per call of each probe beyond ``bare``: median and min over ``repeats`` alternations."""
    sys.path.insert(0, str(REPO_ROOT))
    import arrowstream
    from arrowstream._worker.metrics import Board, Meter

    if not Path(arrowstream.__file__).resolve().is_relative_to(REPO_ROOT):
        raise RuntimeError(f"arrowstream was imported from {arrowstream.__file__}, not from {REPO_ROOT}")
    record = pa.record_batch({"id": np.arange(BATCH, dtype=np.int64)})
    board = Board(1)
    probes = {"Meter.batch, no board row (num_workers=0)": ("instrumented", Meter()),
              "Meter.batch, shared board row (workers)": ("instrumented", Meter(board.row(0))),
              "Meter.split_done (per split)": ("split_done", Meter())}
    out = {}
    for label, (method, meter) in probes.items():
        log(f"instrumentation alone: {label}, {repeats} x {iterations:,} calls")
        probe = Probe(meter, record)
        differences = []
        for _ in range(repeats):
            bare = time_calls(probe.bare, iterations)
            differences.append((time_calls(getattr(probe, method), iterations) - bare) / iterations * 1e6)
        out[label] = {"median_us": statistics.median(differences), "min_us": min(differences),
                      "max_us": max(differences)}
    return out


# -- the report ----------------------------------------------------------------------------------


def median(results: list[dict[str, Any]], field: str) -> float:
    return float(statistics.median(r[field] for r in results))


def spread(results: list[dict[str, Any]], field: str) -> float:
    values = [r[field] for r in results]
    return (max(values) - min(values)) / statistics.median(values)


def pct(value: float) -> str:
    return f"{value * 100:+.1f}%"


def markdown_table(header: list[str], rows: list[list[str]], right_from: int) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    return ["| " + " | ".join(line) + " |" for line in [header, align, *rows]]


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def revisions(baseline: str) -> tuple[str, str]:
    dirty = git("status", "--porcelain", "--", "arrowstream")
    head = git("log", "-1", "--format=%h", "HEAD")
    with_metrics = f"working tree at {head}" + (" with uncommitted changes in arrowstream/" if dirty else "")
    return git("log", "-1", "--format=%h (%cs)", baseline), with_metrics


def data_lines(specs: dict[str, DataSpec]) -> list[str]:
    rows = []
    for spec in specs.values():
        files = sorted(spec.folder.glob("part-*.parquet"))
        columns = "id int64, f0..f7 float32, label int8" + (", name string (4-12 chars)" if spec.kind == "mixed"
                                                             else "")
        rows.append([spec.kind, columns, str(len(files)), f"{spec.rows:,}", f"{spec.row_group_rows:,}",
                     f"{sum(f.stat().st_size for f in files) / 2**20:.0f}"])
    return markdown_table(["table", "columns", "files", "rows", "row group rows", "MiB"], rows, right_from=2)


def epoch_lines(samples: dict[tuple[Case, str], list[dict[str, Any]]]) -> list[str]:
    rows = []
    for (case, variant), results in samples.items():
        lowest, highest = min(r["epoch_rps"] for r in results), max(r["epoch_rps"] for r in results)
        rows.append([case.kind, str(case.num_workers), variant, fmt_rps(median(results, "epoch_rps")),
                     f"{fmt_rps(lowest)} – {fmt_rps(highest)}",
                     f"{spread(results, 'epoch_rps') * 100:.1f}%", fmt_rps(median(results, "steady_rps")),
                     f"{spread(results, 'steady_rps') * 100:.1f}%", fmt_ms(median(results, "first_s")),
                     f"{median(results, 'cpu_s'):.3f}", f"{spread(results, 'cpu_s') * 100:.1f}%"])
    header = ["table", "num_workers", "variant", "rows/s, whole epoch (median)", "min – max", "spread",
              "rows/s, after 1st batch (median)", "spread", "first batch ms (median)", "CPU s (median)", "spread"]
    return markdown_table(header, rows, right_from=3)


def overhead(samples: dict[tuple[Case, str], list[dict[str, Any]]], case: Case, field: str
             ) -> tuple[float, list[float]]:
    """``1 - with / without`` on the medians, and per round (the two epochs of a round ran back to back)."""
    without, with_ = samples[case, WITHOUT], samples[case, WITH]
    paired = [1 - w[field] / wo[field] for wo, w in zip(without, with_)]
    return 1 - median(with_, field) / median(without, field), paired


def verdict(value: float, noise: float, rounds: int) -> str:
    met = "met" if value <= GOAL else "missed"
    if rounds < 2:
        return f"**{met} on one round** ({pct(value)}), no spread to judge it by: run more rounds"
    if noise <= GOAL:
        return f"**{met}** ({pct(value)}; spread {noise * 100:.1f}% ≤ 2%)"
    return (f"**{met} on the medians** ({pct(value)}), but the run-to-run spread is {noise * 100:.1f}% > 2%: "
            "this end-to-end run cannot resolve 2%; see the deterministic bound")


def overhead_lines(samples: dict[tuple[Case, str], list[dict[str, Any]]], cases: list[Case]) -> list[str]:
    rows, goals = [], []
    for case in cases:
        epoch, epoch_rounds = overhead(samples, case, "epoch_rps")
        steady, steady_rounds = overhead(samples, case, "steady_rps")
        cpu, cpu_rounds = overhead(samples, case, "cpu_s")
        noise = max(spread(samples[case, v], "epoch_rps") for v in VARIANTS)
        rows.append([case.kind, str(case.num_workers), pct(epoch),
                     f"{pct(min(epoch_rounds))} – {pct(max(epoch_rounds))}", pct(steady),
                     f"{pct(min(steady_rounds))} – {pct(max(steady_rounds))}", f"{noise * 100:.1f}%",
                     pct(-cpu), f"{pct(-max(cpu_rounds))} – {pct(-min(cpu_rounds))}"])
        rounds = len(samples[case, WITHOUT])
        goals.append(f"- {case.kind}, num_workers={case.num_workers}: {verdict(epoch, noise, rounds)}")
    header = ["table", "num_workers", "overhead, whole epoch (medians)", "per round, min – max",
              "overhead, after 1st batch (medians)", "per round, min – max", "spread (larger of the two)",
              "CPU time added (medians)", "per round, min – max"]
    return [*markdown_table(header, rows, right_from=2), "",
            "Metrics overhead within 2% of throughput, judged on the whole-epoch medians:", "", *goals]


def bound_lines(costs: dict[str, dict[str, float]], samples: dict[tuple[Case, str], list[dict[str, Any]]],
                kinds: list[str]) -> list[str]:
    labels = list(costs)
    cost_rows = [[label, f"{c['median_us']:.3f}", f"{c['min_us']:.3f} – {c['max_us']:.3f}"]
                 for label, c in costs.items()]
    lines = [*markdown_table(["added per call", "µs (median of 5)", "min – max"], cost_rows, right_from=1), ""]
    rows, goals = [], []
    for kind in kinds:
        base = samples[Case(kind, 0), WITHOUT]
        batch_us = BATCH / median(base, "steady_rps") * 1e6
        metered = samples[Case(kind, 0), WITH][0]
        per_split = metered["splits_done"] / metered["batches"]
        worker = samples.get((Case(kind, 2), WITH), [{"batches_per_transfer": 1}])[0]["batches_per_transfer"]
        split_us = costs[labels[2]]["median_us"] * per_split
        local = costs[labels[0]]["median_us"] + split_us
        shared = costs[labels[1]]["median_us"] + split_us
        chunked = costs[labels[1]]["median_us"] / worker + split_us
        rows.append([kind, f"{batch_us:.1f}", f"{local / batch_us * 100:.3f}%", f"{shared / batch_us * 100:.3f}%",
                     f"{chunked / batch_us * 100:.3f}% (chunks of {worker})"])
        goals.append(f"- {kind}: **{'met' if max(local, shared) / batch_us <= GOAL else 'missed'}** "
                     f"(at most {max(local, shared) / batch_us * 100:.2f}% of the time per batch)")
    header = ["table", "µs per batch, num_workers=0 without metrics (after 1st batch, median)",
              "bound, num_workers=0", "bound, board row per batch", "bound, workers as run (board row per chunk)"]
    return [*lines, *markdown_table(header, rows, right_from=1), "",
            "Metrics overhead within 2% of throughput, by the deterministic bound:", "", *goals]


def report(args: argparse.Namespace, specs: dict[str, DataSpec], cases: list[Case],
           samples: dict[tuple[Case, str], list[dict[str, Any]]], costs: dict[str, dict[str, float]],
           seconds: float, load_before: str) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in main_versions().items())
    baseline, with_metrics = revisions(args.baseline)
    lines = [
        f"# Per-worker metrics: overhead on throughput ({dt.date.today().isoformat()})", "",
        f"- Machine: {machine()}; nproc {os.cpu_count()}",
        f"- Python {sys.version.split()[0]}; {versions}",
        f"- Without metrics: git worktree of {baseline}; with metrics: {with_metrics}",
        f"- Command: `{shlex.join(['.venv/bin/python', 'benchmarks/bench_metrics.py', *sys.argv[1:]])}`",
        f"- Load average before / after: {load_before} / {loadavg()}; run time {seconds / 60:.1f} min",
        (f"- batch_size={BATCH}, shuffle=False, output_format=\"torch\"; each epoch in a fresh process "
         f"(`PYTHONPATH` = the variant's package root, checked); one warm-up epoch per case and variant, then "
         f"{args.rounds} round{'s' if args.rounds != 1 else ''}, the two variants back to back in alternating order (AB, BA, ...); medians. "
         "Files in the page cache."), "",
        "## Data", "", *data_lines(specs), "",
        "## End to end", "", *epoch_lines(samples), "",
        ("Whole epoch: from before the loader is built to the last batch (planning and worker start-up included); "
         "after 1st batch: without the first batch and its wait. CPU s: user + system time of the epoch's process and "
         "its workers over the same span (less sensitive to a busy neighbour than wall time). Spread: "
         "(max - min) / median over the rounds."), "",
        "### Overhead (positive: slower with metrics)", "", *overhead_lines(samples, cases), "",
        ("Overhead: 1 - (with metrics) / (without metrics) on rows/s; CPU time added: (with metrics) / (without "
         "metrics) - 1 on CPU seconds. Per round: the same for the two epochs of one round, which ran back to back."), "",
        "## The instrumentation alone", "",
        (f"In one process, {args.iterations:,} calls per measurement, 5 measurements alternating with the same "
         "method without the added lines; the difference per call. The bound divides the added time per batch "
         "(`Meter.split_done` counted once per split, as many splits per batch as the epoch with metrics had) by "
         "the time per batch of the `num_workers=0` epoch without metrics. With workers the meter counts once per "
         "chunk of batches, in the worker, and writes the board row each time."), "",
        *bound_lines(costs, samples, sorted({c.kind for c in cases}, key=lambda k: list(specs).index(k))),
    ]
    return "\n".join(lines) + "\n"


# -- the command ---------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="c243d52", help="the revision without metrics (default c243d52)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5; 1 with --quick)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="calls per instrumentation measurement (default 1,000,000; 100,000 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10x less data, 1 round")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    parser.add_argument("--child", nargs=4, metavar=("FOLDER", "WORKERS", "ROWS", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.iterations = args.iterations or (100_000 if args.quick else 1_000_000)
    return args


def add_worktree(revision: str, folder: Path) -> Path:
    """A detached worktree of ``revision`` in ``folder``: the package without metrics."""
    try:
        commit = git("rev-parse", "--verify", f"{revision}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"--baseline {revision}: not a commit of {REPO_ROOT}; pass a revision without metrics "
                         "(the default is c243d52)") from None
    git("worktree", "add", "--detach", "--quiet", str(folder), commit)
    if (folder / "arrowstream" / "_metrics.py").exists():
        raise RuntimeError(f"--baseline {revision} already has arrowstream/_worker/metrics.py; "
                           "pass a revision without metrics (the default is c243d52)")
    return folder


def remove_worktree(folder: Path) -> None:
    if not folder.exists():
        return
    try:
        git("worktree", "remove", "--force", str(folder))
    except subprocess.CalledProcessError as exc:
        log(f"could not remove the worktree {folder}: {exc.stderr.strip()}")
    git("worktree", "prune")


def main() -> int:
    args = parse_args()
    if args.child:
        folder, workers, rows, root = args.child
        return child(folder, int(workers), int(rows), root)
    if not (REPO_ROOT / "arrowstream" / "_metrics.py").exists():
        raise SystemExit(f"{REPO_ROOT}/arrowstream has no _metrics.py: nothing to measure")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # so that the worktree is removed
    start, load_before = time.perf_counter(), loadavg()
    file_rows = 50_000 if args.quick else 500_000
    specs = {"numeric": DataSpec("numeric", 8, file_rows), "mixed": DataSpec("mixed", 4, file_rows)}
    for spec in specs.values():
        ensure(spec)
    cases = [Case(kind, workers) for kind in specs for workers in (0, 2)]
    temp = Path(tempfile.mkdtemp(prefix="arrowstream-baseline-"))
    worktree = temp / "tree"
    try:
        log(f"worktree of {args.baseline} in {worktree}")
        roots = {WITHOUT: add_worktree(args.baseline, worktree), WITH: REPO_ROOT}
        samples = measure(roots, cases, specs, args.rounds)
    finally:
        remove_worktree(worktree)
        shutil.rmtree(temp, ignore_errors=True)
    costs = instrumentation_cost(args.iterations)
    text = report(args, specs, cases, samples, costs, time.perf_counter() - start, load_before)
    emit_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
