"""``assignment="static"``: each (rank, worker) slot reads the splits the epoch layout gives it
(:mod:`arrowstream._layout.layout`), and a checkpoint holds every worker's cursor. See :mod:`arrowstream._assignment`."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from .._core.order import SlotGrid, assign_lpt
from .._layout.layout import rows_dropped, rows_trimmed, slot_yields
from .._layout.trims import slot_trim
from ..errors import StateMismatchError
from .figures import Figure, rank_sums

if TYPE_CHECKING:
    from .._core.cursor import Position
    from .._core.order import Slot
    from .._layout.trims import Trim
    from .._planning.options import Options
    from .._state.worker import WorkerState
    from .._worker.iterator import SlotIterator
    from .views import PolicyDataset, PolicyLoader


class StaticAssignment:
    """The splits of each slot fixed by the epoch layout (longest processing time on rows)."""

    name: ClassVar[str] = "static"
    in_order: ClassVar[bool] = True
    same_order: ClassVar[bool] = True
    fixed_slots: ClassVar[bool] = True   # a slot reads its share of the layout
    topology_free: ClassVar[bool] = False

    def check(self, options: Options, group_size: int) -> None:
        return None

    def state_options(self) -> dict[str, Any]:
        return {}   # static states stay as they were before there was a choice

    def use_plan(self, dataset: PolicyDataset) -> None:
        return None   # the dataset's epochs lay out each slot's splits: nothing of its own to lay out again

    def assign(self, weights: Sequence[int], num_slots: int) -> list[list[int]]:
        """Longest processing time on rows: deterministic, each slot's items in their given order."""
        return assign_lpt(weights, num_slots)

    def slot_figures(self, dataset: PolicyDataset, num_workers: int) -> list[Figure]:
        """Each slot's share of the epoch layout (the plan's, or the re-planned rest after an elastic resume)."""
        return layout_figures(dataset, num_workers, dataset.epoch)

    def rank_figures(self, dataset: PolicyDataset, num_workers: int, epoch: int | None = None) -> list[Figure]:
        """The sums of each rank's slots."""
        return rank_sums(layout_figures(dataset, num_workers, dataset.epoch if epoch is None else epoch),
                         dataset.world_size)

    def num_batches(self, dataset: PolicyDataset, num_workers: int) -> int:
        return sum(limit for _, limit, _ in workers_yields(dataset, num_workers))

    def rows_dropped(self, dataset: PolicyDataset, num_workers: int) -> int:
        return rows_dropped(workers_yields(dataset, num_workers), dataset.options)

    def rows_trimmed(self, dataset: PolicyDataset, num_workers: int) -> int:
        return rows_trimmed(workers_yields(dataset, num_workers), dataset.options, dataset.even_batches)

    def trim(self, dataset: PolicyDataset, num_workers: int) -> Trim | None:
        options = dataset.options
        return slot_trim(workers_yields(dataset, num_workers), options.batch_size, options.drop_last)

    def stitches_last_rows(self, dataset: PolicyDataset, num_workers: int) -> bool:
        return False

    def replanned_from(self, dataset: PolicyDataset) -> tuple[int, int | None] | None:
        elastic = dataset.epochs.elastic
        return None if elastic is None or elastic.epoch != dataset.epoch else (elastic.world_size, elastic.num_workers)

    def iterate(self, dataset: PolicyDataset, slot: Slot,
                pending: WorkerState | None) -> SlotIterator[Position, WorkerState]:
        from .._worker.iterator import SlotIterator

        return SlotIterator(functools.partial(dataset.open_epoch, slot, pending),
                            before=lambda: pending or dataset.epochs.start(slot, dataset.epoch),
                            epoch=lambda: dataset.epoch)

    def start_state(self, dataset: PolicyDataset, slot: Slot) -> WorkerState:
        return dataset.epochs.start(slot, dataset.epoch)

    def start_workers(self, loader: PolicyLoader) -> None:
        return None

    def before_iteration(self, loader: PolicyLoader) -> None:
        return None

    def advance(self, loader: PolicyLoader) -> None:
        return None

    def started(self, loader: PolicyLoader) -> None:
        return None

    def state_fields(self, loader: PolicyLoader, inner: dict[str, Any]) -> dict[str, Any]:
        return {}   # the workers' cursors in torchdata's dict are the whole state

    def load_ledger(self, dataset: PolicyDataset, outers: list[dict[str, Any]]) -> int:
        raise StateMismatchError(
            "checkpoint was taken with assignment='dynamic', this dataset has assignment='static': the rest of its "
            "epoch is a ledger of leases, not worker cursors. Build the dataset with assignment='dynamic' to resume")

    def refuse_without_ledger(self) -> None:
        return None


def workers_yields(dataset: PolicyDataset, num_workers: int) -> list[tuple[int, int, int]]:
    """Per worker of the dataset's rank: (rows, batches it yields, rows it yields), in the dataset's epoch
    (re-planned for this topology, when a checkpoint of another was loaded)."""
    options = dataset.options
    layout = dataset.epochs.layout(dataset.epoch, SlotGrid(dataset.world_size, num_workers))
    return layout.yields(dataset.rank, options.batch_size, options.drop_last)


def layout_figures(dataset: PolicyDataset, num_workers: int, epoch: int) -> list[Figure]:
    """Each slot's share of the layout of ``epoch`` for ``num_workers`` workers per rank (re-planned, when a loaded
    checkpoint of another topology re-planned that epoch)."""
    options = dataset.options
    layout = dataset.epochs.layout(epoch, SlotGrid(dataset.world_size, num_workers))
    yields = slot_yields([share.num_rows for share in layout.shares], layout.limits, options.batch_size,
                         options.drop_last)
    return [Figure(rows, batches, kept, len(share.splits) + len(share.replays))
            for share, (rows, batches, kept) in zip(layout.shares, yields, strict=True)]
