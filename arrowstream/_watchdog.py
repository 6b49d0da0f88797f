"""Workers end themselves when their trainer dies.

A DataLoader worker whose trainer was killed (SIGKILL, OOM killer) can hang forever: its queue
feeder thread blocks writing a large message into a pipe that no one reads any more, and the
worker joins that thread on exit. torch's own watchdog only looks between tasks, and only at
the worker's parent. This thread looks every half second and ends the worker at once when the
trainer is gone.

The parent is the trainer for fork and spawn workers, but under forkserver it is the fork
server, which outlives the trainer: every forkserver child holds the server's "alive" pipe
open, so the server only exits after its children, and their parent never changes. Such a
worker also watches the trainer's own pid, which the trainer recorded when it pickled the
dataset for the worker (through a pidfd on Linux, which a recycled pid cannot fool). Once the
workers are gone, the fork server and the resource tracker see their pipes close and exit,
unlinking the trainer's semaphores from ``/dev/shm``.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import threading
import time

_started_in: int | None = None


def watch_trainer(trainer_pid: int | None = None, interval: float = 0.5) -> None:
    """Start (once per process) a daemon thread that ends this worker when its trainer is gone.

    Args:
        trainer_pid: The trainer's pid when it is not this worker's parent (forkserver), or
            None to watch the parent only.
        interval: Seconds between two looks.
    """
    global _started_in
    if _started_in == os.getpid():
        return
    _started_in = os.getpid()
    if os.environ.get("ARROWSTREAM_STACKS_ON_SIGUSR1") == "1":
        # for hunting hangs (the test suite sets it): ``kill -USR1 <worker>`` prints every thread's stack
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    parent = os.getppid()
    trainer_fd = _open_pidfd(trainer_pid) if trainer_pid not in (None, parent) else None
    if trainer_pid not in (None, parent) and trainer_fd is None and not _alive(trainer_pid):
        os._exit(1)  # the trainer died before this worker started watching

    def gone() -> bool:
        if os.getppid() != parent:
            return True
        if trainer_fd is not None:
            return bool(select.select([trainer_fd], [], [], 0)[0])  # a pidfd is readable once its process ended
        return trainer_pid not in (None, parent) and not _alive(trainer_pid)

    def watch() -> None:
        while True:
            time.sleep(interval)
            if gone():
                os._exit(1)

    threading.Thread(target=watch, name="arrowstream-trainer-watchdog", daemon=True).start()


def _open_pidfd(pid: int | None) -> int | None:
    """A pidfd of ``pid`` (Linux 5.3+), or None where there is none to have."""
    if pid is None or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _alive(pid: int | None) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as gone)."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
