"""``order="canonical"`` (issue 39): one global sequence of rows for every topology that divides ``canonical_slots``.

Global batch ``k`` is every rank's ``k``-th batch, ranks in rank order. Ranks run in this process (explicit ``rank``
and ``world_size``, one loader each, stepped together); the torchrun test of real ranks is in test_distributed.py.
Each test would fail with ``order="topology"``: its layout, its seeds and its batch sizes follow the topology.
"""

from __future__ import annotations

import copy
import json
import os
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import all_batches
from torchdata.stateful_dataloader import StatefulDataLoader

import arrowstream
from arrowstream import StructuredDataset
from arrowstream.errors import ArgumentTypeError, InvalidArgumentError, StateError, StateMismatchError

SLOTS = 8
GLOBAL = 64   # rows of a global batch: batch_size x world_size
ROWS = (137, 60, 301)   # uneven files


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("canonical")
    start = 0
    for index, rows in enumerate(ROWS):
        ids = np.arange(start, start + rows)
        pq.write_table(pa.table({"id": ids, "v": ids.astype(np.float32) / 2}), os.path.join(path, f"p{index}.parquet"),
                       row_group_size=50)
        start += rows
    return str(path)


def make(folder, world_size, num_workers, rank, **options):
    options = {"shuffle": True, "seed": 3, "order": "canonical", "canonical_slots": SLOTS, **options}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch's "suggested max number of worker" on 2 cores
        return StructuredDataset.create_dataloader(path=folder, batch_size=GLOBAL // world_size,
                                                   num_workers=num_workers, rank=rank, world_size=world_size,
                                                   **options)


def ranks(folder, world_size, num_workers, **options):
    return [make(folder, world_size, num_workers, rank, **options) for rank in range(world_size)]


def run(loaders, epochs, *, stop=None):
    """Every global batch of ``epochs`` (epoch, ids of every rank's batch in rank order), the ranks stepped together;
    with ``stop=(epoch, k)``: up to global batch k of that epoch, and the merged checkpoint there."""
    out = []
    for epoch in epochs:
        iterators = []
        for loader, dataset in loaders:
            dataset.set_epoch(epoch)
            iterators.append(iter(loader))
        count = 0
        while True:
            parts = []
            for iterator in iterators:
                try:
                    parts.append(next(iterator))
                except StopIteration:
                    break
            if len(parts) < len(iterators):
                assert not parts, f"ranks ended their epoch {epoch} apart: {len(parts)} of {len(iterators)} went on"
                break
            out.append((epoch, [int(x) for part in parts for x in part["id"]]))
            count += 1
            if stop == (epoch, count):
                merged = arrowstream.merge_state_dicts([loader.state_dict() for loader, _ in loaders])
                return out, json.loads(json.dumps(merged))
    return out, None


@pytest.fixture(scope="module")
def reference(folder):
    """The sequence of one process without workers, per option set."""
    cache = {}

    def of(**options):
        key = json.dumps(options, sort_keys=True)
        if key not in cache:
            cache[key] = run(ranks(folder, 1, 0, **options), (0, 1))[0]
        return cache[key]
    return of


OPTIONS = [
    {"shuffle_buffer_size": 20, "interleave": 2},
    {"shuffle_buffer_size": 0, "drop_last": True},
    {"shuffle": False},
]


@pytest.mark.parametrize("options", OPTIONS, ids=["buffer-interleave", "drop_last", "no-shuffle"])
def test_global_batches_are_the_same_for_every_world_size(folder, reference, options):
    ref = reference(**options)
    total = sum(ROWS)
    for epoch in (0, 1):
        ids = [x for e, batch in ref if e == epoch for x in batch]
        assert len(ids) == len(set(ids)), "a row repeated in an epoch"
        _, dataset = make(folder, 1, 0, 0, **options)
        dataset.set_epoch(epoch)
        assert len(ids) + dataset.rows_trimmed_per_epoch(0) + dataset.rows_dropped_per_epoch(0) == total
    assert [len(b) for _, b in ref][:-1].count(GLOBAL) >= len(ref) // 2 - 1
    if options.get("shuffle", True):
        assert [b for e, b in ref if e == 0] != [b for e, b in ref if e == 1], "another epoch, another order"
    for world_size in (2, 4, 8):
        got = run(ranks(folder, world_size, 0, **options), (0, 1))[0]
        assert got == ref, f"world_size={world_size} gave another sequence"


@pytest.mark.parametrize(("world_size", "num_workers", "options"), [
    (1, 1, {"shuffle_buffer_size": 20, "interleave": 2}),
    (1, 2, {"shuffle_buffer_size": 20, "interleave": 2}),
    (2, 4, {"shuffle_buffer_size": 20, "interleave": 2}),
    (2, 2, {"shuffle_buffer_size": 0, "drop_last": True}),
])
def test_global_batches_are_the_same_for_every_worker_count(folder, reference, world_size, num_workers, options):
    got = run(ranks(folder, world_size, num_workers, **options), (0, 1))[0]
    assert got == reference(**options)


@pytest.mark.parametrize(("old", "stop", "new"), [
    ((1, 0), (0, 3), (1, 0)),      # the same topology
    ((2, 1), (0, 5), (4, 0)),      # more ranks, a smaller batch_size: the same global batch
    ((4, 0), (1, 1), (1, 2)),      # fewer ranks, in the next epoch
    ((8, 0), (0, 7), (2, 4)),      # at the last global batch of the epoch (its last state says so)
    ((1, 2), (0, 4), (8, 1)),
])
def test_a_checkpoint_resumes_the_same_sequence_on_any_topology(folder, reference, old, stop, new):
    options = {"shuffle_buffer_size": 20, "interleave": 2}
    ref = reference(**options)
    assert len([1 for e, _ in ref if e == 0]) == 8
    first, saved = run(ranks(folder, *old, **options), (0, 1), stop=stop)
    assert saved is not None
    loaders = ranks(folder, *new, **options)
    for loader, _ in loaders:
        loader.load_state_dict(copy.deepcopy(saved))
        assert loader.dataset.epoch == stop[0]
    rest = run(loaders, range(stop[0], 2))[0]
    assert first + rest == ref


def test_a_checkpoint_between_epochs_starts_the_next_whole(folder, reference):
    options = {"shuffle_buffer_size": 20, "interleave": 2}
    loaders = ranks(folder, 2, 0, **options)
    run(loaders, (0,))
    saved = arrowstream.merge_state_dicts([loader.state_dict() for loader, _ in loaders])
    resumed = ranks(folder, 4, 1, **options)
    for loader, _ in resumed:
        loader.load_state_dict(json.loads(json.dumps(saved)))
    assert run(resumed, (0,))[0] == []
    assert run(resumed, (1,))[0] == [(e, b) for e, b in reference(**options) if e == 1]


def test_len_and_counts_are_exact(folder):
    for world_size, num_workers in ((1, 0), (2, 2), (8, 0)):
        loaders = ranks(folder, world_size, num_workers, shuffle_buffer_size=20, drop_last=True)
        got = run(loaders, (0,))[0]
        assert all(len(loader) == len(got) for loader, _ in loaders)
        assert all(len(batch) == GLOBAL for _, batch in got), "drop_last: every global batch whole"
        rows = sum(len(batch) for _, batch in got)
        counted = sum(d.rows_dropped_per_epoch(num_workers) + d.rows_trimmed_per_epoch(num_workers) for _, d in loaders)
        assert rows + counted == sum(ROWS)


@pytest.mark.parametrize("output_format", ["numpy", "arrow", "dict"])
def test_parts_of_every_output_format_are_joined(folder, output_format):
    def ids(batch):
        column = batch.column("id") if output_format == "arrow" else batch["id"]
        return [int(x) for x in (column.to_pylist() if output_format == "arrow" else column)]

    loader, _ = make(folder, 1, 2, 0, output_format=output_format, shuffle_buffer_size=20)
    reference, _ = make(folder, 1, 0, 0, shuffle_buffer_size=20)
    assert [ids(b) for b in loader] == [[int(x) for x in b["id"]] for b in reference]


def test_a_transform_whose_parts_cannot_be_joined_is_refused(folder):
    loader, _ = make(folder, 1, 2, 0, transform=lambda batch: object())
    with pytest.raises(ArgumentTypeError, match="cannot join"):
        next(iter(loader))


def test_a_plain_loader_reads_the_sequence_with_one_worker_and_refuses_more(folder, reference):
    dataset = StructuredDataset(folder, batch_size=GLOBAL, shuffle=True, seed=3, order="canonical",
                                canonical_slots=SLOTS, shuffle_buffer_size=20, interleave=2)
    ref = [b for e, b in reference(shuffle_buffer_size=20, interleave=2) if e == 0]
    plain = StatefulDataLoader(dataset, batch_size=None, num_workers=0)
    iterator = iter(plain)
    head = [[int(x) for x in next(iterator)["id"]] for _ in range(3)]
    state = json.loads(json.dumps(plain.state_dict()))
    again = StatefulDataLoader(StructuredDataset(folder, batch_size=GLOBAL, shuffle=True, seed=3, order="canonical",
                                                 canonical_slots=SLOTS, shuffle_buffer_size=20, interleave=2),
                               batch_size=None, num_workers=0)
    again.load_state_dict(state)
    assert head + [[int(x) for x in b["id"]] for b in again] == ref
    with pytest.raises(InvalidArgumentError, match="arrowstream's loader"):
        all_batches(StatefulDataLoader(dataset, batch_size=None, num_workers=2))   # (its workers ended at once)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"world_size": 3, "rank": 0, "batch_size": 64}, "does not divide canonical_slots"),
    ({"batch_size": 20}, "not a multiple of canonical_slots"),
    ({"assignment": "dynamic"}, "depends on timing"),
    ({"filter": [("id", ">", 3)]}, "filter"),
    ({"order": "by-rank"}, "order: expected"),
    ({"canonical_slots": 0}, "canonical_slots: expected"),
])
def test_arguments_that_break_the_sequence_are_refused(folder, kwargs, match):
    arguments = {"batch_size": GLOBAL, "order": "canonical", "canonical_slots": SLOTS, **kwargs}
    with pytest.raises(InvalidArgumentError, match=match):
        StructuredDataset(folder, **arguments)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"num_workers": 3}, "may be 0 or one of"),
    ({"num_workers": 2, "in_order": False}, "in_order=True"),
    ({"num_workers": 1, "snapshot_every_n_steps": 2}, "snapshot_every_n_steps=1"),
])
def test_loader_options_that_break_the_sequence_are_refused(folder, kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        loader, _ = StructuredDataset.create_dataloader(path=folder, batch_size=GLOBAL, order="canonical",
                                                        canonical_slots=SLOTS, **kwargs)
        next(iter(loader))


@pytest.fixture(scope="module")
def checkpoint(folder):
    """A merged checkpoint of 2 ranks with 1 worker each, three global batches in."""
    return run(ranks(folder, 2, 1, shuffle_buffer_size=20), (0,), stop=(0, 3))[1]


def worker_states(merged):
    for outer in merged["ranks"]:
        if "_snapshot" not in outer["dataloader"]:   # num_workers=0: the trainer's
            yield outer["dataloader"]["dataset_state"]
            continue
        snapshots = outer["dataloader"]["_snapshot"]["_worker_snapshots"]
        for key in sorted(snapshots):
            yield snapshots[key]["dataset_state"]


def test_a_checkpoint_of_another_order_or_sequence_is_refused(folder, checkpoint):
    topology, _ = StructuredDataset.create_dataloader(path=folder, batch_size=GLOBAL, shuffle=True, seed=3,
                                                      shuffle_buffer_size=20)
    with pytest.raises(StateMismatchError, match="order='topology'"):
        topology.load_state_dict(copy.deepcopy(checkpoint))
    plain_state = topology.state_dict()
    canonical, _ = make(folder, 1, 0, 0, shuffle_buffer_size=20)
    with pytest.raises(StateMismatchError, match="order='topology'"):
        canonical.load_state_dict(plain_state)
    other_slots, _ = make(folder, 1, 0, 0, shuffle_buffer_size=20, canonical_slots=4)
    with pytest.raises(StateMismatchError, match="canonical_slots=8"):
        other_slots.load_state_dict(copy.deepcopy(checkpoint))
    other_global, _ = StructuredDataset.create_dataloader(path=folder, batch_size=32, shuffle=True, seed=3,
                                                          shuffle_buffer_size=20, order="canonical",
                                                          canonical_slots=SLOTS)
    with pytest.raises(StateMismatchError, match="batch_size"):
        other_global.load_state_dict(copy.deepcopy(checkpoint))


def test_a_tampered_checkpoint_is_refused_and_changes_nothing(folder, checkpoint, reference):
    loader, _ = make(folder, 1, 0, 0, shuffle_buffer_size=20)

    def refused(edit, error, match):
        state = copy.deepcopy(checkpoint)
        edit(state)
        with pytest.raises(error, match=match):
            loader.load_state_dict(state)

    def out_of_step(state):
        inner = next(worker_states(state))["canonical"]["states"][1]
        inner["counters"]["batches"] += 1
    refused(out_of_step, StateError, "move together")

    def counters(state):
        next(worker_states(state))["counters"]["rows"] += 8
    refused(counters, StateError, "counters")

    def another_slot(state):
        next(worker_states(state))["canonical"]["states"][0]["slot"]["rank"] = 5
    refused(another_slot, StateError, "expected canonical slot")

    def cursor_past_the_plan(state):
        inner = next(worker_states(state))["canonical"]["states"][0]
        inner["counters"]["rows"] += 1000
        next(worker_states(state))["counters"]["rows"] += 1000
    refused(cursor_past_the_plan, StateError, r"counters.rows is \d+, but the cursor stands after \d+ row")

    with pytest.raises(StateMismatchError, match="lacks canonical slots"):   # rank 0's own state: half of them
        loader.load_state_dict(copy.deepcopy(checkpoint["ranks"][0]))
    # nothing was loaded: the loader reads the sequence from the start
    assert [[int(x) for x in b["id"]] for b in loader] == [b for e, b in reference(shuffle_buffer_size=20) if e == 0]


# -- a mixture ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Three sources of uneven files (ids 0.., 10000.., 20000..), small enough that passes wrap inside an epoch."""
    base = tmp_path_factory.mktemp("canonical-mixture")
    out = {}
    for name, sizes, start in (("a", (137, 60), 0), ("b", (91,), 10_000), ("c", (33, 20), 20_000)):
        folder = base / name
        folder.mkdir()
        for index, rows in enumerate(sizes):
            pq.write_table(pa.table({"id": np.arange(start, start + rows)}), folder / f"{index}.parquet",
                           row_group_size=40)
            start += rows
        out[name] = str(folder)
    return out


def mixture_ranks(sources, world_size, num_workers, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [arrowstream.Mixture.create_dataloader(
            sources={name: arrowstream.Source(path) for name, path in sources.items()},
            weights={"a": 0.5, "b": 0.3, "c": 0.2}, epoch_rows=400, batch_size=GLOBAL // world_size,
            num_workers=num_workers, rank=rank, world_size=world_size, order="canonical", canonical_slots=SLOTS,
            shuffle=True, seed=5, shuffle_buffer_size=16, interleave=2, **options) for rank in range(world_size)]


@pytest.fixture(scope="module")
def mixture_reference(sources):
    return run(mixture_ranks(sources, 1, 0), (0, 1))[0]


def test_a_mixture_gives_the_same_global_batches_on_every_topology(sources, mixture_reference):
    ref = mixture_reference
    ids = [x for e, batch in ref if e == 0 for x in batch]
    for low, quota, rows in ((0, 200, 197), (10_000, 120, 91), (20_000, 80, 53)):   # each source's quota: a pass
        mine = [x for x in ids if low <= x < low + 10_000]                       # whole, then the next one's rows
        assert len(mine) == quota and len(set(mine)) == rows
    for world_size, num_workers in ((2, 0), (8, 0), (1, 2), (2, 2)):
        assert run(mixture_ranks(sources, world_size, num_workers), (0, 1))[0] == ref, (world_size, num_workers)
    loader, _ = mixture_ranks(sources, 2, 2)[0]
    assert len(loader) == len([1 for e, _ in ref if e == 0])


@pytest.mark.parametrize(("old", "stop", "new"), [
    ((2, 2), (0, 2), (8, 0)),
    ((4, 0), (1, 2), (1, 1)),
])
def test_a_mixture_checkpoint_resumes_the_same_sequence_on_any_topology(sources, mixture_reference, old, stop, new):
    first, saved = run(mixture_ranks(sources, *old), (0, 1), stop=stop)
    loaders = mixture_ranks(sources, *new)
    for loader, _ in loaders:
        loader.load_state_dict(copy.deepcopy(saved))
    assert first + run(loaders, range(stop[0], 2))[0] == mixture_reference


def test_a_mixture_refuses_a_checkpoint_of_another_order_or_front(sources, folder, checkpoint):
    (canonical, _), = mixture_ranks(sources, 1, 0)
    topology, _ = arrowstream.Mixture.create_dataloader(
        sources={name: arrowstream.Source(path) for name, path in sources.items()},
        weights={"a": 0.5, "b": 0.3, "c": 0.2}, epoch_rows=400, batch_size=GLOBAL, shuffle=True, seed=5,
        shuffle_buffer_size=16, interleave=2)
    next(iter(canonical))
    with pytest.raises(StateMismatchError, match="order='canonical'"):
        topology.load_state_dict(canonical.state_dict())
    next(iter(topology))
    with pytest.raises(StateMismatchError, match="order='topology'"):
        canonical.load_state_dict(topology.state_dict())
    with pytest.raises(StateMismatchError, match="dataset"):
        canonical.load_state_dict(copy.deepcopy(checkpoint))


def test_every_type_is_joined_from_the_workers_parts(tmp_path):
    """torch batches of every kind of column (numbers, bools, timestamps, fixed-size lists as 2-D tensors, strings,
    lists and structs as Python lists, nulls filled) joined from 2 workers equal those of one process."""
    rows = 96
    ids = np.arange(rows)
    table = pa.table({
        "id": ids, "f": ids.astype(np.float32), "b": ids % 3 == 0,
        "t": pa.array(ids * 1_000_000, pa.timestamp("us")), "d": pa.array(ids.astype(np.int32), pa.date32()),
        "v": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 2).astype(np.float32)), 2),
        "s": pa.array([f"s{i}" if i % 5 else None for i in ids]),
        "l": pa.array([[int(i)] * (int(i) % 3) for i in ids], pa.list_(pa.int64())),
        "st": pa.array([{"a": int(i)} for i in ids]),
        "n": pa.array([None if i % 7 == 0 else int(i) for i in ids], pa.int64())})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=30)

    def batches(num_workers):
        loader, _ = StructuredDataset.create_dataloader(path=str(tmp_path), batch_size=32, num_workers=num_workers,
                                                        order="canonical", canonical_slots=4, shuffle=True,
                                                        shuffle_buffer_size=10, fill_nulls={"n": -1})
        return list(loader)

    one, two = batches(0), batches(2)
    assert len(one) == len(two) == 3
    for a, b in zip(one, two, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if hasattr(a[key], "shape"):
                assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape and (a[key] == b[key]).all(), key
            else:
                assert a[key] == b[key], key


def test_skip_passes_over_whole_global_batches(folder, reference):
    ref = [b for e, b in reference(shuffle_buffer_size=20, interleave=2) if e == 0]
    loaders = ranks(folder, 2, 2, shuffle_buffer_size=20, interleave=2)
    for loader, _ in loaders:
        loader.skip(batches=2)
    first, saved = run(loaders, (0,), stop=(0, 1))
    assert [b for _, b in first] == ref[2:3]
    resumed = ranks(folder, 4, 0, shuffle_buffer_size=20, interleave=2)
    for loader, _ in resumed:
        loader.load_state_dict(copy.deepcopy(saved))
    assert [b for _, b in run(resumed, (0,))[0]] == ref[3:]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loaded_checkpoint_is_the_state_until_the_next_batch_and_only_for_its_epoch(folder, reference, num_workers):
    options = {"shuffle_buffer_size": 20, "interleave": 2}
    ref = reference(**options)
    first, saved = run(ranks(folder, 1, 1, **options), (0, 1), stop=(0, 3))
    (loader, dataset), = ranks(folder, 1, num_workers, **options)
    loader.load_state_dict(copy.deepcopy(saved))
    again = json.loads(json.dumps(loader.state_dict()))   # before iterating: the loaded state
    iterator = iter(loader)
    then = json.loads(json.dumps(loader.state_dict()))   # iterating, before the first batch: still it
    assert [[int(x) for x in b["id"]] for b in iterator] == [b for e, b in ref[3:] if e == 0]
    for state in (again, then):
        resumed = ranks(folder, 1, 0, **options)
        resumed[0][0].load_state_dict(copy.deepcopy(state))
        assert first + run(resumed, (0, 1))[0] == ref
    dataset.set_epoch(1)   # the next epoch starts whole
    assert [[int(x) for x in b["id"]] for b in loader] == [b for e, b in ref if e == 1]
    (wrong, wrong_dataset), = ranks(folder, 1, num_workers, **options)
    wrong.load_state_dict(copy.deepcopy(saved))
    wrong_dataset.set_epoch(1)
    with pytest.raises(StateMismatchError, match="set_epoch"):
        all_batches(wrong)   # (its workers ended at once)


def test_a_mixture_checkpoint_is_only_for_its_epoch(sources, mixture_reference):
    first, saved = run(mixture_ranks(sources, 1, 0), (0, 1), stop=(0, 2))
    (loader, mixture), = mixture_ranks(sources, 1, 2)
    loader.load_state_dict(copy.deepcopy(saved))
    assert first + run([(loader, mixture)], (0, 1))[0] == mixture_reference   # the next epoch starts whole
    (wrong, wrong_mixture), = mixture_ranks(sources, 1, 0)
    wrong.load_state_dict(copy.deepcopy(saved))
    wrong_mixture.set_epoch(1)
    with pytest.raises(StateMismatchError, match="set_epoch"):
        next(iter(wrong))


def test_chunks_of_parts_resume_from_inside_a_chunk(folder, reference):
    """With workers, each sends chunks of its parts (batches_per_transfer); a checkpoint between two batches of a
    chunk has every worker at its part of the last batch handed out, though the trainer holds parts of later ones."""
    options = {"shuffle_buffer_size": 20, "interleave": 2}
    ref = reference(**options)
    for stop in ((0, 4), (0, 6)):
        first, saved = run(ranks(folder, 2, 2, batches_per_transfer=3, **options), (0, 1), stop=stop)
        loaders = ranks(folder, 1, 2, batches_per_transfer=2, **options)
        loaders[0][0].load_state_dict(copy.deepcopy(saved))
        assert first + run(loaders, (0, 1))[0] == ref, stop


def test_check_resume_passes_a_canonical_pipeline_of_workers_and_of_a_mixture(folder, sources):
    """arrowstream.testing.check_resume, the public helper, on a canonical dataset with 2 workers (chunks of parts)
    and a canonical mixture."""
    import functools

    from arrowstream.testing import check_resume

    report = check_resume(functools.partial(make, folder, 2, 2, 1, shuffle_buffer_size=20, batches_per_transfer=2),
                          points=3, epochs=2)
    assert len(report.points) >= 4 and report.batches_compared > 0
    mixture = check_resume(lambda: mixture_ranks(sources, 1, 0)[0], points=2, epochs=2)
    assert len(mixture.points) >= 3 and mixture.batches_compared > 0


@pytest.mark.parametrize("delta", [1, -1])
def test_a_row_group_with_other_rows_than_announced_is_named_when_canonical_slots_share_it(tmp_path, monkeypatch,
                                                                                          delta):
    """Canonical slots that read parts of one row group cut them from the whole group decoded once (the unit cache):
    a group holding a row more or less than its metadata announced is a CorruptFileError naming the file, never a
    part cut short or a row lost."""
    from test_mix_announced import lie_about

    pq.write_table(pa.table({"id": np.arange(1000)}), tmp_path / "f.parquet", row_group_size=500)
    lie_about(monkeypatch, 1000, 0, delta)
    loader, _ = StructuredDataset.create_dataloader(path=str(tmp_path), batch_size=64, order="canonical",
                                                    canonical_slots=8, plan_cache=False)
    with pytest.raises(arrowstream.errors.CorruptFileError, match="f.parquet"):
        list(loader)


def test_a_checkpoint_inside_a_span_names_the_batches_past_each_state_and_resumes_after_them(folder, sources, reference,
                                                                                           mixture_reference):
    """A dataset's worker reads its canonical slots a span at a time and keeps one position of each per span: a
    checkpoint after a batch inside a span holds the states where the span started and the batches and rows past them
    (``canonical.past``), and a resume passes over those again, on any topology. A mixture's keeps a position after
    every batch (a state past them could not say its rows of each source): no ``past``."""
    for make_ranks, data, expected in ((ranks, folder, reference(shuffle_buffer_size=20)),
                                       (mixture_ranks, sources, mixture_reference)):
        options = {"shuffle_buffer_size": 20} if make_ranks is ranks else {}
        first, saved = run(make_ranks(data, 1, 0, **options), (0,), stop=(0, 3))
        (worker,) = worker_states(saved)
        head, canonical = worker["counters"], worker["canonical"]
        if make_ranks is ranks:
            assert [p["batches"] for p in canonical["past"]] == [3] * SLOTS   # inside the first span read
            assert all(state["counters"]["batches"] == 0 for state in canonical["states"])
            assert head["rows"] == sum(p["rows"] for p in canonical["past"]) == 3 * GLOBAL
        else:
            assert "past" not in canonical and all(s["counters"]["batches"] == 3 for s in canonical["states"])
        loaders = make_ranks(data, 2, 2, **options)   # another topology passes over them too
        for loader, _ in loaders:
            loader.load_state_dict(copy.deepcopy(saved))
        assert first + run(loaders, (0, 1))[0] == expected


def test_a_tampered_past_is_refused(folder):
    """``canonical.past`` tampered: refused at load where the state says it (its shape, its counters), and at the first
    batch where only the data can (rows or batches past a state that the data does not hold there); nothing lost."""
    _, saved = run(ranks(folder, 1, 0, shuffle_buffer_size=20), (0,), stop=(0, 3))

    def edited(edit):
        state = copy.deepcopy(saved)
        worker = next(worker_states(state))
        edit(worker, worker["canonical"]["past"])
        return state

    def more_rows(worker, past):   # the head says them too: only the data tells
        past[0]["rows"] += 1
        worker["counters"]["rows"] += 1

    def more_batches(worker, past):   # every canonical slot and the head one batch further: rows do not match
        for entry in past:
            entry["batches"] += 1
        worker["counters"]["batches"] += 1

    def past_the_epoch(worker, past):   # further than the epoch goes
        for entry in past:
            entry["batches"] += 1000
        worker["counters"]["batches"] += 1000

    for edit in (more_rows, more_batches, past_the_epoch):
        loader, dataset = make(folder, 1, 0, 0, shuffle_buffer_size=20)
        loader.load_state_dict(edited(edit))
        dataset.set_epoch(0)
        with pytest.raises(StateError, match=r"canonical slot 0 handed out \d+ batch\(es\) of \d+ row\(s\) past its "
                                             r"state, but the data holds"):
            next(iter(loader))

    at_load = [
        (lambda worker, past: past.pop(), r"canonical\.past holds 7 entries, its states 8"),
        (lambda worker, past: past[1].update(batches=2), (r"canonical\.states\[1\] stands at epoch 0, batch 2, the "
                                                          r"worker at epoch 0, batch 3")),
        (lambda worker, past: past[0].update(rows=past[0]["rows"] + 8), r"counters say \d+ rows"),
        (lambda worker, past: past[0].update(batches=5000), r"past\[0\]\.batches is 5000"),
        (lambda worker, past: past[0].update(batches=0), r"past\[0\] says 0 batch\(es\) and 24 row\(s\)"),
        (lambda worker, past: [p.update(batches=0, rows=0) for p in past], (r"stands at epoch 0, batch 0, the worker "
                                                                            r"at epoch 0, batch 3")),
    ]
    for edit, match in at_load:
        loader, _ = make(folder, 1, 0, 0, shuffle_buffer_size=20)
        with pytest.raises(StateError, match=match):
            loader.load_state_dict(edited(edit))
