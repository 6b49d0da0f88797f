"""``skip(batches=n)`` on a mixture's loader: the same semantics, checks, state fields and resume as a dataset's
(tests/test_skip.py): the batches after a skip are an unskipped run's from its n-th on, counted in metrics,
remembered in the state (done or pending), and a checkpoint resumes exactly after them."""

from __future__ import annotations

import warnings

import pytest
from helpers import batch_key, json_roundtrip, write_ids

import arrowstream
from arrowstream import ArgumentTypeError, InvalidArgumentError, Mixture, Source, StateError

OPTIONS = {"batch_size": 10, "shuffle": True, "seed": 5, "shuffle_buffer_size": 30, "interleave": 2,
           "plan_cache": False}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two sources of 230 and 120 rows (row groups of 25 and 20), mixed 2:1 over 300 rows an epoch."""
    big = write_ids(tmp_path_factory.mktemp("big"))
    small = write_ids(tmp_path_factory.mktemp("small"), sizes=(70, 50), row_group_size=20)
    return {"big": big, "small": small}


def loader_of(sources, num_workers=0, **options):
    return Mixture.create_dataloader(sources={name: Source(path) for name, path in sources.items()},
                                     weights={"big": 2, "small": 1}, epoch_rows=300, num_workers=num_workers,
                                     **{**OPTIONS, **options})


def keys(batches):
    return [batch_key(batch) for batch in batches]


def rows_of(batches):
    return sum(len(batch["id"]) for batch in batches)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_then_checkpoint_resumes_exactly(sources, num_workers):
    full = list(loader_of(sources, num_workers, batches_per_transfer=3)[0])
    loader, _ = loader_of(sources, num_workers, batches_per_transfer=3)
    batches = iter(loader)
    got = [next(batches) for _ in range(4)]   # inside a chunk of 3 with workers
    loader.skip(batches=5)
    got += [next(batches) for _ in range(2)]
    assert keys(got) == keys(full[:4] + full[9:11])
    skipped_rows = rows_of(full[4:9])
    metrics = loader.metrics()
    assert (metrics["skipped_batches"], metrics["skipped_rows"]) == (5, skipped_rows)
    assert metrics["rows/big"] + metrics["rows/small"] == metrics["rows"]   # the mixture's own metrics stay
    state = json_roundtrip(loader.state_dict())
    assert (state["kind"], state["reads"]) == ("arrowstream.loader", "mixture") and "pending_skip" not in state
    assert state["skips"] == [{"epoch": 0, "at_batch": 4, "batches": 5, "rows": skipped_rows}]
    if num_workers:
        loader._iterator._shutdown_workers()
    for saved in (state, arrowstream.merge_state_dicts([state])):
        resumed, _ = loader_of(sources, num_workers)
        resumed.load_state_dict(saved)
        assert keys(resumed) == keys(full[11:])   # the skipped rows are not yielded again
        assert resumed.state_dict()["skips"] == state["skips"]   # the record goes on with the run
        assert resumed.metrics()["skipped_batches"] == 0   # metrics: what this loader skipped itself


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_pending_skip_travels_in_the_checkpoint(sources, num_workers):
    full = list(loader_of(sources, num_workers)[0])
    loader, _ = loader_of(sources, num_workers)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    loader.skip(batches=2)
    loader.skip(batches=1)   # they add up
    state = json_roundtrip(loader.state_dict())
    assert state["pending_skip"] == 3 and "skips" not in state
    if num_workers:
        loader._iterator._shutdown_workers()
    resumed, _ = loader_of(sources, num_workers)
    resumed.load_state_dict(state)
    assert keys(resumed) == keys(full[6:])
    assert resumed.state_dict()["skips"] == [{"epoch": 0, "at_batch": 3, "batches": 3, "rows": rows_of(full[3:6])}]
    assert "pending_skip" not in resumed.state_dict()
    fresh, _ = loader_of(sources, num_workers)
    fresh.load_state_dict({})   # a fresh start: no skip
    assert keys(fresh) == keys(full)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_past_the_end_of_the_epoch_ends_it_there(sources, num_workers):
    reference, reference_mixture = loader_of(sources, num_workers)
    full = list(reference)
    reference_mixture.set_epoch(1)
    next_epoch = list(reference)
    loader, mixture = loader_of(sources, num_workers)
    batches = iter(loader)
    next(batches)
    loader.skip(batches=100)
    with pytest.warns(UserWarning, match=rf"skip\(batches=100\) reached the end of epoch 0 after {len(full) - 1} batch"):
        assert list(batches) == []
    state = json_roundtrip(loader.state_dict())
    assert state["skips"] == [{"epoch": 0, "at_batch": 1, "batches": len(full) - 1, "rows": rows_of(full[1:])}]
    mixture.set_epoch(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert keys(loader) == keys(next_epoch)   # the rest of the skip does not carry into the next epoch
    resumed, resumed_mixture = loader_of(sources, num_workers)
    resumed.load_state_dict(state)   # the epoch ended by the skip: the next one resumes whole
    resumed_mixture.set_epoch(1)
    assert keys(resumed) == keys(next_epoch)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_skip_asked_at_the_epoch_boundary_skips_the_next_epochs_first_batches(sources, num_workers):
    reference, reference_mixture = loader_of(sources, num_workers)
    list(reference)
    reference_mixture.set_epoch(1)
    next_epoch = list(reference)
    loader, mixture = loader_of(sources, num_workers)
    list(loader)
    loader.skip(batches=2)
    boundary = json_roundtrip(loader.state_dict())   # at the end of epoch 0, the skip still pending
    assert boundary["pending_skip"] == 2
    mixture.set_epoch(1)
    assert keys(loader) == keys(next_epoch[2:])
    expected = [{"epoch": 1, "at_batch": 0, "batches": 2, "rows": rows_of(next_epoch[:2])}]
    assert loader.state_dict()["skips"] == expected
    if num_workers:
        loader._iterator._shutdown_workers()
    resumed, resumed_mixture = loader_of(sources, num_workers)
    resumed.load_state_dict(boundary)
    resumed_mixture.set_epoch(1)
    assert keys(resumed) == keys(next_epoch[2:])
    assert resumed.state_dict()["skips"] == expected


def test_pending_skips_of_every_rank_with_another_topology(sources):
    states = []
    for rank, pending in ((0, 2), (1, 3)):
        loader, _ = loader_of(sources, rank=rank, world_size=2, plan_locally=True)
        list(loader)   # at the epoch boundary, where a mixture changes ranks
        loader.skip(batches=pending)
        states.append(json_roundtrip(loader.state_dict()))
    one, one_mixture = loader_of(sources)
    with pytest.raises(StateError, match=r"different pending skips \(\[2, 3\] batches\)"):
        one.load_state_dict(arrowstream.merge_state_dicts(states))
    states[1]["pending_skip"] = 2   # the same on every rank: each new rank skips it
    one.load_state_dict(arrowstream.merge_state_dicts(states))
    one_mixture.set_epoch(1)
    unskipped, unskipped_mixture = loader_of(sources)
    unskipped.load_state_dict(arrowstream.merge_state_dicts([{k: v for k, v in state.items() if k != "pending_skip"}
                                                             for state in states]))
    unskipped_mixture.set_epoch(1)
    assert keys(one) == keys(list(unskipped)[2:])
    same, _ = loader_of(sources, rank=1, world_size=2, plan_locally=True)   # the same topology: each rank its own
    same.load_state_dict(arrowstream.merge_state_dicts(states))
    assert same.state_dict()["pending_skip"] == 2


@pytest.mark.parametrize("bad,error", [(-1, InvalidArgumentError), (1.5, ArgumentTypeError), ("3", ArgumentTypeError),
                                       (True, ArgumentTypeError), (None, ArgumentTypeError),
                                       (2**70, InvalidArgumentError)])
def test_bad_arguments_name_batches(sources, bad, error):
    loader, _ = loader_of(sources)
    with pytest.raises(error, match=r"^batches: skip\(\)"):
        loader.skip(batches=bad)
    assert "pending_skip" not in loader.state_dict()


@pytest.mark.parametrize("key,value,named", [
    ("pending_skip", 0, "pending_skip"), ("pending_skip", 2**63, "pending_skip"), ("skips", {}, "skips"),
    ("skips", [{"epoch": 0, "at_batch": 0, "batches": 1}], "skips[0]")])
def test_tampered_skips_are_refused(sources, key, value, named):
    loader, _ = loader_of(sources)
    state = {**loader.state_dict(), key: value}
    with pytest.raises(StateError, match=named.replace("[", r"\[")):
        loader.load_state_dict(state)
    with pytest.raises(StateError, match=named.replace("[", r"\[")):
        arrowstream.merge_state_dicts([state])
