"""``order="canonical"``: one global sequence of rows for every topology that divides ``canonical_slots``.

With ``order="topology"`` (the default) an epoch is laid out over the (rank, worker) slots that read it, so the
rows of each global step depend on how many there are. With ``order="canonical"`` it is laid out over
``canonical_slots`` *canonical slots* instead, fixed whatever reads them:

* the epoch's splits, in the epoch's order (shuffled or not), are one sequence of rows cut into ``C`` contiguous
  stretches of equal rows (within one; :func:`canonical_shares`): canonical slot ``c`` reads stretch ``c``, its
  own interleave and shuffle windows seeded by ``c`` (a :class:`~arrowstream._core.order.Slot` of rank ``c`` among
  ``C`` ranks without workers, :func:`canonical_slot`), in batches of ``chunk`` rows;
* global batch ``k`` (every rank's ``k``-th batch, ranks in rank order) is chunk ``k`` of canonical slot 0, then
  of slot 1, ... of slot ``C - 1``: ``chunk = world_size * batch_size / C`` rows each;
* a physical slot ``p`` of ``P = world_size * workers`` reads canonical slots ``[p C / P, (p + 1) C / P)``
  (:func:`physical_range`) and yields their chunks side by side; a rank's batch is its workers' parts, worker
  after worker (the trainer puts them together, ``arrowstream._loader.canonical``).

Every canonical slot yields the same number of chunks (their ``even_batches`` limits, over ``C`` ranks), so
global batch ``k`` holds the same rows, in the same order, on any topology that divides ``C``; a checkpoint is each
canonical slot's cursor, and resumes on any such topology without a re-plan. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._core.order import Slot, SlotGrid, epoch_order
from .._core.plan_types import SplitTable
from ..errors import InvalidArgumentError
from .elastic import Share

TOPOLOGY, CANONICAL = "topology", "canonical"
ORDERS = (TOPOLOGY, CANONICAL)
"""The values of ``order=``: the epoch laid out over the slots that read it, or over ``canonical_slots``."""

DEFAULT_CANONICAL_SLOTS = 64


def canonical_slot(index: int, slots: int) -> Slot:
    """Canonical slot ``index`` of ``slots``: rank ``index`` of ``slots`` ranks without workers (its seeds, its state)."""
    return Slot(index, slots, 0, 0)


def canonical_grid(slots: int) -> SlotGrid:
    """The grid the canonical slots are laid out on."""
    return SlotGrid(slots, 0)


@dataclass(frozen=True)
class Canonical:
    """The canonical order of a dataset: ``slots`` canonical slots, each giving ``chunk`` rows to a global batch."""

    slots: int
    chunk: int

    def physical_range(self, slot: Slot) -> range:
        """The canonical slots a (rank, worker) slot reads (contiguous, in order)."""
        per = self.slots // slot.num_slots
        return range(slot.index * per, (slot.index + 1) * per)

    def state_options(self) -> dict[str, int | str]:
        return {"order": CANONICAL, "canonical_slots": self.slots}


def check_canonical(slots: int, batch_size: int, world_size: int) -> Canonical:
    """The canonical order of ``slots`` slots for ranks of ``batch_size`` rows; ``InvalidArgumentError`` naming what
    to change when the global batch is not a whole number of rows per canonical slot, or the ranks do not divide
    the slots."""
    if slots % world_size:
        raise InvalidArgumentError(
            f"order='canonical': world_size={world_size} does not divide canonical_slots={slots}; each rank reads "
            f"whole canonical slots. Run on {divisors(slots)} ranks, or choose canonical_slots as a multiple of "
            f"{world_size}")
    global_batch = batch_size * world_size
    if global_batch % slots:
        raise InvalidArgumentError(
            f"order='canonical': the global batch (batch_size={batch_size} x world_size={world_size} = "
            f"{global_batch} rows) is not a multiple of canonical_slots={slots}, so canonical slots cannot each give "
            f"it the same rows; choose batch_size so that batch_size x world_size is a multiple of {slots}")
    return Canonical(slots, global_batch // slots)


def check_workers(canonical: Canonical, world_size: int, num_workers: int) -> None:
    """Refuse (``InvalidArgumentError``) workers per rank that do not divide the canonical slots of a rank."""
    per_rank = canonical.slots // world_size
    workers = max(num_workers, 1)
    if per_rank % workers:
        allowed = [d for d in divisors(per_rank)]
        raise InvalidArgumentError(
            f"order='canonical': world_size x num_workers = {world_size} x {num_workers} does not divide "
            f"canonical_slots={canonical.slots}; each worker reads whole canonical slots. With world_size="
            f"{world_size}, num_workers may be 0 or one of {allowed}")


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, in order."""
    return [d for d in range(1, n + 1) if n % d == 0]


def canonical_shares(splits: SplitTable, slots: int, *, shuffle: bool, seed: int, epoch: int) -> list[Share]:
    """The splits in ``epoch``'s order as one sequence of rows, cut into ``slots`` contiguous stretches of equal rows
    (within one): each canonical slot's share. A split across a cut is read in parts (its unit by both slots:
    at most one unit read twice per canonical slot and epoch).

    Example:
        >>> from arrowstream._core.plan_types import Split
        >>> table = SplitTable.from_splits([Split(0, 0, 1, 0, 5, 50), Split(1, 0, 1, 0, 3, 30)])
        >>> [[(s.file_index, s.row_start, s.num_rows) for s in share.splits]
        ...  for share in canonical_shares(table, 3, shuffle=False, seed=0, epoch=0)]
        [[(0, 0, 2)], [(0, 2, 3)], [(1, 0, 3)]]
    """
    ordered = splits.take(epoch_order(len(splits), shuffle=shuffle, seed=seed, epoch=epoch))
    ordered = ordered.take(np.flatnonzero(ordered.num_rows > 0))
    rows = ordered.num_rows
    ends = np.cumsum(rows)
    starts = ends - rows
    total = int(ends[-1]) if len(ends) else 0
    shares = []
    for j in range(slots):
        lo, hi = total * j // slots, total * (j + 1) // slots
        if hi <= lo:
            shares.append(Share((), ordered.take(np.empty(0, np.int64))))
            continue
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(starts, hi, side="left"))
        columns = [np.array(column[first:last]) for column in ordered.columns()]
        _, _, _, row_start, num_rows, num_bytes = columns
        cut_before = lo - int(starts[first])
        keep_last = hi - int(starts[last - 1])
        whole = num_rows.copy()
        num_rows[-1] = keep_last   # the last split's rows up to the cut (before the first's are moved)
        row_start[0] += cut_before
        num_rows[0] -= cut_before
        num_bytes[:] = num_bytes * num_rows // np.maximum(whole, 1)
        shares.append(Share((), SplitTable(*columns)))
    return shares
