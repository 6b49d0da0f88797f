"""Footers as an Arrow table and back, for the plan cache (``arrowstream._plan_cache``): what each format
keeps in a footer, written column by column, never pickled.

One row per file: the format, the schema (an index into the entry's schemas), the units' rows and
bytes, the kept units; the units' byte ranges where a format keeps them in ``handle`` (Arrow IPC,
ORC); a Parquet ``FileMetaData`` kept as ``handle`` as its Thrift bytes (a Parquet metadata file,
read back with ``pq.read_metadata`` and checked against the units' rows and bytes); a text file's
layout (``TextLayout``: compression, byte ranges, line counts, names, flags), whose parse options are
the dataset's own (the cache key holds them). Handles are written exactly where the footers have
them: planning keeps them within the handle budget (``_footers``), which bounds the entry too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._discovery import FileEntry
from ._base import FileFooter, FileFormat
from ._text_settings import TextLayout, TextSettings
from .parquet import parsed_metadata, serialized_metadata

if TYPE_CHECKING:
    from .._footers import FooterTable

COLUMNS = ("format", "schema", "unit_rows", "unit_bytes", "kept_units", "spans", "text_compression",
           "text_ranges", "text_lines", "text_names", "text_quoted", "text_lone_cr", "parquet_footer")


def shaping_options(file_format: FileFormat) -> dict[str, Any]:
    """What of a configured format shapes its footers (text: parse options and unit size), JSON-able."""
    settings: TextSettings | None = getattr(file_format, "settings", None)
    return {"parse_options": settings.state() if settings is not None else None,
            "unit_bytes": getattr(file_format, "unit_bytes", None)}


def tabled(footers: Sequence[FileFooter]) -> bool:
    """Whether ``footers`` can be written as a table (every file format's can)."""
    return all(f.extra is None or isinstance(f.extra, TextLayout) for f in footers)


def _int_lists(rows: Sequence[Any]) -> pa.Array:
    """A list<int64> column, one list per file (None stays null)."""
    flat = [np.asarray(r, dtype=np.int64).reshape(-1) if r is not None else np.zeros(0, np.int64) for r in rows]
    offsets = np.zeros(len(flat) + 1, dtype=np.int32)
    np.cumsum([len(r) for r in flat], out=offsets[1:])
    values = pa.array(np.concatenate(flat) if flat else np.zeros(0, np.int64), pa.int64())
    mask = pa.array([r is None for r in rows], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, mask=mask)


def footer_columns(footers: Sequence[FileFooter], schema_index: Sequence[int]) -> dict[str, pa.Array]:
    """The columns of ``footers`` (see the module docstring)."""
    layouts: list[TextLayout | None] = [f.extra if isinstance(f.extra, TextLayout) else None for f in footers]
    spans = [f.handle if isinstance(f.handle, tuple) else None for f in footers]   # IPC, ORC: units' byte ranges
    return {
        "format": pa.array([f.format for f in footers], pa.string()),
        "schema": pa.array(schema_index, pa.int32()),
        "unit_rows": _int_lists([f.unit_rows for f in footers]),
        "unit_bytes": _int_lists([f.unit_bytes for f in footers]),
        "kept_units": _int_lists([f.kept_units for f in footers]),
        "spans": _int_lists(spans),
        "text_compression": pa.array([lay.compression if lay else None for lay in layouts], pa.string()),
        "text_ranges": _int_lists([lay.ranges if lay else None for lay in layouts]),
        "text_lines": _int_lists([lay.lines if lay else None for lay in layouts]),
        "text_names": pa.array([list(lay.names) if lay else None for lay in layouts], pa.list_(pa.string())),
        "text_quoted": pa.array([lay.quoted_newlines if lay else None for lay in layouts], pa.bool_()),
        "text_lone_cr": pa.array([lay.lone_cr if lay else None for lay in layouts], pa.bool_()),
        "parquet_footer": pa.array([serialized_metadata(f.handle) if isinstance(f.handle, pq.FileMetaData) else None
                                    for f in footers], pa.binary()),
    }


def _row_lists(column: pa.ChunkedArray) -> list[np.ndarray | None]:
    """A list<int64> column as one int64 array per row (None for a null)."""
    array = column.combine_chunks()
    if not isinstance(array, pa.ListArray) or not pa.types.is_int64(array.type.value_type):
        raise ValueError(f"a column of type {array.type} where list<int64> belongs")
    offsets = array.offsets.to_numpy()
    values = array.values.to_numpy(zero_copy_only=False)
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    return [values[offsets[i]:offsets[i + 1]] if valid[i] else None for i in range(len(array))]


def _units(values: np.ndarray | None) -> tuple[int, ...]:
    """Unit counts in the form ``FileFooter`` holds them (the one place to change if that form changes)."""
    return tuple(values.tolist()) if values is not None else ()


def _pairs(values: np.ndarray | None) -> tuple[tuple[int, int], ...] | None:
    if values is None:
        return None
    if len(values) % 2:
        raise ValueError("an odd number of byte-range bounds")
    return tuple((int(a), int(b)) for a, b in values.reshape(-1, 2).tolist())


def footers_of(table: pa.Table, schemas: Sequence[pa.Schema], entries: Sequence[FileEntry],
               file_format: FileFormat) -> list[FileFooter]:
    """The footers a table holds, rebuilt through ``FileFooter`` on ``entries`` (the current listing's, which
    the caller checked the table was written from); text layouts take ``file_format``'s parse options.
    ValueError, IndexError or KeyError when the table is not one :func:`footer_columns` wrote."""
    rows, sizes, kept = (_row_lists(table.column(n)) for n in ("unit_rows", "unit_bytes", "kept_units"))
    spans, ranges, lines = (_row_lists(table.column(n)) for n in ("spans", "text_ranges", "text_lines"))
    formats, schema_index = table.column("format").to_pylist(), table.column("schema").to_pylist()
    compression, names = table.column("text_compression").to_pylist(), table.column("text_names").to_pylist()
    quoted, lone_cr = table.column("text_quoted").to_pylist(), table.column("text_lone_cr").to_pylist()
    parquet_footers = table.column("parquet_footer").to_pylist()
    settings: TextSettings | None = getattr(file_format, "settings", None)
    footers = []
    for i, entry in enumerate(entries):
        if formats[i] != file_format.name:
            raise ValueError(f"a footer of format {formats[i]!r} in an entry of {file_format.name!r}")
        layout = None
        if names[i] is not None:
            if settings is None:
                raise ValueError(f"a text layout for a {formats[i]} file")
            layout = TextLayout(settings, compression[i], _pairs(ranges[i]) or (), _units(lines[i]),
                                tuple(names[i]), bool(quoted[i]), bool(lone_cr[i]))
        unit_rows, unit_bytes = _units(rows[i]), _units(sizes[i])
        handle: Any = _pairs(spans[i])
        if parquet_footers[i] is not None:
            if handle is not None or formats[i] != "parquet":
                raise ValueError(f"a Parquet footer kept for a {formats[i]} file")
            handle = parsed_metadata(parquet_footers[i], unit_rows, unit_bytes)
        footers.append(FileFooter(entry, formats[i], schemas[schema_index[i]], unit_rows, unit_bytes,
                                  _units(kept[i]), handle, layout))
    return footers


def _flat_lists(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray] | None:
    """A list<int64> column without nulls as (offsets from 0, values), read-only; None when it has nulls."""
    array = column.combine_chunks()
    if not isinstance(array, pa.ListArray) or not pa.types.is_int64(array.type.value_type) or array.null_count:
        return None
    offsets = array.offsets.to_numpy().astype(np.int64)
    values = array.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
    offsets -= offsets[0]
    for out in (offsets, values):
        out.flags.writeable = False
    return offsets, values


def footer_table_of(table: pa.Table, schemas: Sequence[pa.Schema], entries: Sequence[FileEntry],
                    file_format: FileFormat) -> FooterTable | None:
    """The footers a table holds as a :class:`~arrowstream._footers.FooterTable`, column by column: no
    ``FileFooter`` per file, their counts checked as ``check_counts`` checks them, all at once. For the
    common case of many files past the handle budget; None when some file keeps a handle (byte ranges, a
    Parquet footer) or a text layout, or when a count fails a check: :func:`footers_of` then rebuilds the
    files one by one, and names the file whose counts cannot be."""
    from .._footers import FooterTable  # imports this package: here, not at the top

    num_files = len(entries)
    if table.num_rows != num_files:
        raise ValueError(f"{table.num_rows} files in an entry of a listing of {num_files}")
    if any(table.column(name).null_count != num_files for name in ("spans", "text_names", "parquet_footer")):
        return None
    formats = table.column("format")
    if formats.null_count or formats.to_pylist() != [file_format.name] * num_files:
        return None
    schema_index = table.column("schema").to_numpy()
    if num_files and (schema_index.min() < 0 or schema_index.max() >= len(schemas)):
        return None
    lists = [_flat_lists(table.column(name)) for name in ("unit_rows", "unit_bytes", "kept_units")]
    if any(flat is None for flat in lists):
        return None
    (unit_offsets, unit_rows), (byte_offsets, unit_bytes), (kept_offsets, kept_units) = lists  # type: ignore[misc]
    units_per_file = np.diff(unit_offsets)
    owner = np.repeat(np.arange(num_files), np.diff(kept_offsets))
    if (not np.array_equal(unit_offsets, byte_offsets) or (unit_rows < 0).any() or (unit_bytes < 0).any()
            or ((kept_units < 0) | (kept_units >= units_per_file[owner])).any()):
        return None
    return FooterTable(paths=pa.array([e.path for e in entries], pa.large_string()),
                       names=pa.array([e.name for e in entries], pa.large_string()),
                       tags=pa.array([e.tag for e in entries], pa.large_string()),
                       versions=pa.array([e.version for e in entries], pa.large_string()),
                       sizes=np.fromiter((e.size for e in entries), dtype=np.int64, count=num_files),
                       formats=[file_format.name], format_index=np.zeros(num_files, dtype=np.int8),
                       schemas=list(schemas), schema_index=schema_index.astype(np.int32),
                       unit_offsets=unit_offsets, unit_rows=unit_rows, unit_bytes=unit_bytes,
                       kept_offsets=kept_offsets, kept_units=kept_units, handles={}, extras={})
