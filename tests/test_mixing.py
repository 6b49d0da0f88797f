"""Weighted mixtures: quotas, passes, per-batch shares, exact resume, changing the mixture between epochs,
schemas, and refusals. The pure layout is property-tested in test_mix_plan.py."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import as_retired_mixture_worker, slow_collate

from arrowstream import Mixture, Source, errors
from arrowstream._state.versions import STATE_VERSION

WEIGHTS = {"big": 0.6, "small": 0.1, "mid": 0.3}
BASES = {"big": 0, "small": 100_000, "mid": 200_000}


FLOAT64, INT64 = pa.float64(), pa.int64()


def write_source(folder, base: int, rows: int, *, files: int = 2, group: int = 50, x_type=FLOAT64,
                 id_type=INT64) -> str:
    os.makedirs(folder, exist_ok=True)
    per = rows // files
    for f in range(files):
        count = per if f < files - 1 else rows - per * (files - 1)
        ids = list(range(base + f * per, base + f * per + count))
        pq.write_table(pa.table({"id": pa.array(ids, id_type), "x": pa.array([i * 0.5 for i in ids], x_type)}),
                       os.path.join(folder, f"part-{f}.parquet"), row_group_size=group)
    return str(folder)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    return {"big": Source(write_source(root / "big", BASES["big"], 1000)),
            "small": Source(write_source(root / "small", BASES["small"], 10, files=1)),
            "mid": Source(write_source(root / "mid", BASES["mid"], 300, x_type=pa.float32()))}


def loader_of(sources, num_workers=0, **kwargs):
    options = {"weights": WEIGHTS, "epoch_rows": 500, "batch_size": 32, "source_column": "src",
               "plan_cache": False, **kwargs}
    return Mixture.create_dataloader(sources=sources, num_workers=num_workers, **options)


def source_of(row_id: int) -> str:
    return max((base, name) for name, base in BASES.items() if base <= row_id)[1]


def epoch_batches(loader, mixture, epoch):
    mixture.set_epoch(epoch)
    return [(list(b["src"]), [int(i) for i in b["id"]]) for b in loader]


@pytest.mark.parametrize("num_workers,buffer", [(0, 0), (0, 64), (2, 0), (2, 64)])
def test_each_epoch_takes_the_quotas_exactly_and_each_batch_its_share(three, num_workers, buffer):
    loader, mixture = loader_of(three, num_workers, shuffle=True, shuffle_buffer_size=buffer)
    assert mixture.quotas() == {"big": 300, "small": 50, "mid": 150}
    per_slot = mixture.slot_quotas(num_workers)
    for epoch in range(2):
        batches = epoch_batches(loader, mixture, epoch)
        assert len(batches) == len(loader)
        assert Counter(s for names, _ in batches for s in names) == mixture.quotas()
        for names, ids in batches:
            assert [source_of(i) for i in ids] == names   # source_column names each row's source
        # per batch: each source within one row of its slot's proportion (the slot's quotas, summed over
        # slots, are the epoch's; batches come from the workers in turn)
        for index, (names, _) in enumerate(batches):
            quotas = per_slot[index % max(num_workers, 1)]
            total = sum(quotas.values())
            for name, quota in quotas.items():
                assert abs(names.count(name) - len(names) * quota / total) < 1 + 1e-9, (index, name, names)


def test_the_slots_quotas_are_balanced_and_sum_to_the_epoch(three):
    _, mixture = loader_of(three, 3)
    for epoch in range(4):
        per_slot = mixture.slot_quotas(3, epoch)
        for name, quota in mixture.quotas().items():
            shares = [q[name] for q in per_slot]
            assert sum(shares) == quota and max(shares) - min(shares) <= 2


def test_weights_none_reads_every_row_of_every_source_once_per_epoch(three):
    loader, mixture = Mixture.create_dataloader(sources=three, batch_size=64, num_workers=2, shuffle=True,
                                                plan_cache=False)
    assert mixture.quotas() == {"big": 1000, "small": 10, "mid": 300}
    for epoch in range(2):
        mixture.set_epoch(epoch)
        ids = [int(i) for b in loader for i in b["id"]]
        assert sorted(ids) == sorted(list(range(1000)) + list(range(100_000, 100_010)) + list(range(200_000, 200_300)))


def test_a_small_source_is_read_in_whole_passes_that_run_on_across_epochs(tmp_path):
    sources = {"small": Source(write_source(tmp_path / "s", 0, 10, files=1, group=4)),
               "large": Source(write_source(tmp_path / "l", 1_000_000, 10_000, files=2, group=1000))}
    loader, mixture = Mixture.create_dataloader(sources=sources, weights={"small": 0.013, "large": 0.987},
                                                epoch_rows=1000, batch_size=100, shuffle=True, seed=3,
                                                shuffle_buffer_size=7, plan_cache=False)
    assert mixture.quotas()["small"] == 13   # 13 rows an epoch: passes end inside epochs
    small = []
    for epoch in range(5):
        mixture.set_epoch(epoch)
        small += [int(i) for b in loader for i in b["id"] if int(i) < 1_000_000]
    assert len(small) == 65
    passes = [small[p * 10:(p + 1) * 10] for p in range(6)]
    for rows in passes[:6]:
        if len(rows) == 10:
            assert sorted(rows) == list(range(10))   # every row once per pass, before any row again
    assert passes[0] != passes[1]   # each pass has its own order
    assert mixture.passes(5)["small"] == (6, 5)


def test_passes_stay_whole_across_workers(tmp_path):
    sources = {"small": Source(write_source(tmp_path / "s", 0, 10, files=1, group=3)),
               "large": Source(write_source(tmp_path / "l", 1_000_000, 2000, files=2, group=200))}
    loader, mixture = Mixture.create_dataloader(sources=sources, weights={"small": 1, "large": 9}, epoch_rows=300,
                                                batch_size=20, num_workers=2, shuffle=True, plan_cache=False)
    seen: Counter[int] = Counter()
    for epoch in range(4):   # 30 rows of the small source an epoch: 3 passes each
        mixture.set_epoch(epoch)
        seen.update(int(i) for b in loader for i in b["id"] if int(i) < 1_000_000)
        assert set(seen.values()) == {3 * (epoch + 1)} and len(seen) == 10


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_is_exact_at_every_point_of_an_epoch(three, num_workers):
    options = {"shuffle": True, "shuffle_buffer_size": 40, "interleave": 2, "seed": 5}
    loader, mixture = loader_of(three, num_workers, **options)
    mixture.set_epoch(2)   # the small source's pass boundary falls inside this epoch
    reference = [(list(b["src"]), b["id"].tolist()) for b in loader]
    for point in (0, 1, 7, len(reference) - 1, len(reference)):
        loader, mixture = loader_of(three, num_workers, **options)
        mixture.set_epoch(2)
        it = iter(loader)
        for _ in range(point):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        fresh, _again = loader_of(three, num_workers, **options)
        fresh.load_state_dict(state)
        rest = [(list(b["src"]), b["id"].tolist()) for b in fresh]
        assert rest == reference[point:], point


def test_an_epoch_boundary_state_resumes_into_the_next_epoch(three):
    loader, mixture = loader_of(three, 2, shuffle=True)
    full = {e: epoch_batches(loader, mixture, e) for e in range(3)}
    loader, mixture = loader_of(three, 2, shuffle=True)
    epoch_batches(loader, mixture, 0)
    state = loader.state_dict()
    fresh, again = loader_of(three, 2, shuffle=True)
    fresh.load_state_dict(state)
    assert epoch_batches(fresh, again, 1) == full[1]
    assert epoch_batches(fresh, again, 2) == full[2]


def _positions(loader, mixture, epochs):
    """Rows of each source, in order, with one slot and no shuffle: a source's ids run on from pass to pass."""
    out: dict[str, list[int]] = {}
    for epoch in epochs:
        for names, ids in epoch_batches(loader, mixture, epoch):
            for name, i in zip(names, ids, strict=True):
                out.setdefault(name, []).append(i - BASES[name])
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
def test_weights_change_at_an_epoch_boundary_and_every_source_keeps_its_place(three, num_workers):
    loader, mixture = loader_of(three, num_workers)
    first = _positions(loader, mixture, [0])
    state = loader.state_dict()
    changed, remixed = loader_of(three, num_workers, weights={"big": 0.2, "small": 0.4, "mid": 0.4}, epoch_rows=200)
    changed.load_state_dict(state)
    assert remixed.quotas() == {"big": 40, "small": 80, "mid": 80}
    then = _positions(changed, remixed, [1, 2])
    # two epochs of the new quotas were read (an empty epoch after the load would pass the checks below)
    assert {name: len(then.get(name, [])) for name in ("big", "small", "mid")} == {"big": 80, "small": 160, "mid": 160}
    for name, rows in {"big": 1000, "small": 10, "mid": 300}.items():
        sequence = first[name] + then[name]
        passes, extra = divmod(len(sequence), rows)   # no row skipped, none twice before all once
        counts = Counter(Counter(sequence).get(row, 0) for row in range(rows))
        assert counts == (Counter({passes + 1: extra, passes: rows - extra}) - Counter()), name
        if not num_workers:   # one slot reads a pass in its order: here (no shuffle) the rows' own
            assert sequence == [p % rows for p in range(len(sequence))], name
    if num_workers:
        return
    # the loader's state after the change resumes like any other
    state = json.loads(json.dumps(changed.state_dict()))
    again, mixture_again = loader_of(three, weights={"big": 0.2, "small": 0.4, "mid": 0.4}, epoch_rows=200)
    again.load_state_dict(state)
    assert _positions(again, mixture_again, [3]) == _positions(changed, remixed, [3])


def test_a_source_added_starts_at_its_first_pass_and_one_removed_is_left_out(three, tmp_path):
    loader, mixture = loader_of(three)
    first = _positions(loader, mixture, [0])
    state = loader.state_dict()
    sources = {"big": three["big"], "mid": three["mid"],
               "new": Source(write_source(tmp_path / "new", 0, 50, files=1))}
    BASES_NEW = {"big": 0, "mid": 200_000, "new": 0}
    changed, remixed = Mixture.create_dataloader(sources=sources, weights={"big": 1, "mid": 1, "new": 2},
                                                 epoch_rows=100, batch_size=32, source_column="src", plan_cache=False)
    changed.load_state_dict(state)
    remixed.set_epoch(1)
    rows: dict[str, list[int]] = {}
    for b in changed:
        for name, i in zip(b["src"], b["id"].tolist(), strict=True):
            rows.setdefault(name, []).append(i - BASES_NEW[name])
    assert rows["new"] == list(range(50))
    assert rows["big"] == list(range(300, 325)) and rows["mid"] == list(range(150, 175))
    assert first["big"] == list(range(300))


def _kept_rows(loader, mixture, epoch, names):
    mixture.set_epoch(epoch)
    return Counter((name, int(i)) for b in loader for name, i in zip(b["src"], b["id"], strict=True) if name in names)


@pytest.mark.parametrize("num_workers,per_transfer,snapshot,epoch_rows", [
    (0, 1, 1, 500), (2, 1, 1, 500), (2, 4, 1, 500), (2, None, 1, 1024), (3, 2, 1, 500), (2, 1, 3, 500)],
    ids=["0-workers", "2-workers-1-per-transfer", "2-workers-4-per-transfer", "16-batches-a-worker", "3-workers",
         "snapshot-every-3"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_a_source_is_left_out_at_any_epoch_boundary_and_the_others_go_on(three, num_workers, per_transfer, snapshot,
                                                                       epoch_rows, shuffle):
    """A checkpoint taken after the loop is an epoch boundary, whichever batch a worker's last transfer or the
    last snapshot ended with (the last batch's state said the epoch was still going when a worker's batches
    were a multiple of its transfers, and a source left out was refused as if mid-epoch)."""
    from arrowstream._loader.torchdata_state import set_worker_state, worker_states

    options = {"shuffle": shuffle, "seed": 4, "epoch_rows": epoch_rows, "snapshot_every_n_steps": snapshot,
               **({} if per_transfer is None else {"batches_per_transfer": per_transfer})}
    loader, mixture = loader_of(three, num_workers, **options)
    mixture.set_epoch(0)
    assert len(list(loader)) == len(loader)
    state = json.loads(json.dumps(loader.state_dict()))
    reference, reference_mixture = loader_of(three, num_workers, **options)
    expected = _kept_rows(reference, reference_mixture, 1, {"big", "mid"})   # the uninterrupted run's epoch 1
    kept = {"big": three["big"], "mid": three["mid"]}
    # the same quotas for the sources kept: the same rows of each
    kept_weights = {"big": WEIGHTS["big"], "mid": WEIGHTS["mid"]}
    kept_rows = epoch_rows - mixture.quotas()["small"]
    # as this arrowstream writes it, and as earlier releases did (the last states not marked complete)
    unmarked = json.loads(json.dumps(state))
    for worker_id, worker in enumerate(worker_states(unmarked["dataloader"])):
        set_worker_state(unmarked["dataloader"], worker_id, {**worker, "epoch_complete": False})
    for saved in (state, unmarked):
        changed, remixed = loader_of(kept, num_workers, **{**options, "weights": kept_weights, "epoch_rows": kept_rows})
        changed.load_state_dict(saved)
        assert remixed.quotas() == {name: mixture.quotas()[name] for name in kept}
        assert remixed.epoch_starts(1) == {name: mixture.quotas()[name] for name in kept}
        assert _kept_rows(changed, remixed, 1, {"big", "mid"}) == expected
    # and a source added at the same boundary starts at its first pass beside them
    grown, grown_mixture = loader_of({**kept, "new": three["small"]}, num_workers,
                                     **{**options, "weights": {**kept_weights, "new": 0.1}, "epoch_rows": epoch_rows})
    grown.load_state_dict(state)
    assert grown_mixture.epoch_starts(1) == {"big": mixture.quotas()["big"], "mid": mixture.quotas()["mid"], "new": 0}
    rows = _kept_rows(grown, grown_mixture, 1, {"big", "mid", "new"})
    assert Counter({k: v for k, v in rows.items() if k[0] != "new"}) == expected
    assert sum(v for k, v in rows.items() if k[0] == "new") == grown_mixture.quotas()["new"]


def test_a_source_left_out_of_a_lagging_state_at_the_end_of_a_replanned_epoch_is_refused_saying_why(three):
    """The one boundary where a source cannot be left out: the workers' snapshots lag behind the end of an epoch
    re-planned for another topology, and the rows the source gave that epoch cannot be counted without it."""
    options = {"shuffle": True, "snapshot_every_n_steps": 5}
    loader, mixture = loader_of(three, 2, shuffle=True, batches_per_transfer=1)   # (snapshots after every batch)
    mixture.set_epoch(0)
    batches = iter(loader)
    for _ in range(4):
        next(batches)
    inside = json.loads(json.dumps(loader.state_dict()))
    del batches
    replanned, replanned_mixture = loader_of(three, 3, **options)
    replanned.load_state_dict(inside)
    replanned_mixture.set_epoch(0)
    list(replanned)
    state = json.loads(json.dumps(replanned.state_dict()))
    assert state["dataloader"]["_steps_since_snapshot"] > 0   # the case under test
    kept = {"big": three["big"], "mid": three["mid"]}
    fewer, _ = loader_of(kept, 3, **options, weights={"big": 0.6, "mid": 0.3}, epoch_rows=450)
    with pytest.raises(errors.StateMismatchError, match=r"ends mixture epoch 0, which was re-planned for its topology, "
                                                        r"with source\(s\) \['small'\] that this mixture lacks.*"
                                                        "resume with the saved mixture for one epoch"):
        fewer.load_state_dict(state)
    same, same_mixture = loader_of(three, 3, **options)
    same.load_state_dict(state)
    assert len(epoch_batches(same, same_mixture, 1)) == len(same)


def test_another_mixture_is_refused_inside_an_epoch_naming_saved_and_current(three):
    loader, mixture = loader_of(three)
    mixture.set_epoch(0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other, _ = loader_of(three, weights={"big": 0.2, "small": 0.4, "mid": 0.4})
    with pytest.raises(errors.StateMismatchError, match=r"inside mixture epoch 0.*big: quota 300.*big: quota 100.*finish"):
        other.load_state_dict(state)
    fewer, _ = loader_of({"big": three["big"], "mid": three["mid"]}, weights={"big": 0.5, "mid": 0.5})
    with pytest.raises(errors.StateMismatchError, match=r"source\(s\) \[.small.\] that this mixture lacks: finish"):
        fewer.load_state_dict(state)
    bigger_batches, _ = loader_of(three, batch_size=16)
    with pytest.raises(errors.StateMismatchError, match="batch_size: saved 32, current 16"):
        bigger_batches.load_state_dict(state)


def _tampered(state, edit):
    state = json.loads(json.dumps(state))
    edit(state["dataloader"]["dataset_state"])
    return state


@pytest.mark.parametrize("edit", [
    lambda s: s["counters"].update(rows=s["counters"]["rows"] + 1),
    lambda s: s["counters"].update(batches=s["counters"]["batches"] + 3),
    lambda s: s["sources"]["big"].update(taken=s["sources"]["big"]["taken"] + 5),
    lambda s: s["sources"]["small"].update(segment=40),
    lambda s: s["sources"]["big"].update(start=7),
    lambda s: s.update(kind="arrowstream.mixture_worker"),   # the retired kind's name on a state of this version
    lambda s: s.update(version=99),
    lambda s: s["slot"].update(worker_id=1),
    lambda s: s.pop("sources"),
    lambda s: s["options"].update(batch_order="shuffled"),
    lambda s: s["options"].update(batch_order=None),
], ids=["rows", "batches", "taken", "segment", "start", "kind", "version", "slot", "no-sources", "batch-order",
        "batch-order-null"])
def test_a_tampered_state_is_refused(three, edit):
    loader, mixture = loader_of(three, shuffle=True)
    mixture.set_epoch(0)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = _tampered(loader.state_dict(), edit)
    fresh, _ = loader_of(three, shuffle=True)
    with pytest.raises(errors.StateError):
        fresh.load_state_dict(state)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_shuffle_buffer_spreads_each_source_evenly_over_its_batches(three, num_workers):
    """With a shuffle buffer a batch's sources are spread evenly (each batch's shares in even_order), each
    source's rows in its window's order; without one, the sources come one after another."""
    from arrowstream._mixing.span import even_order

    names = list(WEIGHTS)
    for buffer in (64, 0):
        loader, mixture = loader_of(three, num_workers, shuffle=True, shuffle_buffer_size=buffer)
        assert mixture.state_dict()["options"]["batch_order"] == "even"
        for sources, _ in epoch_batches(loader, mixture, 0):
            shares = tuple(sources.count(name) for name in names)
            laid_out = [name for name, count in zip(names, shares) for _ in range(count)]
            if buffer:
                assert sources == [laid_out[i] for i in even_order(shares)]
            else:
                assert sources == laid_out


def test_a_refused_checkpoint_leaves_the_order_inside_batches_as_it_was(three):
    """A state of version 2 (its batches in seeded permutations) refused for another batch size: the
    loader goes on spreading the sources evenly, as if it had not been offered."""
    loader, mixture = loader_of(three, shuffle=True, shuffle_buffer_size=64)
    mixture.set_epoch(0)
    it = iter(loader)
    next(it)
    state = _tampered(loader.state_dict(), lambda s: as_retired_mixture_worker(s, 2))
    other, other_mixture = loader_of(three, shuffle=True, shuffle_buffer_size=64, batch_size=16)
    expected = epoch_batches(*loader_of(three, shuffle=True, shuffle_buffer_size=64, batch_size=16), 0)
    with pytest.raises(errors.StateMismatchError, match="batch_size: saved 32, current 16"):
        other.load_state_dict(state)
    assert epoch_batches(other, other_mixture, 0) == expected


def test_a_worker_state_refused_by_the_mixture_itself_leaves_its_order_as_it_was(three):
    """The same through ``Mixture.load_state_dict`` (a plain StatefulDataLoader's path)."""
    loader, mixture = loader_of(three, shuffle=True, shuffle_buffer_size=64)
    mixture.set_epoch(0)
    it = iter(loader)
    next(it)
    state = _tampered(loader.state_dict(), lambda s: as_retired_mixture_worker(s, 2))
    _, other = loader_of(three, shuffle=True, shuffle_buffer_size=64, batch_size=16)
    with pytest.raises(errors.StateMismatchError, match="batch_size: saved 32, current 16"):
        other.load_state_dict(state["dataloader"]["dataset_state"])
    assert other.state_dict()["options"]["batch_order"] == "even"


def test_safe_casts_make_one_schema_and_other_types_are_refused(tmp_path):
    a = write_source(tmp_path / "a", 0, 20, files=1, x_type=pa.float32(), id_type=pa.int32())
    b = write_source(tmp_path / "b", 100, 20, files=1)
    loader, mixture = Mixture.create_dataloader(sources={"a": Source(a), "b": Source(b)}, batch_size=8,
                                                output_format="arrow", plan_cache=False)
    assert mixture.schema == pa.schema([("id", pa.int64()), ("x", pa.float64())])
    batches = list(loader)
    assert all(batch.schema == mixture.schema for batch in batches)
    assert sorted(i for batch in batches for i in batch.column("id").to_pylist()) == list(range(20)) + list(range(100, 120))
    os.makedirs(tmp_path / "c")
    pq.write_table(pa.table({"id": pa.array(["a"] * 5), "x": pa.array([1.0] * 5)}), tmp_path / "c" / "c.parquet")
    with pytest.raises(errors.SchemaMismatchError, match=r"column 'id' is int32 in source 'a' and string in source 'c'"):
        Mixture(sources={"a": Source(a), "c": Source(str(tmp_path / "c"))}, plan_cache=False)
    with pytest.raises(errors.SchemaMismatchError, match=r"'c' lacks \['x'\]"):
        Mixture(sources={"a": Source(a), "c": Source(str(tmp_path / "c"), columns=["id"])}, plan_cache=False)
    os.makedirs(tmp_path / "s")
    pq.write_table(pa.table({"id": pa.array(["a"]), "x": pa.array([1.0])}), tmp_path / "s" / "s.parquet")
    os.makedirs(tmp_path / "ls")
    pq.write_table(pa.table({"id": pa.array(["b"], pa.large_string()), "x": pa.array([2.0])}), tmp_path / "ls" / "l.parquet")
    _, strings = Mixture.create_dataloader(sources={"s": Source(str(tmp_path / "s")), "l": Source(str(tmp_path / "ls"))},
                                           plan_cache=False)
    assert strings.schema.field("id").type == pa.large_string()
    # string_view (what Polars and DuckDB may write) and string both hold in large_string: no type of the two holds
    # the other's, yet the values are the same kind
    os.makedirs(tmp_path / "v")
    pq.write_table(pa.table({"id": pa.array(["v", None], pa.string_view()), "x": pa.array([3.0, 4.0])}),
                   tmp_path / "v" / "v.parquet")
    assert pq.read_schema(tmp_path / "v" / "v.parquet").field("id").type == pa.string_view()
    loader, views = Mixture.create_dataloader(sources={"s": Source(str(tmp_path / "s")), "v": Source(str(tmp_path / "v"))},
                                              batch_size=2, output_format="arrow", plan_cache=False)
    assert views.schema.field("id").type == pa.large_string()
    assert Counter(pa.Table.from_batches(list(loader)).column("id").to_pylist()) == Counter(["a", "v", None])
    with pytest.raises(errors.SchemaMismatchError, match=r"is int32 in source 'a' and string_view in source 'v'.*"
                                                         r"no safe cast brings both to one type"):
        Mixture(sources={"a": Source(a, columns=["id"]), "v": Source(str(tmp_path / "v"), columns=["id"])},
                plan_cache=False)
    # ints of both signs: the narrowest int that holds both (int8 and uint8: int16), values intact; uint64 has none
    for name, kind, values in (("i8", pa.int8(), [-128, 127]), ("u8", pa.uint8(), [0, 255]), ("u64", pa.uint64(), [2**64 - 1, 0])):
        os.makedirs(tmp_path / name)
        pq.write_table(pa.table({"n": pa.array(values, kind)}), tmp_path / name / "p.parquet")
    loader, ints = Mixture.create_dataloader(sources={"i8": Source(str(tmp_path / "i8")), "u8": Source(str(tmp_path / "u8"))},
                                             batch_size=4, output_format="arrow", plan_cache=False)
    assert ints.schema.field("n").type == pa.int16()
    assert sorted(pa.Table.from_batches(list(loader)).column("n").to_pylist()) == [-128, 0, 127, 255]
    with pytest.raises(errors.SchemaMismatchError, match=r"is int8 in source 'i8' and uint64 in source 'u64'"):
        Mixture(sources={"i8": Source(str(tmp_path / "i8")), "u64": Source(str(tmp_path / "u64"))}, plan_cache=False)


def _nullability_sources(tmp_path):
    """Two sources of the same columns, one with no field nullable (at any depth), one with every field nullable
    and nulls inside its struct and its lists."""
    struct, items = pa.struct([pa.field("c", pa.int64(), nullable=False)]), pa.list_(pa.field("e", pa.int64(), False))
    strict = pa.schema([pa.field("x", pa.int64(), False), pa.field("s", struct, False), pa.field("l", items, False)])
    loose = pa.schema([("x", pa.int64()), ("s", pa.struct([("c", pa.int64())])), ("l", pa.list_(pa.int64()))])
    for name, schema, ids in (("strict", strict, range(20)), ("loose", loose, range(100, 120))):
        os.makedirs(tmp_path / name)
        pq.write_table(pa.table({"x": list(ids), "s": [{"c": None if i % 7 == 3 and schema is loose else i} for i in ids],
                                 "l": [[i, None] if i % 5 == 1 and schema is loose else [i] for i in ids]}, schema=schema),
                       tmp_path / name / "p.parquet", row_group_size=5)
    assert pq.read_schema(tmp_path / "strict" / "p.parquet").field("s").type == struct
    return {"strict": Source(str(tmp_path / "strict")), "loose": Source(str(tmp_path / "loose"))}


@pytest.mark.parametrize("output_format", ["torch", "numpy", "arrow", "dict"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_sources_that_differ_in_nullability_mix_as_nullable_with_their_values(tmp_path, output_format, num_workers):
    sources = _nullability_sources(tmp_path)
    expected = Counter((i, None if i % 7 == 3 and i >= 100 else i, (i, None) if i % 5 == 1 and i >= 100 else (i,))
                       for i in [*range(20), *range(100, 120)])
    for buffer in (0, 8):
        loader, mixture = Mixture.create_dataloader(sources=sources, batch_size=6, output_format=output_format,
                                                    shuffle=True, seed=3, shuffle_buffer_size=buffer,
                                                    num_workers=num_workers, plan_cache=False)
        assert mixture.schema == pa.schema([("x", pa.int64()), ("s", pa.struct([("c", pa.int64())])),
                                            ("l", pa.list_(pa.int64()))])   # nullable where one source is
        got: Counter = Counter()
        for batch in loader:
            if output_format == "arrow":
                assert batch.schema == mixture.schema
                batch = batch.to_pydict()
            got.update((int(x), s["c"], tuple(items)) for x, s, items in zip(batch["x"], batch["s"], batch["l"],
                                                                               strict=True))
        assert got == expected, buffer
    # not nullable where no source is
    _, strict = Mixture.create_dataloader(sources={"a": sources["strict"], "b": sources["strict"]}, plan_cache=False)
    assert not strict.schema.field("x").nullable and strict.schema.field("s").type == pq.read_schema(
        sources["strict"].path + "/p.parquet").field("s").type


def test_nested_types_that_differ_beyond_nullability_are_refused_naming_both_sources(tmp_path):
    for name, kind in (("a", pa.struct([pa.field("c", pa.int64(), False)])), ("b", pa.struct([("d", pa.int64())])),
                       ("w", pa.struct([("c", pa.int32())])), ("f", pa.list_(pa.field("e", pa.int64(), False), 2)),
                       ("g", pa.list_(pa.int64(), 3))):
        os.makedirs(tmp_path / name)
        value = [1, 2] if name == "f" else [1, 2, 3] if name == "g" else {kind.field(0).name: 1}
        pq.write_table(pa.table({"s": pa.array([value], kind)}), tmp_path / name / "p.parquet")
    fixed = r"fixed_size_list<element: int64 not null>\[2\] in source 'f' and fixed_size_list<element: int64>\[3\]"
    for first, second, match in (("a", "b", "struct<c: int64 not null> in source 'a' and struct<d: int64> in source 'b'"),
                                 ("a", "w", "struct<c: int64 not null> in source 'a' and struct<c: int32> in source 'w'"),
                                 ("f", "g", fixed + " in source 'g'")):
        with pytest.raises(errors.SchemaMismatchError, match=rf"column 's' is {match}.*no safe cast"):
            Mixture(sources={first: Source(str(tmp_path / first)), second: Source(str(tmp_path / second))},
                    plan_cache=False)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"weights": {"big": 1}}, errors.InvalidArgumentError, "one weight per source"),
    ({"weights": {"big": -1, "small": 1, "mid": 1}}, errors.InvalidArgumentError, "finite number >= 0"),
    ({"weights": {"big": 0, "small": 0, "mid": 0}}, errors.InvalidArgumentError, "every weight is 0"),
    ({"weights": [1, 2, 3]}, errors.ArgumentTypeError, "weights"),
    ({"epoch_rows": 0}, errors.InvalidArgumentError, "epoch_rows"),
    ({"source_column": "id"}, errors.InvalidArgumentError, "already a column"),
    ({"sources": {}}, errors.ArgumentTypeError, "non-empty dict"),
    ({"sources": {"a": "data/"}}, errors.ArgumentTypeError, "arrowstream.Source"),
    ({"sources": "x"}, errors.ArgumentTypeError, "sources"),
    ({"bogus": 1}, errors.ArgumentTypeError, "unknown keyword"),
], ids=["names", "negative", "zeros", "type", "epoch_rows", "column", "empty", "spec", "not-a-dict", "unknown"])
def test_bad_arguments_are_refused_by_name(three, kwargs, error, match):
    options = {"sources": three, "weights": WEIGHTS, "plan_cache": False, **kwargs}
    with pytest.raises(error, match=match):
        Mixture.create_dataloader(**options)


def test_numpy_and_other_real_weights_are_taken_as_numbers(three):
    plain = Mixture(sources=three, weights={"big": 6, "small": 1, "mid": 3}, epoch_rows=500, plan_cache=False)
    for weights in ({"big": np.float32(0.6), "small": np.float32(0.1), "mid": np.float32(0.3)},
                    {"big": np.int64(6), "small": np.uint8(1), "mid": np.int32(3)},
                    {"big": np.float16(6), "small": np.longdouble(1), "mid": 3.0}):
        mixture = Mixture(sources=three, weights=weights, epoch_rows=500, plan_cache=False)
        assert mixture.quotas() == plain.quotas() == {"big": 300, "small": 50, "mid": 150}
    zero = Mixture(sources=three, weights={"big": np.float64(1), "small": np.int64(0), "mid": 0.0}, epoch_rows=50,
                   plan_cache=False)
    assert zero.quotas() == {"big": 50, "small": 0, "mid": 0}


@pytest.mark.parametrize("weight,error,match", [
    (True, errors.ArgumentTypeError, r"weight of 'small' is True \(bool\); expected a real number"),
    (np.bool_(True), errors.ArgumentTypeError, r"weight of 'small' is np.True_ \(bool\)"),
    ("1", errors.ArgumentTypeError, r"weight of 'small' is '1' \(str\)"),
    (1 + 0j, errors.ArgumentTypeError, r"\(complex\)"),
    (float("nan"), errors.InvalidArgumentError, r"weight of 'small' is nan; expected a finite number >= 0"),
    (np.float32("nan"), errors.InvalidArgumentError, r"is np.float32\(nan\); expected a finite number"),
    (float("inf"), errors.InvalidArgumentError, r"is inf; expected a finite number"),
    (10**400, errors.InvalidArgumentError, r"is <int of 1329 bits>; expected a finite number"),
    (-1, errors.InvalidArgumentError, r"is -1; expected a finite number >= 0"),
    (np.int8(-1), errors.InvalidArgumentError, r"is np.int8\(-1\); expected a finite number >= 0"),
], ids=["bool", "numpy-bool", "str", "complex", "nan", "numpy-nan", "inf", "huge", "negative", "numpy-negative"])
def test_weights_that_are_no_finite_number_are_refused_by_name(three, weight, error, match):
    with pytest.raises(error, match=match):
        Mixture(sources=three, weights={"big": 1, "small": weight, "mid": 1}, plan_cache=False)
    with pytest.raises(errors.InvalidArgumentError, match="every weight is 0"):
        Mixture(sources=three, weights={"big": np.float32(0), "small": np.int64(0), "mid": 0}, plan_cache=False)


@pytest.mark.parametrize("weight", [0, 1, None], ids=["weight-0", "weight-1", "weights-none"])
def test_a_source_with_no_rows_is_refused_by_its_name_whatever_its_weight(three, tmp_path, weight):
    os.makedirs(tmp_path / "rowless")
    pq.write_table(pa.table({"id": pa.array([], pa.int64()), "x": pa.array([], pa.float64())}),
                   tmp_path / "rowless" / "p.parquet")
    os.makedirs(tmp_path / "lines")
    (tmp_path / "lines" / "p.jsonl").write_text("")
    os.makedirs(tmp_path / "nothing")
    weights = None if weight is None else {"big": 1, "empty": weight}
    for empty, fmt in ((tmp_path / "rowless", "parquet"), (tmp_path / "lines", "jsonl"), (tmp_path / "nothing", "parquet")):
        with pytest.raises(errors.EmptyDatasetError, match=r"^sources\['empty'\]: path: .*: leave 'empty' out of "
                                                           r"sources and weights until it has rows"):
            Mixture.create_dataloader(sources={"big": three["big"], "empty": Source(str(empty), format=fmt)},
                                      weights=weights, batch_size=8, plan_cache=False)
    with pytest.raises(errors.DatasetNotFoundError, match=r"^sources\['gone'\]: path: .* does not exist"):
        Mixture(sources={"big": three["big"], "gone": Source(str(tmp_path / "gone"))}, plan_cache=False)


def test_a_filter_is_refused_because_quotas_are_counted_before_reading(three, tmp_path):
    import pyarrow.compute as pc

    filtered = {**three, "big": Source(three["big"].path, filter=pc.field("id") > 10)}
    with pytest.raises(errors.InvalidArgumentError) as raised:
        Mixture(sources=filtered, plan_cache=False)
    assert type(raised.value) is errors.InvalidArgumentError
    assert re.match(r"sources\['big'\]: a filter .* makes the rows a source gives unknown before reading, and a "
                    r"mixture's quotas, passes and per-batch shares are counted from metadata before the epoch "
                    r"starts; filter the data beforehand .*or filter in transform=", str(raised.value))


def test_assignment_static_is_what_a_mixture_does(three):
    loader, mixture = loader_of(three, shuffle=True, assignment="static")
    reference, reference_mixture = loader_of(three, shuffle=True)
    assert epoch_batches(loader, mixture, 0) == epoch_batches(reference, reference_mixture, 0)
    assert Mixture(three, plan_cache=False, assignment="static").names == ["big", "small", "mid"]


def test_assignment_dynamic_is_refused_with_the_reason(three):
    reason = r"each batch's share of every source is fixed per worker slot"
    with pytest.raises(errors.InvalidArgumentError, match=rf"^assignment: a Mixture takes assignment='static' only, "
                                                          rf"got 'dynamic': {reason} .*read_ahead or num_workers"):
        loader_of(three, num_workers=2, assignment="dynamic")
    with pytest.raises(errors.InvalidArgumentError, match=reason):
        Mixture(three, plan_cache=False, assignment="dynamic")


@pytest.mark.parametrize(("value", "error"), [("lpt", errors.InvalidArgumentError), (None, errors.ArgumentTypeError)])
def test_an_unknown_assignment_gets_a_datasets_error(three, value, error):
    from arrowstream import StructuredDataset

    with pytest.raises(error) as dataset_error:
        StructuredDataset(three["big"].path, assignment=value, plan_cache=False)
    with pytest.raises(error) as mixture_error:
        loader_of(three, assignment=value)
    assert type(mixture_error.value) is type(dataset_error.value)
    assert str(mixture_error.value) == str(dataset_error.value)


def test_in_order_false_is_refused_with_the_reason(three):
    with pytest.raises(errors.InvalidArgumentError) as raised:
        loader_of(three, num_workers=2, in_order=False)
    assert type(raised.value) is errors.InvalidArgumentError
    assert re.match(r"in_order: a MixtureDataLoader does not take in_order=False: its checkpoint names each worker's "
                    r"place by torchdata's round robin, so batches handed out ahead of their turn would be read again "
                    r"or lost by a resume .* Leave in_order at True: .*raise prefetch_factor", str(raised.value))
    assert "yet" not in str(raised.value).split()


def test_ranks_split_every_quota_between_them_with_equal_batches(three):
    rows: Counter[str] = Counter()
    ids: list[int] = []
    lengths = []
    for rank in range(3):
        loader, mixture = loader_of(three, 2, rank=rank, world_size=3, plan_locally=True, shuffle=True)
        batches = epoch_batches(loader, mixture, 1)
        lengths.append((len(batches), len(loader)))
        rows.update(s for names, _ in batches for s in names)
        ids += [i for _, batch in batches for i in batch]
    assert len({n for n, _ in lengths}) == 1 and all(n == m for n, m in lengths)
    large = [i for i in ids if source_of(i) != "small"]   # the small source gives 5 passes an epoch
    assert len(large) == len(set(large))
    quotas = mixture.quotas()
    trimmed = sum(quotas.values()) - sum(rows.values())
    assert all(rows[name] <= quotas[name] for name in quotas) and trimmed < 3 * 2 * mixture.batch_size


def test_workers_change_at_an_epoch_boundary(three):
    loader, mixture = loader_of(three, 2, shuffle=True)
    epoch_batches(loader, mixture, 0)
    state = json.loads(json.dumps(loader.state_dict()))
    three_workers, mixture3 = loader_of(three, 3, shuffle=True)
    three_workers.load_state_dict(state)
    assert epoch_batches(three_workers, mixture3, 0) == []   # the saved epoch is over
    reference, reference_mixture = loader_of(three, 3, shuffle=True)
    assert epoch_batches(three_workers, mixture3, 1) == epoch_batches(reference, reference_mixture, 1)


def test_ranks_change_at_an_epoch_boundary_through_a_merged_checkpoint(three):
    import arrowstream

    states = []
    for rank in range(3):
        loader, mixture = loader_of(three, 2, rank=rank, world_size=3, plan_locally=True, shuffle=True)
        epoch_batches(loader, mixture, 0)
        states.append(loader.state_dict())
    merged = json.loads(json.dumps(arrowstream.merge_state_dicts(states)))
    assert (merged["kind"], merged["version"], len(merged["ranks"])) == ("arrowstream.checkpoint", STATE_VERSION, 3)
    assert {state["kind"] for state in merged["ranks"]} == {"arrowstream.loader"}
    assert {state["reads"] for state in merged["ranks"]} == {"mixture"}
    for rank in range(2):
        loader, mixture = loader_of(three, 2, rank=rank, world_size=2, plan_locally=True, shuffle=True)
        loader.load_state_dict(merged)
        reference, reference_mixture = loader_of(three, 2, rank=rank, world_size=2, plan_locally=True, shuffle=True)
        assert epoch_batches(loader, mixture, 1) == epoch_batches(reference, reference_mixture, 1)
    same, mixture = loader_of(three, 2, rank=1, world_size=3, plan_locally=True, shuffle=True)
    same.load_state_dict(merged)   # the same topology takes its own rank's part
    assert epoch_batches(same, mixture, 0) == []
    with pytest.raises(errors.StateMismatchError, match="no state for rank"):
        arrowstream.merge_state_dicts(states[:2])


def test_an_iceberg_table_and_files_in_one_mixture(tmp_path):
    from iceberg_tables import add_position_deletes, make_catalog

    from arrowstream import IcebergSource

    catalog, config = make_catalog(str(tmp_path / "iceberg"))
    data = pa.table({"id": pa.array(range(500_000, 500_400), pa.int64()),
                     "x": pa.array([0.5 * i for i in range(500_000, 500_400)], pa.float32())})
    table = catalog.create_table("db.events", schema=data.schema)
    table.append(data)
    (data_file,) = [task.file.file_path for task in table.scan().plan_files()]
    add_position_deletes(table, {data_file: [0, 1, 2, 399]})   # 396 rows left
    sources = {"files": Source(write_source(tmp_path / "files", 0, 200)),
               "table": IcebergSource("db.events", catalog_config=config)}
    loader, mixture = Mixture.create_dataloader(sources=sources, weights={"files": 1, "table": 1}, epoch_rows=300,
                                                batch_size=20, num_workers=2, source_column="src", shuffle=True,
                                                plan_cache=False)
    assert mixture.source_rows() == {"files": 200, "table": 396}
    assert mixture.schema.field("x").type == pa.float64()   # float32 of the table widened to the files' float64
    seen: Counter[str] = Counter()
    table_ids: list[int] = []
    for epoch in range(2):
        mixture.set_epoch(epoch)
        for batch in loader:
            seen.update(batch["src"])
            table_ids += [int(i) for i, s in zip(batch["id"], batch["src"], strict=True) if s == "table"]
    assert seen == {"files": 300, "table": 300}
    assert len(table_ids) == 300 and set(table_ids) <= set(range(500_003, 500_399))   # deleted rows never come
    assert len(set(table_ids)) == 300   # 300 of the table's 396 rows: no row twice inside a pass
    mixture.set_epoch(2)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [b["id"].tolist() for b in it]
    fresh, _ = Mixture.create_dataloader(sources=sources, weights={"files": 1, "table": 1}, epoch_rows=300,
                                         batch_size=20, num_workers=2, source_column="src", shuffle=True,
                                         plan_cache=False)
    fresh.load_state_dict(state)
    assert [b["id"].tolist() for b in fresh] == rest


@pytest.mark.parametrize("num_workers", [0, 2])
def test_metrics_count_rows_per_source_and_per_worker(three, num_workers):
    loader, mixture = loader_of(three, num_workers, shuffle=True)
    for epoch in range(2):
        epoch_batches(loader, mixture, epoch)
    metrics = loader.metrics()
    assert {name: metrics[f"rows/{name}"] for name in mixture.names} == {n: 2 * q for n, q in mixture.quotas().items()}
    assert metrics["rows"] == 1000 and metrics["batches"] == 2 * len(loader)
    assert len(metrics["workers"]) == max(num_workers, 1)
    for name in mixture.names:
        assert sum(line[f"rows/{name}"] for line in metrics["workers"]) == metrics[f"rows/{name}"]
    flat = loader.metrics(flat=True)
    assert flat["rank0/worker0/rows/small"] == metrics["workers"][0]["rows/small"]


def test_a_collate_fn_in_a_mixtures_worker_counts_as_converting(three):
    loader, mixture = loader_of(three, 1, collate_fn=slow_collate)
    assert sum(len(ids) for _, ids in epoch_batches(loader, mixture, 0)) == 500
    (worker,) = loader.metrics()["workers"]
    assert worker["convert_s"] >= 0.01 * len(loader)   # each batch's collate, in the worker after the hand-over


def test_a_persistent_worker_killed_between_epochs_is_named_and_the_epoch_starts_again_whole(three):
    import signal

    loader, mixture = loader_of(three, 2, shuffle=True, persistent_workers=True)
    epoch_batches(loader, mixture, 0)
    victim = loader._iterator._workers[0]
    os.kill(victim.pid, signal.SIGKILL)
    time.sleep(0.5)
    mixture.set_epoch(1)
    with pytest.raises(errors.WorkerError, match=rf"worker 0 \(pid {victim.pid}\) died .*epoch 1"):
        iter(loader)
    fresh, fresh_mixture = loader_of(three, 2, shuffle=True)
    assert epoch_batches(loader, mixture, 1) == epoch_batches(fresh, fresh_mixture, 1)


def test_merged_metrics_of_ranks_add_the_rows_of_each_source(three):
    """What gather_metrics returns on every rank (it all-gathers, then merges): the ranks' rows of each source
    added, each rank's own in ``ranks``."""
    import arrowstream
    from arrowstream._worker.metrics import merge

    per_rank, seen = [], Counter()
    for rank in range(2):
        loader, mixture = loader_of(three, rank=rank, world_size=2, shuffle=True)
        for names, _ in epoch_batches(loader, mixture, 0):
            seen.update(names)
        per_rank.append(loader.metrics())
    merged = merge(per_rank)
    assert {name: merged[f"rows/{name}"] for name in mixture.names} == dict(seen) == mixture.quotas()
    assert all(merged[f"rows/{name}"] == sum(m[f"rows/{name}"] for m in per_rank) for name in mixture.names)
    assert arrowstream.gather_metrics(per_rank[0])["rows/big"] == per_rank[0]["rows/big"]   # one process: its own


@pytest.mark.parametrize("num_workers", [2])
def test_a_source_on_s3_beside_local_files_with_read_ahead(three, s3_server, tmp_path, num_workers):
    fs = s3_server.filesystem()
    remote = s3_server.url(f"mix-{num_workers}")
    local = write_source(tmp_path / "remote", 300_000, 400, files=2, group=40)
    for name in sorted(os.listdir(local)):
        fs.put(os.path.join(local, name), f"{remote}/{name}")
    sources = {"big": three["big"], "s3": Source(remote, storage_options=s3_server.storage_options)}
    make = lambda: Mixture.create_dataloader(
        sources=sources, weights={"big": 1, "s3": 1}, epoch_rows=600, batch_size=25, num_workers=num_workers,
        source_column="src", shuffle=True, read_ahead=2, plan_cache=False)
    loader, mixture = make()
    mixture.set_epoch(0)
    ids = [(s, int(i)) for b in loader for s, i in zip(b["src"], b["id"], strict=True)]
    assert Counter(s for s, _ in ids) == {"big": 300, "s3": 300}
    assert len({i for s, i in ids if s == "s3"}) == 300 and all(300_000 <= i < 300_400 for s, i in ids if s == "s3")
    text = json.dumps(loader.state_dict())
    secrets = [v for v in s3_server.storage_options.values() if isinstance(v, str)]
    assert secrets and not [v for v in secrets if v in text]   # no credentials in the state
    mixture.set_epoch(1)
    it = iter(loader)
    next(it)
    saved = json.loads(json.dumps(loader.state_dict()))
    rest = [b["id"].tolist() for b in it]
    fresh, _ = make()
    fresh.load_state_dict(saved)
    assert [b["id"].tolist() for b in fresh] == rest


def _rows(batches):
    return Counter((s, i) for names, ids in batches for s, i in zip(names, ids, strict=True))


ELASTIC = {"shuffle": True, "shuffle_buffer_size": 40, "interleave": 2, "seed": 9}


@pytest.mark.parametrize("old,new,stop", [(2, 3, 3), (3, 2, 4), (0, 2, 5), (2, 0, 2)])
def test_elastic_resume_mid_epoch_reads_the_rest_of_the_epoch_once(three, old, new, stop):
    loader, mixture = loader_of(three, old, **ELASTIC)
    whole = epoch_batches(loader, mixture, 1)
    loader, mixture = loader_of(three, old, **ELASTIC)
    mixture.set_epoch(1)
    it = iter(loader)
    before = [(list(b["src"]), b["id"].tolist()) for b in (next(it) for _ in range(stop))]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    resumed, again = loader_of(three, new, **ELASTIC)
    resumed.load_state_dict(state)
    with pytest.raises(errors.StateMismatchError, match="set_epoch\\(1\\) to finish it"):
        again.set_epoch(2)
        iter(resumed)
    again.set_epoch(1)
    rest = [(list(b["src"]), b["id"].tolist()) for b in resumed]
    assert _rows(before) + _rows(rest) == _rows(whole)   # the epoch's rows, each as often as uninterrupted
    slot_quotas = again.slot_quotas(new, 1)
    for index, (names, _) in enumerate(rest):   # the new slots' batches keep their shares
        quotas = slot_quotas[index % max(new, 1)]
        total = sum(quotas.values())
        assert all(abs(names.count(n) - len(names) * q / total) < 1 + 1e-9 for n, q in quotas.items())
    reference, reference_mixture = loader_of(three, new, **ELASTIC)   # later epochs: the new topology's own
    assert epoch_batches(resumed, again, 2) == epoch_batches(reference, reference_mixture, 2)


def test_a_checkpoint_inside_a_replanned_epoch_resumes_exactly(three):
    loader, mixture = loader_of(three, 2, **ELASTIC)
    mixture.set_epoch(0)
    it = iter(loader)
    seen = [next(it)["id"].tolist() for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    first, first_mixture = loader_of(three, 3, **ELASTIC)
    first.load_state_dict(state)
    first_mixture.set_epoch(0)
    it = iter(first)
    seen += [next(it)["id"].tolist() for _ in range(2)]
    inside = json.loads(json.dumps(first.state_dict()))
    assert "elastic" in inside["dataloader"]["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    rest = [b["id"].tolist() for b in it]
    second, second_mixture = loader_of(three, 3, **ELASTIC)
    second.load_state_dict(inside)
    second_mixture.set_epoch(0)
    assert [b["id"].tolist() for b in second] == rest
    # a third topology inside the re-planned epoch re-plans it again (its ``before``: the first re-plan)
    other, other_mixture = loader_of(three, 2, **ELASTIC)
    other.load_state_dict(inside)
    other_mixture.set_epoch(0)
    again = [b["id"].tolist() for b in other]
    assert sorted(i for ids in again for i in ids) == sorted(i for ids in rest for i in ids)
    reference, reference_mixture = loader_of(three, 2, **ELASTIC)   # the epoch's rows, each as often as whole
    assert sorted(i for ids in seen + again for i in ids) == sorted(
        i for _, ids in epoch_batches(reference, reference_mixture, 0) for i in ids)
    assert epoch_batches(other, other_mixture, 1) == epoch_batches(reference, reference_mixture, 1)


def test_ranks_change_mid_epoch_through_a_merged_checkpoint(three):
    import arrowstream

    whole: Counter = Counter()
    states, before = [], Counter()
    for rank in range(2):
        loader, mixture = loader_of(three, 2, rank=rank, world_size=2, plan_locally=True, **ELASTIC)
        whole += _rows(epoch_batches(loader, mixture, 0))
        loader, mixture = loader_of(three, 2, rank=rank, world_size=2, plan_locally=True, **ELASTIC)
        mixture.set_epoch(0)
        it = iter(loader)
        before += _rows([(list(b["src"]), b["id"].tolist()) for b in (next(it) for _ in range(3))])
        states.append(loader.state_dict())
        del it
    merged = json.loads(json.dumps(arrowstream.merge_state_dicts(states)))
    after, lengths = Counter(), []
    for rank in range(3):
        loader, mixture = loader_of(three, 2, rank=rank, world_size=3, plan_locally=True, **ELASTIC)
        loader.load_state_dict(merged)
        mixture.set_epoch(0)
        batches = [(list(b["src"]), b["id"].tolist()) for b in loader]
        lengths.append((len(batches), len(loader)))
        after += _rows(batches)
    assert len({n for n, _ in lengths}) == 1 and all(n == m for n, m in lengths)   # equal batches, len() exact
    lost = whole - (before + after)
    assert not (before + after) - whole and sum(lost.values()) < 6 * 32   # only even_batches' trim, never a repeat


def test_batches_per_transfer_is_a_loader_keyword_and_a_resume_takes_the_checkpoints(three):
    loader, mixture = loader_of(three, 2, shuffle=True, batches_per_transfer=3)
    assert loader.batches_per_transfer == 3
    mixture.set_epoch(0)
    it = iter(loader)
    for _ in range(4):   # inside the second chunk of worker 1
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["batches_per_transfer"] == 3
    rest = [b["id"].tolist() for b in it]
    fresh, _ = loader_of(three, 2, shuffle=True)   # the default would send 16 at a time
    fresh.load_state_dict(state)
    assert fresh.batches_per_transfer == 3
    assert [b["id"].tolist() for b in fresh] == rest
    with pytest.raises(errors.InvalidArgumentError, match="batches_per_transfer"):
        loader_of(three, 2, batches_per_transfer=0)


def test_an_iceberg_source_that_moved_on_is_read_at_the_checkpoints_snapshot(tmp_path):
    from iceberg_tables import make_catalog

    from arrowstream import IcebergSource

    catalog, config = make_catalog(str(tmp_path / "iceberg"))
    data = pa.table({"id": pa.array(range(500_000, 500_300), pa.int64()), "x": pa.array([0.5] * 300, pa.float64())})
    table = catalog.create_table("db.events", schema=data.schema)
    table.append(data)
    sources = {"files": Source(write_source(tmp_path / "files", 0, 200)),
               "table": IcebergSource("db.events", catalog_config=config)}

    def make():
        return Mixture.create_dataloader(sources=sources, weights={"files": 1, "table": 1}, epoch_rows=200,
                                         batch_size=20, num_workers=2, shuffle=True, plan_cache=False)

    loader, mixture = make()
    mixture.set_epoch(1)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [b["id"].tolist() for b in it]
    table.append(pa.table({"id": pa.array(range(600_000, 600_100), pa.int64()), "x": pa.array([1.0] * 100)}))
    fresh, fresh_mixture = make()
    assert fresh_mixture.source_rows()["table"] == 400   # the latest snapshot
    fresh.load_state_dict(state)
    assert fresh_mixture.source_rows()["table"] == 300   # the checkpoint's
    assert [b["id"].tolist() for b in fresh] == rest


def spans_of(sources, per_span, **kwargs):
    """Every span a slot's stream gives, ``per_span`` batches at a time (as a loader worker takes them)."""
    mixture = Mixture(sources=sources, weights=WEIGHTS, epoch_rows=500, batch_size=32, source_column="src",
                      shuffle=True, plan_cache=False, **kwargs)
    stream = mixture._open(None).stream
    spans = []
    while True:
        try:
            spans.append(stream.next_span(per_span))
        except StopIteration:
            return spans, stream.state()


@pytest.mark.parametrize("buffer,drop_last", [(0, False), (64, False), (0, True), (64, True)])
def test_a_span_of_batches_is_the_batches_taken_one_at_a_time(three, buffer, drop_last):
    # a span takes each source's rows of all its batches in one pass and cuts them; the small source's
    # passes (one part each) end inside spans
    one_by_one, one_state = spans_of(three, 1, shuffle_buffer_size=buffer, drop_last=drop_last)
    spans, span_state = spans_of(three, 7, shuffle_buffer_size=buffer, drop_last=drop_last)
    assert pa.Table.from_batches([s[0] for s in spans]).equals(pa.Table.from_batches([s[0] for s in one_by_one]))
    assert [n for s in spans for n in s[1]] == [n for s in one_by_one for n in s[1]]
    assert [p for s in spans for p in s[2]] == [p for s in one_by_one for p in s[2]]
    counts = [s[3] for s in one_by_one]
    assert [s[3] for s in spans] == [[sum(c) for c in zip(*counts[i:i + 7])] for i in range(0, len(counts), 7)]
    assert span_state == one_state


def _tagged(batch):
    return {**batch, "rows": len(batch["id"])}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_transform_takes_each_batch_and_resume_stays_exact(three, num_workers):
    loader, mixture = loader_of(three, num_workers, shuffle=True, transform=_tagged)
    plain, plain_mixture = loader_of(three, num_workers, shuffle=True)
    mixture.set_epoch(1)
    plain_mixture.set_epoch(1)
    batches = list(loader)
    assert [b["rows"] for b in batches] == [len(b["id"]) for b in batches]
    assert [b["id"].tolist() for b in batches] == [b["id"].tolist() for b in plain]   # the same batches
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [b["id"].tolist() for b in it]
    fresh, _ = loader_of(three, num_workers, shuffle=True, transform=_tagged)
    fresh.load_state_dict(state)
    assert [b["id"].tolist() for b in fresh] == rest


@pytest.mark.parametrize("buffer", [0, None, 700])
def test_each_source_decodes_no_further_than_its_first_batch_needs_then_in_full_reads(three, monkeypatch, buffer):
    """The first batch waits for one read's worth of rows (each source its share of one; with a shuffle buffer
    its first window), not one read per source: a source's reads are sized to what is left of that, across
    splits (never below ``SMALLEST_READ_ROWS``), until it is read; then they are full reads, which cost less
    per row."""
    from arrowstream._formats.parquet import ParquetFile
    from arrowstream._worker.reader import SMALLEST_READ_ROWS
    from arrowstream._worker.runtime import READ_BATCH_ROWS

    reads = []   # (rows per file of the source, rows per read asked, rows the read gave)
    read_units = ParquetFile.read_units

    def recorded(self, units, columns, batch_rows, use_threads):
        read = [self._file.metadata.num_rows, batch_rows, 0]
        reads.append(read)
        for batch in read_units(self, units, columns, batch_rows, use_threads):
            read[2] += batch.num_rows
            yield batch

    monkeypatch.setattr(ParquetFile, "read_units", recorded)
    monkeypatch.setattr("arrowstream._worker.reader.SMALLEST_READ_ROWS", 64)   # the test's files are small
    assert SMALLEST_READ_ROWS >= 1024
    loader, mixture = loader_of(three, weights=None, epoch_rows=None, shuffle=True, shuffle_buffer_size=buffer)
    window = mixture._options.shuffle_buffer_size
    assert (window == 0) == (buffer == 0)
    assert sum(len(b["id"]) for b in loader) == 1310
    by_source = {500: "big", 10: "small", 150: "mid"}   # rows per file of each source
    per_source = {}
    for file_rows, batch_rows, given in reads:
        per_source.setdefault(by_source[file_rows], []).append((batch_rows, given))
    quotas = {"big": 1000, "small": 10, "mid": 300}
    for name, sizes in per_source.items():
        left = max(32, min(READ_BATCH_ROWS, window or -(-READ_BATCH_ROWS * quotas[name] // 1310)))
        assert sizes[0][0] < READ_BATCH_ROWS, (name, sizes)
        for batch_rows, given in sizes:
            assert batch_rows == (min(READ_BATCH_ROWS, max(left, 64)) if left > 0 else READ_BATCH_ROWS), (name, sizes)
            left -= given
    if buffer == 700:   # the big source's splits hold 50 rows: 14 of them fill its window, full reads follow
        assert [size for size, _ in per_source["big"][:15]] == [700 - 50 * k for k in range(13)] + [64, READ_BATCH_ROWS]
