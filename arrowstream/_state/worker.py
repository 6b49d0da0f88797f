"""The checkpoint state: versioned, JSON-only, small; migrations from every older version.

A worker's state is its cursor in a pure pipeline (plan -> epoch order -> slot -> interleaved
rows -> shuffle windows): the splits it has open, in its reading order, with the source row offset
inside each, and how far into the current shuffle window it is (see :mod:`arrowstream._core.cursor`).
Orders and assignments are recomputed on load, never stored; no rows, buffers,
paths or credentials are stored. See ``docs/state-format.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._core.cursor import Cursor
from .._core.fields import REMEDY, Fields, is_int, shorten
from .._core.order import Slot, SlotGrid
from .._core.plan_types import PLANNING_VERSION, PLANNING_VERSIONS
from ..errors import StateError, StateMismatchError, StateVersionError
from .identity import STRICT, DataIdentity, check_same_data

STATE_VERSION = 12
WORKER_KIND = "arrowstream.worker"   # a dataset's worker state and a mixture's (from v12): ``reads`` says which
MIXTURE_WORKER_KIND_V4 = "arrowstream.mixture_worker"   # a mixture's worker state before version 12 (its versions 1-4)
LOADER_KIND = "arrowstream.loader"   # a dataset's loader state and a mixture's (from v11): ``reads`` says which
CHECKPOINT_KIND = "arrowstream.checkpoint"  # every rank's loader state, merged
DATASET, MIXTURE = "dataset", "mixture"
READS = (DATASET, MIXTURE)
"""What a loader state's (from v11) and a worker state's (from v12) ``reads`` may say: the loader that wrote it
read a ``StructuredDataset`` (or an ``IcebergDataset``) or a ``Mixture`` (a dataset's older states read a dataset)."""

MAX_REPLANS = 64
"""The most re-plans of one epoch (``elastic.before`` nested) a worker state may hold: one per topology change."""

EVEN, LPT = "even", "lpt"
ELASTIC_CUTS = (EVEN, LPT)
"""How an epoch re-planned for another topology gives the rows left to the new workers (``elastic.cut``):
``even`` cuts them into equal stretches, one per new worker (from state version 9 on); ``lpt`` gave whole
items by longest processing time (earlier versions; a state taken inside such an epoch resumes with it)."""


def _loader_v1_to_v2(state: dict[str, Any]) -> dict[str, Any]:
    """v2 adds ``batches_per_transfer``; v1 loaders sent one batch per message."""
    return {**state, "batches_per_transfer": 1}


def _worker_v1_to_v2(state: dict[str, Any]) -> dict[str, Any]:
    """The worker state did not change in v2."""
    return dict(state)


def _loader_v2_to_v3(state: dict[str, Any]) -> dict[str, Any]:
    """The loader state did not change in v3."""
    return dict(state)


def _worker_v2_to_v3(state: dict[str, Any]) -> dict[str, Any]:
    """v3 keeps a cursor per open split (interleave) and the shuffle window; v2 read one split
    at a time and had no shuffle buffer."""
    cursor = Fields(state["cursor"], "worker state cursor (version 2)")
    split_index, row_offset = cursor.integer("split_index"), cursor.integer("row_offset")
    return {**state, "cursor": {"lanes": [[split_index, row_offset]], "next_split_index": split_index + 1,
                                "turn_index": 0, "block_offset": 0, "window_index": 0, "window_offset": 0}}


def _loader_v3_to_v4(state: dict[str, Any]) -> dict[str, Any]:
    """v4 names the loader's rank and world size; v3 loaders ran on one rank."""
    return {**state, "rank": 0, "world_size": 1}


def _worker_v3_to_v4(state: dict[str, Any]) -> dict[str, Any]:
    """v4 keeps ``even_batches`` among the stream options (v3 ran on one rank, where it is off),
    and can be in an epoch re-planned for another topology (``elastic``, replays in the cursor)."""
    return {**state, "options": {**state["options"], "even_batches": False},
            "cursor": {**state["cursor"], "replay_index": 0, "replay_offset": 0}, "elastic": None}


def _loader_v4_to_v5(state: dict[str, Any]) -> dict[str, Any]:
    """The loader state did not change in v5."""
    return dict(state)


def _worker_v4_to_v5(state: dict[str, Any]) -> dict[str, Any]:
    """v5 names the Iceberg snapshot the data was read from and its schema (``data.snapshot_id``,
    ``data.schema_id``); files have none."""
    return {**state, "data": {**state["data"], "snapshot_id": None, "schema_id": None}}


def _checkpoint_v4_to_v5(state: dict[str, Any]) -> dict[str, Any]:
    """The merged checkpoint did not change in v5 (its rank states migrate on their own)."""
    return dict(state)


def _worker_v5_to_v6(state: dict[str, Any]) -> dict[str, Any]:
    """v6 names the planning version the worker's splits were cut with (``options.planning``); every
    earlier state was taken on planning version 1."""
    return {**state, "options": {**state["options"], "planning": 1}}


def _loader_v5_to_v6(state: dict[str, Any]) -> dict[str, Any]:
    """The loader state did not change in v6 (its worker states migrate on their own)."""
    return dict(state)


def _checkpoint_v5_to_v6(state: dict[str, Any]) -> dict[str, Any]:
    """The merged checkpoint did not change in v6 (its rank states migrate on their own)."""
    return dict(state)


def _unchanged_in_v7(state: dict[str, Any]) -> dict[str, Any]:
    """v7 adds the ``dynamic`` ledger to the loader states of ``assignment="dynamic"`` (which v6 did not
    have); every earlier state is a static one, unchanged."""
    return dict(state)


def _unchanged_in_v8(state: dict[str, Any]) -> dict[str, Any]:
    """v8 adds optional keys only: ``skips`` and ``pending_skip`` to loader states (``loader.skip``) and
    ``data.layout`` to worker states (``data_identity="layout"``); a v7 state has none of them, unchanged."""
    return dict(state)


def _worker_v8_to_v9(state: dict[str, Any]) -> dict[str, Any]:
    """v9 names how an epoch re-planned for another topology cut the rows left over the new workers
    (``elastic.cut``): every earlier re-plan gave out whole items by longest processing time ("lpt")."""
    elastic = state.get("elastic")
    return {**state, "elastic": None if elastic is None else {**elastic, "cut": LPT}}


def _loader_v8_to_v9(state: dict[str, Any]) -> dict[str, Any]:
    """v9 adds ``yielded`` to the dynamic ledger (the rows of the epoch handed out and the sum of their
    positions, checked against the rows it leaves); a v8 ledger has none: ``None``, not checked."""
    if "dynamic" not in state:
        return dict(state)
    return {**state, "dynamic": {**state["dynamic"], "yielded": None}}


def _unchanged_in_v9(state: dict[str, Any]) -> dict[str, Any]:
    """The merged checkpoint did not change in v9 (its loader states migrate on their own)."""
    return dict(state)


def _loader_v9_to_v10(state: dict[str, Any]) -> dict[str, Any]:
    """v10 adds ``replanned`` to the dynamic ledger (every old rank's rest of an epoch re-planned for another
    world size, which v9 refused); a v9 ledger's epoch was laid out from the plan: ``None``."""
    if "dynamic" not in state:
        return dict(state)
    return {**state, "dynamic": {**state["dynamic"], "replanned": None}}


def _unchanged_in_v10(state: dict[str, Any]) -> dict[str, Any]:
    """Worker states and the merged checkpoint did not change in v10 (its loader states migrate on their own)."""
    return dict(state)


def _loader_v10_to_v11(state: dict[str, Any]) -> dict[str, Any]:
    """v11 writes a dataset's loader state and a mixture's as one kind, whose ``reads`` says which it read;
    every earlier state of this kind is a dataset's."""
    return {**state, "reads": DATASET}


def _unchanged_in_v11(state: dict[str, Any]) -> dict[str, Any]:
    """Worker states and the merged checkpoint did not change in v11 (its loader states migrate on their own)."""
    return dict(state)


def _worker_v11_to_v12(state: dict[str, Any]) -> dict[str, Any]:
    """v12 writes a dataset's worker state and a mixture's as one kind, whose ``reads`` says which it read; every
    earlier state of this kind is a dataset's (a mixture's, of the retired kind, migrates in one step:
    :func:`upgraded_worker`)."""
    return {**state, "reads": DATASET}


def _unchanged_in_v12(state: dict[str, Any]) -> dict[str, Any]:
    """Loader states and the merged checkpoint did not change in v12 (their worker states migrate on their own)."""
    return dict(state)


def _mixture_worker_to_v12(state: dict[str, Any]) -> dict[str, Any]:
    """A mixture's worker state of the retired kind (versions 1 to 4) as version 12 has it: the one worker kind with
    ``reads: "mixture"``, its counters under ``counters``, ``elastic`` null where absent (an epoch not re-planned)
    and otherwise with the ``cut`` a dataset's names (``"even"``: a mixture always cut the rows left into equal
    stretches) and, before 4, ``pass_layout`` ``"tracks"`` (the layout of its old slots' epoch), and the options it read with filled in where its version had no field for them: ``batch_order`` (before 3:
    every batch a seeded permutation of its rows, ``"permuted"``) and ``pass_layout`` (before 4: passes read in
    per-slot tracks, ``"tracks"``). Its sources (``history``, ``sources``) are unchanged."""
    version = state.get("version")
    if not is_int(version) or not isinstance(version, int) or not 1 <= version <= 4:
        raise StateVersionError(
            f"a state of kind {MIXTURE_WORKER_KIND_V4!r} has version {shorten(version)}, but a mixture's worker "
            f"wrote that kind as versions 1 to 4 only (from version 12 on it writes {WORKER_KIND!r} with reads "
            f"{MIXTURE!r}); it was not written by arrowstream")
    options = Fields(state, "mixture worker state").mapping("options").value
    defaults = {"batch_order": "permuted"} if version < 3 else {}   # literal: what those versions did, frozen
    if version < 4:
        defaults["pass_layout"] = "tracks"
    elastic = state.get("elastic")
    if elastic is not None:   # cut evenly over the new slots, as a mixture always re-planned
        elastic = {**({} if version >= 4 else {"pass_layout": "tracks"}), **Fields(elastic, "elastic").value,
                   "cut": EVEN}
    moved = {key: value for key, value in state.items() if key not in ("rows", "batches", "rows_dropped")}
    return {**moved, "kind": WORKER_KIND, "version": STATE_VERSION, "reads": MIXTURE,
            "counters": {key: state[key] for key in ("rows", "batches", "rows_dropped") if key in state},
            "options": {**defaults, **options}, "elastic": elastic}


# (kind, n) -> the step from version n to n + 1 of that kind; each takes and returns a plain dict
MIGRATIONS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    (LOADER_KIND, 1): _loader_v1_to_v2,
    (WORKER_KIND, 1): _worker_v1_to_v2,
    (LOADER_KIND, 2): _loader_v2_to_v3,
    (WORKER_KIND, 2): _worker_v2_to_v3,
    (LOADER_KIND, 3): _loader_v3_to_v4,
    (WORKER_KIND, 3): _worker_v3_to_v4,
    (LOADER_KIND, 4): _loader_v4_to_v5,
    (WORKER_KIND, 4): _worker_v4_to_v5,
    (CHECKPOINT_KIND, 4): _checkpoint_v4_to_v5,
    (WORKER_KIND, 5): _worker_v5_to_v6,
    (LOADER_KIND, 5): _loader_v5_to_v6,
    (CHECKPOINT_KIND, 5): _checkpoint_v5_to_v6,
    (WORKER_KIND, 6): _unchanged_in_v7,
    (LOADER_KIND, 6): _unchanged_in_v7,
    (CHECKPOINT_KIND, 6): _unchanged_in_v7,
    (WORKER_KIND, 7): _unchanged_in_v8,
    (LOADER_KIND, 7): _unchanged_in_v8,
    (CHECKPOINT_KIND, 7): _unchanged_in_v8,
    (WORKER_KIND, 8): _worker_v8_to_v9,
    (LOADER_KIND, 8): _loader_v8_to_v9,
    (CHECKPOINT_KIND, 8): _unchanged_in_v9,
    (WORKER_KIND, 9): _unchanged_in_v10,
    (LOADER_KIND, 9): _loader_v9_to_v10,
    (CHECKPOINT_KIND, 9): _unchanged_in_v10,
    (WORKER_KIND, 10): _unchanged_in_v11,
    (LOADER_KIND, 10): _loader_v10_to_v11,
    (CHECKPOINT_KIND, 10): _unchanged_in_v11,
    (WORKER_KIND, 11): _worker_v11_to_v12,
    (LOADER_KIND, 11): _unchanged_in_v12,
    (CHECKPOINT_KIND, 11): _unchanged_in_v12,
}


def check_planning(options: Fields) -> int:
    """The planning version a worker state's options name: one this arrowstream cuts splits by, or a
    ``StateError`` (``StateVersionError`` for a version it does not know)."""
    planning = options.value.get("planning")
    if not is_int(planning):
        raise StateError(f"the state's {options.name('planning')} is {shorten(planning)}, expected the planning "
                         f"version as an int (1 to {PLANNING_VERSION}); {REMEDY}")
    if planning not in PLANNING_VERSIONS:
        raise StateVersionError(
            f"the state's {options.name('planning')} is {planning}: its splits were cut by a planning version "
            f"this arrowstream does not know (it knows {', '.join(map(str, PLANNING_VERSIONS))}); upgrade "
            "arrowstream to load it, or start without loading the checkpoint")
    return int(planning)


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
    cut: str = EVEN   # how the rows left go to the new workers: see ELASTIC_CUTS
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
        ``before`` chain under it (each of the same epoch), iteratively: the innermost re-plan first."""
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
        parsed: Leftovers | None = None
        for value, at in reversed(chain):
            epoch, world_size, num_workers, cursors, cut = cls.read(Fields(value, at), ELASTIC_CUTS)
            if parsed is not None and parsed.epoch != epoch:
                raise StateError(f"the state's {at}.before.epoch is {parsed.epoch}, but {at}.epoch is {epoch}: the "
                                 f"re-plans of one epoch all name that epoch; {REMEDY}")
            parsed = cls(epoch, world_size, num_workers,
                         tuple(None if c is None else Cursor.from_dict(c, f"{at}.cursors[{i}]")
                               for i, c in enumerate(cursors)), cut, parsed)
        assert parsed is not None   # chain holds the source itself
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
        """The head of a worker state of the current version (:func:`upgraded_worker`), every field typed and in
        range; ``StateError`` naming the field if not."""
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


def upgraded_worker(state: Any) -> dict[str, Any]:
    """A worker state of any version, a dataset's or a mixture's (of the retired kind
    :data:`MIXTURE_WORKER_KIND_V4` too), migrated to :data:`STATE_VERSION` (its fields not checked yet)."""
    if isinstance(state, dict) and state.get("kind") == MIXTURE_WORKER_KIND_V4:
        try:
            return _mixture_worker_to_v12(state)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, StateError):
                raise
            raise StateError(f"a state of kind {MIXTURE_WORKER_KIND_V4!r} is malformed: migrating it to version "
                             f"{STATE_VERSION} failed on {shorten(exc)}; {REMEDY}") from None
    return upgrade(state, WORKER_KIND)


def read_head(state: Any, reads: str, where: str) -> tuple[Fields, WorkerHead]:
    """A worker state migrated (:func:`upgraded_worker`) and its head read, refused unless its loader read
    ``reads``: another front's worker state (a mixture's in a dataset's loader, or the reverse) does not resume
    this one."""
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


def upgrade(state: Any, kind: str) -> dict[str, Any]:
    """Check the kind and version of a state dict and migrate it to :data:`STATE_VERSION`."""
    if not isinstance(state, dict):
        raise StateError(f"expected an arrowstream state dict, got {type(state).__name__}; "
                         "pass the dict returned by loader.state_dict()")
    if state.get("kind") != kind:
        raise StateError(f"expected a state of kind {kind!r}, got kind {shorten(state.get('kind'))}; "
                         "pass the dict returned by loader.state_dict() unchanged")
    version = state.get("version")
    if not is_int(version) or not isinstance(version, int) or version < 1:
        raise StateVersionError(f"the state has no valid format version (got {shorten(version)}); "
                                "it was not written by arrowstream")
    if version > STATE_VERSION:
        raise StateVersionError(
            f"the state has format version {shorten(version)}, newer than this arrowstream reads "
            f"(up to {STATE_VERSION}); upgrade arrowstream to load it")
    while version < STATE_VERSION:
        if (kind, version) not in MIGRATIONS:
            raise StateVersionError(f"a state of kind {kind!r} has version {version}, but that kind exists from a later "
                                    "version on; it was not written by arrowstream")
        try:
            state = MIGRATIONS[(kind, version)](state)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(f"a state of kind {kind!r} and version {version} is malformed: migrating it to version "
                             f"{version + 1} failed on {shorten(exc)}; {REMEDY}") from None
        version += 1
        state["version"] = version
    return dict(state)


def check_same_table(saved: DataIdentity, current: DataIdentity, name: str = "the table") -> None:
    """Refuse a state taken on an Iceberg table that has been dropped and recreated under its name since."""
    if None not in (saved.table_uuid, current.table_uuid) and saved.table_uuid != current.table_uuid:
        raise StateMismatchError(
            f"checkpoint was taken on {name} before it was dropped and recreated under the same name: "
            f"recreated (table uuid changed: saved {saved.table_uuid}, now {current.table_uuid}); the snapshot the "
            f"checkpoint read ({saved.snapshot_id}) went with the old table, so the rest of that epoch cannot be "
            "read exactly. Start the run without loading the checkpoint")


def check_compatible(saved: WorkerState, data: DataIdentity, options: dict[str, Any],
                     data_identity: str = STRICT, *, followed: bool = False) -> None:
    """Refuse a state taken on other data (compared as ``data_identity`` says: see ``_state.identity``) or with
    other stream options (saved vs current). ``followed``: the dataset plans as the checkpoint ``saved`` is part of
    said (its first state's planning version: a loader, or ``load_state_dict``, made it), so another version is a
    checkpoint whose states disagree, not one to load whole."""
    if (saved.data.snapshot_id is None) != (data.snapshot_id is None):
        kinds = ("files", "an Iceberg table")
        raise StateMismatchError(
            f"checkpoint was taken on {kinds[saved.data.snapshot_id is not None]}, this dataset reads "
            f"{kinds[data.snapshot_id is not None]}; load it into the kind of dataset it was taken with")
    check_same_table(saved.data, data)
    if (saved.data.snapshot_id, saved.data.schema_id) != (data.snapshot_id, data.schema_id):
        raise StateMismatchError(
            f"checkpoint was taken on snapshot {saved.data.snapshot_id} (schema {saved.data.schema_id}) of the "
            f"table, this dataset reads snapshot {data.snapshot_id} (schema {data.schema_id}); build the dataset "
            f"with snapshot_id={saved.data.snapshot_id} (or None, and the checkpoint's snapshot is followed), "
            "or start without loading the checkpoint")
    check_same_data(saved.data, data, data_identity)
    if saved.options.get("planning") != options.get("planning"):
        versions = (f"checkpoint's splits were cut by planning version {shorten(saved.options.get('planning'))}, "
                    f"this dataset cuts them by version {shorten(options.get('planning'))}")
        if followed:   # the loader made the dataset plan as the checkpoint's first state did: its states disagree
            raise StateMismatchError(
                f"{versions}, as the checkpoint's first state says (loading a checkpoint makes the dataset plan as it "
                "did): its states disagree, so they are not one run's checkpoint; pass the dict returned by "
                "loader.state_dict() (or gather_state_dict, merge_state_dicts) unchanged, every state from one step")
        raise StateMismatchError(
            f"{versions}; load the whole checkpoint with loader.load_state_dict() (or dataset.load_state_dict()), "
            "which makes the dataset plan as the checkpoint did, and keep its workers' states together")
    differing = sorted(str(k) for k in set(saved.options) | set(options)  # True is not 1, 1.0 is not 1
                       if saved.options.get(k) != options.get(k) or type(saved.options.get(k)) is not type(options.get(k)))
    if differing:
        pairs = ", ".join(f"{k if len(k) <= 80 else shorten(k)}: saved {shorten(saved.options.get(k))} vs current {shorten(options.get(k))}"
                          for k in differing[:8])
        raise StateMismatchError(
            f"checkpoint was taken with other stream options ({pairs}); build the dataset with the "
            "saved options to resume, or start without loading the checkpoint")


def check_slot(saved: WorkerState, slot: Slot) -> None:
    """Refuse a worker state of another worker or topology (the loader re-plans those: elastic resume)."""
    if (saved.slot.world_size, saved.slot.num_workers) != (slot.world_size, slot.num_workers):
        raise StateMismatchError(
            f"checkpoint was taken with world_size={saved.slot.world_size}, "
            f"num_workers={saved.slot.num_workers}, this loader runs world_size={slot.world_size}, "
            f"num_workers={slot.num_workers}; resume with the saved topology")
    if (saved.slot.rank, saved.slot.worker_id) != (slot.rank, slot.worker_id):
        raise StateMismatchError(
            f"this state belongs to rank {saved.slot.rank} worker {saved.slot.worker_id}, but was "
            f"loaded into rank {slot.rank} worker {slot.worker_id}; load the whole loader state "
            "with loader.load_state_dict()")
