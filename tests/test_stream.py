"""The pure pipeline of a worker: interleaved lanes, shuffle windows, full batches, cursors.

Property-based (hypothesis), over an in-memory reader of integer rows, so thousands of layouts
run in seconds: every epoch is a permutation of the rows, the order does not depend on how the
reader cuts its reads, and a stream rebuilt from the state after any batch yields exactly the
batches that followed.
"""

from __future__ import annotations

import functools
import itertools
import json

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_stream import EpochStream

from arrowstream._core.cursor import Cursor
from arrowstream._core.interleave import block_size_for
from arrowstream._core.order import Slot, window_seed
from arrowstream._core.piece import Piece
from arrowstream._core.plan_types import PLANNING_VERSION, Split
from arrowstream._core.stream import RunQueue, open_runs
from arrowstream._state.identity import DataIdentity
from arrowstream._state.worker import WorkerState

ROWS_PER_SPLIT = 10_000  # split i holds ids i * ROWS_PER_SPLIT + source offset
SLOT = Slot(0, 1, 0, 0)
DATA = DataIdentity("0" * 32, 1, 0)
OPTIONS = {"planning": PLANNING_VERSION}  # what a worker state must name


class IntReader:
    """Splits of integer ids, read ``piece_rows`` source rows at a time; with ``drop``, ids divisible
    by it are filtered out (as a Parquet filter would), so pieces may be empty."""

    def __init__(self, piece_rows: int, drop: int | None = None) -> None:
        self.piece_rows = piece_rows
        self.drop = drop
        self.rows_read = 0

    def read(self, split, position, offset):
        for start in range(offset, split.num_rows, self.piece_rows):
            end = min(start + self.piece_rows, split.num_rows)
            self.rows_read += end - start
            ids = np.arange(start, end, dtype=np.int64) + split.file_index * ROWS_PER_SPLIT
            if self.drop is None:
                yield Piece(pa.record_batch({"id": ids}), position, start, end, None)
            else:
                keep = ids % self.drop != 0
                yield Piece(pa.record_batch({"id": ids[keep]}), position, start, end,
                            np.arange(start, end, dtype=np.int64)[keep])

    def close(self):
        pass


def make_splits(sizes):
    return [Split(i, 0, 1, 0, n, n) for i, n in enumerate(sizes)]


def open_stream(splits, reader_factory, *, batch_size, interleave, buffer_rows, drop_last=False, start=None,
                seed=0, epoch=0, run_rows=16_384):
    readers = [reader_factory() for _ in range(interleave)]
    if start is None:
        start = WorkerState(DATA, OPTIONS, epoch, SLOT, Cursor.start(len(splits), interleave), 0, 0, 0, False)

    runs = open_runs(readers, splits, batch_size=batch_size, interleave=interleave, buffer_rows=buffer_rows,
                     window_seed=functools.partial(window_seed, seed, epoch, SLOT), start=start.cursor,
                     run_rows=run_rows)

    stream = EpochStream(runs=runs, end=Cursor.end(len(splits)), batch_size=batch_size, drop_last=drop_last,
                         convert=lambda batch: batch.column("id").to_pylist(), data=DATA, options=OPTIONS,
                         epoch=epoch, slot=SLOT, start=start)
    return stream, readers


def run_all(splits, reader_factory, **kwargs):
    """Every batch of the stream and the state (through JSON) after each."""
    stream, _ = open_stream(splits, reader_factory, **kwargs)
    batches, states = [], []
    for batch in stream:
        batches.append(batch)
        states.append(WorkerState.from_dict(json.loads(json.dumps(stream.state().to_dict()))))
    return batches, states


layouts = st.fixed_dictionaries({
    "sizes": st.lists(st.integers(0, 300), min_size=1, max_size=8),
    "batch_size": st.integers(1, 70),
    "interleave": st.integers(1, 4),
    "buffer_rows": st.sampled_from([0, 1, 7, 50, 128, 1000]),
    "drop": st.sampled_from([None, 3, 2]),
    "drop_last": st.booleans(),
    "piece_rows": st.integers(1, 90),
    "run_rows": st.sampled_from([1, 5, 64, 16_384]),
})


def kept_ids(sizes, drop):
    ids = [i * ROWS_PER_SPLIT + r for i, n in enumerate(sizes) for r in range(n)]
    return [i for i in ids if drop is None or i % drop != 0]


def stream_args(layout):
    return {k: layout[k] for k in ("batch_size", "interleave", "buffer_rows", "drop_last", "run_rows")}


@settings(max_examples=150, deadline=None)
@given(layouts)
def test_every_epoch_is_a_permutation_in_full_batches(layout):
    splits = make_splits(layout["sizes"])
    batches, _states = run_all(splits, lambda: IntReader(layout["piece_rows"], layout["drop"]), **stream_args(layout))
    out = [i for batch in batches for i in batch]
    expected = kept_ids(layout["sizes"], layout["drop"])
    size = layout["batch_size"]
    assert len(out) == len(set(out))
    if layout["drop_last"]:
        assert len(out) == len(expected) - len(expected) % size
        assert set(out) <= set(expected)
    else:
        assert sorted(out) == sorted(expected)
    assert all(len(batch) == size for batch in batches[:-1])
    assert not batches or 0 < len(batches[-1]) <= size


@settings(max_examples=100, deadline=None)
@given(layouts, st.integers(1, 90), st.sampled_from([1, 3, 16_384]))
def test_order_does_not_depend_on_how_reads_and_shuffled_runs_are_cut(layout, other_piece_rows, other_run_rows):
    splits = make_splits(layout["sizes"])
    a, _ = run_all(splits, lambda: IntReader(layout["piece_rows"], layout["drop"]), **stream_args(layout))
    b, _ = run_all(splits, lambda: IntReader(other_piece_rows, layout["drop"]),
                   **{**stream_args(layout), "run_rows": other_run_rows})
    assert a == b


@settings(max_examples=120, deadline=None)
@given(layouts, st.data())
def test_replay_from_any_cursor_equals_the_continuation(layout, data):
    splits = make_splits(layout["sizes"])
    factory = functools.partial(IntReader, layout["piece_rows"], layout["drop"])
    batches, states = run_all(splits, factory, **stream_args(layout))
    if not batches:
        return
    k = data.draw(st.integers(0, len(batches) - 1), label="batches before the checkpoint")
    resumed, _ = open_stream(splits, factory, start=states[k], **stream_args(layout))
    assert list(resumed) == batches[k + 1:]


@settings(max_examples=90, deadline=None)
@given(layouts, st.data())
def test_a_resume_rereads_at_most_one_window(layout, data):
    """Cheap resume: rows read after a resume exceed the rows still to come by at most one
    shuffle window (this reader starts exactly at a row offset; Parquet adds a row-group prefix)."""
    splits = make_splits(layout["sizes"])
    factory = functools.partial(IntReader, layout["piece_rows"], None)
    args = {**stream_args(layout), "drop_last": False}
    batches, states = run_all(splits, factory, **args)
    if not batches:
        return
    k = data.draw(st.integers(0, len(batches) - 1), label="batches before the checkpoint")
    resumed, readers = open_stream(splits, factory, start=states[k], **args)
    remaining = sum(len(b) for b in resumed)
    assert sum(r.rows_read for r in readers) <= remaining + layout["buffer_rows"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=6), st.sampled_from([1, 10, 64, 500]),
       st.integers(1, 50))
def test_a_row_stays_in_its_window(sizes, buffer_rows, batch_size):
    """Without interleave, window w holds exactly the rows w * N ... (w + 1) * N - 1 of the reading order."""
    splits = make_splits(sizes)
    batches, _ = run_all(splits, lambda: IntReader(37), batch_size=batch_size, interleave=1, buffer_rows=buffer_rows)
    out = [i for batch in batches for i in batch]
    reading_order = kept_ids(sizes, None)
    for position, row in enumerate(out):
        assert reading_order.index(row) // buffer_rows == position // buffer_rows


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 200), min_size=1, max_size=8), st.integers(2, 4), st.integers(1, 64))
def test_interleave_rotates_blocks_of_open_splits(sizes, interleave, batch_size):
    """Without a buffer, each split's rows come in order, in blocks of ceil(batch_size / K) rows
    (shorter only where a lane runs out), and at most K splits are open at any time."""
    splits = make_splits(sizes)
    batches, _ = run_all(splits, lambda: IntReader(29), batch_size=batch_size, interleave=interleave, buffer_rows=0)
    out = [i for batch in batches for i in batch]
    for split in range(len(sizes)):
        rows = [i for i in out if i // ROWS_PER_SPLIT == split]
        assert rows == sorted(rows)
    started = {}
    finished = {}
    for position, row in enumerate(out):
        started.setdefault(row // ROWS_PER_SPLIT, position)
        finished[row // ROWS_PER_SPLIT] = position
    for position in range(len(out)):
        assert sum(started[s] <= position <= finished[s] for s in started) <= interleave
    block = block_size_for(batch_size, interleave)
    assert block is not None
    if len(sizes) >= interleave and min(sizes[:interleave]) >= block:
        assert [i // ROWS_PER_SPLIT for i in out[:block * interleave:block]] == list(range(interleave))


@given(st.integers(0, 1000), st.integers(0, 30))
def test_windows_are_seeded_by_epoch(seed, epoch):
    splits = make_splits([200, 200])
    args = {"batch_size": 16, "interleave": 1, "buffer_rows": 100}
    a, _ = run_all(splits, lambda: IntReader(50), seed=seed, epoch=epoch, **args)
    assert a == run_all(splits, lambda: IntReader(50), seed=seed, epoch=epoch, **args)[0]
    assert a != run_all(splits, lambda: IntReader(50), seed=seed, epoch=epoch + 1, **args)[0]


@settings(max_examples=100, deadline=None)
@given(layouts)
def test_one_lane_cursors_are_a_split_and_an_offset(layout):
    """With interleave=1 the cursor is what a version 2 state held: one (split, offset), no rotation."""
    splits = make_splits(layout["sizes"])
    _, states = run_all(splits, lambda: IntReader(layout["piece_rows"], layout["drop"]),
                        **{**stream_args(layout), "interleave": 1})
    for state in states:
        cursor = state.cursor
        assert len(cursor.lanes) <= 1 and (cursor.turn_index, cursor.block_offset) == (0, 0)
        assert not cursor.lanes or cursor.next_split_index == cursor.lanes[0][0] + 1


@settings(max_examples=120, deadline=None)
@given(layouts)
def test_a_cursor_is_at_the_end_exactly_when_no_row_follows(layout):
    """``Cursor.at_end`` never claims the end while rows follow; without a filter (which may drop
    every row that is left) it sees the end as soon as the last row is handed out."""
    splits = make_splits(layout["sizes"])
    args = {**stream_args(layout), "drop_last": False}
    batches, states = run_all(splits, lambda: IntReader(layout["piece_rows"], layout["drop"]), **args)
    for k, state in enumerate(states):
        at_end = state.cursor.at_end(layout["sizes"])
        rows_after = sum(len(batch) for batch in batches[k + 1:])
        assert not (at_end and rows_after)
        if layout["drop"] is None and rows_after == 0:
            assert at_end


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 9000), min_size=1, max_size=4), st.sampled_from([4096, 5000, 12_000]),
       st.integers(1, 3), st.data())
def test_windows_of_large_pieces_replay_exactly(sizes, buffer_rows, interleave, data):
    """Reads of thousands of rows take the window path that gathers from the pieces as read."""
    splits = make_splits(sizes)
    args = {"batch_size": 1000, "interleave": interleave, "buffer_rows": buffer_rows, "run_rows": 3000}
    batches, states = run_all(splits, lambda: IntReader(8192), **args)
    assert sorted(i for batch in batches for i in batch) == kept_ids(sizes, None)
    if batches:
        k = data.draw(st.integers(0, len(batches) - 1), label="batches before the checkpoint")
        resumed, _ = open_stream(splits, lambda: IntReader(700), start=states[k], **args)
        assert list(resumed) == batches[k + 1:]


@settings(max_examples=200, deadline=None)
@given(layouts, st.lists(st.integers(0, 90), min_size=1, max_size=12))
def test_taking_marked_rows_at_once_equals_taking_them_stretch_by_stretch(layout, stretches):
    """A mixture takes a source's rows of a span of batches in one pass (``take_marked``): the rows and the
    cursor after each mark are those of one ``take`` per stretch, also where a mark ends a run exactly."""
    splits = make_splits(layout["sizes"])

    def queue():
        readers = [IntReader(layout["piece_rows"], layout["drop"]) for _ in range(layout["interleave"])]
        start = Cursor.start(len(splits), layout["interleave"])
        return RunQueue(open_runs(readers, splits, batch_size=layout["batch_size"], interleave=layout["interleave"],
                                  buffer_rows=layout["buffer_rows"], window_seed=functools.partial(window_seed, 0, 0, SLOT),
                                  start=start, run_rows=layout["run_rows"]), start)

    stretch_by_stretch, at_once = queue(), queue()
    at_once.fill(sum(stretches))
    marks = [mark for mark in itertools.accumulate(stretches) if 0 < mark <= at_once.buffered]
    if not marks:
        return
    rows, cursors = [], []
    for before, mark in zip([0, *marks], marks):
        if mark > before:
            stretch_by_stretch.fill(mark - before)
            rows += stretch_by_stretch.take(mark - before).column("id").to_pylist()
        cursors.append(stretch_by_stretch.cursor)
    pieces, marked = at_once.take_marked(marks[-1], marks)
    assert [row for piece in pieces for row in piece.column("id").to_pylist()] == rows
    assert marked == cursors
    assert at_once.cursor == stretch_by_stretch.cursor
    for queue_ in (stretch_by_stretch, at_once):   # and the rows after them follow the same way
        queue_.fill(10**9)
    assert at_once.buffered == stretch_by_stretch.buffered
    if at_once.buffered:
        assert at_once.take(at_once.buffered).equals(stretch_by_stretch.take(stretch_by_stretch.buffered))
