"""The runs a slot's stream reads (:func:`open_runs`) and what it holds of them (:class:`RunQueue`): its rows
(interleaved, shuffled), read ahead of the rows handed out, and the cursor past the last row handed out (see
:mod:`arrowstream._core.cursor`).

Every slot is read by the one stream, ``arrowstream._mixing.stream.MixStream``, over these: a mixture's slot, a
static dataset slot (``arrowstream._layout.share_parts``) and a dynamic worker's leases
(``arrowstream._layout.leased_parts``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa

from .cursor import Cursor, Run
from .interleave import PieceReader, block_size_for, interleave_runs
from .plan_types import Split
from .window import RUN_ROWS, shuffle_windows


def open_runs(readers: Sequence[PieceReader], splits: Sequence[Split], *, batch_size: int, interleave: int,
              buffer_rows: int, window_seed: Callable[[int], int], start: Cursor,
              run_rows: int = RUN_ROWS) -> Iterator[Run]:
    """A worker's rows from ``start`` on: ``interleave`` splits at a time, shuffled by windows of
    ``buffer_rows`` rows when it is above 0. A pure function of the rows each split yields;
    ``run_rows`` (how many shuffled rows are gathered at a time) changes nothing but memory."""
    runs = interleave_runs(readers, splits, block_size_for(batch_size, interleave), start)
    if buffer_rows == 0:
        return runs
    return shuffle_windows(runs, buffer_rows, window_seed, start, run_rows)


class RunQueue:
    """Runs read ahead of the rows handed out, and the cursor past the last row handed out."""

    def __init__(self, runs: Iterator[Run] | None, cursor: Cursor) -> None:
        self._reading = runs
        self._held: deque[Run] = deque()
        self.buffered = 0
        self._cursor: Cursor | None = cursor
        self._after: tuple[Run, int] | None = None  # the cursor, computed when asked: past rows of this run

    @property
    def cursor(self) -> Cursor:
        """Where the stream stands: past the last row handed out."""
        if self._cursor is None:
            assert self._after is not None
            run, taken = self._after
            self._cursor = run.after(taken)
        return self._cursor

    def _stand(self, cursor: Cursor | None, after: tuple[Run, int] | None = None) -> None:
        self._cursor, self._after = cursor, after

    def fill(self, rows: int) -> None:
        """Read runs until ``rows`` rows are held or the runs end."""
        while self.buffered < rows and self._reading is not None:
            run = next(self._reading, None)
            if run is None:
                self._reading = None
            elif run.num_rows == 0:
                if not self._held:  # nothing held back: the filtered-out rows are behind us
                    self._stand(run.after(0))
            else:
                self._held.append(run)
                self.buffered += run.num_rows

    def take(self, num_rows: int) -> pa.RecordBatch:
        """The next ``num_rows`` held rows (``fill`` first), the cursor moved past them."""
        parts: list[pa.RecordBatch] = []
        remaining = num_rows
        while remaining:
            run = self._held[0]
            if run.num_rows <= remaining:
                self._held.popleft()
                parts.append(run.batch)
                remaining -= run.num_rows
                last, taken = run, run.num_rows
            else:
                parts.append(run.batch.slice(0, remaining))
                self._held[0] = run.tail(remaining)
                last, taken, remaining = run, remaining, 0
        self.buffered -= num_rows
        self._stand(None, (last, taken))
        return parts[0] if len(parts) == 1 else pa.concat_batches(parts)

    def take_marked(self, num_rows: int, marks: Sequence[int]) -> tuple[list[pa.RecordBatch], list[Cursor]]:
        """The next ``num_rows`` held rows (``fill`` first) as the pieces they are held in (zero-copy), and
        the cursor past the first ``marks[i]`` of them for each mark (rising, each in 1..num_rows): what
        :meth:`take` of the marks' differences, one after another, would give, in one pass."""
        pieces: list[pa.RecordBatch] = []
        cursors: list[Cursor] = []
        done, mark_index = 0, 0
        while done < num_rows:
            run = self._held[0]
            rows = min(run.num_rows, num_rows - done)
            # a mark's last row is in this run: the cursor is this run's (the next run may start elsewhere)
            while mark_index < len(marks) and marks[mark_index] <= done + rows:
                cursors.append(run.after(marks[mark_index] - done))
                mark_index += 1
            if rows == run.num_rows:
                self._held.popleft()
                pieces.append(run.batch)
            else:
                pieces.append(run.batch.slice(0, rows))
                self._held[0] = run.tail(rows)
            last, taken = run, rows
            done += rows
        self.buffered -= num_rows
        self._stand(cursors[-1] if mark_index and marks[mark_index - 1] == num_rows else None, (last, taken))
        return pieces, cursors

    def stop(self, cursor: Cursor) -> None:
        """Drop what is held, read no more, and stand at ``cursor``."""
        self._held.clear()
        self.buffered = 0
        self._reading = None
        self._stand(cursor)
