"""The loader's part of a state, read strictly: the wrapper, torchdata's dict, the merged checkpoint.

torchdata reads its own fields with plain indexing and hands them to ``range`` and ``itertools``:
a missing key is a ``KeyError``, ``_steps_since_snapshot=10**6`` a bare ``StopIteration``, and a
``fetcher_ended`` of true an epoch that silently yields nothing. Every field it reads is checked
here first (types, and ranges that do not need the plan); the worker states inside are left to
the dataset, which knows the plan (``StructuredDataset.check_state``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._fields import REMEDY, Fields, check_int, is_int, shorten
from ._state import CHECKPOINT_KIND, LOADER_KIND, upgrade
from .errors import StateError

SNAPSHOT = "_snapshot"
WORKER_SNAPSHOTS = "_worker_snapshots"
MAIN_SNAPSHOT = "_main_snapshot"
DATASET_STATE = "dataset_state"
FINISHED = "_iterator_finished"
STEPS_SINCE_SNAPSHOT = "_steps_since_snapshot"


@dataclass(frozen=True)
class InnerState:
    """What torchdata's dict says, checked: its workers' states (in worker order) and which of them
    it considers done (the loop ended, or the worker's fetcher did)."""

    num_workers: int
    worker_states: list[Any]
    done: list[bool]
    finished: bool
    steps_since_snapshot: int = 0  # batches yielded after the workers' snapshots (not in their states)


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


def _optional_int(fields: Fields, key: str) -> None:
    value = fields.get(key)
    if value is not None and not is_int(value):
        raise StateError(f"the state's {fields.name(key)} is {shorten(value)}, expected an int or null; {REMEDY}")


def _fetcher_ended(fields: Fields, key: str) -> bool:
    """Whether torchdata's fetcher says the dataset ended (the fields it reads are there either way)."""
    fetcher = fields.get(key)
    if fetcher is None:
        return False
    fetcher_fields = Fields(fetcher, fields.name(key))
    fetcher_fields.get("dataset_iter_state")
    return fetcher_fields.boolean("fetcher_ended")


def read_inner(inner: Any, snapshot_every_n_steps: int, where: str = "dataloader") -> InnerState:
    """torchdata's ``StatefulDataLoader`` dict, with every field it reads on resume checked."""
    fields = Fields(inner, where)
    finished = fields.boolean(FINISHED)
    if SNAPSHOT not in fields.value:  # num_workers=0
        for key in ("_sampler_iter_yielded", "_num_yielded"):
            fields.integer(key)
        for key in ("_IterableDataset_len_called", "_shared_seed"):
            _optional_int(fields, key)
        ended = _fetcher_ended(fields, "fetcher_state")
        return InnerState(0, [fields.get(DATASET_STATE)], [finished or ended], finished)
    snapshot = fields.mapping(SNAPSHOT)
    main = snapshot.mapping(MAIN_SNAPSHOT)
    num_workers = main.integer("_num_workers", 1)
    main.integer("_sampler_iter_yielded")
    main.integer("_base_seed", -(2**63))
    for key in ("_IterableDataset_len_called", "_shared_seed"):
        _optional_int(main, key)
    snapshot.integer("_snapshot_step")
    snapshot.integer("_last_yielded_worker_id", 0, num_workers - 1)
    steps = fields.integer(STEPS_SINCE_SNAPSHOT, 0, snapshot_every_n_steps - 1)
    workers = snapshot.mapping(WORKER_SNAPSHOTS)
    keys = [f"worker_{index}" for index in range(num_workers)]
    if set(workers.value) != set(keys):
        raise StateError(f"the state's {workers.where} has entries {shorten(list(workers.value))}, expected "
                         f"{shorten(keys)} for {num_workers} worker(s); {REMEDY}")
    states, done = [], []
    for index, key in enumerate(keys):
        worker = workers.mapping(key)
        check_int(worker.get("worker_id"), worker.name("worker_id"), index, index)
        states.append(worker.get(DATASET_STATE))
        _fetcher_ended(worker, "fetcher_state")  # a worker's fetcher starts again whatever it says
        # after batches yielded since the snapshots, a snapshot stands before its worker's end (checked
        # as a whole by the loader: those batches must be exactly what the workers had left)
        done.append(finished and steps == 0)
    return InnerState(num_workers, states, done, finished, steps)
