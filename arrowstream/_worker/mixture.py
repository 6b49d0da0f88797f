"""A mixture's side in the process that reads it: the slot's stream, opened for the worker iterator.

:class:`MixSide` holds what the loader hands over before its workers start (the :class:`Transport`:
batches per message, chunks, the metrics board; and the board of rows per source) and this process's
meter. :func:`open_stream` makes each source's readers for the slot's epoch and opens its
:class:`~arrowstream._mixing.stream.MixStream` through the one opener (:mod:`arrowstream._worker.open_slot`) from the
values the mixture hands it (a :class:`MixReading`, with its epochs' answer of what the slot reads); :func:`opened` hands it to the one
worker iterator (:class:`~arrowstream._worker.iterator.SlotIterator`, what ``iter(mixture)`` returns), with
the converters to the output format and the row of rows per source: in a loader worker it sends
``batches_per_transfer`` batches per message as one :class:`~arrowstream._worker.transport.Chunk`, each with the
worker's position after it, so that the loader can stand between two batches of a chunk; in the trainer's
process it hands a span's batches out one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from torch.utils.data import get_worker_info

from .._mixing.slot_epoch import SourceReading
from .._mixing.stream import MixSlot, MixStream
from .._state.mixture import MixPosition, MixWorkerState
from ..errors import StateMismatchError
from .convert import make_value_check
from .converters import make_converters
from .held import HeldReader, HeldSource, holds
from .iterator import Opened
from .metrics import Meter
from .open_slot import open_slot_stream
from .reader import ReadAhead, SplitReader, UnitCache, row_ids_for
from .runtime import READ_BATCH_ROWS, Transport, settle_worker

if TYPE_CHECKING:

    from .._mixing.slot_epoch import SlotEpoch
    from .._planning.options import Options
    from .._sources.mixture import Planned


COMPACT = "arrowstream.mixture_position"
"""The key of a worker's compact state inside a MixtureDataLoader (see ``Mixture.state_dict``)."""


class MixSide:
    """The loader's transport and this process's meter (built on first read), which counts the rows of each of
    the mixture's ``sources``."""

    def __init__(self, sources: int) -> None:
        self.transport = Transport()
        self.sources = sources
        self._meter: Meter | None = None

    def use_transport(self, transport: Transport) -> None:
        """The loader's one call, before its workers start."""
        self.transport, self._meter = transport, None

    def meter(self) -> Meter:
        if self._meter is None:
            info = get_worker_info()
            board = self.transport.board
            self._meter = Meter(board.row(info.id) if info is not None and board is not None else None, self.sources)
        return self._meter

    @property
    def metered(self) -> Meter | None:
        return self._meter

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_meter": None}


@dataclass(frozen=True)
class MixReading:
    """What a slot reads of a mixture's epoch, as the mixture lays it out (its values, handed to
    :func:`open_stream`): the options, the sources as planned, where each source's files start in the
    mixture's files, each source's cast to the mixture's schema, the fill values, and the slot's epoch (its
    parts of each source, its batches under ``even_batches``, the order inside a batch: the mixture's epochs'
    answer, ``MixEpochs.with_history(...).slot_epoch``)."""

    options: Options
    sources: Sequence[Planned]
    bases: Sequence[int]
    casts: Mapping[str, Callable[[pa.RecordBatch], pa.RecordBatch]]
    fill_nulls: Any
    epoch: SlotEpoch


@dataclass(frozen=True)
class MixOutput:
    """How a mixture's rows become its batches (see :func:`opened`)."""

    output_format: str
    schema: pa.Schema
    fill_nulls: Any
    transform: Callable[[Any], Any] | None


def opened(side: MixSide, stream: MixStream[MixPosition, MixWorkerState], output: MixOutput, meter: Meter) -> Opened[MixPosition, MixWorkerState]:
    """A slot's epoch of a mixture, opened for the worker iterator: its converters, built now for this process and
    the loader's transport and ``meter``."""
    transport = side.transport
    converters = make_converters(output.output_format, output.schema, output.fill_nulls, output.transform,
                                 batches_per_transfer=transport.batches_per_transfer,
                                 in_worker=get_worker_info() is not None)
    return Opened(stream, converters, meter, transport)


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


def finished_stream(slot: MixSlot, start: MixWorkerState, batch_size: int) -> MixStream[MixPosition, MixWorkerState]:
    """The stream of a slot with nothing left in its epoch (``start``, marked done with it)."""
    start = MixWorkerState(**{**start.__dict__, "epoch_complete": True})
    return MixStream([], [], cast=lambda name, batch: batch, batch_size=batch_size, drop_last=False,
                     max_batches=None, batch_order=None, seed=0, slot=slot, start=start)


@dataclass
class SharedReading:
    """What the streams of several slots in one process share of each source (the canonical slots of
    ``order="canonical"``): a small source held once, and whole units decoded once for the parts of them they read."""

    held: dict[str, HeldSource] = field(default_factory=dict)
    units: dict[str, UnitCache] = field(default_factory=dict)


def open_stream(reading: MixReading, start: MixWorkerState, meter: Meter,
                shared: SharedReading | None = None) -> MixStream[MixPosition, MixWorkerState]:
    """The stream of the slot's epoch that ``reading`` lays out, from ``start``: each source's readers made for this
    epoch (a small source read in many passes held in memory), opened as every slot's stream is
    (:func:`~arrowstream._worker.open_slot.open_slot_stream`). ``shared``: what it shares with the other streams of
    this process (None: nothing)."""
    options, epoch = reading.options, reading.epoch
    in_worker = get_worker_info() is not None
    if in_worker:
        settle_worker()   # as a dataset's workers do
    assert epoch.names == [s.name for s in reading.sources], "the epoch's sources are the mixture's, in its order"
    total = max(sum(source.rows for source in epoch.sources), 1)
    by_name: dict[str, SourceReading] = {}
    # with row ids: a source's files are numbered after the sources' before it
    for s, base in zip(reading.sources, reading.bases, strict=True):
        parts = epoch.parts(s.name)
        row_ids = row_ids_for(s.plan, base) if options.with_row_ids else None
        check = make_value_check(options.output_format, s.plan.schema, reading.fill_nulls)
        prefetcher = s.storage.prefetcher   # object stores: each segment's next splits fetched ahead
        read_ahead = None if prefetcher is None else ReadAhead(s.plan, prefetcher, s.storage.read_ahead)
        # each source's first reads decode what its first batch needs and no more: its share of a dataset's
        # read, or with a shuffle buffer its first window, over its lanes (the first batch waits for the rows
        # of one dataset's read or window, not one per source); later reads are full (fewer, cheaper per row)
        read_rows = max(options.batch_size, READ_BATCH_ROWS)
        first_needs = options.shuffle_buffer_size or -(-READ_BATCH_ROWS * parts.rows // total)
        first_rows = max(options.batch_size, -(-min(read_rows, first_needs) // options.interleave))
        url = str(s.origin.arguments().get("path", s.name))
        if holds(s.plan, len(parts)):   # a small source read in many passes: read once, held, for every lane
            held = None if shared is None else shared.held.get(s.name)
            if held is None:
                held = HeldSource(SplitReader(s.plan, s.storage, read_rows, use_threads=not in_worker, meter=meter,
                                              check=check, row_ids=row_ids), s.plan)
                if shared is not None:
                    shared.held[s.name] = held
            by_name[s.name] = SourceReading([HeldReader(held)] * options.interleave, url, held=held)
        else:
            units = None if shared is None else shared.units.setdefault(s.name, UnitCache())
            by_name[s.name] = SourceReading(
                [SplitReader(s.plan, s.storage, read_rows, use_threads=not in_worker, read_ahead=read_ahead,
                             meter=meter, check=check, first_read_rows=first_rows, row_ids=row_ids,
                             unit_cache=units)
                 for _ in range(options.interleave)], url, read_ahead)
    casts = reading.casts
    return open_slot_stream(epoch, start, by_name, options, cast=lambda name, batch: casts[name](batch))
