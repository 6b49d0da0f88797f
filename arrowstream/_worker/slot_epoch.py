"""A dataset slot's epoch, opened: the stream of the splits the epoch layout gives the slot, from a loaded
worker state or the epoch's start, with the runtime that reads it (how ``assignment="static"`` opens a
worker's epoch; ``StructuredDataset.open_epoch`` hands its values here).

Opening is once per epoch and worker; the per-batch path is the stream's (the share read as one source,
``arrowstream._layout.share_parts``) and the
iterator's (``arrowstream._worker.iterator``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .._state.resume import nothing_left, pending_for_epoch
from .iterator import Opened
from .runtime import WorkerRuntime, open_stream

if TYPE_CHECKING:
    from .._core.cursor import Position
    from .._core.order import Slot
    from .._layout.layout import Epochs
    from .._mixing.stream import MixStream
    from .._planning.options import Options
    from .._state.worker import WorkerState


def open_slot_epoch(runtime: Callable[[], WorkerRuntime], epochs: Epochs, options: Options, slot: Slot, epoch: int,
                    pending: WorkerState | None) -> Opened[Position, WorkerState]:
    """The stream of ``slot`` in ``epoch`` of ``epochs`` read with ``options``, from ``pending`` (a loaded worker
    state, refused when it cannot lead to ``epoch``) or the epoch's start; ``runtime`` builds this process's
    readers once, when first asked."""
    pending = pending_for_epoch(pending, slot, epoch, lambda state: slot_done(runtime, epochs, options, state, slot))
    stream, built = slot_stream(runtime(), epochs, options, slot, epoch, pending), runtime()
    files_between = epochs.files_between
    return Opened(stream, built.converters, built.meter, built.transport,
                  files_between=lambda start, end: files_between(slot, epoch, start.cursor, end.cursor),
                  by_record=True)


def slot_stream(runtime: WorkerRuntime, epochs: Epochs, options: Options, slot: Slot, epoch: int,
                start: WorkerState | None) -> MixStream[Position, WorkerState]:
    """The stream of ``slot`` in ``epoch``, from worker state ``start`` (``None``: the epoch's start)."""
    start = start or epochs.start(slot, epoch)
    return open_stream(runtime, epochs, slot, start, options)


def slot_done(runtime: Callable[[], WorkerRuntime], epochs: Epochs, options: Options, state: WorkerState,
              slot: Slot) -> bool:
    """True when a worker state of ``slot`` has handed out every row of its epoch it ever will."""
    return nothing_left(epochs.batches_left(state, slot), options,
                        lambda wanted: slot_stream(runtime(), epochs, options, slot, state.epoch, state).holds(wanted))
