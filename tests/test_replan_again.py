"""An epoch re-planned for another topology, re-planned again (issue #38): static assignment, a dataset.

A checkpoint taken inside an epoch re-planned from T1 to T2, loaded on a third topology T3, re-plans the rest of it
again: each T2 worker's rows left are the rest of the replay it stood in, its later replays, then what it left of
its ranges; its state's ``elastic`` is the T2 cursors with ``before`` the T1 re-plan (any depth). Every row of the
epoch is read exactly once across the runs, the next epoch is whole and a fresh run's, a checkpoint inside a twice
re-planned epoch resumes exactly on its own topology, and a tampered ``before`` is a ``StateError`` naming it.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter

import pytest
from helpers import ids_of, json_roundtrip, make_loader, write_dataset

import arrowstream
from arrowstream import StructuredDataset, TrimWarning, errors
from arrowstream._loader.torchdata_state import worker_states

OPTIONS = {"batch_size": 32, "shuffle": True, "seed": 5, "shuffle_buffer_size": 90, "interleave": 2}
pytestmark = [pytest.mark.timeout(600), pytest.mark.filterwarnings("ignore:This DataLoader will create")]


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    """4 files of unequal rows and row groups: 1,110 rows."""
    return write_dataset(tmp_path_factory.mktemp("replan-again"), [(400, 100), (310, 62), (250, 125), (150, 50)])


def _run(path, num_workers, state, steps=None, **options):
    """A loader of ``num_workers`` that loads ``state`` (None: fresh) and reads epoch 0: ``steps`` batches (None: to
    its end); the ids it read, the state after them, the loader and its dataset."""
    loader, dataset = make_loader(path, num_workers, **{**OPTIONS, **options})
    if state is not None:
        loader.load_state_dict(state)
    dataset.set_epoch(0)
    ids: list[int] = []
    for step, batch in enumerate(loader):
        ids += ids_of(batch)
        if steps is not None and step + 1 == steps:
            break
    return ids, json_roundtrip(loader.state_dict()), loader, dataset


def _elastic(state):
    return next(w for w in worker_states(state["dataloader"]) if w is not None)["elastic"]


@pytest.mark.parametrize("third", [1, 0])
def test_a_replanned_epoch_replanned_again_reads_every_row_once(uneven, third):
    """2 workers -> 3 -> 1 (and 0) -> 2: the four runs read every row of the epoch once; the next epoch is whole and
    a fresh run's."""
    first, state, _, _ = _run(uneven, 2, None, 5)
    second, state, _, _ = _run(uneven, 3, state, 6)
    assert _elastic(state)["num_workers"] == 2 and "before" not in _elastic(state)
    third_ids, state, _, _ = _run(uneven, third, state, 4)
    elastic = _elastic(state)
    assert (elastic["num_workers"], elastic["before"]["num_workers"]) == (3, 2)   # the chain: T2 cursors, then T1's
    fourth, _, loader, dataset = _run(uneven, 2, state)
    assert _elastic(json_roundtrip(loader.state_dict()))["before"]["before"]["num_workers"] == 2   # three deep
    counts = Counter(first + second + third_ids + fourth)
    assert max(counts.values()) == 1, "a row came twice"
    assert sorted(counts) == list(range(dataset.num_rows)), "a row was lost"
    dataset.set_epoch(1)
    fresh, fresh_dataset = make_loader(uneven, 2, **OPTIONS)
    fresh_dataset.set_epoch(1)
    assert [ids_of(b) for b in loader] == [ids_of(b) for b in fresh]


def test_a_checkpoint_inside_a_twice_replanned_epoch_resumes_exactly_on_its_topology(uneven):
    """Taken inside an epoch re-planned 2 -> 3 -> 1, resumed on 1 worker: the batches that follow are those the
    uninterrupted run yields, the next epoch included."""
    _, state, _, _ = _run(uneven, 2, None, 5)
    _, state, _, _ = _run(uneven, 3, state, 6)
    loader, dataset = make_loader(uneven, 1, **OPTIONS)
    loader.load_state_dict(state)
    reference, inside, consumed = [], None, 0
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        for step, batch in enumerate(loader):
            reference.append(ids_of(batch))
            if epoch == 0 and step == 3:
                inside, consumed = json_roundtrip(loader.state_dict()), len(reference)
    assert inside is not None and "before" in _elastic(inside)
    resumed, resumed_dataset = make_loader(uneven, 1, **OPTIONS)
    resumed.load_state_dict(inside)
    after = []
    for epoch in (0, 1):
        resumed_dataset.set_epoch(epoch)
        after += [ids_of(b) for b in resumed]
    assert after == reference[consumed:]


def _rank_loader(path, num_workers, rank, world_size, options):
    return StructuredDataset.create_dataloader(path=path, num_workers=num_workers, rank=rank, world_size=world_size,
                                               plan_locally=True, **{**OPTIONS, **options})


def _ranks(path, world_size, num_workers, state, steps, options):
    """Every rank of ``world_size`` (``num_workers`` each) loads ``state`` (None: fresh) and reads ``steps`` batches of
    epoch 0 (None: to its end); the ids read, the merged checkpoint after them, each rank's batches, len(loader)
    before reading and the rows its figures leave out (trimmed and dropped)."""
    ids, states, batches, lengths, left_out = [], [], [], [], 0
    for rank in range(world_size):
        loader, dataset = _rank_loader(path, num_workers, rank, world_size, options)
        if state is not None:
            loader.load_state_dict(state)
        dataset.set_epoch(0)
        lengths.append(len(loader))
        left_out += dataset.rows_trimmed_per_epoch(num_workers) + dataset.rows_dropped_per_epoch(num_workers)
        count = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TrimWarning)
            for step, batch in enumerate(loader):
                ids += ids_of(batch)
                count += 1
                if steps is not None and step + 1 == steps:
                    break
        batches.append(count)
        states.append(loader.state_dict())
    merged = json.loads(json.dumps(arrowstream.merge_state_dicts(states) if world_size > 1 else states[0]))
    return ids, merged, batches, lengths, left_out


@pytest.mark.parametrize("kind", ["even", "drop_last", "uneven"])
def test_ranks_replan_a_replanned_epoch_again_through_merged_checkpoints(uneven, kind):
    """2 ranks x 2 workers -> 3 ranks x 1 worker -> 1 rank x 2 workers -> 2 ranks x 1, with merged checkpoints: no row
    twice; with even_batches every rank of a run yields the same batches, len(loader) what it yields; every row not
    read is one the runs' figures count as trimmed or dropped (none without even_batches and drop_last)."""
    options = {"even": {}, "drop_last": {"drop_last": True}, "uneven": {"even_batches": False}}[kind]
    seen, state, _, _, _ = _ranks(uneven, 2, 2, None, 4, options)
    lost = 0
    for world_size, num_workers, steps in ((3, 1, 3), (1, 2, 2), (2, 1, None)):
        ids, state, batches, lengths, left_out = _ranks(uneven, world_size, num_workers, state, steps, options)
        seen += ids
        lost += left_out
        if steps is None:   # the rest of the epoch: each rank yields what len(loader) said, equal under even_batches
            assert batches == lengths, kind
            if kind != "uneven":
                assert len(set(batches)) == 1, kind
    counts = Counter(seen)
    assert max(counts.values()) == 1, "a row came twice"
    total = StructuredDataset(uneven).num_rows
    if kind == "uneven":
        assert sorted(counts) == list(range(total)), "a row was lost"
    else:   # rows left out are rows a run's figures count (trimmed by even_batches, dropped by drop_last)
        assert total - len(counts) <= lost, kind


def test_a_twice_replanned_epochs_figures_are_what_its_workers_yield(uneven):
    """slot_yields, len(loader) and describe_state on an epoch re-planned 2 -> 3 -> 1 (2 ranks): the rows and
    batches its workers yield."""
    _, state, _, _, _ = _ranks(uneven, 1, 2, None, 4, {})
    _, state, _, _, _ = _ranks(uneven, 1, 3, state, 3, {})
    for rank in range(2):
        loader, dataset = _rank_loader(uneven, 1, rank, 2, {})
        loader.load_state_dict(state)
        dataset.set_epoch(0)
        yields = dataset.slot_yields(1)
        _, batches, kept = yields[rank]
        batch_iter = iter(loader)
        first = [next(batch_iter) for _ in range(2)]
        inside = json_roundtrip(loader.state_dict())
        rest = list(batch_iter)
        assert len(first) + len(rest) == batches == len(loader)
        assert sum(len(b["id"]) for b in first + rest) == kept
        _, fresh = _rank_loader(uneven, 1, rank, 2, {})
        about = arrowstream.describe_state(inside, dataset=fresh)
        assert (about["elastic"]["old_world_size"], about["elastic"]["old_num_workers"]) == (1, 3)
        assert about["elastic"]["replans"] == 2
        assert "their epoch itself re-planned 1 time(s) before" in arrowstream.format_state(about)   # state show
        [mine] = about["ranks"]
        assert mine["epoch_rows"] == mine["rows"] + sum(len(b["id"]) for b in rest) == kept


def _tampered(state, edit):
    state = json.loads(json.dumps(state))
    for worker in worker_states(state["dataloader"]):
        if worker is not None:
            edit(worker["elastic"])
    return state


TAMPERS = {
    "before malformed": (lambda e: e.update(before="not a re-plan"), r"elastic\.before"),
    "before of another epoch": (lambda e: e["before"].update(epoch=1), r"elastic\.before\.epoch is 1"),
    "before's slots not its world's": (lambda e: e["before"].update(num_workers=3),
                                       r"elastic\.before\.cursors holds 2 entries.*num_workers=3"),
    "before's cursor past its splits": (lambda e: e["before"]["cursors"][0].update(next_split_index=99),
                                        r"elastic\.before\.cursors\[0\]"),
    "a cursor not in its replanned share": (lambda e: e["cursors"][0].update(replay_index=50),
                                            r"elastic\.cursors\[0\] has replay_index=50"),
}


@pytest.mark.parametrize("tamper", TAMPERS)
def test_a_tampered_before_is_a_state_error_naming_it(uneven, tamper):
    _, state, _, _ = _run(uneven, 2, None, 5)
    _, state, _, _ = _run(uneven, 3, state, 6)
    _, state, _, _ = _run(uneven, 1, state, 2)
    edit, match = TAMPERS[tamper]
    for workers in (1, 2):   # on its own topology and on another
        loader, _ = make_loader(uneven, workers, **OPTIONS)
        with pytest.raises(errors.StateError, match=match):
            loader.load_state_dict(_tampered(state, edit))


def test_a_filter_inside_a_window_is_still_refused_in_a_replanned_epoch(uneven):
    """The refusals of a re-plan stay in a re-planned epoch: a worker inside a shuffle window with a filter."""
    import pyarrow.compute as pc

    options = {"filter": pc.field("label") != 3, "batch_size": 30}   # windows of 90 rows: 3 batches each
    _, state, _, _ = _run(uneven, 0, None, 3, **options)   # at the end of a window: re-planned
    assert all(w["cursor"]["window_offset"] == 0 for w in worker_states(state["dataloader"]) if w is not None)
    _, state, _, _ = _run(uneven, 2, state, 1, **options)   # worker 0 inside a window of its share
    assert "elastic" in json.dumps(state)
    loader, _ = make_loader(uneven, 1, **{**OPTIONS, **options})
    with pytest.raises(errors.StateMismatchError, match="worker 0 stood inside a shuffle window, and with a filter"):
        loader.load_state_dict(state)


# -- a mixture ---------------------------------------------------------------------------------------------

MIX = {"weights": {"a": 2, "b": 1}, "epoch_rows": 600, "batch_size": 16, "source_column": "src", "plan_cache": False,
       "shuffle": True, "seed": 4, "shuffle_buffer_size": 40, "interleave": 2}


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    """Source a: ids 0..499 (uneven files), b: ids 10,000..10,209 (read in more than one pass an epoch)."""
    root = tmp_path_factory.mktemp("replan-again-mix")
    return {"a": arrowstream.Source(write_dataset(root / "a", [(300, 60), (200, 50)])),
            "b": arrowstream.Source(write_dataset(root / "b", [(210, 70)], seed=1))}


def _mix_rows(batches):
    return Counter((src, i) for batch in batches for src, i in zip(batch["src"], batch["id"].tolist(), strict=True))


def _mix_run(sources, num_workers, state, steps=None):
    loader, mixture = arrowstream.Mixture.create_dataloader(sources=sources, num_workers=num_workers, **MIX)
    if state is not None:
        loader.load_state_dict(state)
    mixture.set_epoch(0)
    batches = []
    for batch in loader:
        batches.append(batch)
        if steps is not None and len(batches) == steps:
            break
    return batches, json_roundtrip(loader.state_dict()), loader, mixture


def test_a_mixture_replans_a_replanned_epoch_again_exactly_per_source(two_sources):
    """2 workers -> 3 -> 1 -> 2 (then a checkpoint inside the twice re-planned epoch resumed on its own topology): each
    source's rows of the epoch are those of an uninterrupted run, each as often; the next epoch is a fresh run's."""
    whole, _, _, _ = _mix_run(two_sources, 2, None)
    first, state, _, _ = _mix_run(two_sources, 2, None, 5)
    second, state, _, _ = _mix_run(two_sources, 3, state, 4)
    third, twice, _, _ = _mix_run(two_sources, 1, state, 3)
    assert _elastic(twice)["before"]["num_workers"] == 2 and _elastic(twice)["num_workers"] == 3
    fourth, _, loader, mixture = _mix_run(two_sources, 2, twice)
    assert _mix_rows(first + second + third + fourth) == _mix_rows(whole)   # per source: each row as often
    mixture.set_epoch(1)
    fresh, fresh_mixture = arrowstream.Mixture.create_dataloader(sources=two_sources, num_workers=2, **MIX)
    fresh_mixture.set_epoch(1)
    assert [b["id"].tolist() for b in loader] == [b["id"].tolist() for b in fresh]
    # on its own topology a checkpoint inside the twice re-planned epoch resumes batch for batch
    rest, _, _, _ = _mix_run(two_sources, 1, state)
    again, _, _, _ = _mix_run(two_sources, 1, twice)
    assert [b["id"].tolist() for b in again] == [b["id"].tolist() for b in rest[3:]]


def test_a_mixture_tampered_before_is_a_state_error_naming_it(two_sources):
    _, state, _, _ = _mix_run(two_sources, 2, None, 5)
    _, state, _, _ = _mix_run(two_sources, 3, state, 4)
    _, twice, _, _ = _mix_run(two_sources, 1, state, 3)
    for edit, match in ((lambda e: e["before"].update(epoch=2), r"elastic\.before\.epoch is 2"),
                        (lambda e: e["before"].update(world_size=2), r"elastic\.before\.cursors holds 2 entries"),
                        (lambda e: e.update(before=[]), r"elastic\.before")):
        for workers in (1, 2):
            loader, _ = arrowstream.Mixture.create_dataloader(sources=two_sources, num_workers=workers, **MIX)
            with pytest.raises(errors.StateError, match=match):
                loader.load_state_dict(_tampered(twice, edit))


def test_a_chain_of_re_plans_reads_iteratively_and_is_bounded():
    """``before`` is read without recursion, innermost first; deeper than MAX_REPLANS is a StateError naming it."""
    from arrowstream._state.worker import MAX_REPLANS, Leftovers

    link = {"epoch": 0, "world_size": 1, "num_workers": 1, "cut": "even", "cursors": [None]}
    chain = link
    for _ in range(MAX_REPLANS - 1):
        chain = {**link, "before": chain}
    parsed = Leftovers.from_dict(chain)
    assert parsed.depth == MAX_REPLANS and Leftovers.from_dict(parsed.to_dict()) == parsed
    with pytest.raises(errors.StateError, match=rf"elastic nests more than {MAX_REPLANS} re-plans"):
        Leftovers.from_dict({**link, "before": chain})
