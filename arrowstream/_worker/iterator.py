"""One worker iterator: what ``iter(dataset)`` and ``iter(mixture)`` return, over a slot's stream.

A slot's stream (the one stream, :class:`~arrowstream._mixing.stream.MixStream`: a mixture's slot, a static dataset
slot, a dynamic dataset worker's leases) is read by one :class:`SlotIterator`. It binds the epoch on the
first ``next()`` (so a ``set_epoch`` between ``iter()`` and it counts), times each batch for the metrics, and
hands the batches over:

- in a loader worker that sends chunks, up to ``batches_per_transfer`` batches as one
  :class:`~arrowstream._worker.transport.Chunk`, ending where the slot's batch count is a multiple of it (chunk
  boundaries do not move across a resume); without a ``transform`` the span is converted once per column, with
  one batch by batch;
- otherwise (``num_workers=0``, a plain loader's worker) either one record at a time (``Opened.by_record``,
  a dataset's way) or spans of :func:`~arrowstream._worker.transport.default_batches_per_transfer` batches handed
  out one by one (a mixture's way), the state standing after the last batch handed out.

What differs between a dataset and a mixture is data handed in at open (:class:`Opened`): the stream, the
converters, the meter, the files read (error messages), the row of rows per source, and ``by_record``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Generic, Protocol, TypeVar

import pyarrow as pa
from torch.utils.data import get_worker_info

from .converters import Converters
from .metrics import Meter
from .runtime import Transport
from .stitch import StitchPiece
from .transport import Chunk, default_batches_per_transfer

P = TypeVar("P")   # where a stream stands after a batch (a dataset's Position, a mixture's MixPosition)
S = TypeVar("S")   # a worker's state (WorkerState, MixWorkerState)
P_co = TypeVar("P_co", covariant=True)
S_co = TypeVar("S_co", covariant=True)


class SlotStream(Protocol[P, S_co]):
    """What the iterator reads of a slot's stream (``MixStream`` is one)."""

    @property
    def batches(self) -> int: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    def next_record(self) -> pa.RecordBatch:
        """The next batch as Arrow."""

    def next_span(self, max_batches: int) -> tuple[pa.RecordBatch, list[int], list[P], list[int] | None]:
        """Up to ``max_batches`` next batches as one record batch, each batch's rows, the position after each,
        and the rows of each source among them (None: one source)."""

    def next_piece(self) -> tuple[Any, pa.RecordBatch] | None:
        """The next piece of the slot's last rows that other workers' rows make a batch with (see ``_stitch``)."""

    def position(self) -> P: ...

    def state(self, position: P | None = None) -> S_co:
        """The worker's state where the stream stands, or at ``position`` (one of its positions)."""


@dataclass(frozen=True)
class Opened(Generic[P, S]):
    """A slot's epoch, opened: its stream and how its batches are made and counted.

    Args:
        stream: The slot's stream.
        converters: To the output format.
        meter: This process's metrics.
        transport: How the loader takes the batches.
        files_between: The files read between two positions (asked only for error messages); None: not told.
        by_record: Outside chunks, one record at a time (else spans, handed out one batch at a time).
    """

    stream: SlotStream[P, S]
    converters: Converters
    meter: Meter
    transport: Transport
    files_between: Callable[[P, P], list[str]] | None = None
    by_record: bool = False


class SlotIterator(Generic[P, S]):
    """What ``iter(dataset)`` and ``iter(mixture)`` return: a slot's batches (see the module).

    Args:
        open_epoch: Opens the slot's stream of the epoch (from a loaded state, if any); see :class:`Opened`.
        before: The state before the first batch (the loaded one, or the epoch's start).
        epoch: The epoch now (before the stream is opened).
    """

    def __init__(self, open_epoch: Callable[[], Opened[P, S]], before: Callable[[], S],
                 epoch: Callable[[], int]) -> None:
        self._open_epoch = open_epoch
        self._before = before
        self._epoch = epoch
        self._opened: Opened[P, S] | None = None
        self._stream: SlotStream[P, S] | None = None
        self._worker_id = 0
        self._in_worker = False   # a loader worker's process (not the trainer's)
        self._sends = False   # a loader worker that sends chunks: a record read alone travels as one too
        self._by_record = False   # each next() reads and converts one record, handed out as it is
        self._hands_out = False   # a span's batches are handed out one by one (else the span is the chunk sent)
        self._per_chunk = 1   # batches per chunk, or per span handed out one by one
        self._ready: deque[tuple[Any, P]] = deque()   # a span's batches not handed out yet (outside chunks)
        self._chunk: Chunk | None = None   # the span they are in
        self._position: P | None = None   # after the last batch handed out of a span
        self._left_at = 0.0   # when the last batch was handed over (0: none yet)

    def __iter__(self) -> SlotIterator[P, S]:
        return self

    def _open(self) -> SlotStream[P, S]:
        opened = self._opened = self._open_epoch()
        stream = self._stream = opened.stream
        info = get_worker_info()
        transport = opened.transport
        per_transfer = transport.batches_per_transfer
        self._worker_id = 0 if info is None else info.id
        self._in_worker = info is not None
        self._sends = info is not None and transport.send_chunks
        self._by_record = opened.by_record and (per_transfer == 1 or info is None)
        # chunks of batches_per_transfer where the worker sends them (a dataset's worker: whenever it sends more
        # than one batch per message); else spans of the default size, handed out one by one
        self._hands_out = not (self._sends or opened.by_record)
        self._per_chunk = default_batches_per_transfer(stream.batch_size) if self._hands_out else per_transfer
        return stream

    def __next__(self) -> Any:
        """The next batch (or chunk of batches), timed for the metrics: reading, converting, and the time
        since the last one was handed over, which the worker spent waiting for the trainer."""
        entered = perf_counter()
        if self._ready:   # the next batch of a span read before
            batch, self._position = self._ready.popleft()
            assert self._chunk is not None
            return self._chunk.finish(batch)
        stream = self._stream or self._open()
        opened = self._opened
        assert opened is not None
        # where a chunk may be made: the position it starts from, for the files it read
        start = stream.position() if self._in_worker and opened.files_between is not None else None
        per_source: Sequence[int] | None = None   # a mixture's rows of each source (None: not counted)
        try:
            if self._by_record:
                record = stream.next_record()
                read = perf_counter()
                out, rows, batches = opened.converters.convert(record), record.num_rows, 1
                if self._sends:   # packed in this thread, see _transport
                    out = Chunk(self._worker_id, [out], [stream.position()], files=self._files(start))
            else:
                out, rows, batches, read, per_source = self._next_chunk(stream, opened)
                if self._hands_out:   # the span's batches handed out one by one, the state after the last one
                    self._metered(opened.meter, rows, batches, entered, read, per_source)
                    self._chunk, self._ready = out, deque(zip(out.batches(), out.positions, strict=True))
                    batch, self._position = self._ready.popleft()
                    return out.finish(batch)
                out.files = self._files(start)
        except StopIteration:
            piece = stream.next_piece()
            if piece is None:
                raise
            # a piece of this worker's last rows, stitched with other workers' by the trainer (as Arrow:
            # converted there, whole); the batch is counted once, by the worker whose piece starts it
            tag, record = piece
            read = perf_counter()
            out = Chunk(self._worker_id, [StitchPiece(tag, record)], [stream.position()], files=self._files(start))
            rows, batches = record.num_rows, int(tag.first)
        self._metered(opened.meter, rows, batches, entered, read, per_source)
        if isinstance(out, Chunk):
            out.on_packed = self._packed
        return out

    def _metered(self, meter: Meter, rows: int, batches: int, entered: float, read: float,
                 per_source: Sequence[int] | None = None) -> None:
        done = perf_counter()
        meter.batch(rows, batches, read - entered, done - read, entered - self._left_at if self._left_at else 0.0,
                    done, per_source)
        self._left_at = done

    def _next_chunk(self, stream: SlotStream[P, S],
                    opened: Opened[P, S]) -> tuple[Chunk, int, int, float, Sequence[int] | None]:
        """Up to ``per_chunk`` batches, ending where the slot's batch count is a multiple of it, so chunk
        boundaries do not move when a checkpoint falls inside a chunk; with their rows, their number, when
        reading ended (converting starts) and a mixture's rows of each source in them (None: not counted).

        Without a transform the batches travel as one converted span that the trainer slices: each column is
        converted and packed once per chunk instead of once per batch. With one, each batch is converted (and
        transformed) on its own: read one record at a time (``by_record``), or cut from the span.
        """
        converters, per_chunk = opened.converters, self._per_chunk
        wanted = per_chunk - stream.batches % per_chunk
        if converters.span_convert is None and opened.by_record:
            records, positions = [], []
            while True:
                try:
                    records.append(stream.next_record())
                except StopIteration:
                    break
                positions.append(stream.position())
                if len(records) == wanted:
                    break
            if not records:
                raise StopIteration
            read = perf_counter()
            batches = [converters.convert(record) for record in records]
            return (Chunk(self._worker_id, batches, positions, numpy_as_torch=converters.numpy_as_torch),
                    sum(record.num_rows for record in records), len(records), read, None)
        span, sizes, positions, counts = stream.next_span(wanted)
        read = perf_counter()
        if converters.span_convert is not None:
            chunk = Chunk(self._worker_id, [converters.span_convert(span)], positions,
                          numpy_as_torch=converters.numpy_as_torch, sizes=sizes, objects=converters.objects)
        else:   # a transform takes one batch at a time
            convert, batches, offset = converters.convert, [], 0
            for size in sizes:
                batches.append(convert(span.slice(offset, size)))
                offset += size
            chunk = Chunk(self._worker_id, batches, positions, numpy_as_torch=converters.numpy_as_torch)
        return chunk, span.num_rows, len(sizes), read, counts

    def _files(self, start: P | None) -> Callable[[], list[str]] | None:
        """The files read since ``start``, asked only when a chunk cannot be sent."""
        files_between = self._opened.files_between if self._opened is not None else None
        if start is None or files_between is None or self._stream is None:
            return None
        end = self._stream.position()
        return lambda: files_between(start, end)

    def _packed(self, started: float, done: float) -> None:
        """A chunk this iterator made was collated and packed in the worker: converting, not waiting."""
        assert self._opened is not None
        self._opened.meter.packed(done - started, done)
        self._left_at = done

    def position(self) -> tuple[int, P | None]:
        """The epoch and where this iterator stands (None: at the state it started from)."""
        if self._stream is None:
            return self._epoch(), None
        if self._ready:
            return self._stream.epoch, self._position
        return self._stream.epoch, self._stream.position()

    def state(self) -> S:
        """The worker's state after the last batch handed out."""
        if self._stream is None:
            return self._before()
        if self._ready:   # batches of a span are still to be handed out: the state after the last one handed
            return self._stream.state(self._position)
        return self._stream.state()
