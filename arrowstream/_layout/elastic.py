"""Elastic resume of a dataset: the rest of an epoch, re-planned over another (world_size, num_workers).

From the cursors of every old worker (an :class:`~arrowstream._state.worker.Leftovers`), the rows not yet
handed out are cut into items by :func:`~arrowstream._layout.replan.items_left`, as for each source of a
mixture (:mod:`arrowstream._layout.replan` says how): for each old worker, the rest of the shuffle window
it stood in (a :class:`~arrowstream._layout.replan.Replay` seeded by its slot), then a range for each
open split after that and every split it had not opened. What is the dataset's own: an old worker's
splits are the plan's splits for the old topology (``PlanView.splits_for``) that its slot was given
by the layout's assignment policy
(:func:`~arrowstream._core.order.assigned_split_ids`), and a new slot's :class:`Share` is its replays, then
its ranges.

The items, old worker after old worker, are cut into as many contiguous stretches as there are new
(rank, worker) slots, of equal rows within one (:func:`cut_shares`): so ``even_batches`` trims at most
one batch per new slot, however the rows left were spread. A new worker reads its replays first (the
old window read whole, its part handed out), then its ranges through the usual pipeline (interleave,
shuffle windows of its own). Every row left is read by exactly one new worker, and the plan is a pure
function of the source, so a checkpoint taken in the re-planned epoch resumes exactly with the new
topology.

States of state version 8 and older re-planned by longest processing time
on whole items (:func:`assign_shares`, the :data:`LPT_CUT` cut); a state taken inside such an epoch is
resumed with it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._core.cursor import Cursor, Run
from .._core.interleave import PieceReader, block_size_for
from .._core.order import Slot, SlotGrid, assign_lpt, assigned_split_ids, window_seed
from .._core.plan_types import Split, split_rows
from .._core.stream import open_runs
from .._state.worker import EVEN_CUT, Leftovers
from .replan import Replay, cut_items, item_part, item_rows, items_left, replay_part, split_rest

if TYPE_CHECKING:
    from .._core.plan_types import PlanView


@dataclass(frozen=True)
class Share:
    """What one new slot reads in the re-planned epoch."""

    replays: tuple[Replay[Slot], ...]
    splits: Sequence[Split]   # a tuple, or a SplitTable: a slot's share of a plan's table, in reading order

    @property
    def num_rows(self) -> int:
        return sum(r.rows for r in self.replays) + int(split_rows(self.splits).sum())


def _halve(split: Split) -> tuple[Split, Split]:
    first = split.num_rows // 2
    return (dataclasses.replace(split, num_rows=first, num_bytes=split.num_bytes // 2),
            split_rest(split, first))


def remaining_items(plan: PlanView, leftovers: Leftovers, *, shuffle: bool, seed: int, batch_size: int,
                    interleave: int, buffer_rows: int, planning: int,
                    assign: Callable[[Sequence[int], int], list[list[int]]]) -> list[Replay[Slot] | Split]:
    """Every row of ``leftovers.epoch`` the old workers had not handed out, old worker after old worker:
    what it left of its splits from its cursor (:func:`~arrowstream._layout.replan.items_left`). An old
    worker's splits are those its epoch's layout gave it: the epoch's order given out by ``assign``, the
    layout's own policy (:func:`~arrowstream._core.order.assigned_split_ids`), so the rows re-planned are
    the rows it had left. When the old topology's epoch was itself re-planned (``leftovers.before``), an old
    worker's rows are its share of that re-plan (:func:`replanned_shares`), from its cursor in it
    (:func:`share_items_left`): the chain is pure, however deep.

    A shuffle window's extent follows from row counts, which a filter makes unknown before
    reading: the loader refuses a leftovers with a worker inside a window and a filter.
    """
    grid = SlotGrid(leftovers.world_size, leftovers.num_workers)
    block_size = block_size_for(batch_size, interleave)
    items: list[Replay[Slot] | Split] = []
    if leftovers.before is not None:   # the old topology read a re-planned epoch: its shares of it
        shares = replanned_shares(plan, leftovers.before, grid.num_slots, shuffle=shuffle, seed=seed,
                                  batch_size=batch_size, interleave=interleave, buffer_rows=buffer_rows,
                                  planning=planning, assign=assign)
        for index, cursor in enumerate(leftovers.cursors):
            if cursor is not None:
                items += share_items_left(shares[index], cursor, grid.slot_at(index), block_size=block_size,
                                          lanes=interleave, buffer_rows=buffer_rows)
        return items
    splits = plan.splits_for(grid.num_slots, planning)  # as the old topology read them
    ids = assigned_split_ids(split_rows(splits), grid.num_slots, shuffle=shuffle, seed=seed, epoch=leftovers.epoch,
                             assign=assign)
    for index, cursor in enumerate(leftovers.cursors):
        if cursor is None:
            continue
        slot = grid.slot_at(index)
        mine = [splits[int(i)] for i in ids[slot.index]]
        items += items_left(mine, cursor, slot, block_size=block_size, lanes=interleave, buffer_rows=buffer_rows)
    return items


def replanned_shares(plan: PlanView, leftovers: Leftovers, num_slots: int, *, shuffle: bool, seed: int,
                     batch_size: int, interleave: int, buffer_rows: int, planning: int,
                     assign: Callable[[Sequence[int], int], list[list[int]]]) -> list[Share]:
    """Each of ``num_slots`` new slots' share of the rest of an epoch the old workers left (``leftovers``):
    :func:`remaining_items` cut as ``leftovers.cut`` says (:func:`cut_shares`, or :func:`assign_shares` for the
    ``lpt`` cut of states before version 9)."""
    items = remaining_items(plan, leftovers, shuffle=shuffle, seed=seed, batch_size=batch_size,
                            interleave=interleave, buffer_rows=buffer_rows, planning=planning, assign=assign)
    return cut_shares(items, num_slots) if leftovers.cut == EVEN_CUT else assign_shares(items, num_slots, assign)


def share_items_left(share: Share, cursor: Cursor, slot: Slot, *, block_size: int | None, lanes: int,
                     buffer_rows: int) -> list[Replay[Slot] | Split]:
    """What a worker of a re-planned epoch (``slot``, reading ``share``) left from ``cursor``, in its reading
    order: the rest of the replay it stood in (moved by its offset into it, as :func:`replay_runs` moves it) and
    its later replays, each still seeded by its own old slot; then what it left of its ranges
    (:func:`~arrowstream._layout.replan.items_left`, a window it stood in seeded by ``slot``, as it read them)."""
    items: list[Replay[Slot] | Split] = []
    stream = cursor
    if cursor.replay_index < len(share.replays):
        at = share.replays[cursor.replay_index]
        if cursor.replay_offset < at.rows:
            items.append(replay_part(at, cursor.replay_offset, at.rows))
        items += share.replays[cursor.replay_index + 1:]
        stream = Cursor.start(len(share.splits), lanes)   # its ranges not opened yet
    elif cursor.replay_index or cursor.replay_offset:
        stream = dataclasses.replace(cursor, replay_index=0, replay_offset=0)
    items += items_left(share.splits, stream, slot, block_size=block_size, lanes=lanes, buffer_rows=buffer_rows)
    return items


def cut_shares(items: Sequence[Replay[Slot] | Split], num_slots: int) -> list[Share]:
    """The items as one sequence of rows, cut into ``num_slots`` contiguous stretches of equal rows
    (within one, :func:`~arrowstream._layout.replan.cut_items`): each new slot's share, its replays then its
    ranges. A replay or range across a cut is handed out in parts."""
    shares = []
    for mine in cut_items(items, num_slots, item_rows, item_part):
        shares.append(Share(tuple(item for item in mine if isinstance(item, Replay)),
                            tuple(item for item in mine if not isinstance(item, Replay))))
    return shares


def assign_shares(items: Sequence[Replay[Slot] | Split], num_slots: int,
                  assign: Callable[[Sequence[int], int], list[list[int]]] = assign_lpt) -> list[Share]:
    """The items over ``num_slots`` new slots by ``assign`` on rows, whole (LPT by default: deterministic,
    order kept per slot; ranges halved while there are fewer items than slots): the :data:`LPT_CUT` cut of
    states before version 9, which can leave a new slot far more rows than another."""
    replays = [item for item in items if isinstance(item, Replay)]
    ranges = [item for item in items if not isinstance(item, Replay)]
    while ranges and len(replays) + len(ranges) < num_slots:
        largest = max(range(len(ranges)), key=lambda i: (ranges[i].num_rows, -i))
        if ranges[largest].num_rows < 2:
            break
        ranges[largest:largest + 1] = _halve(ranges[largest])
    weights = [r.rows for r in replays] + [s.num_rows for s in ranges]
    shares = []
    for owned in assign(weights, num_slots):
        shares.append(Share(tuple(replays[i] for i in owned if i < len(replays)),
                            tuple(ranges[i - len(replays)] for i in owned if i >= len(replays))))
    return shares


def _replay_cursor(after_replays: Cursor, index: int, taken: int, rows: int, more: int) -> Cursor:
    """The cursor once ``taken + more`` rows of replay ``index`` (``rows`` rows) are handed out."""
    done = taken + more
    if done >= rows:
        return dataclasses.replace(after_replays, replay_index=index + 1, replay_offset=0)
    return dataclasses.replace(after_replays, replay_index=index, replay_offset=done)


def with_replay_index(run: Run, index: int) -> Run:
    """``run`` with cursors past ``index`` replays (most already are: then as they come, without a copy,
    which costs ~20 us a batch)."""
    def after(rows: int) -> Cursor:
        cursor = run.after(rows)
        if cursor.replay_index == index and cursor.replay_offset == 0:
            return cursor
        return dataclasses.replace(cursor, replay_index=index, replay_offset=0)

    return Run(run.batch, after)


def replay_runs(readers: Sequence[PieceReader], replay: Replay[Slot], index: int, skip: int, after_replays: Cursor, *,
                seed: int, epoch: int, batch_size: int, interleave: int, buffer_rows: int) -> Iterator[Run]:
    """The rows of ``replay`` (a worker's replay ``index``) from its row ``skip`` on, read again the way
    its old worker read them; the cursors are ``after_replays`` with the replay fields set."""
    old_start = dataclasses.replace(replay.start, window_offset=replay.start.window_offset + skip)
    runs = open_runs(readers, replay.splits, batch_size=batch_size, interleave=interleave,
                     buffer_rows=buffer_rows, start=old_start,
                     window_seed=functools.partial(window_seed, seed, epoch, replay.slot))
    taken = skip
    for run in runs:
        if taken >= replay.rows:
            break
        run = run.head(min(run.num_rows, replay.rows - taken))
        yield Run(run.batch, functools.partial(_replay_cursor, after_replays, index, taken, replay.rows))
        taken += run.num_rows
    for reader in readers:
        reader.close()
