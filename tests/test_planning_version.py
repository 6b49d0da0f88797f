"""The planning version in the state: a checkpoint keeps the layout it was taken in (issue #19, point 3).

Version 2 cuts units so that every slot has its share of rows; states of version 5 and before were
taken on version 1's cuts and keep them, in the saved epoch, the later ones and an elastic re-plan.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import pytest
from helpers import assert_replanned_continuation, ids_of, make_loader, write_dataset

from arrowstream._core.plan_types import PLANNING_VERSION
from arrowstream._loader.torchdata_state import worker_state
from arrowstream._state.versions import STATE_VERSION
from arrowstream.errors import StateError, StateMismatchError, StateVersionError

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
sys.path.insert(0, GOLDEN)

from make_golden import prepare_copy


def _epoch(loader, dataset, epoch):
    dataset.set_epoch(epoch)
    return [ids_of(batch) for batch in loader]


@pytest.fixture(scope="module")
def cut(tmp_path_factory):
    """One file of two row groups (400 rows): 3 workers cut them into ranges."""
    return write_dataset(tmp_path_factory.mktemp("cut") / "d", [(400, 200)])


def _v6_state(folder, steps=2, **options):
    loader, dataset = make_loader(folder, 3, batch_size=16, shuffle=True, seed=3, **options)
    dataset.set_epoch(0)
    for step, _ in enumerate(loader):
        if step + 1 == steps:
            break
    return json.loads(json.dumps(loader.state_dict()))


def test_a_fresh_dataset_plans_with_the_current_version_and_says_so(cut):
    loader, dataset = make_loader(cut, 3, batch_size=16)
    assert dataset._options.planning == PLANNING_VERSION == 2
    assert sorted(dataset.slot_rows(3)) == [133, 133, 134]
    state = loader.state_dict()
    assert worker_state(state["dataloader"], 0)["options"]["planning"] == 2


def test_a_mid_epoch_checkpoint_of_a_cut_plan_resumes_every_row_once(cut):
    loader, dataset = make_loader(cut, 3, batch_size=16, shuffle=True, seed=3)
    first, second = _epoch(loader, dataset, 0), _epoch(loader, dataset, 1)
    assert sorted(i for batch in first for i in batch) == list(range(400))
    for steps in (1, 7):
        resumed_loader, resumed = make_loader(cut, 3, batch_size=16, shuffle=True, seed=3)
        resumed_loader.load_state_dict(_v6_state(cut, steps))
        assert first[:steps] + _epoch(resumed_loader, resumed, 0) == first
        assert _epoch(resumed_loader, resumed, 1) == second


@pytest.mark.parametrize("planning, error", [(3, StateVersionError), (0, StateVersionError), ("2", StateError),
                                             (True, StateError), (None, StateError), ("missing", StateError)])
def test_a_state_claiming_another_planning_version_is_refused(cut, planning, error):
    state = _v6_state(cut)
    worker = worker_state(state["dataloader"], 1)
    if planning == "missing":
        del worker["options"]["planning"]
    else:
        worker["options"]["planning"] = planning
    loader, dataset = make_loader(cut, 3, batch_size=16, shuffle=True, seed=3)
    with pytest.raises(error, match=r"worker 1 state.*options\.planning|options\.planning"):
        loader.load_state_dict(state)
    with pytest.raises(error, match="planning"):
        dataset.load_state_dict(worker)
    assert dataset._options.planning == PLANNING_VERSION


def test_workers_of_one_checkpoint_on_other_planning_versions_are_refused_and_nothing_changes(cut):
    state = _v6_state(cut)
    first = worker_state(state["dataloader"], 0)
    first["options"]["planning"] = 1   # worker 0 says version 1, the others 2: not one job's checkpoint
    loader, dataset = make_loader(cut, 3, batch_size=16, shuffle=True, seed=3)
    before = dataset.slot_rows(3)
    with pytest.raises(StateMismatchError, match="planning version 2, this dataset cuts them by version 1") as refused:
        loader.load_state_dict(state)
    # the user loaded the whole checkpoint already: the message says its states disagree, not to load it whole
    assert FOLLOWED in str(refused.value) and "load the whole checkpoint" not in str(refused.value)
    assert dataset._options.planning == PLANNING_VERSION and dataset.slot_rows(3) == before
    assert sorted(i for batch in _epoch(loader, dataset, 0) for i in batch) == list(range(400))


FOLLOWED = ("as the checkpoint's first state says (loading a checkpoint makes the dataset plan as it did): its states "
            "disagree, so they are not one run's checkpoint; pass the dict returned by loader.state_dict() (or "
            "gather_state_dict, merge_state_dicts) unchanged")


def test_a_worker_state_checked_alone_against_another_planning_version_says_to_load_the_whole_checkpoint(cut):
    """``dataset.check_state`` checks a state without loading it, so the dataset plans by its own version: the way
    out is to load the checkpoint, which follows its version."""
    worker = worker_state(_v6_state(cut)["dataloader"], 1)
    worker["options"]["planning"] = 1
    _, dataset = make_loader(cut, 3, batch_size=16, shuffle=True, seed=3)
    with pytest.raises(StateMismatchError) as refused:
        dataset.check_state(worker)
    assert str(refused.value) == (
        "checkpoint's splits were cut by planning version 1, this dataset cuts them by version 2; load the whole "
        "checkpoint with loader.load_state_dict() (or dataset.load_state_dict()), which makes the dataset plan as "
        "the checkpoint did, and keep its workers' states together")
    assert dataset.options.planning == PLANNING_VERSION


def _golden(name):
    with open(os.path.join(GOLDEN, "v5", f"{name}.json")) as f:
        return json.load(f)


def test_a_v5_state_of_a_cut_plan_keeps_the_old_ranges_for_the_rest_of_the_job(tmp_path):
    golden = _golden("cut-rank0of3-workers2-shuffle-mid")
    path = prepare_copy(str(tmp_path / "data"), golden["data"])
    loader, dataset = make_loader(path, golden["num_workers"], **golden["options"])
    assert sorted(dataset.slot_rows(2)) == [13, 13, 13, 13, 14, 14]             # version 2, fresh
    loader.load_state_dict(copy.deepcopy(golden["state"]))
    assert dataset._options.planning == 1
    assert sorted(dataset.slot_rows(2)) == [10, 10, 10, 10, 20, 20]             # version 1, as saved
    assert _epoch(loader, dataset, 0) + _epoch(loader, dataset, 1) == golden["continuation_ids"]
    state = loader.state_dict()   # the checkpoints of the resumed job say version 1 too
    assert worker_state(state["dataloader"], 0)["options"]["planning"] == 1
    assert state["version"] == STATE_VERSION   # written in the current format


def test_an_elastic_resume_of_a_v5_checkpoint_replans_from_the_old_ranges(tmp_path):
    golden = _golden("cut-elastic-rank0of1-workers2-from-3x2-mid")
    path = prepare_copy(str(tmp_path / "data"), golden["data"])
    loader, dataset = make_loader(path, golden["num_workers"], **golden["options"])
    loader.load_state_dict(copy.deepcopy(golden["state"]))
    assert dataset._options.planning == 1
    resumed = _epoch(loader, dataset, 0)
    assert_replanned_continuation(golden, [resumed, _epoch(loader, dataset, 1)])   # re-planned with the even cut
    ids = [i for batch in resumed for i in batch]
    assert len(ids) == len(set(ids)) > 0


# -- assignment="dynamic": the ledger's planning version, followed as a static state's is -------------------

DYNAMIC = {"batch_size": 128, "shuffle": True, "seed": 3, "assignment": "dynamic", "even_batches": False,
           "plan_locally": True}


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory):
    """4,000 rows in two row groups: over 3 ranks, version 1 gives 2,000/1,000/1,000 rows, version 2 1,333 or 1,334."""
    return write_dataset(tmp_path_factory.mktemp("two_groups") / "d", [(4000, 2000)])


def _dynamic_v1_checkpoint(folder, world_size=3, steps=2):
    """Every rank's ledger after ``steps`` batches of epoch 0, taken on planning version 1 (as a job that
    resumed from a version-5 state plans); the ids read before it."""
    from arrowstream import merge_state_dicts

    before, states = [], []
    for rank in range(world_size):
        loader, dataset = make_loader(folder, 0, rank=rank, world_size=world_size, **DYNAMIC)
        dataset.use_planning(1)
        dataset.set_epoch(0)
        for step, batch in enumerate(loader):
            before += ids_of(batch)
            if step + 1 == steps:
                break
        states.append(json.loads(json.dumps(loader.state_dict())))
    assert {state["dynamic"]["options"]["planning"] for state in states} == {1}
    return before, merge_state_dicts(states)


@pytest.mark.parametrize("new_world_size", [3, 2])   # the same world size, and the rest re-planned for another
def test_a_dynamic_checkpoint_of_another_planning_version_resumes_on_its_cuts(two_groups, new_world_size):
    """A ledger names splits cut by its planning version: the dataset cuts as the checkpoint did (as a static
    state makes it), and the rest of the epoch is read once, on any world size."""
    before, merged = _dynamic_v1_checkpoint(two_groups)
    after = []
    for rank in range(new_world_size):
        loader, dataset = make_loader(two_groups, 0, rank=rank, world_size=new_world_size, **DYNAMIC)
        assert dataset.options.planning == PLANNING_VERSION
        loader.load_state_dict(copy.deepcopy(merged))
        assert dataset.options.planning == 1
        after += [i for batch in loader for i in ids_of(batch)]
        assert loader.state_dict()["dynamic"]["options"]["planning"] == 1   # the resumed job's checkpoints too
    assert sorted(before + after) == list(range(4000))


def test_a_dynamic_checkpoint_of_an_unknown_planning_version_is_refused_and_nothing_changes(two_groups):
    _, merged = _dynamic_v1_checkpoint(two_groups)
    for outer in merged["ranks"]:
        outer["dynamic"]["options"]["planning"] = 3
    loader, dataset = make_loader(two_groups, 0, rank=0, world_size=3, **DYNAMIC)
    before = dataset.slot_rows()
    with pytest.raises(StateVersionError, match=r"dynamic\.options\.planning is 3"):
        loader.load_state_dict(merged)
    assert dataset.options.planning == PLANNING_VERSION and dataset.slot_rows() == before


def test_dynamic_ranks_of_other_planning_versions_are_refused_naming_both(two_groups):
    """Rank 0's ledger says version 1, rank 1's version 2: not one job's checkpoint. The dataset follows rank 0
    and refuses rank 1 (saved vs current), and is left as it was."""
    _, merged = _dynamic_v1_checkpoint(two_groups)
    merged["ranks"][1]["dynamic"]["options"]["planning"] = 2
    loader, dataset = make_loader(two_groups, 0, rank=0, world_size=2, **DYNAMIC)   # re-planned: every rank checked
    with pytest.raises(StateMismatchError, match="planning version 2, this dataset cuts them by version 1") as refused:
        loader.load_state_dict(merged)
    assert FOLLOWED in str(refused.value) and "load the whole checkpoint" not in str(refused.value)
    assert dataset.options.planning == PLANNING_VERSION
    dataset.set_epoch(0)
    assert len([i for batch in loader for i in ids_of(batch)]) == 2000   # its own fresh epoch, whole
