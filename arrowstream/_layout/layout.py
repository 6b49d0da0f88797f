"""The epoch layout: what every (rank, worker) slot reads in an epoch, and how many batches it may yield.

A pure function of (plan, topology, options, epoch) and, for an epoch re-planned from a checkpoint
of another topology, its :class:`~arrowstream._state.worker.Leftovers`. A normal epoch is a layout with
nothing replayed: each slot's share is the splits an *assignment policy* gives it, in the epoch's
order (shuffled or not); a re-planned one is the rows the old workers had not handed out, as
replays and ranges (see :mod:`arrowstream._layout.elastic`), given out by the same policy. Either way
``even_batches`` caps each slot's batches from the rows of the shares alone.

An assignment policy is a function ``(weights, num_slots) -> items of each slot`` that is
deterministic and keeps each slot's items in their given order: :func:`~arrowstream._core.order.assign_lpt`
(longest processing time on rows) today. A new policy is a new function handed to
:class:`Layouts`, not a branch in the dataset. :class:`Epochs` is what a dataset asks of its
plan's epochs: layouts, what a slot reads of an epoch (:meth:`Epochs.slot_epoch`, the question a mixture's
epochs answer too: ``arrowstream._mixing.slot_epoch``), where a slot starts and ends, what it has left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._core.cursor import Cursor
from .._core.order import (
    Slot,
    SlotGrid,
    assign_lpt,
    assigned_split_ids,
    even_batch_limits,
    natural_batches,
    rows_yielded,
)
from .._core.plan_types import split_rows
from .._state.worker import Leftovers, WorkerState
from ..errors import StateMismatchError, UnknownLengthError
from .canonical import canonical_shares
from .elastic import Share, replanned_shares
from .share_parts import dataset_start, share_epoch
from .trims import slot_trim

if TYPE_CHECKING:
    from .._core.plan_types import OrderOptions, PlanView, Split
    from .._mixing.slot_epoch import SlotEpoch
    from .._state.identity import DataIdentity
    from .._state.one_source import DatasetStart

Assignment = Callable[[Sequence[int], int], list[list[int]]]
"""A policy: items (their weights, in order) over ``num_slots`` slots, each slot's item indices in order."""

_KEPT = 8  # layouts kept per dataset: an epoch or two of a few topologies (checks of other ranks' states)


@dataclass(frozen=True)
class EpochLayout:
    """Every slot's share of one epoch under one topology, and its batch limit under ``even_batches``."""

    epoch: int
    grid: SlotGrid
    shares: tuple[Share, ...]
    limits: tuple[int, ...] | None
    leftovers: Leftovers | None = None  # the checkpoint this epoch was re-planned from; None: planned here

    @property
    def replanned(self) -> bool:
        """Whether the epoch is the rest of one of another topology (its shares are not the plan's splits)."""
        return self.leftovers is not None

    def share(self, slot: Slot) -> Share:
        return self.shares[slot.index]

    def limit(self, slot: Slot) -> int | None:
        return None if self.limits is None else self.limits[slot.index]

    def yields(self, rank: int, batch_size: int, drop_last: bool) -> list[tuple[int, int, int]]:
        """Per worker of ``rank``: its rows, the batches it yields and the rows it yields."""
        mine = self.grid.rank_range(rank)
        return slot_yields([share.num_rows for share in self.shares[mine]],
                           None if self.limits is None else list(self.limits[mine]), batch_size, drop_last)


def slot_yields(rows: Sequence[int], limits: Sequence[int] | None, batch_size: int,
                drop_last: bool) -> list[tuple[int, int, int]]:
    """(rows, batches it yields, rows it yields) of slots of ``rows`` rows under ``limits`` (None: no limit)."""
    out = []
    for index, r in enumerate(rows):
        limit = natural_batches(r, batch_size, drop_last) if limits is None else limits[index]
        out.append((r, limit, rows_yielded(r, limit, batch_size, drop_last)))
    return out


def lay_out_epoch(plan: PlanView, grid: SlotGrid, epoch: int, options: OrderOptions, *, even_batches: bool,
                  leftovers: Leftovers | None = None,
                  assign: Assignment = assign_lpt, even_cut: bool = False) -> EpochLayout:
    """The layout of ``epoch`` for ``grid``: the plan's splits in the epoch's order given out by
    ``assign``, or, with ``leftovers``, the rest of that epoch of another topology, re-planned. ``even_cut``: the
    splits in the epoch's order cut into equal stretches of rows instead, one per slot (the canonical slots of
    ``order="canonical"``, :mod:`arrowstream._layout.canonical`)."""
    if leftovers is None and even_cut:
        shares = tuple(canonical_shares(plan.splits_for(1, options.planning), grid.num_slots,
                                        shuffle=options.shuffle, seed=options.seed, epoch=epoch))
    elif leftovers is None:
        splits = plan.splits_for(grid.num_slots, options.planning)
        shares = tuple(Share((), splits.take(owned))   # columns, no Split objects
                       for owned in assigned_split_ids(splits.num_rows, grid.num_slots, shuffle=options.shuffle,
                                                       seed=options.seed, epoch=epoch, assign=assign))
    else:   # the old slots' splits found by the same policy: the rows they had left
        shares = tuple(replanned_shares(
            plan, leftovers, grid.num_slots, shuffle=options.shuffle, seed=options.seed,
            batch_size=options.batch_size, interleave=options.interleave, buffer_rows=options.shuffle_buffer_size,
            planning=options.planning, assign=assign))
    limits = None
    if even_batches:
        limits = tuple(even_batch_limits([share.num_rows for share in shares], grid.world_size,
                                         options.batch_size, options.drop_last))
    return EpochLayout(epoch, grid, shares, limits, leftovers)


def replanned_leftovers(old: EpochLayout, saved: Sequence[tuple[WorkerState, bool]], interleave: int,
                     drops_rows: bool) -> Leftovers:
    """The rest of ``old.epoch`` as the states of every old slot (in slot order, each with whether its
    loader had finished the epoch) left it: what an epoch re-planned for another topology starts from. When
    ``old`` is itself re-planned, its leftovers are the new one's ``before``."""
    epoch = old.epoch
    cursors: list[Cursor | None] = []
    for index, (state, finished) in enumerate(saved):
        if state.epoch < epoch:  # it had not started the epoch: all of its share is left
            cursors.append(Cursor.start(len(old.shares[index].splits), interleave))
        elif finished or state.epoch_complete or (old.limits is not None and state.batches >= old.limits[index]):
            cursors.append(None)
        else:
            cursors.append(state.cursor)
    inside_windows = [i for i, c in enumerate(cursors) if c is not None and c.window_offset]
    if inside_windows and drops_rows:
        rank, worker = divmod(inside_windows[0], old.grid.workers_per_rank)
        raise StateMismatchError(
            f"elastic resume: the checkpoint's rank {rank} worker {worker} stood inside a shuffle window, and "
            "with a filter the rows of a window are unknown before reading, so they cannot be re-planned; "
            f"resume with world_size={old.grid.world_size}, num_workers={old.grid.num_workers} until the epoch "
            "ends, then change")
    return Leftovers(epoch, old.grid.world_size, old.grid.num_workers, tuple(cursors), before=old.leftovers)


class Layouts:
    """The layouts of one plan under one set of options, each computed once (the last few kept).

    ``even_batches`` is the dataset's; a layout for a checkpoint of another topology may ask for
    the checkpoint's own.
    """

    def __init__(self, plan: PlanView, options: OrderOptions, even_batches: bool,
                 assign: Assignment = assign_lpt, even_cut: bool = False) -> None:
        self._plan, self._options, self._even_batches, self._assign = plan, options, even_batches, assign
        self._even_cut = even_cut
        self._kept: dict[tuple[Any, ...], EpochLayout] = {}

    def layout(self, epoch: int, grid: SlotGrid, leftovers: Leftovers | None = None,
               even_batches: bool | None = None) -> EpochLayout:
        """The layout of ``epoch`` for ``grid`` (re-planned from ``leftovers`` when given)."""
        even = self._even_batches if even_batches is None else even_batches
        key = (epoch, grid, leftovers, even)
        layout = self._kept.get(key)
        if layout is None:
            if len(self._kept) >= _KEPT:
                del self._kept[next(iter(self._kept))]
            layout = self._kept[key] = lay_out_epoch(self._plan, grid, epoch, self._options, even_batches=even,
                                                     leftovers=leftovers, assign=self._assign,
                                                     even_cut=self._even_cut)
        return layout

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_kept"] = {}  # recomputed where needed: workers lay out only their own epochs
        return state


class Epochs:
    """The epochs of one plan as one dataset reads them: its :class:`Layouts`, the data identity and
    options its worker states carry, and ``elastic``: the epoch re-planned from a loaded checkpoint of
    another topology, if any, which that epoch is laid out from. ``assign``: how items go to slots (the
    dataset's assignment policy's), in a planned epoch and in one re-planned on another topology alike."""

    def __init__(self, plan: PlanView, options: OrderOptions, even_batches: bool, data: DataIdentity,
                 state_options: dict[str, Any], elastic: Leftovers | None = None,
                 assign: Assignment = assign_lpt, even_cut: bool = False) -> None:
        self.plan, self.options, self.data, self.state_options = plan, options, data, state_options
        self.layouts = Layouts(plan, options, even_batches, assign, even_cut)
        self.elastic = elastic

    def layout(self, epoch: int, grid: SlotGrid, leftovers: Leftovers | None = None) -> EpochLayout:
        """The layout of ``epoch`` for ``grid``: re-planned from ``leftovers`` (by default ``elastic``, when
        it is of that epoch), else the plan's for this topology."""
        if leftovers is None and self.elastic is not None and self.elastic.epoch == epoch:
            leftovers = self.elastic
        return self.layouts.layout(epoch, grid, leftovers)

    def slot_epoch(self, slot: Slot, epoch: int, *, state: WorkerState | None = None) -> SlotEpoch:
        """What ``slot`` reads in ``epoch`` (the one epoch-layout question, ``arrowstream._mixing.slot_epoch``): its
        share of the epoch's layout as one source (``arrowstream._layout.share_parts``), with its ``even_batches``
        limit. The layout is :meth:`layout`'s, or with ``state`` (a worker state of the slot in that epoch) the one
        the state was taken in: re-planned from its own leftovers, or planned."""
        if state is None:
            layout = self.layout(epoch, slot.grid)
        else:
            layout = self.layouts.layout(epoch, slot.grid, state.elastic)
        return share_epoch(layout.share(slot), seed=self.options.seed, epoch=epoch, slot=slot,
                           max_batches=layout.limit(slot), rows_known=not self.options.drops_rows,
                           replanned=layout.replanned)

    def stream_start(self, state: WorkerState) -> DatasetStart:
        """Worker state ``state`` as the start of its slot's stream (:meth:`slot_epoch` answered with ``state``)."""
        layout = self.layouts.layout(state.epoch, state.slot.grid, state.elastic)
        return dataset_start(layout.share(state.slot), state, self.options.interleave)

    def start(self, slot: Slot, epoch: int) -> WorkerState:
        """The state of ``slot`` before the first batch of ``epoch``."""
        layout = self.layout(epoch, slot.grid)
        cursor = Cursor.start(len(layout.share(slot).splits), self.options.interleave)
        return WorkerState(self.data, self.state_options, epoch, slot, cursor, 0, 0, 0, False, layout.leftovers)

    def end_cursor(self, state: WorkerState) -> Cursor:
        """Past the last row of the epoch of a worker state (its share, when re-planned)."""
        share = self.layouts.layout(state.epoch, state.slot.grid, state.elastic).share(state.slot)
        return Cursor((), len(share.splits), replay_index=len(share.replays))

    def batches_left(self, state: WorkerState, slot: Slot) -> int | None:
        """See :func:`batches_left`: in the layout the state was taken in."""
        return batches_left(self.layouts.layout(state.epoch, slot.grid, state.elastic), state, slot, self.options)

    def planned_splits(self, slot: Slot, epoch: int) -> Sequence[Split]:
        """The splits ``slot`` reads in ``epoch`` as planned for its topology, in reading order."""
        return self.layouts.layout(epoch, slot.grid).share(slot).splits

    def files_between(self, slot: Slot, epoch: int, start: Cursor, end: Cursor) -> list[str]:
        """The files of the splits ``slot`` read from cursor ``start`` to ``end`` (for error messages)."""
        layout = self.layout(epoch, slot.grid)
        if layout.replanned:
            return [f"the files of worker slot {slot.index} (re-planned epoch {layout.epoch})"]
        splits = layout.share(slot).splits
        first = min([index for index, _ in start.lanes] + [start.next_split_index])
        last = min(max(end.next_split_index, first + 1), len(splits))
        return [self.plan.url(index) for index in sorted({splits[i].file_index for i in range(first, last)})]


# -- facts from the plan: what StructuredDataset.num_batches, rows_trimmed_per_epoch ... answer -----------------


def check_known(options: OrderOptions, what: str) -> None:
    """Refuse (:class:`UnknownLengthError`, a ``TypeError``) a count that a filter (or ``bad_rows='skip'``) leaves
    unknown before reading."""
    if options.drops_rows:
        raise UnknownLengthError(
            f"the {what} unknown before reading: the filter (or bad_rows='skip') decides how many rows each worker "
            "yields. Iterate without it (`for batch in loader`); where a schedule needs the count, take it from an "
            "epoch read (its batches) and allow for the next one to differ by what the filter keeps")


def rows_dropped(yields: Sequence[tuple[int, int, int]], options: OrderOptions) -> int:
    """Rows ``drop_last`` drops from slots of ``yields`` (rows, batches, rows yielded): each short last batch."""
    if not options.drop_last:
        return 0
    check_known(options, "rows drop_last drops are")
    size = options.batch_size
    return sum(r % size for r, limit, _ in yields if limit == r // size)


def rows_trimmed(yields: Sequence[tuple[int, int, int]], options: OrderOptions, even_batches: bool) -> int:
    """Rows ``even_batches`` leaves out of slots of ``yields``: the last rows of those with the most batches."""
    return slot_trim(yields, options.batch_size, options.drop_last).rows if even_batches else 0


def batches_left(layout: EpochLayout, state: WorkerState, slot: Slot, options: OrderOptions) -> int | None:
    """Batches a worker state of ``slot`` has still to hand out in the epoch of ``layout``; ``None`` when
    a filter (or ``bad_rows='skip'``) decides, which only reading tells."""
    if state.epoch_complete:
        return 0
    share, limit = layout.share(slot), layout.limit(slot)
    at_end = (state.cursor.replay_index >= len(share.replays)
              and state.cursor.at_end(split_rows(share.splits).tolist()))
    allowed = None if limit is None else max(limit - state.batches, 0)
    if at_end or allowed == 0:
        return 0
    if options.drops_rows:
        return None
    left = natural_batches(share.num_rows - state.rows - state.rows_dropped, options.batch_size, options.drop_last)
    return left if allowed is None else min(left, allowed)
