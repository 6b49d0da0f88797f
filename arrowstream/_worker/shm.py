"""Shared memory (``/dev/shm``) that runs out: a clear error, and nothing left behind.

What the loader puts in shared memory: the dataset's epoch cell (one int64, so that
``set_epoch`` reaches persistent workers), the loader's metrics board (a row of counters per
worker), each worker's ring of chunk slots (``arrowstream._worker.ring``), and, through multiprocessing, the
semaphores of the loader's queues. torch makes a tensor's segment with ``posix_fallocate``, so a
full ``/dev/shm`` is an error when the segment is made (a RuntimeError naming ENOSPC), never a
SIGBUS when it is written later: a ring that was made can always be written. The ring falls back
to sending by value; the others have no other way, and raise :class:`SharedMemoryError` where
they are made, in the trainer, before any worker starts.

A failed allocation leaves its file in ``/dev/shm`` and its descriptor open (torch 2.13):
:func:`forget_segment` removes both, so a full ``/dev/shm`` does not fill up with names.

A plain ``StatefulDataLoader`` (not ``create_dataloader``'s) sends each tensor of a batch through
shared memory, made by the loader queue's feeder thread in the worker, where a failure is only
printed and the batch lost: the trainer would wait for it forever. :func:`guard_feeder` makes
such a failure end the worker, with a message, so that the loader reports a dead worker.
"""

from __future__ import annotations

import contextlib
import multiprocessing.queues
import os
import re
import sys
from types import TracebackType
from typing import Any

import torch

from ..errors import SharedMemoryError

REMEDY = ("free space in /dev/shm (see `df -h /dev/shm`), or give the machine a larger /dev/shm "
          "(`mount -o remount,size=8G /dev/shm`; in docker, `docker run --shm-size=8g`)")

_SEGMENT = re.compile(r"<(/torch_(\d+)_\w+)>")  # torch names the segment it could not make


def share(tensor: torch.Tensor, what: str) -> torch.Tensor:
    """``tensor``, moved to shared memory; :class:`SharedMemoryError` naming ``what`` when it cannot be."""
    try:
        tensor.share_memory_()  # type: ignore[no-untyped-call]
    except RuntimeError as exc:
        forget_segment(exc)
        raise SharedMemoryError(f"{what}: no room in shared memory (/dev/shm) for {tensor.nbytes} bytes ({exc}); "
                                f"{REMEDY}") from exc
    return tensor


def forget_segment(exc: BaseException) -> None:
    """Close and unlink the segment that torch's failed allocation of ``exc`` left (this process's only)."""
    match = _SEGMENT.search(str(exc))
    if match is None or int(match.group(2)) != os.getpid():
        return
    path = "/dev/shm" + match.group(1)
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{fd}") == path:
                    os.close(int(fd))
    with contextlib.suppress(OSError):
        os.unlink(path)


def semaphore_failure(exc: OSError, num_workers: int) -> SharedMemoryError | None:
    """A :class:`SharedMemoryError` when ``exc`` is multiprocessing failing to make a semaphore
    (they live in ``/dev/shm``) while the loader started its workers, else None.

    Workers the loader had started before the failure are ended: nothing would ever ask them
    for a batch.
    """
    if not any(frame.f_code.co_filename.endswith(os.path.join("multiprocessing", "synchronize.py"))
               for frame in _frames(exc.__traceback__)):
        return None
    _end_started_workers(exc.__traceback__)
    return SharedMemoryError(
        f"the DataLoader could not start its {num_workers} worker(s): multiprocessing found no room in "
        f"shared memory (/dev/shm) for the semaphores of its queues ({type(exc).__name__}: {exc}); {REMEDY}, or pass "
        "num_workers=0")


def _frames(tb: TracebackType | None) -> list[Any]:
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _end_started_workers(tb: TracebackType | None) -> None:
    """End the workers of the loader iterator whose ``__init__`` raised, and mark it shut down
    (its ``__del__`` would trip over the attributes it never set)."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    for frame in _frames(tb):
        iterator = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
        if not isinstance(iterator, _BaseDataLoaderIter):
            continue
        workers = getattr(iterator, "_workers", [])
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join(timeout=5)
        iterator._shutdown = True  # type: ignore[attr-defined]
        return


FEEDER_FAILED_EXIT_CODE = 75
_guarded_in: int | None = None


def guard_feeder(worker_id: int) -> None:
    """In a loader worker, before its first message: a message that the queue's feeder thread
    cannot send ends the worker (exit code ``FEEDER_FAILED_EXIT_CODE``) instead of being dropped."""
    global _guarded_in
    if _guarded_in == os.getpid():
        return
    _guarded_in = os.getpid()

    def on_feeder_error(exc: BaseException, obj: object) -> None:
        forget_segment(exc)
        room = f"; {REMEDY}" if isinstance(exc, OSError | RuntimeError) and "shared memory" in str(exc) else ""
        sys.stderr.write(f"arrowstream: DataLoader worker {worker_id} (pid {os.getpid()}) could not send a batch "
                         f"to the trainer: the loader's queue failed to pickle it ({type(exc).__name__}: {exc})"
                         f"{room}. The batch is lost, so the worker ends now: the loader reports a dead worker "
                         "instead of waiting for it forever. The loader of StructuredDataset.create_dataloader "
                         "sends batches by value when shared memory is full\n")
        sys.stderr.flush()
        os._exit(FEEDER_FAILED_EXIT_CODE)

    multiprocessing.queues.Queue._on_queue_feeder_error = staticmethod(on_feeder_error)  # type: ignore[attr-defined]
