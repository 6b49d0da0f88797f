"""StatefulDataLoader's own keywords: every bad value is an arrowstream error naming it (guarantees
11 and 13), checked before planning and before any worker starts; good values still load."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
from helpers import ids_of, make_loader

from arrowstream import ArrowStreamDataLoader, Mixture, MixtureDataLoader, Source, StructuredDataset, errors

BAD = [
    # in_order=False is taken (tests/test_in_order.py); only its type is checked here
    (1, {"in_order": "no"}, errors.ArgumentTypeError, "in_order: expected True or False"),
    (0, {"in_order": 0}, errors.ArgumentTypeError, "in_order: expected True or False"),
    (1, {"prefetch_factor": 0}, errors.InvalidArgumentError, "prefetch_factor: must be >= 1"),  # was an AssertionError
    (1, {"prefetch_factor": "2"}, errors.ArgumentTypeError, "prefetch_factor: expected an int"),
    (0, {"prefetch_factor": 2}, errors.InvalidArgumentError, "prefetch_factor: applies to worker processes only"),
    (1, {"timeout": -1}, errors.InvalidArgumentError, "timeout: expected seconds >= 0"),
    (1, {"timeout": float("nan")}, errors.InvalidArgumentError, "timeout: expected seconds >= 0"),
    (1, {"timeout": "5"}, errors.ArgumentTypeError, "timeout: expected seconds as a number"),
    (0, {"timeout": 5}, errors.InvalidArgumentError, "timeout: applies to worker processes only"),
    (1, {"worker_init_fn": 3}, errors.ArgumentTypeError, "worker_init_fn: expected a callable"),
    (1, {"collate_fn": "stack"}, errors.ArgumentTypeError, "collate_fn: expected a callable"),
    (1, {"generator": 3}, errors.ArgumentTypeError, "generator: expected a torch.Generator"),
    (1, {"persistent_workers": "yes"}, errors.ArgumentTypeError, "persistent_workers: expected True or False"),
    (0, {"persistent_workers": True}, errors.InvalidArgumentError, "persistent_workers: applies to worker processes"),
    (1, {"pin_memory": 1}, errors.ArgumentTypeError, "pin_memory: expected True or False"),
    (1, {"pin_memory_device": 0}, errors.ArgumentTypeError, "pin_memory_device: expected a device name"),
    (1, {"multiprocessing_context": "thread"}, errors.InvalidArgumentError, "multiprocessing_context: unknown start"),
    (1, {"multiprocessing_context": 3}, errors.ArgumentTypeError, "multiprocessing_context: expected a start method"),
    (0, {"multiprocessing_context": "spawn"}, errors.InvalidArgumentError,
     "multiprocessing_context: applies to worker processes only"),
    (1, {"snapshot_every_n_steps": 0}, errors.InvalidArgumentError, "snapshot_every_n_steps: must be >= 1"),
    (1, {"snapshot_every_n_steps": None}, errors.InvalidArgumentError, "snapshot_every_n_steps: None never"),
    (1, {"snapshot_every_n_steps": 2.0}, errors.ArgumentTypeError, "snapshot_every_n_steps: expected an int"),
    (1, {"sampler": [0, 1]}, errors.InvalidArgumentError, "sampler: .* left out"),
    (1, {"batch_sampler": [[0]]}, errors.InvalidArgumentError, "batch_sampler: .* left out"),
    (1, {"batches_per_transfer": 0}, errors.InvalidArgumentError, "batches_per_transfer: expected an int >= 1"),
    (True, {}, errors.ArgumentTypeError, "num_workers: expected an int"),
]


@pytest.mark.parametrize(("num_workers", "kwargs", "error", "pattern"), BAD,
                         ids=[f"{nw}-{next(iter(kw), 'num_workers')}-{i}" for i, (nw, kw, _, _) in enumerate(BAD)])
def test_bad_loader_keyword(small_dataset, num_workers, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        make_loader(small_dataset, num_workers, batch_size=32, **kwargs)


@pytest.mark.parametrize(("args", "kwargs", "error", "pattern"), [
    ((), {"num_workers": 2, "in_order": None}, errors.ArgumentTypeError, "in_order: expected True or False"),
    ((), {"num_workers": 1, "prefetch_factor": 0}, errors.InvalidArgumentError, "prefetch_factor: must be >= 1"),
    ((), {"batch_size": 4}, errors.InvalidArgumentError, r"batch_size: .* takes batch_size=None"),
    ((4,), {}, errors.InvalidArgumentError, r"batch_size: .* takes batch_size=None"),
    ((None, True), {}, errors.InvalidArgumentError, r"shuffle: .* \(set shuffle=/seed= on the dataset\)"),
    ((), {"drop_last": True}, errors.InvalidArgumentError, "drop_last: .*set drop_last on the dataset"),
    ((), {"prefetch": 2}, errors.ArgumentTypeError, "ArrowStreamDataLoader: .*prefetch"),
])
def test_bad_keyword_of_a_loader_built_directly(small_dataset, args, kwargs, error, pattern):
    dataset = StructuredDataset(small_dataset, batch_size=32)
    with pytest.raises(error, match=pattern):
        ArrowStreamDataLoader(dataset, *args, **kwargs)


def test_loader_of_another_dataset_is_refused():
    with pytest.raises(errors.ArgumentTypeError, match="dataset: ArrowStreamDataLoader loads an arrowstream"):
        ArrowStreamDataLoader(list(range(10)))


def test_in_order_set_after_construction_is_checked_when_iterating(small_dataset):
    loader, _ = make_loader(small_dataset, 2, batch_size=32)
    loader.in_order = "no"
    with pytest.raises(errors.ArgumentTypeError, match="in_order: expected True or False"):
        iter(loader)


def test_mixtures_refuse_in_order_false(small_dataset):
    sources = {"a": Source(small_dataset), "b": Source(small_dataset)}
    with pytest.raises(errors.InvalidArgumentError, match="in_order: a MixtureDataLoader does not take in_order=False"):
        Mixture.create_dataloader(sources=sources, batch_size=32, num_workers=2, in_order=False)
    with pytest.raises(errors.InvalidArgumentError, match="in_order: a MixtureDataLoader does not take in_order=False"):
        MixtureDataLoader(Mixture(sources, batch_size=32), num_workers=2, in_order=False)
    loader, _ = Mixture.create_dataloader(sources=sources, batch_size=32, num_workers=2)
    loader.in_order = False  # set after it was built: refused when the epoch starts
    with pytest.raises(errors.InvalidArgumentError, match="in_order: a MixtureDataLoader does not take in_order=False"):
        iter(loader)


def _first_worker(worker_id: int) -> None:
    torch.manual_seed(worker_id)


@pytest.mark.timeout(120)
def test_good_loader_keywords_still_load(small_dataset):
    loader, dataset = make_loader(
        small_dataset, 1, batch_size=32, in_order=True, prefetch_factor=1, timeout=60.0, worker_init_fn=_first_worker,
        generator=torch.Generator().manual_seed(0), persistent_workers=True, pin_memory=False, pin_memory_device="",
        multiprocessing_context=multiprocessing.get_context("fork"), snapshot_every_n_steps=2)
    dataset.set_epoch(0)
    assert sorted(i for batch in loader for i in ids_of(batch)) == list(range(400))
    direct = ArrowStreamDataLoader(StructuredDataset(small_dataset, batch_size=32), None, num_workers=0)
    assert sum(len(ids_of(batch)) for batch in direct) == 400
