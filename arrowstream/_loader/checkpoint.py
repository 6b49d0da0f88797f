"""One checkpoint for every rank: merge the loader states of all ranks, hand each rank its part.

The loader states of a dataset and those of a mixture merge alike (one function, one kind for both; each
state's ``reads`` says which it read, and all must read the same). A merged checkpoint is a dict of JSON types:
``{"kind": "arrowstream.checkpoint", "version": 14, "world_size": N, "num_workers": W, "ranks": [state of rank 0,
..., state of rank N-1]}``, its version ``STATE_VERSION`` like the loader states it holds (merged checkpoints
exist from version 4 on; a mixture's were of kind ``"arrowstream.mixture_checkpoint"`` before version 11); each
entry is the state ``loader.state_dict()`` returned on that rank, migrated to the current version. Ranks of one
``group_size`` group read the same data, so their states agree and one of them is kept.
"""

from __future__ import annotations

import json
from typing import Any

from .._core.fields import MAX_INT, shorten
from .._state.loader import LOADER_KINDS, read_loader_state
from .._state.versions import CHECKPOINT_KIND, STATE_VERSION
from ..errors import StateError, StateMismatchError, TopologyError
from .torchdata_state import read_inner


def _reading_position(state: dict[str, Any], index: int) -> str:
    """What decides the rows a rank reads next: its workers' dataset states (not torchdata's seeds)."""
    inner = read_inner(state["dataloader"], MAX_INT, f"state {index}.dataloader")
    return json.dumps(inner.worker_states, sort_keys=True)


def merge_state_dicts(states: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge the ``loader.state_dict()`` of every rank into one checkpoint (pure, no collective).

    Load the result with ``loader.load_state_dict(merged)`` on every rank: each rank takes its
    own part. The states may come in any order; every rank must be there once (ranks of one
    ``group_size`` group may all be there, and must agree).

    Example:
        >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
        >>> folder = tempfile.mkdtemp()
        >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(folder, "part.parquet"))
        >>> states = []
        >>> for rank in range(2):
        ...     loader, dataset = arrowstream.StructuredDataset.create_dataloader(
        ...         path=folder, batch_size=2, rank=rank, world_size=2)
        ...     states.append(loader.state_dict())
        >>> merged = arrowstream.merge_state_dicts(states)
        >>> merged["world_size"], len(merged["ranks"])
        (2, 2)
    """
    if not isinstance(states, (list, tuple)) or not states:
        raise StateError(f"merge_state_dicts: expected a non-empty list of loader.state_dict() results, got {shorten(states)}")
    by_rank: dict[int, dict[str, Any]] = {}
    first: dict[str, Any] = {}
    for index, state in enumerate(states):
        if not isinstance(state, dict) or state.get("kind") not in LOADER_KINDS:
            found = f"kind {shorten(state.get('kind'))}" if isinstance(state, dict) else f"a {type(state).__name__}"
            raise StateError(f"merge_state_dicts: state {index} is {found}, not a loader state (kind "
                             f"{LOADER_KINDS[0]!r}); pass the dicts loader.state_dict() returned on every rank, "
                             "unchanged")
        state = read_loader_state(state, f"state {index}")
        first = first or state
        if state["reads"] != first["reads"]:
            raise StateMismatchError(
                f"merge_state_dicts: state {index} was taken by the loader of a {state['reads']}, state 0 by the loader "
                f"of a {first['reads']}; merge the states of one training run (a dataset's loaders or a mixture's, not "
                "both)")
        rank, world_size = state["rank"], state["world_size"]
        for key in ("world_size", "num_workers", "batches_per_transfer"):
            if state[key] != first[key]:
                raise StateMismatchError(
                    f"merge_state_dicts: state {index} has {key}={state[key]}, state 0 has {key}={first[key]}; "
                    "merge the states of one training run, taken at the same step")
        if rank in by_rank:
            if _reading_position(by_rank[rank], rank) != _reading_position(state, index):
                raise StateMismatchError(
                    f"merge_state_dicts: two states for rank {rank} of {world_size} stand at different places; "
                    "take every rank's state at the same step (ranks of one group_size group read the same rows)")
            continue
        by_rank[rank] = state
    world_size = int(first["world_size"])
    missing = sorted(set(range(world_size)) - set(by_rank))
    if missing:
        raise StateMismatchError(f"merge_state_dicts: no state for rank(s) {missing} of world_size={world_size}; "
                                 "pass the state of every rank")
    return {
        "kind": CHECKPOINT_KIND,
        "version": STATE_VERSION,
        "world_size": world_size,
        "num_workers": int(first["num_workers"]),
        "ranks": [by_rank[rank] for rank in range(world_size)],
    }


def gather_state_dict(loader: Any) -> dict[str, Any]:
    """Every rank's loader state, merged into one checkpoint on every rank (a collective).

    Call it on all ranks at the same step, under an initialised ``torch.distributed``; save
    the result on rank 0 and load it with ``loader.load_state_dict(merged)`` on every rank.

    Example (on every rank, inside ``torchrun``)::

        merged = arrowstream.gather_state_dict(loader)
        if torch.distributed.get_rank() == 0:
            torch.save({"loader": merged, "epoch": epoch}, "ckpt.pt")
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise TopologyError("gather_state_dict: torch.distributed is not initialised; call it on every rank after "
                            "init_process_group(), or merge the states yourself with merge_state_dicts()")
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, loader.state_dict())
    return merge_state_dicts(states)
