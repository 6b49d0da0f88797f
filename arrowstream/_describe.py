"""``arrowstream.describe_state``: what a checkpoint says, as a plain dict and as text.

It reads a loader state, a merged checkpoint, a mixture loader state or a merged mixture checkpoint,
or a larger dict that holds one (a training checkpoint ``{"model": ..., "loader": ...}``), with the
parsers ``load_state_dict`` uses, so a tampered state is refused here as it would be on load (the checks
against the plan need the data: pass ``dataset=`` for the counts that need it). The CLI's
``arrowstream state show`` prints it (docs/state-format.md, "Looking inside a checkpoint").
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from ._dynamic import start_cursor
from ._fields import MAX_INT, REMEDY, Fields, check_int, shorten
from ._identity import DataIdentity
from ._loader_state import read_checkpoint, read_loader_state
from ._mix_loader import MIX_CHECKPOINT_KIND, MIX_LOADER_KIND, MIX_LOADER_VERSION, _read_checkpoint
from ._mix_state import MixWorkerState
from ._order import SlotGrid
from ._skip_state import read_skips
from ._state import (
    CHECKPOINT_KIND,
    LOADER_KIND,
    STATE_VERSION,
    WorkerState,
    check_compatible,
    check_planning,
)
from ._torchdata_state import InnerState, read_inner
from .errors import InvalidArgumentError, StateError, StateMismatchError

KINDS = (LOADER_KIND, CHECKPOINT_KIND, MIX_LOADER_KIND, MIX_CHECKPOINT_KIND)
UNKNOWN = "unknown without the data"
# how to give the data, for the Python API and for the command line (both print the same notes)
GIVE_THE_DATA = "describe_state(state, dataset=...) or arrowstream state show CKPT --path DATA"
HASHED = ("columns", "filter", "parse_options")   # options a state holds as a hash only, to stay small
_MAX_DEPTH = 64


# -- finding the states in a checkpoint -------------------------------------------------------------


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


def describe_state(state: Any, dataset: Any = None, at: str | None = None) -> dict[str, Any]:
    """What a checkpoint says: format, epoch, rows and batches consumed per rank and worker, share of the
    epoch, options, topology, elastic, dynamic and mixture details, and the data's identity (no paths, no
    credentials: the state holds none).

    Args:
        state: ``loader.state_dict()``, a merged checkpoint (``merge_state_dicts``), a mixture loader's
            state or merged checkpoint, or any dict or list that holds one (searched depth first; the
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
                         f"kind {' or '.join(map(repr, KINDS))}, or a checkpoint dict that holds one; save "
                         "loader.state_dict() (or merge_state_dicts) in the checkpoint")
    paths = [path for path, _ in found]
    if at is not None:
        if at not in paths:
            raise StateError(f"no arrowstream state at {shorten(at)}; the states inside are at {shorten(paths)}")
        found = [item for item in found if item[0] == at]
    path, chosen = found[0]
    state_copy = copy.deepcopy(chosen)  # the parsers migrate in place
    kind = chosen["kind"]
    if kind in (MIX_LOADER_KIND, MIX_CHECKPOINT_KIND):
        if dataset is not None:
            raise InvalidArgumentError("dataset: describe_state takes the dataset of a StructuredDataset's state; a "
                                       "mixture's state holds its epoch's rows (its quotas): leave dataset out")
        description = _describe_mixture(state_copy)
    else:
        description = _describe_dataset_state(state_copy, dataset)
    return {"path": path, "other_paths": [p for p in paths if p != path], **description}


# -- a dataset's states -----------------------------------------------------------------------------


def _read_outers(state: dict[str, Any]) -> tuple[int, int, list[dict[str, Any]]]:
    saved_version = state.get("version")
    if state["kind"] == CHECKPOINT_KIND:
        world_size, num_workers, outers = read_checkpoint(state)
    else:
        outer = read_loader_state(state)
        world_size, num_workers, outers = outer["world_size"], outer["num_workers"], [outer]
    for outer in outers:
        outer.setdefault("saved_version", saved_version)
    return world_size, num_workers, outers


def _worker_states(outer: dict[str, Any], where: str) -> tuple[InnerState, list[WorkerState | None]]:
    """A rank's torchdata dict and its worker states, each checked to belong where it is found."""
    inner = read_inner(outer["dataloader"], MAX_INT, "dataloader" if where == "loader state" else f"{where}.dataloader")
    if inner.num_workers != outer["num_workers"]:
        raise StateError(f"the state's {where} says num_workers={outer['num_workers']}, its torchdata state holds "
                         f"{inner.num_workers} worker(s); {REMEDY}")
    states: list[WorkerState | None] = []
    for worker, raw in enumerate(inner.worker_states):
        name = f"rank {outer['rank']} worker {worker} state"  # as load_state_dict names it
        state = None if raw is None else WorkerState.from_dict(raw, name)
        if state is not None:
            found = (state.slot.rank, state.slot.world_size, state.slot.worker_id, state.slot.num_workers)
            wanted = (outer["rank"], outer["world_size"], worker, outer["num_workers"])
            if found != wanted:
                raise StateError(f"the state's {name} has slot (rank, world_size, worker_id, num_workers) = {found}, "
                                 f"but it is found at {wanted}; {REMEDY}")
        states.append(state)
    return inner, states


def _ledger(value: Any, where: str) -> dict[str, Any]:
    """The dynamic ledger's summary, its fields read as the loader reads them (the plan aside)."""
    fields = Fields(value, where)
    epoch = fields.integer("epoch")
    replay_rows, replays = 0, fields.sequence("replays")
    for number, replay in enumerate(replays):
        entry = Fields(replay, f"{where}.replays[{number}]")
        slot = entry.sequence("slot")
        if len(slot) != 4:
            raise StateError(f"the state's {entry.name('slot')} is {shorten(slot)}, expected [world size, workers, "
                             f"rank, worker]; {REMEDY}")
        for index, item in enumerate(slot):
            check_int(item, f"{entry.name('slot')}[{index}]")
        _splits_rows(entry.sequence("splits"), entry.name("splits"))
        entry.mapping("start")
        replay_rows += entry.integer("rows", 1)
    split_list = fields.sequence("splits")
    options = fields.mapping("options")
    check_planning(options)
    return {"epoch": epoch, "replays": len(replays), "replay_rows": replay_rows, "splits": len(split_list),
            "split_rows": _splits_rows(split_list, f"{where}.splits"),
            "fresh_from_row": fields.integer("fresh_from_row"),
            "data": DataIdentity.from_dict(fields.mapping("data")), "options": dict(options.value),
            "ledger_bytes": len(json.dumps(value))}


def _splits_rows(splits: list[Any], where: str) -> int:
    rows = 0
    for index, split in enumerate(splits):
        if not isinstance(split, list) or len(split) != 6:
            raise StateError(f"the state's {where}[{index}] is {shorten(split)}, expected [file index, first unit, "
                             f"unit stop, row start, rows, bytes]; {REMEDY}")
        rows += check_int(split[4], f"{where}[{index}][4]", 1)
        for position in (0, 1, 2, 3, 5):
            check_int(split[position], f"{where}[{index}][{position}]")
    return rows


def _worker_line(worker: int, state: WorkerState | None, done: bool) -> dict[str, Any]:
    if state is None:
        return {"worker": worker, "epoch": None, "rows": 0, "batches": 0, "rows_dropped": 0, "epoch_complete": False}
    return {"worker": worker, "epoch": state.epoch, "rows": state.rows, "batches": state.batches,
            "rows_dropped": state.rows_dropped, "epoch_complete": state.epoch_complete or done}


def _describe_rank(outer: dict[str, Any], where: str) -> tuple[dict[str, Any], list[WorkerState]]:
    inner, states = _worker_states(outer, where)
    present = [s for s in states if s is not None]
    epoch = max((s.epoch for s in present), default=0)
    workers = [_worker_line(w, s, done) for w, (s, done) in enumerate(zip(states, inner.done, strict=True))]
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
    if "dynamic" in outer:
        ledger = _ledger(outer["dynamic"], f"{where}.dynamic")
        rank["dynamic"] = {k: v for k, v in ledger.items() if k not in ("data", "options")}
        rank["epoch"] = ledger["epoch"]
    return rank, present


def _describe_dataset_state(state: dict[str, Any], dataset: Any) -> dict[str, Any]:
    world_size, num_workers, outers = _read_outers(state)
    ranks, every_worker = [], []
    for index, outer in enumerate(outers):
        rank, present = _describe_rank(outer, f"checkpoint.ranks[{index}]" if state["kind"] == CHECKPOINT_KIND
                                       else "loader state")
        ranks.append(rank)
        every_worker += present
    ledgers = [_ledger(outer["dynamic"], "dynamic") for outer in outers if "dynamic" in outer]
    first = every_worker[0] if every_worker else None
    options = dict(first.options) if first is not None else dict(ledgers[0]["options"]) if ledgers else {}
    data = first.data if first is not None else ledgers[0]["data"] if ledgers else None
    elastic = next((s.elastic for s in every_worker if s.elastic is not None), None)
    epoch = max((r["epoch"] for r in ranks), default=0)
    description: dict[str, Any] = {
        "kind": state["kind"], "version": STATE_VERSION, "saved_version": outers[0]["saved_version"],
        "arrowstream_version": outers[0].get("arrowstream_version"),
        "source": "iceberg" if data is not None and data.snapshot_id is not None else "files",
        "assignment": "dynamic" if ledgers else "static",
        "epoch": epoch,
        "topology": {"world_size": world_size, "num_workers": num_workers,
                     "batches_per_transfer": outers[0]["batches_per_transfer"],
                     "ranks_in_state": len(outers), "group_size": None},
        "options": options,
        "data": None if data is None else data.to_dict(),
        "elastic": None if elastic is None else {
            "epoch": elastic.epoch, "old_world_size": elastic.world_size, "old_num_workers": elastic.num_workers,
            "old_workers": len(elastic.cursors), "old_workers_done": sum(c is None for c in elastic.cursors)},
        "ranks": ranks,
    }
    if dataset is not None:
        _check_dataset(dataset, every_worker, ledgers)
    # the state holds a hash of the columns read: the dataset (checked to match it) knows their names
    columns = None if dataset is None else dataset._options.columns
    description["column_names"] = None if columns is None or options.get("columns") is None else list(columns)
    _shares(description, dataset)
    return description


def _check_dataset(dataset: Any, states: list[WorkerState], ledgers: list[dict[str, Any]]) -> None:
    """Refuse a dataset other than the checkpoint's (data or options): its plan would say other counts."""
    saved = states[0] if states else None
    if saved is None and ledgers:  # a dynamic state's ledger names the data and options
        ledger = ledgers[0]
        saved = WorkerState(ledger["data"], ledger["options"], ledger["epoch"], SlotGrid(1, 0).slot(0, 0),
                            start_cursor(1), 0, 0, 0, False)
    if saved is not None:
        check_compatible(saved, dataset._data, dataset._state_options)


def _epoch_rows(description: dict[str, Any], dataset: Any) -> tuple[list[int | None], str | None]:
    """The rows each rank yields in the state's epoch, or None each and why not."""
    topology, options = description["topology"], description["options"]
    if description["elastic"] is not None:
        return [None] * len(description["ranks"]), ("the epoch was re-planned from another topology: its rows are "
                                                    "what the old workers had left, " + UNKNOWN)
    if description["assignment"] == "dynamic":
        return _dynamic_rows(description)
    if dataset is not None:
        if (dataset.world_size, dataset._options.planning) != (topology["world_size"], options.get("planning")):
            raise StateMismatchError(
                f"describe_state: the dataset runs world_size={dataset.world_size} with planning version "
                f"{dataset._options.planning}, the checkpoint world_size={topology['world_size']} with planning "
                f"version {shorten(options.get('planning'))}; pass a dataset built as the checkpoint's run was")
        per_rank = max(topology["num_workers"], 1)
        yields = dataset.slot_yields(topology["num_workers"])
        return [sum(y[2] for y in yields[r["rank"] * per_rank:(r["rank"] + 1) * per_rank])
                for r in description["ranks"]], None
    if options.get("filter") is not None:
        return [None] * len(description["ranks"]), "a filter drops rows that are known only by reading them"
    if topology["world_size"] == 1 and description["data"] is not None and not options.get("drop_last"):
        return [description["data"]["num_rows"]], None
    return [None] * len(description["ranks"]), ("each rank's rows of the epoch follow from the plan, "
                                                f"{UNKNOWN}: give it with {GIVE_THE_DATA}")


def _dynamic_rows(description: dict[str, Any]) -> tuple[list[int | None], str | None]:
    """A dynamic ledger names the rows left of its epoch, but its fresh rows only from a row on: on one
    rank without a filter or drop_last they are the data's rows, and the rank's rows consumed are the rest
    (its workers' counters start again at a resume; the ledger does not)."""
    options, data = description["options"], description["data"]
    if description["topology"]["world_size"] != 1 or options.get("filter") is not None or options.get("drop_last") \
            or data is None:
        return [None] * len(description["ranks"]), ("with dynamic assignment a rank's rows of the epoch follow from "
                                                    f"the plan, {UNKNOWN}")
    [rank] = description["ranks"]
    ledger = rank["dynamic"]
    left = ledger["replay_rows"] + ledger["split_rows"] + max(data["num_rows"] - ledger["fresh_from_row"], 0)
    ledger["rows_left"] = left
    rank["rows"] = data["num_rows"] - left
    return [data["num_rows"]], None


def _shares(description: dict[str, Any], dataset: Any) -> None:
    """Each rank's (and the state's) share of the epoch consumed: its rows / its rows of the epoch."""
    per_rank, note = _epoch_rows(description, dataset)
    for rank, rows in zip(description["ranks"], per_rank, strict=True):
        rank["epoch_rows"] = rows
        rank["share"] = 1.0 if rank["epoch_over"] else None if not rows else rank["rows"] / rows
    ranks = description["ranks"]
    description["rows"] = sum(r["rows"] for r in ranks)
    description["batches"] = sum(r["batches"] for r in ranks)
    whole = len(ranks) == description["topology"]["world_size"]
    known = whole and all(r["epoch_rows"] is not None for r in ranks)
    description["epoch_rows"] = sum(r["epoch_rows"] for r in ranks) if known else None
    if whole and all(r["epoch_over"] for r in ranks):
        description["share"] = 1.0
    elif known and description["epoch_rows"]:
        description["share"] = description["rows"] / description["epoch_rows"]
    else:
        description["share"] = None
    description["share_note"] = None if description["share"] is not None else (
        note or "the state holds one rank of several: the share of the whole epoch needs every rank's state")


# -- a mixture's states -----------------------------------------------------------------------------


def _describe_mixture(state: dict[str, Any]) -> dict[str, Any]:
    fields = Fields(state, "mixture state")
    version = fields.integer("version")
    if version != MIX_LOADER_VERSION:
        raise StateError(f"the mixture state has version {version}; this arrowstream reads version "
                         f"{MIX_LOADER_VERSION}: upgrade arrowstream to read it")
    outers = _read_checkpoint(fields) if state["kind"] == MIX_CHECKPOINT_KIND else [state]
    ranks, every_worker = [], []
    for index, outer in enumerate(outers):
        where = f"ranks[{index}]" if state["kind"] == MIX_CHECKPOINT_KIND else "mixture loader state"
        part = Fields(outer, where)
        world_size = part.integer("world_size", 1)
        rank_index, num_workers = part.integer("rank", 0, world_size - 1), part.integer("num_workers")
        inner = read_inner(part.mapping("dataloader").value, MAX_INT, f"{where}.dataloader")
        if inner.num_workers != num_workers:
            raise StateError(f"the state's {where} says num_workers={num_workers}, its torchdata state holds "
                             f"{inner.num_workers} worker(s); {REMEDY}")
        states = [None if s is None else MixWorkerState.from_dict(s, f"{where} worker {w}'s mixture state")
                  for w, s in enumerate(inner.worker_states)]
        present = [s for s in states if s is not None]
        epoch = max((s.epoch for s in present), default=0)
        workers = []
        for worker, (s, done) in enumerate(zip(states, inner.done, strict=True)):
            line: dict[str, Any] = {"worker": worker, "epoch": None if s is None else s.epoch,
                                    "rows": 0 if s is None else s.rows, "batches": 0 if s is None else s.batches,
                                    "rows_dropped": 0 if s is None else s.rows_dropped,
                                    "epoch_complete": done or (s is not None and s.epoch_complete),
                                    "sources": {} if s is None else {n: c.taken for n, c in s.cursors.items()}}
            workers.append(line)
        current = [line for line in workers if line["epoch"] == epoch]
        ranks.append({"rank": rank_index, "epoch": epoch, "rows": sum(x["rows"] for x in current),
                      "batches": sum(x["batches"] for x in current),
                      "rows_dropped": sum(x["rows_dropped"] for x in current),
                      "epoch_over": inner.finished and inner.steps_since_snapshot == 0
                      or bool(current) and len(current) == len(workers) and all(x["epoch_complete"] for x in current),
                      "batches_since_snapshot": inner.steps_since_snapshot,
                      "sources": {name: sum(x["sources"].get(name, 0) for x in current)
                                  for name in (present[0].epochs if present else {})},
                      "workers": workers})
        every_worker += present
    first = every_worker[0] if every_worker else None
    world_size = Fields(outers[0], "mixture state").integer("world_size", 1)
    epoch = max((r["epoch"] for r in ranks), default=0)
    sources = {} if first is None else {
        name: {"quota": e.quota, "start": e.start, "rows": sum(r["sources"].get(name, 0) for r in ranks),
               "data": dict(first.data[name])}
        for name, e in first.epochs.items()}
    epoch_rows = sum(s["quota"] for s in sources.values()) or None
    whole = len(ranks) == world_size
    if whole and ranks and all(r["epoch_over"] for r in ranks):
        share: float | None = 1.0
    else:
        share = sum(r["rows"] for r in ranks) / epoch_rows if whole and epoch_rows else None
    return {
        "kind": state["kind"], "version": version, "saved_version": version,
        "arrowstream_version": outers[0].get("arrowstream_version"), "source": "mixture", "assignment": "static",
        "epoch": epoch,
        "topology": {"world_size": world_size, "num_workers": Fields(outers[0], "mixture state").integer("num_workers"),
                     "batches_per_transfer": outers[0].get("batches_per_transfer", 1), "ranks_in_state": len(outers),
                     "group_size": None},
        "options": {} if first is None else dict(first.options),
        "mixture": {"weights": {n: s["quota"] / epoch_rows for n, s in sources.items()} if epoch_rows else {},
                    "epoch_rows": epoch_rows, "sources": sources,
                    "history": [] if first is None else [[e, dict(q)] for e, q in first.history],
                    "replanned": first is not None and first.elastic is not None},
        "data": None, "elastic": None, "column_names": None, "ranks": ranks,
        "rows": sum(r["rows"] for r in ranks), "batches": sum(r["batches"] for r in ranks),
        "epoch_rows": epoch_rows if whole else None, "share": share,
        "share_note": None if share is not None else
        "the state holds one rank of several: the share of the whole epoch needs every rank's state",
    }


# -- as text ----------------------------------------------------------------------------------------


def _share(value: float | None) -> str:
    return "?" if value is None else f"{value:.1%}"


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def format_state(description: dict[str, Any]) -> str:
    """:func:`describe_state`'s dict as text, for people (``arrowstream state show`` prints it).

    Example:
        >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
        >>> folder = tempfile.mkdtemp()
        >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(folder, "part.parquet"))
        >>> loader, dataset = arrowstream.StructuredDataset.create_dataloader(path=folder, batch_size=4)
        >>> print(arrowstream.format_state(arrowstream.describe_state(loader.state_dict())).splitlines()[0])
        arrowstream.loader, format version 9 (written by arrowstream 0.2.0)
    """
    d, topology = description, description["topology"]
    written = f" (written by arrowstream {d['arrowstream_version']})" if d.get("arrowstream_version") else ""
    migrated = f", saved as version {d['saved_version']}" if d.get("saved_version") not in (None, d["version"]) else ""
    lines = [f"{d['kind']}, format version {d['version']}{migrated}{written}"]
    if d.get("path"):
        lines.append(f"found at: {d['path']}")
    if d.get("other_paths"):
        lines.append(f"other states in the checkpoint (not shown; --at PATH): {', '.join(d['other_paths'])}")
    lines.append(f"epoch {d['epoch']}: {d['rows']:,} rows in {d['batches']:,} batches consumed, "
                 f"{_share(d['share'])} of {_count(d['epoch_rows'])} rows"
                 + (f" ({d['share_note']})" if d.get("share_note") else ""))
    lines.append(f"topology: world_size {topology['world_size']}, num_workers {topology['num_workers']}, "
                 f"batches_per_transfer {topology['batches_per_transfer']}; ranks in this state: "
                 f"{topology['ranks_in_state']} (group_size is not recorded)")
    lines.append(f"source: {d['source']}, assignment {d['assignment']}")
    if d["options"]:
        lines.append("options: " + ", ".join(f"{k}={v}" for k, v in d["options"].items()
                                             if k not in HASHED or v is None))
        lines += _hashed_lines(d)
    if d.get("data"):
        data = d["data"]
        snapshot = "" if data.get("snapshot_id") is None else \
            f", snapshot {data['snapshot_id']} (schema {data.get('schema_id')})"
        lines.append(f"data: {data['num_files']:,} file(s), {data['num_rows']:,} rows{snapshot}, fingerprint "
                     f"{data['fingerprint']}")
    if d.get("elastic"):
        e = d["elastic"]
        lines.append(f"elastic: epoch {e['epoch']} re-planned from world_size {e['old_world_size']}, num_workers "
                     f"{e['old_num_workers']} ({e['old_workers_done']} of {e['old_workers']} old workers had "
                     "nothing left); rows count from the re-plan")
    if d.get("mixture"):
        lines += _mixture_lines(d["mixture"])
    for rank in d["ranks"]:
        lines += _rank_lines(rank)
    return "\n".join(lines)


def _hashed_lines(description: dict[str, Any]) -> list[str]:
    """The options a state holds as a hash (columns, filter, parse options): the names where known."""
    lines, options = [], description["options"]
    if options.get("columns") is not None:
        names = description.get("column_names")
        lines.append(f"columns: {', '.join(names)}" if names else
                     f"columns: hash {options['columns']} (names not stored in the state; give the data to name them: "
                     f"{GIVE_THE_DATA})")
    if options.get("filter") is not None:
        lines.append(f"filter: hash {options['filter']} (the expression is not stored in the state)")
    if options.get("parse_options") is not None:
        lines.append(f"parse_options: hash {options['parse_options']} (not stored in the state)")
    return lines


def _mixture_lines(mixture: dict[str, Any]) -> list[str]:
    lines = [f"mixture: {_count(mixture['epoch_rows'])} rows an epoch"
             + (", epoch re-planned from another topology" if mixture["replanned"] else "")]
    for name, source in mixture["sources"].items():
        weight = mixture["weights"].get(name)
        lines.append(f"  {name}: weight {_share(weight)}, quota {source['quota']:,}, starts at row "
                     f"{source['start']:,} of its passes, {source['rows']:,} rows taken; data "
                     f"{source['data'].get('num_files')} file(s), {source['data'].get('num_rows')} rows")
    return lines


def _rank_lines(rank: dict[str, Any]) -> list[str]:
    over = ", epoch over" if rank["epoch_over"] else ""
    lines = [(f"rank {rank['rank']}: epoch {rank['epoch']}, {rank['rows']:,} rows in {rank['batches']:,} batches, "
             f"{_share(rank.get('share'))} of {_count(rank.get('epoch_rows'))} rows{over}")]
    if rank["batches_since_snapshot"]:
        lines.append(f"  + {rank['batches_since_snapshot']} batch(es) yielded after the workers' snapshot")
    for worker in rank["workers"]:
        if worker["epoch"] is None:
            lines.append(f"  worker {worker['worker']}: no state yet")
            continue
        done = ", done" if worker["epoch_complete"] else ""
        sources = "".join(f", {n} {r:,}" for n, r in worker.get("sources", {}).items())
        lines.append(f"  worker {worker['worker']}: epoch {worker['epoch']}, {worker['rows']:,} rows, "
                     f"{worker['batches']:,} batches, {worker['rows_dropped']:,} dropped{sources}{done}")
    if rank.get("dynamic"):
        dyn = rank["dynamic"]
        lines.append(f"  dynamic ledger ({dyn['ledger_bytes']:,} bytes): epoch {dyn['epoch']}, {dyn['replays']} "
                     f"replay(s) of {dyn['replay_rows']:,} rows, {dyn['splits']} split(s) of {dyn['split_rows']:,} "
                     f"rows, and the rank's fresh rows from row {dyn['fresh_from_row']:,} on")
    for skip in rank.get("skips", []):
        lines.append(f"  skipped: epoch {skip['epoch']}, after batch {skip['at_batch']:,}: {skip['batches']:,} "
                     f"batch(es), {skip['rows']:,} rows")
    if rank.get("pending_skip"):
        lines.append(f"  pending skip: the next {rank['pending_skip']:,} batch(es)")
    return lines
