"""A dataset slot's share of an epoch as the parts of one source: how a dataset's slot is read as a mixture of one.

A slot's :class:`~arrowstream._layout.elastic.Share` is its replays (in an epoch re-planned for another topology:
the rests of old workers' shuffle windows) then its splits. As a source's parts
(:class:`~arrowstream._mixing.parts.Part`), each replay is a part read from the old worker's cursor with the old
worker's window seeds, and the splits are one part with the slot's own seeds: a
:class:`~arrowstream._mixing.stream.MixStream` of one :class:`~arrowstream._mixing.source_rows.SourceRows` over them gives
exactly the batches the slot's share gives (``tests/test_one_source.py``). Part ``i < len(share.replays)`` is replay
``i``; the splits' part, when they hold rows, is the last one.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._core.order import Slot, window_seed
from .._core.plan_types import split_rows
from .._mixing.parts import ListParts, Part
from .._mixing.slot_epoch import SlotEpoch, SourceParts, SourceReading, stream_of
from .._mixing.source_rows import ReadAhead
from .._mixing.stream import MixSlot, MixStream
from .._state.one_source import DATASET, DatasetStart
from .elastic import Share

if TYPE_CHECKING:
    from .._core.cursor import Position
    from .._core.interleave import PieceReader
    from .._state.worker import WorkerState


def share_parts(share: Share, *, seed: int, epoch: int, slot: Slot) -> ListParts:
    """``share`` (of ``slot`` in ``epoch``, shuffled by ``seed``) as a source's parts: each replay, then the splits
    as one part when they hold rows."""
    parts = [Part(replay.splits, replay.rows, functools.partial(window_seed, seed, epoch, replay.slot), replay.start)
             for replay in share.replays]
    rows = int(split_rows(share.splits).sum())
    if rows:
        parts.append(Part(tuple(share.splits), rows, functools.partial(window_seed, seed, epoch, slot)))
    return ListParts(parts)


def share_epoch(share: Share, *, seed: int, epoch: int, slot: Slot, max_batches: int | None, rows_known: bool,
                replanned: bool) -> SlotEpoch:
    """``share`` (of ``slot`` in ``epoch``) as the answer to the one epoch-layout question: one source,
    :data:`DATASET`, over :func:`share_parts`. ``max_batches``: the slot's ``even_batches`` limit; ``rows_known``:
    False when a filter (or ``bad_rows="skip"``) leaves rows out while reading; ``replanned``: the share is the rest
    of an epoch of another topology."""
    parts = share_parts(share, seed=seed, epoch=epoch, slot=slot)
    return SlotEpoch(MixSlot(epoch, slot.rank, slot.world_size, slot.worker_id, slot.num_workers),
                     (SourceParts(DATASET, parts),), max_batches, rows_known=rows_known, replanned=replanned)


def dataset_start(share: Share, state: WorkerState, interleave: int) -> DatasetStart:
    """Worker state ``state`` (in the epoch of ``share``) as the start of the stream of its one source."""
    return DatasetStart(state, [replay.start for replay in share.replays], [replay.rows for replay in share.replays],
                        len(share.splits), interleave)


def share_where(slot: Slot, epoch: int) -> str:
    """What the error of a part that gave fewer rows than its plan promised names (the readers name the file first)."""
    return f"the splits of rank {slot.rank} worker {slot.worker_id} in epoch {epoch}"


def share_stream(readers: Sequence[PieceReader], share: Share, start: WorkerState, *, seed: int, batch_size: int,
                 interleave: int, buffer_rows: int, drop_last: bool, max_batches: int | None, rows_known: bool,
                 read_ahead: ReadAhead | None = None) -> MixStream[Position, WorkerState]:
    """The stream of a dataset slot's ``share`` (of the slot and epoch of worker state ``start``, from where it
    stands), read as a mixture of one source over :func:`share_parts`; its positions and states are a dataset's.
    ``rows_known``: False when a filter (or ``bad_rows="skip"``) leaves rows out while reading; ``max_batches``:
    the slot's ``even_batches`` limit. Built as every slot's stream is (``arrowstream._mixing.slot_epoch``)."""
    slot = start.slot
    epoch = share_epoch(share, seed=seed, epoch=start.epoch, slot=slot, max_batches=max_batches,
                        rows_known=rows_known, replanned=False)
    return stream_of(epoch, dataset_start(share, start, interleave),
                     {DATASET: SourceReading(readers, share_where(slot, start.epoch), read_ahead)},
                     seed=seed, batch_size=batch_size, interleave=interleave, buffer_rows=buffer_rows,
                     drop_last=drop_last, whole_cursors=True, ends_when_asked=True)
