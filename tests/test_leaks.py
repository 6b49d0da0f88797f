"""The leak check of every test (tests/leaks.py, run by conftest.py's autouse fixture) finds what it should."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

from leaks import SHM, Snapshot, descendants


def test_a_thread_left_running_is_found_one_that_ends_is_not():
    before = Snapshot.take()
    stop = threading.Event()
    running = threading.Thread(target=stop.wait, name="left-running", daemon=True)
    ending = threading.Thread(target=stop.wait, args=(0.05,), name="ending-soon")
    running.start()
    ending.start()
    try:
        found = before.leaks(set(), grace_s=0.5)
        assert len(found) == 1 and found[0].startswith("thread 'left-running' (daemon, target Event.wait)")
    finally:
        stop.set()
        running.join()
    assert before.leaks(set(), grace_s=0.5) == []


def test_a_child_process_left_running_is_found_unless_its_group_is_allowed():
    before = Snapshot.take()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        found = _processes(before.leaks(set(), grace_s=0.2))
        assert found == [f"process {child.pid} ({sys.executable} -c import time; time.sleep(60))"]
        assert _processes(before.leaks({child.pid}, grace_s=0.2)) == []   # a session server's group
    finally:
        child.kill()
        child.wait()
    assert before.leaks(set(), grace_s=0.2) == []


def _processes(found):
    """The processes among what a leak check found (another test beside this one may make /dev/shm entries)."""
    return [line for line in found if line.startswith("process ")]


def _holds(pid, path, timeout=10.0):
    """Wait until ``pid`` has ``path`` open (a shell's background job opens it after the shell has returned)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if any(os.readlink(fd.path) == path for fd in os.scandir(f"/proc/{pid}/fd")):
                return True
        time.sleep(0.01)
    return False


def test_a_shared_memory_entry_left_behind_is_found_unless_another_process_holds_it():
    path = os.path.join(SHM, f"arrowstream-leak-test-{uuid.uuid4().hex}")
    before = Snapshot.take()
    # kept open while it exists: the leak checks of tests running beside this one see another process's entry
    with open(path, "wb"):
        try:
            assert before.leaks(set(), grace_s=0.2) == [path]
            # held open by a process outside this one's tree (as by a test run beside this one): not ours
            started = subprocess.run(["/bin/sh", "-c", f"sleep 60 3<{path} >/dev/null 2>&1 & echo $!"],
                                     capture_output=True, text=True, check=True)
            orphan = int(started.stdout)
            try:
                assert orphan not in descendants(os.getpid())
                assert _holds(orphan, path)
                assert before.leaks(set(), grace_s=0.2) == []
            finally:
                os.kill(orphan, signal.SIGKILL)
        finally:
            os.unlink(path)
    assert before.leaks(set(), grace_s=0.2) == []


def test_a_semaphore_is_ours_only_if_this_process_made_it():
    import multiprocessing

    before = Snapshot.take()
    lock = multiprocessing.get_context("spawn").Lock()   # named in /dev/shm until it is collected
    foreign = os.path.join(SHM, f"sem.mp-{uuid.uuid4().hex[:8]}")   # as another run's, left by a dead owner
    with open(foreign, "wb"):
        pass
    try:
        assert before.leaks(set(), grace_s=0.2) == [f"{SHM}/sem.{lock._semlock.name.lstrip('/')}"]
    finally:
        os.unlink(foreign)
        del lock
    assert before.leaks(set(), grace_s=0.2) == []
