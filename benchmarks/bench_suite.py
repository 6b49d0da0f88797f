"""Benchmark suite: arrowstream against pyarrow baselines and peer libraries (issue #3, point 3).

Run from the repository root:

    .venv/bin/python benchmarks/bench_suite.py                 # 2,000,000 rows per table (about 12 min)
    .venv/bin/python benchmarks/bench_suite.py --quick         # 200,000 rows, 1 repeat, prints only
    .venv/bin/python benchmarks/bench_suite.py --skip-peers    # baselines and arrowstream only
    .venv/bin/python benchmarks/bench_suite.py --peers hf,ray  # a choice of peers

It writes two seeded tables (numeric; mixed = numeric + a string and a list<float32> column)
into ``benchmarks/data/`` (git-ignored, reused by later runs), creates each peer's venv under
``benchmarks/.venvs/<peer>/`` when missing, measures every loader in its own process, prints a
markdown report and writes it to ``benchmarks/results/<date>-suite.md`` (``--out`` to change;
``--quick`` writes only with ``--out``), with every raw result beside it in ``<date>-suite.json``. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from suite import measure, report, tables, venvs
from suite.common import log
from suite.measure import Entry, Settings

RESULTS = Path(__file__).resolve().parent / "results"
PEERS = tuple(measure.PEERS)
MAIN_PACKAGES = ("torch", "pyarrow", "torchdata", "numpy", "arrowstream")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=None, help="rows per table (default 2,000,000; 200,000 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 200,000 rows, 1 repeat; writes only with --out")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each baseline/arrowstream measurement (default 3; 1 with --quick)")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated peers (default all: {','.join(PEERS)})")
    parser.add_argument("--skip-peers", action="store_true", help="measure no peer (and set up no venv)")
    parser.add_argument("--peer-rows", type=int, default=1_000_000,
                        help="peers read the first files holding this many rows (default 1,000,000)")
    parser.add_argument("--peer-seconds", type=float, default=120.0, help="cap of a peer's epoch, seconds (default 120)")
    parser.add_argument("--tables", default="numeric,mixed", help="which tables (default numeric,mixed)")
    parser.add_argument("--files", type=int, default=8, help="Parquet files per table (default 8)")
    parser.add_argument("--row-group-rows", type=int, default=65536, help="rows per row group (default 65,536)")
    parser.add_argument("--batch-size", type=int, default=1024, help="rows per batch (default 1,024)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated data (default 0)")
    parser.add_argument("--out", type=Path, default=None, help="report path (default benchmarks/results/<date>-suite.md)")
    args = parser.parse_args(argv)
    args.rows = args.rows if args.rows is not None else (200_000 if args.quick else 2_000_000)
    args.repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    args.peer_list = [] if args.skip_peers else [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = sorted(set(args.peer_list) - set(PEERS))
    if unknown:
        parser.error(f"unknown peers {unknown}; choose from {','.join(PEERS)}")
    args.table_list = [t.strip() for t in args.tables.split(",") if t.strip()]
    if set(args.table_list) - set(tables.KINDS):
        parser.error(f"--tables: choose from {','.join(tables.KINDS)}")
    if args.rows < 2 * args.files or args.repeats < 1:
        parser.error("--rows must be >= 2 x --files and --repeats >= 1")
    if args.out is None and not args.quick:
        args.out = RESULTS / f"{dt.date.today().isoformat()}-suite.md"
    return args


def main_versions() -> dict[str, str]:
    out = {}
    for name in MAIN_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def arrowstream_commit() -> str:
    """The repository's commit, and whether ``arrowstream/`` differs from it (measured as is)."""
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "arrowstream"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return f"git {head}" + (", with uncommitted changes in arrowstream/" if dirty else "")


def run_header(title: str, script: str, load_before: str, seconds: float) -> list[str]:
    """The first lines of a benchmark's report: its title with the date, the machine, the versions, the
    command, the load and the run time."""
    import datetime as dt
    import os
    import shlex
    import sys

    from suite.report import machine

    now = dt.datetime.now(dt.UTC)
    versions = ", ".join(f"{k} {v}" for k, v in main_versions().items())
    return [f"# {title} ({now.date().isoformat()})", "",
            f"- Date: {now:%Y-%m-%d, %H:%M} UTC",
            f"- Machine: {machine()}; `nproc` = {os.cpu_count()}; `uname -a`: {' '.join(os.uname())}",
            f"- Python {sys.version.split()[0]}; {versions}; arrowstream at {arrowstream_commit()}",
            f"- Command: `{shlex.join(['.venv/bin/python', f'benchmarks/{script}', *sys.argv[1:]])}`",
            (f"- Load average before / after: {load_before} / {loadavg()} (the machine is shared); "
             f"run time {seconds / 60:.1f} min")]


def peer_versions(envs: dict[str, venvs.Venv]) -> dict[str, str]:
    out = {}
    for peer, env in envs.items():
        if env.versions is None:
            out[venvs.PACKAGES[peer][0]] = "not installed"
            continue
        main = venvs.PACKAGES[peer][0]
        extras = ", ".join(f"{k} {v}" for k, v in env.versions.items() if k != main)
        out[main] = f"{env.versions.get(main, '?')} ({peer} venv: {extras})"
    return out


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started, load_start, commit_start = time.perf_counter(), loadavg(), arrowstream_commit()
    settings = Settings(batch_size=args.batch_size, repeats=args.repeats, peer_rows=args.peer_rows,
                        peer_seconds=args.peer_seconds, peer_side_seconds=min(30.0, args.peer_seconds),
                        resume_at=0.9)
    shutil.rmtree(measure.LOGS, ignore_errors=True)  # each measurement's stderr goes here, this run only
    envs = {peer: venvs.ensure_venv(peer) for peer in args.peer_list}
    for peer, env in envs.items():
        if env.error:
            log(f"{peer}: venv set-up failed: {env.error}")
    written: list[tables.Table] = []
    by_table: dict[str, list[Entry]] = {}
    for kind in args.table_list:
        spec = tables.TableSpec(kind, args.rows, args.files, args.row_group_rows, args.seed)
        log(f"[{kind}] data in {spec.folder}")
        table = tables.ensure(spec)
        written.append(table)
        entries = measure.run_main_loaders(table, settings)
        for peer, env in envs.items():
            log(f"[{kind}] peer {peer}")
            entries += measure.run_peer(peer, env, table, settings)
        by_table[kind] = entries
    versions = {**main_versions(), **peer_versions(envs)}
    commit_end = arrowstream_commit()
    versions["arrowstream"] += (f" ({commit_end})" if commit_end == commit_start else
                                f" (**{commit_start} at the start, {commit_end} at the end**)")
    notes = [] if args.peer_list else ["Peers were skipped (`--skip-peers`)."]
    notes += [f"{peer}: {measure.PEERS[peer]['label']} not set up: {env.error}" for peer, env in envs.items() if env.error]
    text = report.render(title_date=dt.date.today().isoformat(), command=shlex.join(sys.orig_argv),
                         versions=versions, tables=written, by_table=by_table, settings=settings,
                         load=(load_start, loadavg()), wall_s=time.perf_counter() - started, notes=notes)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        raw = {kind: [dataclasses.asdict(entry) for entry in entries] for kind, entries in by_table.items()}
        args.out.with_suffix(".json").write_text(json.dumps({"versions": versions, "entries": raw}, indent=1))
        log(f"wrote {args.out} and its raw results, {args.out.with_suffix('.json').name}")
    else:
        log("quick run: no report written (pass --out to keep one)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
