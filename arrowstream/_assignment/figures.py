"""What an assignment policy answers of an epoch's slots and ranks: rows, batches, rows yielded, splits.

``dataset.slot_rows``, ``batch_limits``, ``slot_yields``, ``dataset.rank_yields`` and ``arrowstream inspect`` ask the
dataset's policy (:meth:`~arrowstream._assignment.Assignment.slot_figures`, ``rank_figures``) for these, so each
policy answers for the epochs it reads: the static one its layout's shares (re-planned ones after an elastic
resume), the dynamic one the work each rank's workers lease (re-planned after a resume on another world size).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class Figure(NamedTuple):
    """One slot's (a (rank, worker) slot's, or a whole rank's) epoch: ``rows`` it reads (before a filter), the
    ``batches`` it yields, the ``rows_yielded`` they hold (``even_batches`` trims, ``drop_last`` drops the rest)
    and the ``splits`` (and replayed windows of a re-planned epoch) it reads."""

    rows: int
    batches: int
    rows_yielded: int
    splits: int

    @property
    def yields(self) -> tuple[int, int, int]:
        """``(rows, batches, rows_yielded)``: what ``dataset.slot_yields`` lists per slot."""
        return self.rows, self.batches, self.rows_yielded


def rank_sums(slots: Sequence[Figure], world_size: int) -> list[Figure]:
    """Each rank's figure from its slots' (``slots``: every slot of every rank, rank by rank)."""
    per_rank = len(slots) // world_size
    return [Figure(*(sum(column) for column in zip(*slots[rank * per_rank:(rank + 1) * per_rank], strict=True)))
            for rank in range(world_size)]
