"""``assignment="dynamic"``: a rank's workers lease its rows as they finish what they hold, through a lease pool
the loader lays out before its workers start, and a checkpoint holds the ledger of the rest of the epoch
(see :mod:`arrowstream._layout.leases` for the model, :mod:`arrowstream._assignment.dynamic_epoch` for the epochs and the
ledger). See :mod:`arrowstream._assignment`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from torch.utils.data import get_worker_info

from .._core.fields import REMEDY
from .._core.order import assign_lpt
from .._layout.layout import check_known
from .._layout.leases import MAX_TAIL_LEASES_PER_WORKER, TAIL_LEASES_PER_WORKER, LocalPool, PoolLeases, fixed_leases
from .._layout.trims import rank_trim
from .._storage.filesystem import logger
from .._worker.iterator import Opened, SlotIterator
from .._worker.lease_pool import PoolSlots, SharedPool
from ..errors import InvalidArgumentError, StateError
from .dynamic_epoch import (
    DynamicEpochs,
    dynamic_ledger,
    dynamic_stream,
    lease_taker,
    load_dynamic_ledger,
    start_state,
)
from .figures import Figure

if TYPE_CHECKING:
    from .._core.cursor import Position
    from .._core.order import Slot
    from .._layout.trims import Trim
    from .._planning.options import Options
    from .._state.worker import WorkerState
    from .views import PolicyDataset, PolicyLoader


class DynamicAssignment:
    """Leases of the rank's rows, taken by its workers as they go (the rank's rows fixed across ranks as static).

    One per dataset, it owns what only it uses: the dataset's :class:`DynamicEpochs` (each epoch's work, a loaded
    ledger), the lease pool the dataset's workers (or the trainer's process) read (``shared``: a ``SharedPool``, a
    persistent loader's ``PoolSlots``, or the trainer's ``LocalPool``), the pool of the loader's running iteration
    (:attr:`pool`) and the iteration the trainer's process reads (for the ledger of a loader without workers).
    """

    name: ClassVar[str] = "dynamic"
    in_order: ClassVar[bool] = False   # batches as workers have them: a slow worker holds up no other
    same_order: ClassVar[bool] = False   # the order follows the workers' timing
    fixed_slots: ClassVar[bool] = False   # a slot reads what it leases
    topology_free: ClassVar[bool] = False

    def __init__(self) -> None:
        self._epochs: DynamicEpochs | None = None   # made by use_plan, then re-planned in place
        self._shared: Any = None   # what the workers read: inherited from the loader, or the trainer's own
        self._pool: SharedPool | None = None   # the leases of the loader's running iteration
        self._active: SlotIterator[Position, WorkerState] | None = None   # the trainer's process's iteration (num_workers=0)

    @property
    def epochs(self) -> DynamicEpochs:
        """The dataset's epochs as this policy leases them (each epoch's work, a loaded checkpoint's rest)."""
        assert self._epochs is not None, "DynamicAssignment.use_plan makes the epochs"
        return self._epochs

    @property
    def pool(self) -> SharedPool | None:
        """The lease pool of the loader's running iteration (None: no workers started yet, or a checkpoint was
        loaded since)."""
        return self._pool

    def check(self, options: Options, group_size: int) -> None:
        """Not with a filter and a shuffle buffer, whose windows' rows a checkpoint could not name before
        reading; not with ``group_size`` above 1, whose ranks must yield the same batches."""
        if options.drops_rows and options.shuffle_buffer_size:
            raise InvalidArgumentError(
                "assignment='dynamic' with a filter (or bad_rows='skip') and shuffle_buffer_size: which rows a "
                "shuffle window holds is unknown before reading, so a checkpoint could not name the rows a worker had "
                "not handed out. Use one of them, or assignment='static'")
        if group_size > 1:
            raise InvalidArgumentError(
                f"assignment='dynamic' with group_size={group_size}: the ranks of a group must yield the same "
                "batches, and dynamic assignment orders them by the timing of each rank's own workers. Use "
                "assignment='static' with group_size above 1")

    def state_options(self) -> dict[str, Any]:
        return {"assignment": self.name}

    def use_plan(self, dataset: PolicyDataset) -> None:
        """The dataset's plan or options changed (built, a checkpoint's planning or buffer, a table that moved
        on): its epochs are laid out again (a loaded ledger stays), and the workers' pool is forgotten."""
        if self._epochs is None:
            self._epochs = DynamicEpochs(dataset.plan, dataset.options, dataset.world_size, dataset.rank,
                                         dataset.even_batches)
        else:
            self._epochs.replan(dataset.plan, dataset.options)
        self._shared = None

    # -- facts of an epoch -----------------------------------------------------------------------

    def assign(self, weights: Sequence[int], num_slots: int) -> list[list[int]]:
        """Across ranks as static (longest processing time on rows): each rank's rows stay fixed, its workers lease
        them (the dataset's layouts, used for the rank's share and by ``arrowstream inspect``)."""
        return assign_lpt(weights, num_slots)

    def slot_figures(self, dataset: PolicyDataset, num_workers: int) -> list[Figure]:
        """With one worker per rank (or none), a slot is its rank: the rank's figures. With more, refused: which
        rows each worker reads, and so its batches, are decided by the leases it takes at run time; a figure per
        worker would be a guess (a static share no dynamic worker reads), and a list per rank in its place would
        be indexed as slots by the caller without a word. The rank's figures are fixed: ``rank_figures``."""
        if num_workers > 1:
            raise InvalidArgumentError(
                f"num_workers={num_workers}: with assignment='dynamic' each rank's {num_workers} workers lease its "
                "splits in the epoch's order as they finish the ones they hold (the last cut into row ranges), so which "
                "worker reads which rows, and the batches each yields, are decided at run time; the rank's rows and "
                f"batches are fixed: ask dataset.rank_yields({num_workers}) (or len(loader) on the rank), or build the "
                "dataset with assignment='static' for a fixed share per worker")
        return self.rank_figures(dataset, num_workers)

    def rank_figures(self, dataset: PolicyDataset, num_workers: int, epoch: int | None = None) -> list[Figure]:
        """Each rank's work of the dataset's epoch (re-planned for this world size after a resume from another), as
        its workers lease it: its batches are ``len(loader)`` on it (the workers' last rows stitched into whole
        batches), whatever ``num_workers``."""
        epochs = self.epochs
        epoch = dataset.epoch if epoch is None else epoch
        return [(epochs if rank == dataset.rank
                 else epochs.checking(dataset.world_size, rank, epochs.even_batches, epochs.replanned)).figure(epoch)
                for rank in range(dataset.world_size)]

    def num_batches(self, dataset: PolicyDataset, num_workers: int) -> int:
        return int(self.epochs.batches(dataset.epoch))

    def rows_dropped(self, dataset: PolicyDataset, num_workers: int) -> int:
        check_known(dataset.options, "rows drop_last drops are")
        return int(self.epochs.rows_left_out(dataset.epoch)[1])

    def rows_trimmed(self, dataset: PolicyDataset, num_workers: int) -> int:
        return int(self.epochs.rows_left_out(dataset.epoch)[0]) if dataset.even_batches else 0

    def trim(self, dataset: PolicyDataset, num_workers: int) -> Trim | None:
        epochs = self.epochs
        trimmed = epochs.rows_left_out(dataset.epoch)[0]
        kept = epochs.fresh(dataset.epoch).num_rows
        return rank_trim(trimmed, kept + trimmed, dataset.options.batch_size, num_workers)

    def stitches_last_rows(self, dataset: PolicyDataset, num_workers: int) -> bool:
        """With two workers or more, and rows known before reading (a filter or ``bad_rows='skip'`` leaves each
        worker's last batch short, as it leaves len() unknown): see :func:`~arrowstream._layout.leases.last_pieces`."""
        return num_workers > 1 and not dataset.options.drops_rows

    def replanned_from(self, dataset: PolicyDataset) -> tuple[int, int | None] | None:
        """The world size of the merged checkpoint whose ranks' rests the dataset's epoch was re-planned from (its
        workers do not matter: each new rank's workers lease its stretch)."""
        replanned = self.epochs.replanned
        return None if replanned is None or replanned.epoch != dataset.epoch else (replanned.world_size, None)

    # -- iteration -------------------------------------------------------------------------------

    def iterate(self, dataset: PolicyDataset, slot: Slot,
                pending: WorkerState | None) -> SlotIterator[Position, WorkerState]:
        epoch, epochs = dataset.epoch, self.epochs
        refusal = None
        if get_worker_info() is None:   # the trainer's process reads alone: its own pool, each iteration
            loaded = epochs.reads_loaded(epoch)
            self._shared = LocalPool(len(epochs.leases(epoch, 0, loaded=loaded)), epoch, loaded)
            refusal = epochs.refusal(epoch)   # the loader refuses first; raised when read, as static does
        pool = self._shared
        if isinstance(pool, PoolSlots):   # persistent workers: the pool of this iteration, taken now
            pool = pool.current()
        if pool is None:
            raise InvalidArgumentError("assignment='dynamic': this dataset's workers share leases that its loader "
                                       "lays out; iterate it through create_dataloader's loader (or "
                                       "ArrowStreamDataLoader), not a plain DataLoader")
        options, data, state_options = dataset.options, dataset.identity, dataset.state_options
        before = start_state(data, state_options, epoch, slot, options.interleave)

        def open_epoch() -> Opened[Position, WorkerState]:
            if refusal is not None:
                raise refusal
            runtime = dataset.worker_runtime()
            # the loaded checkpoint's rest of the epoch, or its fresh rows, as the loader laid out the pool
            leases = PoolLeases(functools.partial(epochs.leases, epoch, slot.num_workers, loaded=pool.loaded),
                                lambda: pool.pieces)
            if isinstance(pool, SharedPool):
                pool.check(epoch, fixed_leases(leases.of(TAIL_LEASES_PER_WORKER).bounds), slot.worker_id)
            owners = pool.owners if self.stitches_last_rows(dataset, slot.num_workers) else None
            stream = dynamic_stream(runtime, leases, lease_taker(pool, leases, runtime, slot.worker_id), slot,
                                    epoch, options, before, owners)
            return Opened(stream, runtime.converters, runtime.meter, runtime.transport,
                          files_between=lambda start, end: [f"the files leased by worker {slot.worker_id}"],
                          by_record=True)

        self._active = SlotIterator(open_epoch, before=lambda: before, epoch=lambda: epoch)
        return self._active

    def start_state(self, dataset: PolicyDataset, slot: Slot) -> WorkerState:
        return dataset.epochs.start(slot, dataset.epoch)

    def start_workers(self, loader: PolicyLoader) -> None:
        """New pools for new workers, before they start: they inherit them (an abandoned iteration's workers keep
        the old ones); persistent workers use two in turn (see :meth:`advance`)."""
        if loader.num_workers == 0:
            return
        epoch = loader.dataset.epoch
        rest = self.epochs.reads_loaded(epoch)   # a loaded checkpoint's rest, or fresh rows
        leases, finest, fixed = lease_counts(self.epochs, loader.num_workers, epoch, rest)
        if loader.persistent_workers:
            slots = PoolSlots(epoch, leases, finest, fixed, rest)
            self._shared, self._pool = slots, slots.current()
        else:
            self._pool = self._shared = SharedPool(epoch, leases, finest, fixed, rest)

    def before_iteration(self, loader: PolicyLoader) -> None:
        """Refuse an epoch that a loaded checkpoint's rest cannot lead to (see ``DynamicEpochs.refusal``), and
        forget the iteration state_dict() started for another epoch or work than the dataset's now (set_epoch
        came after it): a new one starts."""
        epochs, epoch = self.epochs, loader.dataset.epoch
        pool = self._pool if loader.num_workers > 0 else self._shared
        if loader.holds_state_dict_iteration() and pool is not None \
                and (pool.epoch, pool.loaded) != (epoch, epochs.reads_loaded(epoch)):
            loader.end_iteration()
        refusal = epochs.refusal(epoch)
        if refusal is not None:
            raise refusal

    def advance(self, loader: PolicyLoader) -> None:
        """With persistent workers, before torchdata starts them on the next iteration: that iteration's leases,
        in the pool the last one did not use (see ``PoolSlots``). Where the pool has no room for them, the
        workers are ended and new ones start, with new pools."""
        if loader.num_workers == 0 or not loader.persistent_workers or not loader.holds_iteration():
            return   # no workers yet: start_workers makes the pools
        if loader.holds_state_dict_iteration(unread=True):
            return   # the workers state_dict() started are this iteration's, on the pool made for them
        epoch, slots = loader.dataset.epoch, self._shared
        loaded = self.epochs.reads_loaded(epoch)
        leases, finest, fixed = lease_counts(self.epochs, loader.num_workers, epoch, loaded)
        pool = slots.advance(epoch, leases, finest, fixed, loaded) if isinstance(slots, PoolSlots) else None
        if pool is not None:
            self._pool = pool
            return
        logger.info("assignment='dynamic': epoch %d has %d leases, more than the persistent workers' pools hold; "
                    "starting new workers", epoch, leases)
        loader.end_iteration()

    def started(self, loader: PolicyLoader) -> None:
        self.epochs.started(loader.dataset.epoch)   # a loaded checkpoint's rest is read once

    # -- state -----------------------------------------------------------------------------------

    def state_fields(self, loader: PolicyLoader, inner: dict[str, Any]) -> dict[str, Any]:
        """The ledger: the rest of the epoch, from who took which lease and each worker's state after its last
        batch handed out (see ``arrowstream._layout.leases``)."""
        if loader.num_workers == 0:
            active, pool = self._active, self._shared
            cursors = [None if active is None else active.state().cursor]
        else:
            # each worker's position after its last batch handed out, as the batches went by (torchdata's
            # own snapshots do not follow the batches handed out when they come out of order)
            pool = self._pool
            delivered = loader.positions_handed_out()
            cursors = [None if w not in delivered else delivered[w].cursor for w in range(loader.num_workers)]
        return {"dynamic": dynamic_ledger(loader.dataset, self.epochs, pool, cursors, loader.num_workers)}

    def load_ledger(self, dataset: PolicyDataset, outers: list[dict[str, Any]]) -> int:
        """Load the ledgers (see :func:`~arrowstream._assignment.dynamic_epoch.load_dynamic_ledger`); the leases and
        the iteration of before say nothing of the loaded epoch's rest, and are forgotten."""
        epoch = load_dynamic_ledger(dataset, self.epochs, outers)
        self._pool = self._shared = None
        self._active = None
        return epoch

    def refuse_without_ledger(self) -> None:
        """Worker states that agree with a dynamic dataset (they carry ``assignment: 'dynamic'``) without a
        ledger: it was removed, and the worker cursors do not say which rows are left (a static state is
        refused before, by its options)."""
        raise StateError("the state has no 'dynamic' ledger, but its worker states were taken with "
                         "assignment='dynamic', whose rest of the epoch is the ledger, not the workers' cursors; "
                         f"{REMEDY}")

    def __getstate__(self) -> dict[str, Any]:
        """To the workers with the dataset: the epochs and the pool they read; not the loader's side."""
        return {**self.__dict__, "_pool": None, "_active": None}


def lease_counts(epochs: DynamicEpochs, num_workers: int, epoch: int, loaded: bool) -> tuple[int, int, int]:
    """The leases of a dynamic ``epoch`` (of a loaded checkpoint's rest of it: ``loaded``) for ``num_workers``
    workers: how many with the default tail, with the finest one (the room a pool needs), and before the last
    eighth (the same with any tail)."""
    default = epochs.leases(epoch, num_workers, loaded=loaded)
    finest = len(epochs.leases(epoch, num_workers, MAX_TAIL_LEASES_PER_WORKER, loaded))
    return len(default), finest, fixed_leases(default.bounds)
