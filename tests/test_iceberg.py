"""Iceberg tables: the reader contract, and results equal to pyiceberg's own ``scan().to_arrow()``.

Every table lives in pyiceberg's SQL catalog on SQLite with a warehouse under ``tmp_path``.
Positional delete files and ORC data files, which pyiceberg does not write, are written by
``iceberg_tables`` through pyiceberg's manifest and snapshot classes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import check_resume, ids_of
from iceberg_tables import add_position_deletes, append_orc, data_files, make_catalog
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType, StructType
from test_formats import UNIT_ROWS, ReaderContract

from arrowstream import IcebergDataset, errors
from arrowstream._loader.torchdata_state import worker_states

ROW_GROUP_LIMIT = {"write.parquet.row-group-limit": str(UNIT_ROWS)}


class TestIcebergContract(ReaderContract):
    """The reader contract on an Iceberg table: one append (one data file) per table."""

    format = "iceberg"
    unit_named = r"Iceberg data unit \d"

    def source(self, tmp_path: Path, tables: list[pa.Table], unit_rows: int = UNIT_ROWS) -> Any:
        catalog, config = make_catalog(str(tmp_path / "iceberg"))
        table = catalog.create_table("db.contract", schema=tables[0].schema,
                                     properties={"write.parquet.row-group-limit": str(unit_rows)})
        for data in tables:
            if data.num_rows:
                table.append(data)
        return {"config": config, "table": table}

    def factory(self, source: Any, num_workers: int, **options: Any) -> tuple[Any, Any]:
        if "columns" in options:
            options["selected_fields"] = options.pop("columns")
        return IcebergDataset.create_dataloader(table="db.contract", catalog_config=source["config"],
                                                num_workers=num_workers, **options)

    def expected(self, source: Any) -> pa.Table:
        return source["table"].refresh().scan().to_arrow()

    def filter_options(self, columns: list[str]) -> dict[str, Any]:
        return {"selected_fields": columns, "row_filter": "label = 3 or x > 1.0"}

    def corrupt(self, source: Any) -> str:
        victim = data_files(source["table"])[0].removeprefix("file://")
        Path(victim).write_bytes(b"this is not a data file at all, " * 8)
        return Path(victim).name


# -- results equal pyiceberg's -----------------------------------------------------------------

def rows(start: int, count: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed + start)
    return pa.table({"id": pa.array(np.arange(start, start + count), pa.int64()),
                     "score": pa.array(rng.random(count), pa.float64()),
                     "name": pa.array([f"row-{i}" for i in range(start, start + count)], pa.string())})


@pytest.fixture
def catalog(tmp_path):
    return make_catalog(str(tmp_path / "iceberg"))


def read_all(config: dict[str, str], table: str = "db.events", num_workers: int = 0, **options: Any) -> pa.Table:
    loader, dataset = IcebergDataset.create_dataloader(table=table, catalog_config=config, batch_size=128,
                                                       num_workers=num_workers, output_format="arrow", **options)
    dataset.set_epoch(0)
    return pa.Table.from_batches(list(loader))


def assert_same_rows(got: pa.Table, expected: pa.Table) -> None:
    assert sorted(got.column_names) == sorted(expected.column_names)
    expected = expected.select(got.column_names)
    assert got.num_rows == expected.num_rows
    assert got.sort_by("id").equals(expected.sort_by("id"))


def events(catalog_and_config, appends=((0, 1000), (1000, 700), (1700, 300))):
    catalog, _ = catalog_and_config
    table = catalog.create_table("db.events", schema=rows(0, 1).schema, properties=ROW_GROUP_LIMIT)
    for start, count in appends:
        table.append(rows(start, count))
    return table


def test_appends_and_a_delete_equal_pyiceberg(catalog):
    table = events(catalog)
    table.delete("id >= 900 and id < 1100")   # pyiceberg rewrites the files (copy-on-write)
    table = table.refresh()
    assert_same_rows(read_all(catalog[1]), table.scan().to_arrow())
    assert read_all(catalog[1]).num_rows == 1800


@pytest.mark.parametrize("num_workers", [0, 2])
def test_row_filter_and_projection_equal_pyiceberg(catalog, num_workers):
    table = events(catalog)
    got = read_all(catalog[1], num_workers=num_workers, row_filter="score > 0.7 and id < 1500",
                   selected_fields=["name", "id"])
    expected = table.scan(row_filter="score > 0.7 and id < 1500", selected_fields=("name", "id")).to_arrow()
    assert_same_rows(got, expected)
    assert got.column_names == ["name", "id"]


def test_row_filter_prunes_data_files(catalog):
    events(catalog)
    _, dataset = IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1], row_filter="id >= 1700")
    assert dataset.num_files == 1   # pyiceberg's manifest statistics keep only the third append


def test_evolved_schema_is_read_by_field_id(catalog):
    table = events(catalog, appends=((0, 600),))
    with table.update_schema() as update:
        update.rename_column("score", "quality")
        update.add_column("extra", LongType())
    table = table.refresh()
    table.append(pa.table({"id": pa.array(np.arange(600, 900), pa.int64()),
                           "quality": pa.array(np.linspace(0, 1, 300), pa.float64()),
                           "name": pa.array([f"row-{i}" for i in range(600, 900)], pa.string()),
                           "extra": pa.array(np.arange(300), pa.int64())}))
    with table.update_schema() as update:
        update.delete_column("name")
    table = table.refresh()
    got = read_all(catalog[1])
    assert got.column_names == ["id", "quality", "extra"]
    assert_same_rows(got, table.scan().to_arrow())
    assert got.sort_by("id").column("extra").null_count == 600   # old files lack the added column
    # the old snapshot is read in its own schema, as pyiceberg does
    first = table.snapshots()[0].snapshot_id
    assert_same_rows(read_all(catalog[1], snapshot_id=first), table.scan(snapshot_id=first).to_arrow())


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_field_made_optional_is_read_nullable_from_files_written_while_it_was_required(catalog, num_workers):
    # pyiceberg's schema decides (a dataset's files are joined, see test_errors): files written while a field was
    # required hold it not null, at the top and inside a struct; read in the table's schema, values intact
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "x", LongType(), required=True),
                    NestedField(3, "s", StructType(NestedField(4, "c", LongType(), required=True)), required=True))
    table = catalog[0].create_table("db.optional", schema=schema, properties={"write.parquet.row-group-limit": "4"})
    table.append(pa.Table.from_pylist([{"id": i, "x": i, "s": {"c": i}} for i in range(10)],
                                      schema=table.schema().as_arrow()))
    with table.update_schema() as update:
        update.make_column_optional("x")
        update.make_column_optional("s.c")
    table = table.refresh()
    table.append(pa.Table.from_pylist([{"id": i, "x": None if i % 2 else i, "s": {"c": None if i % 3 else i}}
                                       for i in range(10, 20)], schema=table.schema().as_arrow()))
    written = {pq.read_schema(path.removeprefix("file://")).field("x").nullable for path in data_files(table)}
    assert written == {False, True}
    expected = sorted((i, None if i >= 10 and i % 2 else i, None if i >= 10 and i % 3 else i) for i in range(20))
    for output_format in ("torch", "numpy", "arrow", "dict"):
        for buffer in (0, 8):   # interleave=2: rows of both files in one batch
            fill = {"x": -1} if output_format in ("torch", "numpy") else None
            loader, dataset = IcebergDataset.create_dataloader(
                table="db.optional", catalog_config=catalog[1], batch_size=6, output_format=output_format, shuffle=True,
                shuffle_buffer_size=buffer, interleave=2, num_workers=num_workers, fill_nulls=fill)
            assert dataset.schema == table.schema().as_arrow()   # x and s.c nullable, id and s not
            got = []
            for batch in loader:
                if output_format == "arrow":
                    assert batch.schema == dataset.schema
                    batch = batch.to_pydict()
                got += [(int(i), None if fill and int(x) == -1 else x if x is None else int(x), s["c"])
                        for i, x, s in zip(batch["id"], batch["x"], batch["s"], strict=True)]
            assert sorted(got) == expected, (output_format, buffer)


def files_by_rows(table) -> dict[int, str]:
    return {task.file.record_count: task.file.file_path for task in table.scan().plan_files()}


@pytest.fixture
def with_deletes(catalog):
    table = events(catalog)
    files = files_by_rows(table)
    deletes = {files[1000]: [0, 1, 149, 150, 151, 640, 999], files[700]: list(range(100, 260)) + [699]}
    return add_position_deletes(table, deletes), 2000 - 7 - 161


@pytest.mark.parametrize("num_workers", [0, 2])
def test_positional_deletes_are_applied(catalog, with_deletes, num_workers):
    table, remaining = with_deletes
    assert any(task.delete_files for task in table.scan().plan_files())
    got = read_all(catalog[1], num_workers=num_workers)
    assert got.num_rows == remaining
    assert_same_rows(got, table.scan().to_arrow())


def test_positional_deletes_are_counted_from_metadata_and_resume_exactly(catalog, with_deletes):
    table, remaining = with_deletes
    kept = set(table.scan().to_arrow().column("id").to_pylist())
    _, dataset = IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1], batch_size=64)
    assert dataset._plan.num_rows == remaining
    assert dataset.num_batches() == -(-remaining // 64)   # exact without reading: deletes are known at planning

    def factory(source, num_workers, **options):
        return IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1],
                                                num_workers=num_workers, **options)

    def rows_of_epoch(batches, dataset):
        for epoch in {e for e, _, _ in batches}:
            ids = [i for e, _, batch_ids in batches if e == epoch for i in batch_ids]
            assert sorted(ids) == sorted(kept)

    options = {"batch_size": 64, "shuffle": True, "seed": 3, "shuffle_buffer_size": 100}
    check_resume(None, 2, options, rows_of_epoch, mid=4, factory=factory)


def test_orc_backed_table_equals_pyiceberg(catalog):
    catalog_, config = catalog
    table = catalog_.create_table("db.orc_events", schema=rows(0, 1).schema)
    table = append_orc(table, rows(0, 3000), stripe_rows=250)
    table = append_orc(table, rows(3000, 500), stripe_rows=100)
    assert {task.file.file_format for task in table.scan().plan_files()} == {FileFormat.ORC}
    _, dataset = IcebergDataset.create_dataloader(table="db.orc_events", catalog_config=config, batch_size=100)
    assert len(dataset._plan.splits) == 3000 // 250 + 500 // 100   # one split per stripe
    with table.update_schema() as update:
        update.rename_column("score", "quality")
        update.add_column("note", StringType())
    table = add_position_deletes(table.refresh(), {files_by_rows(table)[3000]: [3, 4, 5, 2999]})
    for num_workers in (0, 2):
        got = read_all(config, table="db.orc_events", num_workers=num_workers)
        assert_same_rows(got, table.scan().to_arrow())
    assert got.num_rows == 3496 and got.column_names == ["id", "quality", "name", "note"]


# -- the pinned snapshot -----------------------------------------------------------------------

def test_resume_continues_on_the_pinned_snapshot_after_an_append(catalog):
    table = events(catalog)
    options = {"batch_size": 50, "shuffle": True, "seed": 9, "shuffle_buffer_size": 120}
    loader, dataset = IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1],
                                                       num_workers=2, **options)
    pinned = dataset.snapshot_id
    reference, state = [], None
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        for step, batch in enumerate(loader):
            reference.append(ids_of(batch))
            if epoch == 0 and step == 6:
                state, consumed = json.loads(json.dumps(loader.state_dict())), len(reference)
    saved = worker_states(state["dataloader"])
    assert {s["data"]["snapshot_id"] for s in saved} == {pinned}

    table.append(rows(2000, 500))          # the table moves on
    fresh_loader, fresh_dataset = IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1],
                                                                   num_workers=2, **options)
    assert fresh_dataset.snapshot_id != pinned
    fresh_loader.load_state_dict(state)
    assert fresh_dataset.snapshot_id == pinned
    resumed = []
    for epoch in (0, 1):
        fresh_dataset.set_epoch(epoch)
        resumed.extend(ids_of(batch) for batch in fresh_loader)
    assert resumed == reference[consumed:]

    # a dataset pinned to the new snapshot refuses the old state, naming both
    _, latest = IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1], num_workers=2,
                                                 snapshot_id=table.refresh().current_snapshot().snapshot_id, **options)
    with pytest.raises(errors.StateMismatchError, match=str(pinned)):
        latest.load_state_dict(saved[0])


@pytest.mark.parametrize("num_workers,merged", [(0, False), (2, False), (2, True)])
def test_a_dynamic_checkpoint_resumes_on_its_pinned_snapshot_after_an_append(catalog, num_workers, merged):
    """assignment='dynamic': the rest of the epoch is the checkpoint snapshot's, each row once, none of the rows
    appended since; the next epoch reads that snapshot whole (as the static path does)."""
    from arrowstream import merge_state_dicts

    table = events(catalog)
    options = {"batch_size": 50, "shuffle": True, "seed": 9, "assignment": "dynamic", "plan_cache": False}
    world = {"world_size": 2, "plan_locally": True} if merged else {}
    before, states = [], []
    for rank in range(2 if merged else 1):
        loader, dataset = IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1],
                                                           num_workers=num_workers, **world,
                                                           **({"rank": rank} if merged else {}), **options)
        pinned = dataset.snapshot_id
        dataset.set_epoch(0)
        for step, batch in enumerate(loader):
            before.extend(ids_of(batch))
            if step == 6:
                break
        states.append(json.loads(json.dumps(loader.state_dict())))
    state = merge_state_dicts(states) if merged else states[0]

    table.append(rows(2000, 500))          # the table moves on
    after, per_rank = [], []
    for rank in range(2 if merged else 1):
        fresh_loader, fresh_dataset = IcebergDataset.create_dataloader(
            table="db.events", catalog_config=catalog[1], num_workers=num_workers, **world,
            **({"rank": rank} if merged else {}), **options)
        assert fresh_dataset.snapshot_id != pinned
        fresh_loader.load_state_dict(state)
        assert fresh_dataset.snapshot_id == pinned
        fresh_dataset.set_epoch(0)
        after.extend(i for batch in fresh_loader for i in ids_of(batch))
        fresh_dataset.set_epoch(1)
        per_rank.append([i for batch in fresh_loader for i in ids_of(batch)])
    trimmed = 2000 - len(before) - len(after)
    assert len(before + after) == len(set(before + after)) and max(before + after) < 2000
    assert 0 <= trimmed < 50 * 2   # even_batches trims less than a batch per rank; one rank trims nothing
    assert not merged or trimmed == 0 or trimmed == 2000 % (50 * 2)
    epoch1 = [i for ids in per_rank for i in ids]
    assert len(epoch1) == len(set(epoch1)) and max(epoch1) < 2000 and len(epoch1) == 2000 - trimmed


@pytest.mark.parametrize("assignment", ["static", "dynamic"])
def test_a_refused_checkpoint_leaves_the_dataset_on_its_own_snapshot(catalog, assignment):
    """Loading a checkpoint follows its pinned snapshot before the checks that may refuse it; a refusal puts the
    dataset back on the snapshot it had: the rows appended since the checkpoint are read, each once."""
    table = events(catalog)
    options = {"batch_size": 50, "shuffle": True, "seed": 9, "assignment": assignment, "plan_cache": False}
    loader, dataset = IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1], **options)
    pinned = dataset.snapshot_id
    dataset.set_epoch(0)
    for step, _ in enumerate(loader):
        if step == 6:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    saved = [state["dynamic"]] if assignment == "dynamic" else worker_states(state["dataloader"])
    assert {s["data"]["snapshot_id"] for s in saved} == {pinned}
    for s in saved:
        s["options"]["seed"] = 10   # tampered: refused after the snapshot is followed

    table.append(rows(2000, 500))          # the table moves on
    fresh_loader, fresh_dataset = IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1],
                                                                   **options)
    current = fresh_dataset.snapshot_id
    assert current != pinned and fresh_dataset.num_rows == 2500
    with pytest.raises(errors.StateMismatchError, match="seed: saved 10 vs current 9"):
        fresh_loader.load_state_dict(state)
    assert fresh_dataset.snapshot_id == current and fresh_dataset.num_rows == 2500
    if assignment == "static":   # a worker state loaded into the dataset (a plain StatefulDataLoader's worker)
        with pytest.raises(errors.StateMismatchError, match="seed: saved 10 vs current 9"):
            fresh_dataset.load_state_dict(saved[0])
        assert fresh_dataset.snapshot_id == current and fresh_dataset.num_rows == 2500
    fresh_dataset.set_epoch(0)
    ids = [i for batch in fresh_loader for i in ids_of(batch)]
    assert sorted(ids) == list(range(2500))


def test_resume_refuses_an_expired_snapshot(catalog):
    table = events(catalog)
    loader, dataset = IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1], batch_size=100)
    dataset.set_epoch(0)
    iterator = iter(loader)
    next(iterator)
    state = json.loads(json.dumps(loader.state_dict()))
    pinned = dataset.snapshot_id
    table.append(rows(2000, 100))
    table = table.refresh()
    table.maintenance.expire_snapshots().by_id(pinned).commit()
    fresh_loader, _ = IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1], batch_size=100)
    with pytest.raises(errors.StateMismatchError, match=f"snapshot {pinned}.*expired"):
        fresh_loader.load_state_dict(state)


def test_resume_refuses_a_recreated_table_as_such(catalog):
    """A table dropped and recreated under its name is named as recreated (its uuid changed), not as an
    expired snapshot; the new table's own checkpoints still resume."""
    table = events(catalog, appends=((0, 300), (300, 300)))
    loader, dataset = IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1], batch_size=100)
    dataset.set_epoch(0)
    next(iter(loader))
    state = json.loads(json.dumps(loader.state_dict()))
    saved_uuid = str(table.metadata.table_uuid)
    catalog[0].drop_table("db.events")
    recreated = events(catalog, appends=((0, 300), (300, 300)))
    fresh_loader, fresh = IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1], batch_size=100)
    with pytest.raises(errors.StateMismatchError) as info:
        fresh_loader.load_state_dict(state)
    assert (f"'db.events' before it was dropped and recreated under the same name: recreated (table uuid changed: "
            f"saved {saved_uuid}, now {recreated.metadata.table_uuid})") in str(info.value)
    assert "expired" not in str(info.value)
    older = json.loads(json.dumps(state).replace(f'"table_uuid": "{saved_uuid}"', '"unused": null'))
    assert "table_uuid" not in json.dumps(older)       # as arrowstream wrote it before the uuid was recorded
    with pytest.raises(errors.StateMismatchError, match=r"which has expired or the table was dropped and recreated"):
        fresh_loader.load_state_dict(older)
    malformed = json.loads(json.dumps(state).replace(f'"table_uuid": "{saved_uuid}"', '"table_uuid": 5'))
    with pytest.raises(errors.StateError, match=r"table_uuid is 5, expected a string or null"):
        fresh_loader.load_state_dict(malformed)
    fresh.set_epoch(0)
    next(iter(fresh_loader))
    fresh_loader.load_state_dict(json.loads(json.dumps(fresh_loader.state_dict())))   # same table: loads


def test_a_data_file_missing_before_planning_is_named_as_missing(catalog, with_deletes):
    table, _ = with_deletes
    snapshot = table.current_snapshot().snapshot_id
    victims = [p for p in data_files(table) if "deletes-" not in p]
    Path(victims[0].removeprefix("file://")).unlink()
    with pytest.raises(errors.FileReadError) as info:
        IcebergDataset("db.events", catalog_config=catalog[1])
    assert str(info.value).startswith(f"{victims[0]}: missing: data file listed in snapshot {snapshot} of "
                                      "'db.events' but not in storage")
    assert "after planning" not in str(info.value)

    deleted = next(d.file_path for task in table.scan().plan_files() for d in task.delete_files)
    Path(deleted.removeprefix("file://")).unlink()
    with pytest.raises(errors.FileReadError, match=rf"^{re.escape(deleted)}: missing: positional delete file listed "
                                                   rf"in snapshot {snapshot} of 'db.events' but not in storage"):
        IcebergDataset("db.events", catalog_config=catalog[1])


def test_a_data_file_gone_after_planning_is_named_as_such(catalog):
    table = events(catalog, appends=((0, 100),))
    loader, dataset = IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1], batch_size=50)
    victim = data_files(table)[0]
    Path(victim.removeprefix("file://")).unlink()
    dataset.set_epoch(0)
    with pytest.raises(errors.FileReadError, match=rf"^{re.escape(victim)}: the file disappeared after planning"):
        list(loader)


def test_state_holds_no_paths_or_catalog_settings(catalog, tmp_path):
    events(catalog)
    loader, dataset = IcebergDataset.create_dataloader(table="db.events", catalog_config=catalog[1], num_workers=2)
    dataset.set_epoch(0)
    next(iter(loader))
    text = json.dumps(loader.state_dict())
    assert str(tmp_path) not in text and "sqlite" not in text and "warehouse" not in text
    assert str(tmp_path) not in repr(dataset) and str(tmp_path) not in repr(dataset._storage)


# -- clear errors ------------------------------------------------------------------------------

def test_equality_deletes_are_refused_clearly(catalog, tmp_path):
    from iceberg_tables import _AppendDeleteFiles, _local
    from pyiceberg.table.snapshots import Operation

    table = events(catalog, appends=((0, 100),))
    path = f"{table.metadata.location}/data/eq-deletes.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": pa.array([5], pa.int64())}), _local(path))
    delete_file = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES, file_path=path, file_format=FileFormat.PARQUET, partition=Record(),
        record_count=1, file_size_in_bytes=Path(_local(path)).stat().st_size, spec_id=0, equality_ids=[1],
        key_metadata=None, sort_order_id=None)
    with table.transaction() as tx:
        producer = _AppendDeleteFiles(operation=Operation.DELETE, transaction=tx, io=table.io)
        producer.append_data_file(delete_file)
        producer.commit()
    with pytest.raises(errors.NotSupportedYetError, match="equality delete"):
        IcebergDataset("db.events", catalog_config=catalog[1])


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"table": "db.missing"}, errors.DatasetNotFoundError, "db.missing"),
    ({"table": "db.events", "row_filter": "nope > 1"}, errors.InvalidArgumentError, "row_filter"),
    ({"table": "db.events", "selected_fields": ["nope"]}, errors.InvalidArgumentError, "selected_fields"),
    ({"table": "db.events", "snapshot_id": 12345}, errors.InvalidArgumentError, "no snapshot 12345"),
    ({"table": "db.events", "columns": ["id"]}, errors.InvalidArgumentError, "selected_fields"),
    ({"table": "db.events", "storage_options": {"key": "x"}}, errors.InvalidArgumentError, "catalog_config"),
])
def test_bad_arguments(catalog, kwargs, error, match):
    events(catalog, appends=((0, 10),))
    with pytest.raises(error, match=match):
        IcebergDataset(catalog_config=catalog[1], **kwargs)


def test_table_without_snapshot_is_empty(catalog):
    catalog[0].create_table("db.empty", schema=rows(0, 1).schema)
    with pytest.raises(errors.EmptyDatasetError, match="no rows"):
        IcebergDataset("db.empty", catalog_config=catalog[1])


def test_partitioned_table_equals_pyiceberg(catalog):
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import IntegerType, NestedField, TimestampType

    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "label", IntegerType(), required=False),
                    NestedField(3, "at", TimestampType(), required=False), NestedField(4, "region", StringType(),
                                                                                      required=False))
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "label"),
                         PartitionField(4, 1001, IdentityTransform(), "region"))
    table = catalog[0].create_table("db.parted", schema=schema, partition_spec=spec, properties=ROW_GROUP_LIMIT)
    count = 1200
    start = np.datetime64("2026-01-01T00:00:00", "us")
    table.append(pa.table({"id": pa.array(np.arange(count), pa.int64()),
                           "label": pa.array(np.arange(count) % 3, pa.int32()),
                           "at": pa.array(start + np.arange(count) * np.timedelta64(3600, "s"), pa.timestamp("us")),
                           "region": pa.array(["eu", "us"] * (count // 2), pa.string())}))
    table = table.refresh()
    assert len(list(table.scan().plan_files())) == 6     # one data file per (label, region)
    for options in ({}, {"row_filter": "label = 1"}, {"selected_fields": ["at", "id"], "row_filter": "region = 'eu'"}):
        expected = table.scan(**{k: tuple(v) if k == "selected_fields" else v for k, v in options.items()}).to_arrow()
        for num_workers in (0, 2):
            assert_same_rows(read_all(catalog[1], table="db.parted", num_workers=num_workers, **options), expected)


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_workers_started_by_spawn_and_forkserver_read_the_table(catalog, with_deletes, context):
    """The catalog connection stays in the main process; each worker opens the table's FileIO itself."""
    table, remaining = with_deletes
    got = read_all(catalog[1], num_workers=2, multiprocessing_context=context)
    assert got.num_rows == remaining
    assert_same_rows(got, table.scan().to_arrow())


def test_dynamic_assignment_over_positional_deletes_resumes_once_with_other_workers(catalog, with_deletes):
    """Leases cut data files at row offsets; the deletes still apply, and a checkpoint's rest is read once."""
    table, remaining = with_deletes
    kept = sorted(table.scan().to_arrow().column("id").to_pylist())
    options = {"table": "db.events", "catalog_config": catalog[1], "batch_size": 64, "assignment": "dynamic",
               "shuffle": True, "shuffle_buffer_size": 100, "interleave": 2}
    loader, _ = IcebergDataset.create_dataloader(num_workers=2, **options)
    seen = []
    for step, batch in enumerate(loader):
        seen += batch["id"].tolist()
        if step == 6:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    fresh, _ = IcebergDataset.create_dataloader(num_workers=3, **options)
    fresh.load_state_dict(state)
    rest = [i for batch in fresh for i in batch["id"].tolist()]
    assert sorted(seen + rest) == kept and len(seen + rest) == remaining


# -- the catalog through arrowstream --------------------------------------------------------------


def _first_python_block(page: str, heading: str) -> str:
    text = (Path(__file__).parent.parent / "docs" / page).read_text()
    section = text[text.index(f"\n{heading}\n"):]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize(("page", "heading"), [("quickstart.md", "## Iceberg tables"),
                                               ("iceberg.md", "## A first loader")])
def test_the_docs_iceberg_block_without_pyiceberg_says_what_to_install(page, heading, tmp_path):
    """The block's first failure is arrowstream's MissingDependencyError naming the extra, not a raw
    ModuleNotFoundError of an `import pyiceberg` before arrowstream could say it."""
    (tmp_path / "block.py").write_text(_first_python_block(page, heading))
    hidden = "import runpy, sys; sys.modules['pyiceberg'] = None; runpy.run_path('block.py')"   # as if not installed
    result = subprocess.run([sys.executable, "-c", hidden], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and last.startswith("arrowstream.errors.MissingDependencyError: reading Iceberg "
                                                      "tables needs pyiceberg"), result.stderr
    assert re.search(r'"arrowstream-.*\.whl\[iceberg\]"', last), last


def test_iceberg_catalog_opens_the_catalog_the_dataset_reads(tmp_path):
    import arrowstream

    config = arrowstream.iceberg_catalog_config(str(tmp_path))
    catalog = arrowstream.iceberg_catalog(config)
    catalog.create_namespace("db")
    catalog.create_table("db.events", schema=rows(0, 1).schema).append(rows(0, 30))
    assert IcebergDataset("db.events", catalog_config=config).num_rows == 30
    with pytest.raises(errors.InvalidArgumentError, match="catalog_config: pyiceberg cannot load catalog 'default' of "
                                                          "type 'nosuch'"):
        arrowstream.iceberg_catalog({"type": "nosuch"})


def test_a_data_file_that_is_not_its_format_gets_no_format_hint(catalog):
    """A table names its data files' format: no `format=` to pass, so the error does not suggest one."""
    catalog, config = catalog
    catalog.create_table("db.events", schema=rows(0, 1).schema).append(rows(0, 30))
    victim = data_files(catalog.load_table("db.events"))[0].removeprefix("file://")
    Path(victim).write_bytes(b"id,score,name\n1,0.5,a\n")
    with pytest.raises(errors.CorruptFileError, match=re.escape(Path(victim).name)) as info:
        IcebergDataset("db.events", catalog_config=config)
    assert "format=" not in str(info.value) and "looks like" not in str(info.value)


def test_canonical_order_reads_an_iceberg_table_in_one_sequence_on_any_topology(catalog, with_deletes):
    """order="canonical" (#39) over an Iceberg table with positional deletes: the same global batches on 1 rank
    without workers and on 2 ranks of 2 workers (string column joined from the workers' parts), every live row once,
    and a merged checkpoint of one resumed on the other."""
    import copy

    import arrowstream

    table, remaining = with_deletes
    kept = set(table.scan().to_arrow().column("id").to_pylist())

    def ranks(world_size, num_workers):
        return [IcebergDataset.create_dataloader(
            table="db.events", catalog_config=catalog[1], batch_size=128 // world_size, num_workers=num_workers,
            rank=rank, world_size=world_size, shuffle=True, seed=2, shuffle_buffer_size=50, order="canonical",
            canonical_slots=8) for rank in range(world_size)]

    def run(loaders, stop=None):
        out, iterators = [], [iter(loader) for loader, _ in loaders]
        for step, parts in enumerate(zip(*iterators), start=1):
            out.append([(int(i), n) for part in parts for i, n in zip(part["id"], part["name"], strict=True)])
            if step == stop:
                return out, arrowstream.merge_state_dicts([loader.state_dict() for loader, _ in loaders])
        return out, None

    reference = run(ranks(1, 0))[0]
    ids = [i for batch in reference for i, _ in batch]
    assert sorted(ids) == sorted(kept) and len(ids) == remaining   # 8 slots of 229 live rows: nothing trimmed
    assert all(name == f"row-{i}" for batch in reference for i, name in batch)
    assert run(ranks(2, 2))[0] == reference
    first, saved = run(ranks(2, 2), stop=5)
    resumed = ranks(1, 0)
    resumed[0][0].load_state_dict(copy.deepcopy(saved))
    assert first + run(resumed)[0] == reference
