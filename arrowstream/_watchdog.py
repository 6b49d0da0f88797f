"""Workers end themselves when their trainer dies.

A DataLoader worker whose trainer was killed (SIGKILL, OOM killer) can hang forever: its queue
feeder thread blocks writing a large message into a pipe that no one reads any more, and the
worker joins that thread on exit. torch's own watchdog only looks between tasks. This thread
looks every half second and ends the worker at once when the trainer is gone.
"""

from __future__ import annotations

import os
import threading
import time

_started_in: int | None = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch_trainer(trainer_pid: int, interval: float = 0.5) -> None:
    """Start (once per process) a daemon thread that exits this process when ``trainer_pid`` dies."""
    global _started_in
    if _started_in == os.getpid() or trainer_pid == os.getpid():
        return
    _started_in = os.getpid()
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent or not _alive(trainer_pid):
                os._exit(1)

    threading.Thread(target=watch, name="arrowstream-trainer-watchdog", daemon=True).start()
