"""Shared fixtures: small generated Parquet datasets and the resume harness."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading

import pytest
from hypothesis import settings

# seeded randomness only: property tests draw the same examples on every run (and in CI);
# HYPOTHESIS_PROFILE=explore draws new ones, to hunt for bugs locally
# and no per-example deadline: speed is measured in benchmarks, and on a loaded 2-core machine an example's
# first run (imports, caches) can take longer than hypothesis's 200 ms without anything being wrong
settings.register_profile("seeded", derandomize=True, deadline=None)
settings.register_profile("explore", derandomize=False, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "seeded"))

# tests/ is on sys.path: the root conftest.py puts it there (for its plugin, tests/hangs.py)
import hangs
from helpers import write_dataset
from leaks import Snapshot, descendants, record_semaphores
from servers import azure_server, gcs_server, s3_server, server_process_groups  # noqa: F401 (fixtures)

# a test about to hit its timeout first makes every process below it print its stacks (workers
# register the signal when this is set), so a hang in CI shows where each worker stood
os.environ["ARROWSTREAM_STACKS_ON_SIGUSR1"] = "1"
STACKS_BEFORE_TIMEOUT_S = 30


record_semaphores()


@pytest.fixture(autouse=True)
def _nothing_left_behind(request):
    """Fail a test that leaves threads, child processes or ``/dev/shm`` entries behind (see tests/leaks.py)."""
    before = Snapshot.take()
    yield
    leaks = before.leaks(server_process_groups())
    if leaks:
        pytest.fail(f"{request.node.nodeid} left behind: {'; '.join(leaks)}", pytrace=False)


def _catches_sigusr1(pid: int) -> bool:
    """Whether ``pid`` handles SIGUSR1 (a worker that registered it); others would die of it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(caught >> (signal.SIGUSR1 - 1) & 1)


def _group(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except OSError:
        return -1


def _print_stacks() -> None:
    faulthandler.dump_traceback(all_threads=True)
    servers = server_process_groups()
    for pid in descendants(os.getpid()):
        if _catches_sigusr1(pid) and _group(pid) not in servers:
            try:
                os.kill(pid, signal.SIGUSR1)
            except OSError:
                pass


@pytest.fixture(autouse=True)
def _stacks_before_timeout(request):
    timeout = hangs.timeout_of(request.node)
    if timeout <= STACKS_BEFORE_TIMEOUT_S or not sys.platform.startswith("linux"):
        yield
        return
    timer = threading.Timer(timeout - STACKS_BEFORE_TIMEOUT_S, _print_stacks)
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()
    timer.join()   # ended before the leak check looks for threads left behind


@pytest.fixture
def uneven_dataset(tmp_path):
    """3 files, 3,130 rows, row groups of 250 / 400 / 120 rows: splits of unequal sizes."""
    return write_dataset(tmp_path / "uneven", [(1000, 250), (1530, 400), (600, 120)])


@pytest.fixture
def small_dataset(tmp_path):
    """2 files of 2 row groups each, 400 rows."""
    return write_dataset(tmp_path / "small", [(200, 100), (200, 100)])


@pytest.fixture(autouse=True)
def _plan_cache_per_test(tmp_path_factory, monkeypatch):
    """Each test its own plan cache folder (child processes inherit it): none uses ~/.cache, none sees
    another's entries."""
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", str(tmp_path_factory.mktemp("plan-cache")))
