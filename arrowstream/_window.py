"""The record-level shuffle buffer: consecutive windows of the stream, each permuted on its own.

A worker's stream (after interleaving) is cut into windows of ``buffer_rows`` rows; window ``w``
is handed out in the order of a permutation seeded by ``(seed, epoch, slot, w)``. A row moves at
most one window away from where it was read, every row of a window is equally likely at every
place in it, and the quality is the same late in the epoch as early.

Unlike a reservoir buffer, whose contents depend on every draw before, a window is rebuilt from
its start: the cursor keeps where the window starts in the stream and how many of its rows were
handed out, so a resume re-reads at most one window and never stores a row.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator

import pyarrow as pa

from ._cursor import Cursor, Run
from ._hashing import permutation


def _after(begin: Cursor, end: Cursor, window: int, size: int, rows: int) -> Cursor:
    if rows < size:
        return dataclasses.replace(begin, window=window, window_rows=rows)
    return dataclasses.replace(end, window=window + 1, window_rows=0)


def windowed_runs(source: Callable[[Cursor], Iterator[Run]], buffer_rows: int, window_seed: Callable[[int], int],
                  start: Cursor) -> Iterator[Run]:
    """The rows of ``source`` from ``start`` on, shuffled window by window (one run per window).

    ``source(cursor)`` gives the unshuffled stream from a cursor; ``window_seed(w)`` the seed of
    window ``w``; ``start.window_rows`` rows of the first window were already handed out.
    """
    window, skip = start.window, start.window_rows
    begin = dataclasses.replace(start, window=0, window_rows=0)
    runs = source(begin)
    held: Run | None = None
    while True:
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
        if size == 0:
            return
        # one table, one chunk per column: its take is faster than a record batch's here
        taken = pa.Table.from_batches(parts).combine_chunks().take(permutation(size, window_seed(window)))
        del parts
        chunks = taken.to_batches()
        shuffled = chunks[0] if len(chunks) == 1 else pa.concat_batches(chunks)
        yield Run(shuffled, functools.partial(_after, begin, end, window, size)).tail(skip)
        window, skip, begin = window + 1, 0, end
