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


# -- the ledger checked against the plan --------------------------------------------------------------


def positions_of(dataset, epoch, ids):
    """The positions of rows ``ids`` among the rank's rows of ``epoch`` (ids run on across the two files)."""
    from arrowstream._core.plan_types import Split

    splits = [Split(0, 0, 6, i, 1, 0) if i < 600 else Split(1, 0, 5, i - 600, 1, 0) for i in ids]
    placed = dataset.policy.epochs.rank(epoch).rows.place(splits)
    assert (placed >= 0).all()
    return placed.tolist()


@pytest.mark.parametrize("num_workers,batches,resumed", [(0, 3, False), (2, 7, False), (3, 5, False), (2, 4, True)])
def test_the_ledger_counts_the_rows_yielded_and_the_sums_of_their_positions(path, num_workers, batches, resumed):
    """``yielded`` is what the trainer received before the checkpoint, across a resume too: as many rows,
    and the sums of their positions and squares (which rows a replay's window hands out included)."""
    from arrowstream._state.ledger_rows import POSITION_SUM_MODULUS

    seen, state = state_after(path, num_workers, batches)
    loader, dataset = make(path, num_workers if not resumed else 0)
    if resumed:   # a checkpoint inside an epoch resumed from another (replays of the old workers' windows)
        loader.load_state_dict(state)
        seen += read(loader, 3)
        state = json.loads(json.dumps(loader.state_dict()))
    positions = positions_of(dataset, 0, seen)
    assert state["dynamic"]["yielded"] == {
        "rows": len(seen), "position_sum": sum(positions) % POSITION_SUM_MODULUS,
        "position_square_sum": sum(p * p for p in positions) % POSITION_SUM_MODULUS}
    assert not resumed or state["dynamic"]["replays"], "the case has replays"


def _edit_slot_worker(ledger):
    slot = ledger["replays"][0]["slot"]
    slot[1], slot[3] = 2, 1 - slot[3] if slot[1] == 2 else 1   # another worker of the rank: another window order


def _edit_split_start(ledger):
    split = next(s for s in ledger["splits"] if s[3] > 0)
    split[3] -= 1   # one row earlier: a row yielded again, the split's last one lost


# one-field edits of a ledger (0 workers, 3 batches of 64 with a window of 100: a replay of 8 rows and two
# splits) and of a resumed one (the replays of 2 workers' windows); each loaded before, losing or repeating rows.
# The message of the first is matched; the second's depends on what the workers had taken (timing): one of
WHAT_IS_WRONG = ("leaves some rows twice|would (lose|repeat)|had not leased|does not read|name other rows|"
                 "shuffle window of|world_size=2|no 'yielded' field")
EDITS = {
    "splits.pop(0)": (lambda d: d["splits"].pop(0), "yielded.rows counts .* would lose"),
    "replays.pop(0)": (lambda d: d["replays"].pop(0), "yielded.rows counts .* would lose"),
    "a replay duplicated": (lambda d: d["replays"].append(json.loads(json.dumps(d["replays"][0]))),
                            "would repeat"),
    "replay rows -= 1": (lambda d: d["replays"][0].update(rows=d["replays"][0]["rows"] - 1), "would lose 1 row"),
    "epoch = 1": (lambda d: d.update(epoch=1), "leaves some rows twice|epoch 1, .* name other rows"),
    "another worker's slot": (_edit_slot_worker, "name other rows"),
    "window_index + 1": (lambda d: d["replays"][0]["start"].update(window_index=d["replays"][0]["start"]["window_index"]
                                                                   + 1), "name other rows"),
    "the other lane's turn": (lambda d: d["replays"][0]["start"].update(turn_index=1 - d["replays"][0]["start"][
        "turn_index"]), "name other rows"),
    "window_offset + 1": (lambda d: d["replays"][0]["start"].update(
        window_offset=d["replays"][0]["start"]["window_offset"] + 1), "shuffle window of|name other rows"),
    "a split one row earlier": (_edit_split_start, "leaves some rows twice|name other rows"),
    "fresh_from_row - 1": (lambda d: d.update(fresh_from_row=d["fresh_from_row"] - 1), "leaves some rows twice"),
    "yielded.rows + 1": (lambda d: d["yielded"].update(rows=d["yielded"]["rows"] + 1), "would repeat 1 row"),
    "yielded.position_sum + 1": (lambda d: d["yielded"].update(position_sum=d["yielded"]["position_sum"] + 1),
                                 "name other rows"),
    "a replay of another rank": (lambda d: d["replays"][0]["slot"].__setitem__(0, 2), r"rank 0 of world_size=2"),
    "yielded deleted": (lambda d: d.pop("yielded"), "has no 'yielded' field"),
}


@pytest.fixture(scope="module")
def ledgers(path):
    """A ledger of one process, and one of a resumed epoch, with the ids yielded before each."""
    seen, state = state_after(path, 0, 3)
    old_seen, old = state_after(path, 2, 6)
    loader, _ = make(path, 0)
    loader.load_state_dict(old)
    old_seen += read(loader, 2)
    resumed = json.loads(json.dumps(loader.state_dict()))
    assert state["dynamic"]["replays"] and state["dynamic"]["splits"] and resumed["dynamic"]["replays"]
    return {"one process": (seen, state), "resumed": (old_seen, resumed)}


@pytest.mark.parametrize("which", ["one process", "resumed"])
@pytest.mark.parametrize("name", list(EDITS))
def test_a_tampered_ledger_is_a_state_error_naming_what_is_wrong(path, ledgers, which, name):
    edit, match = EDITS[name]
    seen, state = ledgers[which]
    loader, _ = make(path, 0)
    loader.load_state_dict(json.loads(json.dumps(state)))   # untouched, it resumes exactly
    assert sorted(seen + read(loader)) == list(range(TOTAL))
    tampered = json.loads(json.dumps(state))
    edit(tampered["dynamic"])
    loader, _ = make(path, 0)
    with pytest.raises(errors.StateError, match=match if which == "one process" else WHAT_IS_WRONG) as raised:
        loader.load_state_dict(tampered)
    assert "pass the dict returned by loader.state_dict()" in str(raised.value)


def test_a_state_whose_ledger_was_removed_is_refused(path):
    """Without its ledger a dynamic loader state looked like a static one, and the dynamic dataset read
    the epoch whole (the rows yielded before the checkpoint again)."""
    _, state = state_after(path, 0, 3)
    del state["dynamic"]
    loader, _ = make(path, 0)
    with pytest.raises(errors.StateError, match="no 'dynamic' ledger"):
        loader.load_state_dict(state)


def test_a_ledger_of_version_8_loads_without_a_count(path):
    """A v8 ledger has no ``yielded``: migrated to ``None``, its rows are checked against the plan only."""
    seen, state = state_after(path, 2, 5)
    state["version"] = 8
    del state["dynamic"]["yielded"]
    loader, _ = make(path, 0)
    loader.load_state_dict(state)
    assert sorted(seen + read(loader)) == list(range(TOTAL))


# -- the ledger's arithmetic ----------------------------------------------------------------------------


def test_a_part_of_a_permutation_is_its_places_values():
    import numpy as np

    from arrowstream._core.hashing import permutation, permutation_part

    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100, 1000):
        for _ in range(20):
            seed = int(rng.integers(0, 2**63))
            start = int(rng.integers(0, n))
            stop = int(rng.integers(start, n + 1))
            assert permutation_part(n, seed, start, stop).tolist() == sorted(permutation(n, seed)[start:stop])


def test_one_lanes_positions_in_arithmetic_are_those_interleave_reads():
    """``interleave=1``: a window's rows are counted without reading them through the rotation."""
    import numpy as np

    from arrowstream._core.cursor import Cursor
    from arrowstream._core.plan_types import Split
    from arrowstream._state.ledger_rows import _rotation_positions, _serial_positions

    rng = np.random.default_rng(1)
    for _ in range(200):
        lengths = rng.integers(1, 30, size=int(rng.integers(1, 6)))
        splits = [Split(0, i, i + 1, 0, int(n), 0) for i, n in enumerate(lengths)]
        firsts = rng.permutation(np.concatenate([[0], np.cumsum(lengths)[:-1]])) * 7
        position = int(rng.integers(0, len(splits) + 1))   # a lane may stand past the splits
        offset = int(rng.integers(0, lengths[position] + 1)) if position < len(splits) else 0
        start = Cursor(((position, offset),), position + 1)
        limit = int(rng.integers(1, 80))
        wanted = _rotation_positions(start, splits, firsts, limit, 1, None)
        assert _serial_positions(start, firsts, lengths, limit).tolist() == wanted.tolist()
