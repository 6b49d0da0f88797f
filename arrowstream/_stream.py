"""One worker's epoch: splits read in order, rows assembled into full batches, a cursor kept.

The cursor is the source position just past the last row handed out: (position of the split
in this slot's reading order, source row offset inside the split). Batches hold exactly
``batch_size`` rows across split and file boundaries; only the last one of an epoch may be
short, and ``drop_last`` drops it (and counts what it dropped).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from ._order import Slot
from ._planning import Split
from ._reader import Piece, SplitReader
from ._state import DataIdentity, WorkerState
from ._storage import logger
from ._transport import Position


class EpochStream:
    """Batches of one slot in one epoch, from a cursor on; :meth:`state` is where it stands."""

    def __init__(self, *, reader: SplitReader, splits: list[Split], batch_size: int, drop_last: bool,
                 convert: Callable[[pa.RecordBatch], Any], data: DataIdentity, options: dict[str, Any],
                 epoch: int, slot: Slot, start: WorkerState | None = None) -> None:
        self._reader = reader
        self._splits = splits
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._convert = convert
        self._data = data
        self._options = options
        self._epoch = epoch
        self._slot = slot
        self._pieces: deque[Piece] = deque()
        self._buffered = 0
        if start is None:
            self._cursor = (0, 0)
            self._rows = self._batches = self._rows_dropped = 0
            self._complete = False
        else:
            self._cursor = (start.split_index, start.row_offset)
            self._rows, self._batches, self._rows_dropped = start.rows, start.batches, start.rows_dropped
            self._complete = start.epoch_complete
        self._reading: Iterator[Piece] | None = None if self._complete else self._read_from(*self._cursor)

    def _read_from(self, position: int, offset: int) -> Iterator[Piece]:
        for index in range(position, len(self._splits)):
            yield from self._reader.read(self._splits[index], index, offset)
            offset = 0

    def _normalized(self, position: int, offset: int) -> tuple[int, int]:
        if position < len(self._splits) and offset >= self._splits[position].num_rows:
            return position + 1, 0
        return position, offset

    def _fill(self, rows: int) -> None:
        while self._buffered < rows and self._reading is not None:
            piece = next(self._reading, None)
            if piece is None:
                self._reading = None
                self._reader.close()
            elif piece.num_rows == 0:
                if not self._pieces:  # nothing held back: the filtered-out rows are behind us
                    self._cursor = self._normalized(piece.position, piece.end)
            else:
                self._pieces.append(piece)
                self._buffered += piece.num_rows

    def _take(self, num_rows: int) -> pa.RecordBatch:
        parts: list[pa.RecordBatch] = []
        remaining = num_rows
        cursor = self._cursor
        while remaining:
            piece = self._pieces[0]
            if piece.num_rows <= remaining:
                self._pieces.popleft()
                parts.append(piece.batch)
                remaining -= piece.num_rows
                cursor = (piece.position, piece.end)
            else:
                parts.append(piece.batch.slice(0, remaining))
                self._pieces[0] = piece.tail(remaining)
                cursor = (piece.position, piece.offset_of(remaining))
                remaining = 0
        self._buffered -= num_rows
        self._cursor = self._normalized(*cursor)
        return parts[0] if len(parts) == 1 else pa.concat_batches(parts)

    def _finish(self) -> None:
        if self._drop_last and self._buffered:
            self._rows_dropped += self._buffered
            logger.info("drop_last: rank %d worker %d dropped its last %d row(s) of epoch %d",
                        self._slot.rank, self._slot.worker_id, self._buffered, self._epoch)
        self._pieces.clear()
        self._buffered = 0
        self._reading = None
        self._reader.close()
        self._cursor = (len(self._splits), 0)
        self._complete = True

    def __iter__(self) -> EpochStream:
        return self

    def _next_record(self) -> pa.RecordBatch:
        """The next batch as Arrow, before conversion."""
        if self._complete:
            raise StopIteration
        self._fill(self._batch_size)
        if self._buffered == 0 or (self._drop_last and self._buffered < self._batch_size):
            self._finish()
            raise StopIteration
        batch = self._take(min(self._batch_size, self._buffered))
        self._rows += batch.num_rows
        self._batches += 1
        return batch

    def __next__(self) -> Any:
        return self._convert(self._next_record())

    def next_span(self, max_batches: int) -> tuple[pa.RecordBatch, list[int], list[Position]]:
        """Up to ``max_batches`` next batches as one Arrow record batch, unconverted, with the
        row count of each batch and the position after it. The batches are exactly those
        ``next()`` would give; taking them together lets the caller convert each column once."""
        if self._complete:
            raise StopIteration
        self._fill(self._batch_size * max_batches)
        parts: list[pa.RecordBatch] = []
        positions: list[Position] = []
        while len(parts) < max_batches:
            try:
                parts.append(self._next_record())
            except StopIteration:
                break
            positions.append(self.position())
        if not parts:
            raise StopIteration
        span = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
        return span, [p.num_rows for p in parts], positions

    @property
    def batches(self) -> int:
        return self._batches

    def position(self) -> Position:
        return Position(self._cursor[0], self._cursor[1], self._rows, self._batches, self._rows_dropped)

    def state(self) -> WorkerState:
        return WorkerState(
            data=self._data, options=self._options, epoch=self._epoch, slot=self._slot,
            split_index=self._cursor[0], row_offset=self._cursor[1], rows=self._rows,
            batches=self._batches, rows_dropped=self._rows_dropped, epoch_complete=self._complete)
