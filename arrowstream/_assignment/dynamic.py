"""``assignment="dynamic"``: a rank's workers lease its rows as they finish what they hold, through a lease pool
the loader lays out before its workers start, and a checkpoint holds the ledger of the rest of the epoch
(see :mod:`arrowstream._layout.leases` for the model, :mod:`arrowstream._assignment.dynamic_epoch` for the epochs and the
ledger). See :mod:`arrowstream._assignment`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, ClassVar

from torch.utils.data import get_worker_info

from .._core.fields import REMEDY
from .._layout.layout import check_known
from .._layout.leases import MAX_TAIL_LEASES_PER_WORKER, TAIL_LEASES_PER_WORKER, LocalPool, PoolLeases, fixed_leases
from .._layout.trims import rank_trim
from .._storage.filesystem import logger
from .._worker.lease_pool import PoolSlots, SharedPool
from .._worker.runtime import EpochIterator, OpenEpoch
from ..errors import InvalidArgumentError, StateError
from .dynamic_epoch import dynamic_ledger, dynamic_stream, lease_taker, load_dynamic_ledger, start_state

if TYPE_CHECKING:
    from .._core.order import Slot
    from .._layout.trims import Trim
    from .._planning.options import Options
    from .._state.worker import WorkerState


class DynamicAssignment:
    """Leases of the rank's rows, taken by its workers as they go (the rank's rows fixed across ranks as static)."""

    name: ClassVar[str] = "dynamic"
    in_order: ClassVar[bool] = False   # batches as workers have them: a slow worker holds up no other
    same_order: ClassVar[bool] = False   # the order follows the workers' timing

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

    # -- facts of an epoch -----------------------------------------------------------------------

    def num_batches(self, dataset: Any, num_workers: int) -> int:
        return int(dataset._dynamic.batches(dataset.epoch))

    def rows_dropped(self, dataset: Any, num_workers: int) -> int:
        check_known(dataset._options, "rows drop_last drops are")
        return int(dataset._dynamic.rows_left_out(dataset.epoch)[1])

    def rows_trimmed(self, dataset: Any, num_workers: int) -> int:
        return int(dataset._dynamic.rows_left_out(dataset.epoch)[0]) if dataset._even_batches else 0

    def trim(self, dataset: Any, num_workers: int) -> Trim | None:
        epochs = dataset._dynamic
        trimmed = epochs.rows_left_out(dataset.epoch)[0]
        kept = epochs.fresh(dataset.epoch).num_rows
        return rank_trim(trimmed, kept + trimmed, dataset._options.batch_size, num_workers)

    def stitches_last_rows(self, dataset: Any, num_workers: int) -> bool:
        """With two workers or more, and rows known before reading (a filter or ``bad_rows='skip'`` leaves each
        worker's last batch short, as it leaves len() unknown): see :func:`~arrowstream._layout.leases.last_pieces`."""
        return num_workers > 1 and not dataset._options.drops_rows

    # -- iteration -------------------------------------------------------------------------------

    def iterate(self, dataset: Any, slot: Slot, pending: WorkerState | None) -> EpochIterator:
        epoch = dataset.epoch
        refusal = None
        if get_worker_info() is None:   # the trainer's process reads alone: its own pool, each iteration
            loaded = dataset._dynamic.reads_loaded(epoch)
            dataset._pool = LocalPool(len(dataset._dynamic.leases(epoch, 0, loaded=loaded)), epoch, loaded)
            refusal = dataset._dynamic.refusal(epoch)   # the loader refuses first; raised when read, as static does
        pool = dataset._pool
        if isinstance(pool, PoolSlots):   # persistent workers: the pool of this iteration, taken now
            pool = pool.current()
        if pool is None:
            raise InvalidArgumentError("assignment='dynamic': this dataset's workers share leases that its loader "
                                       "lays out; iterate it through create_dataloader's loader (or "
                                       "ArrowStreamDataLoader), not a plain DataLoader")
        before = start_state(dataset._data, dataset._state_options, epoch, slot, dataset._options.interleave)

        def open_epoch() -> OpenEpoch:
            if refusal is not None:
                raise refusal
            runtime = dataset._worker_runtime()
            # the loaded checkpoint's rest of the epoch, or its fresh rows, as the loader laid out the pool
            leases = PoolLeases(functools.partial(dataset._dynamic.leases, epoch, slot.num_workers,
                                                  loaded=pool.loaded), lambda: pool.pieces)
            if isinstance(pool, SharedPool):
                pool.check(epoch, fixed_leases(leases.of(TAIL_LEASES_PER_WORKER).bounds), slot.worker_id)
            owners = pool.owners if self.stitches_last_rows(dataset, slot.num_workers) else None
            stream = dynamic_stream(runtime, leases, lease_taker(pool, leases, runtime, slot.worker_id), slot,
                                    epoch, dataset._options, dataset._data, dataset._state_options, before, owners)
            return OpenEpoch(stream, runtime, lambda start, end: [f"the files leased by worker {slot.worker_id}"])

        return EpochIterator(slot, open_epoch, before=lambda: before)

    def start_workers(self, loader: Any) -> None:
        """New pools for new workers, before they start: they inherit them (an abandoned iteration's workers keep
        the old ones); persistent workers use two in turn (see :meth:`advance`)."""
        if loader.num_workers == 0:
            return
        dataset = loader.dataset
        epoch = dataset.epoch
        rest = dataset._dynamic.reads_loaded(epoch)   # a loaded checkpoint's rest, or fresh rows
        leases, finest, fixed = lease_counts(dataset, loader.num_workers, epoch, rest)
        if loader.persistent_workers:
            slots = PoolSlots(epoch, leases, loader.multiprocessing_context, finest, fixed, rest)
            dataset._pool, loader._pool = slots, slots.current()
        else:
            loader._pool = dataset._pool = SharedPool(epoch, leases, loader.multiprocessing_context, finest, fixed,
                                                      rest)

    def before_iteration(self, loader: Any) -> None:
        """Refuse an epoch that a loaded checkpoint's rest cannot lead to (see ``DynamicEpochs.refusal``), and
        forget the iteration state_dict() started for another epoch or work than the dataset's now (set_epoch
        came after it): a new one starts."""
        epochs, epoch = loader.dataset._dynamic, loader.dataset.epoch
        pool = loader._pool if loader.num_workers > 0 else loader.dataset._pool
        if loader._initial_iter_for_state_dict and pool is not None \
                and (pool.epoch, pool.loaded) != (epoch, epochs.reads_loaded(epoch)):
            if loader.num_workers > 0:
                loader._iterator._shutdown_workers()
            loader._iterator, loader._initial_iter_for_state_dict = None, False
        refusal = epochs.refusal(epoch)
        if refusal is not None:
            raise refusal

    def advance(self, loader: Any) -> None:
        """With persistent workers, before torchdata starts them on the next iteration: that iteration's leases,
        in the pool the last one did not use (see ``PoolSlots``). Where the pool has no room for them, the
        workers are ended and new ones start, with new pools."""
        iterator = loader._iterator
        if loader.num_workers == 0 or not loader.persistent_workers or iterator is None:
            return   # no workers yet: start_workers makes the pools
        if loader._initial_iter_for_state_dict and not iterator._finished:
            return   # the workers state_dict() started are this iteration's, on the pool made for them
        dataset = loader.dataset
        epoch, slots = dataset.epoch, dataset._pool
        loaded = dataset._dynamic.reads_loaded(epoch)
        leases, finest, fixed = lease_counts(dataset, loader.num_workers, epoch, loaded)
        pool = slots.advance(epoch, leases, finest, fixed, loaded) if isinstance(slots, PoolSlots) else None
        if pool is not None:
            loader._pool = pool
            return
        logger.info("assignment='dynamic': epoch %d has %d leases, more than the persistent workers' pools hold; "
                    "starting new workers", epoch, leases)
        iterator._shutdown_workers()
        loader._iterator = None

    def started(self, loader: Any) -> None:
        loader.dataset._dynamic.started(loader.dataset.epoch)   # a loaded checkpoint's rest is read once

    # -- state -----------------------------------------------------------------------------------

    def state_fields(self, loader: Any, inner: dict[str, Any]) -> dict[str, Any]:
        """The ledger: the rest of the epoch, from who took which lease and each worker's state after its last
        batch handed out (see ``arrowstream._layout.leases``)."""
        dataset = loader.dataset
        if loader.num_workers == 0:
            active, pool = dataset._active, dataset._pool
            cursors = [None if active is None else active.state().cursor]
        else:
            # each worker's position after its last batch handed out, as the batches went by (torchdata's
            # own snapshots do not follow the batches handed out when they come out of order)
            pool = loader._pool
            batches = loader._batch_iterator
            delivered = {} if batches is None else batches.handed_out()
            cursors = [None if w not in delivered else delivered[w].cursor for w in range(loader.num_workers)]
        return {"dynamic": dynamic_ledger(dataset, pool, cursors, loader.num_workers)}

    def load_ledger(self, dataset: Any, outers: list[dict[str, Any]]) -> int:
        return load_dynamic_ledger(dataset, outers)

    def refuse_without_ledger(self) -> None:
        """Worker states that agree with a dynamic dataset (they carry ``assignment: 'dynamic'``) without a
        ledger: it was removed, and the worker cursors do not say which rows are left (a static state is
        refused before, by its options)."""
        raise StateError("the state has no 'dynamic' ledger, but its worker states were taken with "
                         "assignment='dynamic', whose rest of the epoch is the ledger, not the workers' cursors; "
                         f"{REMEDY}")


def lease_counts(dataset: Any, num_workers: int, epoch: int, loaded: bool) -> tuple[int, int, int]:
    """The leases of a dynamic ``epoch`` (of a loaded checkpoint's rest of it: ``loaded``) for ``num_workers``
    workers: how many with the default tail, with the finest one (the room a pool needs), and before the last
    eighth (the same with any tail)."""
    epochs = dataset._dynamic
    default = epochs.leases(epoch, num_workers, loaded=loaded)
    finest = len(epochs.leases(epoch, num_workers, MAX_TAIL_LEASES_PER_WORKER, loaded))
    return len(default), finest, fixed_leases(default.bounds)
