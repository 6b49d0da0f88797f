"""A dynamic checkpoint (``assignment="dynamic"``) through the loader: the epoch it resumes (issue #36,
item 3: a state of epoch e is refused for another epoch unless it is at e's end) and its ledger checked
against the plan (item 5: a ledger that would lose or repeat rows is a ``StateError`` at load)."""

from __future__ import annotations

import json

import pytest
from helpers import ids_of, write_dataset

from arrowstream import RepeatedEpochWarning, StructuredDataset, errors

DYNAMIC = {"assignment": "dynamic", "plan_cache": False, "batch_size": 64, "shuffle": True, "seed": 1,
           "shuffle_buffer_size": 100, "interleave": 2}
TOTAL = 1000


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    """1,000 rows (ids 0..999) in two Parquet files of row groups of 100 and 80 rows."""
    return write_dataset(tmp_path_factory.mktemp("dynamic-state"), [(600, 100), (400, 80)])


def make(path, num_workers, **kwargs):
    return StructuredDataset.create_dataloader(path, num_workers=num_workers, **{**DYNAMIC, **kwargs})


def read(loader, stop=None):
    """The ids of the loader's next iteration (its first ``stop`` batches)."""
    ids = []
    for step, batch in enumerate(loader):
        ids += ids_of(batch)
        if stop is not None and step + 1 == stop:
            break
    return ids


def state_after(path, num_workers, batches=None, epoch=0, **kwargs):
    """The ids of ``epoch`` yielded before a checkpoint taken after ``batches`` batches (None: after the
    loop), and the checkpoint through JSON."""
    loader, dataset = make(path, num_workers, **kwargs)
    dataset.set_epoch(epoch)
    seen = read(loader, batches)
    return seen, json.loads(json.dumps(loader.state_dict()))


# -- the epoch a dynamic checkpoint resumes ---------------------------------------------------------


@pytest.mark.parametrize("old,new", [(0, 0), (1, 1), (2, 2), (2, 3), (3, 0)])
def test_a_mid_epoch_state_is_refused_for_another_epoch_and_then_finishes_its_own(path, old, new):
    """Loaded, then set_epoch(1): the 808 rows left in epoch 0 would never be read. Refused as static
    assignment refuses it, with the remedy; following it reads the rest of epoch 0, then epoch 1 whole."""
    seen, state = state_after(path, old, 3)
    assert len(seen) == 3 * 64
    loader, dataset = make(path, new)
    loader.load_state_dict(state)
    for epoch in (1, 2):
        dataset.set_epoch(epoch)
        with pytest.raises(errors.StateMismatchError, match=r"epoch 0 \(mid-epoch, 808 row\(s\) .* set to epoch "
                                                            rf"{epoch}; call dataset.set_epoch\(0\)"):
            read(loader)
    assert json.loads(json.dumps(loader.state_dict()))["dynamic"] == state["dynamic"], "still the loaded rest"
    dataset.set_epoch(0)
    rest = read(loader)
    assert len(rest) == TOTAL - len(seen) and sorted(seen + rest) == list(range(TOTAL))
    dataset.set_epoch(1)
    assert sorted(read(loader)) == list(range(TOTAL))


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_a_state_at_the_epochs_end_goes_on_to_the_next_epoch_whole(path, num_workers):
    seen, state = state_after(path, num_workers)
    assert sorted(seen) == list(range(TOTAL))
    loader, dataset = make(path, num_workers)
    loader.load_state_dict(state)
    dataset.set_epoch(1)
    assert sorted(read(loader)) == list(range(TOTAL))
    # the canonical loop from the saved epoch: nothing left of it, then the next one whole
    loader, dataset = make(path, num_workers)
    loader.load_state_dict(state)
    dataset.set_epoch(0)
    assert read(loader) == []
    dataset.set_epoch(1)
    assert sorted(read(loader)) == list(range(TOTAL))
    # an earlier epoch is refused, as static assignment refuses it
    loader, dataset = make(path, num_workers)
    loader.load_state_dict(state_after(path, 0, epoch=2)[1])
    dataset.set_epoch(1)
    with pytest.raises(errors.StateMismatchError, match=r"epoch 2 \(complete\) .* set to epoch 1"):
        read(loader)


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
def test_the_loaded_rest_is_read_once_and_the_next_iteration_reads_the_epoch_whole(path, num_workers, persistent):
    """A second iteration of the loaded epoch is a new pass over it, as with static assignment: it read
    the loaded rest again (808 rows, the 192 rows yielded before the checkpoint never)."""
    kwargs = {"persistent_workers": True} if persistent else {}
    seen, state = state_after(path, num_workers, 3, **kwargs)
    loader, _dataset = make(path, num_workers, **kwargs)
    loader.load_state_dict(state)
    assert sorted(seen + read(loader)) == list(range(TOTAL))
    with pytest.warns(RepeatedEpochWarning):   # epoch 0 again, on purpose
        assert sorted(read(loader)) == list(range(TOTAL))
    # a checkpoint of that second pass resumes it, not the loaded rest
    loader.load_state_dict(state)
    read(loader)
    again = read(loader, 2)
    resumed, _ = make(path, 0)
    resumed.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    assert sorted(again + read(resumed)) == list(range(TOTAL))


def test_an_iteration_that_state_dict_started_follows_a_later_set_epoch(path):
    """state_dict() before iterating starts the iteration (torchdata's); a set_epoch after it is the epoch
    read, not the one the iteration was started for (it read epoch 0's order for epoch 5)."""
    loader, dataset = make(path, 0)
    loader.state_dict()
    dataset.set_epoch(5)
    wanted, wanted_dataset = make(path, 0)
    wanted_dataset.set_epoch(5)
    assert read(loader) == read(wanted)
    # and a loaded checkpoint: started for the wrong epoch by state_dict(), refused, then read in its own
    seen, state = state_after(path, 2, 3)
    loader, dataset = make(path, 2)
    loader.load_state_dict(state)
    dataset.set_epoch(3)
    assert loader.state_dict()["dynamic"]["epoch"] == 0
    with pytest.raises(errors.StateMismatchError, match="set_epoch"):
        read(loader)
    dataset.set_epoch(0)
    assert sorted(seen + read(loader)) == list(range(TOTAL))
