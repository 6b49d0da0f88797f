"""``describe_state``'s parts for a ``StructuredDataset``'s states (a loader state, a merged checkpoint):
worker states, the dynamic ledger, the options and data of the workers, and the rows of the epoch from the
state's counts or from the dataset's plan; an ``order="canonical"`` state's canonical slots
(:mod:`arrowstream._tools.describe_canonical`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .._core.assignment_names import ASSIGNMENT_NAMES
from .._core.fields import REMEDY, Fields, check_int, shorten
from .._core.order import SlotGrid
from .._layout.ledger import start_cursor
from .._loader.torchdata_state import InnerState
from .._state.canonical import is_canonical
from .._state.compatible import check_compatible
from .._state.identity import DataIdentity
from .._state.versions import DATASET as READS_DATASET
from .._state.versions import check_planning
from .._state.worker import WorkerState
from .._state.worker_states import read_worker_state
from ..errors import StateError, StateMismatchError
from .describe_canonical import CanonicalWorker, canonical_body, rank_epoch_rows, read_canonical_worker
from .describe_kind import GIVE_THE_DATA, REPLANNED, UNKNOWN, Envelope, EpochRows, elastic_summary, read_workers

if TYPE_CHECKING:
    from ..dataset import StructuredDataset


class DatasetKind:
    """A ``StructuredDataset``'s (or ``IcebergDataset``'s) loader state or merged checkpoint."""

    reads: str = READS_DATASET

    def worker_states(self, outer: dict[str, Any],
                      where: str) -> tuple[InnerState, list[WorkerState | CanonicalWorker | None]]:
        inner = read_workers(outer["dataloader"], outer["num_workers"],
                             "dataloader" if where == "loader state" else f"{where}.dataloader", where)
        states: list[WorkerState | CanonicalWorker | None] = []
        for worker, raw in enumerate(inner.worker_states):
            name = f"rank {outer['rank']} worker {worker} state"  # as load_state_dict names it
            state: WorkerState | CanonicalWorker | None = None
            if is_canonical(raw):   # order="canonical": its canonical slots' states
                state = read_canonical_worker(raw, name)
            elif raw is not None:
                parsed = read_worker_state(raw, name, READS_DATASET)
                assert isinstance(parsed, WorkerState), "read as a dataset's"
                state = parsed
            if state is not None:
                found = (state.slot.rank, state.slot.world_size, state.slot.worker_id, state.slot.num_workers)
                wanted = (outer["rank"], outer["world_size"], worker, outer["num_workers"])
                if found != wanted:
                    raise StateError(f"the state's {name} has slot (rank, world_size, worker_id, num_workers) = "
                                     f"{found}, but it is found at {wanted}; {REMEDY}")
            states.append(state)
        return inner, states

    def worker_fields(self, state: WorkerState | CanonicalWorker | None) -> dict[str, Any]:
        return state.fields() if isinstance(state, CanonicalWorker) else {}

    def rank_fields(self, outer: dict[str, Any], where: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
        if lines and "canonical_slots" in lines[0]:   # every worker gives its part of each of the rank's batches
            return {"batches": lines[0]["batches"]}
        if "dynamic" not in outer:
            return {}
        ledger = _ledger(outer["dynamic"], f"{where}.dynamic")
        return {"epoch": ledger["epoch"], "dynamic": {k: v for k, v in ledger.items() if k not in ("data", "options")}}

    def body(self, envelope: Envelope, ranks: list[dict[str, Any]], states: list[WorkerState | CanonicalWorker],
             dataset: StructuredDataset | None) -> dict[str, Any]:
        ledgers = [_ledger(outer["dynamic"], "dynamic") for outer in envelope.outers if "dynamic" in outer]
        first = states[0] if states else None
        options = dict(first.options) if first is not None else dict(ledgers[0]["options"]) if ledgers else {}
        data = first.data if first is not None else ledgers[0]["data"] if ledgers else None
        canonical = [s for s in states if isinstance(s, CanonicalWorker)]
        if dataset is not None and not canonical:
            _check_dataset(dataset, [s for s in states if isinstance(s, WorkerState)], ledgers)
        # the state holds a hash of the columns read: the dataset (checked to match it) knows their names
        columns = None if dataset is None else dataset.options.columns
        return {
            "source": "iceberg" if data is not None and data.snapshot_id is not None else "files",
            # as the state names it: a static state's options do not (they are as before there was a choice)
            "assignment": options.get("assignment", ASSIGNMENT_NAMES[0]),
            "options": options,
            "data": None if data is None else data.to_dict(),
            "elastic": elastic_summary(next((s.elastic for s in states if s.elastic is not None), None)),
            "column_names": None if columns is None or options.get("columns") is None else list(columns),
            "order": options.get("order", "topology"),
            "canonical": canonical_body(canonical, dataset) if canonical else None,
        }

    def epoch_rows(self, description: dict[str, Any], dataset: StructuredDataset | None,
                   states: list[WorkerState | CanonicalWorker]) -> EpochRows:
        """The rows each rank yields in the state's epoch, or None each and why not. With the dataset, an epoch
        re-planned from another topology counts the rows of its re-planned shares (from the re-plan, as the
        workers' counters do)."""
        topology, options, ranks = description["topology"], description["options"], description["ranks"]
        if description["elastic"] is not None and dataset is None:
            return EpochRows([None] * len(ranks), note=REPLANNED)
        if dataset is not None \
                and (dataset.world_size, dataset.options.planning) != (topology["world_size"], options.get("planning")):
            raise StateMismatchError(
                f"describe_state: the dataset runs world_size={dataset.world_size} with planning version "
                f"{dataset.options.planning}, the checkpoint world_size={topology['world_size']} with planning "
                f"version {shorten(options.get('planning'))}; pass a dataset built as the checkpoint's run was")
        if any("dynamic" in rank for rank in ranks):   # a rank's ledger: its workers leased its rows
            return _dynamic_rows(description) if dataset is None else _ledger_rows(description, dataset)
        if description["canonical"] is not None:   # each rank's canonical slots' rows
            if dataset is None:
                return EpochRows([None] * len(ranks), note=("each rank's rows of the epoch are its canonical slots', "
                                                            f"which follow from the plan, {UNKNOWN}: give it with "
                                                            f"{GIVE_THE_DATA}"))
            return EpochRows([rank_epoch_rows(dataset, topology["num_workers"], rank["rank"], rank["epoch"])
                              for rank in ranks])
        if dataset is not None:
            plain = [s for s in states if isinstance(s, WorkerState)]
            return EpochRows([_rank_epoch_rows(dataset, topology["num_workers"], rank, plain) for rank in ranks])
        if options.get("filter") is not None:
            return EpochRows([None] * len(ranks), note="a filter drops rows that are known only by reading them")
        if topology["world_size"] == 1 and description["data"] is not None and not options.get("drop_last"):
            return EpochRows([description["data"]["num_rows"]])
        return EpochRows([None] * len(ranks), note=("each rank's rows of the epoch follow from the plan, "
                                                    f"{UNKNOWN}: give it with {GIVE_THE_DATA}"))


def _rank_epoch_rows(dataset: StructuredDataset, num_workers: int, rank: dict[str, Any], states: list[WorkerState]) -> int:
    """The rows a rank yields in its epoch as the dataset's plan lays it out for the checkpoint's topology: the
    planned epoch, or the one its workers' states say was re-planned from another topology (the old workers'
    cursors, checked against the plan first, as loading the state would check them)."""
    epoch, options = rank["epoch"], dataset.options
    mine = [s for s in states if s.slot.rank == rank["rank"] and s.epoch == epoch]
    replanned = next((s for s in mine if s.elastic is not None), None)
    if replanned is not None:
        dataset.check_state(replanned.to_dict(), slot=replanned.slot,
                            where=f"rank {rank['rank']} worker {replanned.slot.worker_id} state")
    layout = dataset.epochs.layouts.layout(epoch, SlotGrid(dataset.world_size, num_workers),
                                           None if replanned is None else replanned.elastic)
    return sum(kept for _, _, kept in layout.yields(rank["rank"], options.batch_size, options.drop_last))


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
            "replanned": fields.get("replanned") is not None,   # from a checkpoint of another world size
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


def _check_dataset(dataset: StructuredDataset, states: list[WorkerState], ledgers: list[dict[str, Any]]) -> None:
    """Refuse a dataset other than the checkpoint's (data or options): its plan would say other counts."""
    saved = states[0] if states else None
    if saved is None and ledgers:  # a dynamic state's ledger names the data and options
        ledger = ledgers[0]
        saved = WorkerState(ledger["data"], ledger["options"], ledger["epoch"], SlotGrid(1, 0).slot(0, 0),
                            start_cursor(1), 0, 0, 0, False)
    if saved is not None:
        check_compatible(saved, dataset.epochs.data, dataset.epochs.state_options)


def _ledger_rows(description: dict[str, Any], dataset: StructuredDataset) -> EpochRows:
    """With the dataset, each rank's rows of its ledger's epoch are its work's, as the dataset's assignment policy
    lays it out (``rank_figures``), and the rows it consumed are the rest of what its ledger leaves (its workers'
    counters start again at a resume; the ledger does not)."""
    ranks, options = description["ranks"], description["options"]
    if options.get("filter") is not None:
        return EpochRows([None] * len(ranks), note="a filter drops rows that are known only by reading them")
    if any(rank["dynamic"]["replanned"] for rank in ranks):
        return EpochRows([None] * len(ranks), note=(
            "the epoch was re-planned from a checkpoint of another world size: each rank's rows are its stretch of "
            "what every old rank had left, which only loading the checkpoint re-plans (len(loader) and "
            "dataset.rank_yields count them on the loaded dataset)"))
    figures: dict[int, list[Any]] = {}
    per_rank = []
    for rank in ranks:
        ledger = rank["dynamic"]
        epoch = ledger["epoch"]
        if epoch not in figures:
            figures[epoch] = dataset.policy.rank_figures(dataset, description["topology"]["num_workers"], epoch)
        epoch_rows = figures[epoch][rank["rank"]].rows_yielded
        # a fresh epoch's work: its fresh rows (cut to those it yields) from fresh_from_row, and the leases in flight
        left = ledger["replay_rows"] + ledger["split_rows"] + max(epoch_rows - ledger["fresh_from_row"], 0)
        ledger["rows_left"] = left
        rank["rows"] = epoch_rows - left
        per_rank.append(epoch_rows)
    return EpochRows(per_rank)


def _dynamic_rows(description: dict[str, Any]) -> EpochRows:
    """A dynamic ledger names the rows left of its epoch, but its fresh rows only from a row on: on one
    rank without a filter or drop_last they are the data's rows, and the rank's rows consumed are the rest
    (its workers' counters start again at a resume; the ledger does not)."""
    options, data = description["options"], description["data"]
    if description["topology"]["world_size"] != 1 or options.get("filter") is not None or options.get("drop_last") \
            or data is None:
        return EpochRows([None] * len(description["ranks"]), note=("with dynamic assignment a rank's rows of the "
                                                                   f"epoch follow from the plan, {UNKNOWN}"))
    [rank] = description["ranks"]
    ledger = rank["dynamic"]
    left = ledger["replay_rows"] + ledger["split_rows"] + max(data["num_rows"] - ledger["fresh_from_row"], 0)
    ledger["rows_left"] = left
    rank["rows"] = data["num_rows"] - left
    return EpochRows([data["num_rows"]])


DATASET = DatasetKind()
