"""Output formats, zero-copy conversion, the null policy, full batches, projection and filter."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from helpers import all_batches, ids_of, make_loader, run_epochs
from pyarrow import ipc, orc

from arrowstream import CorruptFileError, InvalidArgumentError, NullValueError, StructuredDataset
from arrowstream._worker.convert import make_converter


def test_torch_output_types(small_dataset):
    batch = next(iter(StructuredDataset(small_dataset, batch_size=8)))
    assert batch["id"].dtype == torch.int64 and batch["id"].shape == (8,)
    assert batch["x"].dtype == torch.float32
    assert batch["label"].dtype == torch.int8
    assert batch["flag"].dtype == torch.bool
    assert batch["vec"].shape == (8, 3) and batch["vec"].dtype == torch.float32
    assert batch["name"] == [f"row-{i}" for i in range(8)]


def test_numpy_arrow_and_dict_outputs(small_dataset):
    as_numpy = next(iter(StructuredDataset(small_dataset, batch_size=8, output_format="numpy")))
    assert isinstance(as_numpy["id"], np.ndarray) and as_numpy["vec"].shape == (8, 3)
    assert isinstance(as_numpy["name"], list)
    as_arrow = next(iter(StructuredDataset(small_dataset, batch_size=8, output_format="arrow")))
    assert isinstance(as_arrow, pa.RecordBatch) and as_arrow.num_rows == 8
    as_dict = next(iter(StructuredDataset(small_dataset, batch_size=8, output_format="dict")))
    assert as_dict["id"] == list(range(8)) and as_dict["vec"][0] == pytest.approx(as_numpy["vec"][0].tolist())


def test_numpy_output_survives_the_loader(small_dataset):
    """The loader's default collate must not turn ndarrays into tensors."""
    loader, _ = make_loader(small_dataset, 2, batch_size=50, output_format="numpy")
    batch = next(iter(loader))
    assert isinstance(batch["id"], np.ndarray)


def test_numeric_columns_are_zero_copy():
    values = pa.array(np.arange(100, dtype=np.float32))
    batch = pa.record_batch({"x": values})
    tensor = make_converter("torch", batch.schema)(batch)["x"]
    assert tensor.data_ptr() == values.buffers()[1].address
    sliced = batch.slice(10, 20)
    assert make_converter("torch", batch.schema)(sliced)["x"].data_ptr() == values.buffers()[1].address + 40


def test_nulls_raise_unless_filled(tmp_path):
    table = pa.table({"id": pa.array([1, None, 3], pa.int64()), "x": pa.array([1.0, 2.0, None]),
                      "vec": pa.array([[1.0, 2.0], None, [5.0, 6.0]], pa.list_(pa.float64(), 2))})
    pq.write_table(table, tmp_path / "n.parquet")
    with pytest.raises(NullValueError, match="'id'.*fill_nulls"):
        next(iter(StructuredDataset(tmp_path, batch_size=3)))
    filled = next(iter(StructuredDataset(tmp_path, batch_size=3, fill_nulls={"id": -1, "x": float("nan"),
                                                                              "vec": 0.0})))
    assert filled["id"].tolist() == [1, -1, 3]
    assert torch.isnan(filled["x"][2])
    assert filled["vec"].tolist() == [[1.0, 2.0], [0.0, 0.0], [5.0, 6.0]]
    assert next(iter(StructuredDataset(tmp_path, batch_size=3, output_format="dict")))["id"] == [1, None, 3]
    # a single value fills the columns it suits: 0 the numbers, not the bool column
    table = table.append_column("flag", pa.array([True, None, False]))
    pq.write_table(table, tmp_path / "n.parquet")
    with pytest.raises(NullValueError, match="'flag'"):
        next(iter(StructuredDataset(tmp_path, batch_size=3, fill_nulls=0)))
    both = next(iter(StructuredDataset(tmp_path, batch_size=3, fill_nulls={"id": 0, "x": 0.0, "vec": 0.0,
                                                                            "flag": False})))
    assert both["flag"].tolist() == [True, False, False]
    only_numbers = next(iter(StructuredDataset(tmp_path, batch_size=3, columns=["id", "x", "vec"], fill_nulls=0)))
    assert only_numbers["id"].tolist() == [1, 0, 3]
    arrow = next(iter(StructuredDataset(tmp_path, batch_size=3, output_format="arrow")))
    assert arrow.column("x").null_count == 1


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_are_full_across_splits_and_files(uneven_dataset, num_workers, drop_last, caplog):
    caplog.set_level(logging.INFO, logger="arrowstream")
    loader, dataset = make_loader(uneven_dataset, num_workers, batch_size=96, drop_last=drop_last)
    sizes_by_worker: dict[int, list[int]] = {}
    it = iter(loader)
    for step, batch in enumerate(it):
        worker = step % max(num_workers, 1) if num_workers else 0
        sizes_by_worker.setdefault(worker, []).append(len(batch["id"]))
    rows = dataset.slot_rows(num_workers)
    for worker, sizes in sizes_by_worker.items():
        assert all(size == 96 for size in sizes[:-1])
        if drop_last:
            assert sizes[-1] == 96
    total = sum(sum(s) for s in sizes_by_worker.values())
    expected = sum(r - r % 96 for r in rows) if drop_last else dataset.num_rows
    assert total == expected
    assert dataset.rows_dropped_per_epoch(num_workers) == dataset.num_rows - total
    if drop_last and num_workers == 0:  # workers log in their own processes
        assert f"dropped its last {dataset.num_rows - total} row(s)" in caplog.text


def test_rows_dropped_are_counted_in_the_state(small_dataset):
    dataset = StructuredDataset(small_dataset, batch_size=150, drop_last=True)
    it = iter(dataset)
    assert len(list(it)) == 2
    assert dataset.state_dict()["counters"] == {"rows": 300, "batches": 2, "rows_dropped": 100}
    assert dataset.rows_dropped_per_epoch() == 100


def test_projection_and_filter_equal_pyarrow(uneven_dataset):
    expression = (pc.field("label") == 3) | (pc.field("x") > 1.5)
    loader, _ = make_loader(uneven_dataset, 2, batch_size=40, columns=["id", "x"], filter=expression,
                            shuffle=True, output_format="arrow")
    batches = list(loader)
    assert all(b.schema.names == ["id", "x"] for b in batches)
    ours = pa.Table.from_batches(batches).sort_by("id")
    theirs = pq.read_table(uneven_dataset, columns=["id", "x"], filters=expression).sort_by("id")
    assert ours.equals(theirs)


def test_dnf_filter_is_accepted(small_dataset):
    dataset = StructuredDataset(small_dataset, batch_size=1000, filter=[("id", "<", 10)])
    assert [ids_of(b) for b in dataset] == [list(range(10))]


def test_filter_resume_is_exact(uneven_dataset):
    options = {"batch_size": 33, "filter": pc.field("label") != 2, "shuffle": True}
    loader, dataset = make_loader(uneven_dataset, 2, **options)
    checkpoints: dict = {}
    reference = run_epochs(loader, dataset, [0, 1], checkpoints, mid=9)
    for point in ("first", "mid", "next"):
        state, consumed, epoch = checkpoints[point]
        fresh, fresh_dataset = make_loader(uneven_dataset, 2, **options)
        fresh.load_state_dict(state)
        out = []
        for e in range(epoch, 2):
            fresh_dataset.set_epoch(e)
            out += [ids_of(b) for b in fresh]
        assert out == [ids for _, _, ids in reference[consumed:]]


def test_transform_runs_in_the_worker(small_dataset):
    loader, _ = make_loader(small_dataset, 2, batch_size=100, transform=_double_ids)
    ids = sorted(i for b in loader for i in b["id"].tolist())
    assert ids == [2 * i for i in range(400)]


def _double_ids(batch):
    batch["id"] = batch["id"] * 2
    return batch


def test_collate_fn_may_be_overridden(small_dataset):
    loader, _ = make_loader(small_dataset, 0, batch_size=100, collate_fn=lambda b: len(b["id"]))
    assert list(loader) == [100, 100, 100, 100]


def test_arrow_batches_from_workers_carry_only_their_rows():
    """A slice pickled to the trainer must not drag its 65,536-row parent along."""
    import pickle

    parent = pa.record_batch({"x": np.arange(65536, dtype=np.float64)})
    piece = parent.slice(1024, 1024)
    compacted = make_converter("arrow", parent.schema, in_worker=True)(piece)
    assert compacted.equals(piece)
    assert len(pickle.dumps(compacted)) < 2 * 1024 * 8
    assert len(pickle.dumps(piece)) > 30 * 1024 * 8  # why it matters


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_null_error_names_the_file(tmp_path, num_workers):
    """Found where the rows are read, so the error says which file holds the nulls."""
    pq.write_table(pa.table({"id": pa.array(range(5), pa.int64())}), tmp_path / "part-000.parquet")
    pq.write_table(pa.table({"id": pa.array([5, None, 7], pa.int64())}), tmp_path / "part-001.parquet")
    loader, _ = make_loader(str(tmp_path), num_workers, batch_size=4, output_format="numpy")
    with pytest.raises(NullValueError, match=r"part-001\.parquet: column 'id' has 1 null"):
        all_batches(loader)


def test_temporal_nulls_follow_the_null_policy(tmp_path):
    """A null timestamp is no number: refused in torch/numpy batches unless filled by name (in the unit)."""
    table = pa.table({"t": pa.array([10**9, None, 3 * 10**9], pa.timestamp("ns")), "x": [1, 2, None]})
    pq.write_table(table, tmp_path / "t.parquet")
    with pytest.raises(NullValueError, match=r"t\.parquet: column 't'.*fill_nulls"):
        next(iter(StructuredDataset(tmp_path, batch_size=3, fill_nulls=0)))   # 0 fills only number columns
    batch = next(iter(StructuredDataset(tmp_path, batch_size=3, fill_nulls={"t": -1, "x": 0}, output_format="numpy")))
    assert batch["t"].dtype == np.dtype("datetime64[ns]") and batch["t"].view(np.int64).tolist() == [10**9, -1, 3 * 10**9]
    tensor = next(iter(StructuredDataset(tmp_path, batch_size=3, fill_nulls={"t": 0, "x": 0})))["t"]
    assert tensor.dtype == torch.int64 and tensor.tolist() == [10**9, 0, 3 * 10**9]
    with pytest.raises(InvalidArgumentError, match=r"column 't'.*an int in the column's unit"):
        StructuredDataset(tmp_path, fill_nulls={"t": 1.5})


@pytest.mark.parametrize("fmt", ["parquet", "orc", "arrow"])
def test_field_names_that_are_not_utf8(tmp_path, fmt):
    path = tmp_path / f"bad.{fmt}"
    table = pa.table({"goodname": [1, 2]})
    if fmt == "parquet":
        pq.write_table(table, path, store_schema=False)
    elif fmt == "orc":
        orc.write_table(table, path, compression="uncompressed")
    else:
        with ipc.new_file(path, table.schema) as writer:
            writer.write_table(table)
    path.write_bytes(path.read_bytes().replace(b"goodname", b"good\xff\xfeme"))
    with pytest.raises(CorruptFileError, match=r"bad\.\w+: a column name in the .* metadata is not valid UTF-8"):
        StructuredDataset(tmp_path, format=fmt)
