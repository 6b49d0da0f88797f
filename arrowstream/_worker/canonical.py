"""A worker's epoch under ``order="canonical"``, opened: one stream per canonical slot it reads, side by side.

Each canonical slot is read as a dataset slot of the canonical layout is (its share as one source,
``arrowstream._layout.share_parts``), with readers of its own (``WorkerRuntime.readers_of``); the worker's batch is
their chunks side by side (:class:`~arrowstream._layout.canonical_stream.CanonicalStream`). Opening is once per
epoch and worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._layout.canonical import Canonical, canonical_slot
from .._layout.canonical_stream import CanonicalPosition, CanonicalStream
from .._layout.share_parts import share_where
from .._mixing.slot_epoch import SourceReading
from .._state.one_source import DATASET
from .iterator import Opened
from .open_slot import open_slot_stream
from .transport import default_batches_per_transfer

if TYPE_CHECKING:
    from .._core.order import Slot
    from .._layout.layout import Epochs
    from .._state.canonical import CanonicalState
    from .runtime import WorkerRuntime


def open_canonical_epoch(runtime: Callable[[], WorkerRuntime], epochs: Epochs, canonical: Canonical, slot: Slot,
                         epoch: int, pending: CanonicalState | None,
                         options: dict[str, Any]) -> Opened[CanonicalPosition, CanonicalState]:
    """The stream of (rank, worker) ``slot`` in ``epoch``: the canonical slots it reads (``canonical``), laid out by
    ``epochs`` (the canonical slots' epochs), each from its state in ``pending`` (a loaded worker state of this
    epoch) or the epoch's start. ``options``: what its states' head says."""
    built = runtime()
    streams = []
    for index, number in enumerate(canonical.physical_range(slot)):
        inner = canonical_slot(number, canonical.slots)
        start = pending.states[index] if pending is not None and pending.epoch == epoch else epochs.start(inner, epoch)
        reading = SourceReading(built.readers_of(index + 1), share_where(inner, epoch))
        streams.append(open_slot_stream(epochs.slot_epoch(inner, epoch, state=start), epochs.stream_start(start),
                                        {DATASET: reading}, epochs.options, dataset=True))   # type: ignore[arg-type]
    rows = canonical.chunk * len(streams)   # of each batch of this worker
    stream = CanonicalStream(streams, slot, canonical.slots, options, per_fill=default_batches_per_transfer(rows))
    return Opened(stream, built.converters, built.meter, built.transport, by_record=True)
