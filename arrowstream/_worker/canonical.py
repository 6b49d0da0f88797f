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
from .._layout.canonical_stream import CanonicalPosition, CanonicalStream, fill_batches, pass_over
from .iterator import Opened
from .runtime import open_stream

if TYPE_CHECKING:
    from .._core.order import Slot
    from .._layout.layout import Epochs
    from .._planning.options import Options
    from .._state.canonical import CanonicalState
    from .runtime import WorkerRuntime


def open_canonical_epoch(runtime: Callable[[], WorkerRuntime], epochs: Epochs, read_options: Options,
                         canonical: Canonical, slot: Slot, epoch: int, pending: CanonicalState | None,
                         options: dict[str, Any]) -> Opened[CanonicalPosition, CanonicalState]:
    """The stream of (rank, worker) ``slot`` in ``epoch``: the canonical slots it reads (``canonical``), laid out by
    ``epochs`` (the canonical slots' epochs) and read with ``read_options`` (batches of the chunk), each from its
    state in ``pending`` (a loaded worker state of this epoch) or the epoch's start, with readers of its own.
    ``options``: what its states' head says."""
    built = runtime()
    streams = []
    loaded = pending if pending is not None and pending.epoch == epoch else None
    for index, number in enumerate(canonical.physical_range(slot)):
        inner = canonical_slot(number, canonical.slots)
        start = loaded.states[index] if loaded is not None else epochs.start(inner, epoch)
        opened = open_stream(built, epochs, inner, start, read_options, readers=built.readers_of(index + 1))
        if loaded is not None:
            pass_over(opened, loaded.past_of(index), number)
        streams.append(opened)
    rows = canonical.chunk * len(streams)   # of each batch of this worker
    stream = CanonicalStream(streams, slot, canonical.slots, options, per_fill=fill_batches(rows))
    return Opened(stream, built.converters, built.meter, built.transport, by_record=True)
