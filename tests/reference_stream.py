"""Frozen references for the tests: how a dynamic worker read its leases before it read through the one stream.

``EpochStream`` (``arrowstream/_core/stream.py`` until the dynamic path was switched to
``arrowstream._layout.leased_parts``, #38) and ``leased_runs`` (``arrowstream/_layout/ledger.py``), copied as
they were: ``tests/test_dynamic_stream.py`` reads a dynamic worker's leases both ways and compares every batch and
worker state, and the older tests of the stream (``test_stream.py``, ``test_elastic_plan.py``,
``test_one_source.py``, ``test_dynamic.py``) keep reading through them as ``tests/test_ledger.py`` keeps old code.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from arrowstream._core.cursor import Cursor, Position, Run
from arrowstream._core.interleave import PieceReader
from arrowstream._core.order import Slot, window_seed
from arrowstream._core.plan_types import Split
from arrowstream._core.stream import RunQueue, open_runs
from arrowstream._layout.elastic import replay_runs, with_replay_index
from arrowstream._layout.ledger import LeasedShare, LeasedSplits, start_cursor
from arrowstream._state.identity import DataIdentity
from arrowstream._state.worker import WorkerState

logger = logging.getLogger("arrowstream")


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


def leased_runs(readers: Sequence[PieceReader], share: LeasedShare, *, seed: int, epoch: int, slot: Slot,
                batch_size: int, interleave: int, buffer_rows: int,
                reading_order: Callable[[Sequence[Split]], None] | None = None) -> Iterator[Run]:
    """A dynamic worker's rows: the replays it leases (handed out in their own order), then the splits
    it leases, through the usual pipeline (interleave, shuffle windows seeded by its slot).
    ``reading_order`` is told the order of the splits read (for read-ahead): none while replaying."""
    if reading_order is not None:
        reading_order(())
    index = 0
    while (replay := share.replay(index)) is not None:
        yield from replay_runs(readers, replay, index, 0, Cursor((), 0), seed=seed, epoch=epoch,
                               batch_size=batch_size, interleave=interleave, buffer_rows=buffer_rows)
        index += 1
    base = dataclasses.replace(start_cursor(interleave), replay_index=index)
    seeds: Callable[[int], int] = functools.partial(window_seed, seed, epoch, slot)
    splits = LeasedSplits(share)
    if reading_order is not None:
        reading_order(splits)
    for run in open_runs(readers, splits, batch_size=batch_size, interleave=interleave,
                         buffer_rows=buffer_rows, window_seed=seeds, start=base):
        yield with_replay_index(run, index)
