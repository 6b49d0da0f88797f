"""Shared memory that runs out (issue #17): the epoch finishes by value, or a clear error, never a hang.

Each test runs a trainer (``tests/shm_child.py``) with a tiny tmpfs on /dev/shm, in a mount
namespace of its own (``unshare -m``: nothing outside it sees the mount). Where mounting is not
permitted, the child injects the failures such a /dev/shm gives instead; the test id
(``[tmpfs]`` or ``[injected]``) and its output say which ran.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from helpers import write_dataset

HERE = os.path.dirname(__file__)
ROWS = 40000  # shm_child.ROWS


def _tmpfs_permitted() -> bool:
    """Whether this process may mount a tmpfs on /dev/shm in a private mount namespace."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /dev/shm"],
                              check=False, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


MODE = "tmpfs" if _tmpfs_permitted() else "injected"


@pytest.fixture(scope="module")
def chunky_dataset(tmp_path_factory):
    """2 workers' chunks of 16 x 1,024 rows: a ring of 6 slots (about 4.7 MB) cannot fit in 1 MiB."""
    return write_dataset(tmp_path_factory.mktemp("shm") / "data", [(20000, 2000), (20000, 2000)])


def _run_child(mode, scenario, dataset, tmpfs_size, timeout=120):
    command = [sys.executable, os.path.join(HERE, "shm_child.py"), mode, scenario, dataset]
    if mode == "tmpfs":
        command = ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size={tmpfs_size} tmpfs /dev/shm && exec "$@"',
                   "sh", *command]
    print(f"shared-memory path: {mode}: {' '.join(command)}")
    # a hang is a failure: TimeoutExpired (the child is killed, and its workers follow it)
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout, cwd=HERE)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", [MODE])
def test_a_ring_that_does_not_fit_in_dev_shm_goes_by_value(chunky_dataset, mode):
    """/dev/shm of 1 MiB: the loader's small things fit, no worker's ring does. Two epochs of 2
    persistent workers give every row exactly once; each worker warns once; the failed
    allocations leave no file in /dev/shm (torch left one per worker)."""
    result, stderr = _run_child(mode, "ring", chunky_dataset, "1m")
    assert result["exact"] == [True, True]
    warned = re.findall(r"worker of pid (\d+) cannot make its shared-memory ring", stderr)
    assert sorted(map(int, warned)) == sorted(result["workers"]), stderr[-4000:]
    assert "ARROWSTREAM_SHM_RING=0" in stderr and "--shm-size" in stderr
    assert result["left"] == []


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", [MODE])
def test_no_room_in_dev_shm_is_a_clear_error_within_seconds(chunky_dataset, mode):
    """/dev/shm with room for 0, 1, 2, ... pages: every attempt to build a 2-worker loader and read
    an epoch is a SharedMemoryError (an OSError) naming what had no room and what to do, within
    seconds, with no worker left running and no file left in /dev/shm, until one has room enough
    and reads every row once (by value: no ring fits). torch's RuntimeError and
    multiprocessing's OSError came out bare, and a worker started before the failure stayed."""
    result, _ = _run_child(mode, "full", chunky_dataset, "256k")
    *failed, last = result["attempts"]
    assert last.get("exact") is True, last
    assert failed[0]["stage"] == "dataset" and "the epoch cell" in failed[0]["message"]
    named = " ".join(attempt["message"] for attempt in failed)
    assert "the metrics board" in named and "the semaphores of its queues" in named
    for attempt in failed:
        assert attempt["error"][:3] == ["SharedMemoryError", "ArrowStreamError", "OSError"], attempt
        assert "/dev/shm" in attempt["message"] and "--shm-size" in attempt["message"], attempt
        assert attempt["seconds"] < 20, attempt
        assert attempt["children"] == 0 and attempt["left"] == [], attempt


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", [MODE])
def test_a_plain_loader_whose_batch_does_not_fit_in_dev_shm_fails_within_seconds(chunky_dataset, mode):
    """The dataset in a plain StatefulDataLoader: torch puts each tensor of a batch in /dev/shm in
    the queue's feeder thread, which only printed the failure and dropped the batch: the loop
    waited forever. Now the worker says why and ends, and the loop gets torch's error naming it."""
    result, stderr = _run_child(mode, "plain", chunky_dataset, "256k", timeout=90)
    assert result["error"][0] == "RuntimeError" and "exited unexpectedly" in result["message"], result
    assert result["seconds"] < 30, result
    assert re.search(r"arrowstream: DataLoader worker [01] \(pid \d+\) could not send a batch to the trainer: .*"
                     r"No space left on device.*--shm-size", stderr), stderr[-4000:]
