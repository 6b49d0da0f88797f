"""``loader.skip(batches=n)``: the batches after a skip are exactly those of an unskipped run from its n-th
on, the skip is counted in metrics and remembered in the state (done or pending), and it resumes exactly."""

from __future__ import annotations

import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import batch_key, json_roundtrip, write_ids

import arrowstream
from arrowstream import (
    ArgumentTypeError,
    InvalidArgumentError,
    Mixture,
    Source,
    StateError,
    StructuredDataset,
    describe_state,
)

OPTIONS = {"batch_size": 10, "shuffle": True, "seed": 5, "shuffle_buffer_size": 30, "interleave": 2}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """2 files, 230 rows, row groups of 25."""
    return write_ids(tmp_path_factory.mktemp("skip"))


def loader_of(folder, num_workers=0, **options):
    return StructuredDataset.create_dataloader(path=folder, num_workers=num_workers, **{**OPTIONS, **options})


def keys(batches):
    return [batch_key(batch) for batch in batches]


def rows_of(batches):
    return sum(len(batch["id"]) for batch in batches)


def test_skip_is_exact_counted_and_resumes_exactly(folder, num_workers=0):
    _check_skip(folder, num_workers)


def test_skip_with_workers(folder):
    _check_skip(folder, 2)


def _check_skip(folder, num_workers):
    full_loader, _ = loader_of(folder, num_workers, batches_per_transfer=3)
    full = list(full_loader)
    loader, _ = loader_of(folder, num_workers, batches_per_transfer=3)
    batches = iter(loader)
    got = [next(batches) for _ in range(4)]   # inside a chunk of 3 with workers
    loader.skip(batches=5)
    got += [next(batches) for _ in range(2)]
    assert keys(got) == keys(full[:4] + full[9:11])
    skipped_rows = rows_of(full[4:9])
    assert loader.metrics()["skipped_batches"] == 5 and loader.metrics()["skipped_rows"] == skipped_rows
    state = json_roundtrip(loader.state_dict())
    assert state["skips"] == [{"epoch": 0, "at_batch": 4, "batches": 5, "rows": skipped_rows}]
    assert "pending_skip" not in state
    about = describe_state({"loader": state})
    assert about["ranks"][0]["skips"] == state["skips"]
    assert (about["rows"], about["batches"]) == (rows_of(full[:11]), 11)   # the skipped rows are consumed
    assert "skipped: epoch 0, after batch 4: 5 batch(es)" in arrowstream.format_state(about)
    if num_workers:
        loader._iterator._shutdown_workers()
    resumed, _ = loader_of(folder, num_workers)
    resumed.load_state_dict(state)
    assert keys(resumed) == keys(full[11:])   # the skipped rows are not yielded again
    assert resumed.state_dict()["skips"] == state["skips"]   # the record goes on with the run
    assert resumed.metrics()["skipped_batches"] == 0   # metrics: what this loader skipped itself


def test_a_pending_skip_travels_in_the_checkpoint(folder):
    full = list(loader_of(folder)[0])
    loader, _ = loader_of(folder)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    loader.load_state_dict(loader.state_dict())   # after a load, as after a loss spike
    loader.skip(batches=2)
    loader.skip(batches=1)   # they add up
    state = json_roundtrip(loader.state_dict())
    assert state["pending_skip"] == 3 and "skips" not in state
    assert describe_state(state)["ranks"][0]["pending_skip"] == 3
    resumed, _ = loader_of(folder)
    resumed.load_state_dict(state)
    assert keys(resumed) == keys(full[6:])
    assert resumed.state_dict()["skips"] == [{"epoch": 0, "at_batch": 3, "batches": 3, "rows": rows_of(full[3:6])}]
    assert "pending_skip" not in resumed.state_dict()
    fresh, _ = loader_of(folder)
    fresh.load_state_dict({})   # a fresh start forgets nothing it was not given: no skip
    assert keys(fresh) == keys(full)


def test_pending_skips_of_every_rank_with_another_world_size(folder):
    states = []
    for rank, pending in ((0, 2), (1, 3)):
        loader, _ = loader_of(folder, rank=rank, world_size=2)
        loader.skip(batches=pending)
        states.append(loader.state_dict())
    one, _ = loader_of(folder)
    with pytest.raises(StateError, match=r"different pending skips \(\[2, 3\] batches\)"):
        one.load_state_dict(arrowstream.merge_state_dicts(states))
    states[1]["pending_skip"] = 2   # the same on every rank: each new rank skips it
    one.load_state_dict(arrowstream.merge_state_dicts(states))
    unskipped, _ = loader_of(folder)
    unskipped.load_state_dict(arrowstream.merge_state_dicts([{k: v for k, v in state.items() if k != "pending_skip"}
                                                             for state in states]))
    assert keys(one) == keys(list(unskipped)[2:])
    same, _ = loader_of(folder, rank=1, world_size=2)   # the same world size: each rank its own
    same.load_state_dict(arrowstream.merge_state_dicts(states))
    assert same.state_dict()["pending_skip"] == 2


def test_skip_past_the_end_of_the_epoch_ends_it_there(folder):
    full = list(loader_of(folder)[0])
    loader, dataset = loader_of(folder)
    batches = iter(loader)
    next(batches)
    loader.skip(batches=100)
    with pytest.warns(UserWarning, match=rf"skip\(batches=100\) reached the end of epoch 0 after {len(full) - 1} batch"):
        assert list(batches) == []
    assert loader.state_dict()["skips"] == [{"epoch": 0, "at_batch": 1, "batches": len(full) - 1,
                                             "rows": rows_of(full[1:])}]
    dataset.set_epoch(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rows_of(loader) == 230   # the rest of the skip does not carry into the next epoch


def test_skip_with_dynamic_assignment(folder):
    unskipped, _ = loader_of(folder, assignment="dynamic")
    batches = iter(unskipped)
    full = [next(batches) for _ in range(7)]
    unskipped_state = json_roundtrip(unskipped.state_dict())
    loader, _ = loader_of(folder, assignment="dynamic")
    loader.skip(batches=4)
    batches = iter(loader)
    got = [next(batches) for _ in range(3)]
    assert keys(got) == keys(full[4:7])
    state = json_roundtrip(loader.state_dict())
    assert state["dynamic"] == unskipped_state["dynamic"]   # the rest of the epoch: the unskipped run's
    resumed, _ = loader_of(folder, assignment="dynamic")
    resumed.load_state_dict(state)
    rest, _ = loader_of(folder, assignment="dynamic")
    rest.load_state_dict(unskipped_state)
    assert keys(resumed) == keys(rest)


@pytest.mark.parametrize("bad,error", [(-1, InvalidArgumentError), (1.5, ArgumentTypeError), ("3", ArgumentTypeError),
                                       (True, ArgumentTypeError), (None, ArgumentTypeError)])
def test_bad_arguments_name_batches(folder, bad, error):
    loader, _ = loader_of(folder)
    with pytest.raises(error, match="batches"):
        loader.skip(batches=bad)
    assert "pending_skip" not in loader.state_dict()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_takes_what_a_state_can_hold_and_the_state_it_writes_loads(folder, num_workers):
    """2**70 was taken, and written into a state its own load_state_dict refused."""
    most = 2**63 - 1
    full = list(loader_of(folder, num_workers)[0])
    loader, _ = loader_of(folder, num_workers)
    batches = iter(loader)
    got = [next(batches) for _ in range(2)]
    before = json_roundtrip(loader.state_dict())
    with pytest.raises(InvalidArgumentError, match=rf"batches: skip\(\) takes at most {most} batch\(es\) \(2\*\*63 - 1 "
                                                   r"in all.*got 1180591620717411303424; .*skip\(batches=len\(loader\)\)"):
        loader.skip(batches=2**70)
    with pytest.raises(InvalidArgumentError, match=r"got <int of 1001 bits>"):
        loader.skip(batches=2**1000)
    loader.skip(batches=2**62)
    with pytest.raises(InvalidArgumentError, match=rf"at most {most - 2**62} batch\(es\) on top of the {2**62} already "
                                                   rf"asked for .*got {2**62}"):
        loader.skip(batches=2**62)   # they add up: the sum is what the state holds
    loader.skip(batches=most - 2**62)   # up to the bound: taken
    state = json_roundtrip(loader.state_dict())
    assert state["pending_skip"] == most
    for saved in (state, arrowstream.merge_state_dicts([state])):
        resumed, _ = loader_of(folder, num_workers)
        resumed.load_state_dict(saved)   # what skip took, the state loads
        with pytest.warns(UserWarning, match=rf"skip\(batches={most}\) reached the end of epoch 0 after "
                                             rf"{len(full) - 2} batch"):
            assert list(resumed) == []
        after = json_roundtrip(resumed.state_dict())
        assert after["skips"] == [{"epoch": 0, "at_batch": 2, "batches": len(full) - 2, "rows": rows_of(full[2:])}]
        loader_of(folder, num_workers)[0].load_state_dict(after)
    with pytest.raises(StateError, match="pending_skip"):   # beyond it, a state is still refused
        loader_of(folder, num_workers)[0].load_state_dict({**state, "pending_skip": most + 1})
    unskipped, _ = loader_of(folder, num_workers)
    unskipped.load_state_dict(before)   # a checkpoint from before the skip knows nothing of it
    assert keys(got + list(unskipped)) == keys(full)


@pytest.mark.parametrize("key,value,named", [
    ("pending_skip", 0, "pending_skip"), ("pending_skip", True, "pending_skip"), ("skips", {}, "skips"),
    ("skips", [{"epoch": 0, "at_batch": 0, "batches": 1}], "skips[0]"),
    ("skips", [{"epoch": 0, "at_batch": -1, "batches": 1, "rows": 10}], "skips[0].at_batch")])
def test_tampered_skips_are_refused(folder, key, value, named):
    loader, _ = loader_of(folder)
    state = {**loader.state_dict(), key: value}
    with pytest.raises(StateError, match=named.replace("[", r"\[")):
        loader.load_state_dict(state)
    with pytest.raises(StateError, match=named.replace("[", r"\[")):
        describe_state(state)
    with pytest.raises(StateError, match=named.replace("[", r"\[")):
        arrowstream.merge_state_dicts([state])


def test_a_mixture_loader_checks_skip_arguments_as_a_datasets(tmp_path):
    """A mixture's loader skips (tests/test_mix_skip.py); its argument is checked as a dataset's skip checks it."""
    pq.write_table(pa.table({"id": list(range(20))}), tmp_path / "a.parquet")
    loader, _ = Mixture.create_dataloader(sources={"a": Source(str(tmp_path))}, batch_size=4, plan_cache=False)
    for bad, error in ((2**70, InvalidArgumentError), (-1, InvalidArgumentError), (1.5, ArgumentTypeError)):
        with pytest.raises(error, match=r"^batches: skip\(\)"):
            loader.skip(batches=bad)
    assert "pending_skip" not in loader.state_dict()


def test_a_skip_pending_in_a_state_at_the_epoch_boundary_is_recorded_in_the_next_epoch(folder):
    """It was recorded as epoch 0, after the whole epoch, with negative rows (the loaded state's counters)."""
    loader, _ = loader_of(folder)
    list(loader)
    loader.skip(batches=2)
    boundary = json_roundtrip(loader.state_dict())
    reference, reference_dataset = loader_of(folder)
    reference_dataset.set_epoch(1)
    next_epoch = list(reference)
    resumed, resumed_dataset = loader_of(folder)
    resumed.load_state_dict(boundary)
    resumed_dataset.set_epoch(1)
    assert keys(resumed) == keys(next_epoch[2:])
    assert resumed.state_dict()["skips"] == [{"epoch": 1, "at_batch": 0, "batches": 2, "rows": rows_of(next_epoch[:2])}]
