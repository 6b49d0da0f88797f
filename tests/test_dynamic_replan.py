"""Dynamic assignment re-plans the rest of an epoch for another world size (issue #38 part H).

Ranks are explicit ``rank``/``world_size`` loaders in this process, their states merged. Every old rank's
ledger leaves rows; loaded on another world size, those rows are one sequence cut into equal stretches, one
per new rank, each leased to its workers. Each case counts the ids read before and after: every row of the
epoch once, none twice, ``len(loader)`` exact and equal on every rank; a checkpoint taken inside the re-planned
epoch resumes on the same world size with other workers and on another world size again; the next epoch is
whole, as a fresh loader reads it.
"""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import ids_of, json_roundtrip, make_loader

import arrowstream
from arrowstream import TrimWarning
from arrowstream.errors import StateError, StateMismatchError

ROWS, FILES, BATCH = 4000, 10, 32
OPTIONS = {"batch_size": BATCH, "shuffle": True, "seed": 3, "shuffle_buffer_size": 150, "assignment": "dynamic",
           "batches_per_transfer": 1}


@pytest.fixture(scope="module")
def ten(tmp_path_factory):
    """10 files of 400 rows (row groups of 100), ids 0..3999."""
    folder = tmp_path_factory.mktemp("ten")
    per = ROWS // FILES
    for index in range(FILES):
        ids = np.arange(index * per, (index + 1) * per, dtype=np.int64)
        pq.write_table(pa.table({"id": ids}), folder / f"part-{index:02d}.parquet", row_group_size=100)
    return str(folder)


def _loaders(path, world_size, num_workers, state=None, **extra):
    out = []
    for rank in range(world_size):
        loader, dataset = make_loader(path, num_workers, rank=rank, world_size=world_size, **{**OPTIONS, **extra})
        if state is not None:
            loader.load_state_dict(state)
        dataset.set_epoch(0)
        out.append((loader, dataset))
    return out


def _read(loaders, steps=None):
    """Every rank's next ``steps`` batches of the epoch (None: all): the ids, len(loader) and batches per rank,
    and the merged checkpoint after them."""
    ids, counts, states = [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrimWarning)   # a re-plan trims at most one batch per rank
        for loader, _ in loaders:
            expected = len(loader)
            got = 0
            for batch in loader:
                ids += ids_of(batch)
                got += 1
                if got == steps:
                    break
            counts.append((expected, got))
            states.append(loader.state_dict())
    merged = json_roundtrip(arrowstream.merge_state_dicts(states) if len(states) > 1 else states[0])
    return ids, counts, merged


def _trimmed(loaders, num_workers):
    return sum(d.rows_trimmed_per_epoch(num_workers) + d.rows_dropped_per_epoch(num_workers) for _, d in loaders)


def _assert_once(ids, left_out=0):
    counts = Counter(ids)
    assert max(counts.values()) == 1, "a row came twice"
    assert len(counts) + left_out == ROWS, "rows were lost beyond what even_batches counts"


CASES = [((1, 0), (2, 2), 40), ((2, 2), (1, 0), 20), ((2, 0), (3, 0), 9), ((2, 1), (3, 2), 55), ((1, 2), (2, 0), 118)]


@pytest.mark.parametrize(("old", "new", "steps"), CASES,
                         ids=[f"{o[0]}x{o[1]}-to-{n[0]}x{n[1]}-after-{s}" for o, n, s in CASES])
@pytest.mark.filterwarnings("ignore::arrowstream.TrimWarning")   # epoch 1: 10 files over 3 ranks, planned
def test_the_rest_of_an_epoch_is_replanned_for_another_world_size(ten, old, new, steps):
    before, _, state = _read(_loaders(ten, *old), steps)
    assert state["dynamic" if old[0] == 1 else "ranks"]
    resumed = _loaders(ten, *new, state=state)
    after, counts, _ = _read(resumed)
    trimmed = _trimmed(resumed, new[1])
    assert trimmed <= new[0] * BATCH, "even_batches trimmed more than a batch per rank"
    _assert_once(before + after, trimmed)
    assert all(expected == got for expected, got in counts), f"len(loader) is not what a rank yields: {counts}"
    assert len({got for _, got in counts}) == 1, "the ranks yield different numbers of batches"
    # the next epoch is whole: each rank reads what a fresh loader of this topology reads
    for (loader, dataset), (fresh, fresh_dataset) in zip(resumed, _loaders(ten, *new), strict=True):
        dataset.set_epoch(1)
        fresh_dataset.set_epoch(1)
        assert sorted(i for b in loader for i in ids_of(b)) == sorted(i for b in fresh for i in ids_of(b))


CHAINS = [((2, 0), (3, 1), (3, 2)), ((1, 2), (2, 0), (1, 0)), ((2, 1), (1, 0), (2, 0)), ((2, 0), (3, 0), (2, 2))]


@pytest.mark.parametrize(("old", "middle", "new"), CHAINS,
                         ids=[f"{o[0]}x{o[1]}-{m[0]}x{m[1]}-{n[0]}x{n[1]}" for o, m, n in CHAINS])
def test_a_checkpoint_inside_a_replanned_epoch_resumes_on_any_topology(ten, old, middle, new):
    before, _, state = _read(_loaders(ten, *old), 11)
    inside = _loaders(ten, *middle, state=state)
    during, _, state = _read(inside, 7)
    ledgers = [state["dynamic"]] if middle[0] == 1 else [rank["dynamic"] for rank in state["ranks"]]
    assert all(ledger["replanned"]["world_size"] == old[0] for ledger in ledgers)
    resumed = _loaders(ten, *new, state=state)
    after, counts, _ = _read(resumed)
    _assert_once(before + during + after, _trimmed(inside if new[0] == middle[0] else resumed, new[1]))
    # len(loader) is the batches of the epoch the loader reads: the same re-planned epoch on the same world size
    # (7 batches of it read before the checkpoint), else the rest re-planned again
    already = 7 if new[0] == middle[0] else 0
    assert all(expected == already + got for expected, got in counts), counts
    assert len({got for _, got in counts}) == 1


def test_a_single_ranks_state_of_another_world_size_is_refused(ten):
    _, _, merged = _read(_loaders(ten, 2, 0), 4)
    loader, _ = make_loader(ten, 0, rank=0, world_size=3, **OPTIONS)
    with pytest.raises(StateMismatchError, match=r"needs every old rank's ledger.*rank\(s\) \[1\] only.*merged"):
        loader.load_state_dict(merged["ranks"][1])


def test_a_tampered_rest_of_a_replanned_epoch_is_refused(ten):
    _, _, state = _read(_loaders(ten, 2, 0), 5)
    _, _, inside = _read(_loaders(ten, 3, 0, state=state), 2)
    rest = inside["ranks"][0]["dynamic"]["replanned"]["rests"][1]
    rest["fresh_from_row"] += 40   # the old rank 1 would have yielded 40 rows more
    loader, _ = make_loader(ten, 0, rank=0, world_size=3, **OPTIONS)
    with pytest.raises(StateError, match=r"replanned\.rests\[1\]"):
        loader.load_state_dict(inside)
    del inside["ranks"][0]["dynamic"]["replanned"]["rests"][1]["yielded"]
    with pytest.raises(StateError, match=r"rests\[1\] has no 'yielded'"):
        loader.load_state_dict(inside)


def test_a_trim_warning_in_a_replanned_epoch_blames_the_replan(ten):
    """The TrimWarning of an epoch re-planned from a checkpoint of another world size names that re-plan as its
    cause (as a static re-plan's does), not unequal rows of the plan; the next epoch, planned, names the plan.
    A dynamic re-plan cuts the rest into stretches of equal rows within one, so evening trims at most one batch
    per rank and the warning does not fire on its own: the trim it would see is made larger here."""
    from arrowstream._layout.trims import Trim, TrimWatch

    _, _, merged = _read(_loaders(ten, 2, 0), steps=5)
    _, dataset = _loaders(ten, 3, 0, merged)[0]
    assert dataset.policy.replanned_from(dataset) == (2, None)
    too_much = Trim(rows=5 * BATCH, rank_rows=2000, batches=5, worker=None, allowed=1)
    with pytest.warns(TrimWarning) as caught:
        TrimWatch().starting(dataset.epoch, dataset.rank, too_much, dataset.policy.replanned_from(dataset))
    message = str(caught[0].message)
    assert "the epoch was re-planned from a checkpoint of world_size=2, and the rows it had left" in message
    assert "unequal rows" not in message
    dataset.set_epoch(1)
    assert dataset.policy.replanned_from(dataset) is None   # a planned epoch: the plan is the cause


def test_a_static_replan_names_the_old_workers_too(ten):
    _, _, merged = _read(_loaders(ten, 2, 2, assignment="static"), steps=5)
    _, dataset = _loaders(ten, 3, 1, merged, assignment="static")[0]
    assert dataset.policy.replanned_from(dataset) == (2, 2)
    dataset.set_epoch(1)
    assert dataset.policy.replanned_from(dataset) is None


def test_ranks_whose_even_batches_disagree_are_refused(ten):
    """Each old rank's rest follows from its own even_batches; ranks of one run have the same, so a merged
    checkpoint whose ranks disagree is refused (saved values named), not re-planned on the last rank's."""
    _, _, merged = _read(_loaders(ten, 2, 0), 5)
    merged["ranks"][1]["dynamic"]["options"]["even_batches"] = False
    loader, _ = make_loader(ten, 0, rank=0, world_size=3, **OPTIONS)
    with pytest.raises(StateMismatchError, match=r"rank 0 was taken with even_batches=True and its rank 1 with "
                                                 r"even_batches=False.*same even_batches"):
        loader.load_state_dict(merged)


def _nested(replanned, levels):
    """``replanned`` under ``levels`` more re-plans (each of 2 old ranks, their rests left empty)."""
    for _ in range(levels):
        replanned = {"world_size": 2, "even_batches": True, "rests": [{}, {}], "replanned": replanned}
    return replanned


def test_a_replan_nested_deeper_than_any_run_makes_is_a_state_error(ten):
    """A re-plan of a re-plan is legal (one per change of world size inside an epoch), up to 64 deep; deeper, or
    deeper than Python can copy, is a StateError naming the field, never a RecursionError."""
    _, _, state = _read(_loaders(ten, 2, 0), 5)
    _, _, inside = _read(_loaders(ten, 3, 0, state=state), 2)   # each ledger: replanned, 1 deep
    loader, _ = make_loader(ten, 0, rank=0, world_size=3, **OPTIONS)
    # 64 deep: every level parsed (the real one at the bottom too), the deepest empty rests refused
    for levels, match in [(63, r"dynamic(\.replanned){63}\.rests\[0\] has no 'yielded'"),
                          (64, r"dynamic\.replanned holds re-plans of re-plans more than 64 deep"),
                          (2000, r"nested deeper than Python can copy")]:
        tampered = {**inside, "ranks": [{**outer, "dynamic": {**outer["dynamic"],
                                                              "replanned": _nested(outer["dynamic"]["replanned"], levels)}}
                                        for outer in inside["ranks"]]}
        with pytest.raises(StateError, match=match):
            loader.load_state_dict(tampered)


def _chain(ten):
    """A checkpoint on 2 ranks of an epoch re-planned from 3 ranks, itself re-planned from 2: replanned 2 deep."""
    _, _, state = _read(_loaders(ten, 2, 0), 5)
    _, _, inside = _read(_loaders(ten, 3, 0, state=state), 2)
    _, _, again = _read(_loaders(ten, 2, 0, state=inside), 2)
    assert again["ranks"][0]["dynamic"]["replanned"]["replanned"]["world_size"] == 2
    return inside, again


def test_a_tampered_nested_replan_is_named_by_its_path(ten):
    _, again = _chain(ten)
    again["ranks"][0]["dynamic"]["replanned"]["replanned"]["rests"][1]["fresh_from_row"] += 40
    loader, _ = make_loader(ten, 0, rank=0, world_size=2, **OPTIONS)
    with pytest.raises(StateError, match=r"dynamic\.replanned\.replanned\.rests\[1\]"):
        loader.load_state_dict(again)


def test_the_replan_bound_refuses_a_checkpoint_deeper_and_a_replan_that_would_make_one(ten, monkeypatch):
    """With the bound at 1 (64 in a release): a checkpoint re-planned 2 deep is refused, and a checkpoint 1 deep
    is not re-planned for another world size (its checkpoints would be refused), yet resumes on its own."""
    from arrowstream._assignment import dynamic_epoch

    inside, again = _chain(ten)
    monkeypatch.setattr(dynamic_epoch, "MAX_REPLANS", 1)
    loader, _ = make_loader(ten, 0, rank=0, world_size=2, **OPTIONS)
    with pytest.raises(StateError, match=r"dynamic\.replanned holds re-plans of re-plans more than 1 deep"):
        loader.load_state_dict(again)
    with pytest.raises(StateMismatchError, match=r"re-planned 1 times already.*Resume with world_size=3"):
        loader.load_state_dict(inside)
    loader, _ = make_loader(ten, 0, rank=0, world_size=3, **OPTIONS)
    loader.load_state_dict(inside)
