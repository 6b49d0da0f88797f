"""A part of a held source read whole at once: its rows' order and the stream's cursors, by arithmetic.

A small source that a mixture reads in many passes (:mod:`arrowstream._held`) has parts of a few rows
each; reading each through the pipeline (interleaved lanes, a shuffle window) costs far more than its
rows. Where that pipeline's order is simple, a part is read here instead, with the same rows in the same
order and the same cursors after each row:

* with a shuffle buffer, a part of at most ``buffer_rows`` rows is one window: its rows in reading order,
  permuted by the window's seed (:func:`~arrowstream._window.shuffle_windows`);
* reading order is the part's splits one after another with one lane (``interleave=1``), or its one
  split's rows with any number of lanes (one lane opens it; blocks only move the cursor's block offset).

Everything else (more windows, several lanes over several splits, a part that starts inside a window)
is read through the pipeline. ``tests/test_mix_bulk.py`` checks rows and cursors against it.
"""

from __future__ import annotations

import bisect
import itertools

import numpy as np
import numpy.typing as npt

from ._cursor import Cursor
from ._hashing import permutations
from ._held import HeldSource
from ._mix_parts import Part


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


class BulkCursors:
    """The pipeline's cursor after each row of a part read here."""

    def __init__(self, part: Part, interleave: int, buffer_rows: int, block_size: int | None) -> None:
        self._ends = list(itertools.accumulate(split.num_rows for split in part.splits))
        self._rows, self._block_size, self._buffer_rows = part.rows, block_size, buffer_rows
        self._one_lane = interleave == 1

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
