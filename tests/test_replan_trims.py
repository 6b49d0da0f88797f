"""What a re-planned epoch trims (issue #36): the rest of an epoch re-planned on another topology is cut into
equal stretches per new (rank, worker) slot, so ``even_batches`` trims at most one batch per slot; more than
that, in a planned or a re-planned epoch, is a ``TrimWarning`` naming the rows.

An in-process matrix: old topology -> new topology (ranks are explicit ``rank``/``world_size`` loaders in this
process, their states merged) x {default buffer, explicit buffer, interleave, drop_last, mixture, dynamic (other workers, and other ranks)}.
Each case counts the rows read before the checkpoint and after it on every new rank: none twice, every row
of the epoch read but those ``even_batches`` trims and ``drop_last`` drops (as the datasets count them), at
most one batch per new slot, equal batches on every rank and ``len(loader)`` exact.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import ids_of, json_roundtrip, make_loader

import arrowstream
from arrowstream import Mixture, Source, TrimWarning
from arrowstream._loader.torchdata_state import worker_states

ROWS, FILES, BATCH = 8000, 20, 64


@pytest.fixture(scope="module")
def twenty(tmp_path_factory):
    """20 files of 400 rows (row groups of 100), ids 0..7999."""
    folder = tmp_path_factory.mktemp("twenty")
    per = ROWS // FILES
    for index in range(FILES):
        ids = np.arange(index * per, (index + 1) * per, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), folder / f"part-{index:02d}.parquet", row_group_size=100)
    return str(folder)


def _old_states(path, world_size, num_workers, steps, options):
    """Every old rank after ``steps`` batches of epoch 0: the ids read, and the checkpoint (merged when ranks > 1)."""
    seen, states = [], []
    for rank in range(world_size):
        loader, dataset = make_loader(path, num_workers, rank=rank, world_size=world_size, **options)
        dataset.set_epoch(0)
        with warnings.catch_warnings():   # a planned epoch of 20 files over 3 ranks trims more than a batch: warned
            warnings.simplefilter("ignore", TrimWarning)
            for step, batch in enumerate(loader):
                seen += ids_of(batch)
                if step + 1 == steps:
                    break
        states.append(loader.state_dict())
    return seen, json_roundtrip(arrowstream.merge_state_dicts(states) if world_size > 1 else states[0])


def _resume_everywhere(path, world_size, num_workers, state, options):
    """Every new rank loads ``state`` and reads the rest of epoch 0: ids, (len, batches) per rank, rows left out."""
    after, lengths, left_out = [], [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrimWarning)   # a re-plan that trims more than a batch per slot fails here
        for rank in range(world_size):
            loader, dataset = make_loader(path, num_workers, rank=rank, world_size=world_size, **options)
            loader.load_state_dict(state)
            dataset.set_epoch(0)
            expected = len(loader)
            batches = [ids_of(batch) for batch in loader]
            lengths.append((expected, len(batches)))
            after += [i for batch in batches for i in batch]
            trimmed = dataset.rows_trimmed_per_epoch(num_workers)
            assert trimmed <= max(num_workers, 1) * BATCH, f"rank {rank} trims {trimmed} rows, more than a batch per slot"
            left_out += trimmed + dataset.rows_dropped_per_epoch(num_workers)
    return after, lengths, left_out


OPTIONS = {
    "default-buffer": {"shuffle": True, "seed": 0},
    "buffer": {"shuffle": True, "seed": 1, "shuffle_buffer_size": 700},
    "interleave": {"shuffle": True, "seed": 2, "interleave": 3},
    "drop-last": {"shuffle": True, "seed": 3, "drop_last": True, "shuffle_buffer_size": 300},
}
TOPOLOGIES = [((1, 2), (2, 2)), ((1, 2), (4, 1)), ((2, 1), (3, 1)), ((1, 0), (2, 2)), ((3, 0), (2, 0)),
              ((2, 2), (1, 3))]


@pytest.mark.parametrize("kind", list(OPTIONS))
@pytest.mark.parametrize(("old", "new"), TOPOLOGIES, ids=[f"{o[0]}x{o[1]}-to-{n[0]}x{n[1]}" for o, n in TOPOLOGIES])
def test_a_replanned_epoch_trims_at_most_one_batch_per_slot(twenty, kind, old, new):
    options = {"batch_size": BATCH, **OPTIONS[kind]}
    if kind != "default-buffer" and max(old[1], new[1]) > 1 and old != ((1, 2), (2, 2)):
        options["batches_per_transfer"] = 1   # (keeps the worker cases short)
    seen, state = _old_states(twenty, *old, steps=9, options=options)
    after, lengths, left_out = _resume_everywhere(twenty, *new, state=state, options=options)
    counts = Counter(seen + after)
    assert max(counts.values()) == 1, "a row came twice"
    assert len(counts) + left_out == ROWS, "rows were lost beyond what even_batches and drop_last count"
    assert all(expected == got for expected, got in lengths), "len(loader) was not the batches read"
    assert len({got for _, got in lengths}) == 1, "the ranks yielded different numbers of batches"
    assert lengths[0][1] > 0


def test_the_issues_case_reads_every_row_left(twenty):
    """1 rank x 2 workers, default buffer, 32 batches, resumed on 2 ranks x 2 workers: every row was trimmed."""
    options = {"batch_size": BATCH, "shuffle": True, "seed": 0}
    seen, state = _old_states(twenty, 1, 2, steps=32, options=options)
    for target in (state, json_roundtrip(arrowstream.merge_state_dicts([state]))):   # the rank's state or merged
        after, lengths, left_out = _resume_everywhere(twenty, 2, 2, state=target, options=options)
        assert sorted(seen + after) == list(range(ROWS)) and left_out == 0
        assert lengths == [(48, 48), (48, 48)]   # (8000 - 32 * 64) rows over 4 slots: 1,488 each, 24 batches


def test_even_batches_false_spreads_the_rest_over_every_rank(twenty):
    options = {"batch_size": BATCH, "shuffle": True, "seed": 0, "even_batches": False}
    seen, state = _old_states(twenty, 1, 2, steps=32, options=options)
    after, lengths, _ = _resume_everywhere(twenty, 2, 2, state=state, options=options)
    assert sorted(seen + after) == list(range(ROWS))
    assert lengths == [(48, 48), (48, 48)]   # before #36: rank 0 had every batch, rank 1 none


@pytest.mark.parametrize(("old", "new"), [(2, 3), (0, 2), (3, 1)])
def test_dynamic_assignment_replans_for_other_workers_without_a_trim(twenty, old, new):
    options = {"batch_size": BATCH, "shuffle": True, "seed": 4, "assignment": "dynamic", "world_size": 2}
    seen, states = [], []
    for rank in range(2):
        loader, dataset = make_loader(twenty, old, **{**options, "rank": rank})
        dataset.set_epoch(0)
        for step, batch in enumerate(loader):
            seen += ids_of(batch)
            if step + 1 == 7:
                break
        states.append(loader.state_dict())
    merged = json_roundtrip(arrowstream.merge_state_dicts(states))
    after, lengths = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrimWarning)
        for rank in range(2):
            loader, dataset = make_loader(twenty, new, **{**options, "rank": rank})
            loader.load_state_dict(merged)
            batches = [ids_of(batch) for batch in loader]
            lengths.append(len(batches))
            after += [i for batch in batches for i in batch]
            assert dataset.rows_trimmed_per_epoch(new) <= max(new, 1) * BATCH
    counts = Counter(seen + after)
    assert max(counts.values()) == 1 and len(counts) == ROWS   # 8000 rows over 2 ranks: nothing to trim
    assert lengths[0] == lengths[1]


DYNAMIC_TOPOLOGIES = [((1, 2), (2, 2)), ((2, 1), (3, 1)), ((3, 0), (2, 0)), ((2, 2), (1, 3))]


@pytest.mark.parametrize(("old", "new"), DYNAMIC_TOPOLOGIES,
                         ids=[f"{o[0]}x{o[1]}-to-{n[0]}x{n[1]}" for o, n in DYNAMIC_TOPOLOGIES])
def test_a_dynamic_epoch_replanned_for_another_world_size_trims_at_most_one_batch_per_rank(twenty, old, new):
    """Dynamic assignment: every old rank's ledger, its rows left cut into equal stretches, one per new rank."""
    options = {"batch_size": BATCH, "shuffle": True, "seed": 4, "assignment": "dynamic", "batches_per_transfer": 1}
    seen, state = _old_states(twenty, *old, steps=9, options=options)
    after, lengths, left_out = _resume_everywhere(twenty, *new, state=state, options=options)
    # the rows the old epoch's own even_batches would have trimmed (20 files over 3 ranks) are re-planned with the
    # old ranks' rests (they had rows left): read now, as a static re-plan reads them (they were lost, uncounted)
    old_trims = sum(make_loader(twenty, old[1], rank=rank, world_size=old[0], **options)[1]
                    .rows_trimmed_per_epoch(old[1]) for rank in range(old[0]))
    assert old_trims or old[0] != 3, "20 files over 3 ranks: the old epoch trims"
    counts = Counter(seen + after)
    assert max(counts.values()) == 1, "a row came twice"
    assert len(counts) + left_out == ROWS, "rows were lost beyond what the new epoch's even_batches counts"
    assert left_out <= new[0] * BATCH   # a rank's rows are trimmed together: at most a batch per rank
    assert all(expected == got for expected, got in lengths), "len(loader) was not the batches read"
    assert len({got for _, got in lengths}) == 1, "the ranks yielded different numbers of batches"


def _mixture(sources, num_workers, rank, world_size, **kwargs):
    options = {"weights": None, "batch_size": 32, "shuffle": True, "shuffle_buffer_size": 200,
               "seed": 5, "plan_cache": False, "rank": rank, "world_size": world_size, "plan_locally": True, **kwargs}
    return Mixture.create_dataloader(sources=sources, num_workers=num_workers, **options)


@pytest.mark.parametrize(("old", "new"), [((1, 2), (2, 2)), ((2, 0), (3, 0)), ((3, 1), (1, 2))])
def test_a_mixtures_replanned_epoch_trims_at_most_one_batch_per_slot(twenty, tmp_path, old, new):
    other = tmp_path / "b"
    other.mkdir()
    ids = np.arange(100_000, 102_000, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), other / "part.parquet", row_group_size=250)
    sources = {"a": Source(twenty), "b": Source(str(other))}
    states, before = [], []
    for rank in range(old[0]):
        loader, mixture = _mixture(sources, old[1], rank, old[0])
        mixture.set_epoch(0)
        for step, batch in enumerate(loader):
            before += batch["id"].tolist()
            if step + 1 == 6:
                break
        states.append(loader.state_dict())
    merged = json.loads(json.dumps(arrowstream.merge_state_dicts(states)))
    after, lengths = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrimWarning)
        for rank in range(new[0]):
            loader, mixture = _mixture(sources, new[1], rank, new[0])
            loader.load_state_dict(merged)
            mixture.set_epoch(0)
            expected = len(loader)
            batches = [batch["id"].tolist() for batch in loader]
            lengths.append((expected, len(batches)))
            after += [i for batch in batches for i in batch]
    counts = Counter(before + after)
    assert max(counts.values()) == 1
    epoch_rows = mixture.quotas()["a"] + mixture.quotas()["b"]
    assert epoch_rows - len(counts) <= new[0] * max(new[1], 1) * 32   # at most a batch per new slot trimmed
    assert all(e == g for e, g in lengths) and len({g for _, g in lengths}) == 1


def test_a_planned_epoch_that_trims_more_than_a_batch_per_slot_warns(tmp_path):
    sizes = [5000, 1000, 1000]   # one row group each: rank 0 holds 5,000 rows, rank 1 2,000
    for index, rows in enumerate(sizes):
        pq.write_table(pa.table({"id": np.arange(rows)}), tmp_path / f"f{index}.parquet", row_group_size=rows)
    loader, dataset = make_loader(str(tmp_path), 0, batch_size=100, rank=0, world_size=2)
    with pytest.warns(TrimWarning, match=r"trims 3,000 row\(s\) of epoch 0 on rank 0 \(60\.0% of the rank's 5,000 "
                                         r"rows\), 30 batch\(es\) of worker 0.*even_batches=False"):
        assert len(list(loader)) == 20
    assert dataset.rows_trimmed_per_epoch() == 3000
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrimWarning)   # once per epoch
        list(loader)
    other, _ = make_loader(str(tmp_path), 0, batch_size=100, rank=1, world_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrimWarning)   # rank 1 trims nothing
        assert len(list(other)) == 20


def test_an_old_state_inside_an_epoch_replanned_whole_by_lpt_warns_of_its_trim(twenty):
    """A state of version 8 or older inside a re-planned epoch keeps that epoch's LPT cut (it resumes exactly);
    where that cut trims every row left, as in #36, the loader says so."""
    options = {"batch_size": BATCH, "shuffle": True, "seed": 0}
    _, state = _old_states(twenty, 1, 2, steps=32, options=options)
    replanned = []
    for rank in range(2):   # the re-planned epoch's states before their first batch, as an older version cut it
        loader, _ = make_loader(twenty, 2, rank=rank, world_size=2, **options)
        loader.load_state_dict(state)
        inside = json_roundtrip(loader.state_dict())
        for worker in worker_states(inside["dataloader"]):
            assert worker["elastic"]["cut"] == "even"
            worker["elastic"]["cut"] = "lpt"
        replanned.append(inside)
    merged = json_roundtrip(arrowstream.merge_state_dicts(replanned))
    loader, dataset = make_loader(twenty, 2, rank=0, world_size=2, **options)
    loader.load_state_dict(merged)
    assert len(loader) == 0   # the rows left went whole to rank 0's two workers, rank 1 has none: all trimmed
    with pytest.warns(TrimWarning, match=r"trims 5,952 row\(s\).*re-planned from a checkpoint of world_size=1, "
                                         r"num_workers=2"):
        assert list(loader) == []
    assert dataset.rows_trimmed_per_epoch(2) == 5952
