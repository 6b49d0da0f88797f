"""The runs a slot's stream reads (:func:`open_runs`, :class:`RunQueue`), and a dynamic worker's epoch
(:class:`EpochStream`): its rows (interleaved, shuffled) assembled into full batches, a cursor kept.

A static dataset slot and a mixture's slot are read by ``arrowstream._mixing.stream.MixStream`` over the same
runs; ``EpochStream`` stays the stream of ``assignment="dynamic"`` (leases taken as the worker goes, the last rows
stitched with other workers').

Batches hold exactly ``batch_size`` rows across split and file boundaries; only the last one of
an epoch may be short, and ``drop_last`` drops it (and counts what it dropped). The cursor is
the position just past the last row handed out (see :mod:`arrowstream._core.cursor`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from .._state.identity import DataIdentity
from .._state.worker import WorkerState
from .cursor import Cursor, Position, Run
from .interleave import PieceReader, block_size_for, interleave_runs
from .order import Slot
from .plan_types import Split
from .window import RUN_ROWS, shuffle_windows

logger = logging.getLogger("arrowstream")


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


class EpochStream:
    """Batches of one slot in one epoch, from a cursor on; :meth:`state` is where it stands."""

    def __init__(self, *, runs: Iterator[Run], end: Cursor, batch_size: int,
                 drop_last: bool, max_batches: int | None = None, convert: Callable[[pa.RecordBatch], Any], data: DataIdentity,
                 options: dict[str, Any], epoch: int, slot: Slot, start: WorkerState,
                 last_pieces: Callable[[], list[tuple[int, Any]]] | None = None) -> None:
        self._end = end
        # assignment='dynamic' with workers: how the last rows (fewer than a batch) are handed out, as
        # pieces of (rows, tag); a tagged piece is stitched with other workers' (see _layout.leases.last_pieces)
        self._last_pieces = last_pieces
        self._pieces: deque[tuple[int, Any]] | None = None
        self._elastic = start.elastic
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._max_batches = max_batches
        self._convert = convert
        self._data = data
        self._options = options
        self._epoch = epoch
        self._slot = slot
        self._rows, self._batches, self._rows_dropped = start.rows, start.batches, start.rows_dropped
        self._complete = start.epoch_complete
        self._queue = RunQueue(None if self._complete else runs, start.cursor)

    def _finish(self) -> None:
        if self._max_batches is not None and self._batches >= self._max_batches:
            logger.info("even_batches: rank %d worker %d stops after %d batch(es) of epoch %d; the rest of its "
                        "rows are trimmed this epoch", self._slot.rank, self._slot.worker_id, self._batches,
                        self._epoch)
        elif self._drop_last and self._queue.buffered:
            self._rows_dropped += self._queue.buffered
            logger.info("drop_last: rank %d worker %d dropped its last %d row(s) of epoch %d",
                        self._slot.rank, self._slot.worker_id, self._queue.buffered, self._epoch)
        self._queue.stop(self._end)
        self._complete = True

    def __iter__(self) -> EpochStream:
        return self

    def next_record(self) -> pa.RecordBatch:
        """The next batch as Arrow, before conversion."""
        if self._complete:
            raise StopIteration
        if self._max_batches is not None and self._batches >= self._max_batches:
            self._finish()
            raise StopIteration
        queue = self._queue
        queue.fill(self._batch_size)
        if queue.buffered == 0 or (self._drop_last and queue.buffered < self._batch_size):
            self._finish()
            raise StopIteration
        rows = min(self._batch_size, queue.buffered)
        if rows < self._batch_size and self._last_pieces is not None:   # the last rows: read to the end
            rows, tag = self._next_piece()
            if tag is not None:   # stitched with other workers' rows: next_piece() hands it out
                raise StopIteration
            self._pieces.popleft()   # type: ignore[union-attr]
        return self._take(rows)

    def _take(self, rows: int) -> pa.RecordBatch:
        batch = self._queue.take(rows)
        self._rows += batch.num_rows
        self._batches += 1
        return batch

    def _next_piece(self) -> tuple[int, Any]:
        if self._pieces is None:
            assert self._last_pieces is not None
            self._pieces = deque(self._last_pieces())
            if sum(rows for rows, _ in self._pieces) != self._queue.buffered:
                raise AssertionError(f"worker {self._slot.worker_id} holds {self._queue.buffered} last row(s), its "
                                     f"leases leave {sum(rows for rows, _ in self._pieces)}")
        return self._pieces[0]

    def next_piece(self) -> tuple[Any, pa.RecordBatch] | None:
        """The next piece of this worker's last rows that other workers' rows make a batch with, and
        its tag; None when the next rows (if any) are not such a piece (see ``_layout.leases.last_pieces``)."""
        if self._complete or self._last_pieces is None:
            return None
        self._queue.fill(self._batch_size)
        if not 0 < self._queue.buffered < self._batch_size:
            return None
        rows, tag = self._next_piece()
        if tag is None:
            return None
        self._pieces.popleft()   # type: ignore[union-attr]
        return tag, self._take(rows)

    def __next__(self) -> Any:
        return self._convert(self.next_record())

    def next_span(self, max_batches: int) -> tuple[pa.RecordBatch, list[int], list[Position], None]:
        """Up to ``max_batches`` next batches as one Arrow record batch, unconverted, with the
        row count of each batch and the position after it (and None: one source, as a mixture's
        stream answers with its sources' rows). The batches are exactly those ``next()`` would
        give; taking them together lets the caller convert each column once."""
        if self._complete:
            raise StopIteration
        if self._max_batches is not None:  # never read rows that even_batches trims
            max_batches = min(max_batches, self._max_batches - self._batches)
        self._queue.fill(self._batch_size * max(max_batches, 0))
        parts: list[pa.RecordBatch] = []
        positions: list[Position] = []
        while len(parts) < max(max_batches, 1):  # at the limit, the first next() ends the epoch
            try:
                parts.append(self.next_record())
            except StopIteration:
                break
            positions.append(self.position())
        if not parts:
            raise StopIteration
        span = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
        return span, [p.num_rows for p in parts], positions, None

    def holds(self, rows: int) -> bool:
        """Whether at least ``rows`` rows are left in the epoch (reads ahead as far as needed)."""
        if self._complete:
            return False
        self._queue.fill(rows)
        return self._queue.buffered >= rows

    @property
    def batches(self) -> int:
        return self._batches

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def epoch(self) -> int:
        return self._epoch

    def position(self) -> Position:
        return Position(self._queue.cursor, self._rows, self._batches, self._rows_dropped)

    def state(self, position: Position | None = None) -> WorkerState:
        """The worker's state where the stream stands now, or at ``position`` (one of :meth:`position`'s,
        taken before the stream went on: its epoch is not complete there)."""
        if position is None:
            cursor, rows, batches, rows_dropped = self._queue.cursor, self._rows, self._batches, self._rows_dropped
            complete = self._complete
        else:
            cursor, rows, batches, rows_dropped = position.cursor, position.rows, position.batches, position.rows_dropped
            complete = False
        return WorkerState(
            data=self._data, options=self._options, epoch=self._epoch, slot=self._slot, cursor=cursor, rows=rows,
            batches=batches, rows_dropped=rows_dropped, epoch_complete=complete, elastic=self._elastic)
