"""The leases of one iteration of a loader with ``assignment="dynamic"``, shared by its workers.

One int64 tensor in shared memory: the iteration's epoch, the number of leases, the next lease to hand
out, the tail leases per worker they were laid out with, then the worker that took each lease (-1 while
nobody has). A lock makes taking a lease one step.
The loader makes a new pool for every ``iter()``, before its workers start, so the workers of an
iteration it abandoned (still running for a moment) hold the old pool and cannot take the new one's
leases. Persistent workers live through iterations: they share two pools (:class:`PoolSlots`), used in
turn. The trainer reads the owners when it writes a checkpoint (see :mod:`arrowstream._dynamic`).
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ._dynamic import TAIL_LEASES_PER_WORKER
from ._shm import share
from .errors import StateMismatchError

_EPOCH, _COUNT, _NEXT, _PIECES, _OWNERS = 0, 1, 2, 3, 4


class SharedPool:
    """``num_leases`` leases of ``epoch``, taken in order by the workers of one loader iteration, laid out
    with ``pieces`` tail leases per worker (the workers lay them out alike); room for ``capacity`` leases
    (at least ``num_leases``) when it is to be :meth:`reset` for later ones."""

    def __init__(self, epoch: int, num_leases: int, context: Any = None, capacity: int = 0,
                 pieces: int = TAIL_LEASES_PER_WORKER) -> None:
        cells = torch.full((_OWNERS + max(num_leases, capacity),), -1, dtype=torch.int64)
        cells[_EPOCH], cells[_COUNT], cells[_NEXT], cells[_PIECES] = epoch, num_leases, 0, pieces
        self._cells = share(cells, "assignment='dynamic': the lease pool")
        if isinstance(context, str):
            context = multiprocessing.get_context(context)
        self._lock = (context or multiprocessing).Lock()

    @property
    def pieces(self) -> int:
        return int(self._cells[_PIECES])

    @property
    def capacity(self) -> int:
        return len(self._cells) - _OWNERS

    def reset(self, epoch: int, num_leases: int, pieces: int = TAIL_LEASES_PER_WORKER) -> None:
        """The pool laid out again for ``num_leases`` leases of ``epoch``, none taken. Only while no
        worker can take from it (see :class:`PoolSlots`)."""
        if num_leases > self.capacity:
            raise ValueError(f"reset: {num_leases} leases, room for {self.capacity}")
        with self._lock:
            self._cells[_OWNERS:] = -1
            self._cells[_EPOCH], self._cells[_COUNT], self._cells[_NEXT] = epoch, num_leases, 0
            self._cells[_PIECES] = pieces

    @property
    def epoch(self) -> int:
        return int(self._cells[_EPOCH])

    def __len__(self) -> int:
        return int(self._cells[_COUNT])

    def take(self, worker: int) -> int | None:
        """The next lease for ``worker``, or None when all are taken."""
        with self._lock:
            lease = int(self._cells[_NEXT])
            if lease >= len(self):
                return None
            self._cells[_NEXT] = lease + 1
            self._cells[_OWNERS + lease] = worker
        return lease

    def owners(self) -> npt.NDArray[np.int64]:
        """Who took each lease (-1: nobody yet), as the trainer reads it for a checkpoint."""
        with self._lock:
            return self._cells[_OWNERS:_OWNERS + len(self)].numpy().copy()

    def check(self, epoch: int, num_leases: int, worker: int) -> None:
        """Refuse to read leases laid out for another epoch or other work than this worker's."""
        if (epoch, num_leases) != (self.epoch, len(self)):
            raise StateMismatchError(
                f"assignment='dynamic': worker {worker} reads epoch {epoch} in {num_leases} lease(s), but the loader laid "
                f"out epoch {self.epoch} in {len(self)}: set_epoch was called after iter(loader). Call set_epoch "
                "before iterating the loader")


def pool_capacity(num_leases: int) -> int:
    """Room for the leases of later epochs in the pools of persistent workers: their count moves a little
    between epochs (which items of the epoch's order fall in the tail, cut in pieces)."""
    return 2 * num_leases + 64


class PoolSlots:
    """Two pools shared by persistent workers, one per iteration in turn: an iteration's workers read the
    current one when their ``iter()`` starts (see ``StructuredDataset._iter_dynamic``).

    Why two: when a persistent loader starts its next iteration, torch lets each worker finish the fetches
    it was sent before it acknowledges the new iteration, and those fetches of the old iteration may take
    leases (an iteration left early). So the next iteration's pool must not be the one those fetches hold:
    :meth:`advance` lays out the other one before the workers are told to start again. The pool it lays
    out was last used two iterations ago, whose fetches all ended before the iteration in between began
    (every worker acknowledged it). Leases are taken only in the workers' reading thread, never in a
    background one, so nothing of an old iteration outlives its acknowledgement.
    """

    def __init__(self, epoch: int, num_leases: int, context: Any = None, pieces: int = TAIL_LEASES_PER_WORKER) -> None:
        capacity = pool_capacity(num_leases)
        self._pools = (SharedPool(epoch, num_leases, context, capacity, pieces), SharedPool(-1, 0, context, capacity))
        self._current = share(torch.zeros(1, dtype=torch.int64), "assignment='dynamic': the current lease pool")

    def current(self) -> SharedPool:
        return self._pools[int(self._current[0])]

    def advance(self, epoch: int, num_leases: int, pieces: int = TAIL_LEASES_PER_WORKER) -> SharedPool | None:
        """The other pool, laid out for ``num_leases`` leases of ``epoch`` and made current; None (nothing
        changed) when it has no room for them: the loader then starts new workers with new pools."""
        other = 1 - int(self._current[0])
        pool = self._pools[other]
        if num_leases > pool.capacity:
            return None
        pool.reset(epoch, num_leases, pieces)
        self._current[0] = other
        return pool
