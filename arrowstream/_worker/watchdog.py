"""Dying processes: workers end themselves when their trainer dies, and the trainer names a dead worker.

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

The other way round, a worker that dies (SIGKILL, the out-of-memory killer) surfaces in the
trainer as whatever broke first: torch's RuntimeError naming a pid, a reset connection, a
truncated message, or torch's SIGCHLD handler raising its RuntimeError wherever the trainer's
main thread stands. :func:`worker_death` turns those into one
:class:`~arrowstream.errors.WorkerError` naming the worker, and :func:`name_dead_workers` does
it for the SIGCHLD handler. A worker killed while it was writing a message to the loader's
pipe leaves the trainer waiting for the rest of that message, forever (no SIGCHLD reaches a
trainer from forkserver workers): :func:`guard_reads` makes such a read give up once the
sender is known dead.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

from ..errors import WorkerError

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
        # to the process's own stderr: sys.stderr may be an object without a file descriptor (pytest's capsys)
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__ or 2, all_threads=True)
    parent = os.getppid()
    trainer_fd = _open_pidfd(trainer_pid) if trainer_pid not in (None, parent) else None
    if trainer_pid not in (None, parent) and trainer_fd is None and not process_alive(trainer_pid):
        os._exit(1)  # the trainer died before this worker started watching

    def gone() -> bool:
        if os.getppid() != parent:
            return True
        if trainer_fd is not None:
            return bool(select.select([trainer_fd], [], [], 0)[0])  # a pidfd is readable once its process ended
        return trainer_pid not in (None, parent) and not process_alive(trainer_pid)

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


def process_alive(pid: int | None) -> bool:
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


# what a worker's death looks like from the trainer: torch's own report, or a broken transport
_DEATH_SYMPTOMS = (RuntimeError, OSError, EOFError, pickle.UnpicklingError)


def worker_death(workers: Sequence[Any], exc: BaseException, wait: float = 3.0,
                 named: bool = False) -> WorkerError | None:
    """A :class:`WorkerError` naming the dead worker when ``exc`` came from a worker's death, else None.

    The trainer can see a reset connection or a truncated message a moment before the kernel
    reports the worker's exit, so this waits up to ``wait`` seconds for one to be reported.
    Errors a live worker raised and sent (``Caught ... in DataLoader worker process N``) are
    left as they are. ``named``: only a worker whose pid the message of ``exc`` names.
    """
    found = _dead_worker(workers, exc, wait, named)
    if found is None:
        return None
    index, worker = found
    return WorkerError(
        f"DataLoader worker {index} (pid {worker.pid}) died ({_how(worker)}) before it sent all its batches of this "
        f"epoch; the loader cannot go on without it ({type(exc).__name__}: {exc}). Resume from your last "
        f"checkpoint with loader.load_state_dict(state): no row is lost or repeated then. {_OOM_HINT}")


def _dead_worker(workers: Sequence[Any], exc: BaseException, wait: float,
                 named: bool = False) -> tuple[int, Any] | None:
    """The index and process of the dead worker ``exc`` came from (the one its message names first), waiting
    up to ``wait`` seconds for an exit to be reported; None when ``exc`` is not a death's."""
    if not isinstance(exc, _DEATH_SYMPTOMS) or str(exc).startswith("Caught "):
        return None
    deadline = time.monotonic() + wait
    while True:
        dead = [(index, worker) for index, worker in enumerate(workers) if worker.exitcode not in (None, 0)]
        if dead or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    message = str(exc)
    dead.sort(key=lambda item: f"pid {item[1].pid})" not in message and f"pid(s) {item[1].pid}" not in message)
    if not dead or (named and str(dead[0][1].pid) not in message):
        return None
    return dead[0]


_OOM_HINT = "A SIGKILL is often the out-of-memory killer: lower num_workers, prefetch_factor or batch_size"


def _how(worker: Any) -> str:
    code = worker.exitcode
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def raise_death_between_iterations(loader: Any, exc: BaseException, epoch: int) -> None:
    """When ``exc`` came from a persistent worker of ``loader`` that died after the last iteration (torch finds
    it as the next one starts, and raises a RuntimeError naming a pid): end the other workers, so that the
    next ``iter(loader)`` starts new ones at the epoch's first batch (nothing of it was handed out), and raise
    a :class:`WorkerError` naming the dead one. Otherwise return."""
    iterator = loader._iterator
    found = _dead_worker(iterator._workers, exc, wait=0.0) if loader.persistent_workers and iterator is not None else None
    if found is None:
        return
    iterator._shutdown_workers()
    loader._iterator = None
    index, worker = found
    raise WorkerError(
        f"DataLoader worker {index} (pid {worker.pid}) died ({_how(worker)}) after the last iteration "
        f"(persistent_workers=True), found as epoch {epoch} started; no batch of it was handed out "
        f"({type(exc).__name__}: {exc}). The loader ended its other workers: iterate it again to start new ones at "
        f"the epoch's first batch, or load a checkpoint. {_OOM_HINT}") from exc


_watched: weakref.WeakSet[Any] = weakref.WeakSet()  # the trainer's torch iterators with live workers


def name_dead_workers(iterator: Any) -> None:
    """Make torch's SIGCHLD report of a dead worker of ``iterator`` a :class:`WorkerError` naming it.

    torch's handler raises a RuntimeError naming only a pid, in the main thread, wherever it is
    (the training step, or a weakref callback, where Python can only print it as "Exception
    ignored"). This wraps it, once per process, from the main thread only (where signal handlers
    can be set): a dead worker of an iterator whose reads are guarded (:func:`guard_reads`) raises
    nothing here, and the loader's next read raises the :class:`WorkerError` within
    ``STALL_CHECK_S``; one of another iterator raises the ``WorkerError`` here.
    """
    _watched.add(iterator)
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGCHLD)
    if getattr(previous, "arrowstream", False) or not callable(previous):
        return

    def handler(signum: int, frame: Any) -> None:
        try:
            previous(signum, frame)
        except RuntimeError as exc:
            for watched in list(_watched):
                error = worker_death(getattr(watched, "_workers", []), exc, wait=0.0, named=True)
                if error is None:
                    continue
                if getattr(getattr(watched, "_worker_result_queue", None), "_guarded", False):
                    return  # the next read of this loader reports it, where the trainer expects errors
                raise error from exc
            raise

    handler.arrowstream = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGCHLD, handler)


STALL_CHECK_S = 1.0  # a read that got no byte for this long looks for a dead worker


def guard_reads(iterator: Any) -> None:
    """Make the trainer's reads of ``iterator``'s result queue give up once a worker is dead.

    Both a wait for the next message (torch looks for dead workers only every 5 seconds) and a
    message whose sender died half-way (which nothing else ends). Replaces the queue's
    ``_poll`` and ``_recv_bytes`` (CPython's ``multiprocessing.Queue`` reads through them) in
    this process only; a queue of another shape is left as it is.
    """
    queue = getattr(iterator, "_worker_result_queue", None)
    reader = getattr(queue, "_reader", None)
    if queue is None or reader is None or not hasattr(queue, "_recv_bytes") or getattr(queue, "_guarded", False):
        return
    fd = reader.fileno()
    watched = weakref.ref(iterator)  # the queue must not keep its iterator (and its pipes) alive

    def poll(timeout: float = 0.0) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if reader.poll(max(0.0, min(STALL_CHECK_S, deadline - time.monotonic()))):
                return True
            _raise_if_dead(watched(), "no message came")
            if time.monotonic() >= deadline:
                return False

    def recv_bytes() -> bytearray:
        (size,) = struct.unpack("!i", _read_exactly(fd, 4, watched))
        if size == -1:
            (size,) = struct.unpack("!Q", _read_exactly(fd, 8, watched))
        return _read_exactly(fd, size, watched)

    queue._poll, queue._recv_bytes = poll, recv_bytes
    queue._guarded = True


def _read_exactly(fd: int, size: int, watched: weakref.ref[Any]) -> bytearray:
    """``size`` bytes of the pipe ``fd``; EOFError when they stop coming and a worker is dead."""
    data = bytearray(size)
    view = memoryview(data)
    done = 0
    while done < size:
        if not select.select([fd], [], [], STALL_CHECK_S)[0]:
            _raise_if_dead(watched(), f"a message stopped after {done} of {size} bytes")
            continue
        count = os.readv(fd, [view[done:]])
        if count == 0:
            raise EOFError(f"the DataLoader workers' pipe closed after {done} of {size} bytes of a message")
        done += count
    return data


def _raise_if_dead(iterator: Any, what: str) -> None:
    """EOFError when a worker the trainer still expects batches from has died: the read stops waiting."""
    if iterator is None:
        return
    expected = zip(iterator._workers, iterator._workers_status, strict=False)
    dead = [worker.pid for worker, waited_for in expected if waited_for and worker.exitcode not in (None, 0)]
    if dead:
        raise EOFError(f"{what} from the DataLoader workers, and worker pid(s) {dead} died")
