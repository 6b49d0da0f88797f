"""Planning: read every file's metadata once, in the main process, and cut the data into splits.

A split is a contiguous range of rows of one file that never cuts a unit (Parquet row group,
ORC stripe, IPC record batch) unless the plan has fewer splits than slots (then single units
are cut into row ranges, so no worker idles). Everything after :func:`plan_files` is pure and cheap to recompute.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from ._discovery import FileEntry
from ._failures import wrap_read_error
from ._formats import FileFooter, FileFormat, check_counts
from ._hashing import fingerprint  # also importable from here, its old home
from ._plan_types import Split  # also importable from here, its old home
from ._storage import Storage, display_url
from .errors import ArrowStreamError, CorruptFileError, EmptyDatasetError, InvalidArgumentError, SchemaMismatchError

MAX_PLANNING_THREADS = 32
_SHIPPED_METADATA_BYTES = 64 << 20  # footers travel to workers below this total size


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
        if sum(f.handle_bytes for f in self.files) > _SHIPPED_METADATA_BYTES:
            state["files"] = [f.without_handle() for f in self.files]
        return state


def read_footer(storage: Storage, file_format: FileFormat, entry: FileEntry, filter: pc.Expression | None,
                 filter_columns: list[str]) -> FileFooter:
    """Read one file's metadata, retrying transient errors; name the file when it cannot be read or
    announces counts that cannot be."""
    url = display_url(storage.protocol, entry.path)
    try:
        footer = storage.call(lambda: file_format.inspect(storage, entry, filter, filter_columns), url)
    except ArrowStreamError:
        raise
    except Exception as exc:  # backends raise their own types (Azure's HttpResponseError): classified
        raise wrap_read_error(exc, url, file_format.label) from exc
    check_counts(footer, url, file_format.label, file_format.unit)
    _check_names(footer.schema, url, file_format.label)
    return footer


def _check_names(schema: pa.Schema, url: str, label: str) -> None:
    """Refuse a schema whose field names (nested ones too) are not valid UTF-8."""
    try:
        schema.to_string(show_field_metadata=False, show_schema_metadata=False)
        schema.names  # noqa: B018 (decoding is the check)
    except UnicodeDecodeError as exc:
        raise CorruptFileError(
            f"{url}: a column name in the {label} metadata is not valid UTF-8 "
            f"({exc.object[max(exc.start - 16, 0):exc.end + 16]!r}); the file is corrupt: rewrite it with UTF-8 "
            "column names, or leave it out of `path`") from None


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


def _type_of(schema: pa.Schema, name: str) -> str:
    """The type of column ``name`` (of each column of that name, where several share it)."""
    return ", ".join(str(f.type) for f in schema if f.name == name)


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
            ref_type = _type_of(reference.schema, name)
            this_type = _type_of(footer.schema, name)
            if ref_type != this_type:
                raise SchemaMismatchError(
                    f"column {name!r} is {this_type} in {url} but {ref_type} in {ref_url}; "
                    "rewrite the files with one type, or leave the column out of `columns`")


def _runs(footer: FileFooter, split_bytes: int | None) -> list[list[int]]:
    """Kept row groups in runs of neighbours whose bytes fit ``split_bytes`` (one each when None)."""
    runs: list[list[int]] = []
    run_bytes = 0
    for rg in footer.kept_units:
        if footer.unit_rows[rg] == 0:
            continue
        size = footer.unit_bytes[rg]
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
            rows = sum(footer.unit_rows[i] for i in run)
            size = sum(footer.unit_bytes[i] for i in run)
            splits.append(Split(file_index, run[0], run[-1] + 1, 0, rows, size))
    return splits


def _single_units(split: Split, footer: FileFooter) -> list[Split]:
    if split.unit_stop - split.unit_start == 1:
        return [split]
    return [Split(split.file_index, rg, rg + 1, 0, footer.unit_rows[rg], footer.unit_bytes[rg])
            for rg in range(split.unit_start, split.unit_stop)]


def _row_ranges(split: Split, pieces: int) -> list[Split]:
    base, extra = divmod(split.num_rows, pieces)
    out, start = [], split.row_start
    for k in range(pieces):
        rows = base + (1 if k < extra else 0)
        out.append(Split(split.file_index, split.unit_start, split.unit_stop, start, rows,
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
    singles = [s for split in splits for s in _single_units(split, footers[split.file_index])]
    if len(singles) >= num_slots:
        return singles
    target = max(sum(s.num_rows for s in singles) // num_slots, 1)
    return [piece for s in singles for piece in _row_ranges(s, -(-s.num_rows // target))]


class FooterCache(Protocol):
    """Where planning keeps the footers of a listing between runs (``arrowstream._plan_cache``)."""

    def load(self, entries: Sequence[FileEntry]) -> list[FileFooter] | None: ...

    def store(self, entries: Sequence[FileEntry], footers: Sequence[FileFooter]) -> None: ...


def plan_files(storage: Storage, entries: Sequence[FileEntry], file_format: FileFormat, *,
               columns: list[str] | None, filter: pc.Expression | None, split_bytes: int | None,
               cache: FooterCache | None = None) -> Plan:
    """Read every file's metadata once (concurrently; from ``cache`` when it holds this listing's) and
    build the plan of the dataset."""
    footers = cache.load(entries) if cache is not None else None
    if footers is None:
        footers = read_footers(storage, entries, file_format, columns=columns, filter=filter)
        if cache is not None:
            cache.store(entries, footers)
    return plan_footers(storage.protocol, footers, columns=columns, filter=filter, split_bytes=split_bytes)


def _lead(entries: Sequence[FileEntry]) -> int:
    """The file that columns and filter are checked on: the first that is not empty (an empty text file
    names no columns)."""
    return next((i for i, e in enumerate(entries) if e.size != 0), 0)


def _check_columns(columns: list[str] | None, schema: pa.Schema, url: str) -> None:
    if columns is None:
        return
    unknown = [c for c in columns if c not in schema.names]
    if unknown:
        raise InvalidArgumentError(f"columns: {unknown} not found in {url}; its columns are {schema.names}")
    shared = sorted({c for c in columns if schema.names.count(c) > 1})
    if shared:
        raise InvalidArgumentError(
            f"columns: {shared} each name several columns of {url}, so `columns` cannot choose "
            "between them; leave them out of `columns`, or rewrite the file with distinct names")


def read_footers(storage: Storage, entries: Sequence[FileEntry], file_format: FileFormat, *,
                 columns: list[str] | None, filter: pc.Expression | None) -> list[FileFooter]:
    """Every file's footer (concurrently), reconciled; columns and filter checked on the first file
    before the others are read."""
    lead = _lead(entries)
    first_url = display_url(storage.protocol, entries[lead].path)
    first = read_footer(storage, file_format, entries[lead], None, [])
    filter_columns = check_filter(filter, first.schema, first_url) if filter is not None else []
    if filter is not None:  # now that the filter is known to fit, prune the first file too
        first = read_footer(storage, file_format, entries[lead], filter, filter_columns)
    _check_columns(columns, first.schema, first_url)
    rest = [e for i, e in enumerate(entries) if i != lead]
    if len(rest) > 1:
        with ThreadPoolExecutor(max_workers=min(MAX_PLANNING_THREADS, len(rest))) as pool:
            others = list(pool.map(lambda e: read_footer(storage, file_format, e, filter, filter_columns), rest))
    else:
        others = [read_footer(storage, file_format, e, filter, filter_columns) for e in rest]
    footers = [*others[:lead], first, *others[lead:]]
    return file_format.reconcile(footers, storage.protocol)   # text formats: one schema for every file


def plan_footers(protocol: str, footers: list[FileFooter], *, columns: list[str] | None,
                 filter: pc.Expression | None, split_bytes: int | None) -> Plan:
    """The plan of the reconciled footers of every file: columns, filter and schemas checked."""
    lead = _lead([f.entry for f in footers])
    first_url = display_url(protocol, footers[lead].entry.path)
    filter_columns = check_filter(filter, footers[lead].schema, first_url) if filter is not None else []
    _check_columns(columns, footers[lead].schema, first_url)
    # a text file of no rows has names but no types: the schema is that of the first file with rows
    with_rows = [f for f in footers if any(f.unit_rows)] or footers
    reference = with_rows[0]

    output_columns = list(columns) if columns is not None else list(reference.schema.names)
    read_columns = output_columns + [c for c in filter_columns if c not in output_columns]
    _check_schemas(with_rows, protocol, read_columns, all_columns=columns is None)
    if columns is None:  # every column, in file order: duplicate names are legal in Arrow IPC and Parquet
        schema = pa.schema(list(reference.schema))
    else:
        schema = pa.schema([reference.schema.field(c) for c in output_columns])
    return build_plan(protocol, footers, schema, read_columns, filter, split_bytes,
                      identity={"schema": [[fld.name, str(fld.type)] for fld in reference.schema]})


def build_plan(protocol: str, footers: list[FileFooter], schema: pa.Schema, read_columns: list[str],
               filter: pc.Expression | None, split_bytes: int | None, identity: dict[str, Any]) -> Plan:
    """The plan of checked footers; ``identity`` joins the files in the data fingerprint."""
    first_url = display_url(protocol, footers[0].entry.path)
    num_rows = sum(sum(f.unit_rows) for f in footers)
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
        "files": [[f.entry.name, f.entry.size, f.entry.tag, list(f.unit_rows)] for f in footers],
        **identity,
    })
    return Plan(protocol, footers, splits, schema, read_columns, filter, data_fingerprint, num_rows)
