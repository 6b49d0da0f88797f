"""``order="canonical"``: the epoch laid out over ``canonical_slots`` fixed slots, read by any topology that divides
them (:mod:`arrowstream._layout.canonical`). Its rows reach the workers statically (``assignment="static"``): each
(rank, worker) slot reads whole canonical slots, and a rank's batch is its workers' parts side by side (put together
in the trainer, ``arrowstream._loader.canonical``). A checkpoint is every canonical slot's cursor, which resumes
on any such topology as it stands, without a re-plan. See :mod:`arrowstream._assignment` for what a policy answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from torch.utils.data import get_worker_info

from .._core.order import assign_lpt
from .._layout.canonical import Canonical, canonical_grid, canonical_slot, check_canonical, check_workers
from .._layout.layout import Epochs, rows_dropped, slot_yields
from .._layout.trims import Trim, slot_trim
from .._planning.auto_buffer import auto_buffer_rows, row_bytes
from .._state.canonical import CanonicalState, SlotAt, rank_states
from .._state.resume import Against, checked_state
from .._state.versions import DATASET
from .._state.worker import WorkerState
from ..errors import InvalidArgumentError, StateMismatchError
from .figures import Figure, rank_sums

if TYPE_CHECKING:
    from .._core.order import Slot
    from .._layout.canonical_stream import CanonicalPosition
    from .._planning.options import Options
    from .._worker.iterator import Opened, SlotIterator
    from .views import PolicyDataset, PolicyLoader


def refuse_plain_loader(sends_chunks: bool, loaders: str) -> None:
    """Refuse a worker of a plain ``StatefulDataLoader`` of several workers (one that does not send chunks): a rank's
    batch under ``order="canonical"`` is every worker's part of it, joined in the trainer by arrowstream's loader
    (``loaders``: which)."""
    info = get_worker_info()
    if info is not None and info.num_workers > 1 and not sends_chunks:
        raise InvalidArgumentError(
            f"order='canonical' with more than one worker needs arrowstream's loader ({loaders}): a rank's batch is "
            "every worker's part of it, put together in the trainer, which a plain StatefulDataLoader does not do. "
            "Use num_workers=0 or 1 with a plain loader")


class CanonicalOrder:
    """``order="canonical"`` with ``canonical_slots`` slots (see the module)."""

    name: ClassVar[str] = "static"
    in_order: ClassVar[bool] = True
    same_order: ClassVar[bool] = True
    fixed_slots: ClassVar[bool] = True
    topology_free: ClassVar[bool] = True   # each canonical slot's state resumes on any topology that divides them

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._canonical: Canonical | None = None
        self._epochs: Epochs | None = None
        self._options: Options | None = None
        self._resume: dict[int, SlotAt] = {}   # a loaded checkpoint: where each canonical slot stands
        self._resume_epoch = -1

    def check(self, options: Options, group_size: int) -> None:
        if options.drops_rows:
            raise InvalidArgumentError(
                "order='canonical' cuts the epoch's rows into equal stretches, one per canonical slot, so that every "
                "global batch holds the same rows on any topology; a filter (or bad_rows='skip') makes the rows "
                "unknown before reading. Filter the data when writing it, or use order='topology'")

    def state_options(self) -> dict[str, Any]:
        return {"order": "canonical", "canonical_slots": self.slots}

    def use_plan(self, dataset: PolicyDataset) -> None:
        """The canonical slots' epochs of the dataset's plan: batches of ``chunk`` rows (a global batch over the
        canonical slots), the default buffer sized per canonical slot."""
        options = dataset.options
        canonical = check_canonical(self.slots, options.batch_size, dataset.world_size)
        buffer = options.shuffle_buffer_size
        if options.auto_buffer and buffer:   # the default's memory spread over the canonical slots
            buffer = auto_buffer_rows(row_bytes(dataset.plan) * self.slots, canonical.chunk, windows=self.slots)
        inner = dataclasses.replace(options, batch_size=canonical.chunk, shuffle_buffer_size=buffer)
        state_options = {**inner.state_options(), "even_batches": True, **self.state_options()}
        self._canonical, self._options = canonical, inner
        self._epochs = Epochs(dataset.plan, inner, True, dataset.identity, state_options, assign=assign_lpt,
                              even_cut=True)

    @property
    def canonical(self) -> Canonical:
        assert self._canonical is not None, "laid out by use_plan"
        return self._canonical

    @property
    def read_options(self) -> Options:
        """The options a canonical slot reads with (batches of the chunk, its buffer)."""
        assert self._options is not None, "laid out by use_plan"
        return self._options

    @property
    def epochs(self) -> Epochs:
        """The canonical slots' epochs."""
        assert self._epochs is not None, "laid out by use_plan"
        return self._epochs

    def assign(self, weights: Sequence[int], num_slots: int) -> list[list[int]]:
        return assign_lpt(weights, num_slots)   # a re-plan of another order's checkpoint is refused: never asked

    # -- facts of an epoch ---------------------------------------------------------------------

    def canonical_yields(self, epoch: int) -> list[tuple[int, int, int]]:
        """Each canonical slot's (rows, chunks, rows yielded) in ``epoch``."""
        layout = self.epochs.layout(epoch, canonical_grid(self.slots))
        options = self.epochs.options
        return slot_yields([share.num_rows for share in layout.shares], layout.limits, options.batch_size,
                           options.drop_last)

    def slot_figures(self, dataset: PolicyDataset, num_workers: int) -> list[Figure]:
        """Each (rank, worker) slot: the sums of the canonical slots it reads; its batches are its parts of
        global batches (a rank's batches are its workers' parts side by side)."""
        return self._physical(dataset, num_workers, dataset.epoch)

    def _physical(self, dataset: PolicyDataset, num_workers: int, epoch: int) -> list[Figure]:
        check_workers(self.canonical, dataset.world_size, num_workers)
        layout = self.epochs.layout(epoch, canonical_grid(self.slots))
        yields = self.canonical_yields(epoch)
        per = self.slots // (dataset.world_size * max(num_workers, 1))
        out = []
        for first in range(0, self.slots, per):
            mine = range(first, first + per)
            out.append(Figure(sum(yields[c][0] for c in mine), yields[first][1], sum(yields[c][2] for c in mine),
                              sum(len(layout.shares[c].splits) for c in mine)))
        return out

    def rank_figures(self, dataset: PolicyDataset, num_workers: int, epoch: int | None = None) -> list[Figure]:
        figures = self._physical(dataset, num_workers, dataset.epoch if epoch is None else epoch)
        ranks = rank_sums(figures, dataset.world_size)
        per_rank = len(figures) // dataset.world_size
        return [Figure(figure.rows, figures[rank * per_rank].batches, figure.rows_yielded, figure.splits)
                for rank, figure in enumerate(ranks)]

    def num_batches(self, dataset: PolicyDataset, num_workers: int) -> int:
        return self.canonical_yields(dataset.epoch)[0][1]

    def _rank_yields(self, dataset: PolicyDataset) -> list[tuple[int, int, int]]:
        per_rank = self.slots // dataset.world_size
        return self.canonical_yields(dataset.epoch)[dataset.rank * per_rank:(dataset.rank + 1) * per_rank]

    def rows_dropped(self, dataset: PolicyDataset, num_workers: int) -> int:
        return rows_dropped(self._rank_yields(dataset), self.epochs.options)

    def rows_trimmed(self, dataset: PolicyDataset, num_workers: int) -> int:
        return sum(rows - kept for rows, _, kept in self._rank_yields(dataset)) - self.rows_dropped(dataset, 0)

    def trim(self, dataset: PolicyDataset, num_workers: int) -> Trim | None:
        options = self.epochs.options
        return slot_trim(self._rank_yields(dataset), options.batch_size, options.drop_last)

    def stitches_last_rows(self, dataset: PolicyDataset, num_workers: int) -> bool:
        return False

    def replanned_from(self, dataset: PolicyDataset) -> tuple[int, int | None] | None:
        return None

    # -- iteration -----------------------------------------------------------------------------

    def iterate(self, dataset: PolicyDataset, slot: Slot,
                pending: Any) -> SlotIterator[CanonicalPosition, CanonicalState]:
        from .._worker.canonical import open_canonical_epoch
        from .._worker.iterator import SlotIterator

        check_workers(self.canonical, dataset.world_size, slot.num_workers)
        pending = self._pending(dataset, slot)
        self._taken(dataset)   # this process has it now (a worker's copy, or the trainer's without workers)

        def opened() -> Opened[CanonicalPosition, CanonicalState]:
            # refused at the first batch (a worker's error torch hands over as any batch's, and shuts down cleanly)
            refuse_plain_loader(dataset.worker_runtime().transport.send_chunks, "create_dataloader, or "
                                "ArrowStreamDataLoader")
            return open_canonical_epoch(dataset.worker_runtime, self.epochs, self.read_options, self.canonical, slot,
                                        dataset.epoch, pending, self._head_options(dataset))

        return SlotIterator(opened, before=lambda: pending or self.start_state(dataset, slot),
                            epoch=lambda: dataset.epoch)

    def _head_options(self, dataset: PolicyDataset) -> dict[str, Any]:
        return dict(dataset.state_options)

    def _pending(self, dataset: PolicyDataset, slot: Slot) -> CanonicalState | None:
        """The loaded state of ``slot``'s canonical slots in the dataset's epoch (None: the epoch starts whole);
        refused when the checkpoint stands inside another epoch than the dataset's (its rows would be lost)."""
        if self._resume_epoch < 0:
            return None
        if self._resume_epoch != dataset.epoch:
            self._check_epoch(dataset)
            return None
        loaded = [self._resume[c] for c in self.canonical.physical_range(slot)]
        return CanonicalState.of(DATASET, dataset.epoch, slot, self.slots, tuple(at.state for at in loaded),
                                 self._head_options(dataset), tuple(at.past for at in loaded))

    def _check_epoch(self, dataset: PolicyDataset) -> None:
        """Refuse to iterate another epoch than a loaded mid-epoch checkpoint's (its rows would be lost)."""
        if self._resume_epoch < 0 or self._resume_epoch == dataset.epoch:
            return
        if any(self.epochs.batches_left(at.state, canonical_slot(c, self.slots)) != at.past[0]
               for c, at in self._resume.items()):
            raise StateMismatchError(
                f"the checkpoint is in epoch {self._resume_epoch} (mid-epoch) but the dataset is set to epoch "
                f"{dataset.epoch}; call dataset.set_epoch({self._resume_epoch}) before iterating to finish the saved "
                "epoch, or start without loading the checkpoint")

    def _taken(self, dataset: PolicyDataset) -> None:
        """The loaded states were handed to the iteration of the dataset's epoch (or that epoch is another): forget
        them, so a later epoch, or the same one iterated again, starts whole."""
        if self._resume_epoch >= 0:
            self.forget()

    def start_state(self, dataset: PolicyDataset, slot: Slot) -> CanonicalState:
        """``slot``'s state before its next batch: the loaded one, or the start of the dataset's epoch."""
        loaded = self._pending(dataset, slot)
        if loaded is not None:
            return loaded
        states = tuple(self.epochs.start(canonical_slot(c, self.slots), dataset.epoch)
                       for c in self.canonical.physical_range(slot))
        return CanonicalState.of(DATASET, dataset.epoch, slot, self.slots, states, self._head_options(dataset))

    def start_workers(self, loader: PolicyLoader) -> None:
        check_workers(self.canonical, loader.dataset.world_size, loader.num_workers)

    def before_iteration(self, loader: PolicyLoader) -> None:
        self._check_epoch(loader.dataset)   # in the trainer, before any worker starts

    def advance(self, loader: PolicyLoader) -> None:
        return None

    def started(self, loader: PolicyLoader) -> None:
        self._taken(loader.dataset)   # the workers have their copies of the loaded states

    # -- state ---------------------------------------------------------------------------------

    def state_fields(self, loader: PolicyLoader, inner: dict[str, Any]) -> dict[str, Any]:
        return {}

    def load_ledger(self, dataset: PolicyDataset, outers: list[dict[str, Any]]) -> int:
        raise StateMismatchError(
            "checkpoint was taken with assignment='dynamic', this dataset has order='canonical': the rest of its "
            "epoch is a ledger of leases, not canonical slots' cursors. Build the dataset as the run that took it")

    def refuse_without_ledger(self) -> None:
        return None

    def resume(self, dataset: PolicyDataset, saved: Sequence[CanonicalState], where: str) -> int:
        """Resume from the worker states of a checkpoint (of any topology that divides the canonical slots): every
        canonical slot this rank reads must be among them, at one epoch and one global batch; each is checked
        against the canonical layout. Returns the epoch."""
        found = rank_states(saved, self.slots, dataset.rank, dataset.world_size, where)
        wanted = list(found)
        first: WorkerState = found[wanted[0]].state
        against = Against(self.epochs, self.epochs.options, dataset.identity, self.epochs.state_options,
                          dataset.data_identity, set())
        for c in wanted:
            checked_state(against, found[c].state, False, canonical_slot(c, self.slots),
                          f"{where}'s canonical slot {c}", None, followed=True)
        self._resume = found
        self._resume_epoch = first.epoch
        return first.epoch

    def forget(self) -> None:
        """Forget a loaded checkpoint: the epochs start whole."""
        self._resume, self._resume_epoch = {}, -1
