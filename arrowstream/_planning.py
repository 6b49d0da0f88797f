"""Planning: read Parquet footers once, in the main process, and cut the data into splits.

A split is a contiguous range of rows of one file that never cuts a row group unless the
plan has fewer splits than slots (then single row groups are cut into row ranges, so no
worker idles). Everything after :func:`plan_parquet` is pure and cheap to recompute.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ._discovery import FileEntry
from ._storage import Storage, display_url, wrap_read_error
from .errors import EmptyDatasetError, InvalidArgumentError, SchemaMismatchError

MAX_PLANNING_THREADS = 32
_SHIPPED_METADATA_BYTES = 64 << 20  # footers travel to workers below this total size


@dataclass(frozen=True, slots=True)
class Split:
    """Rows ``[row_start, row_start + num_rows)`` of the row groups ``[row_group_start, row_group_stop)``."""

    file_index: int
    row_group_start: int
    row_group_stop: int
    row_start: int
    num_rows: int
    num_bytes: int


@dataclass(frozen=True)
class FileFooter:
    """What planning learned from one file's footer."""

    entry: FileEntry
    schema: pa.Schema
    row_group_rows: tuple[int, ...]
    row_group_bytes: tuple[int, ...]
    kept_row_groups: tuple[int, ...]
    metadata: pq.FileMetaData | None = field(default=None, compare=False)


@dataclass
class Plan:
    """The splits of a dataset plus what readers need to read them."""

    protocol: str
    files: list[FileFooter]
    splits: list[Split]
    schema: pa.Schema                 # of the output columns
    read_columns: list[str]           # output columns plus the filter's
    filter: pc.Expression | None
    data_fingerprint: str
    num_rows: int                     # before the filter
    _refined: dict[int, list[Split]] = field(default_factory=dict, repr=False)

    def url(self, file_index: int) -> str:
        return display_url(self.protocol, self.files[file_index].entry.path)

    def splits_for(self, num_slots: int) -> list[Split]:
        """The splits with large ones cut until there are at least ``num_slots`` (when rows allow)."""
        if num_slots not in self._refined:
            self._refined[num_slots] = refine_splits(self.splits, num_slots, self.files)
        return self._refined[num_slots]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_refined"] = {}
        shipped = sum(f.metadata.serialized_size for f in self.files if f.metadata is not None)
        if shipped > _SHIPPED_METADATA_BYTES:
            state["files"] = [FileFooter(f.entry, f.schema, f.row_group_rows, f.row_group_bytes,
                                         f.kept_row_groups) for f in self.files]
        return state


def _pyarrow_filesystem(storage: Storage) -> pafs.FileSystem:
    if storage.is_local:
        return pafs.LocalFileSystem()
    return pafs.PyFileSystem(pafs.FSSpecHandler(storage.fs))


def _read_footer(storage: Storage, filesystem: pafs.FileSystem, entry: FileEntry,
                 filter: pc.Expression | None, filter_columns: list[str] | None) -> FileFooter:
    """Read one footer; prune row groups by statistics when the file has the filter's columns.

    With ``filter_columns=None`` (the first file) the filter is validated against this file.
    """
    url = display_url(storage.protocol, entry.path)

    def read() -> FileFooter:
        fragment = ds.ParquetFileFormat().make_fragment(entry.path, filesystem=filesystem)
        metadata = fragment.metadata
        schema = fragment.physical_schema
        rows = tuple(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
        sizes = tuple(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
        kept: tuple[int, ...] = tuple(range(len(rows)))
        if filter is not None:
            needed = filter_columns if filter_columns is not None else check_filter(filter, schema, url)
            if all(name in schema.names for name in needed):  # else the schema check reports it
                kept = tuple(f.row_groups[0].id for f in fragment.split_by_row_group(filter, schema=schema))
        return FileFooter(entry, schema, rows, sizes, kept, metadata)

    try:
        return storage.retry.call(read, url)
    except InvalidArgumentError:
        raise
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise wrap_read_error(exc, url) from exc


def _referenced(filter: pc.Expression, schema: pa.Schema) -> list[str]:
    """Column names a filter expression reads, found by elimination on empty tables."""
    empty = schema.empty_table()
    needed = []
    for name in schema.names:
        try:
            empty.drop_columns([name]).filter(filter)
        except (pa.ArrowException, ValueError, TypeError, KeyError):
            needed.append(name)
    return needed


def check_filter(filter: pc.Expression, schema: pa.Schema, url: str) -> list[str]:
    """Validate ``filter`` on ``schema``; return the columns it reads."""
    try:
        schema.empty_table().filter(filter)
    except (pa.ArrowException, ValueError, TypeError, KeyError) as exc:
        raise InvalidArgumentError(
            f"filter: {filter} cannot be evaluated on the columns of {url} ({exc}); "
            f"the file has columns {schema.names}") from None
    return _referenced(filter, schema)


def _check_schemas(footers: Sequence[FileFooter], protocol: str, required: list[str],
                   all_columns: bool) -> None:
    reference = footers[0]
    ref_url = display_url(protocol, reference.entry.path)
    for footer in footers[1:]:
        url = display_url(protocol, footer.entry.path)
        names = set(footer.schema.names)
        if all_columns and names != set(reference.schema.names):
            extra = sorted(names - set(reference.schema.names))
            missing = sorted(set(reference.schema.names) - names)
            raise SchemaMismatchError(
                f"{url} has columns that differ from {ref_url}: missing {missing}, extra {extra}; "
                "pass `columns=[...]` with the columns all files share, or fix the files")
        for name in required:
            if name not in names:
                raise SchemaMismatchError(
                    f"{url} has no column {name!r}, which {ref_url} has; "
                    "leave the column out of `columns` or fix the file")
            ref_type = reference.schema.field(name).type
            this_type = footer.schema.field(name).type
            if ref_type != this_type:
                raise SchemaMismatchError(
                    f"column {name!r} is {this_type} in {url} but {ref_type} in {ref_url}; "
                    "rewrite the files with one type, or leave the column out of `columns`")


def _runs(footer: FileFooter, split_bytes: int | None) -> list[list[int]]:
    """Kept row groups in runs of neighbours whose bytes fit ``split_bytes`` (one each when None)."""
    runs: list[list[int]] = []
    run_bytes = 0
    for rg in footer.kept_row_groups:
        if footer.row_group_rows[rg] == 0:
            continue
        size = footer.row_group_bytes[rg]
        joins = (split_bytes is not None and runs and runs[-1][-1] == rg - 1
                 and run_bytes + size <= split_bytes)
        if joins:
            runs[-1].append(rg)
            run_bytes += size
        else:
            runs.append([rg])
            run_bytes = size
    return runs


def _base_splits(footers: Sequence[FileFooter], split_bytes: int | None) -> list[Split]:
    splits: list[Split] = []
    for file_index, footer in enumerate(footers):
        for run in _runs(footer, split_bytes):
            rows = sum(footer.row_group_rows[i] for i in run)
            size = sum(footer.row_group_bytes[i] for i in run)
            splits.append(Split(file_index, run[0], run[-1] + 1, 0, rows, size))
    return splits


def _single_row_groups(split: Split, footer: FileFooter) -> list[Split]:
    if split.row_group_stop - split.row_group_start == 1:
        return [split]
    return [Split(split.file_index, rg, rg + 1, 0, footer.row_group_rows[rg], footer.row_group_bytes[rg])
            for rg in range(split.row_group_start, split.row_group_stop)]


def _row_ranges(split: Split, pieces: int) -> list[Split]:
    base, extra = divmod(split.num_rows, pieces)
    out, start = [], split.row_start
    for k in range(pieces):
        rows = base + (1 if k < extra else 0)
        out.append(Split(split.file_index, split.row_group_start, split.row_group_stop, start, rows,
                         split.num_bytes * rows // max(split.num_rows, 1)))
        start += rows
    return out


def refine_splits(splits: Sequence[Split], num_slots: int, footers: Sequence[FileFooter]) -> list[Split]:
    """Make at least ``num_slots`` splits when the rows allow, so that no worker idles.

    First whole row groups come apart; if that is not enough, row groups are cut into
    near-equal row ranges of about ``total_rows // num_slots`` rows. Pure and deterministic.
    """
    if len(splits) >= num_slots:
        return list(splits)
    singles = [s for split in splits for s in _single_row_groups(split, footers[split.file_index])]
    if len(singles) >= num_slots:
        return singles
    target = max(sum(s.num_rows for s in singles) // num_slots, 1)
    return [piece for s in singles for piece in _row_ranges(s, -(-s.num_rows // target))]


def fingerprint(payload: Any) -> str:
    """A short, stable digest of a JSON-able value."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def plan_parquet(storage: Storage, entries: Sequence[FileEntry], *, columns: list[str] | None,
                 filter: pc.Expression | None, split_bytes: int | None) -> Plan:
    """Read every footer once (concurrently) and build the plan of the dataset."""
    filesystem = _pyarrow_filesystem(storage)
    first = _read_footer(storage, filesystem, entries[0], filter, None)
    first_url = display_url(storage.protocol, entries[0].path)
    filter_columns = _referenced(filter, first.schema) if filter is not None else []
    if columns is not None:
        unknown = [c for c in columns if c not in first.schema.names]
        if unknown:
            raise InvalidArgumentError(
                f"columns: {unknown} not found in {first_url}; its columns are {first.schema.names}")
    rest = entries[1:]
    if len(rest) > 1:
        with ThreadPoolExecutor(max_workers=min(MAX_PLANNING_THREADS, len(rest))) as pool:
            others = list(pool.map(lambda e: _read_footer(storage, filesystem, e, filter, filter_columns), rest))
    else:
        others = [_read_footer(storage, filesystem, e, filter, filter_columns) for e in rest]
    footers = [first, *others]

    output_columns = list(columns) if columns is not None else list(first.schema.names)
    read_columns = output_columns + [c for c in filter_columns if c not in output_columns]
    _check_schemas(footers, storage.protocol, read_columns, all_columns=columns is None)

    num_rows = sum(sum(f.row_group_rows) for f in footers)
    if num_rows == 0:
        raise EmptyDatasetError(
            f"path: the {len(footers)} file(s) starting with {first_url} hold no rows; "
            "point `path` at data that has rows")
    splits = _base_splits(footers, split_bytes)
    if not splits:
        raise EmptyDatasetError(
            f"filter: {filter} excludes every row group of the {len(footers)} file(s) by their "
            "statistics, so an epoch would be empty; loosen the filter or check the data")
    data_fingerprint = fingerprint({
        "files": [[f.entry.name, f.entry.size, f.entry.tag, list(f.row_group_rows)] for f in footers],
        "schema": [[fld.name, str(fld.type)] for fld in first.schema],
    })
    schema = pa.schema([first.schema.field(c) for c in output_columns])
    return Plan(storage.protocol, footers, splits, schema, read_columns, filter, data_fingerprint, num_rows)

