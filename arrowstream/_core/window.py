"""The record-level shuffle buffer: consecutive windows of the stream, each permuted on its own.

A worker's stream (after interleaving) is cut into windows of ``buffer_rows`` rows; window ``w``
is handed out in the order of a permutation seeded by ``(seed, epoch, slot, w)``. A row moves at
most one window away from where it was read, every row of a window is equally likely at every
place in it, and the quality is the same late in the epoch as early.

Unlike a reservoir buffer, whose contents depend on every draw before, a window is rebuilt from
its start: the cursor keeps where the window starts in the stream and how many of its rows were
handed out, so a resume re-reads at most one window and never stores a row.

A window's rows stay as they were read (slices of the reader's batches) and are gathered into
shuffled order a run at a time, so memory holds about one window plus a run. When the window
came in many small pieces (interleave hands out small blocks), it is first copied into one piece,
which is faster to gather from and holds two windows for a moment.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .cursor import Cursor, Run
from .hashing import permutations
from .take import take

RUN_ROWS = 16_384  # rows of a window copied into shuffled order at a time
SMALL_PART_ROWS = 4_096  # a window read in pieces this small on average is copied into one first


def _cursor_after_rows(begin: Cursor, end: Cursor, window: int, size: int, rows: int) -> Cursor:
    """The cursor once ``rows`` of window ``window`` (``size`` rows, from ``begin`` to ``end``) are out."""
    # built field by field: this runs for every batch (every source's, in a mixture); dataclasses.replace is slow
    if rows < size:
        return Cursor(begin.lanes, begin.next_split_index, begin.turn_index, begin.block_offset, window, rows,
                      begin.replay_index, begin.replay_offset)
    return Cursor(end.lanes, end.next_split_index, end.turn_index, end.block_offset, window + 1, 0, end.replay_index,
                  end.replay_offset)


def _fill(runs: Iterator[Run], held: Run | None, buffer_rows: int,
          begin: Cursor) -> tuple[pa.Table | None, Cursor, Run | None]:
    """The next window's rows in stream order (no copy), the cursor after them, and the rest of
    the run that did not fit; ``None`` rows when the stream is done."""
    parts: list[pa.RecordBatch] = []
    size, end = 0, begin
    while size < buffer_rows:
        run = held or next(runs, None)
        held = None
        if run is None:
            break
        if run.num_rows > buffer_rows - size:
            held = run.tail(buffer_rows - size)
            run = run.head(buffer_rows - size)
        if run.num_rows:
            parts.append(run.batch)
            size += run.num_rows
        end = run.after(run.num_rows)
    if not parts:
        return None, end, held
    rows = pa.Table.from_batches(parts)
    if len(parts) * SMALL_PART_ROWS > size:
        # gathering from many small pieces (interleave's blocks) is slow: one copy first is faster
        rows = rows.combine_chunks()
    return rows, end, held


def _shuffled(rows: pa.Table, order: npt.NDArray[np.int64], after: Callable[[int], Cursor], skip: int,
              run_rows: int) -> Iterator[Run]:
    """The window's rows in ``order``, copied ``run_rows`` at a time as they are needed, so a
    window is in memory about once (its rows as read) plus the run being handed out."""
    for start in range(skip - skip % run_rows, len(order), run_rows):
        chunks = take(rows, order[start:start + run_rows]).to_batches()
        run = Run(chunks[0] if len(chunks) == 1 else pa.concat_batches(chunks), after, start)
        yield run.tail(skip - start) if start < skip else run


def shuffle_windows(runs: Iterator[Run], buffer_rows: int, window_seed: Callable[[int], int], start: Cursor,
                    run_rows: int = RUN_ROWS) -> Iterator[Run]:
    """The rows of ``runs`` (the unshuffled stream from ``start``), shuffled window by window.

    ``window_seed(w)`` is the seed of window ``w``; ``start.window_offset`` rows of the first
    window were already handed out.
    """
    window, skip, begin = start.window_index, start.window_offset, start
    held: Run | None = None
    while True:
        rows, end, held = _fill(runs, held, buffer_rows, begin)
        if rows is None:
            return
        after = functools.partial(_cursor_after_rows, begin, end, window, rows.num_rows)
        order = permutations(rows.num_rows, [window_seed(window)])[0]   # permutation()'s order, sorted faster
        yield from _shuffled(rows, order, after, skip, run_rows)
        del rows
        window, skip, begin = window + 1, 0, end
