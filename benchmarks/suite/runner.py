"""Run one measurement process: a time limit, its result line, and its peak memory.

Each measurement runs in a fresh process (its own session, so a time-out ends its children
too). While it runs, a thread samples the resident memory of the process and all of its
descendants from ``/proc`` every 50 ms; the peak of that sum is the "tree" peak RSS, which counts
DataLoader workers and helper processes (Ray's raylet, ...) that ``getrusage`` reports only as
the largest single child. Pages shared between processes (forked workers) count once per process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import BENCH_DIR, RESULT_PREFIX, log

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
SAMPLE_S = 0.05


@dataclass
class Outcome:
    """What one measurement process returned (``result`` holds ``error`` when it failed)."""

    name: str
    result: dict[str, Any]
    wall_s: float
    tree_peak_kib: int
    command: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return "error" not in self.result

    @property
    def error(self) -> str | None:
        return self.result.get("error")


def children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids, from ``/proc/*/stat``."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry))
    return out


def tree_rss_kib(root: int) -> int:
    """Resident memory of ``root`` and all its descendants, KiB."""
    children = children_map()
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KIB
        except (OSError, IndexError, ValueError):
            pass
        stack.extend(children.get(pid, []))
    return total


class TreeSampler(threading.Thread):
    """Samples the process tree's RSS until stopped; keeps the peak."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_kib = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak_kib = max(self.peak_kib, tree_rss_kib(self.pid))
            self._stop_event.wait(SAMPLE_S)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return self.peak_kib


def parse_result(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return dict(json.loads(line[len(RESULT_PREFIX):]))
    return None


def stderr_tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    kept = [line for line in text.splitlines() if line.strip() and not line.startswith("[suite]")]
    return " | ".join(kept[-lines:])[-1500:]


def run(name: str, command: list[str], timeout_s: float, logs: Path, env: dict[str, str] | None = None) -> Outcome:
    """Run ``command`` (cwd ``benchmarks/``) with a time limit; parse its result line."""
    logs.mkdir(parents=True, exist_ok=True)
    errfile = logs / f"{name.replace(' ', '_').replace('/', '_')}.log"
    full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with errfile.open("a") as err:
        err.write(f"\n$ {' '.join(command)}\n")
        err.flush()
        process = subprocess.Popen(command, cwd=BENCH_DIR, stdout=subprocess.PIPE, stderr=err, text=True,
                                   env=full_env, start_new_session=True)
        sampler = TreeSampler(process.pid)
        sampler.start()
        try:
            stdout, _ = process.communicate(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, _ = process.communicate()
            timed_out = True
        finally:
            peak = sampler.stop()
        _kill_leftovers(process.pid)
    wall = time.perf_counter() - start
    result = parse_result(stdout or "")
    if timed_out:
        result = {"error": f"timed out after {timeout_s:.0f} s (killed)"}
    elif result is None:
        result = {"error": f"exit {process.returncode} without a result line: {stderr_tail(errfile)}"}
    outcome = Outcome(name, result, wall, peak, command)
    log(f"{name}: {summary(outcome)} ({wall:.1f} s)")
    return outcome


def _kill_leftovers(pgid: int) -> None:
    """End what is left of the measurement's process group (orphaned workers)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def summary(outcome: Outcome) -> str:
    r = outcome.result
    if "error" in r:
        return f"ERROR {r['error'][:300]}"
    if "epoch_rps" in r:
        steady = r.get("steady_rps") or 0.0
        return (f"{r['rows']:,} rows, {r['epoch_rps'] / 1e6:.3f} M rows/s epoch, {steady / 1e6:.3f} M steady, "
                f"first {r['first_s'] * 1e3:.0f} ms, tree peak {outcome.tree_peak_kib / 1024:.0f} MiB")
    if "resume_first_s" in r:
        return f"resume first batch {r['resume_first_s'] * 1e3:.0f} ms, exact={r.get('exact')}"
    if "convert_s" in r:
        return f"converted {r['rows']:,} rows in {r['convert_s']:.1f} s"
    return json.dumps(r)[:300]
