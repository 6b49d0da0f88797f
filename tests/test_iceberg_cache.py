"""The plan cache of Iceberg snapshots (``arrowstream._sources.iceberg_cache``): a warm start reads the manifests and
no data file footer and no delete file, plans what a cold start plans, resumes exactly; one entry per snapshot;
damaged or stale entries are rebuilt; no credentials or catalog settings in an entry."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pyiceberg.io.pyarrow as pyiceberg_pyarrow
import pytest
from helpers import check_resume
from iceberg_tables import add_position_deletes, make_catalog
from pyiceberg.io.pyarrow import PyArrowFileIO
from test_iceberg import ROW_GROUP_LIMIT, assert_same_rows, files_by_rows, read_all, rows
from test_plan_cache import _entry_of, _entry_parts

import arrowstream._formats.footers as footers_module
import arrowstream._sources.iceberg_files as iceberg_module
from arrowstream import IcebergDataset, errors
from arrowstream._planning import cache_entry

TABLE = "db.events"


@pytest.fixture
def table_with_deletes(tmp_path):
    catalog, config = make_catalog(str(tmp_path / "iceberg"))
    table = catalog.create_table(TABLE, schema=rows(0, 1).schema, properties=ROW_GROUP_LIMIT)
    for start, count in ((0, 1000), (1000, 700), (1700, 300)):
        table.append(rows(start, count))
    files = files_by_rows(table)
    table = add_position_deletes(table, {files[1000]: [0, 1, 149, 150, 151, 640, 999],
                                         files[700]: list(range(100, 260)) + [699]})
    return table, config


@pytest.fixture
def reads(monkeypatch):
    """What planning reads from storage: footers (read_footer), delete files (pyiceberg's reader) and every
    file the table's FileIO opens (manifests, data and delete files), by path."""
    counted: dict[str, Any] = {"footers": 0, "delete_reads": 0, "opened": []}
    read_footer, read_deletes, new_input = (iceberg_module.read_footer, pyiceberg_pyarrow._read_all_delete_files,
                                            PyArrowFileIO.new_input)

    def counted_footer(*args: Any, **kwargs: Any) -> Any:
        counted["footers"] += 1
        return read_footer(*args, **kwargs)

    def counted_deletes(*args: Any, **kwargs: Any) -> Any:
        counted["delete_reads"] += 1
        return read_deletes(*args, **kwargs)

    def counted_input(self: Any, location: str) -> Any:
        counted["opened"].append(location)
        return new_input(self, location)

    monkeypatch.setattr(iceberg_module, "read_footer", counted_footer)
    monkeypatch.setattr(pyiceberg_pyarrow, "_read_all_delete_files", counted_deletes)
    monkeypatch.setattr(PyArrowFileIO, "new_input", counted_input)
    return counted


def cache_files() -> list[Path]:
    return sorted(Path(os.environ["ARROWSTREAM_CACHE_DIR"]).glob("*.plan"))


def the_entry() -> Path:
    (entry,) = cache_files()
    return entry


def plan_facts(dataset: IcebergDataset) -> tuple:
    plan = dataset._plan
    return (plan.data_fingerprint, list(plan.splits), plan.num_rows,
            [(f.entry, f.unit_rows, f.unit_bytes, f.kept_units, f.extra.inner.unit_rows, f.extra.inner.schema,
              None if f.extra.deleted is None else f.extra.deleted.tolist(), f.extra.arrow_schema)
             for f in plan.files])


def data_and_delete_files(table: Any) -> set[str]:
    tasks = list(table.scan().plan_files())
    return {t.file.file_path for t in tasks} | {d.file_path for t in tasks for d in t.delete_files}


def test_a_warm_start_reads_no_footer_and_no_delete_file(table_with_deletes, reads):
    """The second start reads the manifests only; its plan is the cold plan and its rows pyiceberg's, deletes
    applied."""
    table, config = table_with_deletes
    cold = IcebergDataset(TABLE, catalog_config=config, plan_cache=False)
    first = IcebergDataset(TABLE, catalog_config=config)
    assert first._origin.cache_outcome.action == "built"
    assert reads["footers"] == 2 * 3 and reads["delete_reads"] == 2
    reads.update(footers=0, delete_reads=0, opened=[])
    warm = IcebergDataset(TABLE, catalog_config=config)
    assert warm._origin.cache_outcome.action == "hit"
    assert (reads["footers"], reads["delete_reads"]) == (0, 0)
    assert reads["opened"] and not set(reads["opened"]) & data_and_delete_files(table)   # manifests: yes
    assert plan_facts(warm) == plan_facts(cold) == plan_facts(first)
    assert warm._plan.num_rows == 2000 - 7 - 161
    assert_same_rows(read_all(config), table.scan().to_arrow())


def test_exact_resume_across_cached_restarts(table_with_deletes, reads):
    """Every loader of the resume check (the reference and each restart from a state) plans from the entry;
    each state resumes to exactly the reference's continuation, every kept row once per epoch."""
    table, config = table_with_deletes
    kept = sorted(table.scan().to_arrow().column("id").to_pylist())
    IcebergDataset(TABLE, catalog_config=config)   # writes the entry
    reads.update(footers=0, delete_reads=0)
    outcomes = []

    def factory(source, num_workers, **options):
        loader, dataset = IcebergDataset.create_dataloader(table=TABLE, catalog_config=config,
                                                           num_workers=num_workers, **options)
        outcomes.append(dataset._origin.cache_outcome.action)
        return loader, dataset

    def rows_of_epoch(batches, dataset):
        for epoch in {e for e, _, _ in batches}:
            assert sorted(i for e, _, ids in batches if e == epoch for i in ids) == kept

    check_resume(None, 2, {"batch_size": 64, "shuffle": True, "seed": 3, "shuffle_buffer_size": 100},
                 rows_of_epoch, mid=4, factory=factory)
    assert len(outcomes) > 1 and set(outcomes) == {"hit"}
    assert (reads["footers"], reads["delete_reads"]) == (0, 0)


def test_another_snapshot_is_another_entry(table_with_deletes, reads):
    table, config = table_with_deletes
    old = IcebergDataset(TABLE, catalog_config=config)
    table.append(rows(5000, 100))
    new = IcebergDataset(TABLE, catalog_config=config)
    assert new.snapshot_id != old.snapshot_id
    assert new._origin.cache_outcome.action == "built" and len(cache_files()) == 2
    assert new._plan.num_rows == old._plan.num_rows + 100
    reads.update(footers=0, delete_reads=0)
    pinned = IcebergDataset(TABLE, catalog_config=config, snapshot_id=old.snapshot_id)
    again = IcebergDataset(TABLE, catalog_config=config)
    assert [d._origin.cache_outcome.action for d in (pinned, again)] == ["hit", "hit"]
    assert plan_facts(pinned) == plan_facts(old) and plan_facts(again) == plan_facts(new)
    assert (reads["footers"], reads["delete_reads"]) == (0, 0)


def _flip(data: bytes) -> bytes:
    middle = len(data) * 2 // 3
    return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1:]


def test_a_damaged_entry_is_logged_and_rebuilt(table_with_deletes, reads, caplog):
    _, config = table_with_deletes
    cold = IcebergDataset(TABLE, catalog_config=config)
    entry = the_entry()
    entry.write_bytes(_flip(entry.read_bytes()))
    reads.update(footers=0, delete_reads=0)
    with caplog.at_level(logging.WARNING, logger="arrowstream"):
        rebuilt = IcebergDataset(TABLE, catalog_config=config)
    outcome = rebuilt._origin.cache_outcome
    assert outcome.action == "rebuilt" and "damaged" in outcome.reason
    assert any("is not used" in r.message and "damaged" in r.message for r in caplog.records)
    assert (reads["footers"], reads["delete_reads"]) == (3, 1)
    assert plan_facts(rebuilt) == plan_facts(cold)
    assert IcebergDataset(TABLE, catalog_config=config)._origin.cache_outcome.action == "hit"


def _tampered(entry: Path, column: str, change: Any) -> None:
    """Rewrite the entry with ``change`` applied to one listing column of its first file, its checksum valid
    (as if the entry were of other scan tasks)."""
    header, payload = _entry_parts(entry.read_bytes())
    table = cache_entry.read_entry_table(payload)
    values = table.column(column).to_pylist()
    values[0] = change(values[0])
    table = table.set_column(table.schema.get_field_index(column), column, pa.array(values, table.schema.field(column).type))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    entry.write_bytes(_entry_of(header, bytes(sink.getvalue())))


@pytest.mark.parametrize(("column", "change", "differs"), [
    ("path", lambda p: p.replace(".parquet", "-other.parquet"), "the path of"),
    ("size", lambda s: s + 1, "the size of"),
])
def test_an_entry_of_other_scan_tasks_is_stale(table_with_deletes, reads, caplog, column, change, differs):
    _, config = table_with_deletes
    cold = IcebergDataset(TABLE, catalog_config=config)
    _tampered(the_entry(), column, change)
    reads.update(footers=0, delete_reads=0)
    with caplog.at_level(logging.INFO, logger="arrowstream"):
        again = IcebergDataset(TABLE, catalog_config=config)
    outcome = again._origin.cache_outcome
    assert outcome.action == "rebuilt" and f"the listing changed: {differs}" in outcome.reason
    assert (reads["footers"], reads["delete_reads"]) == (3, 1)
    assert plan_facts(again) == plan_facts(cold)


def test_an_entry_holds_no_credentials_or_catalog_settings(table_with_deletes):
    _, config = table_with_deletes
    secret = "FAKE-SECRET-" + hashlib.sha256(b"x").hexdigest()[:12]
    config = {**config, "s3.secret-access-key": secret, "token": secret + "-catalog"}
    dataset = IcebergDataset(TABLE, catalog_config=config)
    assert dataset._storage._io_properties["s3.secret-access-key"] == secret   # it did reach the FileIO
    data = the_entry().read_bytes()
    header, payload = _entry_parts(data)
    decoded = json.dumps(cache_entry.read_entry_table(payload).to_pylist(), default=repr)
    for text in (secret, config["uri"], "catalog.db"):
        assert text.encode() not in data and text not in header.decode() and text not in decoded
    assert set(json.loads(header)["key"]) == {"cache_version", "pyarrow", "protocol", "table_uuid", "snapshot_id",
                                              "schema_id", "row_filter", "selected_fields", "format", "handle_budget"}


def test_plan_cache_false_writes_nothing_and_a_folder_is_used(table_with_deletes, tmp_path, reads):
    _, config = table_with_deletes
    off = IcebergDataset(TABLE, catalog_config=config, plan_cache=False)
    off_again = IcebergDataset(TABLE, catalog_config=config, plan_cache=False)
    assert not cache_files() and off_again._origin.cache_outcome.action == "off"
    assert reads["footers"] == 6
    folder = tmp_path / "chosen"
    IcebergDataset(TABLE, catalog_config=config, plan_cache=str(folder))
    warm = IcebergDataset(TABLE, catalog_config=config, plan_cache=folder)
    assert warm._origin.cache_outcome.action == "hit" and len(list(folder.glob("*.plan"))) == 1
    assert not cache_files() and plan_facts(warm) == plan_facts(off)
    with pytest.raises(errors.ArgumentTypeError, match="plan_cache: expected None"):
        IcebergDataset(TABLE, catalog_config=config, plan_cache=5)


def test_parquet_footers_are_kept_as_handles_within_the_budget(table_with_deletes, monkeypatch):
    """A small table keeps every data file's FileMetaData (cold and warm): a reader opens the file with it and
    reads no footer. Past the remote handle budget none is kept, and the entry is of another key."""
    table, config = table_with_deletes
    cold = IcebergDataset(TABLE, catalog_config=config)
    warm = IcebergDataset(TABLE, catalog_config=config)
    assert warm._origin.cache_outcome.action == "hit"
    for dataset in (cold, warm):
        assert all(isinstance(f.extra.inner.handle, pq.FileMetaData) for f in dataset._plan.files)
    opened = []
    parquet_file = pq.ParquetFile
    monkeypatch.setattr(pq, "ParquetFile", lambda source, metadata=None, **kw: opened.append(metadata) or
                        parquet_file(source, metadata=metadata, **kw))
    assert_same_rows(read_all(config), table.scan().to_arrow())
    assert len(opened) == 3 and all(isinstance(m, pq.FileMetaData) for m in opened)
    monkeypatch.setattr(footers_module, "REMOTE_HANDLE_BUDGET", 100)
    over = IcebergDataset(TABLE, catalog_config=config)
    assert over._origin.cache_outcome.action == "built"
    assert all(f.extra.inner.handle is None for f in over._plan.files)
    assert plan_facts(over) == plan_facts(cold)


def test_deleted_positions_are_one_list_column(table_with_deletes):
    """The deletes are an int64 list column of the entry (no Python object per position), read back as the
    sorted positions; positions out of order make the entry damaged, not trusted."""
    _, config = table_with_deletes
    IcebergDataset(TABLE, catalog_config=config)
    header, payload = _entry_parts(the_entry().read_bytes())
    table = cache_entry.read_entry_table(payload)
    column = table.column("deleted")
    assert pa.types.is_int64(column.type.value_type)
    assert Counter(len(v) if v is not None else None for v in column.to_pylist()) == Counter({7: 1, 161: 1, None: 1})
    values = column.to_pylist()
    index = next(i for i, v in enumerate(values) if v and len(v) == 7)
    values[index] = values[index][::-1]
    table = table.set_column(table.schema.get_field_index("deleted"), "deleted", pa.array(values, column.type))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    the_entry().write_bytes(_entry_of(header, bytes(sink.getvalue())))
    again = IcebergDataset(TABLE, catalog_config=config)
    assert again._origin.cache_outcome.action == "rebuilt" and "not sorted" in again._origin.cache_outcome.reason
    assert np.array_equal(sorted(f.extra.deleted.size for f in again._plan.files if f.extra.deleted is not None),
                          [7, 161])


def test_row_filter_and_selected_fields_are_part_of_the_key(table_with_deletes):
    _, config = table_with_deletes
    options = {"row_filter": "id >= 1200 and score > 0.5", "selected_fields": ["id"]}
    first = IcebergDataset(TABLE, catalog_config=config, **options)
    again = IcebergDataset(TABLE, catalog_config=config, **options)
    other = IcebergDataset(TABLE, catalog_config=config, row_filter="id >= 1300", selected_fields=["id"])
    fields = IcebergDataset(TABLE, catalog_config=config, row_filter=options["row_filter"])
    assert [d._origin.cache_outcome.action for d in (first, again, other, fields)] == ["built", "hit", "built", "built"]
    assert len(cache_files()) == 3 and plan_facts(again) == plan_facts(first)


def test_an_unwritable_folder_is_one_warning_and_planning_goes_on(table_with_deletes, tmp_path, caplog):
    _, config = table_with_deletes
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="arrowstream"):
        datasets = [IcebergDataset(TABLE, catalog_config=config, plan_cache=blocked / "cache") for _ in range(2)]
    assert [d._origin.cache_outcome.action for d in datasets] == ["off", "off"]
    assert sum("cannot write the plan cache" in r.message for r in caplog.records) == 1
    assert datasets[1]._plan.num_rows == 2000 - 7 - 161


def test_cli_plan_builds_a_table_entry_ahead_of_a_job(table_with_deletes, tmp_path, capsys, reads):
    from arrowstream.cli import main

    table, _config = table_with_deletes
    folder = tmp_path / "ahead"
    args = ["plan", "--iceberg-table", TABLE, "--catalog-root", str(tmp_path / "iceberg"), "--cache-dir", str(folder)]
    assert main(args) == 0
    built = capsys.readouterr().out
    assert "this run: built" in built and f"snapshot {table.current_snapshot().snapshot_id}" in built
    assert "3 data files" in built and "2000 rows before positional deletes" in built
    assert main([*args, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["action"] == "hit" and info["snapshot_id"] == table.current_snapshot().snapshot_id
    assert info["rows"] == 2000 and info["files"] == 3
    # the job that follows finds the entry built ahead and reads no footer
    reads["footers"] = 0
    dataset = IcebergDataset(TABLE, catalog_config=_config, batch_size=64, plan_cache=folder)
    assert dataset._origin.cache_outcome.action == "hit" and reads["footers"] == 0
