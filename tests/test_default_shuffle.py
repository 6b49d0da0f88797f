"""``shuffle=True`` mixes rows by default (a buffer sized by memory), old checkpoints still resume exactly, and
a loop that forgets ``set_epoch`` is warned (issue #22 point 6; docs/shuffle.md)."""

from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_replanned_continuation, ids_of, json_roundtrip, make_loader, replanned_by_an_older_cut

import arrowstream
from arrowstream import Mixture, RepeatedEpochWarning, Source, errors
from arrowstream._planning.auto_buffer import BUDGET_BYTES, MAX_ROWS, MIN_BATCHES, auto_buffer_rows

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
sys.path.insert(0, GOLDEN)

from make_golden import prepare_copy

GROUPS, GROUP_ROWS, BATCH = 10, 1_000, 50


@pytest.fixture(scope="module")
def sorted_rows(tmp_path_factory):
    """``id`` = the row's position in the files: 2 files, 10 row groups of 1,000 rows (``id // 1,000``)."""
    folder = tmp_path_factory.mktemp("sorted")
    for index in range(2):
        ids = np.arange(index * 5_000, (index + 1) * 5_000, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids.astype(np.float32)}), folder / f"part-{index}.parquet",
                       row_group_size=GROUP_ROWS)
    return str(folder)


def epoch_ids(loader, dataset, epoch=0):
    dataset.set_epoch(epoch)
    return [ids_of(batch) for batch in loader]


def groups_per_batch(batches):
    return float(np.mean([len({i // GROUP_ROWS for i in batch}) for batch in batches if len(batch) == BATCH]))


def test_the_default_mixes_rows_as_a_random_draw_would(sorted_rows):
    loader, dataset = make_loader(sorted_rows, 0, batch_size=BATCH, shuffle=True, plan_cache=False)
    batches = epoch_ids(loader, dataset)
    first = batches[0]
    assert np.any(np.diff(first) != 1), f"the first batch holds consecutive ids: {first[:8]}..."
    assert sorted(i for b in batches for i in b) == list(range(GROUPS * GROUP_ROWS))
    # the buffer holds the whole (small) epoch here: a batch draws its rows as a random sample would, so it
    # meets about G * (1 - (1 - 1/G)^B) of the G row groups; split order alone meets at most 2
    random_draw = GROUPS * (1 - (1 - 1 / GROUPS) ** BATCH)
    assert groups_per_batch(batches) >= 0.9 * random_draw
    split_only, split_dataset = make_loader(sorted_rows, 0, batch_size=BATCH, shuffle=True, shuffle_buffer_size=0,
                                            plan_cache=False)
    split_batches = epoch_ids(split_only, split_dataset)
    assert groups_per_batch(split_batches) <= 2
    assert all(np.all(np.diff(b) == 1) for b in split_batches[:1])   # 0: split order only, as before


def test_shuffle_off_or_a_filter_gets_no_default_buffer(sorted_rows):
    plain, dataset = make_loader(sorted_rows, 0, batch_size=BATCH, plan_cache=False)
    assert [i for b in epoch_ids(plain, dataset) for i in b] == list(range(GROUPS * GROUP_ROWS))
    assert dataset._options.shuffle_buffer_size == 0
    # a filter with a buffer is refused by dynamic assignment (and by an elastic resume inside a window): the
    # default leaves those configurations working as they did, in split order
    filtered, dataset = make_loader(sorted_rows, 0, batch_size=BATCH, shuffle=True, filter=[("id", ">=", 100)],
                                    assignment="dynamic", plan_cache=False)
    assert dataset._options.shuffle_buffer_size == 0
    assert sorted(i for b in epoch_ids(filtered, dataset) for i in b) == list(range(100, GROUPS * GROUP_ROWS))


def parquet_row_bytes(folder):
    """Bytes per row as Parquet's own metadata gives them (uncompressed row groups), read here with pyarrow."""
    sizes = rows = 0
    for name in sorted(os.listdir(folder)):
        metadata = pq.ParquetFile(os.path.join(folder, name)).metadata
        for index in range(metadata.num_row_groups):
            sizes += metadata.row_group(index).total_byte_size
            rows += metadata.row_group(index).num_rows
    return sizes / rows


def test_the_default_size_follows_the_budget_the_same_on_every_rank(tmp_path):
    # rows of about 1 KiB: the budget, not a clamp, decides the size
    rng = np.random.default_rng(0)
    values = pa.array(rng.standard_normal(600 * 256).astype(np.float32))
    table = pa.table({"id": np.arange(600), "vec": pa.FixedSizeListArray.from_arrays(values, 256)})
    pq.write_table(table, tmp_path / "wide.parquet", row_group_size=200)
    expected = int(BUDGET_BYTES // parquet_row_bytes(tmp_path))
    assert MIN_BATCHES * 64 < expected < MAX_ROWS
    sizes = []
    for rank in (0, 1):
        _, dataset = make_loader(str(tmp_path), 0, batch_size=64, shuffle=True, rank=rank, world_size=2,
                                      plan_locally=True, plan_cache=False)
        options = dataset.state_dict()["options"]
        sizes.append(options["shuffle_buffer_size"])   # what the checkpoint holds, and a resume must match
    assert sizes == [expected, expected]
    assert expected * parquet_row_bytes(tmp_path) <= BUDGET_BYTES


def test_the_default_size_stays_between_a_few_batches_and_its_maximum():
    assert auto_buffer_rows(1.0, 1024) == MAX_ROWS   # narrow rows: bounded by the rows a window permutes
    assert auto_buffer_rows(BUDGET_BYTES / 10, 32) == MIN_BATCHES * 32   # huge rows: a few batches still
    assert auto_buffer_rows(BUDGET_BYTES / 2**16, 32) == 2**16


@pytest.mark.parametrize("name", ["v6/workers1-shuffle-next-epoch.json", "v7/cut-elastic-rank0of1-workers2-from-3x2-mid.json"])
def test_a_checkpoint_of_split_order_resumes_exactly_with_the_default(tmp_path, name):
    """States taken before the default (shuffle=True, buffer 0): the loader adopts 0 for the run, in the saved
    epoch and the later ones (the second file is re-planned for another topology: elastic resume)."""
    with open(os.path.join(GOLDEN, name)) as f:
        golden = json.load(f)
    assert golden["options"]["shuffle"] and "shuffle_buffer_size" not in golden["options"]
    path = prepare_copy(str(tmp_path / "data"), golden.get("data", "data"))
    loader, dataset = make_loader(path, golden["num_workers"], **golden["options"])
    assert dataset._options.shuffle_buffer_size > 0   # the default, before the checkpoint is loaded
    loader.load_state_dict(json_roundtrip(golden["state"]))
    assert dataset._options.shuffle_buffer_size == 0
    per_epoch = [epoch_ids(loader, dataset, epoch) for epoch in range(golden["epoch"], golden["epochs"][-1] + 1)]
    if replanned_by_an_older_cut(golden):   # the rest of the epoch re-planned with the even cut (#36)
        assert_replanned_continuation(golden, per_epoch)
        return
    assert [batch for batches in per_epoch for batch in batches] == golden["continuation_ids"]


def test_an_explicit_other_size_is_refused_and_a_refused_checkpoint_leaves_the_default(tmp_path):
    with open(os.path.join(GOLDEN, "v6", "workers2-shuffle-mid.json")) as f:
        golden = json.load(f)
    path = prepare_copy(str(tmp_path / "data"), "data")
    explicit, _ = make_loader(path, golden["num_workers"], **golden["options"], shuffle_buffer_size=40)
    with pytest.raises(errors.StateMismatchError, match="shuffle_buffer_size: saved 0 vs current 40"):
        explicit.load_state_dict(golden["state"])
    other_seed = {**golden["options"], "seed": golden["options"]["seed"] + 1}
    loader, dataset = make_loader(path, golden["num_workers"], **other_seed)
    size = dataset._options.shuffle_buffer_size
    with pytest.raises(errors.StateMismatchError, match="seed: saved 1 vs current 2"):
        loader.load_state_dict(golden["state"])
    assert dataset._options.shuffle_buffer_size == size > 0


def test_a_checkpoint_of_the_default_resumes_exactly(sorted_rows):
    loader, dataset = make_loader(sorted_rows, 0, batch_size=BATCH, shuffle=True, plan_cache=False)
    dataset.set_epoch(1)
    iterator = iter(loader)
    head = [ids_of(next(iterator)) for _ in range(7)]
    state = json_roundtrip(loader.state_dict())
    rest = [ids_of(batch) for batch in iterator]
    fresh, fresh_dataset = make_loader(sorted_rows, 0, batch_size=BATCH, shuffle=True, plan_cache=False)
    fresh.load_state_dict(state)
    assert epoch_ids(fresh, fresh_dataset, 1) == rest
    assert sorted(i for b in head + rest for i in b) == list(range(GROUPS * GROUP_ROWS))


def test_a_mixture_mixes_rows_by_default_and_takes_an_old_checkpoint(tmp_path, sorted_rows):
    loader, mixture = Mixture.create_dataloader(sources={"a": Source(sorted_rows)}, batch_size=BATCH, shuffle=True,
                                                plan_cache=False)
    assert mixture._options.shuffle_buffer_size > 0
    mixture.set_epoch(0)
    first = next(iter(loader))["id"].tolist()
    assert np.any(np.diff(first) != 1)
    from make_golden_mixture import batch_record, make

    with open(os.path.join(GOLDEN, "mixture-v1", "workers2-after-loop.json")) as f:
        golden = json.load(f)
    assert golden["options"] == {"shuffle": True}
    prepare_copy(str(tmp_path / "data"), "data")
    prepare_copy(str(tmp_path / "data-cut"), "data-cut")
    old, old_mixture = make(str(tmp_path), golden)
    assert old_mixture._options.shuffle_buffer_size > 0
    old.load_state_dict(golden["state"])
    assert old_mixture._options.shuffle_buffer_size == 0
    resumed = []
    for epoch in range(golden["epoch"], golden["epochs"][-1] + 1):
        old_mixture.set_epoch(epoch)
        resumed += [batch_record(batch) for batch in old]
    assert resumed == golden["continuation"]



def test_a_mixtures_windows_together_hold_at_most_the_maximum(sorted_rows):
    """A mixture worker holds one window per source at once and gathers from all of them: the default sizes
    each so that together they hold at most MAX_ROWS rows (one dataset's window), as the budget is shared."""
    assert auto_buffer_rows(1.0, 1024, windows=3) == MAX_ROWS // 3
    assert auto_buffer_rows(1.0, 32, windows=MAX_ROWS) == MIN_BATCHES * 32   # each still a few batches
    sources = {name: Source(sorted_rows) for name in ("a", "b", "c")}
    _, mixture = Mixture.create_dataloader(sources=sources, batch_size=BATCH, shuffle=True, plan_cache=False)
    per_row = parquet_row_bytes(sorted_rows)
    assert mixture._options.shuffle_buffer_size == min(int(BUDGET_BYTES // (3 * per_row)), MAX_ROWS // 3)


def test_a_mixture_checkpoint_of_an_older_default_size_resumes_exactly(sorted_rows, monkeypatch):
    """0.2.0 gave each source of a mixture a whole dataset's window; a checkpoint of that size (in its options)
    resumes with the size it was taken with, mid-epoch, to the same batches."""
    monkeypatch.setattr(arrowstream._planning.auto_buffer, "MAX_ROWS", 1_200)   # windows smaller than a source's rows
    sources = {name: Source(sorted_rows) for name in ("a", "b")}
    _, default = Mixture.create_dataloader(sources=sources, batch_size=BATCH, shuffle=True, plan_cache=False)
    older = default._options.shuffle_buffer_size * 2
    assert older == 1_200
    loader, mixture = Mixture.create_dataloader(sources=sources, batch_size=BATCH, shuffle=True, plan_cache=False,
                                                shuffle_buffer_size=older, epoch_rows=4 * GROUP_ROWS)
    mixture.set_epoch(0)
    batches = iter(loader)
    for _ in range(7):
        next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [b["id"].tolist() for b in batches]
    resumed, resumed_mixture = Mixture.create_dataloader(sources=sources, batch_size=BATCH, shuffle=True,
                                                         plan_cache=False, epoch_rows=4 * GROUP_ROWS)
    assert resumed_mixture._options.shuffle_buffer_size != older
    resumed.load_state_dict(state)
    assert resumed_mixture._options.shuffle_buffer_size == older
    resumed_mixture.set_epoch(0)
    assert [b["id"].tolist() for b in resumed] == rest


# -- the warning --------------------------------------------------------------------------------------------


def test_a_second_epoch_without_set_epoch_is_warned_once(sorted_rows):
    loader, dataset = make_loader(sorted_rows, 0, batch_size=BATCH * 20, shuffle=True, plan_cache=False)
    dataset.set_epoch(0)
    first = [ids_of(b) for b in loader]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = [ids_of(b) for b in loader]
        third = [ids_of(b) for b in loader]
    assert first == second == third   # what the warning is about: the same order again
    repeated = [w for w in caught if issubclass(w.category, RepeatedEpochWarning)]
    assert len(repeated) == 1 and "dataset.set_epoch(epoch)" in str(repeated[0].message)
    assert repeated[0].filename == __file__   # it points at the loop that forgot set_epoch
    assert issubclass(RepeatedEpochWarning, UserWarning) and "RepeatedEpochWarning" in arrowstream.__all__


def test_no_warning_with_set_epoch_a_loop_left_early_or_a_fixed_order(sorted_rows):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RepeatedEpochWarning)
        loader, dataset = make_loader(sorted_rows, 0, batch_size=BATCH * 20, shuffle=True, plan_cache=False)
        for epoch in range(3):
            dataset.set_epoch(epoch)
            next(iter(loader))          # a peek, then the epoch: one epoch read once
            assert sum(len(b) for b in epoch_ids(loader, dataset, epoch)) == GROUPS * GROUP_ROWS
        state = loader.state_dict()
        loader.load_state_dict(state)   # resumes at the end of epoch 2: reading it is no repeat
        assert list(loader) == []
        fixed, fixed_dataset = make_loader(sorted_rows, 0, batch_size=BATCH * 20, plan_cache=False)
        assert epoch_ids(fixed, fixed_dataset) == epoch_ids(fixed, fixed_dataset)   # shuffle=False: by design


def test_a_mixture_without_set_epoch_is_warned(sorted_rows):
    loader, _ = Mixture.create_dataloader(sources={"a": Source(sorted_rows)}, batch_size=BATCH * 20,
                                                shuffle=True, plan_cache=False)
    list(loader)
    with pytest.warns(RepeatedEpochWarning, match=r"mixture\.set_epoch\(epoch\)"):
        list(loader)
