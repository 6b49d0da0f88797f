"""A loaded dataset worker state checked against the dataset it resumes: the same data (an Iceberg table not
recreated, the same snapshot and schema, the data identity), the same planning version and stream options, and
the same slot (another topology is re-planned by the loader: elastic resume).
"""

from __future__ import annotations

from typing import Any

from .._core.fields import shorten
from .._core.order import Slot
from ..errors import StateMismatchError
from .identity import STRICT, DataIdentity, check_same_data
from .worker import WorkerState


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
