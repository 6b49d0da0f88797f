"""A mixture worker's state: where a slot stands in each source of its epoch, as a small JSON dict.

Pure. :class:`MixWorkerState` is what a worker's ``state_dict`` says (docs/state-format.md, "Worker states": from
version 12 the one worker kind, ``reads: "mixture"``, its head read and written as a dataset's is);
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
from .._core.order import Slot
from .._mixing.quotas import PASS_LAYOUTS, SPANS
from ..errors import StateError, StateMismatchError
from .versions import MIXTURE
from .worker import EVEN_CUT, ElasticHead, WorkerHead, read_chain, read_head

# The retired kind "arrowstream.mixture_worker" (versions 1 to 4) migrates to the one worker kind of version 12
# (``arrowstream._state.versions.upgraded_worker``): 4 added options.pass_layout (absent before: "tracks"), 3
# options.batch_order (absent before: "permuted"), 2 each source's data with its layout (data_identity).

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


@dataclass(frozen=True)
class MixElastic(ElasticHead):
    """A mixture epoch re-planned from the states of another topology (its worker states' ``elastic``): the head
    every ``elastic`` has (``arrowstream._state.worker.ElasticHead``) with each old slot's place in each source
    (``None``: that worker was done with the epoch), the rows left cut evenly (``cut``: ``"even"``, the only cut a
    mixture makes), and how the old slots' epoch laid its passes out (``pass_layout``, see
    ``arrowstream._mixing.quotas.PASS_LAYOUTS``)."""

    cursors: tuple[dict[str, SourceCursor] | None, ...]
    pass_layout: str = SPANS
    cut: str = EVEN_CUT
    before: MixElastic | None = None   # the old topology's own epoch was re-planned from this; None: it was planned

    def to_dict(self) -> dict[str, Any]:
        out = {**self.head_dict(self.cut), "pass_layout": self.pass_layout,
               "cursors": [None if c is None else {n: v.to_dict() for n, v in c.items()} for c in self.cursors]}
        if self.before is not None:   # absent for the rest of a planned epoch (as every state before it wrote)
            out["before"] = self.before.to_dict()
        return out

    @classmethod
    def from_dict(cls, value: Any, where: str) -> MixElastic:
        """Parse a mixture worker state's ``elastic`` (typed and bounded; ``StateError`` naming the field if not), and
        the ``before`` chain under it (``arrowstream._state.worker.read_chain``)."""
        return read_chain(value, where, cls._one)

    @classmethod
    def _one(cls, value: Any, where: str, before: MixElastic | None) -> MixElastic:
        fields = Fields(value, where)
        epoch, world_size, num_workers, entries, cut = cls.read(fields, (EVEN_CUT,))
        cursors: list[dict[str, SourceCursor] | None] = []
        for index, entry in enumerate(entries):
            if entry is None:
                cursors.append(None)
                continue
            if not isinstance(entry, dict):
                raise StateError(f"the state's {where}.cursors[{index}] is {shorten(entry)}, expected a dict (each "
                                 f"source's place) or null; {REMEDY}")
            cursors.append({str(n): SourceCursor.from_dict(v, f"{where}.cursors[{index}].{n}") for n, v in entry.items()})
        pass_layout = fields.get("pass_layout")
        if pass_layout not in PASS_LAYOUTS:
            raise StateError(f"the state's {where}.pass_layout is {shorten(pass_layout)}, expected one of "
                             f"{list(PASS_LAYOUTS)}; {REMEDY}")
        return cls(epoch, world_size, num_workers, tuple(cursors), pass_layout, cut, before)


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
    elastic: MixElastic | None = None   # an epoch re-planned from another topology: the old cursors

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

    @property
    def slot(self) -> Slot:
        """The (rank, worker) slot this state is of."""
        return Slot(self.rank, self.world_size, self.worker_id, self.num_workers)

    @property
    def head(self) -> WorkerHead:
        """What this state says as every worker state does (see ``arrowstream._state.worker.WorkerHead``)."""
        return WorkerHead(MIXTURE, self.epoch, self.slot, self.rows, self.batches, self.rows_dropped,
                          self.epoch_complete, self.options)

    def to_dict(self) -> dict[str, Any]:
        return {**self.head.to_dict(),
                "history": [[first, dict(quotas)] for first, quotas in self.history],
                "sources": {name: {"start": e.start, "quota": e.quota, **self.cursors[name].to_dict(),
                                   "data": self.data[name]} for name, e in self.epochs.items()},
                "elastic": None if self.elastic is None else self.elastic.to_dict()}

    @classmethod
    def from_dict(cls, value: Any, where: str = "mixture worker state") -> MixWorkerState:
        """Parse a mixture's worker state of any version (the retired kind migrated); ``StateError`` naming the
        field if not, ``StateMismatchError`` for a dataset's."""
        fields, head = read_head(value, MIXTURE, where)
        if "canonical" in fields.value:
            canonical = fields.value["canonical"]
            slots = canonical.get("slots") if isinstance(canonical, dict) else None
            raise StateMismatchError(
                f"the {where} was taken with order='canonical' (canonical_slots={slots}): it holds the cursors of "
                "canonical slots, which resume only a mixture of that order; build the mixture with "
                f"order='canonical', canonical_slots={slots}")
        options = head.options
        if options.get("batch_order") not in BATCH_ORDERS:
            raise StateError(f"the {where}'s options.batch_order is {shorten(options.get('batch_order'))}, expected "
                             f"one of {list(BATCH_ORDERS)}; {REMEDY}")
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
        slot, elastic = head.slot, fields.get("elastic")
        return cls(head.epoch, slot.rank, slot.world_size, slot.worker_id, slot.num_workers, head.rows, head.batches,
                   head.rows_dropped, head.epoch_complete, options, history, epochs, cursors, data,
                   None if elastic is None else MixElastic.from_dict(elastic, f"{where}.elastic"))


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
