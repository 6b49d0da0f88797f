"""Epoch order and slot assignment: pure functions of (plan, seed, epoch, topology), no I/O.

A *slot* is one (rank, worker) pair: ``slot_index = rank * workers_per_rank + worker_id``.
Every split of an epoch goes to exactly one slot.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .hashing import derive_seed, permutation

_ORDER_DOMAIN = 0x5350_4C49  # "SPLI": keeps split-order seeds apart from other uses of the seed


@dataclass(frozen=True)
class SlotGrid:
    """The (rank, worker) slots of a topology: ``world_size`` ranks of ``num_workers`` workers each.

    ``num_workers=0`` (the trainer's process reads) is one slot per rank. Slots are numbered rank
    by rank: ``index = rank * workers_per_rank + worker_id``.

    Example:
        >>> grid = SlotGrid(world_size=2, num_workers=0)
        >>> grid.num_slots, grid.slot_at(1)
        (2, Slot(rank=1, world_size=2, worker_id=0, num_workers=0))
    """

    world_size: int
    num_workers: int

    @property
    def workers_per_rank(self) -> int:
        """Readers per rank: the workers, or the rank's own process with none."""
        return max(self.num_workers, 1)

    @property
    def num_slots(self) -> int:
        return self.world_size * self.workers_per_rank

    def slot(self, rank: int, worker_id: int) -> Slot:
        return Slot(rank, self.world_size, worker_id, self.num_workers)

    def slot_at(self, index: int) -> Slot:
        """The slot numbered ``index`` (rank by rank)."""
        rank, worker_id = divmod(index, self.workers_per_rank)
        return self.slot(rank, worker_id)

    def rank_slots(self, rank: int) -> list[Slot]:
        """The slots of ``rank``, worker by worker."""
        return [self.slot(rank, worker_id) for worker_id in range(self.workers_per_rank)]

    def rank_range(self, rank: int) -> slice:
        """Where ``rank``'s slots stand in a list of every slot."""
        return slice(rank * self.workers_per_rank, (rank + 1) * self.workers_per_rank)


@dataclass(frozen=True)
class Slot:
    """One reader of the data: a worker of a rank."""

    rank: int
    world_size: int
    worker_id: int
    num_workers: int

    @property
    def grid(self) -> SlotGrid:
        """The topology this slot is one of."""
        return SlotGrid(self.world_size, self.num_workers)

    @property
    def workers_per_rank(self) -> int:
        return self.grid.workers_per_rank

    @property
    def num_slots(self) -> int:
        return self.grid.num_slots

    @property
    def index(self) -> int:
        return self.rank * self.workers_per_rank + self.worker_id


def epoch_order(num_splits: int, *, shuffle: bool, seed: int, epoch: int) -> npt.NDArray[np.int64]:
    """The order of splits in an epoch: natural without shuffle, else a seeded permutation."""
    if not shuffle:
        return np.arange(num_splits, dtype=np.int64)
    return permutation(num_splits, derive_seed(_ORDER_DOMAIN, seed, epoch))


def cut_evenly(sizes: Sequence[int], num_slots: int) -> Iterator[tuple[int, int, int, int]]:
    """Items of ``sizes`` rows, one after another, cut into ``num_slots`` contiguous stretches of equal rows
    (within one): ``(item, slot, lo, hi)`` for each non-empty piece, rows ``[lo, hi)`` of the item going to
    ``slot``, in item order. How a re-planned epoch hands the rows left to the new slots."""
    total = sum(sizes)
    bounds = [total * j // num_slots for j in range(num_slots + 1)]
    slot, start = 0, 0
    for item, size in enumerate(sizes):
        end = start + size
        while slot < num_slots and bounds[slot + 1] <= start:
            slot += 1
        place = slot
        while place < num_slots and bounds[place] < end:
            lo, hi = max(bounds[place], start) - start, min(bounds[place + 1], end) - start
            if hi > lo:
                yield item, place, lo, hi
            place += 1
        start = end


def assign_lpt(weights: Sequence[int] | npt.NDArray[np.int64], num_slots: int) -> list[list[int]]:
    """Longest-processing-time assignment of items (in their given order) to slots.

    Items are taken heaviest first (ties keep the given order) and each goes to the slot
    with the least load (ties to the lowest slot). Each slot's items come back in the given
    order, so the epoch order survives inside a slot. Deterministic and pure.
    """
    w = np.asarray(weights, dtype=np.int64)
    by_weight = np.argsort(-w, kind="stable")
    heap = [(0, slot) for slot in range(num_slots)]
    owned: list[list[int]] = [[] for _ in range(num_slots)]
    for position in by_weight.tolist():
        load, slot = heapq.heappop(heap)
        owned[slot].append(position)
        heapq.heappush(heap, (load + int(w[position]), slot))
    for items in owned:
        items.sort()
    return owned


def assigned_split_ids(split_rows: Sequence[int] | npt.NDArray[np.int64], num_slots: int, *, shuffle: bool,
                       seed: int, epoch: int,
                       assign: Callable[[Sequence[int], int], list[list[int]]] = assign_lpt) -> list[npt.NDArray[np.int64]]:
    """The split ids (indices into the plan) each of ``num_slots`` slots reads in ``epoch``, in reading order:
    the epoch's order given out by the policy ``assign`` (items' weights, in order -> each slot's item
    indices, in order). What an epoch's layout gives each slot, and what a re-plan finds an old slot read."""
    rows = np.asarray(split_rows, dtype=np.int64)
    order = epoch_order(len(rows), shuffle=shuffle, seed=seed, epoch=epoch)
    return [order[np.asarray(owned, dtype=np.int64)] for owned in assign(rows[order].tolist(), num_slots)]


def slot_split_ids(split_rows: Sequence[int] | npt.NDArray[np.int64], slot: Slot, *,
                   shuffle: bool, seed: int, epoch: int) -> list[int]:
    """The split ids (indices into the plan) that ``slot`` reads in ``epoch`` by longest processing time, in
    reading order (see :func:`assigned_split_ids`)."""
    ids = assigned_split_ids(split_rows, slot.num_slots, shuffle=shuffle, seed=seed, epoch=epoch)
    return [int(i) for i in ids[slot.index]]


def slot_row_counts(split_rows: Sequence[int] | npt.NDArray[np.int64], num_slots: int) -> list[int]:
    """Rows per slot; the same in every epoch, because LPT loads do not depend on tie order."""
    rows = np.asarray(split_rows, dtype=np.int64)
    return [int(rows[items].sum()) for items in assign_lpt(rows, num_slots)]


_WINDOW_DOMAIN = 0x5749_4E44  # "WIND": seeds of the shuffle buffer's windows


def window_seed(seed: int, epoch: int, slot: Slot, window: int) -> int:
    """The seed of shuffle window ``window`` of ``slot`` in ``epoch``."""
    return derive_seed(_WINDOW_DOMAIN, seed, epoch, slot.rank, slot.world_size, slot.worker_id, slot.num_workers,
                       window)


def natural_batches(rows: int, batch_size: int, drop_last: bool) -> int:
    """Batches a slot yields from ``rows`` rows: full ones, and a short last one unless ``drop_last``."""
    return rows // batch_size if drop_last else -(-rows // batch_size)


def even_batch_limits(slot_rows: Sequence[int], world_size: int, batch_size: int, drop_last: bool) -> list[int]:
    """Batches each slot may yield so that every rank yields the same number (``even_batches``).

    ``slot_rows`` lists the rows of every slot, rank by rank. Each rank keeps as many batches as
    the poorest rank has; a richer rank gives up its surplus one batch at a time from the worker
    with the most batches left (ties: the highest worker), so its workers stay balanced and
    the batches given up are the last ones of their workers. A worker whose count is cut yields
    only full batches. Pure: the limits follow from row counts alone.
    """
    per_rank = len(slot_rows) // world_size
    natural = [natural_batches(r, batch_size, drop_last) for r in slot_rows]
    target = min(sum(natural[r * per_rank:(r + 1) * per_rank]) for r in range(world_size))
    limits = list(natural)
    for rank in range(world_size):
        heap = [(-natural[i], -i) for i in range(rank * per_rank, (rank + 1) * per_rank)]
        heapq.heapify(heap)
        for _ in range(sum(natural[rank * per_rank:(rank + 1) * per_rank]) - target):
            count, neg_slot = heapq.heappop(heap)
            limits[-neg_slot] -= 1
            heapq.heappush(heap, (count + 1, neg_slot))
    return limits


def rows_yielded(rows: int, limit: int, batch_size: int, drop_last: bool) -> int:
    """Rows a slot of ``rows`` rows yields when it stops after ``limit`` batches."""
    if limit < natural_batches(rows, batch_size, drop_last):
        return limit * batch_size
    return rows - rows % batch_size if drop_last else rows
