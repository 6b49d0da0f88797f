"""What ``ArrowStreamDataLoader.load_state_dict`` checks of the worker states in torchdata's dict, in the
main process before any worker starts, and how it marks a state taken after its epoch ended.

Each worker state is checked against the plan by the dataset (``StructuredDataset.check_state``);
here are the checks across a rank's workers (done workers, batches yielded since the snapshots) and
across the ranks of a merged checkpoint re-planned for another topology (see ``arrowstream._layout.elastic``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

from .._core.order import Slot, SlotGrid
from .._state.resume import Replans, follow_planning
from .._state.worker import WorkerState
from ..errors import StateError
from .torchdata_state import (
    InnerState,
    clear_steps_since_snapshot,
    read_inner,
    set_iterator_finished,
    set_worker_state,
    worker_states,
)

if TYPE_CHECKING:
    from .._layout.layout import Epochs


class ChecksStates(Replans, Protocol):
    """What the loader's resume checks ask of a dataset (``StructuredDataset`` answers it): to plan as a checkpoint
    did (:class:`~arrowstream._state.resume.Replans`), to check a worker state against its plan, and what a worker
    state has left of its epoch."""

    def check_state(self, state_dict: dict[str, Any], elastic: bool = False, *, slot: Slot | None = None,
                    where: str = "worker state", done: str | None = None, followed: bool = False) -> WorkerState: ...

    def batches_left(self, state: WorkerState, slot: Slot) -> int | None: ...


def follow_checkpoint_planning(dataset: ChecksStates, parsed: list[InnerState]) -> None:
    """Make ``dataset`` plan as the checkpoint of these ranks' torchdata dicts did: by the planning version of
    its first worker state (the others are compared with it as they are checked)."""
    for rank, inner in enumerate(parsed):
        for index, state in enumerate(inner.worker_states):
            if state is not None:
                follow_planning(dataset, state, f"rank {rank} worker {index} state")
                return


def check_workers(dataset: ChecksStates, parsed: InnerState, rank: int, world_size: int,
                  elastic: bool = False) -> list[WorkerState]:
    """Check the worker states of one rank's torchdata dict against the plan, in worker order
    (the dataset planning as the checkpoint did: :func:`follow_checkpoint_planning`).

    A worker the checkpoint counts as done (the loop ended, its fetcher ended, or another
    worker is in a later epoch) must have nothing left to yield in its epoch.
    """
    def check(index: int, done: str | None) -> WorkerState:
        state = parsed.worker_states[index]
        where = f"rank {rank} worker {index} state"
        if state is None:
            raise StateError(f"load_state_dict: the checkpoint holds no state for {where.removesuffix(' state')}; "
                             "pass the dict returned by loader.state_dict() (or gather_state_dict) unchanged")
        slot = SlotGrid(world_size, parsed.num_workers).slot(rank, index)
        return dataset.check_state(state, elastic, slot=slot, where=where, done=done, followed=True)

    saved = [check(index, "the checkpoint says its loop ended" if done else None)
             for index, done in enumerate(parsed.done)]
    epoch = max(s.epoch for s in saved)
    for index, state in enumerate(saved):
        if state.epoch < epoch and not parsed.done[index]:
            check(index, f"another worker of the checkpoint is in epoch {epoch}")
    if parsed.finished and parsed.steps_since_snapshot:
        # the loop ended after batches the snapshots do not count: exactly the ones the workers had left
        left = [dataset.batches_left(state, state.slot) for state in saved]
        if all(n is not None for n in left) and sum(n or 0 for n in left) != parsed.steps_since_snapshot:
            raise StateError(
                f"load_state_dict: rank {rank}'s checkpoint says its loop ended {parsed.steps_since_snapshot} "
                f"batch(es) after the workers' snapshots, but the workers had {sum(n or 0 for n in left)} left; "
                "it is not a position this dataset's plan reaches. Pass the dict returned by loader.state_dict() "
                "unchanged")
    return saved


def elastic_slots(dataset: ChecksStates,
                  outers: list[dict[str, Any]]) -> tuple[int, int, list[tuple[WorkerState, bool]]]:
    """The old world size, the old workers per rank, and the state of every old (rank, worker) slot in
    slot order with whether its loader had finished the epoch, checked for an elastic resume."""
    old_world, old_workers = int(outers[0]["world_size"]), int(outers[0]["num_workers"])
    slots: list[tuple[WorkerState, bool]] = []
    # the re-plan starts from the workers' snapshots: no batch may have been yielded since
    every_rank = [read_inner(outer["dataloader"], 1, f"ranks[{rank}].dataloader") for rank, outer in enumerate(outers)]
    follow_checkpoint_planning(dataset, every_rank)
    for rank, parsed in enumerate(every_rank):
        if parsed.num_workers != old_workers:
            raise StateError(f"load_state_dict: rank {rank}'s loader state says num_workers={old_workers}, its "
                             f"torchdata state holds {parsed.num_workers} worker(s); pass the dict returned by "
                             "loader.state_dict() (or gather_state_dict) unchanged")
        states = check_workers(dataset, parsed, rank, old_world, elastic=True)
        slots.extend(zip(states, parsed.done))
    old_grid = SlotGrid(old_world, old_workers)
    if len(slots) != old_grid.num_slots:
        raise StateError(f"load_state_dict: the checkpoint holds {len(slots)} worker state(s), expected "
                         f"{old_grid.num_slots} for world_size={old_world}, num_workers={old_workers}")
    return old_world, old_workers, slots


def mark_epoch_complete(inner: dict[str, Any], epochs: Epochs) -> None:
    """A state taken after the epoch ended: every worker is done with that epoch.

    torchdata would replay the epoch from the start; marking the workers complete, their cursors
    at the end of their epoch, makes the saved epoch yield nothing more and the next epoch start
    whole. (A snapshot taken before the last batches stands before the end: the loader checked
    that those batches are the ones yielded since.)
    """
    def complete(state: dict[str, Any] | None) -> dict[str, Any] | None:
        if state is None:
            return None
        saved = WorkerState.from_dict(state)
        return dataclasses.replace(saved, cursor=epochs.end_cursor(saved), epoch_complete=True).to_dict()

    for worker_id, state in enumerate(worker_states(inner)):
        set_worker_state(inner, worker_id, complete(state))
    clear_steps_since_snapshot(inner)
    set_iterator_finished(inner, False)
