"""The state format's versions, and how a state of any older version is migrated to the current one.

Every state dict names its ``kind`` (a worker's, a loader's, a merged checkpoint's) and its format ``version``;
:func:`upgrade` refuses a newer version than this arrowstream reads and migrates an older one step by step
(:data:`MIGRATIONS`: one step per kind and version, each a pure function of a plain dict), and
:func:`upgraded_worker` takes a mixture's worker state of the retired kind in one step. A worker state also names
the planning version its splits were cut by (:func:`check_planning`), which this arrowstream must know. What a step
fills in for what older versions did (a cut's name, a batch order) is a literal, frozen: a step never changes when
a later version renames something. See ``docs/state-format.md`` (Versions and migrations).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._core.fields import REMEDY, Fields, is_int, shorten
from .._core.plan_types import PLANNING_VERSION, PLANNING_VERSIONS
from ..errors import StateError, StateVersionError

STATE_VERSION = 14
WORKER_KIND = "arrowstream.worker"   # a dataset's worker state and a mixture's (from v12): ``reads`` says which
MIXTURE_WORKER_KIND_V4 = "arrowstream.mixture_worker"   # a mixture's worker state before version 12 (its versions 1-4)
RETIRED_MIXTURE_WORKER_BECOMES = 12   # the version of the one worker kind that kind migrates to (then on step by step)
LOADER_KIND = "arrowstream.loader"   # a dataset's loader state and a mixture's (from v11): ``reads`` says which
CHECKPOINT_KIND = "arrowstream.checkpoint"  # every rank's loader state, merged
DATASET, MIXTURE = "dataset", "mixture"
READS = (DATASET, MIXTURE)
"""What a loader state's (from v11) and a worker state's (from v12) ``reads`` may say: the loader that wrote it
read a ``StructuredDataset`` (or an ``IcebergDataset``) or a ``Mixture`` (a dataset's older states read a dataset)."""


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
    return {**state, "elastic": None if elastic is None else {**elastic, "cut": "lpt"}}   # literal: frozen


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


def _unchanged_in_v13(state: dict[str, Any]) -> dict[str, Any]:
    """v13 adds ``order="canonical"`` (datasets): a canonical worker state is the head plus ``canonical`` (the number
    of canonical slots and each one's dataset worker state) and its options name ``order`` and ``canonical_slots``;
    every earlier state was taken with ``order="topology"`` (no such keys), unchanged."""
    return dict(state)


def _unchanged_in_v14(state: dict[str, Any]) -> dict[str, Any]:
    """v14 adds ``canonical.past`` to a canonical worker state (the batches and rows each canonical slot handed out
    past its state, which a resume passes over again); a v13 state has none (absent: none), unchanged."""
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
                   "cut": "even"}   # literal: the cut version 12 names "even", frozen
    moved = {key: value for key, value in state.items() if key not in ("rows", "batches", "rows_dropped")}
    return {**moved, "kind": WORKER_KIND, "version": RETIRED_MIXTURE_WORKER_BECOMES, "reads": MIXTURE,
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
    (WORKER_KIND, 12): _unchanged_in_v13,
    (LOADER_KIND, 12): _unchanged_in_v13,
    (CHECKPOINT_KIND, 12): _unchanged_in_v13,
    (WORKER_KIND, 13): _unchanged_in_v14,
    (LOADER_KIND, 13): _unchanged_in_v14,
    (CHECKPOINT_KIND, 13): _unchanged_in_v14,
}


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


def upgraded_worker(state: Any) -> dict[str, Any]:
    """A worker state of any version, a dataset's or a mixture's (of the retired kind
    :data:`MIXTURE_WORKER_KIND_V4` too), migrated to :data:`STATE_VERSION` (its fields not checked yet)."""
    if isinstance(state, dict) and state.get("kind") == MIXTURE_WORKER_KIND_V4:
        try:
            state = _mixture_worker_to_v12(state)   # then on from version 12, as any worker state of that version
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, StateError):
                raise
            raise StateError(f"a state of kind {MIXTURE_WORKER_KIND_V4!r} is malformed: migrating it to version "
                             f"{RETIRED_MIXTURE_WORKER_BECOMES} failed on {shorten(exc)}; {REMEDY}") from None
    return upgrade(state, WORKER_KIND)


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
