"""A held source's parts read whole (``arrowstream._mix_bulk``) give the pipeline's rows and cursors.

A mixture holds a small source in memory (``arrowstream._held``) and reads a part of it at once where the
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
from arrowstream._cursor import Cursor
from arrowstream._held import HeldReader, HeldSource, holds
from arrowstream._interleave import block_size_for
from arrowstream._mix_bulk import BulkCursors, bulk_order, bulk_readable
from arrowstream._mix_parts import Part
from arrowstream._plan_types import Split
from arrowstream._reader import SplitReader
from arrowstream._stream import RunQueue, open_runs


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
    cursors = BulkCursors(part, interleave, buffer_rows, block_size_for(batch_size, interleave))
    assert [cursors.after(j) for j in range(1, part.rows + 1)] == held_cursors

