"""One way to open a slot's stream, for both fronts: :func:`open_slot_stream`.

A front answers what the slot reads of its epoch (a :class:`~arrowstream._mixing.slot_epoch.SlotEpoch`, from its
epoch layout: a dataset's ``Epochs``, a mixture's ``MixEpochs`` with its history), gives where the slot starts (a
dataset's ``DatasetStart``, a mixture's ``MixWorkerState``) and how each source is read (its readers). What stays
different between the fronts is only how readers are made: a dataset's runtime builds its readers once per process
(``arrowstream._worker.runtime``), a mixture makes each source's per epoch, small sources held
(``arrowstream._worker.mixture``). Opening is once per epoch and worker; the per-batch path is the stream's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from .._mixing.slot_epoch import stream_of

if TYPE_CHECKING:
    import pyarrow as pa

    from .._mixing.slot_epoch import OpenStart, SlotEpoch, SourceReading
    from .._mixing.stream import MixStream
    from .._planning.options import Options

P = TypeVar("P")
S = TypeVar("S")


def open_slot_stream(epoch: SlotEpoch, start: OpenStart[P, S], reading: Mapping[str, SourceReading],
                     options: Options, *, cast: Callable[[str, pa.RecordBatch], pa.RecordBatch] | None = None,
                     dataset: bool = False) -> MixStream[P, S]:
    """The stream of ``epoch`` (what the slot reads of it) from ``start``, each source read as ``reading`` says,
    with ``options``' batch size, interleave, shuffle buffer, ``drop_last`` and seed. ``cast``: each source's rows
    to the mixture's schema; ``dataset``: positions and the epoch's end as a dataset's worker states have them
    (each carries the cursor itself; the epoch is complete once a batch past its last one is asked for)."""
    return stream_of(epoch, start, reading, seed=options.seed, batch_size=options.batch_size,
                     interleave=options.interleave, buffer_rows=options.shuffle_buffer_size,
                     drop_last=options.drop_last, cast=cast, whole_cursors=dataset, ends_when_asked=dataset)
