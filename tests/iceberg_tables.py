"""Iceberg tables for tests, on pyiceberg's SQL catalog (SQLite) with a local warehouse.

pyiceberg 0.12 writes Parquet data files, and deletes by rewriting them (copy-on-write). Two
things it cannot write are made here by hand, through its own manifest and snapshot classes:
positional delete files (a Parquet file of ``file_path``, ``pos`` committed in a delete
manifest) and ORC data files (written by pyarrow with ``iceberg.id`` attributes, committed by a
fast append).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import orc
from pyiceberg.catalog import load_catalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent, ManifestWriterV2
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.typedef import Record

import arrowstream

FILE_PATH_ID, POS_ID = 2147483546, 2147483545   # reserved field ids of positional delete files


def make_catalog(root: str) -> tuple[Any, dict[str, str]]:
    config = arrowstream.iceberg_catalog_config(root)
    catalog = load_catalog("default", **config)
    catalog.create_namespace("db")
    return catalog, config


def data_files(table: Table) -> list[str]:
    return sorted(task.file.file_path for task in table.scan().plan_files())


def _local(path: str) -> str:
    local = path.removeprefix("file://")
    os.makedirs(os.path.dirname(local), exist_ok=True)
    return local


class _DeleteManifestWriter(ManifestWriterV2):
    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _AppendDeleteFiles(_FastAppendFiles):
    """A snapshot that adds delete files (in a delete manifest) instead of data files."""

    def new_manifest_writer(self, spec: Any) -> _DeleteManifestWriter:
        return _DeleteManifestWriter(spec, self.schema(), self.new_manifest_output(), self._snapshot_id,
                                     self._compression)


def add_position_deletes(table: Table, deletes: dict[str, list[int]]) -> Table:
    """Commit one positional delete file that deletes ``positions`` of each data file path."""
    paths = sorted(deletes)
    rows = pa.table({
        "file_path": pa.array([p for p in paths for _ in sorted(deletes[p])], pa.string()),
        "pos": pa.array([pos for p in paths for pos in sorted(deletes[p])], pa.int64()),
    })
    schema = pa.schema([
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID).encode()}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID).encode()}),
    ])
    location = f"{table.metadata.location}/data/deletes-{uuid.uuid4().hex}.parquet"
    pq.write_table(rows.cast(schema), _local(location))
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES, file_path=location, file_format=FileFormat.PARQUET,
        partition=Record(), record_count=rows.num_rows, file_size_in_bytes=os.path.getsize(_local(location)),
        spec_id=table.metadata.default_spec_id, equality_ids=None, key_metadata=None, sort_order_id=None)
    with table.transaction() as tx:
        producer = _AppendDeleteFiles(operation=Operation.OVERWRITE, transaction=tx, io=table.io)
        producer.append_data_file(delete_file)
        producer.commit()
    return table.refresh()


def append_orc(table: Table, data: pa.Table, stripe_rows: int) -> Table:
    """Append ``data`` as one ORC data file of stripes of ``stripe_rows`` rows, columns tagged by field id."""
    arrow_schema = schema_to_pyarrow(table.schema())
    schema = pa.schema([pa.field(f.name, f.type, f.nullable, metadata={b"iceberg.id": str(fid).encode()})
                        for f, fid in zip(arrow_schema, [c.field_id for c in table.schema().columns], strict=True)])
    location = f"{table.metadata.location}/data/orc-{uuid.uuid4().hex}.orc"
    orc.write_table(data.select(schema.names).cast(schema), _local(location), stripe_size=1, batch_size=stripe_rows)
    data_file = DataFile.from_args(
        content=DataFileContent.DATA, file_path=location, file_format=FileFormat.ORC, partition=Record(),
        record_count=data.num_rows, file_size_in_bytes=os.path.getsize(_local(location)),
        spec_id=table.metadata.default_spec_id, equality_ids=None, key_metadata=None, sort_order_id=None)
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(data_file)
    return table.refresh()
