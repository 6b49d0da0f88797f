"""The pure layout of a mixture, property-tested: quotas, spans (and the tracks of older states), passes over
epochs, batch shares."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowstream._core.plan_types import SplitTable
from arrowstream._core.take import take
from arrowstream._mixing import span as span_module
from arrowstream._mixing.quotas import (
    consumed,
    epoch_segments,
    positions,
    quotas,
    quotas_at,
    segment_splits,
    shares_after,
    shares_along,
    span_before,
    span_first,
    span_piece,
    span_pieces,
    span_segment,
    span_taken,
    tracks,
)
from arrowstream._mixing.span import (
    SMALL_TAKE,
    batch_order,
    even_order,
    even_orders,
    even_span_order,
    in_batch_order,
    mixed,
)


@given(st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 10_000), min_size=1, max_size=5),
       st.integers(1, 100_000), st.data())
def test_quotas_are_the_largest_remainders_of_the_weights_and_sum_to_epoch_rows(rows, epoch_rows, data):
    weights = {name: data.draw(st.floats(0.001, 100)) for name in rows}
    given_rows = quotas(rows, weights, epoch_rows)
    assert sum(given_rows.values()) == epoch_rows
    total = sum(weights.values())
    for name, quota in given_rows.items():
        assert abs(quota - epoch_rows * weights[name] / total) < 1 + 1e-6
    if sum(rows.values()):
        assert quotas(rows, None, None) == rows   # no weights: every row of every source once


@settings(max_examples=300)
@given(st.integers(1, 8), st.integers(0, 7), st.integers(0, 60))
def test_span_slots_take_within_one_row_of_their_share_and_in_slot_order(slots, first, x):
    first %= slots
    taken = [span_taken(x, slots, s, first) for s in range(slots)]
    assert sum(taken) == x and max(taken) - min(taken) <= 1
    assert all(span_taken(x, slots, s, first) <= span_taken(x + 1, slots, s, first) for s in range(slots))
    assert [span_before(x, slots, s, first) for s in range(slots)] == list(itertools.accumulate([0, *taken[:-1]]))


@settings(max_examples=300)
@given(st.integers(1, 40), st.integers(1, 6), st.text(min_size=1, max_size=3),
       st.lists(st.integers(0, 130), min_size=1, max_size=6))
def test_spans_read_each_epochs_positions_whole_whatever_the_slots(rows, slots, name, epoch_quotas):
    """Every epoch reads exactly its positions [start, start + quota) of the passes, cut into one stretch per slot
    of each piece (so a source's place at an epoch boundary is its position alone, on any topology), and every
    slot moves through a pass with the others: within one row of its share at every piece's end."""
    first = span_first(name, slots)
    start = 0
    for quota in epoch_quotas:
        pieces = span_pieces(rows, start, quota)
        covered: list[tuple[int, int]] = []
        for index in range(pieces):
            pass_index, _, end = span_piece(rows, start, quota, index)
            segments = [span_segment(rows, start, quota, slots, s, first, index) for s in range(slots)]
            assert all(seg.pass_index == pass_index for seg in segments)
            stretch = [(seg.start, seg.stop) for seg in segments if seg.num_rows]
            assert all(a[1] == b[0] for a, b in itertools.pairwise(stretch)), "a piece's stretches are not in slot order"
            covered += [(pass_index, row) for seg in segments for row in range(seg.start, seg.stop)]
            for s in range(slots):   # each slot within one row of its share of the epoch so far
                assert abs(span_taken(end, slots, s, first) - end / slots) < 1
        expected = [divmod(position, rows) for position in range(start, start + quota)]
        assert covered == expected
        start += quota


@settings(max_examples=200)
@given(st.integers(1, 60), st.integers(1, 8), st.integers(0, 5))
def test_tracks_advance_together_and_cover_the_pass(rows, slots, pass_index):
    track = tracks(rows, slots, pass_index)
    assert int(track.lengths.sum()) == rows and int(track.lengths.max() - track.lengths.min()) <= 1
    previous = consumed(track, 0)
    for position in range(rows + 1):
        now = consumed(track, position)
        assert int(now.sum()) == position and (now >= previous).all() and (now <= track.lengths).all()
        assert (abs(now - position / slots) < 1 + 1e-9).all()
        previous = now


@settings(max_examples=200)
@given(st.integers(1, 40), st.integers(1, 6), st.lists(st.integers(0, 90), min_size=1, max_size=6))
def test_epochs_read_every_row_once_per_pass_with_no_row_twice_before_all_once(rows, slots, epoch_quotas):
    seen: Counter[tuple[int, int]] = Counter()
    history = [(epoch, {"a": quota}) for epoch, quota in enumerate(epoch_quotas)]
    for epoch, quota in enumerate(epoch_quotas):
        start = positions(history, epoch)["a"]
        assert quotas_at(history, epoch)["a"] == quota
        per_slot = epoch_segments(rows, start, quota, slots)
        assert sum(seg.num_rows for segments in per_slot for seg in segments) == quota
        for segments in per_slot:
            for seg in segments:
                seen.update((seg.pass_index, row) for row in range(seg.start, seg.stop))
    total = sum(epoch_quotas)
    assert sum(seen.values()) == total and set(seen.values()) <= {1}
    assert all((p, row) in seen for p in range(total // rows) for row in range(rows))
    assert all(p <= total // rows for p, _ in seen)


@given(st.lists(st.integers(0, 300), min_size=1, max_size=4), st.integers(1, 64))
def test_batch_shares_stay_within_one_row_and_end_at_the_quotas(slot_quotas, batch_size):
    total = sum(slot_quotas)
    taken, rows = [0] * len(slot_quotas), 0
    while rows < total:
        rows = min(total, rows + batch_size)
        after = shares_after(taken, slot_quotas, rows)
        assert sum(after) == rows and all(a >= t for a, t in zip(after, taken, strict=True))
        assert all(abs(a - rows * q / total) < 1 + 1e-9 for a, q in zip(after, slot_quotas, strict=True))
        taken = after
    assert taken == slot_quotas


@settings(max_examples=300)
@given(st.lists(st.integers(0, 2000), min_size=1, max_size=6), st.integers(1, 300), st.data())
def test_a_spans_shares_are_shares_after_batch_by_batch(slot_quotas, batch_size, data):
    """``shares_along`` (a span's batches planned together: one source takes every row, the rows missing after
    rounding down placed in one sort) gives exactly ``shares_after``'s numbers, batch after batch, from any
    place a run may stand (also after batches of another size, as after a resume with other options)."""
    total = sum(slot_quotas)
    taken, rows = [0] * len(slot_quotas), 0
    for step in data.draw(st.lists(st.integers(1, 300), max_size=4)):   # where the span starts
        rows = min(total, rows + step)
        taken = shares_after(taken, slot_quotas, rows)
    span = []
    for _ in range(data.draw(st.integers(1, 20))):
        if rows == total:
            break
        rows = min(total, rows + batch_size)
        span.append(rows)
    expected, now = [], taken
    for row in span:
        now = shares_after(now, slot_quotas, row)
        expected.append(now)
    assert shares_along(taken, slot_quotas, span) == [list(column) for column in zip(*expected)] \
        if span else [[] for _ in slot_quotas]


def test_shares_along_gives_back_rows_taken_above_the_ideal_as_shares_after_does():
    """A source ahead of its ideal (taken before with other quotas): the numbers of shares_after's second loop."""
    taken, quotas_now = [5, 0, 0], [10, 10, 10]
    expected = shares_after(taken, quotas_now, 6)
    assert sum(expected) == 6 and expected[0] == 5
    assert shares_along(taken, quotas_now, [6, 9]) == [list(c) for c in zip(expected,
                                                                              shares_after(expected, quotas_now, 9))]


def test_a_segment_is_cut_from_the_splits_in_pass_order():
    table = SplitTable([0, 1, 2], [0, 0, 0], [1, 1, 1], [0, 0, 0], [10, 5, 20], [100, 50, 200])
    order = __import__("numpy").array([2, 0, 1])
    from arrowstream._mixing.quotas import Segment

    splits = segment_splits(table, order, Segment(0, 15, 32))   # rows 15..32 of (20, 10, 5)
    assert [(s.file_index, s.row_start, s.num_rows) for s in splits] == [(2, 15, 5), (0, 0, 10), (1, 0, 2)]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_mixed_span_is_each_batch_of_its_sources_shares_in_its_permutations_order(data):
    """The rows of a mixed span (one take from the sources' pieces) are, batch after batch, the batch's shares
    (source after source) in the order of its permutation: what permuting each batch of the unmixed span gives."""
    sources = data.draw(st.integers(1, 4))
    batches = data.draw(st.integers(1, 6))
    steps = [data.draw(st.lists(st.integers(0, 5), min_size=batches, max_size=batches)) for _ in range(sources)]
    sizes = [sum(step[b] for step in steps) for b in range(batches)]
    if min(sizes) == 0:
        return
    marks = [list(itertools.accumulate(step)) for step in steps]
    start, pieces = 0, []
    for source_marks in marks:   # each source's rows as pieces cut anywhere; ids say where a row came from
        rows = pa.record_batch({"id": np.arange(start, start + source_marks[-1])})
        cuts = sorted(data.draw(st.lists(st.integers(0, rows.num_rows), max_size=3)))
        bounds = [0, *cuts, rows.num_rows]
        pieces.append([rows.slice(lo, hi - lo) for lo, hi in itertools.pairwise(bounds) if hi > lo])
        start += source_marks[-1]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    orders = [rng.permutation(size) for size in sizes]
    plain = in_batch_order(pieces, marks).column("id").to_numpy()
    expected = np.concatenate([plain[at:at + size][order] for at, size, order
                               in zip(itertools.accumulate([0, *sizes]), sizes, orders)])
    assert mixed(pieces, batch_order(marks, orders)).column("id").to_numpy().tolist() == expected.tolist()


@given(st.lists(st.integers(0, 300), min_size=1, max_size=6))
def test_an_even_order_spreads_every_source_over_the_batch(shares):
    """Row i of a source of n rows goes where (i + 1/2) / n falls among all rows' fractions, the earlier source
    first on a tie; so every stretch from the batch's start holds each source's share of it within
    (sources + 1) / 2 rows (a sort, not a loop: a batch of many sources and rows stays cheap)."""
    order = even_order(tuple(shares))
    source_of = np.repeat(np.arange(len(shares)), shares)
    row_in_source = np.concatenate([np.arange(n) for n in shares]) if sum(shares) else np.zeros(0, np.int64)
    keys = sorted(range(sum(shares)), key=lambda r: (float((row_in_source[r] + 0.5) / shares[source_of[r]]),
                                                      int(source_of[r])))
    assert order.tolist() == keys
    assert sorted(order.tolist()) == list(range(sum(shares)))   # a permutation of the batch's rows
    placed = source_of[order]
    total = sum(shares)
    for source, n in enumerate(shares):
        if total:
            counts = np.concatenate([[0], np.cumsum(placed == source)])
            ideal = np.arange(total + 1) * n / total
            assert np.abs(counts - ideal).max() <= (len(shares) + 1) / 2
    assert not order.flags.writeable   # cached: shared by every batch of these shares


@given(st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=6), min_size=1, max_size=4).filter(
    lambda steps: len({len(step) for step in steps}) == 1))
def test_a_spans_even_orders_are_each_batchs_shares_even_order(steps):
    marks = [list(itertools.accumulate(step)) for step in steps]
    expected = [even_order(tuple(step[batch] for step in steps)) for batch in range(len(steps[0]))]
    assert [order.tolist() for order in even_orders(marks)] == [order.tolist() for order in expected]
    if sum(len(order) for order in expected):   # the span's order: cached, the one of its batches' orders
        span = even_span_order(marks)
        assert span.tolist() == batch_order(marks, expected).tolist()
        assert even_span_order([list(m) for m in marks]) is span and not span.flags.writeable


@pytest.mark.parametrize("small_take", [0, SMALL_TAKE], ids=["from the pieces", "joined first"])
def test_a_mixed_span_of_every_kind_of_column_is_the_one_the_concatenated_rows_give(monkeypatch, small_take):
    """One take from the sources' pieces as they are (a chunked table), or, for a small span, from them joined:
    the same rows and types as concatenating them first, for strings, views, lists, structs, dictionaries and
    nulls."""
    monkeypatch.setattr(span_module, "SMALL_TAKE", small_take)
    def rows(start: int, count: int) -> pa.RecordBatch:
        ids = range(start, start + count)
        return pa.record_batch({
            "id": pa.array(ids, pa.int64()), "s": pa.array([f"row {i}" for i in ids]),
            "l": pa.array([[i] * (i % 3) for i in ids], pa.list_(pa.int32())),
            "st": pa.array([{"a": i, "b": None if i % 2 else str(i)} for i in ids]),
            "d": pa.array(["x" if i % 2 else "y" for i in ids]).dictionary_encode(),
            "n": pa.array([None if i % 4 == 0 else i for i in ids], pa.float64()),
            "v": pa.array([f"view {i}" for i in ids], pa.string_view())})
    pieces = [[rows(0, 7), rows(7, 5)], [rows(100, 6)], [rows(200, 2), rows(202, 4)]]
    marks = [[4, 8, 12], [2, 4, 6], [2, 4, 6]]
    orders = even_orders(marks)
    got = mixed(pieces, even_span_order(marks))
    plain = in_batch_order(pieces, marks)
    expected = take(pa.Table.from_batches([plain]), np.concatenate([order + 8 * batch for batch, order
                                                                    in enumerate(orders)])).to_batches()[0]
    assert got.equals(expected)
    assert got.schema == plain.schema
