"""A trainer process for the crash tests: iterates a loader and reports the processes it started.

Usage: ``trainer_child.py DATASET PID_FILE [START_METHOD]``. PID_FILE receives, as JSON, the
worker pids, the pids of multiprocessing's helpers (fork server, resource tracker) and the
names of the semaphores this process registered for cleanup (its ``/dev/shm/sem.*`` entries).
"""

from __future__ import annotations

import json
import os
import sys
import time
from multiprocessing import resource_tracker

from helpers import make_loader

_registered: list[str] = []
_register = resource_tracker.register


def _record(name: str, rtype: str) -> None:
    """Note every named resource handed to the resource tracker, then register it as usual."""
    _registered.append(name)
    _register(name, rtype)


def _helper_pids() -> list[int]:
    from multiprocessing import forkserver

    pids = [forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid]
    return [pid for pid in pids if pid is not None]


if __name__ == "__main__":
    path, pid_file = sys.argv[1:3]
    method = sys.argv[3] if len(sys.argv) > 3 else None
    resource_tracker.register = _record
    loader, dataset = make_loader(path, 2, batch_size=64, persistent_workers=True, multiprocessing_context=method)
    it = iter(loader)
    next(it)
    with open(pid_file + ".tmp", "w") as f:
        json.dump({"workers": [w.pid for w in loader._iterator._workers], "helpers": _helper_pids(),
                   "semaphores": _registered}, f)
    os.replace(pid_file + ".tmp", pid_file)
    while True:  # keep the workers busy until the test kills this process
        time.sleep(0.05)
