"""A dynamic worker's side of its leases (see :mod:`arrowstream._layout.leases` for the model): what it
holds, how it reads it, and what it has left at a checkpoint, the *ledger*.

**A worker's rows.** :class:`LeasedShare` is what a worker took, in order, expanded into its replays and
splits; :mod:`arrowstream._layout.leased_parts` reads it with the one stream: the replays as they are, then the
splits through the usual pipeline (interleave, shuffle windows seeded by its slot), so its cursor reads as a static
worker's does.

**The ledger.** Which worker took which lease (the pool's table) and each worker's cursor after the
last batch the trainer received (a piece counts when its stitched batch is handed out) say exactly
which rows were handed out: :func:`remaining_work` is the rest, as a new
:class:`~arrowstream._layout.leases.Work` (replays of windows a worker stood in, the rest of the splits it
had open, every lease not handed out, and the fresh splits from the first lease nobody took). A worker's
rest is the re-plan core's (:func:`~arrowstream._layout.replan.window_left` and
:func:`~arrowstream._layout.replan.ranges_left`), with its replay cut to the splits its window reads
(:func:`window_replay`). It is expressed in splits of the plan, never in leases, so a resume lays out
leases anew for any number of workers, and a checkpoint of a resumed epoch is again a ``Work`` (no chain
of checkpoints).

**A rank's work.** A fresh epoch's is the rank's share of the static assignment across ranks
(:func:`fresh_work`); one re-planned for another world size is a stretch of every old rank's rest, old rank
after old rank, cut as a static re-plan cuts its items (:func:`replanned_work`, on
:func:`~arrowstream._layout.replan.cut_items`).

Pure: no I/O, no torch (``tests/test_layers.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .._core.cursor import Cursor
from .._core.interleave import block_size_for
from .._core.order import Slot, SlotGrid, even_batch_limits, natural_batches, rows_yielded
from .._core.plan_types import Split, split_rows
from .layout import lay_out_epoch
from .leases import LeasedItems, Leases, PoolLeases, Work
from .replan import (
    Replay,
    cut_items,
    item_part,
    item_rows,
    ranges_left,
    replay_part,
    split_part,
    split_rest,
    window_left,
)

if TYPE_CHECKING:
    from .._core.plan_types import OrderOptions, PlanView


# -- a worker's rows -----------------------------------------------------------------------------


class LeasedShare:
    """One worker's side of the leases: what it took, in order, expanded into its replays and splits.

    ``take`` asks the pool for the next lease (``None`` when none is left). Replays come before splits in
    the virtual stream, so a worker's replays all come before its splits; :meth:`replay` and
    :meth:`split` lease as far as needed to answer.
    """

    def __init__(self, leases: Leases | PoolLeases, take: Callable[[], int | None]) -> None:
        self._leases = leases
        self._take = take
        self.taken: list[int] = []
        self.replays: list[Replay[Slot]] = []
        self.splits: list[Split] = []
        self._dry = False

    def _lease(self) -> bool:
        if self._dry:
            return False
        lease = self._take()
        if lease is None:
            self._dry = True
            return False
        self.taken.append(lease)
        items = self._leases.items(lease)
        self.replays.extend(items.replays)
        self.splits.extend(items.splits)
        return True

    def replay(self, index: int) -> Replay[Slot] | None:
        """This worker's replay ``index``, leasing until it has it; None once its leases hold splits."""
        while len(self.replays) <= index and not self.splits:
            if not self._lease():
                break
        return self.replays[index] if index < len(self.replays) else None

    def has_split(self, index: int) -> bool:
        """Whether this worker has a split ``index`` (in its reading order), leasing until it has."""
        while len(self.splits) <= index:
            if not self._lease():
                return False
        return True


class LeasedSplits(Sequence[Split]):
    """A worker's splits as :func:`~arrowstream._core.interleave.interleave_runs` reads them: the ones leased
    so far; ``lease_through(i)`` leases until split ``i`` exists (False once the pool is dry)."""

    def __init__(self, share: LeasedShare) -> None:
        self._share = share

    def __len__(self) -> int:
        return len(self._share.splits)

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        return self._share.splits[index]

    def lease_through(self, index: int) -> bool:
        return self._share.has_split(index)

    def __iter__(self) -> Iterator[Split]:
        return iter(self._share.splits)


def start_cursor(interleave: int) -> Cursor:
    """Where a dynamic worker starts: its first replay, or its first ``interleave`` splits once it has some."""
    return Cursor.start(interleave, interleave)


# -- the ledger: what is left ----------------------------------------------------------------------


def _rebased(cursor: Cursor, first: int) -> Cursor:
    """``cursor`` over a worker's splits from split ``first`` on."""
    return dataclasses.replace(cursor, lanes=tuple((index - first, offset) for index, offset in cursor.lanes),
                               next_split_index=cursor.next_split_index - first)


def window_replay(replay: Replay[Slot], end: Cursor) -> Replay[Slot]:
    """``replay`` (the rest of the window a worker stood in, over all its splits) over the splits that window
    reads alone, from the first its cursor still reads to the one the window ends in (``end``: the stream
    cursor past the window), with its cursor counted from there: what a ledger saves."""
    start = replay.start
    first = min([index for index, _ in start.lanes] + [start.next_split_index])
    last = min(end.next_split_index, len(replay.splits))
    return Replay(replay.slot, replay.splits[first:last], _rebased(start, first), replay.rows)


def worker_rest(slot: Slot, share: LeasedItems, cursor: Cursor, *, batch_size: int, interleave: int,
                buffer_rows: int) -> tuple[list[Replay[Slot]], list[Split]]:
    """The rows of a worker's leased ``share`` (its replays and splits, in order) not handed out at
    ``cursor`` (its position after the last batch the trainer received): while it replays, the rest of its
    replays and every split; else what the re-plan core leaves of its splits (the rest of its window, as
    :func:`window_replay`, then its ranges)."""
    if cursor.replay_index < len(share.replays):   # still replaying: the rest of that replay, the others, every split
        current = share.replays[cursor.replay_index]
        replays = [replay_part(current, cursor.replay_offset, current.rows), *share.replays[cursor.replay_index + 1:]]
        return replays, list(share.splits)
    window, end = window_left(share.splits, cursor, slot, block_size=block_size_for(batch_size, interleave),
                              lanes=interleave, buffer_rows=buffer_rows)
    return ([] if window is None else [window_replay(window, end)]), ranges_left(share.splits, end)


def remaining_work(leases: Leases, owners: npt.NDArray[np.int64], cursors: Sequence[Cursor | None],
                   slots: Sequence[Slot], *, batch_size: int, interleave: int, buffer_rows: int) -> Work:
    """The rows of ``leases.work`` not handed out, as a new :class:`~arrowstream._layout.leases.Work`.

    ``owners[i]`` is the worker that took lease ``i`` (-1: none; leases are taken in order); ``cursors[w]`` is worker ``w``'s cursor
    after the last batch of it the trainer received (None: it handed out everything it leased; a
    worker's cursor reads over its leases' splits in the order it took them).
    """
    work = leases.work
    replays: list[Replay[Slot]] = []
    splits: list[Split] = []
    taken = np.flatnonzero(owners >= 0)
    for worker, cursor in enumerate(cursors):
        mine = np.flatnonzero(owners == worker)
        if cursor is None or not len(mine):
            continue
        # the worker's leases from the one holding the first split its cursor still reads: a checkpoint
        # expands a few leases per worker, not every lease it took this epoch
        split_counts, replay_counts = leases.counts(mine)
        before = np.concatenate([[0], np.cumsum(split_counts)])
        first_split = min([index for index, _ in cursor.lanes] + [cursor.next_split_index])
        reading_splits = cursor.replay_index >= int(replay_counts.sum())
        skip = max(int(np.searchsorted(before, first_split, side="right")) - 1, 0) if reading_splits else 0
        share = [leases.items(int(lease)) for lease in mine[skip:]]
        leased = LeasedItems(tuple(r for s in share for r in s.replays), tuple(p for s in share for p in s.splits))
        rebased = _rebased(cursor, int(before[skip])) if skip else cursor
        rest_replays, rest_splits = worker_rest(slots[worker], leased, rebased, batch_size=batch_size,
                                                interleave=interleave, buffer_rows=buffer_rows)
        replays += rest_replays
        splits += rest_splits
    # the pool hands leases out in order: those before `high` were all taken, the rest by nobody
    high = int(taken.max()) + 1 if len(taken) else 0
    # from lease `high` on: the rest of the virtual stream, explicit where it is not fresh
    start = int(leases.bounds[high]) if high < len(leases) else int(leases.bounds[-1])
    head_rows = sum(r.rows for r in work.replays) + sum(s.num_rows for s in work.splits)
    if start < head_rows:
        offset = start
        for replay in work.replays:
            if offset < replay.rows:
                replays.append(replay_part(replay, offset, replay.rows))
            offset = max(offset - replay.rows, 0)
        for split in work.splits:
            if offset < split.num_rows:
                splits.append(split_part(split, offset, split.num_rows))
            offset = max(offset - split.num_rows, 0)
        fresh_from = work.fresh_from_row
    else:
        fresh_from = work.fresh_from_row + start - head_rows
    return Work(tuple(replays), tuple(splits), work.fresh, fresh_from)


# -- a rank's work of an epoch: fresh, or re-planned from every old rank's rest ---------------------


def truncated(splits: Sequence[Split], rows: int) -> tuple[Split, ...]:
    """The first ``rows`` rows of ``splits`` (the last one cut)."""
    out: list[Split] = []
    left = rows
    for split in splits:
        if left <= 0:
            break
        if split.num_rows > left:
            split = dataclasses.replace(split, num_rows=left, num_bytes=split.num_bytes * left // max(split.num_rows, 1))
        out.append(split)
        left -= split.num_rows
    return tuple(out)


def rank_share(plan: PlanView, world_size: int, rank: int, epoch: int, options: OrderOptions,
               even_batches: bool) -> tuple[Sequence[Split], int]:
    """A rank's splits of ``epoch`` under dynamic assignment (its share of the static assignment across
    ranks, each rank one slot, in the epoch's order) and the rows of them it yields (``even_batches``,
    ``drop_last``)."""
    layout = lay_out_epoch(plan, SlotGrid(world_size, 0), epoch, options, even_batches=even_batches)
    slot = SlotGrid(world_size, 0).slot(rank, 0)
    splits = layout.share(slot).splits
    rows = int(split_rows(splits).sum())
    limit = layout.limit(slot)
    if limit is None:
        limit = natural_batches(rows, options.batch_size, options.drop_last)
    return splits, rows_yielded(rows, limit, options.batch_size, options.drop_last)


def work_of(share: Sequence[Split], kept: int) -> Work:
    """The fresh :class:`~arrowstream._layout.leases.Work` of a rank's ``share`` cut to its first ``kept`` rows."""
    return Work((), (), share if kept == int(split_rows(share).sum()) else truncated(share, kept), 0)


def fresh_work(plan: PlanView, world_size: int, rank: int, epoch: int, options: OrderOptions, even_batches: bool) -> Work:
    """A rank's rows of ``epoch`` under dynamic assignment, cut to the rows it yields (see :func:`rank_share`)."""
    return work_of(*rank_share(plan, world_size, rank, epoch, options, even_batches))


@dataclass(frozen=True)
class Replanned:
    """A dynamic epoch re-planned for another world size: every old rank's rest of ``epoch`` (``rests``, in old rank
    order, each a :class:`~arrowstream._layout.leases.Work` of that rank, checked), taken on ``world_size`` ranks; ``value``: as the ledger
    saves it (the old rests and what they were re-planned from in turn, if they were). ``tails``: each old rank's
    rows of the epoch past those it would have yielded (what its ``even_batches`` trims and ``drop_last`` drops,
    :meth:`~arrowstream._assignment.dynamic_epoch.DynamicEpochs.left_out`), re-planned with its rest while it had
    rows left (empty: a ``replanned`` saved without ``"tails": true``, by a version that left them out unread
    and uncounted, laid out as it was)."""

    epoch: int
    world_size: int
    rests: tuple[Work, ...]
    value: dict[str, Any] = dataclasses.field(compare=False, hash=False)
    tails: tuple[tuple[Replay[Slot] | Split, ...], ...] = ()


def rest_items(work: Work) -> list[Replay[Slot] | Split]:
    """The items of ``work`` in lease order: its replays, its splits, then its fresh splits from ``fresh_from_row``."""
    items: list[Replay[Slot] | Split] = [*work.replays, *(s for s in work.splits if s.num_rows)]
    before = 0
    for split in work.fresh:
        end = before + split.num_rows
        if end > work.fresh_from_row:
            items.append(split_rest(split, max(work.fresh_from_row - before, 0)))
        before = end
    return items


def items_after(items: Sequence[Replay[Slot] | Split], rows: int) -> tuple[Replay[Slot] | Split, ...]:
    """The rows of ``items`` (one sequence) past their first ``rows``, as items (the first one cut)."""
    out: list[Replay[Slot] | Split] = []
    before = 0
    for item in items:
        count = item_rows(item)
        if before + count > rows:
            out.append(item if before >= rows else item_part(item, rows - before, count))
        before += count
    return tuple(out)


def replanned_stretches(rests: Sequence[Work], world_size: int,
                        tails: Sequence[Sequence[Replay[Slot] | Split]] = ()) -> list[list[Replay[Slot] | Split]]:
    """The items of every old rank's rest (``rests``, in old rank order) cut into ``world_size`` stretches of equal
    rows within one, one per new rank (see :func:`replanned_work`). An old rank with rows left adds its ``tails``
    entry after them: the rows its own ``even_batches`` and ``drop_last`` would have left out when it ended, which it
    never did (one that handed out all it yields left them out, and its figures count them)."""
    items = []
    for index, rest in enumerate(rests):
        items += rest_items(rest)
        if tails and rest.num_rows:
            items += tails[index]
    return cut_items(items, world_size, item_rows, item_part)


def replanned_work(rests: Sequence[Work], world_size: int, rank: int, batch_size: int, drop_last: bool,
                   even_batches: bool, tails: Sequence[Sequence[Replay[Slot] | Split]] = ()) -> tuple[Work, int]:
    """A rank's rows of a dynamic epoch re-planned for ``world_size`` ranks from every old rank's rest (``rests``,
    in old rank order), and its rows before ``even_batches`` and ``drop_last`` cut them.

    The rests' items, old rank after old rank, are one sequence of rows cut into ``world_size`` stretches of
    equal rows within one (:func:`~arrowstream._layout.replan.cut_items`), as a static re-plan cuts its items
    (:func:`~arrowstream._layout.elastic.cut_shares`): rank ``rank`` leases its stretch, its replays first (the
    rest of old windows, read again the way the old workers read them), then its splits, as fresh splits of a
    :class:`~arrowstream._layout.leases.Work` (``fresh_from_row`` counts in them). ``even_batches`` then trims
    at most one batch per rank."""
    stretches = replanned_stretches(rests, world_size, tails)
    stretch_rows = [sum(map(item_rows, stretch)) for stretch in stretches]
    replays = [item for item in stretches[rank] if isinstance(item, Replay)]
    splits = [item for item in stretches[rank] if not isinstance(item, Replay)]
    rows = stretch_rows[rank]
    limits = (even_batch_limits(stretch_rows, world_size, batch_size, drop_last) if even_batches
              else [natural_batches(r, batch_size, drop_last) for r in stretch_rows])
    kept = rows_yielded(rows, limits[rank], batch_size, drop_last)
    head = sum(r.rows for r in replays)
    if kept < head:   # (a stretch of replays longer than what the rank yields: the last ones cut)
        cut: list[Replay[Slot]] = []
        for replay in replays:
            take = min(replay.rows, kept - sum(r.rows for r in cut))
            if take > 0:
                cut.append(replay_part(replay, 0, take))
        replays, splits = cut, []
    return Work(tuple(replays), (), truncated(splits, kept - head), 0), rows
