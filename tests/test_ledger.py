"""The dynamic ledger's rest and re-plan on the shared re-plan core (``arrowstream._layout.replan``), property-based.

``worker_rest`` (what a worker left of its leases at a checkpoint: it goes into the saved ledger) and
``replanned_work`` (a rank's stretch of every old rank's rest) once had their own copies of
``items_left`` and ``cut_evenly``'s cutting. They now stand on ``window_left``/``ranges_left`` and
``cut_items``; the copies they had are kept below, verbatim, as the reference: over random splits,
cursors reached by reading, replays and rests, the two give equal results, so every ledger saved is
the one saved before (tests/golden/ holds some; these cover the rest).
"""

from __future__ import annotations

import dataclasses
import functools

from hypothesis import given, settings
from hypothesis import strategies as st
from test_elastic_plan import IdReader, make_plan

from arrowstream._core.cursor import Cursor
from arrowstream._core.interleave import block_size_for
from arrowstream._core.order import (
    Slot,
    cut_evenly,
    even_batch_limits,
    natural_batches,
    rows_yielded,
    window_seed,
)
from arrowstream._core.plan_types import Split
from arrowstream._core.stream import open_runs
from arrowstream._layout.leases import LeasedItems, Work
from arrowstream._layout.ledger import replanned_work, truncated, worker_rest
from arrowstream._layout.replan import Replay, replay_part, split_part, split_rest, window_end

# -- the reference: the copies leases.py had, as they were --------------------------------------------


def _rebased(cursor: Cursor, first: int) -> Cursor:
    return dataclasses.replace(cursor, lanes=tuple((index - first, offset) for index, offset in cursor.lanes),
                               next_split_index=cursor.next_split_index - first)


def old_worker_rest(slot, share, cursor, *, batch_size, interleave, buffer_rows):
    replays = []
    splits = list(share.splits)
    if cursor.replay_index < len(share.replays):
        current = share.replays[cursor.replay_index]
        replays.append(replay_part(current, cursor.replay_offset, current.rows))
        replays.extend(share.replays[cursor.replay_index + 1:])
        return replays, splits
    end = cursor
    if buffer_rows and cursor.window_offset:
        first = min([index for index, _ in cursor.lanes] + [cursor.next_split_index])
        size, end = window_end(splits, cursor, block_size_for(batch_size, interleave), interleave, buffer_rows)
        if size > cursor.window_offset:
            last = min(end.next_split_index, len(splits))
            replays.append(Replay(slot, tuple(splits[first:last]), _rebased(cursor, first),
                                  size - cursor.window_offset))
    rest = [split_rest(splits[index], offset) for index, offset in end.lanes
            if index < len(splits) and offset < splits[index].num_rows]
    rest += [s for s in splits[end.next_split_index:] if s.num_rows]
    return replays, rest


def old_rest_items(work):
    items = [*work.replays, *(s for s in work.splits if s.num_rows)]
    before = 0
    for split in work.fresh:
        end = before + split.num_rows
        if end > work.fresh_from_row:
            items.append(split_rest(split, max(work.fresh_from_row - before, 0)))
        before = end
    return items


def old_replanned_work(rests, world_size, rank, batch_size, drop_last, even_batches):
    items = [item for rest in rests for item in old_rest_items(rest)]
    sizes = [item.rows if isinstance(item, Replay) else item.num_rows for item in items]
    replays = []
    splits = []
    stretch_rows = [0] * world_size
    for index, slot, lo, hi in cut_evenly(sizes, world_size):
        stretch_rows[slot] += hi - lo
        if slot != rank:
            continue
        item = items[index]
        if isinstance(item, Replay):
            replays.append(replay_part(item, lo, hi))
        else:
            splits.append(split_part(item, lo, hi))
    rows = stretch_rows[rank]
    limits = (even_batch_limits(stretch_rows, world_size, batch_size, drop_last) if even_batches
              else [natural_batches(r, batch_size, drop_last) for r in stretch_rows])
    kept = rows_yielded(rows, limits[rank], batch_size, drop_last)
    head = sum(r.rows for r in replays)
    if kept < head:
        cut = []
        for replay in replays:
            take = min(replay.rows, kept - sum(r.rows for r in cut))
            if take > 0:
                cut.append(replay_part(replay, 0, take))
        replays, splits = cut, []
    return Work(tuple(replays), (), truncated(splits, kept - head), 0), rows


# -- random inputs --------------------------------------------------------------------------------

SLOT = Slot(0, 1, 1, 3)
files = st.lists(st.lists(st.integers(0, 60), min_size=1, max_size=4), min_size=1, max_size=4).filter(
    lambda fs: any(map(sum, fs)))


def leased_splits(plan, cuts: list[tuple[int, int]]) -> tuple[Split, ...]:
    """The plan's splits as a worker leases them: some whole, some a part of their rows (a tail lease)."""
    out = []
    for split, (a, b) in zip(plan.splits_for(1), cuts, strict=False):
        lo, hi = sorted((a % (split.num_rows + 1), b % (split.num_rows + 1)))
        if hi > lo:
            out.append(split_part(split, lo, hi))
    return tuple(out)


def synthetic_replays(splits: tuple[Split, ...], sizes: list[int]) -> tuple[Replay[Slot], ...]:
    """Replays of old windows (what they read matters not to the rest: only their rows)."""
    return tuple(Replay(Slot(0, 2, i % 2, 2), splits[:2], Cursor((), 0, window_offset=i), rows)
                 for i, rows in enumerate(sizes))


def cursor_after(splits, rows: int, *, batch_size: int, interleave: int, buffer_rows: int, piece_rows: int, plan):
    """The cursor of a worker's stream over ``splits`` once ``rows`` rows of it are handed out (at most all)."""
    readers = [IdReader(plan, piece_rows) for _ in range(interleave)]
    cursor = Cursor.start(len(splits), interleave)
    runs = open_runs(readers, splits, batch_size=batch_size, interleave=interleave, buffer_rows=buffer_rows,
                     start=cursor, window_seed=functools.partial(window_seed, 3, 0, SLOT))
    for run in runs:
        if rows < run.num_rows:
            return run.after(rows)
        cursor = run.after(run.num_rows)
        rows -= run.num_rows
    return cursor


@settings(max_examples=300, deadline=None)
@given(files=files, split_bytes=st.sampled_from([None, 1, 300, 2000]),
       cuts=st.lists(st.tuples(st.integers(0, 80), st.integers(0, 80)), max_size=16),
       replays=st.lists(st.integers(1, 90), max_size=3), replaying=st.integers(0, 4), replay_offset=st.integers(0, 89),
       taken=st.integers(0, 600), batch_size=st.integers(1, 40), interleave=st.integers(1, 3),
       buffer_rows=st.sampled_from([0, 1, 7, 50, 200]), piece_rows=st.integers(1, 50))
def test_a_workers_rest_is_the_one_its_own_copy_gave(files, split_bytes, cuts, replays, replaying, replay_offset,
                                                      taken, batch_size, interleave, buffer_rows, piece_rows):
    plan = make_plan(files, split_bytes)
    splits = leased_splits(plan, cuts)
    share = LeasedItems(synthetic_replays(splits, replays), splits)
    if replaying < len(replays):   # still reading its replays
        cursor = Cursor((), 0, replay_index=replaying, replay_offset=replay_offset % replays[replaying])
    else:
        cursor = dataclasses.replace(cursor_after(splits, taken, batch_size=batch_size, interleave=interleave,
                                                  buffer_rows=buffer_rows, piece_rows=piece_rows, plan=plan),
                                     replay_index=len(replays))
    options = {"batch_size": batch_size, "interleave": interleave, "buffer_rows": buffer_rows}
    assert worker_rest(SLOT, share, cursor, **options) == old_worker_rest(SLOT, share, cursor, **options)


@settings(max_examples=300, deadline=None)
@given(files=files, split_bytes=st.sampled_from([None, 1, 300, 2000]),
       rests=st.lists(st.tuples(st.lists(st.integers(1, 90), max_size=2),
                                st.lists(st.tuples(st.integers(0, 80), st.integers(0, 80)), max_size=6),
                                st.integers(0, 400)), min_size=1, max_size=4),
       world_size=st.integers(1, 5), batch_size=st.integers(1, 40), drop_last=st.booleans(),
       even_batches=st.booleans())
def test_a_replanned_ranks_work_is_the_one_its_own_copy_gave(files, split_bytes, rests, world_size, batch_size,
                                                              drop_last, even_batches):
    plan = make_plan(files, split_bytes)
    fresh = tuple(plan.splits_for(1))
    works = []
    for replays, cuts, fresh_from in rests:
        splits = leased_splits(plan, cuts)
        works.append(Work(synthetic_replays(splits, replays), splits, fresh,
                          fresh_from % (sum(s.num_rows for s in fresh) + 1)))
    for rank in range(world_size):
        args = (works, world_size, rank, batch_size, drop_last, even_batches)
        assert replanned_work(*args) == old_replanned_work(*args)
