"""A mixture's passes on any topology (issue #36): a source's place is its position alone.

A source read in passes (``epoch_rows`` below the sources' rows) must give every row once per pass, however
many workers and ranks read the epochs before: at an epoch boundary and after a mid-epoch elastic resume.
Before #36 a pass was read in per-slot tracks, so what an epoch left of it depended on the topology: one
100-row source, ``epoch_rows=50``, epoch 0 on 0 workers and epoch 1 on 3 gave 83 distinct ids of 100.
Checkpoints of runs that read passes in tracks (mixture states of version 3 and older) keep them on their
topology; on another one they are refused unless every source's pass ends with the saved epoch.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowstream
from arrowstream import Mixture, Source, errors

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Source a: ids 0..99 (row groups of 10); source b: ids 1000..1039 (row groups of 8)."""
    root = tmp_path_factory.mktemp("passes")
    for name, ids, group in (("a", np.arange(100), 10), ("b", np.arange(1000, 1040), 8)):
        os.makedirs(root / name)
        pq.write_table(pa.table({"id": ids}), root / name / "part.parquet", row_group_size=group)
    return {"a": Source(str(root / "a")), "b": Source(str(root / "b"))}


def _loader(sources, topology, **kwargs):
    world_size, num_workers, rank = (*topology, 0)[:3]
    options = {"weights": {"a": 50, "b": 20}, "epoch_rows": 70, "batch_size": 10, "plan_cache": False,
               "rank": rank, "world_size": world_size, "plan_locally": True, **kwargs}   # quotas: 50 of a, 20 of b
    return Mixture.create_dataloader(sources=sources, num_workers=num_workers, **options)


def _read(sources, topology, epoch, state, stop=None, **kwargs):
    """Every rank of ``topology`` reads ``epoch`` (from ``state``, up to ``stop`` batches each): ids, states."""
    ids, states = [], []
    for rank in range(topology[0]):
        loader, mixture = _loader(sources, (*topology, rank), **kwargs)
        if state is not None:
            loader.load_state_dict(state)
        mixture.set_epoch(epoch)
        for step, batch in enumerate(loader):
            ids += batch["id"].tolist()
            if step + 1 == stop:
                break
        states.append(loader.state_dict())
    merged = states[0] if len(states) == 1 else arrowstream.merge_state_dicts(states)
    return ids, json.loads(json.dumps(merged))


def _passes_whole(ids):
    """Each source's ids of two epochs (one pass: 50 + 50 of a, 20 + 20 of b) are all its rows, once."""
    counts = Counter(ids)
    assert sorted(i for i in counts if i < 1000) == list(range(100)), "source a: a pass lost or repeated rows"
    assert sorted(i for i in counts if i >= 1000) == list(range(1000, 1040)), "source b: a pass lost or repeated rows"
    assert set(counts.values()) == {1}


KINDS = {"plain": {}, "shuffle": {"shuffle": True, "seed": 3},
         "buffer": {"shuffle": True, "seed": 4, "shuffle_buffer_size": 16, "interleave": 2}}
BOUNDARIES = [((1, 0), (1, 2)), ((1, 0), (1, 3)), ((2, 0), (1, 0)), ((1, 2), (2, 1)), ((3, 1), (2, 2))]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(("old", "new"), BOUNDARIES, ids=[f"{o}-to-{n}" for o, n in BOUNDARIES])
def test_a_pass_goes_on_exactly_when_the_topology_changes_at_an_epoch_boundary(two, kind, old, new):
    first, state = _read(two, old, 0, None, **KINDS[kind])
    second, state = _read(two, new, 1, state, **KINDS[kind])
    _passes_whole(first + second)
    third, state = _read(two, new, 2, state, **KINDS[kind])
    fourth, _ = _read(two, old, 3, state, **KINDS[kind])   # and back
    _passes_whole(third + fourth)


MID = [((1, 2), (2, 1), 2), ((1, 0), (1, 3), 3), ((2, 1), (3, 0), 1), ((1, 3), (1, 0), 2)]


@pytest.mark.parametrize(("old", "new", "stop"), MID, ids=[f"{o}-to-{n}" for o, n, _ in MID])
def test_a_mid_epoch_elastic_resume_keeps_the_passes_of_later_epochs_whole(two, old, new, stop):
    options = KINDS["buffer"]
    before, state = _read(two, old, 0, None, stop=stop, **options)
    rest, state = _read(two, new, 0, state, **options)
    second, state = _read(two, new, 1, state, **options)
    _passes_whole(before + rest + second)
    third, state = _read(two, new, 2, state, **options)
    fourth, _ = _read(two, new, 3, state, **options)
    _passes_whole(third + fourth)


def _tracks_state(sources, topology, epochs, **kwargs):
    """The state after ``epochs`` whole epochs of a run whose passes are laid out in tracks (as a run resumed from
    a state of mixture state version 3 or older lays them out), and its ids."""
    loader, mixture = _loader(sources, topology, **kwargs)
    mixture.use_pass_layout("tracks")
    ids = []
    for epoch in range(epochs):
        mixture.set_epoch(epoch)
        ids += [i for batch in loader for i in batch["id"].tolist()]
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["dataloader"]["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]["options"][
        "pass_layout"] == "tracks"
    return ids, state


def test_a_checkpoint_of_tracks_moves_to_another_topology_only_where_its_passes_end(two):
    # after one epoch both sources stand inside their passes: what tracks left depends on the topology
    _, inside = _tracks_state(two, (1, 2), 1)
    loader, refused = _loader(two, (1, 3))
    refused.set_epoch(4)
    before = (refused.epoch, refused.history, refused.pass_layout)
    with pytest.raises(errors.StateMismatchError, match=r"per-worker tracks.*source\(s\) \['a', 'b'\] stand inside a "
                                                        r"pass after epoch 0 \(at row a: 50, b: 20\)\. Resume with "
                                                        r"world_size=1, num_workers=2"):
        loader.load_state_dict(inside)
    # refused after the mixture followed the checkpoint's epoch and history: both put back, as its layout
    assert (refused.epoch, refused.history, refused.pass_layout) == before == (4, [(0, {"a": 50, "b": 20})], "spans")
    same, mixture = _loader(two, (1, 2))
    same.load_state_dict(inside)   # on its own topology it goes on in tracks
    mixture.set_epoch(1)
    assert len([i for batch in same for i in batch["id"].tolist()]) == 70
    # after two epochs both passes end: spans from there, on any topology
    ids, boundary = _tracks_state(two, (1, 2), 2)
    _passes_whole(ids)
    third, state = _read(two, (2, 1), 2, boundary)
    fourth, _ = _read(two, (1, 3), 3, state)
    _passes_whole(third + fourth)


def test_a_golden_mixture_state_of_version_3_on_another_topology_is_refused_saying_why(tmp_path):
    sys.path.insert(0, GOLDEN)
    from make_golden import prepare_copy
    from make_golden_mixture import MIXTURE, sources

    with open(os.path.join(GOLDEN, "mixture-v3", "workers2-after-loop.json")) as f:
        golden = json.load(f)
    root = str(tmp_path)
    prepare_copy(os.path.join(root, "data"), "data")
    prepare_copy(os.path.join(root, "data-cut"), "data-cut")
    loader, _ = Mixture.create_dataloader(sources=sources(root), num_workers=3, **MIXTURE, **golden["options"])
    with pytest.raises(errors.StateMismatchError, match=r"per-worker tracks.*num_workers=2"):
        loader.load_state_dict(golden["state"])


@pytest.mark.timeout(120)
def test_an_epoch_of_a_trillion_rows_over_tiny_sources_starts_at_once(tmp_path):
    """Sources of 37, 300 and 1,000 rows, epoch_rows=10**12: len() and the first batch are arithmetic on passes
    (before #36 a loop over them: 21.8 s and 716 MB to the first batch at 10**8, and 10**12 never started)."""
    sources = {}
    for name, rows in (("x", 37), ("y", 300), ("z", 1000)):
        os.makedirs(tmp_path / name)
        pq.write_table(pa.table({"id": np.arange(rows)}), tmp_path / name / "p.parquet", row_group_size=100)
        sources[name] = Source(str(tmp_path / name))
    loader, mixture = Mixture.create_dataloader(sources=sources, epoch_rows=10**12, batch_size=1337, shuffle=True,
                                                source_column="src", plan_cache=False)
    assert len(loader) == -(-10**12 // 1337)
    assert mixture.quotas() == {"x": 27_673_896_784, "y": 224_382_946_896, "z": 747_943_156_320}
    batches = iter(loader)
    for _ in range(3):
        batch = next(batches)
        shares = Counter(batch["src"])
        for name, quota in mixture.quotas().items():   # each batch within a row of its share
            assert abs(shares[name] - 1337 * quota / 10**12) < 1
    with pytest.raises(errors.InvalidArgumentError, match=r"epoch_rows: 4,398,046,511,105 rows.*2\*\*42"):
        Mixture(sources=sources, epoch_rows=2**42 + 1, plan_cache=False)


@pytest.mark.timeout(120)
def test_a_trillion_row_epoch_is_replanned_for_other_ranks_at_once_and_resumes_exactly_inside(tmp_path):
    """The parts an old worker had not opened go to the new workers whole, not walked (before: a loop over
    every pass of every old worker, 18 s at epoch_rows=10**7)."""
    sources = {}
    for name, rows in (("x", 37), ("z", 1000)):
        os.makedirs(tmp_path / name)
        pq.write_table(pa.table({"id": np.arange(rows) + (0 if name == "x" else 10_000)}),
                       tmp_path / name / "p.parquet", row_group_size=100)
        sources[name] = Source(str(tmp_path / name))

    def make(rank, world_size):
        return Mixture.create_dataloader(sources=sources, epoch_rows=10**12, batch_size=64, shuffle=True,
                                         shuffle_buffer_size=32, plan_cache=False, rank=rank, world_size=world_size,
                                         plan_locally=True)

    loader, _ = make(0, 1)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    del batches
    resumed, mixture = make(1, 2)
    resumed.load_state_dict(state)
    assert len(resumed) == -(-(10**12 - 3 * 64) // 2 // 64)
    mixture.set_epoch(0)
    batches = iter(resumed)
    for _ in range(5):
        batch = next(batches)
        assert abs(sum(i < 10_000 for i in batch["id"].tolist()) - 64 * 37 / 1037) < 2   # shares kept
    inside = json.loads(json.dumps(resumed.state_dict()))
    expected = [next(batches)["id"].tolist() for _ in range(4)]
    del batches
    again, again_mixture = make(1, 2)
    again.load_state_dict(inside)
    again_mixture.set_epoch(0)
    batches = iter(again)
    assert [next(batches)["id"].tolist() for _ in range(4)] == expected
