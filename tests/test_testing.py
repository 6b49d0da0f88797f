"""arrowstream.testing.check_resume: it passes on pipelines that resume exactly and names the first
divergence of those that do not (unseeded randomness, a stateful transform, a seed that changes)."""

from __future__ import annotations

import copy
import functools
import itertools
import multiprocessing
import signal
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
import torch
from helpers import write_dataset
from resume_makers import make_small, make_with_hashed_names
from torch.utils.data import get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

from arrowstream import ArgumentTypeError, InvalidArgumentError, Mixture, Source, StateMismatchError, StructuredDataset
from arrowstream._tools.batch_diff import first_difference, snapshot
from arrowstream._tools.fresh_process import run_in_fresh_process
from arrowstream.testing import _Batch, _compare_continuation, _Point, check_resume


def seeded_noise(batch):
    """Deterministic: the noise is seeded by the batch's own first id."""
    rng = np.random.default_rng(int(batch["id"][0]))
    return {**batch, "noisy": batch["x"] + torch.from_numpy(rng.standard_normal(len(batch["x"])).astype(np.float32))}


def seeded_noise_numpy(batch):
    rng = np.random.default_rng(int(batch["id"][0]))
    return {**batch, "noisy": batch["x"] + rng.standard_normal(len(batch["x"])).astype(np.float32)}


def unseeded_noise(batch):
    rng = np.random.default_rng()   # the bug: a new entropy seed on every call
    return {**batch, "noisy": batch["x"] + torch.from_numpy(rng.standard_normal(len(batch["x"])).astype(np.float32))}


def unseeded_row_drop(batch):
    keep = torch.from_numpy(np.random.default_rng().random(len(batch["id"])) > 0.2)
    return {name: values[keep] for name, values in batch.items()}


class CountingTransform:
    """Adds how many batches this copy of the transform has made, and its worker: the same in every
    run from the start, but a resumed worker's count starts again at 1 (state the checkpoint lacks)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, batch):
        self.calls += 1
        info = get_worker_info()
        rows = len(batch["id"])
        return {**batch, "calls": torch.full((rows,), self.calls), "worker": torch.full((rows,), info.id if info else 0)}


def spread(total, n):
    return sorted({round((i + 1) * total / (n + 1)) for i in range(n)} - {0, total})


CORRECT = {
    "workers0-ordered": (0, {"shuffle": False, "shuffle_buffer_size": 0}),
    "workers0-arrow": (0, {"output_format": "arrow"}),
    "workers2-buffer-interleave": (2, {"interleave": 2, "batches_per_transfer": 2}),
    "workers0-seeded-transform-numpy": (0, {"transform": seeded_noise_numpy, "columns": ["id", "x"],
                                            "output_format": "numpy"}),
}


@pytest.mark.parametrize("case", list(CORRECT))
def test_passes_on_a_pipeline_that_resumes_exactly(small_dataset, case):
    num_workers, options = CORRECT[case]
    make = functools.partial(make_small, small_dataset, num_workers, **options)
    report = check_resume(make, points=2)
    per_epoch = len(make()[0])
    total = 2 * per_epoch
    assert report.num_batches == total
    assert report.points == tuple(sorted([0, *spread(total, 2), per_epoch]))
    assert report.epoch_ends == (per_epoch,)
    assert report.batches_compared == sum(total - k for k in report.points)
    assert "checkpoints resumed exactly" in repr(report)


def test_passes_on_a_mixture(small_dataset, tmp_path):
    other = write_dataset(tmp_path / "other", [(150, 50)], seed=9)
    make = functools.partial(Mixture.create_dataloader, sources={"a": Source(small_dataset), "b": Source(other)},
                             weights={"a": 0.7, "b": 0.3}, epoch_rows=300, batch_size=32, num_workers=2,
                             shuffle=True, seed=1, shuffle_buffer_size=64, source_column="source")
    report = check_resume(make, points=1)
    assert report.num_batches == 2 * len(make()[0]) and report.batches_compared > report.num_batches


def test_accepts_a_bare_loader_of_a_dataset(small_dataset):
    def make():
        dataset = StructuredDataset(small_dataset, batch_size=32, shuffle=True, seed=1)
        return StatefulDataLoader(dataset, batch_size=None)

    report = check_resume(make, points=3)
    assert report.num_batches == 26


@pytest.mark.parametrize("transform", [unseeded_noise, unseeded_row_drop])
def test_catches_a_transform_with_unseeded_randomness(small_dataset, transform):
    make = functools.partial(make_small, small_dataset, columns=["id", "x"], transform=transform)
    with pytest.raises(AssertionError, match=r"diverged at batch 1 of the run \(batch 1 of epoch 0, from worker 0\): "
                                             r"column '(noisy|id)'"):
        check_resume(make, points=2)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_names_the_first_batch_a_stateful_transform_changes_after_the_resume(small_dataset, num_workers):
    def make():
        return make_small(small_dataset, num_workers, transform=CountingTransform(), batches_per_transfer=2)

    loader, dataset = make()
    dataset.set_epoch(0)
    batches = list(loader)
    eighth = batches[7]
    worker, calls = int(eighth["worker"][0]), int(eighth["calls"][0])
    assert calls > 1
    with pytest.raises(AssertionError) as raised:
        check_resume(make, points=[7], at_epoch_ends=False)
    message = str(raised.value)
    assert message.startswith("check_resume: the run resumed from the checkpoint taken after batch 7 (epoch 0) "
                              f"diverged at batch 8 of the run (batch 8 of epoch 0, from worker {worker}): column "
                              f"'calls', element 0: expected {calls}, got 1; the pipeline does not resume exactly"), message


def test_catches_a_make_loader_that_changes_its_seed(small_dataset):
    seeds = itertools.count()

    def make():
        return make_small(small_dataset, seed=next(seeds))

    with pytest.raises(AssertionError, match=r"the run up to the checkpoint taken after batch \d+ \(epoch 0\) diverged "
                                             r"at batch 1 of the run .*column 'id'.*"
                                             r"two loaders built by make_loader yield different batches"):
        check_resume(make, points=2)


def test_a_state_the_loader_refuses_stays_its_error_with_the_checkpoint_named(small_dataset):
    seeds = itertools.count()
    with pytest.raises(StateMismatchError, match="seed") as raised:
        check_resume(lambda: make_small(small_dataset, seed=next(seeds)), points=[0], at_epoch_ends=False)
    assert "check_resume: raised while resuming from the checkpoint taken before the first batch" in \
        raised.value.__notes__


def test_fresh_process_catches_what_one_process_cannot(small_dataset, monkeypatch):
    """``hash`` of a str is salted per process: the same in one process, not in a restarted job."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    make = functools.partial(make_with_hashed_names, small_dataset)
    check_resume(make, points=[5], at_epoch_ends=False)
    with pytest.raises(AssertionError, match=r"diverged at batch 6 of the run .*column 'bucket'"):
        check_resume(make, points=[5], at_epoch_ends=False, fresh_process=True)


def test_a_fresh_process_is_ended_when_its_parent_is_interrupted():
    """Ctrl-C (or a test's timeout) while the parent waits: the child does not run on without it."""
    timer = threading.Timer(3.0, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_in_fresh_process(time.sleep, 120)
    finally:
        timer.cancel()
        timer.join()
    assert [p.name for p in multiprocessing.active_children()] == []


def test_fresh_process_refuses_what_a_new_process_cannot_import(small_dataset):
    def nested():
        return make_small(small_dataset)

    with pytest.raises(InvalidArgumentError, match=r"<lambda>' is a lambda, which cannot be imported.*top level"):
        check_resume(lambda: make_small(small_dataset), fresh_process=True)
    with pytest.raises(InvalidArgumentError, match="is a function defined inside another function"):
        check_resume(nested, fresh_process=True)
    with pytest.raises(InvalidArgumentError, match="cannot be pickled"):
        check_resume(functools.partial(lambda path: make_small(path), small_dataset), fresh_process=True)


@pytest.mark.parametrize(("arguments", "error", "message"), [
    ({"points": -1}, InvalidArgumentError, "points: expected an int >= 0"),
    ({"points": [3, 10_000]}, InvalidArgumentError, r"points: expected batch counts from 0 to 26 .*got \[10000\]"),
    ({"points": [], "at_epoch_ends": False}, InvalidArgumentError, "no checkpoint to check"),
    ({"epochs": 0}, InvalidArgumentError, "epochs: expected an int >= 1"),
    ({"fresh_process": "yes"}, ArgumentTypeError, "fresh_process: expected True or False"),
])
def test_bad_arguments_are_refused(small_dataset, arguments, error, message):
    with pytest.raises(error, match=message):
        check_resume(functools.partial(make_small, small_dataset), **arguments)


def test_make_loader_must_return_a_loader(small_dataset):
    with pytest.raises(ArgumentTypeError, match="make_loader: expected a function"):
        check_resume(make_small(small_dataset))
    with pytest.raises(ArgumentTypeError, match=r"expected it to return \(loader, dataset\).*got list"):
        check_resume(lambda: [1, 2])


def test_a_state_that_does_not_survive_json_is_caught(small_dataset):
    class TupleStateLoader(StatefulDataLoader):
        def state_dict(self):
            return {**super().state_dict(), "extra": (1, 2)}

    def make():
        return TupleStateLoader(StructuredDataset(small_dataset, batch_size=32), batch_size=None)

    with pytest.raises(AssertionError, match=r"changes through json.dumps/json.loads"):
        check_resume(make, points=1)


def test_another_number_of_batches_is_a_divergence():
    reference = [_Batch(0, step, 0, snapshot({"x": torch.tensor([step])})) for step in range(4)]
    with pytest.raises(AssertionError, match=r"yielded 1 batches \(its last in epoch 0\), the uninterrupted run 2 after"):
        _compare_continuation(reference, _Point(2, 0), reference[2:3])
    with pytest.raises(AssertionError, match=r"yielded 3 batches"):
        _compare_continuation(reference, _Point(2, 0), [*reference[2:], reference[3]])
    assert _compare_continuation(reference, _Point(2, 0), reference[2:]) == 2


@pytest.mark.parametrize(("expected", "actual", "message"), [
    ({"x": torch.tensor([1.0, 2.0])}, {"x": torch.tensor([1.0, 3.0])}, "column 'x', element 1: expected 2.0, got 3.0"),
    ({"x": torch.zeros(2, 3)}, {"x": torch.zeros(3, 2)}, "column 'x': expected shape (2, 3), got (3, 2)"),
    ({"x": torch.zeros(2)}, {"x": torch.zeros(2, dtype=torch.float64)},
     "column 'x': expected a tensor of torch.float32, got a tensor of torch.float64"),
    ({"x": torch.zeros(2)}, {"x": np.zeros(2, dtype=np.float32)}, "expected a tensor of torch.float32, got an ndarray"),
    ({"x": np.zeros((2, 2))}, {"x": np.array([[0.0, 0.0], [0.0, 1.0]])}, "column 'x', element (1, 1): expected 0.0, got 1.0"),
    ({"x": torch.tensor([0.0])}, {"x": torch.tensor([-0.0])}, "column 'x', element 0: expected 0.0, got -0.0"),
    ({"name": ["a", "b"]}, {"name": ["a", "c"]}, "column 'name', row 1: expected 'b', got 'c'"),
    ({"name": ["a", "b"]}, {"name": ["a"]}, "column 'name': expected 2 items, got 1"),
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}, "expected keys ['a', 'b'], got ['b', 'a']"),
    ({"f": {"g": torch.tensor([1])}}, {"f": {"g": torch.tensor([2])}}, "column 'f'['g'], element 0: expected 1, got 2"),
    ((torch.tensor([1]), torch.tensor([1])), (torch.tensor([1]), torch.tensor([5])), "the batch[1], element 0"),
    (pa.record_batch({"x": [1, 2]}), pa.record_batch({"x": [1, 3]}), "column 'x', row 1: expected 2, got 3"),
    (pa.record_batch({"x": [1]}), pa.record_batch({"x": [1.0]}), "the batch: expected schema 'x: int64', got 'x: double'"),
])
def test_first_difference_says_where_and_what(expected, actual, message):
    assert message in first_difference(snapshot(expected), snapshot(actual))


def test_equal_batches_are_equal_nan_included():
    batch = {"x": torch.tensor([float("nan"), 1.0]), "h": torch.tensor([1.5], dtype=torch.bfloat16),
             "name": ["a", None], "v": np.array([[1, 2]]), "f": [float("nan")], "nested": {"y": [[1.0, float("nan")]]},
             "arrow": pa.record_batch({"z": [float("nan"), None]})}
    assert first_difference(snapshot(batch), snapshot(copy.deepcopy(batch))) is None


def test_a_snapshot_is_a_copy():
    """A loader may hand out batches on shared memory that later batches reuse."""
    values = torch.zeros(3)
    taken = snapshot({"x": values})
    values[1] = 7
    assert "element 1: expected 0.0, got 7.0" in first_difference(taken, snapshot({"x": values}))


@pytest.mark.parametrize("front", ["dataset", "mixture"])
def test_last_batch_worker_names_the_worker_of_each_batch(tmp_path, front):
    """The loaders' public handle on the worker that made the batch just handed out (what check_resume reads):
    a chunk's worker for every batch of it, in torchdata's round robin; None before the first batch."""
    path = write_dataset(tmp_path / "data", [(64, 8), (64, 8)])
    if front == "dataset":
        loader, _ = StructuredDataset.create_dataloader(path, batch_size=8, num_workers=2, batches_per_transfer=2,
                                                        plan_cache=False)
    else:
        loader, _ = Mixture.create_dataloader(sources={"a": Source(path)}, batch_size=8, num_workers=2,
                                              batches_per_transfer=2, plan_cache=False)
    assert loader.last_batch_worker is None
    workers = []
    for batch in loader:
        workers.append(loader.last_batch_worker)
    assert workers == [0, 0, 1, 1] * 4
