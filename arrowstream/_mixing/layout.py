"""A mixture's epochs: every slot's parts of every source, and its rows of each.

Pure. A normal epoch follows from the history of quotas (:mod:`arrowstream._mixing.quotas`): a slot's parts
are its segments of the passes, laid out in spans (arithmetic: :class:`~arrowstream._mixing.parts.SpanParts`)
or, for a run resumed from a state of mixture state version 3 or older, in tracks. The epoch a checkpoint
of another topology was re-planned into follows from the old slots' cursors (:mod:`arrowstream._mixing.elastic`),
for the topology it was re-planned for. With a run's history of quotas (:meth:`MixEpochs.with_history`, a
:class:`MixLayout`), it answers what a slot reads of an epoch as a dataset's epochs do
(:mod:`arrowstream._mixing.slot_epoch`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._core.order import even_batch_limits
from .._core.plan_types import SplitTable
from .._state.mixture import MixElastic
from .elastic import replanned_parts
from .parts import ListParts, Part, Parts, SpanParts
from .quotas import (
    SPANS,
    Segment,
    epoch_segments,
    pass_order,
    positions,
    quotas_at,
    segment_splits,
    slot_quotas,
    span_first,
    span_taken,
)
from .slot_epoch import SlotEpoch, SourceParts
from .stream import MixSlot, source_seeds

if TYPE_CHECKING:
    from .._core.order import Slot

History = Sequence[tuple[int, dict[str, int]]]
_REPLANS_KEPT = 4   # re-planned epochs kept: the one read, and a few of the chain it was re-planned from


@dataclass(frozen=True)
class SourcePlan:
    """What the layout needs of a source: its name, splits and rows."""

    name: str
    splits: SplitTable
    rows: int


class MixEpochs:
    """Every slot's parts of every source, in normal epochs and in the one re-planned for this topology."""

    def __init__(self, sources: Sequence[SourcePlan], *, shuffle: bool, seed: int, batch_size: int, interleave: int,
                 buffer_rows: int, pass_layout: str = SPANS) -> None:
        self._sources = list(sources)
        self._shuffle, self._seed = shuffle, seed
        self._batch_size, self._interleave, self._buffer_rows = batch_size, interleave, buffer_rows
        self.pass_layout = pass_layout   # of normal epochs (see _mixing.quotas.PASS_LAYOUTS)
        self.elastic: tuple[MixElastic, int, int] | None = None   # re-planned for (world_size, num_workers)
        self._replanned: dict[tuple[Any, ...], list[dict[str, Parts]]] = {}

    def _track_segments(self, history: History, epoch: int, num_slots: int) -> dict[str, list[list[Segment]]]:
        starts, quotas = positions(history, epoch), quotas_at(history, epoch)
        return {s.name: epoch_segments(s.rows, starts.get(s.name, 0), quotas[s.name], num_slots)
                if quotas.get(s.name) else [[] for _ in range(num_slots)] for s in self._sources}

    def _normal_parts(self, history: History, slot: MixSlot, pass_layout: str | None = None) -> dict[str, Parts]:
        if (pass_layout or self.pass_layout) != SPANS:
            return self._track_parts(history, slot)
        starts, quotas = positions(history, slot.epoch), quotas_at(history, slot.epoch)
        out: dict[str, Parts] = {}
        for s in self._sources:
            quota = quotas.get(s.name, 0)
            out[s.name] = ListParts(()) if not quota else SpanParts(
                s.splits, rows=s.rows, start=starts.get(s.name, 0), quota=quota, num_slots=slot.num_slots,
                slot=slot.index, first=span_first(s.name, slot.num_slots), shuffle=self._shuffle, seed=self._seed,
                name=s.name, epoch=slot.epoch)
        return out

    def _track_parts(self, history: History, slot: MixSlot) -> dict[str, Parts]:
        segments = self._track_segments(history, slot.epoch, slot.num_slots)
        out: dict[str, Parts] = {}
        for s in self._sources:
            orders: dict[int, Any] = {}
            seeds = source_seeds(self._seed, s.name, slot)
            parts = []
            for index, segment in enumerate(segments[s.name][slot.index]):
                if segment.pass_index not in orders:
                    orders[segment.pass_index] = pass_order(len(s.splits), shuffle=self._shuffle, seed=self._seed,
                                                            name=s.name, pass_index=segment.pass_index)
                parts.append(Part(segment_splits(s.splits, orders[segment.pass_index], segment), segment.num_rows,
                                  functools.partial(seeds, index)))
            out[s.name] = ListParts(parts)
        return out

    def planned_parts(self, history: History, slot: MixSlot, pass_layout: str) -> dict[str, Parts]:
        """``slot``'s parts of every source in its epoch as planned (not re-planned), its passes laid out as
        ``pass_layout`` says: an old slot's, whose cursors an epoch re-planned for another topology keeps."""
        return self._normal_parts(history, slot, pass_layout)

    def replanned(self, slot: MixSlot) -> MixElastic | None:
        """The re-planned epoch ``slot`` is in, if it is in one."""
        if self.elastic is None:
            return None
        elastic, world_size, num_workers = self.elastic
        same = (slot.epoch, slot.world_size, slot.num_workers) == (elastic.epoch, world_size, num_workers)
        return elastic if same else None

    def parts(self, history: History, slot: MixSlot) -> dict[str, Parts]:
        """``slot``'s parts of every source in its epoch."""
        elastic = self.replanned(slot)
        if elastic is None:
            return self._normal_parts(history, slot)
        return self._replanned_epoch(history, elastic, slot.world_size, slot.num_workers)[slot.index]

    def old_parts(self, history: History, elastic: MixElastic) -> list[dict[str, Parts]]:
        """Each old slot's parts of every source in the epoch ``elastic`` re-planned, in slot order: as planned, its
        passes laid out as ``elastic.pass_layout`` says, or, when that epoch was itself re-planned
        (``elastic.before``), its parts of that re-plan: the chain is pure, however deep."""
        if elastic.before is not None:
            return self._replanned_epoch(history, elastic.before, elastic.world_size, elastic.num_workers)
        return [self._normal_parts(history, old, elastic.pass_layout)
                for old in self._slots(elastic.epoch, elastic.world_size, elastic.num_workers)]

    @staticmethod
    def _slots(epoch: int, world_size: int, num_workers: int) -> list[MixSlot]:
        return [MixSlot(epoch, rank, world_size, worker, num_workers)
                for rank in range(world_size) for worker in range(max(num_workers, 1))]

    def _replanned_epoch(self, history: History, elastic: MixElastic, world_size: int,
                         num_workers: int) -> list[dict[str, Parts]]:
        key = (json.dumps(elastic.to_dict()), world_size, num_workers, json.dumps(list(history)))
        if key not in self._replanned:
            news = self._slots(elastic.epoch, world_size, num_workers)
            old_parts = self.old_parts(history, elastic)
            out: list[dict[str, Parts]] = [{} for _ in news]
            for s in self._sources:
                per_old = [parts[s.name] for parts in old_parts]
                per_new = replanned_parts(per_old, elastic, s.name, news, seed=self._seed,
                                          batch_size=self._batch_size, interleave=self._interleave,
                                          buffer_rows=self._buffer_rows)
                for index, parts in enumerate(per_new):
                    out[index][s.name] = parts
            if len(self._replanned) >= _REPLANS_KEPT:   # the re-planned epoch, and those it was re-planned from
                del self._replanned[next(iter(self._replanned))]
            self._replanned[key] = out
        return self._replanned[key]

    def slot_rows(self, history: History, epoch: int, world_size: int, num_workers: int) -> list[dict[str, int]]:
        """Per slot of a topology: its rows of each source in ``epoch``."""
        slots = [MixSlot(epoch, rank, world_size, worker, num_workers)
                 for rank in range(world_size) for worker in range(max(num_workers, 1))]
        elastic = self.replanned(slots[0])
        if elastic is not None:
            epoch_parts = self._replanned_epoch(history, elastic, world_size, num_workers)
            return [{name: parts.rows for name, parts in slot_parts.items()} for slot_parts in epoch_parts]
        if self.pass_layout != SPANS:
            segments = self._track_segments(history, epoch, len(slots))
            return [{name: sum(seg.num_rows for seg in per_slot[slot.index]) for name, per_slot in segments.items()}
                    for slot in slots]
        quotas = quotas_at(history, epoch)
        firsts = {s.name: span_first(s.name, len(slots)) for s in self._sources}
        return [{s.name: span_taken(quotas.get(s.name, 0), len(slots), slot.index, firsts[s.name])
                 for s in self._sources} for slot in slots]

    def source_slot_rows(self, name: str, rows: int, start: int, quota: int, num_slots: int) -> list[int]:
        """Per slot: its rows of a source of ``rows`` rows a pass (named ``name``, which may be none of this
        mixture's: a checkpoint's source left out since) in an epoch that takes ``quota`` from ``start``."""
        if self.pass_layout != SPANS:
            return slot_quotas(rows, start, quota, num_slots)
        first = span_first(name, num_slots)
        return [span_taken(quota, num_slots, slot, first) for slot in range(num_slots)]

    def with_history(self, history: History, *, even_batches: bool, drop_last: bool,
                     batch_order: str | None) -> MixLayout:
        """These epochs as a run with ``history`` reads them: what each slot reads of an epoch (the one
        epoch-layout question, :class:`~arrowstream._mixing.slot_epoch.EpochLayouts`), each slot's batches capped
        under ``even_batches`` (of batches that drop a short last one with ``drop_last``), its batches ordered as
        ``batch_order`` says (None: one source after another)."""
        return MixLayout(self, tuple(history), even_batches, drop_last, batch_order)

    def slot_limits(self, history: History, epoch: int, world_size: int, num_workers: int, drop_last: bool) -> list[int]:
        """Per slot of a topology: the batches it yields in ``epoch`` under ``even_batches``."""
        rows = [sum(q.values()) for q in self.slot_rows(history, epoch, world_size, num_workers)]
        return even_batch_limits(rows, world_size, self._batch_size, drop_last)

    def source_names(self) -> list[str]:
        """The sources' names, in the order a batch takes them."""
        return [s.name for s in self._sources]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_replanned": {}}


@dataclass(frozen=True)
class MixLayout:
    """A mixture's epochs with one history of quotas (see :meth:`MixEpochs.with_history`): its answer to what a slot
    reads of an epoch."""

    epochs: MixEpochs
    history: History
    even_batches: bool
    drop_last: bool
    batch_order: str | None

    def slot_epoch(self, slot: Slot, epoch: int) -> SlotEpoch:
        """What ``slot`` reads in ``epoch``: its parts of every source (of the epoch re-planned for its topology,
        when it is in one), its ``even_batches`` limit, the order inside its batches."""
        mix_slot = MixSlot(epoch, slot.rank, slot.world_size, slot.worker_id, slot.num_workers)
        parts = self.epochs.parts(self.history, mix_slot)
        limit = None
        if self.even_batches:
            limit = self.epochs.slot_limits(self.history, epoch, slot.world_size, slot.num_workers,
                                            self.drop_last)[slot.index]
        return SlotEpoch(mix_slot, tuple(SourceParts(name, parts[name]) for name in self.epochs.source_names()),
                         limit, batch_order=self.batch_order,
                         replanned=self.epochs.replanned(mix_slot) is not None)
