"""Iceberg: a pinned snapshot's scan tasks become splits of row groups or stripes.

Planning (main process) asks pyiceberg for the scan tasks of one snapshot (``plan_files``, with
the row filter pushed down to manifests and file statistics), reads each data file's footer
(Parquet row groups, ORC stripes) and its positional deletes, and counts the rows each unit
keeps after the deletes. Workers read units of a data file with the ``iceberg`` format below:
the inner format reads the file's physical columns, the deletes are taken out by position, and
pyiceberg's own projection (by field id: renamed, added, dropped and promoted columns, partition
values) turns the batch into the snapshot's schema. The rest of arrowstream sees plain splits.
The catalog, the table and the pinned snapshot (schema, filter, projection) are ``_sources.iceberg_table``'s.

pyiceberg's projection helpers are private (``pyiceberg.io.pyarrow``); they are used here and
nowhere else, and the supported pyiceberg versions are pinned in ``pyproject.toml``.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .._core.plan_types import FileEntry
from .._core.row_ids import physical_after_deletes
from .._formats import FileFooter, UnitFile, get_format, register_format
from .._formats.footers import FooterTable, handle_budget
from .._planning.cache import CacheOutcome, PlanCacheSetting
from .._planning.plan import MAX_PLANNING_THREADS, Plan, build_plan, read_footer
from .._storage.cache import HandleStore
from .._storage.failures import is_missing
from .._storage.filesystem import Storage
from .._storage.pinned import Pin
from .._storage.prefetch import PartsFile
from .._storage.retry import RetryPolicy
from ..errors import (
    EmptyDatasetError,
    FileReadError,
    NotSupportedYetError,
)
from .iceberg_cache import Deleted, iceberg_cache_for
from .iceberg_table import IcebergSource, requested_schema


class IcebergStorage(Storage):
    """Data files are opened through the table's own pyiceberg ``FileIO``, one per process.

    Its properties (credentials included) travel to workers by pickle, like ``storage_options``,
    and never appear in a state, a repr or a log line.
    """

    def __init__(self, io_properties: dict[str, str], location: str, retry: RetryPolicy | None = None) -> None:
        super().__init__("iceberg", retry=retry)
        self._io_properties = dict(io_properties)
        self._location = location
        self._io: Any = None
        self._io_pid = -1

    @property
    def is_local(self) -> bool:
        return False

    @property
    def prefetcher(self) -> None:
        """None: data files are read through pyiceberg's FileIO, which buffers on its own."""
        return None

    def _file_io(self) -> Any:
        if self._io is None or self._io_pid != os.getpid():
            from pyiceberg.io import load_file_io

            self._io, self._io_pid = load_file_io(self._io_properties, self._location), os.getpid()
        return self._io

    def open_input(self, entry: FileEntry, memory_map: bool = False) -> pa.NativeFile:
        """A data or delete file, through the table's FileIO; on an object store with a data cache, its reads through
        the cache (an Iceberg data file is never rewritten in place: its path and size are its version)."""
        handle: pa.NativeFile = self._file_io().new_input(entry.path).open()
        scheme = entry.path.split("://", 1)[0] if "://" in entry.path else "file"
        if self.cache is None or scheme == "file" or entry.size <= 0:
            return handle
        pin = Pin(entry.path, entry.path, entry.size, f"size {entry.size}", f"iceberg+{scheme}")
        parts = PartsFile(None, pin, None, self.cache, store=HandleStore(handle, entry.path))
        return pa.PythonFile(parts, mode="r")

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_io=None, _io_pid=-1)
        return state

    def __repr__(self) -> str:
        return f"IcebergStorage(io_properties=<{len(self._io_properties)} hidden>)"


@dataclass(frozen=True)
class DataFileSpec:
    """How a worker turns one data file's units into rows of the snapshot's schema."""

    inner: FileFooter                        # the file as its own format planned it (raw unit rows)
    deleted: npt.NDArray[np.int64] | None    # file positions of deleted rows, sorted
    physical_columns: list[str]
    file_schema: Any                         # pyiceberg Schema of the columns read from the file
    requested: Any                           # pyiceberg Schema the batches are projected to
    missing: dict[int, Any]                  # values of projected columns the file lacks (partitions)
    downcast_ns: bool
    arrow_schema: pa.Schema


def kept_rows(unit_rows: Sequence[int], deleted: npt.NDArray[np.int64] | None) -> tuple[int, ...]:
    """Rows each unit keeps once the deleted positions are taken out."""
    if deleted is None:
        return tuple(unit_rows)
    bounds = np.concatenate([[0], np.cumsum(unit_rows, dtype=np.int64)])
    removed = np.diff(np.searchsorted(deleted, bounds))
    return tuple(int(rows - gone) for rows, gone in zip(unit_rows, removed, strict=True))


class IcebergFile:
    """Units of one data file, deletes applied, projected by field id."""

    def __init__(self, storage: Storage, spec: DataFileSpec) -> None:
        self._spec = spec
        self._inner: UnitFile = get_format(spec.inner.format).open(storage, spec.inner)

    def read_units(self, units: Sequence[int], columns: list[str], batch_rows: int,
                   use_threads: bool) -> Iterator[pa.RecordBatch]:
        from pyiceberg.io.pyarrow import _to_requested_schema

        spec = self._spec
        position = sum(spec.inner.unit_rows[:units[0]]) if units else 0
        for batch in self._inner.read_units(units, spec.physical_columns, batch_rows, use_threads):
            rows = batch.num_rows
            if spec.deleted is not None:
                lo, hi = np.searchsorted(spec.deleted, [position, position + rows])
                if hi > lo:
                    mask = np.ones(rows, dtype=bool)
                    mask[spec.deleted[lo:hi] - position] = False
                    batch = batch.filter(pa.array(mask))
            position += rows
            if batch.num_rows == 0:
                continue
            out = _to_requested_schema(spec.requested, spec.file_schema, batch, downcast_ns_timestamp_to_us=spec.downcast_ns,
                                       projected_missing_fields=spec.missing, allow_timestamp_tz_mismatch=True)
            if out.schema != spec.arrow_schema:
                out = out.cast(spec.arrow_schema)
            yield out

    def close(self) -> None:
        self._inner.close()


class IcebergFormat:
    """The format of Iceberg data files as planned by :func:`plan_iceberg`: a format readers open, and
    no :class:`~arrowstream._formats.FileFormat` (its files are planned from the table's scan tasks,
    never inspected one by one, so it has no ``inspect``)."""

    name = "iceberg"
    label = "Iceberg data"
    unit = "unit"
    units = "row groups/stripes"   # of the Parquet and ORC data files
    row_ok_column: str | None = None

    def open(self, storage: Storage, footer: FileFooter) -> IcebergFile:
        return IcebergFile(storage, footer.extra)

    def byte_ranges(self, footer: FileFooter, units: Sequence[int], columns: list[str]) -> list[tuple[int, int]]:
        """None: data files are read through pyiceberg's FileIO, which has its own buffering."""
        return []

    def physical_rows(self, footer: FileFooter, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Positions in the data file: the rows read are the rows its positional deletes left."""
        return physical_after_deletes(footer.extra.deleted, rows)


register_format(IcebergFormat())


def _deleted_positions(chunks: list[Any] | None) -> npt.NDArray[np.int64] | None:
    if not chunks:
        return None
    positions = np.concatenate([np.asarray(c.to_numpy(), dtype=np.int64) for c in chunks])
    return np.unique(positions) if positions.size else None


def plan_iceberg(source: IcebergSource, split_bytes: int | None, retry: RetryPolicy | None = None,
                 plan_cache: PlanCacheSetting = False) -> tuple[IcebergStorage, Plan, CacheOutcome]:
    """The plan of the pinned snapshot: one file per scan task, its row groups or stripes as units; what
    was read of the data and delete files comes from the snapshot's plan cache entry where it has one
    (``arrowstream._sources.iceberg_cache``), and the cache's outcome."""
    table = source.table
    metadata = table.metadata
    tasks = _scan_tasks(source)
    storage = IcebergStorage(dict(table.io.properties), metadata.location, retry)
    if not tasks:
        raise EmptyDatasetError(
            f"table: {source.table_name!r} snapshot {source.snapshot_id} has no data file that may match "
            f"row_filter {source.row_filter}; loosen the filter or check the table")
    # the plan lists the files by their names under the table's location (sorted stably: the order tasks came in)
    entries = sorted((FileEntry(t.file.file_path, _relative(t.file.file_path, metadata.location),
                                int(t.file.file_size_in_bytes), "") for t in tasks), key=attrgetter("name"))
    by_path = {t.file.file_path: t for t in tasks}
    tasks = [by_path[e.path] for e in entries]
    formats = [_data_format(task) for task in tasks]
    # an entry holds the footers of one format (a table of Parquet and ORC files is planned without the cache)
    cache = iceberg_cache_for(plan_cache, source, get_format(formats[0])) if len(set(formats)) == 1 else None
    cached = cache.load_snapshot(entries) if cache is not None else None
    if cached is not None:
        inner, deleted = list(cached[0]), cached[1]
    else:
        inner, deleted = _read_files(source, storage, tasks, entries, formats)
        if cache is not None:
            cache.store_snapshot(FooterTable.build(inner), deleted)
    outcome = cache.outcome if cache is not None else CacheOutcome(
        None, "off", "no cache" if plan_cache is False else "the data files are of several formats")
    footers = _planned_files(source, tasks, inner, deleted)
    # files written by different writers may differ in physical types (string / large_string): one schema
    arrow_schema = footers[0].extra.arrow_schema
    footers = [replace(f, extra=replace(f.extra, arrow_schema=arrow_schema)) for f in footers]
    schema = pa.schema([arrow_schema.field(c) for c in source.output_columns])
    plan = build_plan(storage.protocol, footers, schema, list(arrow_schema.names), source.arrow_filter, split_bytes,
                      identity={"table": str(metadata.table_uuid), "snapshot_id": source.snapshot_id,
                                "schema_id": source.schema_id,
                                "schema": [[f.name, str(f.type)] for f in arrow_schema]})
    if cached is not None and cache is not None:
        plan.cache_entry = cache.path
    return storage, plan, outcome


def _scan_tasks(source: IcebergSource) -> list[Any]:
    """pyiceberg's scan tasks of the snapshot (it reads the manifests), the row filter pushed down."""
    scan = source.table.scan(row_filter=source.row_filter, selected_fields=source.selected_fields,
                             snapshot_id=source.snapshot_id)
    try:
        return list(scan.plan_files())
    except ValueError as exc:
        if "equality deletes" in str(exc):
            raise NotSupportedYetError(
                f"table: {source.table_name!r} snapshot {source.snapshot_id} has equality delete files: pyiceberg, "
                "which plans the scan, refuses them (it applies positional deletes only), so which rows are deleted "
                "is unknown; rewrite the table's data files (compaction) or read a snapshot from before the "
                "deletes") from None
        raise


def _data_format(task: Any) -> str:
    from pyiceberg.manifest import FileFormat

    data_file = task.file
    formats = {FileFormat.PARQUET: "parquet", FileFormat.ORC: "orc"}
    if data_file.file_format not in formats:
        raise NotSupportedYetError(f"{data_file.file_path}: an Iceberg data file in {data_file.file_format}; arrowstream "
                                   "reads Parquet and ORC data files (pyarrow, which decodes them, has no Avro "
                                   "reader): rewrite the table's data files as Parquet")
    return formats[data_file.file_format]


def _read_files(source: IcebergSource, storage: IcebergStorage, tasks: list[Any], entries: list[FileEntry],
                formats: list[str]) -> tuple[list[FileFooter], list[Deleted]]:
    """What planning reads from storage: every data file's footer (kept as a handle within the remote handle
    budget, the rule of ``_planning.plan.read_footers``: workers read no footer) and every positional delete file."""
    from pyiceberg.io.pyarrow import _read_all_delete_files

    try:
        deletes = _read_all_delete_files(source.table.io, tasks)
    except Exception as exc:
        if not is_missing(exc):
            raise
        paths = sorted({d.file_path for task in tasks for d in task.delete_files})
        named = next((p for p in paths if p.removeprefix("file://") in str(exc)), f"one of {paths}")
        raise missing_file(source, "positional delete file", named, exc) from exc

    def read(index: int) -> FileFooter:
        try:
            # False: the table names the format of its data files, no format= to hint at (format_given)
            return read_footer(storage, get_format(formats[index]), entries[index], None, [], False)
        except FileReadError as exc:
            if exc.__cause__ is None or not is_missing(exc.__cause__):
                raise
            raise missing_file(source, "data file", entries[index].path, exc.__cause__) from exc.__cause__

    lead = next((i for i, e in enumerate(entries) if e.size != 0), 0)
    first = read(lead)
    keep_handles = first.handle_bytes * len(entries) <= handle_budget(storage.is_local)

    def kept(index: int) -> FileFooter:
        footer = first if index == lead else read(index)
        return footer if keep_handles or footer.handle is None else footer.without_handle()

    with ThreadPoolExecutor(max_workers=min(MAX_PLANNING_THREADS, len(tasks))) as pool:
        footers = list(pool.map(kept, range(len(tasks))))
    return footers, [_deleted_positions(deletes.get(entry.path)) for entry in entries]


def _planned_files(source: IcebergSource, tasks: list[Any], inner: list[FileFooter],
                   deleted: list[Deleted]) -> list[FileFooter]:
    """The plan's files (format ``iceberg``): each data file's footer, deletes counted out of its units, and
    how a worker projects its rows (by field id) into the snapshot's schema. Reads nothing from storage."""
    from pyiceberg.io.pyarrow import _get_column_projection_values, _to_requested_schema, pyarrow_to_schema
    from pyiceberg.schema import prune_columns
    from pyiceberg.types import ListType, MapType

    metadata = source.table.metadata
    requested = requested_schema(source)
    table_schema = metadata.schema()
    name_mapping = metadata.name_mapping()
    downcast_ns = metadata.format_version <= 2
    read_ids = {i for i in requested.field_ids if not isinstance(requested.find_type(i), (MapType, ListType))}

    def plan_file(task: Any, footer: FileFooter, positions: Deleted) -> FileFooter:
        data_file = task.file
        file_schema = pyarrow_to_schema(footer.schema, name_mapping, downcast_ns_timestamp_to_us=downcast_ns,
                                        format_version=metadata.format_version)
        file_project = prune_columns(file_schema, read_ids, select_full_types=False)
        missing = _get_column_projection_values(data_file, requested, table_schema,
                                                metadata.specs().get(data_file.spec_id), file_schema.field_ids)
        physical = pa.schema([footer.schema.field(c.name) for c in file_project.columns])
        out_schema = _to_requested_schema(requested, file_project, pa.RecordBatch.from_pylist([], schema=physical),
                                          downcast_ns_timestamp_to_us=downcast_ns, projected_missing_fields=missing,
                                          allow_timestamp_tz_mismatch=True).schema
        spec = DataFileSpec(footer, positions, [c.name for c in file_project.columns], file_project, requested,
                            dict(missing), downcast_ns, out_schema)
        return FileFooter(footer.entry, "iceberg", footer.schema, kept_rows(footer.unit_rows, positions),
                          footer.unit_bytes, footer.kept_units, None, spec)

    return [plan_file(task, footer, positions) for task, footer, positions in zip(tasks, inner, deleted, strict=True)]


def missing_file(source: IcebergSource, kind: str, path: str, exc: BaseException) -> FileReadError:
    """A file the snapshot's metadata lists and storage does not hold, found while planning (one gone after
    planning is reported by the reader: "disappeared after planning")."""
    what = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return FileReadError(
        f"{path}: missing: {kind} listed in snapshot {source.snapshot_id} of {source.table_name!r} but not in storage "
        f"({what}); the table's metadata and its files disagree (deleted by hand, or by a cleanup that should have "
        "kept it): restore the file, or read a snapshot whose files all exist (snapshot_id=)")


def _relative(path: str, location: str) -> str:
    """A data file's name relative to the table location (no machine-local absolute path)."""
    prefix = location.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else posixpath.basename(path)
