"""The checkpoint state: versioned, JSON-only, small; migrations from every older version.

A worker's state is its cursor in a pure pipeline (plan -> epoch order -> slot -> interleaved
rows -> shuffle windows): the splits it has open, in its reading order, with the source row offset
inside each, and how far into the current shuffle window it is (see :mod:`arrowstream._cursor`).
Orders and assignments are recomputed on load, never stored; no rows, buffers,
paths or credentials are stored. See ``docs/state-format.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._cursor import Cursor
from ._order import Slot
from .errors import StateError, StateMismatchError, StateVersionError

STATE_VERSION = 5
WORKER_KIND = "arrowstream.worker"
LOADER_KIND = "arrowstream.loader"
CHECKPOINT_KIND = "arrowstream.checkpoint"  # every rank's loader state, merged


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
    cursor = state["cursor"]
    split_index, row_offset = int(cursor["split_index"]), int(cursor["row_offset"])
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
}


@dataclass(frozen=True)
class DataIdentity:
    """What the state remembers of the data: enough to refuse other data, nothing more."""

    fingerprint: str
    num_files: int
    num_rows: int
    snapshot_id: int | None = None  # the Iceberg snapshot read, and the schema it is read in; None for files
    schema_id: int | None = None


@dataclass(frozen=True)
class ElasticSource:
    """Where every worker of the old topology stood when an epoch was re-planned for a new one.

    ``cursors`` has one entry per old (rank, worker) slot, in slot order: its cursor in
    ``epoch``, or ``None`` when it had nothing left. The new workers' share of the rest of the
    epoch is a pure function of this (see :mod:`arrowstream._elastic`).
    """

    epoch: int
    world_size: int
    num_workers: int
    cursors: tuple[Cursor | None, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "world_size": self.world_size, "num_workers": self.num_workers,
                "cursors": [None if c is None else c.to_dict() for c in self.cursors]}

    @classmethod
    def from_dict(cls, source: dict[str, Any]) -> ElasticSource:
        return cls(int(source["epoch"]), int(source["world_size"]), int(source["num_workers"]),
                   tuple(None if c is None else Cursor.from_dict(c) for c in source["cursors"]))


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
    elastic: ElasticSource | None = None  # set in an epoch re-planned for another topology

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": WORKER_KIND,
            "version": STATE_VERSION,
            "data": {"fingerprint": self.data.fingerprint, "num_files": self.data.num_files,
                     "num_rows": self.data.num_rows, "snapshot_id": self.data.snapshot_id,
                     "schema_id": self.data.schema_id},
            "options": dict(self.options),
            "epoch": self.epoch,
            "slot": {"rank": self.slot.rank, "world_size": self.slot.world_size,
                     "worker_id": self.slot.worker_id, "num_workers": self.slot.num_workers},
            "cursor": self.cursor.to_dict(),
            "counters": {"rows": self.rows, "batches": self.batches, "rows_dropped": self.rows_dropped},
            "epoch_complete": self.epoch_complete,
            "elastic": None if self.elastic is None else self.elastic.to_dict(),
        }

    @classmethod
    def from_dict(cls, state: Any) -> WorkerState:
        state = upgrade(state, WORKER_KIND)
        try:
            data, slot, cursor, counters = state["data"], state["slot"], state["cursor"], state["counters"]
            return cls(
                data=DataIdentity(str(data["fingerprint"]), int(data["num_files"]), int(data["num_rows"]),
                                  _optional_int(data["snapshot_id"]), _optional_int(data["schema_id"])),
                options=dict(state["options"]),
                epoch=int(state["epoch"]),
                slot=Slot(int(slot["rank"]), int(slot["world_size"]), int(slot["worker_id"]),
                          int(slot["num_workers"])),
                cursor=Cursor.from_dict(cursor),
                rows=int(counters["rows"]),
                batches=int(counters["batches"]),
                rows_dropped=int(counters["rows_dropped"]),
                epoch_complete=bool(state["epoch_complete"]),
                elastic=None if state["elastic"] is None else ElasticSource.from_dict(state["elastic"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(
                f"the arrowstream worker state is missing or has a malformed field ({exc!r}); "
                "pass the dict returned by loader.state_dict() unchanged") from None


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def upgrade(state: Any, kind: str) -> dict[str, Any]:
    """Check the kind and version of a state dict and migrate it to :data:`STATE_VERSION`."""
    if not isinstance(state, dict):
        raise StateError(f"expected an arrowstream state dict, got {type(state).__name__}; "
                         "pass the dict returned by loader.state_dict()")
    if state.get("kind") != kind:
        raise StateError(f"expected a state of kind {kind!r}, got kind {state.get('kind')!r}; "
                         "pass the dict returned by loader.state_dict() unchanged")
    version = state.get("version")
    if not isinstance(version, int) or version < 1:
        raise StateVersionError(f"the state has no valid format version (got {version!r}); "
                                "it was not written by arrowstream")
    if version > STATE_VERSION:
        raise StateVersionError(
            f"the state has format version {version}, newer than this arrowstream reads "
            f"(up to {STATE_VERSION}); upgrade arrowstream to load it")
    while version < STATE_VERSION:
        if (kind, version) not in MIGRATIONS:
            raise StateVersionError(f"a state of kind {kind!r} has version {version}, but that kind exists from a later "
                                    "version on; it was not written by arrowstream")
        state = MIGRATIONS[(kind, version)](state)
        version += 1
        state["version"] = version
    return dict(state)


def check_compatible(saved: WorkerState, data: DataIdentity, options: dict[str, Any]) -> None:
    """Refuse a state taken on other data or with other stream options (saved vs current)."""
    if (saved.data.snapshot_id is None) != (data.snapshot_id is None):
        kinds = ("files", "an Iceberg table")
        raise StateMismatchError(
            f"checkpoint was taken on {kinds[saved.data.snapshot_id is not None]}, this dataset reads "
            f"{kinds[data.snapshot_id is not None]}; load it into the kind of dataset it was taken with")
    if (saved.data.snapshot_id, saved.data.schema_id) != (data.snapshot_id, data.schema_id):
        raise StateMismatchError(
            f"checkpoint was taken on snapshot {saved.data.snapshot_id} (schema {saved.data.schema_id}) of the "
            f"table, this dataset reads snapshot {data.snapshot_id} (schema {data.schema_id}); build the dataset "
            f"with snapshot_id={saved.data.snapshot_id} (or None, and the checkpoint's snapshot is followed), "
            "or start without loading the checkpoint")
    if saved.data.fingerprint != data.fingerprint:
        raise StateMismatchError(
            f"checkpoint was taken on {saved.data.num_files} file(s) with {saved.data.num_rows} rows "
            f"(fingerprint {saved.data.fingerprint[:12]}), this dataset has {data.num_files} file(s) "
            f"with {data.num_rows} rows (fingerprint {data.fingerprint[:12]}); the files, their sizes "
            "or modification times differ. Point the dataset at the same data, or start without "
            "loading the checkpoint")
    differing = sorted(k for k in set(saved.options) | set(options) if saved.options.get(k) != options.get(k))
    if differing:
        pairs = ", ".join(f"{k}: saved {saved.options.get(k)!r} vs current {options.get(k)!r}" for k in differing)
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
