"""A mixture's side in the process that reads it: the slot's stream, the iterator, chunks for the loader.

:class:`MixSide` holds what the loader hands over before its workers start (the :class:`Transport`:
batches per message, chunks, the metrics board; and the board of rows per source) and this process's
meter. :func:`open_stream` opens a slot's :class:`~arrowstream._mixing.stream.MixStream` of the mixture's
epoch from the values the mixture hands it (a :class:`MixReading`). :class:`MixIterator` is what
``iter(mixture)`` returns: in a loader worker it sends
``batches_per_transfer`` batches per message as one :class:`~arrowstream._worker.transport.Chunk` (the shared
memory ring, numeric columns as ndarrays that the trainer makes tensors of), each with the worker's state
after it, so that the loader can stand between two batches of a chunk.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa
from torch.utils.data import get_worker_info

from .._core.interleave import PieceReader
from .._mixing.stream import MixSlot, MixStream, SourceRows
from .._state.mixture import MixPosition, MixWorkerState
from ..errors import StateMismatchError
from .convert import make_converter, make_value_check
from .held import HeldReader, HeldSource, holds
from .metrics import Meter
from .reader import ReadAhead, SplitReader, row_ids_for
from .runtime import READ_BATCH_ROWS, Transport, settle_worker
from .transport import Chunk, default_batches_per_transfer

if TYPE_CHECKING:
    import torch

    from .._mixing.parts import Parts
    from .._planning.options import Options
    from .._sources.mixture import Planned


COMPACT = "arrowstream.mixture_position"
"""The key of a worker's compact state inside a MixtureDataLoader (see ``Mixture.state_dict``)."""


class MixSide:
    """The loader's transport and per-source board, and this process's meter (built on first read)."""

    def __init__(self) -> None:
        self.transport = Transport()
        self.sources_board: torch.Tensor | None = None
        self._meter: Meter | None = None

    def use_transport(self, transport: Transport, sources_board: torch.Tensor) -> None:
        """The loader's one call, before its workers start."""
        self.transport, self.sources_board, self._meter = transport, sources_board, None

    def meter(self) -> Meter:
        if self._meter is None:
            info = get_worker_info()
            board = self.transport.board
            self._meter = Meter(board.row(info.id) if info is not None and board is not None else None)
        return self._meter

    @property
    def metered(self) -> Meter | None:
        return self._meter

    def source_row(self) -> Any:
        """This worker's row of rows per source (an ndarray in shared memory), or None without a loader."""
        if self.sources_board is None:
            return None
        info = get_worker_info()
        return self.sources_board[0 if info is None else info.id].numpy()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_meter": None}


@dataclass(frozen=True)
class MixReading:
    """What a slot reads of a mixture's epoch, as the mixture lays it out (its values, handed to
    :func:`open_stream`): the options, the sources as planned, where each source's files start in the
    mixture's files, the slot's parts of each source, each source's cast to the mixture's schema, the
    fill values, the slot's batches under ``even_batches`` (None: without) and the order inside a batch."""

    options: Options
    sources: Sequence[Planned]
    bases: Sequence[int]
    parts: Mapping[str, Parts]
    casts: Mapping[str, Callable[[pa.RecordBatch], pa.RecordBatch]]
    fill_nulls: Any
    limit: int | None
    batch_order: str | None


@dataclass(frozen=True)
class MixOutput:
    """How a mixture's rows become its batches: what :class:`MixIterator` converts a span with."""

    output_format: str
    schema: pa.Schema
    fill_nulls: Any
    transform: Callable[[Any], Any] | None


class MixOpened(NamedTuple):
    """A slot's epoch of a mixture, opened: its stream and how its batches are made."""

    stream: MixStream
    output: MixOutput


def start_in_epoch(pending: MixWorkerState | None, slot: MixSlot) -> MixWorkerState | None:
    """``pending`` (a loaded state) if the slot's epoch goes on from it; None where the mixture is set to a
    later epoch than a finished one; refused where it is set to another epoch than an unfinished one."""
    if pending is not None and pending.epoch != slot.epoch:
        if not (pending.epoch_complete and pending.epoch < slot.epoch):
            raise StateMismatchError(
                f"the checkpoint is in mixture epoch {pending.epoch} (mid-epoch) but the mixture is set to epoch "
                f"{slot.epoch}; call mixture.set_epoch({pending.epoch}) before iterating to finish the saved "
                "epoch, or start without loading the checkpoint")
        return None
    return pending


def finished_stream(slot: MixSlot, start: MixWorkerState, batch_size: int) -> MixStream:
    """The stream of a slot with nothing left in its epoch (``start``, marked done with it)."""
    start = MixWorkerState(**{**start.__dict__, "epoch_complete": True})
    return MixStream([], [], cast=lambda name, batch: batch, batch_size=batch_size, drop_last=False,
                     max_batches=None, batch_order=None, seed=0, slot=slot, start=start)


def open_stream(reading: MixReading, slot: MixSlot, start: MixWorkerState, meter: Meter) -> MixStream:
    """The stream of ``slot`` in the mixture's epoch that ``reading`` lays out, from ``start``."""
    options, parts = reading.options, reading.parts
    in_worker = get_worker_info() is not None
    if in_worker:
        settle_worker()   # as a dataset's workers do
    quotas = {name: parts[name].rows for name in parts}
    total = max(sum(quotas.values()), 1)
    sources = []
    # with row ids: a source's files are numbered after the sources' before it
    for s, base in zip(reading.sources, reading.bases, strict=True):
        row_ids = row_ids_for(s.plan, base) if options.with_row_ids else None
        check = make_value_check(options.output_format, s.plan.schema, reading.fill_nulls)
        prefetcher = s.storage.prefetcher   # object stores: each segment's next splits fetched ahead
        read_ahead = None if prefetcher is None else ReadAhead(s.plan, prefetcher, s.storage.read_ahead)
        # each source's first reads decode what its first batch needs and no more: its share of a dataset's
        # read, or with a shuffle buffer its first window, over its lanes (the first batch waits for the rows
        # of one dataset's read or window, not one per source); later reads are full (fewer, cheaper per row)
        read_rows = max(options.batch_size, READ_BATCH_ROWS)
        first_needs = options.shuffle_buffer_size or -(-READ_BATCH_ROWS * quotas[s.name] // total)
        first_rows = max(options.batch_size, -(-min(read_rows, first_needs) // options.interleave))
        held = None
        if holds(s.plan, len(parts[s.name])):   # a small source read in many passes: read once, held, for every lane
            held = HeldSource(SplitReader(s.plan, s.storage, read_rows, use_threads=not in_worker, meter=meter,
                                          check=check, row_ids=row_ids), s.plan)
            readers: list[PieceReader] = [HeldReader(held)] * options.interleave
            read_ahead = None
        else:
            readers = [SplitReader(s.plan, s.storage, read_rows, use_threads=not in_worker, read_ahead=read_ahead,
                                   meter=meter, check=check, first_read_rows=first_rows, row_ids=row_ids)
                       for _ in range(options.interleave)]
        sources.append(SourceRows(s.name, readers, parts[s.name], batch_size=options.batch_size,
                                  interleave=options.interleave, buffer_rows=options.shuffle_buffer_size,
                                  start=start.cursors[s.name], url=str(s.origin.arguments().get("path", s.name)),
                                  read_ahead=read_ahead, held=held))
    casts = reading.casts
    return MixStream(sources, [parts[s.name].rows for s in reading.sources],
                     cast=lambda name, batch: casts[name](batch), batch_size=options.batch_size,
                     drop_last=options.drop_last, max_batches=reading.limit, batch_order=reading.batch_order,
                     seed=options.seed, slot=slot, start=start)


class MixIterator:
    """What ``iter(mixture)`` returns: binds the epoch on the first batch and counts what it hands out.

    Batches are taken ``batches_per_transfer`` at a time as one span: without a ``transform`` it is converted
    once per column and cut into batches (views); with one, each batch is converted and transformed on its
    own. In a loader worker the span travels as one :class:`~arrowstream._worker.transport.Chunk`; in the
    trainer's process (``num_workers=0``) its batches are handed out one by one. Each batch carries the position after it, so a state taken between two batches
    of a span is exact.

    Args:
        side: The mixture's side in this process (the loader's transport and boards, the meter).
        open_epoch: Opens the slot's stream of the mixture's epoch (from a loaded state, if any); see
            :class:`MixOpened`.
        before: The state before the first batch (the loaded one, or the epoch's start).
        epoch: The mixture's epoch now (before the stream is opened).
    """

    def __init__(self, side: MixSide, open_epoch: Callable[[], MixOpened], before: Callable[[], MixWorkerState],
                 epoch: Callable[[], int]) -> None:
        self._side = side
        self._open_epoch = open_epoch
        self._before = before
        self._epoch = epoch
        self._stream: MixStream | None = None
        self._convert: Callable[[pa.RecordBatch], Any] = lambda batch: batch
        self._span_convert: Callable[[pa.RecordBatch], Any] | None = None
        self._objects: str | None = None
        self._sources: Any = None   # this worker's rows per source on the loader's board
        self._as_torch = False      # a chunk's numeric columns travel as ndarrays, made tensors by the trainer
        self._ready: deque[tuple[Any, MixPosition]] = deque()   # num_workers=0: a span's batches not handed yet
        self._chunk: Chunk | None = None
        self._position: MixPosition | None = None   # after the last batch handed out of a span
        self._left_at = 0.0

    def __iter__(self) -> MixIterator:
        return self

    def _open(self) -> MixStream:
        self._stream, output = self._open_epoch()
        info = get_worker_info()
        in_worker = info is not None
        transport = self._side.transport
        output_format, transform = output.output_format, output.transform
        self._as_torch = in_worker and transport.batches_per_transfer > 1 and transform is None and \
            output_format == "torch"
        made = "numpy" if self._as_torch else output_format
        if transform is None:   # a span's columns converted at once; Python objects made batch by batch
            self._span_convert = make_converter(made, output.schema, output.fill_nulls, in_worker=in_worker,
                                                objects_later=True, torch_values=self._as_torch)
            self._objects = output_format if output_format in ("torch", "numpy", "dict") else None
        else:
            convert = make_converter(made, output.schema, output.fill_nulls, in_worker=in_worker)
            self._convert = lambda batch: transform(convert(batch))
        self._sources = self._side.source_row()
        return self._stream

    def __next__(self) -> Any:
        entered = perf_counter()
        if self._ready:
            batch, self._position = self._ready.popleft()
            assert self._chunk is not None
            return self._chunk.finish(batch)
        stream = self._stream or self._open()
        info = get_worker_info()
        transport = self._side.transport
        chunks = info is not None and transport.send_chunks
        per_span = transport.batches_per_transfer if chunks else default_batches_per_transfer(stream.batch_size)
        # up to a multiple of per_span batches: chunk ends do not move across a resume
        span, sizes, positions, counts = stream.next_span(per_span - stream.batches % per_span)
        if self._sources is not None:
            self._sources += counts
        read = perf_counter()
        worker_id = info.id if info is not None else 0
        if self._span_convert is not None:
            chunk = Chunk(worker_id, [self._span_convert(span)], positions, numpy_as_torch=self._as_torch, sizes=sizes,
                          objects=self._objects)
        else:   # a transform takes one batch at a time
            starts = itertools.accumulate(sizes, initial=0)
            chunk = Chunk(worker_id, [self._convert(span.slice(start, size)) for start, size in zip(starts, sizes)],
                          positions, numpy_as_torch=self._as_torch)
        self._metered(span.num_rows, len(sizes), entered, read)
        if chunks:
            chunk.on_packed = self._packed
            return chunk
        self._chunk, self._ready = chunk, deque(zip(chunk.batches(), positions, strict=True))
        batch, self._position = self._ready.popleft()
        return chunk.finish(batch)

    def _metered(self, rows: int, batches: int, entered: float, read: float) -> None:
        done = perf_counter()
        self._side.meter().batch(rows, batches, read - entered, done - read,
                                          entered - self._left_at if self._left_at else 0.0, done)
        self._left_at = done

    def _packed(self, started: float, done: float) -> None:
        """A chunk this iterator made was collated and packed in the worker: converting, not waiting."""
        self._side.meter().packed(done - started, done)
        self._left_at = done

    def position(self) -> tuple[int, MixPosition | None]:
        """The epoch and where this iterator stands (None: at the state it started from)."""
        if self._stream is None:
            return self._epoch(), None
        if self._ready:
            return self._stream.epoch, self._position
        return self._stream.epoch, self._stream.position()

    def state(self) -> MixWorkerState:
        if self._stream is None:
            return self._before()
        if self._ready:   # batches of a span are still to be handed out: the state after the last one handed
            assert self._position is not None
            return self._stream.state(self._position)
        return self._stream.state()
