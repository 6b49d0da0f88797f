"""One source's rows of a slot's epoch, handed out exactly as asked: :class:`SourceRows`.

It reads the source's parts of the epoch (a mixture source's segments of passes, see
:mod:`arrowstream._mixing.quotas`; a dataset slot's share, see :mod:`arrowstream._layout.share_parts`; a dynamic
worker's leases, see :mod:`arrowstream._layout.leased_parts`) through the usual pipeline (interleaved splits,
shuffle windows), part after part, and stands at a cursor (part, the pipeline's cursor in it, rows taken). The one
stream, :class:`~arrowstream._mixing.stream.MixStream`, takes every batch's rows from its sources.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .._core.cursor import Cursor
from .._core.interleave import PieceReader, block_size_for
from .._core.stream import RunQueue, open_runs
from .._core.take import take
from .._state.mixture import CompactCursor, SourceCursor
from ..errors import FileChangedError
from .bulk import BulkCursors, bulk_order, bulk_readable, span_take, spans_readable

if TYPE_CHECKING:
    from .._core.plan_types import Split
    from .bulk import HeldSource
    from .parts import Parts

class ReadAhead(Protocol):
    """What a slot's stream tells the read-ahead (``arrowstream._worker.reader.ReadAhead``): the splits it reads next."""

    def begin(self, order: Sequence[Split]) -> None: ...


class SourceRows:
    """One source's rows of a slot's epoch (its parts, in order), from a :class:`SourceCursor` on, handed
    out as asked.

    ``whole_cursors``: places carry the :class:`Cursor` itself instead of its fields (a dataset's stream).
    ``rows_known=False``: the rows of a part are known only by reading (a dataset's ``filter=`` or
    ``bad_rows="skip"``): a part's ``rows`` is an upper bound, a part ends when its runs end, and the part
    being read is tracked rather than found from the rows taken. The stream then reads ahead (:meth:`fill`)
    to plan its batches, and a part's queue is opened once the one before it has ended (the readers are
    free again), so a batch may hold the last rows of one part and the first of the next."""

    def __init__(self, name: str, readers: Sequence[PieceReader], parts: Parts, *, batch_size: int,
                 interleave: int, buffer_rows: int, start: SourceCursor, url: str,
                 read_ahead: ReadAhead | None = None, held: HeldSource | None = None,
                 rows_known: bool = True, whole_cursors: bool = False) -> None:
        self.name = name
        # how a place carries a cursor: its fields (a mixture's positions travel as plain tuples), or the cursor
        # itself (a dataset's, whose positions hold one: no copy per batch)
        self._fields: Callable[[Cursor], Any] = _same if whole_cursors else _fields
        self.rows_known = rows_known
        self._ahead: list[RunQueue] = []   # rows unknown: the next parts' queues, opened by reading ahead
        self._readers = readers
        self._held = held   # a small source held in memory: parts that allow it are read whole (_mixing.bulk)
        self._bulk: tuple[int, npt.NDArray[np.int64], BulkCursors] | None = None   # (part, its order, cursors)
        # every part read many at once (span_take)
        self._spans = spans_readable(parts, held, buffer_rows) if rows_known else None
        self._parts = parts
        self._num_parts = len(parts)
        self._part_end = parts.rows_before(start.segment + 1) if start.segment < self._num_parts else 0
        self._batch_size, self._interleave, self._buffer_rows = batch_size, interleave, buffer_rows
        self._part = start.segment
        self._start = start.cursor
        self._queue: RunQueue | None = None
        self.taken = start.taken
        self._url = url
        self._read_ahead = read_ahead

    def _open(self, index: int | None = None) -> RunQueue:
        """A queue of the runs of part ``index`` (by default the current one, from where the source stands)."""
        part = self._parts[self._part if index is None else index]
        if part.runs is not None:   # a part that reads itself (and tells the read-ahead itself)
            runs, standing = part.runs()
            return RunQueue(runs, standing)
        start = (self._start if index is None else None) or part.start or Cursor.start(len(part.splits),
                                                                                        self._interleave)
        if self._read_ahead is not None:
            self._read_ahead.begin(part.splits)
        runs = open_runs(self._readers, part.splits, batch_size=self._batch_size, interleave=self._interleave,
                         buffer_rows=self._buffer_rows, window_seed=part.seeds, start=start)
        return RunQueue(runs, start)

    def _short(self, wanted: int, given: int) -> FileChangedError:
        return FileChangedError(f"source {self.name!r} ({self._url}) gave {given} of the {wanted} row(s) its plan "
                                "promised: a file changed or lost rows since planning; re-plan (restart) to read the "
                                "data as it is now")

    def take_marked(self, marks: Sequence[int]) -> tuple[list[pa.RecordBatch], list[CompactCursor]]:
        """The next ``marks[-1]`` rows as the pieces they were read in (no copy), and where the source
        stands once the first ``marks[i]`` of them are handed out, for each mark (rising from 0), in
        :meth:`compact_cursor`'s form; ``FileChangedError`` if the source has fewer rows."""
        if not self.rows_known:
            return self._take_read(marks)
        wanted = marks[-1] if marks else 0
        queue = self._queue
        if queue is not None and marks[0] and wanted <= queue.buffered and wanted <= self._part_end - self.taken:
            # the common case, the loop below in short: the rows are held, in the part being read
            held, after = queue.take_marked(wanted, marks)
            part, before = self._part, self.taken
            self.taken = before + wanted
            return held, [(part, self._fields(cursor), before + mark) for mark, cursor in zip(marks, after, strict=True)]
        pieces: list[pa.RecordBatch] = []
        bulk: list[npt.NDArray[np.int64]] = []   # rows of the held table read whole, not yet taken
        cursors: list[CompactCursor] = []
        done, mark_index = 0, 0
        while mark_index < len(marks) and marks[mark_index] == 0:   # none handed out yet: where it stands
            cursors.append(self.compact_cursor())
            mark_index += 1
        if self._spans is not None and wanted:
            return self._take_spans(wanted, marks[mark_index:], cursors)
        while done < wanted:
            if self._part >= self._num_parts:
                raise self._short(wanted, done)
            in_part = self._part_end - self.taken
            if in_part <= 0:   # this part is done: the next one with rows, from its first row
                if self._queue is not None:
                    self._drain_part(0)
                    for reader in self._readers:
                        reader.close()
                # the next part with rows (spans have parts of none: a piece another slot takes whole)
                self._part, self._start, self._queue = self._parts.index_of_row(self.taken), None, None
                if self._part < self._num_parts:
                    self._part_end = self._parts.rows_before(self._part + 1)
                continue
            rows = min(wanted - done, in_part)
            if self._queue is None and self._bulk_part() is not None:
                first = mark_index
                while mark_index < len(marks) and marks[mark_index] <= done + rows:
                    mark_index += 1
                cursors += self._take_bulk(rows, [mark - done for mark in marks[first:mark_index]], bulk)
                done += rows
                self.taken += rows
                continue
            self._flush(bulk, pieces)
            if self._queue is None:
                self._queue = self._open()
            queue = self._queue
            queue.fill(rows)
            if queue.buffered == 0:
                raise self._short(wanted, done)
            rows = min(rows, queue.buffered)
            mark_index = self._take_queued(queue, rows, marks, mark_index, done, pieces, cursors)
            done += rows
        self._flush(bulk, pieces)
        return pieces, cursors

    def take(self, rows: int) -> pa.RecordBatch:
        """The next ``rows`` rows (at least one) as one record batch, without a cursor after them (:meth:`compact_cursor`
        finds it when asked); ``FileChangedError`` if the source has fewer rows."""
        if not self.rows_known:
            self._move_on()
        queue = self._queue
        if queue is not None and rows <= queue.buffered and (not self.rows_known or rows <= self._part_end - self.taken):
            self.taken += rows
            return queue.take(rows)
        pieces, _ = self.take_marked([rows])
        return pieces[0] if len(pieces) == 1 else pa.concat_batches(pieces)

    def drain(self) -> None:
        """At the epoch's end (every planned row handed out, or dropped by ``drop_last``): read the part the source
        stands in to the end of its runs, as :meth:`_drain_part` does at every part's end. Rows unknown: reading ahead
        read to the end already."""
        if self.rows_known and self._queue is not None and self._part < self._num_parts:
            self._drain_part(self._part_end - self.taken)

    def _drain_part(self, left: int) -> None:
        """Read the current part's runs to their end, ``left`` of its planned rows not taken: every unit it reads
        to its end is then checked against the rows its file announced (a unit holding more rows than announced is
        named, ``CorruptFileError``, not cut short), its splits count as done and its read-ahead ends. A replay (a
        part with a ``start``: the rest of an old worker's window, whose runs go on into that worker's next windows)
        is not; more rows than planned left in a part is a ``FileChangedError``."""
        assert self._queue is not None
        if self._parts[self._part].start is not None:
            return
        self._queue.fill(left + 1)
        if self._queue.buffered > left:
            raise FileChangedError(f"source {self.name!r} ({self._url}) holds more rows than its plan promised "
                                   f"(at least {self._queue.buffered - left} more in part {self._part} of this slot's "
                                   "epoch): a file changed since planning; re-plan (restart) to read the data as it "
                                   "is now")

    def fill(self, rows: int) -> int:
        """Rows unknown: read ahead until ``rows`` rows are held from where the source stands (across the ends of
        parts) or its parts end; the rows held (fewer than ``rows``: every row left)."""
        self._move_on()
        if self._queue is None:
            if not self._parts.has_part(self._part):
                return 0
            self._queue = self._open()
        held = self._queue.buffered
        if self._ahead:
            held += sum(queue.buffered for queue in self._ahead)
        while held < rows:
            last = self._ahead[-1] if self._ahead else self._queue
            before = last.buffered
            last.fill(before + rows - held)
            held += last.buffered - before
            following = self._part + len(self._ahead) + 1
            if held >= rows or not self._parts.has_part(following):
                break
            # the last queue's runs ended: the next part is read by the readers they freed
            for reader in self._readers:
                reader.close()
            self._ahead.append(self._open(following))
            self._move_on()
        return held

    def _move_on(self) -> None:
        """Rows unknown: stand in the next part opened once the current one has ended and none of its rows are held
        (rows its filter dropped at the start of the next part then move the cursor, as in one stream)."""
        while self._ahead and self._queue is not None and self._queue.buffered == 0:
            self._queue = self._ahead.pop(0)
            self._part += 1
            self._start = None

    def _take_read(self, marks: Sequence[int]) -> tuple[list[pa.RecordBatch], list[CompactCursor]]:
        """:meth:`take_marked` of rows known only by reading: the rows held (:meth:`fill` first), part after part."""
        wanted = marks[-1] if marks else 0
        pieces: list[pa.RecordBatch] = []
        cursors: list[CompactCursor] = []
        done, mark_index = 0, 0
        while mark_index < len(marks) and marks[mark_index] == 0:
            cursors.append(self.compact_cursor())
            mark_index += 1
        while done < wanted:
            self._move_on()
            queue = self._queue
            rows = 0 if queue is None else min(wanted - done, queue.buffered)
            if queue is None or rows == 0:
                raise self._short(wanted, done)
            mark_index = self._take_queued(queue, rows, marks, mark_index, done, pieces, cursors)
            done += rows
        return pieces, cursors

    def _take_queued(self, queue: RunQueue, rows: int, marks: Sequence[int], mark_index: int, done: int,
                     pieces: list[pa.RecordBatch], cursors: list[CompactCursor]) -> int:
        """Take ``rows`` held rows of ``queue`` (``done`` of the call's rows taken before them) into ``pieces``, with
        the cursor of each mark from ``mark_index`` on that they reach into ``cursors``; the next mark's index."""
        first = mark_index
        while mark_index < len(marks) and marks[mark_index] <= done + rows:
            mark_index += 1
        taken, after = queue.take_marked(rows, [mark - done for mark in marks[first:mark_index]])
        pieces += taken
        cursors += [(self._part, self._fields(cursor), self.taken + mark - done)
                    for mark, cursor in zip(marks[first:mark_index], after, strict=True)]
        self.taken += rows
        return mark_index

    def _take_spans(self, wanted: int, marks: Sequence[int],
                    cursors: list[CompactCursor]) -> tuple[list[pa.RecordBatch], list[CompactCursor]]:
        """:meth:`take_marked` of a held source of one split in spans: the rows of many parts at once, and the
        cursor of the part each mark ends in."""
        parts, held = self._spans, self._held
        assert parts is not None and held is not None
        if self.taken + wanted > parts.rows:
            raise self._short(wanted, max(parts.rows - self.taken, 0))
        rows = span_take(parts, held, self.taken, wanted, self._buffer_rows)
        batches = take(held.table, rows).to_batches()
        block = block_size_for(self._batch_size, self._interleave)

        def after(taken: int) -> tuple[int, int, Cursor]:   # the part of the last row out, its end, the cursor
            part = parts.index_of_row(taken - 1)
            before, end = parts.rows_before(part), parts.rows_before(part + 1)
            return part, end, BulkCursors([end - before], self._interleave, self._buffer_rows, block).after(
                taken - before)

        for mark in marks:
            part, _, cursor = after(self.taken + mark)
            cursors.append((part, _fields(cursor), self.taken + mark))
        self.taken += wanted
        self._part, self._part_end, self._start = after(self.taken)
        self._queue = None
        return [batches[0] if len(batches) == 1 else pa.concat_batches(batches)], cursors

    def _bulk_part(self) -> tuple[int, npt.NDArray[np.int64], BulkCursors] | None:
        """The current part's order and cursors when it is read whole from the held rows, else None."""
        if self._held is None:
            return None
        if self._bulk is None or self._bulk[0] != self._part:
            part = self._parts[self._part]
            if not bulk_readable(part, self._interleave, self._buffer_rows):
                return None
            self._bulk = (self._part, bulk_order(self._held, part, self._buffer_rows),
                          BulkCursors.of_part(part, self._interleave, self._buffer_rows,
                                      block_size_for(self._batch_size, self._interleave)))
        return self._bulk

    def _take_bulk(self, rows: int, marks: Sequence[int],
                   pending: list[npt.NDArray[np.int64]]) -> list[CompactCursor]:
        """The next ``rows`` rows of the current part from its order (into ``pending``), and the cursors once
        ``marks[i]`` of them are handed out."""
        assert self._bulk is not None
        _, order, cursors = self._bulk
        offset = self.taken - self._parts.rows_before(self._part)
        pending.append(order[offset:offset + rows])
        out: list[CompactCursor] = [(self._part, _fields(cursors.after(offset + mark)), self.taken + mark)
                                    for mark in marks]
        self._start = cursors.after(offset + rows)
        return out

    def _flush(self, pending: list[npt.NDArray[np.int64]], pieces: list[pa.RecordBatch]) -> None:
        """Take the rows read whole so far from the held table, as one piece after ``pieces``."""
        if pending:
            assert self._held is not None
            rows = pending[0] if len(pending) == 1 else np.concatenate(pending)
            batches = take(self._held.table, rows).to_batches()
            pieces.append(batches[0] if len(batches) == 1 else pa.concat_batches(batches))
            pending.clear()

    def compact_cursor(self) -> CompactCursor:
        """Where it stands, as plain tuples (see :class:`MixPosition`)."""
        cursor = self._start if self._queue is None else self._queue.cursor
        return self._part, None if cursor is None else self._fields(cursor), self.taken


def _same(cursor: Cursor) -> Cursor:
    return cursor


def _fields(cursor: Cursor) -> tuple[Any, ...]:
    """A cursor's fields in order, as :class:`MixPosition` carries them."""
    return (cursor.lanes, cursor.next_split_index, cursor.turn_index, cursor.block_offset, cursor.window_index,
            cursor.window_offset, cursor.replay_index, cursor.replay_offset)


