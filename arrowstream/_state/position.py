"""A loaded cursor checked against the plan: a position the worker's stream can reach, or a ``StateError``.

:meth:`Cursor.from_dict <arrowstream._core.cursor.Cursor.from_dict>` checks what a cursor says on its
own; here it meets the splits the worker reads in its epoch (or its share of a re-planned one),
``interleave``, the block size and the shuffle buffer. Without a filter the stream is a pure
function of row counts, so the check is exact: the lanes, the turn and the block must be those
the rotation reaches after as many rows as the cursor says were handed out, and the counters must
agree. With a filter, rows it drops are unknown before reading, and only the bounds are checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._core.cursor import Cursor
from .._core.fields import REMEDY
from .._core.interleave import block_size_for
from .._core.order import Slot, SlotGrid
from .._core.plan_types import split_rows as rows_of
from ..errors import StateError
from .worker import Leftovers, WorkerState

if TYPE_CHECKING:
    from .._core.plan_types import OrderOptions
    from .._layout.layout import Epochs


def cursor_at(split_rows: Sequence[int], interleave: int, block_size: int | None, rows: int) -> Cursor:
    """The cursor just past the first ``rows`` rows of an unfiltered stream of splits of ``split_rows``
    rows, read ``interleave`` at a time in blocks of ``block_size`` (``interleave_runs`` in arithmetic,
    whole rotations at a time)."""
    start = Cursor.start(len(split_rows), interleave)
    lanes = [list(lane) for lane in start.lanes]
    next_split, turn, taken, left = start.next_split_index, 0, 0, rows
    block = block_size if block_size is not None else max(sum(split_rows), 1)
    while left > 0 and lanes:
        position, offset = lanes[turn]
        remaining = split_rows[position] - offset
        if remaining <= 0:  # the split is done: open the next one, or leave the rotation
            if next_split < len(split_rows):
                lanes[turn] = [next_split, 0]
                next_split += 1
            else:
                lanes.pop(turn)
                turn, taken = (turn % len(lanes) if lanes else 0), 0
            continue
        if taken == 0 and block_size is not None:
            rounds = min(min(split_rows[p] - o for p, o in lanes) // block, left // (block * len(lanes)))
            if rounds > 0:  # every lane hands out whole blocks this many times
                for lane in lanes:
                    lane[1] += rounds * block
                left -= rounds * block * len(lanes)
                continue
        give = min(remaining, block - taken, left)
        lanes[turn][1] += give
        left -= give
        taken += give
        if block_size is not None and taken >= block:
            turn, taken = (turn + 1) % len(lanes), 0
    if block_size is None:
        turn = taken = 0
    return Cursor(tuple((p, o) for p, o in lanes), next_split, turn, taken)


def _slot_rows(epochs: Epochs, slot: Slot, epoch: int) -> list[int]:
    """The rows of each split ``slot`` reads in ``epoch`` as planned for its topology, in reading order
    (the epoch's layout, computed once for every slot)."""
    rows: list[int] = rows_of(epochs.planned_splits(slot, epoch)).tolist()
    return rows


def _refuse(where: str, what: str) -> StateError:
    return StateError(f"the state's {where} {what}; it is not a position this dataset's plan reaches, so resuming "
                      f"from it would lose or repeat rows. {REMEDY[0].upper()}{REMEDY[1:]}")


def check_cursor(cursor: Cursor, split_rows: Sequence[int], *, interleave: int, block_size: int | None,
                 buffer_rows: int, exact: bool, where: str) -> int:
    """Check the stream part of ``cursor`` (lanes, turn, block, window) against a worker's splits;
    return how many rows of its stream were handed out (source rows before the filter)."""
    num_splits, lanes = len(split_rows), cursor.lanes
    if interleave == 1 and lanes == ((num_splits, 0),) and cursor.next_split_index == num_splits + 1:
        lanes = ()  # the end of the epoch as version 2 wrote it (split_index = number of splits)
        cursor = dataclasses.replace(cursor, lanes=(), next_split_index=num_splits)
    if cursor.next_split_index > num_splits:
        raise _refuse(where, f"has next_split_index={cursor.next_split_index}, but the worker reads {num_splits} split(s)")
    if len(lanes) > interleave:
        raise _refuse(where, f"has {len(lanes)} lanes, but interleave={interleave}")
    for number, (position, offset) in enumerate(lanes):
        if position >= num_splits or offset > split_rows[position]:
            rows = f"{split_rows[position]} rows" if position < num_splits else "no such split"
            raise _refuse(f"{where}.lanes[{number}]", f"is [{position}, {offset}] (split {position}: {rows})")
    if cursor.next_split_index < num_splits and len(lanes) != interleave:
        raise _refuse(where, f"has {len(lanes)} lane(s) and next_split_index={cursor.next_split_index} of {num_splits} "
                             f"splits: a lane leaves the rotation only when no split is left to open (interleave={interleave})")
    if interleave == 1 and lanes and cursor.next_split_index != lanes[0][0] + 1:
        raise _refuse(where, f"reads split {lanes[0][0]} with next_split_index={cursor.next_split_index}; with "
                             "interleave=1 the next split is the one after it")
    if (block_size is None or not lanes) and (cursor.turn_index or cursor.block_offset):
        raise _refuse(where, f"has turn_index={cursor.turn_index}, block_offset={cursor.block_offset}, but no rotation "
                             f"of blocks (interleave={interleave}, {len(lanes)} lane(s))")
    if block_size is not None and cursor.block_offset >= block_size:
        raise _refuse(where, f"has block_offset={cursor.block_offset}, but a block holds {block_size} rows")
    if buffer_rows == 0 and (cursor.window_index or cursor.window_offset):
        raise _refuse(where, f"has window_index={cursor.window_index}, window_offset={cursor.window_offset}, but "
                             "shuffle_buffer_size=0")
    if buffer_rows and cursor.window_offset >= buffer_rows:
        raise _refuse(where, f"has window_offset={cursor.window_offset}, but a shuffle window holds {buffer_rows} rows")
    total = sum(split_rows)
    consumed = sum(split_rows[:cursor.next_split_index]) - sum(split_rows[p] - o for p, o in lanes)
    if exact:
        if lanes and interleave > 1:
            expected = cursor_at(split_rows, interleave, block_size, consumed)
            found = (cursor.lanes, cursor.next_split_index, cursor.turn_index, cursor.block_offset)
            if found != (expected.lanes, expected.next_split_index, expected.turn_index, expected.block_offset):
                raise _refuse(where, f"has lanes {list(map(list, cursor.lanes))}, next_split_index="
                                     f"{cursor.next_split_index}, turn_index={cursor.turn_index}, block_offset="
                                     f"{cursor.block_offset}; after {consumed} rows the rotation stands at lanes "
                                     f"{list(map(list, expected.lanes))}, next_split_index={expected.next_split_index}, "
                                     f"turn_index={expected.turn_index}, block_offset={expected.block_offset}")
        at_end = not lanes and consumed == total and cursor.window_index == 0  # Cursor.end: no window
        if buffer_rows and cursor.window_index != -(-consumed // buffer_rows) and not at_end:
            raise _refuse(where, f"has window_index={cursor.window_index}, but its window starts after {consumed} rows, "
                                 f"in window {-(-consumed // buffer_rows)} of {buffer_rows} rows")
        if cursor.window_offset and cursor.window_offset >= total - consumed:
            raise _refuse(where, f"has window_offset={cursor.window_offset}, but only {total - consumed} row(s) are "
                                 "left from the window's start")
    return consumed + cursor.window_offset


def check_share_cursor(cursor: Cursor, split_rows: Sequence[int], replay_rows: Sequence[int] | None, *,
                       interleave: int, block_size: int | None, buffer_rows: int, exact: bool, where: str) -> int:
    """Check ``cursor`` against a worker's splits and, in a re-planned epoch, the rows of its replays (``None``:
    an epoch planned for its topology, which has none); return how many rows of its share were handed out
    (source rows before the filter)."""
    replays = list(replay_rows or ())
    if replay_rows is None and (cursor.replay_index or cursor.replay_offset):
        raise _refuse(where, f"has replay_index={cursor.replay_index}, replay_offset="
                             f"{cursor.replay_offset} outside an epoch re-planned for another topology")
    if cursor.replay_index > len(replays):
        raise _refuse(where, f"has replay_index={cursor.replay_index}, but the worker has {len(replays)} replay(s)")
    stream = dataclasses.replace(cursor, replay_index=0, replay_offset=0)
    if cursor.replay_index < len(replays):
        if cursor.replay_offset >= replays[cursor.replay_index] or stream != Cursor.start(len(split_rows), interleave):
            raise _refuse(where, f"has replay_index={cursor.replay_index}, replay_offset="
                                 f"{cursor.replay_offset} (replays of {replays} rows) and its own splits "
                                 f"at {stream}, not at their start")
        return sum(replays[:cursor.replay_index]) + cursor.replay_offset
    if cursor.replay_offset:
        raise _refuse(where, f"has replay_offset={cursor.replay_offset} past its last replay")
    return sum(replays) + check_cursor(stream, split_rows, interleave=interleave, block_size=block_size,
                                       buffer_rows=buffer_rows, exact=exact, where=where)


def check_leftovers(epochs: Epochs, checked: set[Leftovers], source: Leftovers, where: str, *, exact: bool,
                    common: dict[str, Any]) -> None:
    """Check every old worker's cursor of an elastic ``source`` against what it read of its epoch: its planned
    splits, or, when that epoch was itself re-planned (``source.before``, checked first, the same way), its share
    of the re-plan (replays, then ranges). A source already in ``checked`` is not checked again; one found valid
    is added."""
    if source in checked:
        return
    before = source.before
    if before is not None:
        check_leftovers(epochs, checked, before, f"{where}.before", exact=exact, common=common)
    grid = SlotGrid(source.world_size, source.num_workers)
    layout = None if before is None else epochs.layouts.layout(source.epoch, grid, before)
    for index, old in enumerate(source.cursors):
        if old is None:
            continue
        old_slot, at = grid.slot_at(index), f"{where}.cursors[{index}]"
        if layout is None:
            if old.replay_index or old.replay_offset:
                raise _refuse(at, "has replay fields; an old worker's cursor of a planned epoch has none")
            check_cursor(old, _slot_rows(epochs, old_slot, source.epoch), exact=exact, where=at, **common)
        else:
            share = layout.share(old_slot)
            check_share_cursor(old, rows_of(share.splits).tolist(), [r.rows for r in share.replays], exact=exact,
                               where=at, **common)
    checked.add(source)  # every new worker carries the same source: checked once


def check_position(saved: WorkerState, split_rows: Sequence[int], replay_rows: Sequence[int] | None, *,
                   batch_size: int, interleave: int, block_size: int | None, buffer_rows: int, drop_last: bool,
                   limit: int | None, exact: bool, where: str) -> bool:
    """Check a worker state's cursor and counters against its splits (and, in a re-planned epoch,
    the rows of its replays); return whether the cursor is the end of its epoch."""
    cursor = saved.cursor
    replays = list(replay_rows or ())
    handed = check_share_cursor(cursor, split_rows, replay_rows, interleave=interleave, block_size=block_size,
                                buffer_rows=buffer_rows, exact=exact, where=f"{where}.cursor")
    total = sum(replays) + sum(split_rows)
    at_end = handed == total and cursor.replay_index == len(replays) and not cursor.lanes
    rows, batches = saved.rows, saved.batches
    if saved.epoch_complete and at_end:
        if exact and rows + saved.rows_dropped > total:
            raise _refuse(f"{where}.counters", f"count {rows} rows yielded and {saved.rows_dropped} dropped, but the "
                                               f"worker reads {total} rows in the epoch")
        return True
    if rows > handed or (exact and rows != handed):
        raise _refuse(f"{where}.counters.rows", f"is {rows}, but the cursor stands after {handed} row(s)")
    if saved.rows_dropped:
        raise _refuse(f"{where}.counters.rows_dropped", f"is {saved.rows_dropped} inside the epoch (drop_last drops "
                                                        "rows only when the epoch ends)")
    short = rows % batch_size != 0
    if batches != -(-rows // batch_size) or (short and (drop_last or (exact and handed != total))):
        raise _refuse(f"{where}.counters", f"count {batches} batch(es) for {rows} rows of batches of {batch_size}")
    if limit is not None and batches > limit:
        raise _refuse(f"{where}.counters.batches", f"is {batches}, but even_batches lets this worker yield {limit}")
    return at_end


def check_in_plan(epochs: Epochs, options: OrderOptions, checked: set[Leftovers], saved: WorkerState, where: str,
                  done: str | None = None) -> None:
    """Check a parsed worker state against a dataset's plan (its ``epochs`` and ``options``) in the state's own
    topology (its slot); ``done``: why the checkpoint counts the worker as done with its epoch (then nothing may
    be left). An elastic source already in ``checked`` is not checked again; one found valid is added."""
    exact = not options.drops_rows
    common: dict[str, Any] = {"interleave": options.interleave, "buffer_rows": options.shuffle_buffer_size,
                              "block_size": block_size_for(options.batch_size, options.interleave)}
    slot = saved.slot
    replay_rows: list[int] | None = None
    if saved.elastic is None:  # the epoch as the state's topology reads it, with the state's even_batches
        layout = epochs.layouts.layout(saved.epoch, slot.grid, even_batches=bool(saved.options.get("even_batches")))
        split_rows, limit = rows_of(layout.share(slot).splits).tolist(), layout.limit(slot)
    else:
        source = saved.elastic
        if source.epoch != saved.epoch:
            raise _refuse(f"{where}.elastic.epoch", f"is {source.epoch}, but the state is in epoch {saved.epoch}")
        check_leftovers(epochs, checked, source, f"{where}.elastic", exact=exact, common=common)
        layout = epochs.layouts.layout(saved.epoch, slot.grid, source,  # with the state's even_batches
                                       even_batches=bool(saved.options.get("even_batches")))
        share, limit = layout.share(slot), layout.limit(slot)
        split_rows, replay_rows = rows_of(share.splits).tolist(), [r.rows for r in share.replays]
    at_end = check_position(saved, split_rows, replay_rows, batch_size=options.batch_size, drop_last=options.drop_last,
                            limit=limit, exact=exact, where=where, **common)
    if (saved.epoch_complete or done) and not at_end and exact:
        left = sum(split_rows) + sum(replay_rows or ()) - saved.rows
        wanted = options.batch_size if options.drop_last else 1
        if left >= wanted and (limit is None or saved.batches < limit):
            raise _refuse(where, f"stands after {saved.rows} rows with {left} row(s) of epoch {saved.epoch} left to "
                                 f"yield, but {done or 'its epoch_complete is true'}")
