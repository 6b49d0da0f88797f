"""The loader's part of a state, read strictly: arrowstream's wrapper and the merged checkpoint.

One reader of each level for a dataset's loader and a mixture's: from version 11 both write a loader state of
kind ``"arrowstream.loader"``, whose ``reads`` says what the loader read (``"dataset"`` or ``"mixture"``), and
merge into a checkpoint of kind ``"arrowstream.checkpoint"``. A dataset's older states (versions 1 to 10)
migrate step by step (``arrowstream._state.versions.MIGRATIONS``); a mixture's, of the retired kinds
``"arrowstream.mixture_loader"`` and ``"arrowstream.mixture_checkpoint"`` (version 1 only), are renamed to
version 11 in one step.

The torchdata dict inside (the ``dataloader`` field) is read by ``arrowstream._loader.torchdata_state``,
the one module that knows its layout; the worker states inside that are left to the dataset or mixture,
which knows the plan (``StructuredDataset.check_state``, a mixture's ``check_worker_state``).
"""

from __future__ import annotations

from typing import Any

from .._core.fields import REMEDY, Fields, is_int, shorten
from ..errors import StateError, StateVersionError
from .skips import read_skips
from .versions import CHECKPOINT_KIND, DATASET, LOADER_KIND, MIXTURE, READS, STATE_VERSION, upgrade

MIXTURE_LOADER_KIND_V1 = "arrowstream.mixture_loader"   # a mixture's loader state before version 11
MIXTURE_CHECKPOINT_KIND_V1 = "arrowstream.mixture_checkpoint"   # its merged checkpoint before version 11
_RETIRED = {LOADER_KIND: MIXTURE_LOADER_KIND_V1, CHECKPOINT_KIND: MIXTURE_CHECKPOINT_KIND_V1}
LOADER_KINDS = (LOADER_KIND, MIXTURE_LOADER_KIND_V1)
"""The kinds a loader state is read from (the second, a mixture's before version 11, is migrated)."""
CHECKPOINT_KINDS = (CHECKPOINT_KIND, MIXTURE_CHECKPOINT_KIND_V1)
"""The kinds a merged checkpoint is read from (the second, a mixture's before version 11, is migrated)."""


def _mixture_v1_to_v11(state: dict[str, Any], kind: str) -> dict[str, Any]:
    """A mixture's loader state or merged checkpoint of version 1 (its retired kind) as version 11 has it: the
    kind renamed and, in a loader state, ``reads`` added and ``batches_per_transfer`` filled in where the first
    mixture states, whose workers sent one batch per message, lack it. The ranks of a checkpoint migrate on
    their own."""
    version = state.get("version")
    if not is_int(version) or version != 1:
        raise StateVersionError(
            f"a state of kind {_RETIRED[kind]!r} has version {shorten(version)}, but a mixture's loader wrote that "
            f"kind as version 1 only (from version 11 on it writes {kind!r}); it was not written by arrowstream")
    renamed = {**state, "kind": kind, "version": STATE_VERSION}
    if kind == LOADER_KIND:
        renamed["reads"] = MIXTURE
        renamed.setdefault("batches_per_transfer", 1)
    return renamed


def upgraded(state: Any, kind: str) -> dict[str, Any]:
    """A loader state (``kind`` :data:`LOADER_KIND`) or merged checkpoint (:data:`CHECKPOINT_KIND`) of any
    version, of a dataset or a mixture, migrated to the current version (its fields not checked yet)."""
    if isinstance(state, dict) and state.get("kind") == _RETIRED[kind]:
        return _mixture_v1_to_v11(state, kind)
    return upgrade(state, kind)


def read_loader_state(state: Any, where: str = "loader state") -> dict[str, Any]:
    """A loader state (``loader.state_dict()``, a dataset's or a mixture's), migrated and with its own fields
    checked."""
    outer = Fields(upgraded(state, LOADER_KIND), where)
    reads = outer.get("reads")
    if reads not in READS:
        raise StateError(f"the state's {outer.name('reads')} is {shorten(reads)}, expected what the loader that "
                         f"wrote it reads: {' or '.join(map(repr, READS))}; {REMEDY}")
    if reads == MIXTURE and "dynamic" in outer.value:
        raise StateError(f"the state's {where} reads a mixture and holds a dynamic ledger "
                         f"({outer.name('dynamic')}), which only a dataset's loader writes (a mixture assigns its rows "
                         f"statically); {REMEDY}")
    world_size = outer.integer("world_size", 1)
    outer.integer("rank", 0, world_size - 1)
    num_workers = outer.integer("num_workers")
    per_transfer = outer.integer("batches_per_transfer", 1)
    if num_workers == 0 and per_transfer != 1:
        raise StateError(f"the state's {where}.batches_per_transfer is {per_transfer} with num_workers=0, where it is "
                         f"always 1; {REMEDY}")
    outer.mapping("dataloader")
    read_skips(outer.value, where)  # optional: the skips of loader.skip(), absent when none
    return outer.value


def read_checkpoint(state: Any) -> tuple[int, int, list[dict[str, Any]]]:
    """A merged checkpoint (a dataset's or a mixture's): its world size, num_workers and every rank's loader
    state, checked, every one reading what the first does (and what the checkpoint's kind said before v11)."""
    saved_kind = state.get("kind") if isinstance(state, dict) else None
    saved_version: Any = state.get("version") if isinstance(state, dict) else None
    checkpoint = Fields(upgraded(state, CHECKPOINT_KIND), "checkpoint")
    world_size, num_workers = checkpoint.integer("world_size", 1), checkpoint.integer("num_workers")
    ranks = checkpoint.sequence("ranks")
    if len(ranks) != world_size:
        raise StateError(f"the state's checkpoint.ranks holds {len(ranks)} loader state(s) for world_size={world_size}; "
                         f"{REMEDY}")
    outers = [read_loader_state(s, f"checkpoint.ranks[{i}]") for i, s in enumerate(ranks)]
    # before v11 the checkpoint's kind said what its ranks read; from v11 on they say it, all alike
    reads = MIXTURE if saved_kind == MIXTURE_CHECKPOINT_KIND_V1 else \
        outers[0]["reads"] if is_int(saved_version) and saved_version >= 11 else DATASET
    for index, outer in enumerate(outers):
        found = (outer["rank"], outer["world_size"], outer["num_workers"], outer["batches_per_transfer"],
                 outer["reads"])
        wanted = (index, world_size, num_workers, outers[0]["batches_per_transfer"], reads)
        if found != wanted:
            raise StateError(f"the state's checkpoint.ranks[{index}] has rank, world_size, num_workers, "
                             f"batches_per_transfer, reads = {found}, expected {wanted}; {REMEDY}")
    return world_size, num_workers, outers
