"""Where a mixture slot stands in a part of a source, by arithmetic (``arrowstream._state.mixture_position``).

Property: for random parts of a real Parquet source (splits cut to row ranges, in any order), random interleave,
shuffle buffer and batch size, :func:`part_cursor` after every row is the cursor the pipeline reports; so is it
for a part that starts inside an old slot's shuffle window (an epoch re-planned for another topology). And the
rows of each source after each batch, replayed from the last batch where every share is whole, are those the
slot's stream takes batch after batch.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_mix_bulk import held  # noqa: F401 (the fixture)

from arrowstream._core.cursor import Cursor
from arrowstream._core.interleave import block_size_for
from arrowstream._core.plan_types import Split
from arrowstream._core.stream import RunQueue, open_runs
from arrowstream._mixing.parts import Part
from arrowstream._mixing.quotas import shares_after
from arrowstream._state.mixture_position import SHARES_REPLAYED, final_counters, part_cursor, shares_at
from arrowstream._worker.reader import SplitReader  # noqa: F401 (held's reader)


def _cursors(reader, part, start, rows, interleave, buffer_rows, batch_size):
    """The pipeline's cursor after each of the first ``rows`` rows of ``part`` from ``start``."""
    readers = [reader() for _ in range(interleave)]
    queue = RunQueue(open_runs(readers, part.splits, batch_size=batch_size, interleave=interleave,
                               buffer_rows=buffer_rows, window_seed=part.seeds, start=start), start)
    out = []
    for _ in range(rows):
        queue.fill(1)
        queue.take(1)
        out.append(queue.cursor)
    return out


@settings(max_examples=120, deadline=None)
@given(data=st.data(), interleave=st.sampled_from([1, 2, 3]), buffer_rows=st.sampled_from([0, 4, 9, 64]),
       batch_size=st.integers(1, 7))
def test_a_parts_cursor_after_any_row_is_the_pipelines(held, data, interleave, buffer_rows, batch_size):  # noqa: F811
    plan, _, reader = held
    count = len(plan.splits)
    order = data.draw(st.permutations(range(count)))
    first = data.draw(st.integers(0, count - 1))
    last = data.draw(st.integers(first, count - 1))
    splits = [plan.splits[i] for i in order[first:last + 1]]
    lo = data.draw(st.integers(0, splits[0].num_rows - 1))
    splits[0] = Split(splits[0].file_index, splits[0].unit_start, splits[0].unit_stop, splits[0].row_start + lo,
                      splits[0].num_rows - lo, splits[0].num_bytes)
    part = Part(tuple(splits), sum(s.num_rows for s in splits), functools.partial(lambda w: 17 + w))
    block = block_size_for(batch_size, interleave)
    options = {"interleave": interleave, "block_size": block, "buffer_rows": buffer_rows}
    start = Cursor.start(len(splits), interleave)
    pipeline = _cursors(reader, part, start, part.rows, interleave, buffer_rows, batch_size)
    assert part_cursor(part, 0, **options) == start
    assert [part_cursor(part, k, **options) for k in range(1, part.rows + 1)] == pipeline
    inside = [(k, c) for k, c in enumerate(pipeline, 1) if c.window_offset]
    if inside:   # an old slot stood inside a window: the rest of it, from there, as a re-planned epoch reads it
        k, old = data.draw(st.sampled_from(inside))
        left = data.draw(st.integers(1, min(buffer_rows, part.rows - (k - old.window_offset)) - old.window_offset))
        replay = Part(part.splits, left, part.seeds, old)
        assert part_cursor(replay, 0, **options) == old
        assert [part_cursor(replay, j, **options) for j in range(1, left + 1)] == \
            _cursors(reader, replay, old, left, interleave, buffer_rows, batch_size)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), quotas=st.lists(st.sampled_from([0, 1, 2, 3, 7, 10, 33, 100, 457, 1000]), min_size=1,
                                       max_size=5), batch_size=st.integers(1, 40))
def test_the_rows_of_each_source_after_any_batch_are_those_the_stream_takes(data, quotas, batch_size):
    total = sum(quotas)
    after = [[0] * len(quotas)]   # the stream's rows of each source after each batch
    while (len(after) - 1) * batch_size < total:
        after.append(shares_after(after[-1], quotas, min(len(after) * batch_size, total)))
    for batches in data.draw(st.lists(st.integers(0, len(after) - 1), min_size=1, max_size=6)):
        replayed = shares_at(quotas, batch_size, batches)
        assert replayed == after[batches] or (replayed is None and batches > SHARES_REPLAYED)


@pytest.mark.parametrize("rows,limit,drop_last,expected", [
    (100, None, False, (100, 4, 0)), (100, None, True, (96, 3, 4)), (100, 2, False, (64, 2, 0)),
    (100, 4, True, (96, 3, 0)), (100, 3, True, (96, 3, 0)), (96, None, True, (96, 3, 0)), (0, None, False, (0, 0, 0))])
def test_a_finished_slots_counters(rows, limit, drop_last, expected):
    assert final_counters(rows, limit, batch_size=32, drop_last=drop_last) == expected
