"""The worker runtime: what one process needs to read its slot, built once, and how it opens a slot's stream.

The loader hands its transport settings to the dataset in one call (:class:`Transport`); each
process that reads (a worker, or the trainer with ``num_workers=0``) builds one
:class:`WorkerRuntime` from the plan, the storage and the options: its readers, the read-ahead of
remote splits, the converters to the output format and its meter. :class:`WorkerSide` is the
dataset's handle on it: the transport settings, the runtime once built, the meter, and where the
dataset was pickled (a worker started by spawn watches the process that pickled it).
:func:`open_stream` opens a slot's epoch stream with it (through the one opener,
:mod:`arrowstream._worker.open_slot`), which the worker iterator (:mod:`arrowstream._worker.iterator`) reads.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch.utils.data import get_worker_info

from .._core.row_ids import with_row_id_fields
from .._layout.share_parts import share_where
from .._mixing.slot_epoch import SourceReading
from .._state.one_source import DATASET
from .convert import make_converter, make_value_check
from .converters import Converters, make_converters, with_transform
from .metrics import Board, Meter
from .open_slot import open_slot_stream
from .reader import ReadAhead, SplitReader, UnitCache, row_ids_for
from .watchdog import watch_trainer

if TYPE_CHECKING:
    import pyarrow as pa

    from .._core.cursor import Position
    from .._core.order import Slot
    from .._layout.layout import Epochs
    from .._mixing.stream import MixStream
    from .._planning.options import Options
    from .._planning.plan import Plan
    from .._state.worker import WorkerState
    from .._storage.filesystem import Storage

READ_BATCH_ROWS = 65536
_PR_SET_THP_DISABLE = 41


_settled_in: int | None = None


def settle_worker() -> None:
    """In a loader worker, before it reads, once per process: what its process needs that the trainer's does not.

    - The heap inherited from the trainer (torch, pyarrow, ...) never becomes garbage here: freezing it keeps
      the collector from walking it for every batch of Python objects.
    - No transparent huge pages (Linux). pyarrow's allocator (mimalloc) reserves a 1 GiB arena marked for huge
      pages, which a forked worker inherits; a worker's first windows fault in fresh 2 MiB pages, and where
      the kernel has to compact memory to find them, reads stall in system time. Measured: a resumed
      mixture's first batch 117-301 ms with them, 123-159 ms without; a mixture's workers ~8% less CPU
      without, a dataset's the same (docs/performance.md).
    """
    global _settled_in
    if _settled_in == os.getpid():   # once: a later freeze would keep this worker's own objects from the collector
        return
    _settled_in = os.getpid()
    gc.freeze()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0)


@dataclass(frozen=True)
class Transport:
    """How a worker hands its batches over, as the loader sets it (one call: ``WorkerSide.use_transport``)."""

    batches_per_transfer: int = 1  # consecutive batches per message (worker processes only)
    send_chunks: bool = False  # workers send Chunks, which the loader unpacks
    board: Board | None = field(default=None, compare=False)  # the loader's workers' metrics


@dataclass(frozen=True)
class WorkerRuntime:
    """What one process reads its slots with; see :func:`build_runtime`."""

    readers: list[SplitReader]
    read_ahead: ReadAhead | None
    meter: Meter
    converters: Converters  # to the output format, ``transform`` applied
    transport: Transport
    new_readers: Callable[[], list[SplitReader]] | None = None   # another set of ``readers`` (no read-ahead)
    more: list[list[SplitReader]] = field(default_factory=list, compare=False)   # the sets made so far

    def readers_of(self, index: int) -> list[SplitReader]:
        """Set ``index`` of this process's readers, for a process that reads several streams at once (the canonical
        slots of ``order="canonical"``, each with readers of its own): set 0 is :attr:`readers`, the others are made
        when first asked, without read-ahead."""
        if index == 0:
            return self.readers
        assert self.new_readers is not None, "a runtime of one set of readers"
        while len(self.more) < index:
            self.more.append(self.new_readers())
        return self.more[index - 1]


def build_runtime(plan: Plan, storage: Storage, options: Options, fill_nulls: Any, transport: Transport,
                  meter: Meter, *, worker_id: int | None, pickled_by: int | None) -> WorkerRuntime:
    """Set up this process's readers and converters, once. ``worker_id``: this worker's, None in the
    trainer's process; ``pickled_by``: the process that pickled the dataset for this worker, if it
    came by pickle (spawn, forkserver), which the worker then watches."""
    in_worker = worker_id is not None
    if in_worker:
        watch_trainer(pickled_by)
        settle_worker()
    # one reader per interleaved split, each with a full read size: smaller reads of side-by-side
    # splits would save a little memory but decode about 20% slower
    read_rows = max(options.batch_size, READ_BATCH_ROWS)
    prefetcher = storage.prefetcher
    read_ahead = None if prefetcher is None else ReadAhead(plan, prefetcher, storage.read_ahead)
    output_format = options.output_format
    # values an output format cannot hold are found as read, where the file is known
    check = make_value_check(output_format, plan.schema, fill_nulls)
    row_ids = row_ids_for(plan) if options.with_row_ids else None
    schema = read_schema(plan, options)
    readers = [SplitReader(plan, storage, read_rows, use_threads=not in_worker, read_ahead=read_ahead, meter=meter,
                           check=check, row_ids=row_ids) for _ in range(options.interleave)]
    converters = make_converters(output_format, schema, fill_nulls, options.transform,
                                 batches_per_transfer=transport.batches_per_transfer, in_worker=in_worker)

    units = UnitCache()   # shared by the sets: canonical slots that read parts of one unit decode it once

    def new_readers() -> list[SplitReader]:
        return [SplitReader(plan, storage, read_rows, use_threads=not in_worker, meter=meter, check=check,
                            row_ids=row_ids, unit_cache=units) for _ in range(options.interleave)]

    return WorkerRuntime(readers, read_ahead, meter, converters, transport, new_readers)


def read_schema(plan: Plan, options: Options) -> pa.Schema:
    """The schema of the batches read: the plan's, with the row-id columns when asked for."""
    return with_row_id_fields(plan.schema) if options.with_row_ids else plan.schema


def trainer_convert(plan: Plan, options: Options, fill_nulls: Any) -> Callable[[Any], Any]:
    """A record batch to a batch of the output format, ``transform`` applied, in the trainer's process
    (the batches stitched from the workers' last rows, see ``_stitch``)."""
    return with_transform(make_converter(options.output_format, read_schema(plan, options), fill_nulls,
                                          in_worker=False), options.transform)


class WorkerSide:
    """A dataset's side in the process that reads it: the loader's :class:`Transport`, this process's
    meter, and its :class:`WorkerRuntime`, built on the first read. Pickled for a worker (spawn,
    forkserver), it keeps the transport and which process pickled it, and leaves the rest behind."""

    def __init__(self) -> None:
        self.transport = Transport()
        self.meter: Meter | None = None  # this process's metrics, once it reads
        self._runtime: WorkerRuntime | None = None
        self._pickled_by: int | None = None  # the process that pickled this side for a worker
        self._unpickled_in: int | None = None

    def use_transport(self, transport: Transport) -> None:
        """How workers hand their batches over: the loader's one call, before its workers start."""
        if transport != self.transport:
            self._runtime = None  # its converters follow batches_per_transfer
        self.transport = transport

    def forget(self) -> None:
        """Drop the runtime (a new plan): the next read builds one for it."""
        self._runtime = None

    def runtime(self, plan: Plan, storage: Storage, options: Options, fill_nulls: Any) -> WorkerRuntime:
        """This process's readers and converters, built once."""
        if self._runtime is None:
            info = get_worker_info()
            if self.meter is None:
                board = self.transport.board
                self.meter = Meter(board.row(info.id) if info is not None and board is not None else None)
            # pickled for this worker (spawn, forkserver): by the trainer, which may not be the parent
            pickled_by = self._pickled_by if self._unpickled_in == os.getpid() else None
            self._runtime = build_runtime(plan, storage, options, fill_nulls, self.transport, self.meter,
                                          worker_id=None if info is None else info.id, pickled_by=pickled_by)
        return self._runtime

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "meter": None, "_runtime": None, "_pickled_by": os.getpid()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._unpickled_in = os.getpid()


def open_stream(runtime: WorkerRuntime, epochs: Epochs, slot: Slot, start: WorkerState,
                options: Options, readers: list[SplitReader] | None = None) -> MixStream[Position, WorkerState]:
    """The stream of ``slot`` in the epoch of worker state ``start``, from it, read by ``runtime``: what the slot
    reads (``epochs.slot_epoch``: its share as one source) opened as every slot's stream is
    (:func:`~arrowstream._worker.open_slot.open_slot_stream`), its states a dataset's. ``readers``: other readers
    than the runtime's own (one set of :meth:`WorkerRuntime.readers_of`, without read-ahead)."""
    epoch = epochs.slot_epoch(slot, start.epoch, state=start)
    reading = SourceReading(runtime.readers, share_where(slot, start.epoch), runtime.read_ahead) if readers is None \
        else SourceReading(readers, share_where(slot, start.epoch))
    return open_slot_stream(epoch, epochs.stream_start(start), {DATASET: reading}, options, dataset=True)
