"""``arrowstream.describe_state``: what a checkpoint says, as a plain dict (and as text: ``format_state``).

It reads a loader state or a merged checkpoint, of a dataset or a mixture (and of every older version and kind,
migrated as on load), or a larger dict that holds one (a training checkpoint ``{"model": ..., "loader": ...}``), with the
parsers ``load_state_dict`` uses, so a tampered state is refused here as it would be on load (the checks
against the plan need the data: pass ``dataset=`` for the counts that need it). The CLI's
``arrowstream state show`` prints it (docs/state-format.md, "Looking inside a checkpoint").

Every state goes through one walk: the envelope (its ranks, read by ``arrowstream._state.loader``, one kind per
level for both), each rank's workers, the epoch and the counters, and the share of the epoch. What differs by
what the state's loader read (its ``reads``: how a worker state is parsed, a mixture's sources, a dynamic ledger,
the rows of the epoch) is a small :class:`~arrowstream._tools.describe_kind.StateKind`:
``describe_dataset.DATASET`` and ``describe_mixture.MIXTURE``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .._core.fields import shorten
from .._state.loader import CHECKPOINT_KINDS, LOADER_KINDS, read_checkpoint, read_loader_state
from .._state.skips import read_skips
from .._state.versions import CHECKPOINT_KIND, LOADER_KIND, STATE_VERSION
from ..errors import InvalidArgumentError, StateError
from .describe_dataset import DATASET
from .describe_kind import ONE_RANK_OF_SEVERAL, Envelope, StateKind
from .describe_mixture import MIXTURE
from .describe_text import HASHED, format_state

if TYPE_CHECKING:
    from ..dataset import StructuredDataset

__all__ = ["HASHED", "KINDS", "describe_state", "find_states", "format_state"]

_BY_READS: dict[str, StateKind] = {part.reads: part for part in (DATASET, MIXTURE)}
KINDS = LOADER_KINDS + CHECKPOINT_KINDS   # what a state found is (the retired mixture kinds migrate on reading)
_MAX_DEPTH = 64


def find_states(value: Any, path: str = "", depth: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every arrowstream loader state or checkpoint inside ``value`` (dicts and lists, depth first, in
    their order), with its key path (``""``: ``value`` itself; ``"loader"``, ``"loaders[1]"``)."""
    if isinstance(value, dict) and value.get("kind") in KINDS:
        yield path, value
        return
    if depth >= _MAX_DEPTH:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from find_states(item, f"{path}.{key}" if path else str(key), depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from find_states(item, f"{path}[{index}]", depth + 1)


def describe_state(state: Any, dataset: StructuredDataset | None = None, at: str | None = None) -> dict[str, Any]:
    """What a checkpoint says: format, epoch, rows and batches consumed per rank and worker, share of the
    epoch, options, topology, elastic, dynamic and mixture details, and the data's identity (no paths, no
    credentials: the state holds none).

    Args:
        state: ``loader.state_dict()`` or a merged checkpoint (``merge_state_dicts``), of a dataset's loader or
            a mixture's, or any dict or list that holds one (searched depth first; the
            first found is described, ``other_paths`` lists the rest).
        dataset: Optional, the ``StructuredDataset`` the state was taken on: the rows of each worker's
            epoch then come from its plan (without it, a count that needs the plan is ``None`` and
            ``share_note`` says why). It must be the checkpoint's data and options (``StateMismatchError``).
        at: The key path of the state to describe when there are several (as ``path`` reports them,
            ``"loaders[1]"``).

    Returns:
        A plain dict of JSON types; :func:`format_state` renders it as text.

    Raises:
        StateError: No arrowstream state inside, or a malformed one (the field named, as ``load_state_dict``
            would name it).

    Example:
        >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
        >>> folder = tempfile.mkdtemp()
        >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(folder, "part.parquet"))
        >>> loader, dataset = arrowstream.StructuredDataset.create_dataloader(path=folder, batch_size=4)
        >>> batches = iter(loader)
        >>> _ = next(batches)
        >>> about = arrowstream.describe_state({"step": 1, "loader": loader.state_dict()})
        >>> about["path"], about["epoch"], about["rows"], about["batches"], about["share"]
        ('loader', 0, 4, 1, 0.4)
    """
    found = list(find_states(state))
    if not found:
        raise StateError(f"no arrowstream loader state inside the {type(state).__name__} given: expected a dict of "
                         f"kind {LOADER_KIND!r} or {CHECKPOINT_KIND!r}, or a checkpoint dict that holds one; save "
                         "loader.state_dict() (or merge_state_dicts) in the checkpoint")
    paths = [path for path, _ in found]
    if at is not None:
        if at not in paths:
            raise StateError(f"no arrowstream state at {shorten(at)}; the states inside are at {shorten(paths)}")
        found = [item for item in found if item[0] == at]
    path, chosen = found[0]
    envelope = _envelope(copy.deepcopy(chosen))   # the parsers migrate in place
    if envelope.reads == MIXTURE.reads and dataset is not None:
        raise InvalidArgumentError("dataset: describe_state takes the dataset of a StructuredDataset's state; a "
                                   "mixture's state holds its epoch's rows (its quotas): leave dataset out")
    description = _describe(_BY_READS[envelope.reads], envelope, dataset)
    return {"path": path, "other_paths": [p for p in paths if p != path], **description}


def _envelope(state: dict[str, Any]) -> Envelope:
    """A state's envelope, migrated and checked as ``load_state_dict`` reads it: a merged checkpoint's ranks, or
    the one loader state."""
    saved_kind, saved_version = state["kind"], state.get("version")
    if saved_kind in CHECKPOINT_KINDS:
        world_size, num_workers, outers = read_checkpoint(state)
        kind, wheres = CHECKPOINT_KIND, [f"checkpoint.ranks[{index}]" for index in range(len(outers))]
    else:
        outer = read_loader_state(state)
        world_size, num_workers, outers = outer["world_size"], outer["num_workers"], [outer]
        kind, wheres = LOADER_KIND, ["loader state"]
    first = outers[0]
    return Envelope(kind, STATE_VERSION, saved_kind, saved_version, first["reads"], first.get("arrowstream_version"),
                    world_size, num_workers, first["batches_per_transfer"], outers, wheres)


def _describe(part: StateKind, envelope: Envelope, dataset: StructuredDataset | None) -> dict[str, Any]:
    """The one walk: the envelope, every rank and its workers, then the epoch's rows and the share."""
    ranks, every_worker = [], []
    for outer, where in zip(envelope.outers, envelope.wheres, strict=True):
        rank, present = _describe_rank(part, outer, where)
        ranks.append(rank)
        every_worker += present
    description: dict[str, Any] = {
        "kind": envelope.kind, "version": envelope.version, "saved_kind": envelope.saved_kind,
        "saved_version": envelope.saved_version, "reads": envelope.reads,
        "arrowstream_version": envelope.arrowstream_version,
        "epoch": max((r["epoch"] for r in ranks), default=0),
        "topology": {"world_size": envelope.world_size, "num_workers": envelope.num_workers,
                     "batches_per_transfer": envelope.batches_per_transfer, "ranks_in_state": len(envelope.outers),
                     "group_size": None},
        "ranks": ranks,
    }
    body = part.body(envelope, ranks, every_worker, dataset)
    description = {**description, **body, "ranks": ranks}
    _shares(part, description, dataset, every_worker)
    return description


def _worker_line(worker: int, state: Any, done: bool, extra: dict[str, Any]) -> dict[str, Any]:
    if state is None:
        return {"worker": worker, "epoch": None, "rows": 0, "batches": 0, "rows_dropped": 0, "epoch_complete": done,
                **extra}
    return {"worker": worker, "epoch": state.epoch, "rows": state.rows, "batches": state.batches,
            "rows_dropped": state.rows_dropped, "epoch_complete": state.epoch_complete or done, **extra}


def _describe_rank(part: StateKind, outer: dict[str, Any], where: str) -> tuple[dict[str, Any], list[Any]]:
    """A rank's line (its epoch: the latest of its workers'; its counters: those of its workers in that epoch)
    and its workers' parsed states."""
    inner, states = part.worker_states(outer, where)
    present = [s for s in states if s is not None]
    epoch = max((s.epoch for s in present), default=0)
    workers = [_worker_line(w, s, done, part.worker_fields(s))
               for w, (s, done) in enumerate(zip(states, inner.done, strict=True))]
    current = [line for line in workers if line["epoch"] == epoch]
    skips, pending = read_skips(outer, where)
    rank: dict[str, Any] = {
        "rank": outer["rank"], "epoch": epoch,
        "rows": sum(line["rows"] for line in current), "batches": sum(line["batches"] for line in current),
        "rows_dropped": sum(line["rows_dropped"] for line in current),
        "epoch_over": inner.finished and inner.steps_since_snapshot == 0
        or bool(current) and all(line["epoch_complete"] for line in current) and len(current) == len(workers),
        "batches_since_snapshot": inner.steps_since_snapshot, "batches_per_transfer": outer["batches_per_transfer"],
        "workers": workers, "skips": [skip.to_dict() for skip in skips], "pending_skip": pending,
    }
    rank.update(part.rank_fields(outer, where, current))
    return rank, present


def _shares(part: StateKind, description: dict[str, Any], dataset: StructuredDataset | None, states: list[Any]) -> None:
    """Each rank's (and the state's) share of the epoch consumed: its rows / its rows of the epoch."""
    rows = part.epoch_rows(description, dataset, states)
    ranks = description["ranks"]
    for rank, epoch_rows in zip(ranks, rows.per_rank, strict=True):
        rank["epoch_rows"] = epoch_rows
        rank["share"] = 1.0 if rank["epoch_over"] else None if not epoch_rows else rank["rows"] / epoch_rows
    description["rows"] = sum(r["rows"] for r in ranks)
    description["batches"] = sum(r["batches"] for r in ranks)
    whole = len(ranks) == description["topology"]["world_size"]
    total = rows.total if rows.total is not None else \
        sum(r["epoch_rows"] for r in ranks) if all(r["epoch_rows"] is not None for r in ranks) else None
    description["epoch_rows"] = total if whole else None
    if whole and ranks and all(r["epoch_over"] for r in ranks):
        description["share"] = 1.0
    elif description["epoch_rows"]:
        description["share"] = description["rows"] / description["epoch_rows"]
    else:
        description["share"] = None
    description["share_note"] = None if description["share"] is not None else (rows.note or ONE_RANK_OF_SEVERAL)
