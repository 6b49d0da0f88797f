"""A per-worker ring of shared-memory slots for chunk buffers.

Through the loader's pipe, a chunk buffer is copied five times (pack, pickle, pipe in, pipe
out, unpickle) and the pipe's small capacity makes the trainer wait on many reads. With a ring,
the worker packs straight into a slot and only a small descriptor travels; the trainer copies
the slot out once and frees it.

The ring is a torch shared-memory tensor. Under torch's default ``file_descriptor`` sharing
strategy its segment is unlinked as soon as it exists, so it lives only as long as a process
maps it: a killed worker or trainer leaves nothing in ``/dev/shm``. The tensor travels to the
trainer once, with the worker's first chunk; later chunks name it by id.

The first ``num_slots`` bytes are flags: 1 while a slot holds a chunk in transit, 0 when the
trainer has copied it out. Only the worker's own thread claims slots (``Chunk.pack``) and only
the trainer frees them. When no slot is free or a chunk does not fit, the chunk goes by value:
the worker never waits on the trainer. When the ring cannot be made (``/dev/shm`` full or
missing), every chunk of that worker goes by value, with one warning (see ``arrowstream._worker.shm``).
"""

from __future__ import annotations

import logging
import os
from multiprocessing.reduction import ForkingPickler

import numpy as np
import torch

from .shm import REMEDY, forget_segment
from .watchdog import process_alive

logger = logging.getLogger("arrowstream")

NUM_SLOTS = 6
MAX_RING_BYTES = 256 << 20
_HEADER = 64


class Ring:
    """The worker's side: claims slots and writes chunk buffers into them."""

    def __init__(self, slot_bytes: int, num_slots: int = NUM_SLOTS) -> None:
        # not ``random``: torchdata seeds it per worker from a base seed that a resumed loader
        # restores, so a resumed worker would take the id of the ring of the run it resumes
        self.id = int.from_bytes(os.urandom(8), "little") >> 2
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.tensor = torch.empty(_HEADER + num_slots * slot_bytes, dtype=torch.uint8)
        # torch fallocates the segment: no room is this RuntimeError now, never a SIGBUS in a slot write later
        self.tensor.share_memory_()  # type: ignore[no-untyped-call]
        self.array = self.tensor.numpy()
        self.array[:num_slots] = 0
        self.announced = False

    def claim(self, nbytes: int) -> int | None:
        """A free slot for ``nbytes``, marked busy; None when none is free or it does not fit."""
        if nbytes > self.slot_bytes:
            return None
        for slot in range(self.num_slots):
            if self.array[slot] == 0:
                self.array[slot] = 1
                return slot
        return None

    def announcement(self) -> bytes | None:
        """The ring's tensor pickled for the trainer, the first time only (then None).

        Pickled here, in the worker's own thread, rather than by the queue's feeder thread,
        where a failure (no file descriptor left to share it) would drop the chunk silently.
        """
        if self.announced:
            return None
        data = bytes(ForkingPickler.dumps(self.tensor))
        self.announced = True
        return data

    def view(self, slot: int, nbytes: int) -> np.ndarray:
        start = _HEADER + slot * self.slot_bytes
        view: np.ndarray = self.array[start:start + nbytes]
        return view


_ring: Ring | None = None
_ring_pid = -1


def worker_ring(nbytes: int) -> Ring | None:
    """This worker's ring, sized on first use for chunks of about ``nbytes``.

    ``ARROWSTREAM_SHM_RING=0`` in the environment turns rings off (every chunk by value), for
    benchmarks and for platforms without shared memory.
    """
    global _ring, _ring_pid
    if _ring_pid != os.getpid():
        _ring, _ring_pid = None, os.getpid()
        if os.environ.get("ARROWSTREAM_SHM_RING", "1") == "0":
            return None
        slot_bytes = -(-max(nbytes + nbytes // 4, 1 << 16) // 4096) * 4096
        if slot_bytes * NUM_SLOTS <= MAX_RING_BYTES:
            try:
                _ring = Ring(slot_bytes)
            except (OSError, RuntimeError) as exc:  # torch reports a full /dev/shm as RuntimeError
                forget_segment(exc)
                logger.warning("arrowstream: the DataLoader worker of pid %d cannot make its shared-memory ring of %d "
                               "bytes (%s); its batches go through the loader's pipe instead (slower, nothing is "
                               "lost). To use the ring, %s; or set ARROWSTREAM_SHM_RING=0 to silence this",
                               os.getpid(), slot_bytes * NUM_SLOTS, exc, REMEDY)
    return _ring


# the trainer's side: rings by id, as numpy views of the received tensors
_known: dict[int, tuple[int, torch.Tensor, np.ndarray]] = {}


def register(ring_id: int, owner_pid: int, tensor: torch.Tensor) -> None:
    """Keep a worker's ring, forgetting rings of workers that have exited."""
    for known_id, (pid, _, _) in list(_known.items()):
        if not process_alive(pid):
            del _known[known_id]
    _known[ring_id] = (owner_pid, tensor, tensor.numpy())


def take(ring_id: int, slot: int, slot_bytes: int, nbytes: int) -> np.ndarray:
    """Copy a slot's buffer out and free the slot."""
    try:
        array = _known[ring_id][2]
    except KeyError:
        raise RuntimeError(f"arrowstream transport: a chunk names ring {ring_id}, which this process never "
                           "received; this is a bug, please report it") from None
    start = _HEADER + slot * slot_bytes
    out = array[start:start + nbytes].copy()
    array[slot] = 0
    return out
