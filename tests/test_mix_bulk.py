"""A held source's parts read whole (``arrowstream._mixing.bulk``) give the pipeline's rows and cursors.

A mixture holds a small source in memory (``arrowstream._worker.held``) and reads a part of it at once where the
pipeline's order is simple (one window or none, one lane's order). Property: for random parts of a real
Parquet source (files of several row groups, splits cut to row ranges), random interleave, shuffle buffer
and batch size, the rows read whole come in the order the pipeline hands them out (through the held
reader, and through the file reader itself), and the cursor after every row is the pipeline's.
"""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from arrowstream import Mixture, Source
from arrowstream._core.cursor import Cursor
from arrowstream._core.interleave import block_size_for
from arrowstream._core.plan_types import Split
from arrowstream._core.stream import RunQueue, open_runs
from arrowstream._mixing.bulk import BulkCursors, bulk_order, bulk_readable
from arrowstream._mixing.parts import Part, SpanParts
from arrowstream._mixing.quotas import span_first
from arrowstream._mixing.source_rows import SourceRows
from arrowstream._state.mixture import SourceCursor
from arrowstream._worker.held import HeldReader, HeldSource, holds
from arrowstream._worker.reader import SplitReader


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """A planned source of three files (7, 13 and 5 rows in row groups of 3), and its rows held."""
    folder = tmp_path_factory.mktemp("held")
    start = 0
    for index, rows in enumerate((7, 13, 5)):
        pq.write_table(pa.table({"id": np.arange(start, start + rows)}), folder / f"f{index}.parquet",
                       row_group_size=3)
        start += rows
    mixture = Mixture({"s": Source(str(folder), split_bytes=1)}, batch_size=4, plan_cache=False)
    planned = mixture._sources[0]
    assert holds(planned.plan, 4) and len(planned.plan.splits) > 3

    def reader():
        return SplitReader(planned.plan, planned.storage, 1024, use_threads=False)

    return planned.plan, HeldSource(reader(), planned.plan), reader


def _pipeline(readers, part, interleave, buffer_rows, batch_size):
    """Every row of ``part`` through the pipeline, one at a time, and the cursor after each."""
    start = Cursor.start(len(part.splits), interleave)
    queue = RunQueue(open_runs(readers, part.splits, batch_size=batch_size, interleave=interleave,
                               buffer_rows=buffer_rows, window_seed=part.seeds, start=start), start)
    ids, cursors = [], []
    for _ in range(part.rows):
        queue.fill(1)
        ids += queue.take(1).column("id").to_pylist()
        cursors.append(queue.cursor)
    return ids, cursors


@settings(max_examples=120, deadline=None)
@given(data=st.data(), interleave=st.sampled_from([1, 2, 3]), buffer_rows=st.sampled_from([0, 4, 9, 64]),
       batch_size=st.integers(1, 7), seed=st.integers(0, 2**32))
def test_a_part_read_whole_has_the_pipelines_rows_and_cursors(held, data, interleave, buffer_rows, batch_size, seed):
    plan, source, reader = held
    count = len(plan.splits)
    order = data.draw(st.permutations(range(count)))
    first = data.draw(st.integers(0, count - 1))
    last = data.draw(st.integers(first, min(count - 1, first + (5 if interleave == 1 else 0))))
    splits = [plan.splits[i] for i in order[first:last + 1]]
    lo = data.draw(st.integers(0, splits[0].num_rows - 1))
    splits[0] = Split(splits[0].file_index, splits[0].unit_start, splits[0].unit_stop, splits[0].row_start + lo,
                      splits[0].num_rows - lo, splits[0].num_bytes)
    cut = data.draw(st.integers(1, splits[-1].num_rows))
    splits[-1] = Split(splits[-1].file_index, splits[-1].unit_start, splits[-1].unit_stop, splits[-1].row_start,
                       cut, splits[-1].num_bytes)
    part = Part(tuple(splits), sum(s.num_rows for s in splits), functools.partial(lambda s, w: s + 7919 * w, seed))
    assume(bulk_readable(part, interleave, buffer_rows))
    held_ids, held_cursors = _pipeline([HeldReader(source)] * interleave, part, interleave, buffer_rows, batch_size)
    file_ids, file_cursors = _pipeline([reader() for _ in range(interleave)], part, interleave, buffer_rows,
                                       batch_size)
    assert held_ids == file_ids and held_cursors == file_cursors   # the held reader is the file reader's twin
    rows = bulk_order(source, part, buffer_rows)
    assert source.table.column("id").take(pa.array(rows)).to_pylist() == held_ids
    cursors = BulkCursors.of_part(part, interleave, buffer_rows, block_size_for(batch_size, interleave))
    assert [cursors.after(j) for j in range(1, part.rows + 1)] == held_cursors



@pytest.fixture(scope="module")
def one_split(tmp_path_factory):
    """A planned source of one file of 11 rows in one row group (one split), and its rows held."""
    folder = tmp_path_factory.mktemp("one-split")
    pq.write_table(pa.table({"id": np.arange(100, 111)}), folder / "f.parquet")
    mixture = Mixture({"s": Source(str(folder))}, batch_size=4, plan_cache=False)
    planned = mixture._sources[0]
    assert len(planned.plan.splits) == 1
    return planned.plan, HeldSource(SplitReader(planned.plan, planned.storage, 1024, use_threads=False), planned.plan)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), interleave=st.sampled_from([1, 2]), buffer_rows=st.sampled_from([0, 11, 64]),
       batch_size=st.integers(1, 9), slots=st.integers(1, 5), start=st.integers(0, 60), quota=st.integers(1, 90))
def test_a_source_of_one_split_read_many_parts_at_once_has_the_pipelines_rows_and_cursors(
        one_split, data, interleave, buffer_rows, batch_size, slots, start, quota):
    """``SourceRows`` of a held source of one split in spans (every part read at once: ``span_take``) against
    the same parts read part by part through the pipeline: the same rows, and the same cursor at every mark."""
    plan, source = one_split
    slot = data.draw(st.integers(0, slots - 1))
    parts = SpanParts(plan.splits, rows=plan.num_rows, start=start, quota=quota, num_slots=slots, slot=slot,
                      first=span_first("s", slots), shuffle=True, seed=5, name="s", epoch=2)
    assume(parts.rows > 0)
    marks, at = [], 0
    while at < parts.rows:
        at = min(parts.rows, at + data.draw(st.integers(1, 12)))
        marks.append(at)
    calls = data.draw(st.integers(1, len(marks)))   # the marks over a few take_marked calls, as spans of batches
    cuts = sorted(data.draw(st.sets(st.integers(1, len(marks) - 1), max_size=calls - 1))) if len(marks) > 1 else []

    def read(held):
        rows = SourceRows("s", [HeldReader(source)] * interleave, parts, batch_size=batch_size, interleave=interleave,
                          buffer_rows=buffer_rows, start=SourceCursor(0, None, 0), url="s", held=held)
        ids, cursors, done = [], [], 0
        for lo, hi in zip([0, *cuts], [*cuts, len(marks)], strict=True):
            pieces, after = rows.take_marked([m - done for m in marks[lo:hi]])
            ids += [i for piece in pieces for i in piece.column("id").to_pylist()]
            cursors += after
            done = marks[hi - 1]
        return ids, cursors, rows.compact_cursor()

    held_path = read(source)
    assert held_path == read(None)
    if slots == 1:   # one slot: the epoch's positions of the passes, each once
        assert sorted(held_path[0]) == sorted(100 + position % 11 for position in range(start, start + quota))
