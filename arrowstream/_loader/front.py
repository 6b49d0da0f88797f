"""What both front doors (``StructuredDataset``, ``Mixture``) are to a loader, defined once: :class:`FrontDoor`.

An ``IterableDataset`` read as a stream (:class:`~arrowstream._loader.plain.Streamed`), with the epoch it reads
next in shared memory (so that ``set_epoch`` reaches persistent workers), its look at the loader that iterates it
(:class:`~arrowstream._loader.plain.LoaderWatch`), its place among the ranks and its resolved options. The bases of
the front doors (``_loader/dataset_hooks.py``'s ``DatasetHooks``, ``_loader/mixture_hooks.py``'s ``MixtureHooks``)
stand on it and set ``_rank``, ``_world_size`` and ``_options``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.utils.data import IterableDataset

from .._worker.shm import share
from ..errors import InvalidArgumentError
from .plain import LoaderWatch, Streamed

if TYPE_CHECKING:
    from .._planning.options import Options


class FrontDoor(Streamed, IterableDataset):  # type: ignore[type-arg]
    """The epoch cell, the loader watch, the rank and the options of a front door named ``what`` (in errors)."""

    _rank: int
    _world_size: int
    _options: Options

    def __init__(self, what: str) -> None:
        super().__init__()
        # shared, so that set_epoch reaches persistent workers
        self._epoch_cell = share(torch.zeros(1, dtype=torch.int64), f"{what}: the epoch cell")
        self._loader_watch = LoaderWatch(what)   # a loader that batches again, or cannot resume

    @property
    def epoch(self) -> int:
        """The epoch read next (``set_epoch``)."""
        return int(self._epoch_cell[0])

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to read next; with ``shuffle=True`` each epoch has its own order (a mixture's quotas
        and passes are per epoch too).

        Call it before iterating the loader each epoch. It reaches persistent workers too.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidArgumentError(f"set_epoch: epoch must be an int >= 0, got {epoch!r}")
        self._epoch_cell[0] = epoch

    @property
    def rank(self) -> int:
        """This rank's place among the ranks that read distinct data (its group's, with ``group_size``)."""
        return self._rank

    @property
    def world_size(self) -> int:
        """How many ranks read distinct data (groups, with ``group_size``)."""
        return self._world_size

    @property
    def batch_size(self) -> int:
        """Rows per batch."""
        return self._options.batch_size

    @property
    def options(self) -> Options:
        """The options this front door reads with, as resolved (a frozen value; for arrowstream's own modules)."""
        return self._options
