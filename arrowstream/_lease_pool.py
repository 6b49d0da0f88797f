"""The leases of one iteration of a loader with ``assignment="dynamic"``, shared by its workers.

One int64 tensor in shared memory: the iteration's epoch, the number of leases, the next lease to hand
out, then the worker that took each lease (-1 while nobody has). A lock makes taking a lease one step.
The loader makes a new pool for every ``iter()``, before its workers start, so the workers of an
iteration it abandoned (still running for a moment) hold the old pool and cannot take the new one's
leases. The trainer reads the owners when it writes a checkpoint (see :mod:`arrowstream._dynamic`).
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ._shm import share
from .errors import StateMismatchError

_EPOCH, _COUNT, _NEXT, _OWNERS = 0, 1, 2, 3


class SharedPool:
    """``num_leases`` leases of ``epoch``, taken in order by the workers of one loader iteration."""

    def __init__(self, epoch: int, num_leases: int, context: Any = None) -> None:
        cells = torch.full((_OWNERS + num_leases,), -1, dtype=torch.int64)
        cells[_EPOCH], cells[_COUNT], cells[_NEXT] = epoch, num_leases, 0
        self._cells = share(cells, "assignment='dynamic': the lease pool")
        if isinstance(context, str):
            context = multiprocessing.get_context(context)
        self._lock = (context or multiprocessing).Lock()

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
            return self._cells[_OWNERS:].numpy().copy()

    def check(self, epoch: int, num_leases: int, worker: int) -> None:
        """Refuse to read leases laid out for another epoch or other work than this worker's."""
        if (epoch, num_leases) != (self.epoch, len(self)):
            raise StateMismatchError(
                f"assignment='dynamic': worker {worker} reads epoch {epoch} in {num_leases} lease(s), but the loader laid "
                f"out epoch {self.epoch} in {len(self)}: set_epoch was called after iter(loader). Call set_epoch "
                "before iterating the loader")
