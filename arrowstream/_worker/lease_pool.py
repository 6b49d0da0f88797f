"""The leases of one iteration of a loader with ``assignment="dynamic"``, shared by its workers.

One int64 tensor in shared memory: the iteration's epoch, the number of leases, the next lease to hand
out, the tail leases per worker of the last eighth (0 until decided), how many leases come before the
last eighth, whether the leases are of a loaded checkpoint's rest of the epoch (1) or of its fresh rows
(0), the number of leases once the last eighth is laid out, then the worker that took each lease (-1
while nobody has). A lock makes taking a lease one step: a :class:`ProcessLock`, which a worker killed
while it holds it does not keep (the trainer would wait for it forever at its next checkpoint). Such a
worker may die between two writes of its step, so each step writes the cell that makes it count last:
the tail pieces after the count they go with (the count read is the decided one only once the pieces
are), the next lease after its owner (a lease owned but not yet passed is taken again by the next
worker; the dead one never read it). The worker that takes the first lease of the last eighth decides how finely it is cut, by what the
workers measured so far (see :func:`arrowstream._layout.leases.lease_bounds`), in the same step: no lease of
the last eighth is handed out before its layout is known.
The loader makes a new pool for every ``iter()``, before its workers start, so the workers of an
iteration it abandoned (still running for a moment) hold the old pool and cannot take the new one's
leases. Persistent workers live through iterations: they share two pools (:class:`PoolSlots`), used in
turn. The trainer reads the owners when it writes a checkpoint (see :mod:`arrowstream._layout.leases`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import torch

from .._layout.leases import TAIL_LEASES_PER_WORKER
from ..errors import StateMismatchError
from .process_lock import ProcessLock
from .shm import share

_EPOCH, _COUNT, _NEXT, _PIECES, _FIXED, _LOADED, _DECIDED, _OWNERS = 0, 1, 2, 3, 4, 5, 6, 7

Decide = Callable[[], tuple[int, int]]   # the tail pieces of the last eighth, and the leases with them


class SharedPool:
    """``num_leases`` leases of ``epoch`` (with the default tail), taken in order by the workers of one
    loader iteration; the first ``fixed`` are the same with any tail, the rest are laid out again when the
    first of them is taken (:meth:`take`). Room for ``capacity`` leases (at least ``num_leases``): the most
    any tail gives, and what a :meth:`reset` for later epochs may need. ``loaded``: the leases are of the
    loaded checkpoint's rest of ``epoch`` (see ``DynamicEpochs``), not of its fresh rows."""

    def __init__(self, epoch: int, num_leases: int, capacity: int = 0,
                 fixed: int | None = None, loaded: bool = False) -> None:
        cells = torch.full((_OWNERS + max(num_leases, capacity),), -1, dtype=torch.int64)
        self._cells = share(cells, "assignment='dynamic': the lease pool")
        self._lay_out(epoch, num_leases, num_leases if fixed is None else fixed, loaded)
        self._lock = ProcessLock()

    def _lay_out(self, epoch: int, num_leases: int, fixed: int, loaded: bool) -> None:
        cells = self._cells
        cells[_OWNERS:] = -1
        cells[_EPOCH], cells[_COUNT], cells[_NEXT], cells[_PIECES], cells[_FIXED] = epoch, num_leases, 0, 0, fixed
        cells[_LOADED], cells[_DECIDED] = int(loaded), num_leases

    @property
    def pieces(self) -> int:
        """Tail leases per worker of the last eighth: decided, or the default while undecided."""
        return int(self._cells[_PIECES]) or TAIL_LEASES_PER_WORKER

    @property
    def fixed(self) -> int:
        return int(self._cells[_FIXED])

    @property
    def capacity(self) -> int:
        return len(self._cells) - _OWNERS

    def reset(self, epoch: int, num_leases: int, fixed: int | None = None, loaded: bool = False) -> None:
        """The pool laid out again for ``num_leases`` leases of ``epoch``, none taken. Only while no
        worker can take from it (see :class:`PoolSlots`)."""
        if num_leases > self.capacity:
            raise ValueError(f"reset: {num_leases} leases, room for {self.capacity}")
        with self._lock:
            self._lay_out(epoch, num_leases, num_leases if fixed is None else fixed, loaded)

    @property
    def epoch(self) -> int:
        return int(self._cells[_EPOCH])

    @property
    def loaded(self) -> bool:
        """Whether the leases are of the loaded checkpoint's rest of the epoch."""
        return bool(self._cells[_LOADED])

    def __len__(self) -> int:
        cells = self._cells
        return int(cells[_DECIDED] if int(cells[_PIECES]) else cells[_COUNT])

    def take(self, worker: int, decide: Decide | None = None) -> int | None:
        """The next lease for ``worker``, or None when all are taken. The first lease of the last eighth
        is taken after ``decide`` has laid it out: its tail pieces and the number of leases with them (where
        the pool has no room for them, the default stays)."""
        with self._lock:
            cells = self._cells
            lease = int(cells[_NEXT])
            if lease == int(cells[_FIXED]) and not int(cells[_PIECES]) and decide is not None:
                pieces, count = decide()
                if count > self.capacity:
                    pieces, count = TAIL_LEASES_PER_WORKER, int(cells[_COUNT])
                cells[_DECIDED] = count
                cells[_PIECES] = pieces   # last: the layout counts from here
            if lease >= len(self):
                return None
            cells[_OWNERS + lease] = worker
            cells[_NEXT] = lease + 1   # last: the lease is taken from here
        return lease

    def owners(self) -> npt.NDArray[np.int64]:
        """Who took each lease (-1: nobody yet)."""
        return self.snapshot()[1]

    def snapshot(self) -> tuple[int, npt.NDArray[np.int64]]:
        """The tail pieces and who took each lease, read together (a worker may lay out the last eighth
        meanwhile), as the trainer reads them for a checkpoint."""
        with self._lock:
            return self.pieces, self._cells[_OWNERS:_OWNERS + len(self)].numpy().copy()

    def check(self, epoch: int, fixed: int, worker: int) -> None:
        """Refuse to read leases laid out for another epoch or other work than this worker's (``fixed``: its
        leases before the last eighth)."""
        if (epoch, fixed) != (self.epoch, self.fixed):
            raise StateMismatchError(
                f"assignment='dynamic': worker {worker} reads epoch {epoch} in {fixed} lease(s) before its last "
                f"eighth, but the loader laid out epoch {self.epoch} in {self.fixed}: set_epoch was called after "
                "iter(loader). Call set_epoch before iterating the loader")


class PoolSlots:
    """Two pools shared by persistent workers, one per iteration in turn: an iteration's workers read the
    current one when their ``iter()`` starts (see ``DynamicAssignment.iterate``).

    Why two: when a persistent loader starts its next iteration, torch lets each worker finish the fetches
    it was sent before it acknowledges the new iteration, and those fetches of the old iteration may take
    leases (an iteration left early). So the next iteration's pool must not be the one those fetches hold:
    :meth:`advance` lays out the other one before the workers are told to start again. The pool it lays
    out was last used two iterations ago, whose fetches all ended before the iteration in between began
    (every worker acknowledged it). Leases are taken only in the workers' reading thread, never in a
    background one, so nothing of an old iteration outlives its acknowledgement.
    """

    def __init__(self, epoch: int, num_leases: int, capacity: int = 0,
                 fixed: int | None = None, loaded: bool = False) -> None:
        room = pool_capacity(max(num_leases, capacity))
        self._pools = (SharedPool(epoch, num_leases, room, fixed, loaded), SharedPool(-1, 0, room))
        self._current = share(torch.zeros(1, dtype=torch.int64), "assignment='dynamic': the current lease pool")

    def current(self) -> SharedPool:
        return self._pools[int(self._current[0])]

    def advance(self, epoch: int, num_leases: int, capacity: int = 0, fixed: int | None = None,
                loaded: bool = False) -> SharedPool | None:
        """The other pool, laid out for ``num_leases`` leases of ``epoch`` (room for ``capacity``) and made
        current; None (nothing changed) when it has no room for them: the loader then starts new workers
        with new pools."""
        other = 1 - int(self._current[0])
        pool = self._pools[other]
        if max(num_leases, capacity) > pool.capacity:
            return None
        pool.reset(epoch, num_leases, fixed, loaded)
        self._current[0] = other
        return pool


def pool_capacity(num_leases: int) -> int:
    """Room for the leases of later epochs in the pools of persistent workers: their count moves a little
    between epochs (which items of the epoch's order fall in the tail, cut in pieces)."""
    return 2 * num_leases + 64
