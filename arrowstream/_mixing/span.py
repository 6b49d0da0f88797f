"""A mixture span's rows in batch order: each source's rows of the span (taken in one pass) cut per batch.

A span of a slot's batches holds, batch after batch, the first source's share of the batch, then the next
source's (see :class:`~arrowstream._mixing.stream.MixStream`). Each source's rows of the whole span come as the
pieces they were read in, with ``marks``: how many of them the span has given after each batch.

With a shuffle buffer the sources are mixed inside each batch: spread evenly (:func:`even_order`, mixture
states from version 3 on) or, for a run resumed from an older state, by the batch's seeded permutation.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .._core.take import take


def in_batch_order(pieces: list[list[pa.RecordBatch]], marks: list[list[int]]) -> pa.RecordBatch:
    """The span's rows batch after batch, each batch its sources' shares in source order: zero-copy slices,
    one concatenation."""
    cut = [_cut(source_pieces, source_marks) for source_pieces, source_marks in zip(pieces, marks, strict=True)]
    parts = [part for batch in range(len(marks[0])) for source_cut in cut for part in source_cut[batch]]
    return parts[0] if len(parts) == 1 else pa.concat_batches(parts)


def batch_order(marks: Sequence[Sequence[int]], permutations: Sequence[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    """Where each row of the mixed span comes from, as an index into the sources' rows laid end to end
    (the first source's rows of the span, then the next source's): batch after batch, the batch's rows
    (its sources' shares in source order) in the order of its permutation."""
    taken = np.asarray(marks, dtype=np.int64)                        # (sources, batches): rows after each batch
    before = np.zeros_like(taken)
    before[:, 1:] = taken[:, :-1]
    starts = np.zeros(len(marks), np.int64)                          # where each source's rows begin
    np.cumsum(taken[:-1, -1], out=starts[1:])
    first = (starts[:, None] + before).T.ravel()                     # each (batch, source) stretch: first row, rows
    lengths = (taken - before).T.ravel()
    stretch_at = np.zeros_like(lengths)
    np.cumsum(lengths[:-1], out=stretch_at[1:])
    rows = np.repeat(first - stretch_at, lengths)
    rows += np.arange(len(rows), dtype=np.int64)
    sizes = [len(permutation) for permutation in permutations]
    batch_at = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=batch_at[1:])
    where = np.concatenate(permutations)
    where += np.repeat(batch_at, sizes)
    order: npt.NDArray[np.int64] = rows[where]
    return order


@functools.lru_cache(maxsize=128)   # at most 128 x batch_size x 8 bytes (1 MiB for batches of 1,024 rows)
def even_order(shares: tuple[int, ...]) -> npt.NDArray[np.int64]:
    """The order of a batch's rows (its sources' ``shares`` in source order) that spreads every source
    evenly over the batch: row ``i`` of a source of ``n`` rows goes where ``(i + 1/2) / n`` falls among all
    the rows' such fractions (ties, which are exact in floating point: the earlier source first). Any
    stretch of ``k`` rows from the batch's start then holds each source's share of ``k`` within
    ``(sources + 1) / 2`` rows, so a batch cut into micro-batches cuts every source in proportion.
    Cached: a mixture's batches have few distinct shares (each source's is its ideal rounded down or up)."""
    fractions = np.concatenate([(np.arange(n) + 0.5) / n for n in shares if n] or [np.zeros(0)])
    order = np.argsort(fractions, kind="stable").astype(np.int64)
    order.flags.writeable = False
    return order


def even_orders(marks: Sequence[Sequence[int]]) -> list[npt.NDArray[np.int64]]:
    """:func:`even_order` of each batch of a span (``marks``: each source's rows after each batch)."""
    taken = np.asarray(marks, dtype=np.int64)
    shares = np.diff(taken, axis=1, prepend=0).T.tolist()
    return [even_order(tuple(batch)) for batch in shares]


def even_span_order(marks: list[list[int]]) -> npt.NDArray[np.int64]:
    """:func:`batch_order` of a span whose batches are each in :func:`even_order`. Cached: with steady weights
    a few patterns of shares repeat from span to span (weights 0.5 / 0.3 / 0.2: five)."""
    return _even_span_order(tuple(tuple(source_marks) for source_marks in marks))


@functools.lru_cache(maxsize=16)   # at most 16 x batches_per_transfer x batch_size x 8 bytes (2 MiB by default)
def _even_span_order(marks: tuple[tuple[int, ...], ...]) -> npt.NDArray[np.int64]:
    order = batch_order(marks, even_orders(marks))
    order.flags.writeable = False
    return order


SMALL_TAKE = 2048
"""Rows of a span up to which :func:`mixed` joins the pieces before it takes the rows (one copy more, but one
pass over each column instead of one per piece: cheaper for a batch or two; a bigger span takes from the pieces)."""


def mixed(pieces: list[list[pa.RecordBatch]], order: npt.NDArray[np.int64]) -> pa.RecordBatch:
    """The sources' pieces laid end to end (:func:`batch_order`'s rows), row ``order[i]`` made row ``i``: one
    take from the pieces as they are (no copy first), or, for a small span (:data:`SMALL_TAKE`), from them
    joined."""
    flat = [piece for source_pieces in pieces for piece in source_pieces]
    if len(order) <= SMALL_TAKE:
        joined = flat[0] if len(flat) == 1 else pa.concat_batches(flat)
        try:
            return joined.take(order)
        except pa.ArrowNotImplementedError:   # a view type (string_view, ...): take() gathers it
            pass
    rows = take(pa.Table.from_batches(flat), order)
    batches = rows.to_batches()
    # (a take may leave a column in pieces: one copy then)
    return batches[0] if len(batches) == 1 else rows.combine_chunks().to_batches()[0]


def _cut(pieces: list[pa.RecordBatch], marks: list[int]) -> list[list[pa.RecordBatch]]:
    """``pieces`` (rows in order) cut at each of ``marks`` (rising row counts): the pieces of each stretch."""
    stretches: list[list[pa.RecordBatch]] = []
    index, offset, start = 0, 0, 0
    for mark in marks:
        stretch = []
        need = mark - start
        while need:
            piece = pieces[index]
            rows = min(need, piece.num_rows - offset)
            stretch.append(piece if rows == piece.num_rows else piece.slice(offset, rows))
            need -= rows
            offset += rows
            if offset == piece.num_rows:
                index, offset = index + 1, 0
        stretches.append(stretch)
        start = mark
    return stretches
