"""A mixture span's rows in batch order: each source's rows of the span (taken in one pass) cut per batch.

A span of a slot's batches holds, batch after batch, the first source's share of the batch, then the next
source's (see :class:`~arrowstream._mix_stream.MixStream`). Each source's rows of the whole span come as the
pieces they were read in, with ``marks``: how many of them the span has given after each batch.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa


def in_batch_order(pieces: list[list[pa.RecordBatch]], marks: list[list[int]]) -> pa.RecordBatch:
    """The span's rows batch after batch, each batch its sources' shares in source order: zero-copy slices,
    one concatenation."""
    cut = [_cut(source_pieces, source_marks) for source_pieces, source_marks in zip(pieces, marks, strict=True)]
    parts = [part for batch in range(len(marks[0])) for source_cut in cut for part in source_cut[batch]]
    return parts[0] if len(parts) == 1 else pa.concat_batches(parts)


def mixed(pieces: list[list[pa.RecordBatch]], marks: list[list[int]],
          permutations: list[npt.NDArray[np.int64]]) -> pa.RecordBatch:
    """:func:`in_batch_order`'s rows with each batch's rows in the order of its permutation, gathered in one
    take from the sources' pieces (no concatenation first: one copy of the rows, not two)."""
    starts = np.cumsum([0, *(source_marks[-1] for source_marks in marks)])
    order = []
    for batch, permutation in enumerate(permutations):
        rows = np.concatenate([np.arange(start + (source_marks[batch - 1] if batch else 0), start + source_marks[batch])
                               for start, source_marks in zip(starts[:-1], marks, strict=True)])
        order.append(rows[permutation])
    table = pa.Table.from_batches([piece for source_pieces in pieces for piece in source_pieces])
    return table.take(np.concatenate(order)).combine_chunks().to_batches()[0]


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
