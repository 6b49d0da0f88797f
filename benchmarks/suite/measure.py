"""The measurement plan of one table: which processes run, in which order, with which caps.

* Baselines and arrowstream read every file. They run ``repeats`` times, interleaved (raw,
  scanner, torch-dl, arrowstream 0/1/2, then the next repeat), after one untimed warm-up of the
  raw loop and of arrowstream, so that a noisy neighbour slows them alike; the report takes
  medians. arrowstream's resume (``num_workers`` 0 and 2) runs ``repeats`` times too.
* Peers read the first files of the same table, as many as hold ``peer_rows`` rows (at least two,
  one per DataLoader worker); they run once, with a time cap on the epoch. Peers with their own
  format convert those files first, timed on their own.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import BENCH_DIR, log
from .runner import Outcome, run
from .tables import DATA_ROOT, Table
from .venvs import Venv

WORK_ROOT = DATA_ROOT / "suite-work"
LOGS = WORK_ROOT / "logs"
ARROWSTREAM_WORKERS = (0, 1, 2)
RESUME_WORKERS = (0, 2)
CONVERT_TIMEOUT_S = 900
START_SLACK_S = 240  # on top of an epoch's cap: imports, startup, the resume's first 90%

#: Peer adapters: script, variants (the first is the one that counts as the peer's number),
#: whether it converts first, whether it has a mid-epoch resume.
PEERS: dict[str, dict[str, Any]] = {
    "hf": {"label": "HF datasets streaming", "script": "suite/peers/hf.py",
           "variants": {"iter": "`.with_format(\"torch\").iter(batch_size=1024)`, 1 process",
                        "dl2": "`DataLoader(ds.batch(1024).with_format(\"torch\"), batch_size=None, num_workers=2)`"},
           "convert": False, "resume": True},
    "mosaic": {"label": "MosaicML Streaming", "script": "suite/peers/mosaic.py",
               "variants": {None: "MDS, `StreamingDataLoader(batch_size=1024, num_workers=2)`"},
               "convert": True, "resume": True},
    "litdata": {"label": "LitData", "script": "suite/peers/lit.py",
                "variants": {None: "`optimize` chunks, `StreamingDataLoader(batch_size=1024, num_workers=2)`"},
                "convert": True, "resume": True},
    "ray": {"label": "Ray Data", "script": "suite/peers/raydata.py",
            "variants": {None: "`read_parquet(...).iter_torch_batches(batch_size=1024)`"},
            "convert": False, "resume": False},
}


@dataclass
class Settings:
    batch_size: int
    repeats: int
    peer_rows: int
    peer_seconds: float
    peer_side_seconds: float  # cap of the secondary variants (HF's DataLoader)
    resume_at: float


@dataclass
class Entry:
    """One loader on one table: its epoch samples, resume samples, conversion."""

    name: str
    group: str                       # "baseline", "arrowstream" or "peer"
    description: str
    rows_scope: str
    epochs: list[Outcome] = field(default_factory=list)
    resumes: list[Outcome] = field(default_factory=list)
    resume_note: str | None = None   # "not supported", or why it was not measured
    convert: Outcome | None = None
    primary: bool = True             # counts for "best peer"
    error: str | None = None         # set up failed before any measurement


def main_python() -> str:
    return sys.executable


def common_args(files: list[Path], settings: Settings) -> list[str]:
    return ["--files", *[str(f) for f in files], "--batch-size", str(settings.batch_size)]


def baseline_command(variant: str, files: list[Path], settings: Settings) -> list[str]:
    return [main_python(), "-m", "suite.baselines", "--variant", variant, "--num-workers", "2",
            *common_args(files, settings)]


def ours_command(mode: str, workers: int, files: list[Path], settings: Settings) -> list[str]:
    return [main_python(), "-m", "suite.ours", "--mode", mode, "--num-workers", str(workers),
            "--resume-at", str(settings.resume_at), *common_args(files, settings)]


def run_main_loaders(table: Table, settings: Settings) -> list[Entry]:
    """Baselines and arrowstream, interleaved over the repeats, then arrowstream's resumes."""
    kind = table.spec.kind
    scope = f"{table.spec.rows:,} (all {len(table.files)} files)"
    entries: dict[str, tuple[Entry, list[str]]] = {
        "raw": (Entry("raw pyarrow loop", "baseline", "`ParquetFile.iter_batches`, 1 process", scope),
                baseline_command("raw", table.files, settings)),
        "scanner": (Entry("pyarrow.dataset scanner", "baseline", "`to_batches(use_threads=True)`, 1 process", scope),
                    baseline_command("scanner", table.files, settings)),
        "torch-dl": (Entry("torch DataLoader, 2 workers", "baseline",
                           "raw loop per worker, files split across workers", scope),
                     baseline_command("torch-dl", table.files, settings)),
    }
    for workers in ARROWSTREAM_WORKERS:
        entries[f"as{workers}"] = (
            Entry(f"arrowstream num_workers={workers}", "arrowstream", "`create_dataloader(output_format=\"torch\")`",
                  scope), ours_command("epoch", workers, table.files, settings))
    timeout = 600.0
    log(f"[{kind}] warm-up")
    run(f"{kind}-warmup-raw", entries["raw"][1], timeout, LOGS)
    run(f"{kind}-warmup-as0", entries["as0"][1], timeout, LOGS)
    for repeat in range(settings.repeats):
        log(f"[{kind}] repeat {repeat + 1}/{settings.repeats}")
        for key, (entry, command) in entries.items():
            entry.epochs.append(run(f"{kind}-{key}", command, timeout, LOGS))
    for key, (entry, _) in entries.items():
        if entry.group == "baseline":
            entry.resume_note = "not measured (no checkpoint)"
        elif int(key[2:]) not in RESUME_WORKERS:
            entry.resume_note = "not measured"
    for repeat in range(settings.repeats):
        for workers in RESUME_WORKERS:
            entry = entries[f"as{workers}"][0]
            entry.resumes.append(run(f"{kind}-as{workers}-resume",
                                     ours_command("resume", workers, table.files, settings), timeout, LOGS))
    return [entry for entry, _ in entries.values()]


def peer_files(table: Table, peer_rows: int) -> list[Path]:
    """The first files that hold ``peer_rows`` rows; at least two (one per worker)."""
    chosen: list[Path] = []
    rows = 0
    for path, count in zip(table.files, table.file_rows):
        if rows >= peer_rows and len(chosen) >= 2:
            break
        chosen.append(path)
        rows += count
    return chosen


def run_peer(peer: str, venv: Venv, table: Table, settings: Settings) -> list[Entry]:
    spec = PEERS[peer]
    kind = table.spec.kind
    files = peer_files(table, settings.peer_rows)
    rows = sum(table.file_rows[: len(files)])
    scope = (f"{rows:,} (first {len(files)} of {len(table.files)} files)" if len(files) < len(table.files)
             else f"{rows:,} (all {len(files)} files)")
    entries = []
    for index, (variant, description) in enumerate(spec["variants"].items()):
        label = spec["label"] + (f" ({variant})" if variant and index > 0 else "")
        entries.append(Entry(label, "peer", description, scope, primary=index == 0))
    if venv.python is None:
        for entry in entries:
            entry.error = f"not installed: {venv.error}"
        return entries
    work = WORK_ROOT / f"{peer}-{kind}"
    work.mkdir(parents=True, exist_ok=True)
    base = [str(venv.python), spec["script"], *common_args(files, settings), "--work-dir", str(work),
            "--num-workers", "2", "--resume-at", str(settings.resume_at)]
    env = {"HF_HOME": str(WORK_ROOT / "hf-home")}
    main = entries[0]
    if spec["convert"]:
        main.convert = run(f"{kind}-{peer}-convert", [*base, "--mode", "convert"], CONVERT_TIMEOUT_S, LOGS, env)
        if not main.convert.ok:
            for entry in entries:
                entry.error = f"conversion failed: {main.convert.error}"
            return entries
    for index, (entry, variant) in enumerate(zip(entries, spec["variants"])):
        seconds = settings.peer_seconds if index == 0 else settings.peer_side_seconds
        command = [*base, "--mode", "epoch", "--max-seconds", str(seconds)]
        if variant:
            command += ["--variant", variant]
        entry.epochs.append(run(f"{kind}-{peer}-{variant or 'epoch'}", command, seconds + START_SLACK_S, LOGS, env))
        if index > 0:
            entry.resume_note = "not measured (secondary variant)"
    if not spec["resume"]:
        main.resume_note = "not supported"
    elif main.epochs and main.epochs[0].ok and not main.epochs[0].result.get("complete", True):
        main.resume_note = "not measured (the epoch did not finish within the cap)"
    else:
        command = [*base, "--mode", "resume"]
        if next(iter(spec["variants"])):
            command += ["--variant", next(iter(spec["variants"]))]
        main.resumes.append(run(f"{kind}-{peer}-resume", command, settings.peer_seconds + START_SLACK_S, LOGS, env))
    return entries


def relative(path: Path) -> str:
    try:
        return str(path.relative_to(BENCH_DIR))
    except ValueError:
        return str(path)
