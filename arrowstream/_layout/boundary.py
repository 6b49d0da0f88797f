"""The epoch boundary: when a loaded state's epoch is over, a later epoch starts as if uninterrupted.

A state taken after the last batch of epoch ``e`` may be resumed with ``set_epoch(e + 1)``
(docs/resume.md). Two things in torchdata's state would make that epoch differ from the one the
uninterrupted loader yields: the round robin restarts after the worker that yielded the epoch's
last batch instead of at worker 0, and with ``snapshot_every_n_steps > 1`` the batches since the
last snapshot are read again and thrown away, from the new epoch. The loader asks here whether
the saved epoch is over, and if so starts the later epoch whole. A state with rows left in its
epoch is left alone: the workers refuse the later epoch (``StateMismatchError``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .._core.order import Slot, SlotGrid
from .._state.worker import WorkerState
from ..errors import StateMismatchError

if TYPE_CHECKING:
    from .layout import Epochs


class EpochsOf(Protocol):
    """What the epoch boundary reads of a dataset (``StructuredDataset`` answers it): its epoch and epochs, its
    rank among the ranks, and what a worker state has left of its epoch."""

    @property
    def epoch(self) -> int: ...

    @property
    def epochs(self) -> Epochs: ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def batches_left(self, state: WorkerState, slot: Slot) -> int | None: ...


def later_epoch_starts_whole(dataset: EpochsOf, saved: list[WorkerState], steps_since_snapshot: int) -> bool:
    """Whether a later epoch than the saved workers' starts whole, after ``steps_since_snapshot`` more
    batches of theirs (yielded after their snapshot). With no step since the snapshot, each worker
    checks its own state when it starts (a filter may leave rows only reading finds); after some,
    the batches they had left must be exactly those steps, which needs the counts from the plan."""
    if not saved or max(state.epoch for state in saved) >= dataset.epoch:
        return False
    if steps_since_snapshot == 0:
        return True
    left = [dataset.batches_left(state, state.slot) for state in saved]
    return all(n is not None for n in left) and sum(n for n in left if n is not None) == steps_since_snapshot


def check_replanned_epoch_over(dataset: EpochsOf, num_workers: int) -> None:
    """Refuse to start a later epoch while the epoch a checkpoint was re-planned into (elastic
    resume) still has rows for this rank: skipping them would lose them silently."""
    source = dataset.epochs.elastic
    if source is None or dataset.epoch <= source.epoch:
        return
    for slot in SlotGrid(dataset.world_size, num_workers).rank_slots(dataset.rank):
        worker = slot.worker_id
        left = dataset.batches_left(dataset.epochs.start(slot, source.epoch), slot)
        if left != 0:
            rows = "rows to read (a filter decides how many it yields)" if left is None else f"{left} batch(es)"
            raise StateMismatchError(
                f"the checkpoint is in epoch {source.epoch} (re-planned from world_size={source.world_size}, "
                f"num_workers={source.num_workers}), which still has {rows} for rank {dataset.rank} worker {worker}, "
                f"but the dataset is set to epoch {dataset.epoch}; call dataset.set_epoch({source.epoch}) before "
                "iterating to finish the saved epoch, or start without loading the checkpoint")
