"""The worker states' models: the head every worker state has (:class:`WorkerHead`), a dataset worker's state
(:class:`WorkerState`), and an epoch re-planned for another topology (:class:`ElasticHead`, :class:`Leftovers`).

A worker's state is its cursor in a pure pipeline (plan -> epoch order -> slot -> interleaved
rows -> shuffle windows): the splits it has open, in its reading order, with the source row offset
inside each, and how far into the current shuffle window it is (see :mod:`arrowstream._core.cursor`).
Orders and assignments are recomputed on load, never stored; no rows, buffers,
paths or credentials are stored. A state of an older version is migrated first
(:mod:`arrowstream._state.versions`); one is checked against a dataset in :mod:`arrowstream._state.compatible`.
See ``docs/state-format.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .._core.cursor import Cursor
from .._core.fields import REMEDY, Fields, shorten
from .._core.order import Slot, SlotGrid
from ..errors import StateError, StateMismatchError
from .identity import DataIdentity
from .versions import DATASET, MIXTURE, READS, STATE_VERSION, WORKER_KIND, check_planning, upgraded_worker

MAX_REPLANS = 64
"""The most re-plans of one epoch (``elastic.before`` nested) a worker state may hold: one per topology change."""

EVEN_CUT, LPT_CUT = "even", "lpt"
ELASTIC_CUTS = (EVEN_CUT, LPT_CUT)
"""How an epoch re-planned for another topology gives the rows left to the new workers (``elastic.cut``):
``even`` cuts them into equal stretches, one per new worker (from state version 9 on); ``lpt`` gave whole
items by longest processing time (earlier versions; a state taken inside such an epoch resumes with it)."""


@dataclass(frozen=True)
class ElasticHead:
    """What every epoch re-planned for another topology says in a worker state's ``elastic``, a dataset's and a
    mixture's alike (from version 12, under the same names): the re-planned epoch and the old topology, and
    (``cursors``, ``cut``: each subclass's fields) one entry per old (rank, worker) slot, in slot order, ``None``
    for a slot that had nothing left, and how the rows left were cut over the new slots (:data:`ELASTIC_CUTS`).
    What an old slot's entry is differs: a dataset's cursor (:class:`Leftovers`), a mixture's place in each source
    (``arrowstream._state.mixture.MixElastic``)."""

    epoch: int
    world_size: int
    num_workers: int

    def head_dict(self, cut: str) -> dict[str, Any]:
        return {"epoch": self.epoch, "world_size": self.world_size, "num_workers": self.num_workers, "cut": cut}

    @staticmethod
    def read(fields: Fields, cuts: Sequence[str]) -> tuple[int, int, int, list[Any], str]:
        """The head of an ``elastic`` (its epoch, old world size and num_workers, its old slots' raw entries, one
        per old slot, and its cut, one of ``cuts``); ``StateError`` naming the field if not."""
        where = fields.where
        world_size, num_workers = fields.integer("world_size", 1), fields.integer("num_workers")
        cursors = fields.sequence("cursors")
        grid = SlotGrid(world_size, num_workers)
        if len(cursors) != grid.num_slots:
            raise StateError(f"the state's {where}.cursors holds {len(cursors)} entries, expected one per old worker: "
                             f"{grid.num_slots} for world_size={world_size}, "
                             f"num_workers={num_workers}; {REMEDY}")
        cut = fields.value.get("cut")
        if cut not in cuts:
            raise StateError(f"the state's {where}.cut is {shorten(cut)}, expected one of {list(cuts)}; {REMEDY}")
        return fields.integer("epoch"), world_size, num_workers, cursors, str(cut)


@dataclass(frozen=True)
class Leftovers(ElasticHead):
    """Where every worker of the old topology stood when an epoch was re-planned for a new one.

    ``cursors`` has one entry per old (rank, worker) slot, in slot order: its cursor in
    ``epoch``, or ``None`` when it had nothing left. The new workers' share of the rest of the
    epoch is a pure function of this (see :mod:`arrowstream._layout.elastic`).
    """

    cursors: tuple[Cursor | None, ...]
    cut: str = EVEN_CUT   # how the rows left go to the new workers: see ELASTIC_CUTS
    before: Leftovers | None = None   # the old topology's own epoch was re-planned from this; None: it was planned

    @property
    def depth(self) -> int:
        """How many re-plans the epoch went through: 1 for the rest of a planned epoch, 2 when that was itself
        re-planned, and so on."""
        return 1 if self.before is None else 1 + self.before.depth

    def to_dict(self) -> dict[str, Any]:
        out = {**self.head_dict(self.cut), "cursors": [None if c is None else c.to_dict() for c in self.cursors]}
        if self.before is not None:   # absent for the rest of a planned epoch (as every state before it wrote)
            out["before"] = self.before.to_dict()
        return out

    @classmethod
    def from_dict(cls, source: Any, where: str = "elastic") -> Leftovers:
        """Parse the ``elastic`` field of a worker state (typed and bounded; ``StateError`` if not), and the
        ``before`` chain under it (:func:`read_chain`)."""
        return read_chain(source, where, cls._one)

    @classmethod
    def _one(cls, value: Any, where: str, before: Leftovers | None) -> Leftovers:
        epoch, world_size, num_workers, cursors, cut = cls.read(Fields(value, where), ELASTIC_CUTS)
        return cls(epoch, world_size, num_workers,
                   tuple(None if c is None else Cursor.from_dict(c, f"{where}.cursors[{i}]")
                         for i, c in enumerate(cursors)), cut, before)


E = TypeVar("E", bound=ElasticHead)


def read_chain(source: Any, where: str, one: Callable[[Any, str, E | None], E]) -> E:
    """An ``elastic`` and the ``before`` chain under it (each a re-plan of the same epoch), parsed iteratively,
    the innermost re-plan first, each link by ``one(value, where, the link it was re-planned from)``; at most
    :data:`MAX_REPLANS` links. ``StateError`` naming the field if not."""
    chain: list[tuple[Any, str]] = []
    top = where
    while source is not None:
        if len(chain) >= MAX_REPLANS:
            raise StateError(
                f"the state's {top} nests more than {MAX_REPLANS} re-plans of one epoch under 'before'; "
                f"arrowstream writes one per topology change and resumes at most {MAX_REPLANS} in one epoch "
                f"(each is laid out again on load); {REMEDY}")
        chain.append((source, where))
        source = source.get("before") if isinstance(source, dict) else None
        where = f"{where}.before"
    parsed: E | None = None
    for value, at in reversed(chain):
        link = one(value, at, parsed)
        if parsed is not None and parsed.epoch != link.epoch:
            raise StateError(f"the state's {at}.before.epoch is {parsed.epoch}, but {at}.epoch is {link.epoch}: the "
                             f"re-plans of one epoch all name that epoch; {REMEDY}")
        parsed = link
    assert parsed is not None   # the chain holds the source itself
    return parsed


@dataclass(frozen=True)
class WorkerHead:
    """What every worker state says under the same names, a dataset's and a mixture's alike (from version 12): what
    its loader read, its epoch and slot, its counters, whether its epoch is complete, and the options it read with.
    A worker's own fields come beside it: a dataset's ``data``, ``cursor`` and ``elastic`` (:class:`WorkerState`), a
    mixture's ``history``, ``sources`` and ``elastic`` (``arrowstream._state.mixture.MixWorkerState``)."""

    reads: str
    epoch: int
    slot: Slot
    rows: int
    batches: int
    rows_dropped: int
    epoch_complete: bool
    options: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        slot = self.slot
        return {"kind": WORKER_KIND, "version": STATE_VERSION, "reads": self.reads, "epoch": self.epoch,
                "slot": {"rank": slot.rank, "world_size": slot.world_size, "worker_id": slot.worker_id,
                         "num_workers": slot.num_workers},
                "counters": {"rows": self.rows, "batches": self.batches, "rows_dropped": self.rows_dropped},
                "epoch_complete": self.epoch_complete, "options": dict(self.options)}

    @classmethod
    def from_fields(cls, fields: Fields) -> WorkerHead:
        """The head of a worker state of the current version (:func:`~arrowstream._state.versions.upgraded_worker`),
        every field typed and in range; ``StateError`` naming the field if not."""
        reads = fields.get("reads")
        if reads not in READS:
            raise StateError(f"the state's {fields.name('reads')} is {shorten(reads)}, expected what the loader "
                             f"that wrote it reads: {' or '.join(map(repr, READS))}; {REMEDY}")
        slot, counters = fields.mapping("slot"), fields.mapping("counters")
        world_size, num_workers = slot.integer("world_size", 1), slot.integer("num_workers")
        workers_per_rank = SlotGrid(world_size, num_workers).workers_per_rank
        return cls(reads, fields.integer("epoch"),
                   Slot(slot.integer("rank", 0, world_size - 1), world_size,
                        slot.integer("worker_id", 0, workers_per_rank - 1), num_workers),
                   counters.integer("rows"), counters.integer("batches"), counters.integer("rows_dropped"),
                   fields.boolean("epoch_complete"), dict(fields.mapping("options").value))



def read_head(state: Any, reads: str, where: str) -> tuple[Fields, WorkerHead]:
    """A worker state migrated (:func:`~arrowstream._state.versions.upgraded_worker`) and its head read, refused
    unless its loader read ``reads``: another front's worker state (a mixture's in a dataset's loader, or the
    reverse) does not resume this one."""
    fields = Fields(upgraded_worker(state), where)
    head = WorkerHead.from_fields(fields)
    if head.reads != reads:
        build = "Mixture.create_dataloader" if head.reads == MIXTURE else \
            "StructuredDataset.create_dataloader (IcebergDataset for a table)"
        raise StateMismatchError(
            f"the {where} was taken by a worker of a {head.reads}'s loader (its reads is {head.reads!r}), this loader "
            f"reads a {reads}; a {head.reads}'s state resumes only a {head.reads}: load the checkpoint into the loader "
            f"of {build}, with the data and options of the run that took it")
    return fields, head


@dataclass(frozen=True)
class WorkerState:
    """One worker's position in one epoch."""

    data: DataIdentity
    options: dict[str, Any]
    epoch: int
    slot: Slot
    cursor: Cursor
    rows: int
    batches: int
    rows_dropped: int
    epoch_complete: bool
    elastic: Leftovers | None = None  # set in an epoch re-planned for another topology

    @property
    def head(self) -> WorkerHead:
        """What this state says as every worker state does (see :class:`WorkerHead`)."""
        return WorkerHead(DATASET, self.epoch, self.slot, self.rows, self.batches, self.rows_dropped,
                          self.epoch_complete, self.options)

    def to_dict(self) -> dict[str, Any]:
        return {**self.head.to_dict(), "data": self.data.to_dict(), "cursor": self.cursor.to_dict(),
                "elastic": None if self.elastic is None else self.elastic.to_dict()}

    @classmethod
    def from_dict(cls, state: Any, where: str = "worker state") -> WorkerState:
        """Parse a dataset's worker state: every field of its JSON type (a bool is not an int) and, where that
        alone decides it, in range; ``StateError`` naming the field if not (``StateMismatchError`` for a
        mixture's). The plan decides the rest (see :mod:`arrowstream._state.position`)."""
        fields, head = read_head(state, DATASET, where)
        if "canonical" in fields.value:
            slots = fields.value["canonical"].get("slots") if isinstance(fields.value["canonical"], dict) else None
            raise StateMismatchError(
                f"the {where} was taken with order='canonical' (canonical_slots={slots}): it holds the cursors of "
                "canonical slots, which resume only a dataset of that order; build the dataset with "
                f"order='canonical', canonical_slots={slots}")
        check_planning(fields.mapping("options"))
        elastic = fields.get("elastic")
        return cls(
            data=DataIdentity.from_dict(fields.mapping("data")),
            options=head.options,
            epoch=head.epoch,
            slot=head.slot,
            cursor=Cursor.from_dict(fields.get("cursor"), f"{where}.cursor"),
            rows=head.rows,
            batches=head.batches,
            rows_dropped=head.rows_dropped,
            epoch_complete=head.epoch_complete,
            elastic=None if elastic is None else Leftovers.from_dict(elastic, f"{where}.elastic"),
        )
