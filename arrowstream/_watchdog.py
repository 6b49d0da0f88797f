"""Workers end themselves when their trainer dies.

A DataLoader worker whose trainer was killed (SIGKILL, OOM killer) can hang forever: its queue
feeder thread blocks writing a large message into a pipe that no one reads any more, and the
worker joins that thread on exit. torch's own watchdog only looks between tasks. This thread
looks every half second and ends the worker at once when the trainer is gone.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time

_started_in: int | None = None


def watch_trainer(interval: float = 0.5) -> None:
    """Start (once per process) a daemon thread that ends this worker when its parent is gone.

    The parent is the trainer for fork and spawn workers, and for forkserver workers the fork
    server, which exits when the trainer does; either way the worker is re-parented then.
    """
    global _started_in
    if _started_in == os.getpid():
        return
    _started_in = os.getpid()
    if os.environ.get("ARROWSTREAM_STACKS_ON_SIGUSR1") == "1":
        # for hunting hangs (the test suite sets it): ``kill -USR1 <worker>`` prints every thread's stack
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="arrowstream-trainer-watchdog", daemon=True).start()
