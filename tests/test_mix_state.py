"""Tampered mixture checkpoints (#36 item 5): every field of a mixture worker state, a mixture loader state and a
merged mixture checkpoint is checked on load, as a dataset's state is; an edit that would lose or repeat rows (or
fail later in a worker) is a ``StateError`` at load that names the field. ``tests/test_state_fuzz.py`` edits
every field; here are the edits found by hand, each of which loaded before."""

from __future__ import annotations

import copy
import json
from collections import Counter

import pytest
from test_mixing import epoch_batches, loader_of, three  # noqa: F401 (the fixture)

import arrowstream
from arrowstream import errors
from arrowstream._state.versions import STATE_VERSION

OPTIONS = {"shuffle": True, "shuffle_buffer_size": 40, "interleave": 2, "seed": 5}


def _state_after(sources, batches, num_workers=0, **options):
    """The loader state after ``batches`` batches of epoch 0, through JSON."""
    loader, mixture = loader_of(sources, num_workers, **OPTIONS, **options)
    mixture.set_epoch(0)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    return state


@pytest.fixture(scope="module")
def mid(three):  # noqa: F811
    return _state_after(three, 5)


def _worker(state, worker=None):
    inner = state["dataloader"]
    return inner["dataset_state"] if worker is None else \
        inner["_snapshot"]["_worker_snapshots"][f"worker_{worker}"]["dataset_state"]


def _shift_taken(state):
    sources = _worker(state)["sources"]
    sources["big"]["taken"] += 1
    sources["mid"]["taken"] -= 1


def _lanes(state):
    _worker(state)["sources"]["big"]["cursor"]["lanes"][0][1] -= 1


@pytest.mark.parametrize("edit,match", [
    (_lanes, r"sources\.big\.cursor has lanes \[\[0, 47\], \[1, 32\]\] where the stream stands at \[\[0, 48\]"),
    (lambda s: _worker(s)["sources"]["big"].update(cursor=None), r"sources\.big\.cursor is null .* taken=96"),
    (lambda s: _worker(s).update(epoch_complete=True), r"epoch_complete is true with rows=160, batches=5.*rows=500"),
    (lambda s: s["dataloader"]["fetcher_state"].update(fetcher_ended=True),
     r"fetcher_ended is true.*after 5 of its 16 batches"),
    (lambda s: _worker(s)["history"].append([1, {"big": 10, "small": 10, "mid": 480}]),
     r"history changes the quotas from epoch 1 on, after its own epoch 0"),
    (_shift_taken, r"sources\.big\.taken is 97, but after 5 batch\(es\) the slot takes 96"),
    (lambda s: _worker(s)["sources"]["big"]["cursor"].update(window_offset=17),
     r"sources\.big\.cursor has window_offset 17 where the stream stands at 16"),
    (lambda s: _worker(s)["sources"]["big"]["cursor"].update(next_split_index=3),
     r"sources\.big\.cursor has next_split_index 3 where the stream stands at 2"),
], ids=["lanes", "cursor-null", "epoch-complete", "fetcher-ended", "history", "taken-shifted", "window-offset",
        "next-split"])
def test_a_tampered_position_is_refused_naming_the_field(three, mid, edit, match):  # noqa: F811
    """Each loaded before and lost or repeated rows (lanes: 6 missed and 6 repeated; a null cursor: 96 and 96;
    epoch_complete or fetcher_ended: the 340 rows left; the history: epoch 1 with other quotas), or failed in the
    reading with a FileChangedError although no file changed (taken shifted, window_offset, next_split_index)."""
    state = copy.deepcopy(mid)
    edit(state)
    loader, _ = loader_of(three, **OPTIONS)
    with pytest.raises(errors.StateError, match=match):
        loader.load_state_dict(state)


@pytest.mark.timeout(120)
def test_batches_said_to_be_yielded_after_the_snapshots_are_refused(three):  # noqa: F811
    """torchdata would throw away the next chunk of batches (70 rows were missed)."""
    state = _state_after(three, 3, num_workers=2)
    state["dataloader"]["_steps_since_snapshot"] = 1
    loader, _ = loader_of(three, 2, **OPTIONS)
    with pytest.raises(errors.StateError, match=r"_steps_since_snapshot is 1, expected an int from 0 to 0"):
        loader.load_state_dict(state)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("edit,match", [
    (lambda inner: inner["_snapshot"]["_worker_snapshots"].update(worker_0=[]), r"worker_0 is \[\], expected a dict"),
    (lambda inner: inner.update(_snapshot=7), r"_snapshot is 7, expected a dict"),
    (lambda inner: inner["_snapshot"]["_worker_snapshots"]["worker_1"].update(dataset_state=None),
     "holds no state for worker 1"),
], ids=["worker-0-a-list", "snapshot-an-int", "no-worker-state"])
def test_malformed_torchdata_parts_are_a_state_error(three, edit, match):  # noqa: F811
    """They raised a raw AttributeError or TypeError (a worker without a state started its epoch afresh)."""
    state = _state_after(three, 3, num_workers=2)
    edit(state["dataloader"])
    loader, _ = loader_of(three, 2, **OPTIONS)
    with pytest.raises(errors.StateError, match=match):
        loader.load_state_dict(state)


@pytest.mark.timeout(120)
def test_a_rank_said_to_be_done_in_a_merged_checkpoint_is_refused(three):  # noqa: F811
    """Re-planned for one rank, the rows rank 1 had left were never read."""
    states = []
    for rank in range(2):
        loader, mixture = loader_of(three, rank=rank, world_size=2, plan_locally=True, **OPTIONS)
        mixture.set_epoch(0)
        it = iter(loader)
        for _ in range(2):
            next(it)
        states.append(loader.state_dict())
        del it
    merged = json.loads(json.dumps(arrowstream.merge_state_dicts(states)))
    merged["ranks"][1]["dataloader"]["dataset_state"]["epoch_complete"] = True
    loader, _ = loader_of(three, **OPTIONS)
    with pytest.raises(errors.StateError, match=r"rank 1 worker 0's epoch_complete is true with rows=64, batches=2"):
        loader.load_state_dict(merged)


@pytest.mark.timeout(180)
def test_lagging_snapshots_inside_an_epoch_are_refused_on_another_topology(three):  # noqa: F811
    """With snapshot_every_n_steps > 1, the workers' snapshots stand before the batches yielded since; the re-plan
    for another topology starts from the snapshots and yielded those batches again (128 rows repeated)."""
    state = _state_after(three, 4, num_workers=2, snapshot_every_n_steps=5)
    assert state["dataloader"]["_steps_since_snapshot"] == 4
    other, _ = loader_of(three, 1, **OPTIONS, snapshot_every_n_steps=5)
    with pytest.raises(errors.StateMismatchError, match=r"4 batch\(es\) after its workers' last snapshots.*resume "
                                                        r"with world_size=1, num_workers=2"):
        other.load_state_dict(state)
    same, mixture = loader_of(three, 2, **OPTIONS, snapshot_every_n_steps=5)   # the same topology replays them
    same.load_state_dict(state)
    reference, reference_mixture = loader_of(three, 2, **OPTIONS, snapshot_every_n_steps=5)
    whole = epoch_batches(reference, reference_mixture, 0)
    mixture.set_epoch(0)
    assert [(list(b["src"]), b["id"].tolist()) for b in same] == whole[4:]


@pytest.mark.timeout(180)
def test_a_checkpoint_taken_between_a_boundary_load_and_the_next_epoch_goes_on_with_that_epoch(three):  # noqa: F811
    """A loader that loaded an epoch-boundary checkpoint of another topology said, until its next epoch began, that
    it stood at the start of the saved epoch (which a resume then read again), with a history of the next."""
    loader, mixture = loader_of(three, **OPTIONS)
    epoch_batches(loader, mixture, 0)
    boundary = json.loads(json.dumps(loader.state_dict()))
    moved, _ = loader_of(three, 2, **OPTIONS)
    moved.load_state_dict(boundary)
    state = json.loads(json.dumps(moved.state_dict()))
    resumed, resumed_mixture = loader_of(three, 2, **OPTIONS)
    resumed.load_state_dict(state)
    reference, reference_mixture = loader_of(three, 2, **OPTIONS)
    rows = Counter(i for _, ids in epoch_batches(resumed, resumed_mixture, 1) for i in ids)
    assert rows == Counter(i for _, ids in epoch_batches(reference, reference_mixture, 1) for i in ids)


def test_a_worker_state_loaded_into_the_mixture_itself_is_checked_against_its_data_and_quotas(three, mid, tmp_path):  # noqa: F811
    """The path of a plain StatefulDataLoader (each worker loads its state into the mixture): a state taken on other
    data, or inside an epoch of other quotas, loaded and read the mixture's own rows from its cursors."""
    import shutil

    worker = _worker(mid)
    _, mixture = loader_of(three, **OPTIONS)
    mixture.load_state_dict(copy.deepcopy(worker))   # (the same mixture: it loads)
    copied = {}
    for name, source in three.items():   # the same files, copied: other modification times
        shutil.copytree(source.path, tmp_path / name, copy_function=shutil.copy)
        copied[name] = arrowstream.Source(str(tmp_path / name))
    _, other_data = loader_of(copied, **OPTIONS)
    with pytest.raises(errors.StateMismatchError, match="source 'big'"):
        other_data.load_state_dict(copy.deepcopy(worker))
    _, other_quotas = loader_of(three, **OPTIONS, weights={"big": 0.5, "small": 0.2, "mid": 0.3})
    with pytest.raises(errors.StateMismatchError, match=r"inside mixture epoch 0.*big: quota 300.*big: quota 250"):
        other_quotas.load_state_dict(copy.deepcopy(worker))


@pytest.mark.timeout(120)
def test_a_rank_inside_an_earlier_epoch_than_another_is_refused(three):  # noqa: F811
    """Re-planned for one rank, a rank still inside epoch 0 while the other was in epoch 1 counted as done with it:
    the rows it had left of epoch 0 were never read."""
    states = []
    for rank, epoch in enumerate((1, 0)):
        loader, mixture = loader_of(three, rank=rank, world_size=2, plan_locally=True, **OPTIONS)
        for current in range(epoch + 1):
            mixture.set_epoch(current)
            it = iter(loader)
            for _ in range(2 if current == epoch else len(loader)):
                next(it)
        states.append(loader.state_dict())
        del it
    merged = json.loads(json.dumps(arrowstream.merge_state_dicts(states)))
    loader, _ = loader_of(three, **OPTIONS)
    with pytest.raises(errors.StateError, match=r"rank 1 worker 0 is inside mixture epoch 0, another worker in epoch 1"):
        loader.load_state_dict(merged)


@pytest.mark.parametrize("edit,error,match", [
    (lambda s: s.update(reads="Mixture"), errors.StateError,
     r"loader state\.reads is 'Mixture', expected what the loader that wrote it reads: 'dataset' or 'mixture'"),
    (lambda s: s.pop("reads"), errors.StateError, r"loader state has no 'reads' field"),
    (lambda s: s.update(reads=None), errors.StateError, r"loader state\.reads is None"),
    (lambda s: s.update(dynamic={"epoch": 0}), errors.StateError, r"reads a mixture and holds a dynamic ledger"),
    (lambda s: s.update(kind="arrowstream.mixture_loader"), errors.StateVersionError,
     rf"'arrowstream.mixture_loader' has version {STATE_VERSION}, but a mixture's loader wrote that kind as version 1"),
], ids=["reads-other", "reads-missing", "reads-null", "dynamic", "retired-kind"])
def test_a_tampered_envelope_is_refused_naming_the_field(three, mid, edit, error, match):  # noqa: F811
    """The envelope of a mixture's state is the dataset's (v11): what it reads is checked, and a dynamic ledger
    (which only a dataset's loader writes) or the retired kind at this version is refused."""
    state = copy.deepcopy(mid)
    assert (state["kind"], state["reads"]) == ("arrowstream.loader", "mixture")
    edit(state)
    loader, _ = loader_of(three, **OPTIONS)
    with pytest.raises(error, match=match):
        loader.load_state_dict(state)
    loader.load_state_dict(copy.deepcopy(mid))   # refused, it was left as it was
