"""The seams of the dataset (issue 18): the epoch layout, the assignment policy it takes, the worker
runtime the loader configures in one call, and the sources the front doors stand on."""

from __future__ import annotations

from collections import Counter

import pytest
from helpers import ids_of, write_dataset

from arrowstream import IcebergDataset, StructuredDataset
from arrowstream._core.order import SlotGrid, epoch_order, even_batch_limits, slot_row_counts, slot_split_ids
from arrowstream._layout.layout import Layouts, lay_out_epoch
from arrowstream._storage.filesystem import Storage
from arrowstream._worker.runtime import Transport

TOPOLOGIES = [(1, 0), (1, 3), (2, 2), (3, 1)]


@pytest.fixture(scope="module")
def plan_and_options(tmp_path_factory):
    folder = write_dataset(tmp_path_factory.mktemp("layout"), [(300, 97), (7, 7), (1200, 97), (64, 10), (900, 300)])
    dataset = StructuredDataset(folder, batch_size=16, shuffle=True, seed=5, split_bytes=2048,
                                world_size=2, rank=0, plan_locally=True)
    return dataset._plan, dataset._options


@pytest.mark.parametrize(("world_size", "num_workers"), TOPOLOGIES)
def test_a_normal_layout_is_every_split_once_in_the_slots_reading_order(plan_and_options, world_size, num_workers):
    plan, options = plan_and_options
    grid = SlotGrid(world_size, num_workers)
    splits = plan.splits_for(grid.num_slots)
    rows = [s.num_rows for s in splits]
    for epoch in (0, 3):
        layout = lay_out_epoch(plan, grid, epoch, options, even_batches=world_size > 1)
        assert not layout.replanned and all(share.replays == () for share in layout.shares)
        for index in range(grid.num_slots):
            slot = grid.slot_at(index)
            ids = slot_split_ids(rows, slot, shuffle=True, seed=5, epoch=epoch)
            assert layout.share(slot).splits == tuple(splits[i] for i in ids)
        assert Counter(s for share in layout.shares for s in share.splits) == Counter(splits)
        # the limits follow from the slots' rows, which do not depend on the epoch's order
        expected = even_batch_limits(slot_row_counts(rows, grid.num_slots), world_size, 16, False)
        assert layout.limits == (tuple(expected) if world_size > 1 else None)


def test_an_assignment_policy_is_a_function_the_layout_takes(plan_and_options):
    """A new policy plugs in as a function (here: round robin), not as a branch in the dataset."""
    plan, options = plan_and_options

    def round_robin(weights, num_slots):
        return [list(range(slot, len(weights), num_slots)) for slot in range(num_slots)]

    grid = SlotGrid(1, 3)
    layout = Layouts(plan, options, even_batches=False, assign=round_robin).layout(0, grid)
    splits = plan.splits_for(grid.num_slots)
    order = epoch_order(len(splits), shuffle=True, seed=5, epoch=0)
    for slot in range(3):
        assert layout.shares[slot].splits == tuple(splits[int(order[i])] for i in range(slot, len(splits), 3))


def test_the_loader_hands_the_dataset_its_transport_in_one_call(uneven_dataset):
    """The loader writes nothing onto the dataset but its transport settings, which reach the workers."""
    dataset = StructuredDataset(uneven_dataset, batch_size=64)
    before = set(vars(dataset))
    from arrowstream import ArrowStreamDataLoader

    loader = ArrowStreamDataLoader(dataset, batch_size=None, num_workers=2, batches_per_transfer=3)
    assert set(vars(dataset)) == before
    assert dataset._side.transport == Transport(batches_per_transfer=3, send_chunks=True)
    assert dataset._side.transport.board is loader._transport.board is not None
    assert sorted(i for batch in loader for i in ids_of(batch)) == list(range(dataset.num_rows))
    assert loader.metrics()["rows"] == dataset.num_rows  # the workers' meters write to the loader's board


def test_the_storage_reads_ahead_as_built_not_as_written_from_outside():
    storage = Storage("memory")
    opened = storage.fs  # planning opened it (and may have asked a credential provider for it)
    reading = storage.reading(read_ahead=4, read_lanes=2)
    assert (reading.read_ahead, reading.read_lanes) == (4, 2)
    assert (storage.read_ahead, storage.read_lanes) == (0, 1)  # the original is left as it was
    assert reading.fs is opened  # not opened again (a pickling copy would drop it)


def test_the_front_doors_override_no_planning_hook():
    """IcebergDataset stands on a source (arrowstream._sources.iceberg): it overrides no hook of planning,
    identity, snapshot following or pickling."""
    hooks = {"_make_plan", "_arguments", "_use_plan", "follow_origin", "_follow_snapshot", "__getstate__",
             "_plan_here"}
    assert hooks & set(vars(IcebergDataset)) == set()


def test_what_both_front_doors_answer_alike_is_defined_once():
    """StructuredDataset and Mixture answer epoch, set_epoch, rank, world_size, batch_size and options from one
    base (arrowstream._loader.front.FrontDoor); neither front door nor its hooks defines them again."""
    from arrowstream import Mixture
    from arrowstream._loader.dataset_hooks import DatasetHooks
    from arrowstream._loader.front import FrontDoor
    from arrowstream._loader.mixture_hooks import MixtureHooks
    from arrowstream._loader.mixture_sources import PlannedMixture

    common = {"epoch", "set_epoch", "rank", "world_size", "batch_size", "options"}
    assert common <= set(vars(FrontDoor))
    for door in (StructuredDataset, DatasetHooks, IcebergDataset, Mixture, MixtureHooks, PlannedMixture):
        assert issubclass(door, FrontDoor) and common & set(vars(door)) == set(), door.__name__
