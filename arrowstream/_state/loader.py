"""The loader's part of a state, read strictly: arrowstream's wrapper and the merged checkpoint.

The torchdata dict inside (the ``dataloader`` field) is read by ``arrowstream._loader.torchdata_state``,
the one module that knows its layout; the worker states inside that are left to the dataset,
which knows the plan (``StructuredDataset.check_state``).
"""

from __future__ import annotations

from typing import Any

from .._core.fields import REMEDY, Fields
from ..errors import StateError
from .skips import read_skips
from .worker import CHECKPOINT_KIND, LOADER_KIND, upgrade


def read_loader_state(state: Any, where: str = "loader state") -> dict[str, Any]:
    """A loader state (``loader.state_dict()``), migrated and with its own fields checked."""
    outer = Fields(upgrade(state, LOADER_KIND), where)
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
    """A merged checkpoint: its world size, num_workers and every rank's loader state, checked."""
    checkpoint = Fields(upgrade(state, CHECKPOINT_KIND), "checkpoint")
    world_size, num_workers = checkpoint.integer("world_size", 1), checkpoint.integer("num_workers")
    ranks = checkpoint.sequence("ranks")
    if len(ranks) != world_size:
        raise StateError(f"the state's checkpoint.ranks holds {len(ranks)} loader state(s) for world_size={world_size}; "
                         f"{REMEDY}")
    outers = [read_loader_state(s, f"checkpoint.ranks[{i}]") for i, s in enumerate(ranks)]
    for index, outer in enumerate(outers):
        found = (outer["rank"], outer["world_size"], outer["num_workers"], outer["batches_per_transfer"])
        wanted = (index, world_size, num_workers, outers[0]["batches_per_transfer"])
        if found != wanted:
            raise StateError(f"the state's checkpoint.ranks[{index}] has rank, world_size, num_workers, "
                             f"batches_per_transfer = {found}, expected {wanted}; {REMEDY}")
    return world_size, num_workers, outers
