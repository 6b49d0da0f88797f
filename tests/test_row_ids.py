"""``with_row_ids=True``: every row's ``_file`` (index into ``dataset.files``) and ``_row`` (its physical
position in that file) are its true provenance, through every stage, and change no row's place.

The files are written so that each row's ``id`` is ``file number * 1_000_000 + position in the file``
(the file number is in its name): a row id is checked against the row's own value, wherever shuffling,
interleaving, filtering, workers, resumes or mixing put it.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
import torch
from helpers import batch_key, json_roundtrip
from iceberg_tables import add_position_deletes, make_catalog
from pyarrow import orc

from arrowstream import IcebergDataset, Mixture, Source, StructuredDataset, errors

M = 1_000_000
FILE_ROWS = (430, 250, 310)   # rows of part-0, part-1, part-2
UNIT = 100                    # rows per row group / stripe / record batch


def file_table(number: int, rows: int) -> pa.Table:
    positions = np.arange(rows, dtype=np.int64)
    # the names make ORC cut stripes of UNIT rows (numbers alone compress into one)
    return pa.table({"id": number * M + positions, "v": (positions * 7919) % 10,
                     "name": [f"row-{p}" for p in positions]})


def write_files(folder: Path, fmt: str, rows: tuple[int, ...] = FILE_ROWS, first: int = 0) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for number, count in enumerate(rows, start=first):
        table = file_table(number, count)
        path = folder / f"part-{number}.{fmt}"
        if fmt == "parquet":
            pq.write_table(table, path, row_group_size=UNIT)
        elif fmt == "orc":
            orc.write_table(table, path, stripe_size=1, batch_size=UNIT)
        elif fmt == "arrow":
            with pa.ipc.new_file(path, table.schema) as writer:
                for batch in table.to_batches(max_chunksize=UNIT):
                    writer.write_batch(batch)
        elif fmt == "csv":
            pa_csv.write_csv(table, path)
        else:
            path.write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))
    return str(folder)


def columns_of(batch: Any) -> dict[str, list[Any]]:
    """Every column of a batch of any output format as a Python list."""
    if isinstance(batch, pa.RecordBatch):
        return batch.to_pydict()
    return {name: (value.tolist() if isinstance(value, (torch.Tensor, np.ndarray)) else list(value))
            for name, value in batch.items()}


def file_number(name: str) -> int:
    found = re.search(r"part-(\d+)\.", name)
    assert found, name
    return int(found.group(1))


def check_provenance(batches: list[Any], files: tuple[str, ...]) -> list[int]:
    """Assert every row's (_file, _row) names the row its id was written at; return the ids in order."""
    ids: list[int] = []
    for batch in batches:
        cols = columns_of(batch)
        for value, file_index, row in zip(cols["id"], cols["_file"], cols["_row"], strict=True):
            assert value == file_number(files[file_index]) * M + row, (value, files[file_index], row)
        ids += cols["id"]
    return ids


def without_ids(batch: Any) -> Any:
    if isinstance(batch, pa.RecordBatch):
        return batch.drop_columns(["_file", "_row"])
    return {name: value for name, value in batch.items() if name not in ("_file", "_row")}


def epoch(loader: Any, dataset: Any, number: int = 0) -> list[Any]:
    dataset.set_epoch(number)
    return list(loader)


ALL_ROWS = sorted(number * M + row for number, count in enumerate(FILE_ROWS) for row in range(count))


@pytest.fixture(scope="module")
def parquet_folder(tmp_path_factory) -> str:
    return write_files(tmp_path_factory.mktemp("row_ids") / "parquet", "parquet")


# -- the ids are the rows' true positions, and the stream is the same as without them ------------------

@pytest.mark.parametrize(("num_workers", "options"), [
    (0, {"shuffle": True, "seed": 5, "shuffle_buffer_size": 300, "interleave": 2}),
    (2, {"shuffle": True, "seed": 1, "shuffle_buffer_size": 120, "batches_per_transfer": 3}),
    (0, {"filter": pc.field("v") > 5, "shuffle": True, "shuffle_buffer_size": 200, "interleave": 3}),
    (0, {"columns": ["id"], "split_bytes": 1, "output_format": "arrow"}),
], ids=["buffer-interleave", "two-workers-chunks", "filter", "columns-arrow"])
def test_row_ids_name_each_rows_file_and_position_and_change_no_batch(parquet_folder, num_workers, options):
    with_ids, dataset = StructuredDataset.create_dataloader(parquet_folder, batch_size=32, num_workers=num_workers,
                                                            with_row_ids=True, **options)
    plain, plain_dataset = StructuredDataset.create_dataloader(parquet_folder, batch_size=32,
                                                               num_workers=num_workers, **options)
    batches = epoch(with_ids, dataset, 1)
    ids = check_provenance(batches, dataset.files)
    if "filter" not in options:
        assert sorted(ids) == ALL_ROWS
    else:
        assert sorted(ids) == [i for i in ALL_ROWS if (i % M) * 7919 % 10 > 5]
    assert [batch_key(without_ids(b)) for b in batches] == [batch_key(b) for b in epoch(plain, plain_dataset, 1)]
    assert ids != sorted(ids) or "shuffle" not in options   # the shuffle did move rows


def test_files_are_the_plans_files_in_order(parquet_folder):
    dataset = StructuredDataset(parquet_folder, batch_size=8, with_row_ids=True)
    assert [os.path.basename(f) for f in dataset.files] == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    assert all(os.path.isabs(f) for f in dataset.files) and dataset.num_files == 3


@pytest.mark.parametrize("output_format", ["torch", "numpy", "dict"])
def test_every_output_format_holds_the_ids_as_integers(parquet_folder, output_format):
    seen = []
    dataset = StructuredDataset(parquet_folder, batch_size=64, output_format=output_format, with_row_ids=True,
                                transform=lambda batch: seen.append(batch) or batch)
    batch = next(iter(dataset))
    assert seen and "_file" in seen[0] and "_row" in seen[0]   # the transform sees them
    if output_format == "torch":
        assert (batch["_file"].dtype, batch["_row"].dtype) == (torch.int32, torch.int64)
    elif output_format == "numpy":
        assert (batch["_file"].dtype, batch["_row"].dtype) == (np.int32, np.int64)
    else:
        assert all(type(v) is int for v in batch["_file"] + batch["_row"])
    check_provenance([batch], dataset.files)


def test_arrow_batches_hold_int32_and_int64_columns_last(parquet_folder):
    dataset = StructuredDataset(parquet_folder, batch_size=64, output_format="arrow", with_row_ids=True)
    batch = next(iter(dataset))
    assert batch.schema.names == ["id", "v", "name", "_file", "_row"]
    assert (batch.schema.field("_file").type, batch.schema.field("_row").type) == (pa.int32(), pa.int64())


# -- every format --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["orc", "arrow", "csv", "jsonl"])
def test_every_format_gives_true_positions(tmp_path, fmt):
    folder = write_files(tmp_path / fmt, fmt)
    # small text units: a file is cut into several, so positions add up across them
    loader, dataset = StructuredDataset.create_dataloader(folder, format=fmt, batch_size=50, shuffle=True,
                                                          shuffle_buffer_size=200, interleave=2, with_row_ids=True,
                                                          split_bytes=1024 if fmt in ("csv", "jsonl") else None)
    assert dataset.num_splits() > len(FILE_ROWS)
    assert sorted(check_provenance(epoch(loader, dataset), dataset.files)) == ALL_ROWS


def test_csv_rows_skipped_as_bad_keep_their_place_in_the_count(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    lines = ["id,v"] + [f"{row},{row % 10}" if row != 3 else "oops,not,a,row" for row in range(8)]
    (folder / "part-0.csv").write_text("\n".join(lines) + "\n")
    dataset = StructuredDataset(str(folder), format="csv", batch_size=100, with_row_ids=True, output_format="dict",
                                parse_options={"bad_rows": "skip"})
    batch = next(iter(dataset))
    assert batch["_row"] == batch["id"] == [0, 1, 2, 4, 5, 6, 7]


# -- resume, other topologies, dynamic assignment ----------------------------------------------------

def test_resume_mid_epoch_and_with_other_workers_keeps_the_ids(parquet_folder):
    options = {"batch_size": 32, "shuffle": True, "seed": 2, "shuffle_buffer_size": 150, "interleave": 2,
               "with_row_ids": True}
    loader, dataset = StructuredDataset.create_dataloader(parquet_folder, num_workers=2, **options)
    dataset.set_epoch(0)
    before, state = [], None
    for step, batch in enumerate(loader):
        before.append(batch)
        if step == 6:
            state = json_roundtrip(loader.state_dict())
    rest = before[7:]
    # the same topology: exactly the batches that came after, ids and all
    same, same_dataset = StructuredDataset.create_dataloader(parquet_folder, num_workers=2, **options)
    same.load_state_dict(state)
    same_dataset.set_epoch(0)
    assert [batch_key(b) for b in same] == [batch_key(b) for b in rest]
    # another topology (elastic): the rows left, re-planned, each still naming its own place
    other, other_dataset = StructuredDataset.create_dataloader(parquet_folder, num_workers=0, **options)
    other.load_state_dict(state)
    other_dataset.set_epoch(0)
    ids = check_provenance(before[:7], dataset.files) + check_provenance(list(other), other_dataset.files)
    assert Counter(ids) == Counter(ALL_ROWS)


def test_a_checkpoint_taken_without_ids_resumes_with_them(parquet_folder):
    options = {"batch_size": 32, "shuffle": True, "seed": 4, "shuffle_buffer_size": 100}
    plain, plain_dataset = StructuredDataset.create_dataloader(parquet_folder, **options)
    batches = epoch(plain, plain_dataset)
    plain_dataset.set_epoch(0)
    for step, _ in enumerate(plain):
        if step == 4:
            state = json_roundtrip(plain.state_dict())
            break
    loader, dataset = StructuredDataset.create_dataloader(parquet_folder, with_row_ids=True, **options)
    loader.load_state_dict(state)
    dataset.set_epoch(0)
    rest = list(loader)
    check_provenance(rest, dataset.files)
    assert [batch_key(without_ids(b)) for b in rest] == [batch_key(b) for b in batches[5:]]


def test_dynamic_assignment_gives_true_positions(parquet_folder):
    loader, dataset = StructuredDataset.create_dataloader(parquet_folder, batch_size=40, num_workers=2, shuffle=True,
                                                          assignment="dynamic", with_row_ids=True)
    assert sorted(check_provenance(epoch(loader, dataset), dataset.files)) == ALL_ROWS


# -- Iceberg: positions in the data file, before its positional deletes -----------------------------------

def test_iceberg_rows_are_found_again_in_their_data_file_after_positional_deletes(tmp_path):
    catalog, config = make_catalog(str(tmp_path / "iceberg"))
    table = catalog.create_table("db.t", schema=file_table(0, 1).schema,
                                 properties={"write.parquet.row-group-limit": str(UNIT)})
    table.append(file_table(0, 430))
    table.append(file_table(1, 250))
    paths = {task.file.record_count: task.file.file_path for task in table.scan().plan_files()}
    deleted = {paths[430]: [0, 1, 99, 100, 101, 250, 429], paths[250]: list(range(40, 160))}
    add_position_deletes(table, deleted)
    loader, dataset = IcebergDataset.create_dataloader(table="db.t", catalog_config=config, batch_size=64,
                                                       shuffle=True, shuffle_buffer_size=100, output_format="arrow",
                                                       with_row_ids=True)
    got = pa.Table.from_batches(epoch(loader, dataset))
    assert got.num_rows == 430 + 250 - 7 - 120
    for index, path in enumerate(dataset.files):
        mine = got.filter(pc.equal(got.column("_file"), index))
        in_file = pq.read_table(path.removeprefix("file://")).column("id").to_numpy()
        # pyarrow finds each row again at its _row: the positions count the deleted rows
        assert np.array_equal(in_file[mine.column("_row").to_numpy()], mine.column("id").to_numpy())
        gone = set(deleted[path])
        assert gone.isdisjoint(mine.column("_row").to_pylist()) and len(mine) == len(in_file) - len(gone)


# -- mixtures ----------------------------------------------------------------------------------------

def test_mixture_ids_index_the_files_of_every_source(tmp_path):
    first = write_files(tmp_path / "a", "parquet", rows=(300, 200))
    second = write_files(tmp_path / "b", "parquet", rows=(250,), first=7)
    loader, mixture = Mixture.create_dataloader(
        {"a": Source(first), "b": Source(second)}, weights={"a": 1, "b": 1}, epoch_rows=500, batch_size=40,
        shuffle=True, shuffle_buffer_size=100, source_column="source", with_row_ids=True, num_workers=2)
    mixture.set_epoch(0)
    batches = []
    for step, batch in enumerate(loader):
        batches.append(batch)
        if step == 3:
            state = json_roundtrip(loader.state_dict())
    ids = check_provenance(batches, mixture.files)
    assert [os.path.basename(f) for f in mixture.files] == ["part-0.parquet", "part-1.parquet", "part-7.parquet"]
    assert len(ids) == len(set(ids)) == 500   # 250 of each: no second pass
    for batch in batches:   # the source column agrees with the file's source
        assert all((mixture.files[f].startswith(second)) == (s == "b") for f, s in zip(batch["_file"].tolist(),
                                                                                    batch["source"], strict=True))
    # resumed with another number of workers (the epoch re-planned): the rest, each row naming its place
    other, other_mixture = Mixture.create_dataloader(
        {"a": Source(first), "b": Source(second)}, weights={"a": 1, "b": 1}, epoch_rows=500, batch_size=40,
        shuffle=True, shuffle_buffer_size=100, source_column="source", with_row_ids=True, num_workers=0)
    other.load_state_dict(state)
    other_mixture.set_epoch(0)
    assert Counter(check_provenance(batches[:4], mixture.files) + check_provenance(list(other), other_mixture.files)) \
        == Counter(ids)


# -- a column of the same name ------------------------------------------------------------------------

def test_a_column_named_like_a_row_id_is_refused_unless_left_out(tmp_path):
    folder = tmp_path / "clash"
    folder.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "_row": [5, 6]}), folder / "part-0.parquet")
    with pytest.raises(errors.InvalidArgumentError, match=r"column '_row'.*columns=\[\.\.\.\]"):
        StructuredDataset(str(folder), with_row_ids=True)
    batch = next(iter(StructuredDataset(str(folder), with_row_ids=True, columns=["id"], output_format="dict")))
    assert batch == {"id": [1, 2], "_file": [0, 0], "_row": [0, 1]}
    with pytest.raises(errors.InvalidArgumentError, match=r"source 'a'.*'_row'"):
        Mixture({"a": Source(str(folder))}, with_row_ids=True)
    with pytest.raises(errors.ArgumentTypeError, match="with_row_ids"):
        StructuredDataset(str(folder), with_row_ids="yes")
