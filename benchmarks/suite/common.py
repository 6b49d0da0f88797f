"""What every measurement process shares: the timed epoch, the result line, peak RSS.

This module imports only the standard library, because the peers' adapter scripts import it
too, from their own venvs (where arrowstream is not installed).

A measurement process times one loader over one epoch (or up to a row/time cap) and prints a
single line ``SUITE_RESULT {json}`` on stdout; the suite's runner reads that line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SUITE_DIR = Path(__file__).resolve().parent
BENCH_DIR = SUITE_DIR.parent
REPO_ROOT = BENCH_DIR.parent
RESULT_PREFIX = "SUITE_RESULT "

#: The columns of the generated tables (see ``tables.py``); ``id`` is the global row number.
FLOAT_COLUMNS = [f"f{i}" for i in range(8)]
NUMERIC_COLUMNS = [*FLOAT_COLUMNS, "id", "user", "label"]
MIXED_EXTRA = ["name", "values"]  # string, list<float32>


def log(message: str) -> None:
    print(f"[suite] {message}", file=sys.stderr, flush=True)


def emit_report(text: str, out: Any) -> None:
    """Print a markdown report, and write it to ``out`` (a ``Path``) when given."""
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        log(f"report written to {out}")


def batch_rows(batch: Any) -> int:
    """Rows in a batch: a dict of columns (tensors, arrays or lists), or a record batch."""
    if isinstance(batch, dict):
        return len(batch["id"])
    return int(batch.num_rows)


def first_id(batch: Any) -> int:
    """The ``id`` of the first row of a batch (identifies the batch after a resume)."""
    return int(batch["id"][0])


def time_epoch(make_iterator: Callable[[], Iterator[Any]], max_rows: int | None = None,
               max_seconds: float | None = None) -> dict[str, Any]:
    """Time ``iter()`` to the first batch and to the end of the epoch (or to a cap).

    ``max_rows``/``max_seconds`` stop early: the result then says ``complete: false`` and its
    rates cover the rows read so far.
    """
    start = time.perf_counter()
    iterator = make_iterator()
    first = next(iterator)
    first_s = time.perf_counter() - start
    first_rows = rows = batch_rows(first)
    batches = 1
    complete = True
    for batch in iterator:
        rows += batch_rows(batch)
        batches += 1
        if (max_rows is not None and rows >= max_rows) or (
                max_seconds is not None and time.perf_counter() - start >= max_seconds):
            complete = False
            break
    total_s = time.perf_counter() - start
    if not complete:  # stop a DataLoader's workers now (a generator's close() reaches them too)
        close = getattr(iterator, "_shutdown_workers", None) or getattr(iterator, "close", None)
        if close is not None:
            close()
    steady = (rows - first_rows) / (total_s - first_s) if total_s > first_s and rows > first_rows else None
    return {"first_s": first_s, "total_s": total_s, "rows": rows, "batches": batches,
            "first_rows": first_rows, "complete": complete, "epoch_rps": rows / total_s, "steady_rps": steady}


def time_resume(make_loader: Callable[[], Any], at: float, stop: Callable[[Any], None] | None = None,
                before_fresh: Callable[[], None] | None = None) -> dict[str, Any]:
    """Iterate ``at`` of an epoch, take ``state_dict()``, stop; then time a fresh loader's
    ``load_state_dict`` and first batch, and check it is the batch that followed the checkpoint.

    ``make_loader`` builds a loader with ``len``, ``state_dict`` and ``load_state_dict``;
    ``stop`` ends an iterator's workers; ``before_fresh`` cleans up between the two loaders.
    """
    loader = make_loader()
    total = len(loader)
    before = max(1, int(total * at))
    iterator = iter(loader)
    for _ in range(before):
        next(iterator)
    state = loader.state_dict()
    expected = first_id(next(iterator))
    if stop is not None:
        stop(iterator)
    del iterator, loader
    if before_fresh is not None:
        before_fresh()

    start = time.perf_counter()
    fresh = make_loader()
    fresh.load_state_dict(state)
    loaded = time.perf_counter()
    iterator = iter(fresh)
    batch = next(iterator)
    end = time.perf_counter()
    if stop is not None:
        stop(iterator)
    return {"resume_first_s": end - start, "resume_build_load_s": loaded - start, "batches_before": before,
            "batches_total": total, "exact": first_id(batch) == expected, "resume_first_id": first_id(batch),
            "expected_id": expected}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def rusage_kib() -> dict[str, int]:
    """Peak RSS of this process and of its largest waited-for child, KiB (Linux units)."""
    return {"self_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "children_maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}


def emit(result: dict[str, Any]) -> None:
    """Print the result line (with this process's rusage) and flush."""
    result = {**result, **rusage_kib(), "pid": os.getpid()}
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()


def adapter_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None
                 ) -> argparse.Namespace:
    """The arguments every measurement script takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--files", nargs="+", required=True, help="Parquet files to read, in order")
    parser.add_argument("--mode", choices=["epoch", "resume", "convert"], default="epoch")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--max-rows", type=int, default=None, help="stop the epoch after this many rows")
    parser.add_argument("--max-seconds", type=float, default=None, help="stop the epoch after this long")
    parser.add_argument("--resume-at", type=float, default=0.9, help="resume checkpoint, fraction of the epoch")
    parser.add_argument("--work-dir", type=Path, default=None, help="scratch folder (converted formats)")
    parser.add_argument("--variant", default=None, help="which of the script's loaders")
    if extra is not None:
        extra(parser)
    return parser.parse_args()


def run_main(body: Callable[[], dict[str, Any]]) -> None:
    """Run ``body`` and emit its result; on an exception emit the error instead, exit 1."""
    try:
        result = body()
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a recorded result
        detail = traceback.format_exc(limit=-3)
        emit({"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": detail[-4000:]})
        sys.stdout.flush()
        os._exit(1)
    emit(result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip slow interpreter teardown (peers' background threads); the result is out
