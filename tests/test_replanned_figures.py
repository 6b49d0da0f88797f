"""The figures that describe an epoch describe it as it is read when a loaded checkpoint of another topology
re-planned it (issue #38): ``dataset.slot_rows``, ``batch_limits`` and ``slot_yields`` (what ``arrowstream
inspect`` and ``describe_state`` show) are the re-planned shares, as ``len(loader)``, the trims and the
``TrimWarning`` count them, and as the workers yield them.

A mid-epoch checkpoint of 2 workers (on 1 rank and on 2 ranks, merged) is resumed with 3 workers and with 1, with
and without ``even_batches`` and with ``drop_last``; every batch says which worker made it, so each slot's figures
are compared with the batches and rows it actually yields.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from helpers import write_dataset
from torch.utils.data import get_worker_info

import arrowstream
from arrowstream import StructuredDataset, TrimWarning

BATCH, TAKEN = 32, 7
SIZES = [(700, 100), (300, 300), (450, 150), (520, 260), (90, 90), (610, 61), (330, 110)]   # rows, row group
pytestmark = [pytest.mark.timeout(300), pytest.mark.filterwarnings("ignore:This DataLoader will create")]


def _tag_worker(batch):
    """Every batch says which worker made it (-1: the trainer's process)."""
    info = get_worker_info()
    return {**batch, "worker": torch.full((len(batch["id"]),), -1 if info is None else info.id)}


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("replanned-figures"), SIZES)


def _loader(path, num_workers, rank, world_size, options):
    return StructuredDataset.create_dataloader(path=path, num_workers=num_workers, rank=rank, world_size=world_size,
                                               batch_size=BATCH, shuffle=True, seed=3, transform=_tag_worker,
                                               plan_locally=True, **options)


def _checkpoint(path, world_size, options):
    """Every rank of ``world_size`` with 2 workers after ``TAKEN`` batches of epoch 0, merged when several."""
    states = []
    for rank in range(world_size):
        loader, dataset = _loader(path, 2, rank, world_size, options)
        dataset.set_epoch(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TrimWarning)
            for step, _ in enumerate(loader):
                if step + 1 == TAKEN:
                    break
        states.append(loader.state_dict())
    return json.loads(json.dumps(arrowstream.merge_state_dicts(states) if world_size > 1 else states[0]))


def _yielded(loader):
    """(batches, rows) each worker yielded, in worker order."""
    per_worker: dict[int, list[int]] = {}
    for batch in loader:
        counts = per_worker.setdefault(int(batch["worker"][0]), [0, 0])
        counts[0] += 1
        counts[1] += len(batch["id"])
    return [tuple(per_worker.get(w, [0, 0])) for w in range(max(loader.num_workers, 1))]


OPTIONS = {"even": {}, "drop_last": {"drop_last": True}, "uneven": {"even_batches": False}}


@pytest.mark.parametrize("old_world_size, new_world_size", [(1, 1), (2, 2), (2, 3)])
@pytest.mark.parametrize("num_workers", [3, 1])
@pytest.mark.parametrize("kind", OPTIONS)
def test_a_replanned_epochs_figures_are_what_its_workers_yield(uneven, old_world_size, new_world_size, num_workers,
                                                               kind):
    options = OPTIONS[kind]
    state = _checkpoint(uneven, old_world_size, options)
    per_rank = max(num_workers, 1)
    for rank in range(new_world_size):
        loader, dataset = _loader(uneven, num_workers, rank, new_world_size, options)
        planned = dataset.slot_yields(num_workers)
        loader.load_state_dict(state)
        dataset.set_epoch(0)
        yields = dataset.slot_yields(num_workers)
        assert yields != planned, "the re-planned epoch is the rest of the old one: fewer rows than the plan's"
        mine = yields[rank * per_rank:(rank + 1) * per_rank]
        length = len(loader)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TrimWarning)
            actual = _yielded(loader)
        where = f"rank {rank} of {new_world_size}, {num_workers} worker(s), {kind}"
        assert [(batches, kept) for _, batches, kept in mine] == actual, where
        assert length == sum(batches for batches, _ in actual), where
        assert dataset.slot_rows(num_workers) == [rows for rows, _, _ in yields], where
        limits = dataset.batch_limits(num_workers)
        assert (limits is None) == (kind == "uneven" or new_world_size == 1), where
        if limits is not None:
            assert limits == [batches for _, batches, _ in yields], where
        left_out = dataset.rows_trimmed_per_epoch(num_workers) + dataset.rows_dropped_per_epoch(num_workers)
        assert left_out == sum(rows - kept for rows, _, kept in mine), where


@pytest.mark.parametrize("new_world_size, num_workers", [(1, 3), (1, 1), (2, 3)])
def test_describe_state_counts_a_replanned_epochs_rows_with_the_dataset(uneven, new_world_size, num_workers):
    """A checkpoint inside a re-planned epoch: with the dataset, each rank's rows of the epoch are those of its
    re-planned shares (its workers' counters start at the re-plan), so consumed + what follows = the epoch's rows."""
    state = _checkpoint(uneven, 2, {})
    for rank in range(new_world_size):
        loader, dataset = _loader(uneven, num_workers, rank, new_world_size, {})
        loader.load_state_dict(state)
        dataset.set_epoch(0)
        batches = iter(loader)
        for _ in range(5):
            next(batches)
        inside = json.loads(json.dumps(loader.state_dict()))
        rest = sum(len(batch["id"]) for batch in batches)
        _, fresh = _loader(uneven, num_workers, rank, new_world_size, {})   # as the run was built, nothing loaded
        about = arrowstream.describe_state(inside, dataset=fresh)
        assert about["elastic"]["old_num_workers"] == 2 and about["elastic"]["old_world_size"] == 2
        [mine] = about["ranks"]
        assert mine["epoch_rows"] == mine["rows"] + rest, f"rank {rank}"
        assert mine["share"] == pytest.approx(mine["rows"] / mine["epoch_rows"])
        per_rank = max(num_workers, 1)
        assert mine["epoch_rows"] == sum(kept for _, _, kept in
                                         dataset.slot_yields(num_workers)[rank * per_rank:(rank + 1) * per_rank])
        assert arrowstream.describe_state(inside)["share"] is None   # without the data: unknown, and said so


def test_len_counts_the_epoch_as_laid_out_whole_on_the_saved_topology_the_rest_on_another(uneven):
    """docs/distributed.md: resumed on the topology it was taken with, ``len(loader)`` is the whole epoch's batches
    and the loader yields the rest of them; on another topology it is the re-planned rest, all of which it yields."""
    state = _checkpoint(uneven, 1, {})
    whole, _ = _loader(uneven, 2, 0, 1, {})
    same, _ = _loader(uneven, 2, 0, 1, {})
    same.load_state_dict(state)
    assert len(same) == len(whole)
    assert sum(batches for batches, _ in _yielded(same)) == len(whole) - TAKEN
    other, _ = _loader(uneven, 3, 0, 1, {})
    other.load_state_dict(state)
    length = len(other)
    assert length < len(whole) and sum(batches for batches, _ in _yielded(other)) == length
