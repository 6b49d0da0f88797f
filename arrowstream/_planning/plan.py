"""Planning: read every file's metadata once, in the main process, and build the plan of the dataset.

The footers are read concurrently (:func:`read_footers`; local Parquet files the short way, checks
per distinct schema), checked (columns, filter, schemas) and handed to :mod:`arrowstream._planning.cutting`,
which cuts them into splits. Everything after the footers is pure and cheap to recompute.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .._core.plan_types import PLANNING_VERSION, FileEntry, SplitTable
from .._formats import FileFooter, FileFormat, check_counts
from .._formats.base import MetadataFormat
from .._formats.footers import FooterTable, as_table, files_fingerprint, handle_budget, shared_schema
from .._formats.sniff import sniff
from .._storage.failures import wrap_read_error
from .._storage.filesystem import Storage, display_url
from .._storage.pinned import local_version
from ..errors import ArrowStreamError, CorruptFileError, EmptyDatasetError
from .checks import check_columns, check_filter, check_names, check_schemas
from .cutting import REFINERS, base_splits

if TYPE_CHECKING:
    from .cache import PlanCache

MAX_PLANNING_THREADS = 32
MAX_LOCAL_THREADS = 4
MIN_CORES_FOR_LOCAL_THREADS = 2   # local footers are read in one thread on a machine of this many cores or fewer
_FILES_PER_CHUNK = 64   # files a planning thread reads per task; fewer files than that: no threads


@dataclass
class Plan:
    """The splits of a dataset plus what readers need to read them.

    ``files`` and ``splits`` are columns (:class:`~arrowstream._formats.footers.FooterTable`,
    :class:`~arrowstream._core.plan_types.SplitTable`) that read as lists of footers and splits: a plan of a
    million units holds no object per unit and pickles to workers as a few buffers.
    """

    protocol: str
    files: FooterTable
    splits: SplitTable
    schema: pa.Schema                 # of the output columns
    read_columns: list[str]           # output columns plus the filter's
    filter: pc.Expression | None
    data_fingerprint: str
    num_rows: int                     # before the filter
    # what joins the files in the data fingerprint (the schema; Iceberg: the table, snapshot and schema ids)
    identity: dict[str, Any] = field(default_factory=dict)
    # the plan cache entry the files' metadata came from (None: read from the files): what a reader names when a
    # file's own metadata is not the plan's (see _formats._opened); in no state, fingerprint or argument
    cache_entry: str | None = None
    _refined: dict[tuple[int, int], SplitTable] = field(default_factory=dict, repr=False)

    def url(self, file_index: int) -> str:
        return display_url(self.protocol, self.files.path(file_index))

    def splits_for(self, num_slots: int, planning: int = PLANNING_VERSION) -> SplitTable:
        """The splits with large ones cut until there are at least ``num_slots`` (when rows allow), as
        planning version ``planning`` cuts them (see :data:`PLANNING_VERSION`)."""
        if len(self.splits) >= num_slots:   # nothing to cut (either version): the plan's own table, never a copy
            return self.splits
        key = (num_slots, planning)
        if key not in self._refined:
            self._refined[key] = SplitTable.from_splits(REFINERS[planning](self.splits, num_slots, self.files))
        return self._refined[key]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_refined"] = {}
        return state


def read_footer(storage: Storage, file_format: FileFormat, entry: FileEntry, filter: pc.Expression | None,
                 filter_columns: list[str], format_given: bool = True) -> FileFooter:
    """Read one file's metadata, retrying transient errors; name the file when it cannot be read or
    announces counts that cannot be (and, where ``format_given`` by the user, which ``format=`` it looks like)."""
    url = display_url(storage.protocol, entry.path)
    try:
        footer = storage.call(lambda: file_format.inspect(storage, entry, filter, filter_columns), url)
    except ArrowStreamError:
        raise
    except Exception as exc:  # backends raise their own types (Azure's HttpResponseError): classified
        error = wrap_read_error(exc, url, file_format.label)
        if format_given and isinstance(error, CorruptFileError):   # a CSV file read as Parquet: say what it looks like
            hint = sniff(storage, entry, file_format.name)
            if hint is not None:
                error = CorruptFileError(f"{url}: {hint}")
        raise error from exc
    check_counts(footer, url, file_format.label, file_format.unit)
    check_names(footer.schema, url, file_format.label)
    return footer


def plan_files(storage: Storage, entries: Sequence[FileEntry], file_format: FileFormat, *,
               columns: list[str] | None, filter: pc.Expression | None, split_bytes: int | None,
               cache: PlanCache | None = None) -> Plan:
    """Read every file's metadata once (concurrently; from ``cache`` when it holds this listing's) and
    build the plan of the dataset."""
    if cache is None:
        footers = read_footers(storage, entries, file_format, columns=columns, filter=filter)
        return plan_footers(storage.protocol, footers, columns=columns, filter=filter, split_bytes=split_bytes)
    cached = cache.load(entries)
    footers = cached if cached is not None else read_footers(storage, entries, file_format, columns=columns,
                                                             filter=filter)
    known = set(footers.known_fingerprints)
    try:
        plan = plan_footers(storage.protocol, footers, columns=columns, filter=filter, split_bytes=split_bytes)
    except ArrowStreamError:   # the footers are sound: a start with other columns plans from them
        if cached is None:
            cache.store(entries, footers)
        raise
    # written after planning, so that the entry keeps the data fingerprint too; an entry that lacked it
    # (written by a start that failed, or by an earlier release) is written again, once, with it
    if cached is None or set(plan.files.known_fingerprints) != known:
        cache.store(entries, plan.files)
    if cached is not None:
        plan.cache_entry = cache.path
    return plan


def read_footers(storage: Storage, entries: Sequence[FileEntry], file_format: FileFormat, *,
                 columns: list[str] | None, filter: pc.Expression | None) -> FooterTable:
    """Every file's footer (concurrently), reconciled; columns and filter checked on the first file
    before the others are read."""
    # columns and filter are checked on the first file that is not empty (an empty text file names no columns)
    lead = next((i for i, e in enumerate(entries) if e.size != 0), 0)
    first_url = display_url(storage.protocol, entries[lead].path)
    first = read_footer(storage, file_format, entries[lead], None, [])
    filter_columns = check_filter(filter, first.schema, first_url) if filter is not None else []
    if filter is not None:  # now that the filter is known to fit, prune the first file too
        first = read_footer(storage, file_format, entries[lead], filter, filter_columns)
    check_columns(columns, first.schema, first_url)
    # handles (Parquet FileMetaData) are kept by the rule in _formats.footers, which the lead file decides
    keep_handles = first.handle_bytes * len(entries) <= handle_budget(storage.is_local)
    if not keep_handles:
        first = first.without_handle()

    def read(entry: FileEntry) -> FileFooter:
        footer = read_footer(storage, file_format, entry, filter, filter_columns)
        return footer if keep_handles or footer.handle is None else footer.without_handle()

    def read_short(run: Sequence[FileEntry]) -> FooterTable | None:
        return _read_local(file_format, run, keep_handles)

    short = storage.is_local and filter is None and isinstance(file_format, MetadataFormat)
    # local reads are CPU: chunks of files per task; remote ones wait on the network: one file per task
    per_task = _FILES_PER_CHUNK if storage.is_local else 1
    parts = _read_parts(read, entries, lead, first, _planning_threads(storage, len(entries)), per_task,
                        read_short if short else None)
    footers = _joined(part if isinstance(part, FooterTable) else FooterTable.build(part) for part in parts)
    if not isinstance(file_format, MetadataFormat):   # text formats: one schema for every file
        footers = FooterTable.build(file_format.reconcile(list(footers), storage.protocol))
    return footers


def plan_footers(protocol: str, footers: Sequence[FileFooter] | FooterTable, *, columns: list[str] | None,
                 filter: pc.Expression | None, split_bytes: int | None) -> Plan:
    """The plan of the reconciled footers of every file: columns, filter and schemas checked."""
    footers = as_table(footers)
    not_empty = np.flatnonzero(footers.sizes != 0)
    lead = int(not_empty[0]) if len(not_empty) else 0   # as read_footers chose it
    first_url = display_url(protocol, footers.path(lead))
    filter_columns = check_filter(filter, footers.schema_of(lead), first_url) if filter is not None else []
    check_columns(columns, footers.schema_of(lead), first_url)
    # a text file of no rows has names but no types: the schema is that of the first file with rows
    with_rows = np.flatnonzero(footers.file_rows() > 0)
    reference = footers.schema_of(int(with_rows[0]) if len(with_rows) else 0)

    output_columns = list(columns) if columns is not None else list(reference.names)
    read_columns = output_columns + [c for c in filter_columns if c not in output_columns]
    # each column nullable where any file's is (at any depth); the data identity keeps the reference's schema
    joined = check_schemas(footers, protocol, read_columns, all_columns=columns is None)
    if columns is None:  # every column, in file order: duplicate names are legal in Arrow IPC and Parquet
        schema = pa.schema(list(joined))
    else:
        schema = pa.schema([joined.field(c) for c in output_columns])
    return build_plan(protocol, footers, schema, read_columns, filter, split_bytes,
                      identity={"schema": [[fld.name, str(fld.type)] for fld in reference]})


def _planning_threads(storage: Storage, num_files: int, cores: int | None = None) -> int:
    """Threads reading footers: many for a remote store (each read waits on the network), the cores for
    local files (a read is mostly CPU: decoding; pyarrow lets go of the GIL for it, Python does not), but
    one on a machine of :data:`MIN_CORES_FOR_LOCAL_THREADS` cores or fewer: there a second thread gained
    nothing (10,000 small files: 1.0-1.1 s in one thread or two, the Python share of a read holding the GIL)."""
    cores = cores if cores is not None else os.cpu_count() or 1
    if storage.is_local:
        threads = 1 if cores <= MIN_CORES_FOR_LOCAL_THREADS else min(cores, MAX_LOCAL_THREADS)
    else:
        return max(1, min(MAX_PLANNING_THREADS, num_files - 1))   # the lead file is read before the others
    return max(1, min(threads, num_files // _FILES_PER_CHUNK))


def _read_local(file_format: FileFormat, entries: Sequence[FileEntry], keep_handles: bool) -> FooterTable | None:
    """The footers of local files without a filter, read the short way into the plan's columns (no
    ``FileFooter`` per file): one open, fstat and footer read per file, the UTF-8 check of names once per
    distinct schema. The checks are those of :func:`read_footer` (the size and version ``open_input``
    checks, ``check_counts``, ``check_names``, the rows the footer announces), made on the columns; None
    when a file fails one or cannot be read: the caller reads the files one by one, which retries what is
    transient and raises the error that names the file."""
    if not isinstance(file_format, MetadataFormat) or not entries:
        return None
    try:
        read = file_format.read_local([entry.path for entry in entries], handles=keep_handles)
        if read is None or len(read) != len(entries):
            return None
        for entry, status in zip(entries, read.statuses, strict=True):   # each file as it was listed
            if status.st_size != entry.size or (entry.version and local_version(status) != entry.version):
                return None
        offsets, rows, sizes = (_frozen(a) for a in (read.unit_offsets, read.unit_rows, read.unit_bytes))
        sums = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        if ((rows < 0).any() or (sizes < 0).any() or len(rows) != len(sizes)   # what check_counts refuses
                or not np.array_equal(sums[offsets[1:]] - sums[offsets[:-1]], read.num_rows)):
            return None
        for schema in read.schemas:
            check_names(schema, entries[0].path, file_format.label)   # raises: read carefully
    except Exception:  # noqa: BLE001 (the careful read raises it again, classified and naming the file)
        return None
    per_file = np.diff(offsets)
    return FooterTable(paths=pa.array([e.path for e in entries], pa.large_string()),
                       names=pa.array([e.name for e in entries], pa.large_string()),
                       tags=pa.array([e.tag for e in entries], pa.large_string()),
                       versions=pa.array([e.version for e in entries], pa.large_string()),
                       sizes=_frozen(np.fromiter((e.size for e in entries), dtype=np.int64, count=len(entries))),
                       formats=[file_format.name], format_index=np.zeros(len(entries), dtype=np.int8),
                       schemas=list(read.schemas), schema_index=_frozen(read.schema_index),
                       unit_offsets=offsets, unit_rows=rows, unit_bytes=sizes, kept_offsets=offsets,
                       kept_units=_frozen(np.arange(len(rows), dtype=np.int64) - np.repeat(offsets[:-1], per_file)),
                       handles=dict(read.handles) if keep_handles else {}, extras={})


def _frozen(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``values``, read-only (as ``FooterTable.build`` leaves its columns)."""
    values.flags.writeable = False
    return values


def _joined(parts: Iterable[FooterTable]) -> FooterTable:
    """One table of the files of ``parts``, in order, as :meth:`FooterTable.build` of all their footers
    makes it: formats and schemas listed in the order files first have them, equal schemas one."""
    tables = list(parts)
    if len(tables) == 1:
        return tables[0]
    formats: list[str] = []
    schemas: list[pa.Schema] = []
    format_index, schema_index, handles, extras = [], [], {}, {}
    unit_offsets, kept_offsets = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
    files = units = kept = 0
    for table in tables:
        for name in table.formats:
            if name not in formats:
                formats.append(name)
        format_index.append(np.array([formats.index(n) for n in table.formats], np.int8)[table.format_index])
        schema_index.append(np.array([shared_schema(schemas, s) for s in table.schemas], np.int32)[table.schema_index])
        unit_offsets.append(table.unit_offsets[1:] + units)
        kept_offsets.append(table.kept_offsets[1:] + kept)
        handles.update({files + i: handle for i, handle in table.handles.items()})
        extras.update({files + i: extra for i, extra in table.extras.items()})
        files, units, kept = files + len(table), units + table.num_units, kept + len(table.kept_units)

    def joined(name: str) -> pa.Array:
        return pa.concat_arrays([getattr(t, name) for t in tables])

    def stacked(arrays: Sequence[npt.NDArray[Any]], dtype: type[Any] = np.int64) -> Any:
        return _frozen(np.concatenate(arrays).astype(dtype, copy=False))

    return FooterTable(paths=joined("paths"), names=joined("names"), tags=joined("tags"), versions=joined("versions"),
                       sizes=stacked([t.sizes for t in tables]), formats=formats,
                       format_index=stacked(format_index, np.int8), schemas=schemas,
                       schema_index=stacked(schema_index, np.int32), unit_offsets=stacked(unit_offsets),
                       unit_rows=stacked([t.unit_rows for t in tables]),
                       unit_bytes=stacked([t.unit_bytes for t in tables]), kept_offsets=stacked(kept_offsets),
                       kept_units=stacked([t.kept_units for t in tables]), handles=handles, extras=extras)


def _read_all(read: Callable[[FileEntry], FileFooter], entries: Sequence[FileEntry], lead: int, first: FileFooter,
              threads: int, per_task: int = _FILES_PER_CHUNK,
              read_short: Callable[[Sequence[FileEntry]], Sequence[FileFooter] | None] | None = None
              ) -> Iterator[FileFooter]:
    """Every file's footer in file order: the footers of :func:`_read_parts`, one after another."""
    for part in _read_parts(read, entries, lead, first, threads, per_task, read_short):
        yield from part


def _read_parts(read: Callable[[FileEntry], FileFooter], entries: Sequence[FileEntry], lead: int, first: FileFooter,
                threads: int, per_task: int = _FILES_PER_CHUNK,
                read_short: Callable[[Sequence[FileEntry]], Sequence[FileFooter] | None] | None = None
                ) -> Iterator[Sequence[FileFooter]]:
    """Every file's footer in file order, as runs of consecutive files (``first`` is the lead's, already
    read), read by ``threads`` threads in chunks of at least ``per_task`` consecutive files: for local files
    one task per chunk, not per file, keeps the pool's own cost small; a remote read waits on the network,
    so there each file is a task. ``read_short`` reads a run the short way where it can (a table, or None:
    that run is read file by file)."""
    def run(start: int, stop: int) -> Sequence[FileFooter]:   # files start:stop, the lead not among them
        footers = read_short(entries[start:stop]) if read_short is not None and start < stop else None
        return footers if footers is not None else [read(entries[i]) for i in range(start, stop)]

    def chunk(start: int, stop: int) -> list[Sequence[FileFooter]]:
        if not start <= lead < stop:
            return [run(start, stop)]
        return [run(start, lead), [first], run(lead + 1, stop)]   # the lead's footer is read already

    size = max(per_task, -(-len(entries) // (threads * 8))) if per_task > 1 else 1
    bounds = [(start, min(start + size, len(entries))) for start in range(0, len(entries), size)]
    if threads <= 1:
        for start, stop in bounds:
            yield from chunk(start, stop)
        return
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for parts in pool.map(lambda b: chunk(*b), bounds):
            yield from parts


def build_plan(protocol: str, footers: Sequence[FileFooter] | FooterTable, schema: pa.Schema,
               read_columns: list[str], filter: pc.Expression | None, split_bytes: int | None,
               identity: dict[str, Any]) -> Plan:
    """The plan of checked footers; ``identity`` joins the files in the data fingerprint."""
    table = as_table(footers)
    first_url = display_url(protocol, table.path(0))
    num_rows = table.num_rows
    if num_rows == 0:
        raise EmptyDatasetError(
            f"path: the {len(table)} file(s) starting with {first_url} hold no rows; "
            "point `path` at data that has rows")
    splits = base_splits(table, split_bytes)
    if not splits:
        raise EmptyDatasetError(
            f"filter: {filter} excludes every row group of the {len(table)} file(s) by their "
            "statistics, so an epoch would be empty; loosen the filter or check the data")
    return Plan(protocol, table, splits, schema, read_columns, filter, files_fingerprint(table, identity), num_rows,
                identity)
