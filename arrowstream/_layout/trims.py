"""The warning when ``even_batches`` trims more than one batch of a worker in an epoch.

Evening the ranks' batch counts costs at most one batch per worker when the ranks' shares of an epoch
are balanced (guarantee 2). A plan of few or uneven splits, or the rest of an epoch re-planned from a
checkpoint, can leave a rank more rows than another by far; evening then trims the difference, and
those rows are not read in that epoch. The loader's ``__iter__`` (the trainer's process) warns once per
epoch with the numbers the layout fixes before reading: the rows trimmed on this rank, their share of
the rank's epoch, the worker that loses the most batches, and the remedy.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from .._core.order import natural_batches
from ..errors import TrimWarning


@dataclass(frozen=True)
class Trim:
    """What ``even_batches`` leaves out of one rank's epoch."""

    rows: int           # rows trimmed on the rank
    rank_rows: int      # rows of the rank's epoch before trimming
    batches: int        # the most batches trimmed from one worker (from the rank, with dynamic assignment)
    worker: int | None  # that worker; None with dynamic assignment (the rank's rows are trimmed together)
    allowed: int        # the batches evening may trim without a warning: one per worker


def slot_trim(yields: Sequence[tuple[int, int, int]], batch_size: int, drop_last: bool) -> Trim:
    """The trim of a rank whose workers have ``yields`` (rows, batches it yields, rows it yields)."""
    trimmed = [natural_batches(rows, batch_size, drop_last) - limit for rows, limit, _ in yields]
    worst = max(range(len(yields)), key=lambda i: (trimmed[i], -i)) if yields else 0
    rows = sum(r - kept for (r, _, kept), cut in zip(yields, trimmed, strict=True) if cut > 0)
    return Trim(rows, sum(r for r, _, _ in yields), trimmed[worst] if yields else 0, worst, 1)


def rank_trim(rows: int, rank_rows: int, batch_size: int, num_workers: int) -> Trim:
    """The trim of a rank whose rows are trimmed together (dynamic assignment): ``rows`` of ``rank_rows``."""
    return Trim(rows, rank_rows, -(-rows // batch_size), None, max(num_workers, 1))


class TrimWatch:
    """Warns once per epoch (and layout) when ``even_batches`` trims more than one batch of a worker.

    ``what`` names the epoch's kind in the message (``"epoch"``, ``"mixture epoch"``).
    """

    def __init__(self, what: str = "epoch") -> None:
        self._what = what
        self._warned: set[tuple[int, Trim]] = set()

    def starting(self, epoch: int, rank: int, trim: Trim | None,
                 replanned_from: tuple[int, int | None] | None) -> None:
        """An iteration of ``epoch`` starts on ``rank``, whose epoch ``even_batches`` trims by ``trim`` (None:
        nothing, or unknown before reading); ``replanned_from``: the (world_size, num_workers) of the
        checkpoint the epoch was re-planned from, if it was (num_workers None: the ranks' rows were re-planned,
        whatever their workers, as under dynamic assignment)."""
        if trim is None or trim.batches <= trim.allowed or (epoch, trim) in self._warned:
            return
        self._warned.add((epoch, trim))
        who = "the rank" if trim.worker is None else f"worker {trim.worker}"
        if replanned_from is None:
            cause = ("the plan gives the ranks unequal rows (fewer or larger splits than ranks x workers can share "
                     "evenly)")
        else:
            old_workers = "" if replanned_from[1] is None else f", num_workers={replanned_from[1]}"
            cause = (f"the {self._what} was re-planned from a checkpoint of world_size={replanned_from[0]}"
                     f"{old_workers}, and the rows it had left were spread unevenly over the ranks")
        share = trim.rows / trim.rank_rows if trim.rank_rows else 1.0
        warnings.warn(TrimWarning(
            f"even_batches trims {trim.rows:,} row(s) of {self._what} {epoch} on rank {rank} ({share:.1%} of the "
            f"rank's {trim.rank_rows:,} rows), {trim.batches} batch(es) of {who}, more than the "
            f"{trim.allowed} batch(es) evening may cost: {cause}. These rows are not read in this {self._what}. "
            "Pass even_batches=False to read them (ranks then yield different numbers of batches: wrap the "
            "training step in DDP's join()), or give the plan more, smaller splits (split_bytes=...)"),
            stacklevel=3)
