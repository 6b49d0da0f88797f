"""A mixture worker's state: where a slot stands in each source of its epoch, as a small JSON dict.

Pure. :class:`MixWorkerState` is what a worker's ``state_dict`` says (docs/state-format.md, "Mixture states");
:class:`MixPosition` is the same place, compact, as it travels with every batch of a chunk.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._core.cursor import Cursor
from .._core.fields import REMEDY, Fields, shorten
from .._mixing.quotas import PASS_LAYOUTS, TRACKS
from ..errors import StateError

MIX_WORKER_KIND = "arrowstream.mixture_worker"
MIX_STATE_VERSION = 4  # 4: options.pass_layout (absent before: "tracks"); 3: options.batch_order (absent before:
# "permuted"); 2: each source's data may hold its layout (data_identity); older versions load unchanged

EVEN, PERMUTED = "even", "permuted"
BATCH_ORDERS = (EVEN, PERMUTED)
"""How the shuffle buffer mixes a batch's sources (``options.batch_order``): ``even`` spreads each source's
share evenly over the batch (:func:`~arrowstream._mixing.span.even_order`; states from version 3 on); ``permuted``
puts the batch's rows in a seeded permutation of their own (states of versions 1 and 2: a run resumed from one
keeps it, and says so in its own states). In both, each source's rows come in its shuffle window's order.
Without a shuffle buffer, a batch holds its sources one after another."""


@dataclass(frozen=True)
class SourceCursor:
    """Where a slot stands in one source's rows of an epoch: the segment, the cursor in it, rows taken."""

    segment: int
    cursor: Cursor | None  # None: the segment's first row
    taken: int

    def to_dict(self) -> dict[str, Any]:
        return {"segment": self.segment, "cursor": None if self.cursor is None else self.cursor.to_dict(),
                "taken": self.taken}

    @classmethod
    def from_dict(cls, value: Any, where: str) -> SourceCursor:
        fields = Fields(value, where)
        raw = fields.value.get("cursor")
        cursor = None if raw is None else Cursor.from_dict(raw, f"{where}.cursor")
        return cls(fields.integer("segment"), cursor, fields.integer("taken"))


@dataclass(frozen=True)
class SourceEpoch:
    """A source in a mixture epoch: where its passes stand when the epoch starts, and its quota."""

    start: int
    quota: int


CompactCursor = tuple[int, Any, int]
"""A source's place as a :class:`MixPosition` carries it: ``(part, cursor fields or None, taken)`` (a dataset's one
source, ``arrowstream._state.one_source``: the cursor itself instead of its fields)."""


class MixPosition(NamedTuple):
    """A mixture worker's place after one batch, compact (it travels with every batch of a chunk, so plain
    tuples that pickle fast): its counters and, per source in order, ``(part, cursor fields or None, taken)``."""

    rows: int
    batches: int
    rows_dropped: int
    complete: bool
    cursors: tuple[CompactCursor, ...]


@dataclass(frozen=True)
class MixWorkerState:
    """A mixture worker's position in its epoch; see docs/mixing.md."""

    epoch: int
    rank: int
    world_size: int
    worker_id: int
    num_workers: int
    rows: int
    batches: int
    rows_dropped: int
    epoch_complete: bool
    options: dict[str, Any]
    history: list[tuple[int, dict[str, int]]]  # the quotas in effect from each epoch on (see _mixing.quotas.positions)
    epochs: dict[str, SourceEpoch]      # every source's start and quota in this epoch
    cursors: dict[str, SourceCursor]    # this slot's place in each source's rows
    data: dict[str, dict[str, Any]]     # each source's data identity
    elastic: dict[str, Any] | None = None   # an epoch re-planned from another topology: the old cursors

    def at(self, position: MixPosition, names: Sequence[str]) -> MixWorkerState:
        """This state, moved to ``position`` (the cursors of sources ``names``, in order)."""
        moved = [SourceCursor(part, None if fields is None else Cursor(*fields), taken)
                 for part, fields, taken in position.cursors]
        cursors = {**self.cursors, **dict(zip(names, moved, strict=True))}
        return dataclasses.replace(self, rows=position.rows, batches=position.batches,
                                   rows_dropped=position.rows_dropped, epoch_complete=position.complete,
                                   cursors=cursors)

    def place(self, rows: int, batches: int, rows_dropped: int, complete: bool,
              cursors: tuple[CompactCursor, ...]) -> MixPosition:
        """Where a stream from this state stands after a batch (``_mixing.stream.StreamStart``)."""
        return MixPosition(rows, batches, rows_dropped, complete, cursors)

    def state_at(self, position: MixPosition, names: Sequence[str], complete: bool) -> MixWorkerState:
        """:meth:`at` (``_mixing.stream.StreamStart``); ``position`` says whether the epoch is complete there."""
        del complete
        return self.at(position, names)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": MIX_WORKER_KIND, "version": MIX_STATE_VERSION, "epoch": self.epoch,
                "slot": {"rank": self.rank, "world_size": self.world_size, "worker_id": self.worker_id,
                         "num_workers": self.num_workers},
                "rows": self.rows, "batches": self.batches, "rows_dropped": self.rows_dropped,
                "epoch_complete": self.epoch_complete, "options": dict(self.options),
                "history": [[first, dict(quotas)] for first, quotas in self.history],
                "sources": {name: {"start": e.start, "quota": e.quota, **self.cursors[name].to_dict(),
                                   "data": self.data[name]} for name, e in self.epochs.items()},
                **({} if self.elastic is None else {"elastic": self.elastic})}

    @classmethod
    def from_dict(cls, value: Any, where: str = "mixture worker state") -> MixWorkerState:
        fields = Fields(value, where)
        if fields.value.get("kind") != MIX_WORKER_KIND:
            raise StateError(f"the {where} has kind {shorten(fields.value.get('kind'))}, expected "
                             f"{MIX_WORKER_KIND!r}: not a mixture's state (a StructuredDataset's state loads into "
                             f"its own loader); {REMEDY}")
        version = fields.integer("version")
        if not 1 <= version <= MIX_STATE_VERSION:
            raise StateError(f"the {where} has version {version}; this arrowstream reads mixture states of versions "
                             f"1 to {MIX_STATE_VERSION}: upgrade arrowstream to load it")
        slot = fields.mapping("slot")
        options = dict(fields.mapping("options").value)
        if version < 3:   # its batches mixed their sources by a seeded permutation each, as a resume goes on to
            options.setdefault("batch_order", PERMUTED)
        if options.get("batch_order") not in BATCH_ORDERS:
            raise StateError(f"the {where}'s options.batch_order is {shorten(options.get('batch_order'))}, expected "
                             f"one of {list(BATCH_ORDERS)}; {REMEDY}")
        if version < 4:   # its passes were laid out in per-slot tracks (see _mixing.quotas.PASS_LAYOUTS)
            options.setdefault("pass_layout", TRACKS)
        if options.get("pass_layout") not in PASS_LAYOUTS:
            raise StateError(f"the {where}'s options.pass_layout is {shorten(options.get('pass_layout'))}, expected "
                             f"one of {list(PASS_LAYOUTS)}; {REMEDY}")
        history = _history(fields.sequence("history"), f"{where}.history")
        sources = fields.mapping("sources")
        epochs, cursors, data = {}, {}, {}
        for name in sources.value:
            entry = sources.mapping(name)
            epochs[name] = SourceEpoch(entry.integer("start"), entry.integer("quota"))
            cursors[name] = SourceCursor.from_dict(entry.value, f"{where}.sources.{name}")
            data[name] = entry.mapping("data").value
        return cls(fields.integer("epoch"), slot.integer("rank"), slot.integer("world_size"),
                   slot.integer("worker_id"), slot.integer("num_workers"), fields.integer("rows"),
                   fields.integer("batches"), fields.integer("rows_dropped"), fields.boolean("epoch_complete"),
                   dict(options), history, epochs, cursors, data, fields.value.get("elastic"))


def _history(entries: list[Any], where: str) -> list[tuple[int, dict[str, int]]]:
    """``[[first epoch, {source: quota}], ...]``, first epochs rising from 0."""
    history: list[tuple[int, dict[str, int]]] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, (list, tuple)) or len(entry) != 2 or not isinstance(entry[1], dict):
            raise StateError(f"the {where}[{index}] is {shorten(entry)}, expected [first epoch, {{source: quota}}]; {REMEDY}")
        first = Fields({"epoch": entry[0]}, f"{where}[{index}]").integer("epoch")
        quotas = Fields(entry[1], f"{where}[{index}][1]")
        history.append((first, {str(name): quotas.integer(name) for name in entry[1]}))
    firsts = [first for first, _ in history]
    if not history or firsts[0] != 0 or any(b <= a for a, b in itertools.pairwise(firsts)):
        raise StateError(f"the {where} starts its epochs at {shorten(firsts)}, expected rising epochs from 0; {REMEDY}")
    return history
