"""A part of a held source read whole at once: its rows' order and the stream's cursors, by arithmetic.

A small source that a mixture reads in many passes (:mod:`arrowstream._worker.held`) has parts of a few rows
each; reading each through the pipeline (interleaved lanes, a shuffle window) costs far more than its
rows. Where that pipeline's order is simple, a part is read here instead, with the same rows in the same
order and the same cursors after each row:

* with a shuffle buffer, a part of at most ``buffer_rows`` rows is one window: its rows in reading order,
  permuted by the window's seed (:func:`~arrowstream._core.window.shuffle_windows`);
* reading order is the part's splits one after another with one lane (``interleave=1``), or its one
  split's rows with any number of lanes (one lane opens it; blocks only move the cursor's block offset).

Everything else (more windows, several lanes over several splits, a part that starts inside a window)
is read through the pipeline. A source of one split laid out in spans, that no part of which is more than
a window, is read many parts at once (:func:`span_take`: each part's rows and window order computed
together, the cursors only where a batch ends). ``tests/test_mix_bulk.py`` checks rows and cursors
against the pipeline.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from .._core.cursor import Cursor
from .._core.hashing import permutations
from .parts import Part, Parts, SpanParts

if TYPE_CHECKING:
    import pyarrow as pa

    from .._core.plan_types import Split


class HeldSource(Protocol):
    """A source's rows held in this process as one table (what ``arrowstream._worker.held`` reads)."""

    @property
    def table(self) -> pa.Table: ...

    def first_row(self, split: Split) -> int: ...

    def indices(self, splits: tuple[Split, ...]) -> npt.NDArray[np.int64]: ...


def bulk_readable(part: Part, interleave: int, buffer_rows: int) -> bool:
    """Whether ``part`` is read here: from its start, one window (or none), one lane's order."""
    return part.start is None and (interleave == 1 or len(part.splits) == 1) and \
        (buffer_rows == 0 or part.rows <= buffer_rows)


def bulk_order(source: HeldSource, part: Part, buffer_rows: int) -> npt.NDArray[np.int64]:
    """The held table's rows of ``part`` in the order the pipeline hands them out."""
    rows = source.indices(part.splits)
    if buffer_rows and part.rows > 1:
        rows = rows[permutations(part.rows, [part.seeds(0)])[0]]
    return rows


def spans_readable(parts: Parts, source: HeldSource | None, buffer_rows: int) -> SpanParts | None:
    """``parts`` when every one of them is read many at once (:func:`span_take`): a held source of one split
    laid out in spans, whose parts are no more than a window each."""
    if source is None or not isinstance(parts, SpanParts) or parts.only is None:
        return None
    return parts if buffer_rows == 0 or parts.only.num_rows <= buffer_rows else None


def span_take(parts: SpanParts, source: HeldSource, taken: int, wanted: int,
              buffer_rows: int) -> npt.NDArray[np.int64]:
    """The held table's rows of the slot's rows ``[taken, taken + wanted)`` of ``parts`` (one split, spans), in
    the order the pipeline hands them out: every part's rows (a range of the split) in its window's order."""
    assert parts.only is not None
    first, last = parts.index_of_row(taken), parts.index_of_row(taken + wanted - 1)
    pieces = np.arange(first, last + 1, dtype=np.int64)
    starts, sizes = parts.segments(pieces)
    bases = source.first_row(parts.only) + starts   # the table's row of each part's first row
    ends = np.cumsum(sizes)
    out = np.empty(int(ends[-1]), dtype=np.int64)
    for size in np.unique(sizes):
        if size == 0:
            continue
        chosen = sizes == size
        order = np.arange(size, dtype=np.int64)[None, :]
        if buffer_rows and size > 1:   # one window: its rows by its seed's permutation
            order = permutations(int(size), parts.first_window_seeds(pieces[chosen]))
        out[(ends[chosen] - size)[:, None] + np.arange(size)] = bases[chosen][:, None] + order
    skip = taken - parts.rows_before(first)
    return out[skip:skip + wanted]


class BulkCursors:
    """The pipeline's cursor after each row of a part read here."""

    def __init__(self, split_rows: Sequence[int], interleave: int, buffer_rows: int, block_size: int | None) -> None:
        """The cursors of a part whose splits hold ``split_rows`` rows."""
        self._ends = list(itertools.accumulate(split_rows))
        self._rows, self._block_size, self._buffer_rows = self._ends[-1], block_size, buffer_rows
        self._one_lane = interleave == 1

    @classmethod
    def of_part(cls, part: Part, interleave: int, buffer_rows: int, block_size: int | None) -> BulkCursors:
        return cls([split.num_rows for split in part.splits], interleave, buffer_rows, block_size)

    def _read(self, rows: int) -> Cursor:
        """The interleaved stream's cursor once its first ``rows`` rows (> 0) are handed out."""
        if self._one_lane:
            split = bisect.bisect_left(self._ends, rows)   # the split of the last row handed out
            before = self._ends[split - 1] if split else 0
            return Cursor(((split, rows - before),), split + 1)
        assert self._block_size is not None
        return Cursor(((0, rows),), 1, 0, rows % self._block_size)

    def after(self, rows: int) -> Cursor:
        """The cursor once the part's first ``rows`` rows (> 0) are handed out."""
        if not self._buffer_rows:
            return self._read(rows)
        if rows < self._rows:   # inside the window: where it starts (the part's start), and rows handed out
            return Cursor(((0, 0),), 1, 0, 0, 0, rows)
        end = self._read(rows)
        return Cursor(end.lanes, end.next_split_index, end.turn_index, end.block_offset, 1, 0)
