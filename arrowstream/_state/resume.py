"""Resume checks of ``StructuredDataset``: a loaded worker state checked against the plan, and an epoch
re-planned from the states of another topology.

The bodies of :meth:`StructuredDataset.check_state <arrowstream.StructuredDataset.check_state>`,
``load_state_dict`` and ``begin_elastic_epoch``, and the check of a pending state when its epoch opens.
Pure: the dataset hands in what a check reads (a :class:`Against`) and applies what comes back (it follows
a checkpoint's data, planning version and buffer itself); nothing here reads files (``tests/test_layers.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .._core.order import Slot, SlotGrid
from .._layout.layout import replanned_leftovers
from ..errors import StateMismatchError
from .compatible import check_compatible, check_slot
from .identity import DataIdentity
from .position import check_in_plan
from .versions import DATASET, check_planning
from .worker import Leftovers, WorkerState, read_head

if TYPE_CHECKING:
    from .._core.plan_types import OrderOptions
    from .._layout.layout import Epochs


class Replans(Protocol):
    """What following a checkpoint's planning asks of a dataset (``StructuredDataset`` answers it): to cut splits
    by a planning version, and to take a checkpoint's shuffle buffer where its own was left to the default."""

    def use_planning(self, planning: int) -> None: ...

    def adopt_buffer(self, saved_options: Any) -> None: ...


@dataclass(frozen=True)
class Against:
    """What a loaded worker state is checked against: a dataset's plan as it stands (after following the
    state's data), the options, and what a checkpoint must match of the data."""

    epochs: Epochs
    options: OrderOptions
    data: DataIdentity
    state_options: dict[str, Any]
    data_identity: str
    checked: set[Leftovers]   # the elastic sources found valid for this plan, which a check adds to


def checked_state(against: Against, saved: WorkerState, elastic: bool, slot: Slot | None,
                  where: str, done: str | None, followed: bool = False) -> WorkerState:
    """``saved`` checked against a dataset (see ``StructuredDataset.check_state``)."""
    options = against.state_options
    if elastic:
        options = {**options, "even_batches": saved.options.get("even_batches")}
    check_compatible(saved, against.data, options, against.data_identity, followed=followed)
    if slot is not None:
        if saved.slot != slot:
            raise StateMismatchError(
                f"the {where} belongs to rank {saved.slot.rank} worker {saved.slot.worker_id} of world_size="
                f"{saved.slot.world_size}, num_workers={saved.slot.num_workers}, but stands where the checkpoint "
                f"keeps rank {slot.rank} worker {slot.worker_id} of world_size={slot.world_size}, num_workers="
                f"{slot.num_workers}; pass the dict returned by loader.state_dict() (or merge_state_dicts) unchanged")
        check_in_plan(against.epochs, against.options, against.checked, saved, where, done)
    return saved


def follow_planning(dataset: Replans, state_dict: Any, where: str) -> None:
    """Make ``dataset`` cut splits as the worker state ``state_dict`` was planned (its ``options.planning``):
    a job that resumes from a checkpoint keeps the checkpoint's planning version, in every later epoch too;
    and its shuffle buffer, when the dataset's size was left to the default (``arrowstream._planning.auto_buffer``).
    The other states of the checkpoint must agree (their options are compared with the dataset's)."""
    if state_dict is not None:
        options = read_head(state_dict, DATASET, where)[0].mapping("options")   # a mixture's refused first
        dataset.use_planning(check_planning(options))
        dataset.adopt_buffer(options.value)   # shuffle_buffer_size left out: the checkpoint's


def loaded_state(against: Against, saved: WorkerState, slot: Slot) -> WorkerState:
    """A worker state to resume from in ``slot`` (this process's), checked against the plan (the dataset
    has followed its planning version, buffer and data)."""
    check_compatible(saved, against.data, against.state_options, against.data_identity, followed=True)
    if saved.slot == slot:  # another slot's state is refused when the epoch opens (check_slot)
        check_in_plan(against.epochs, against.options, against.checked, saved, "worker state")
    return saved


def pending_for_epoch(pending: WorkerState | None, slot: Slot, epoch: int,
                      nothing_left: Callable[[WorkerState], bool]) -> WorkerState | None:
    """The state ``slot`` resumes from in ``epoch``: ``pending``, or ``None`` when it had finished an
    earlier epoch (``nothing_left`` of it); a state of another slot, or of an epoch it cannot lead to,
    is refused."""
    if pending is None:
        return None
    check_slot(pending, slot)
    if not (pending.epoch == epoch or (epoch > pending.epoch and nothing_left(pending))):
        raise StateMismatchError(
            f"the checkpoint is in epoch {pending.epoch} "
            f"({'complete' if pending.epoch_complete else 'mid-epoch'}) but the dataset is set to "
            f"epoch {epoch}; call dataset.set_epoch({pending.epoch}) before iterating to finish the "
            "saved epoch, or start without loading the checkpoint")
    return pending if pending.epoch == epoch else None


def nothing_left(left: int | None, options: OrderOptions, holds: Callable[[int], bool]) -> bool:
    """True when a worker state has handed out every row of its epoch it ever will: ``left`` batches by the
    plan, or, when a filter decides (``None``), whether its stream ``holds`` the rows a batch needs."""
    if left is not None:
        return left == 0
    wanted = options.batch_size if options.drop_last else 1  # fewer rows than that: none
    # the filter decides what is left: look ahead from the cursor (the rows a resumed run reads first)
    return not holds(wanted)


def replanned_epoch(epochs: Epochs, options: OrderOptions, epoch: int, world_size: int, num_workers: int,
                    saved: Sequence[tuple[WorkerState, bool]]) -> Leftovers:
    """The rest of ``epoch`` from the states of every old (rank, worker) slot, in slot order (each with
    whether its loader had finished the epoch), to be laid out for this topology. When the old topology read
    that epoch re-planned from yet another (its states' ``elastic``), the rest is of its shares of that re-plan,
    and the re-plan its ``before``: the chain stays a pure function of the plan and the old workers' cursors."""
    inside = [state for state, _ in saved if state.epoch == epoch]
    before = inside[0].elastic if inside else None
    for state in inside:
        if state.elastic != before:
            first = SlotGrid(world_size, num_workers).slot_at(next(i for i, (s, _) in enumerate(saved) if s.epoch == epoch))
            raise StateMismatchError(
                f"the checkpoint's rank {state.slot.rank} worker {state.slot.worker_id} state and its rank "
                f"{first.rank} worker {first.worker_id} state are both in epoch {epoch} but read it laid out "
                f"differently ({_laid_out(state.elastic)} vs {_laid_out(before)}), so they are not one run's "
                "checkpoint; pass the dict returned by loader.state_dict() (or gather_state_dict, "
                "merge_state_dicts) unchanged, every state from one step")
    # the epoch as the old topology read it, with its own even_batches
    old = epochs.layouts.layout(epoch, SlotGrid(world_size, num_workers), before,
                                even_batches=bool(saved and saved[0][0].options.get("even_batches")))
    return replanned_leftovers(old, saved, options.interleave, options.drops_rows)


def _laid_out(elastic: Leftovers | None) -> str:
    if elastic is None:
        return "planned for its topology"
    return (f"re-planned from world_size={elastic.world_size}, num_workers={elastic.num_workers}"
            f"{'' if elastic.before is None else f' ({elastic.depth} re-plans deep)'}")
