"""Footers as an Arrow table and back, for the plan cache (``arrowstream._planning.cache``): what each format
keeps in a footer, written column by column, never pickled.

One row per file: the format, the schema (an index into the entry's schemas), the units' rows and
bytes, the kept units; the units' byte ranges where a format keeps them in ``handle`` (Arrow IPC,
ORC); a Parquet ``FileMetaData`` kept as ``handle`` as its Thrift bytes (a Parquet metadata file,
read back with ``pq.read_metadata`` and checked against the units' rows and bytes); a text file's
layout (``TextLayout``: compression, byte ranges, line counts, names, flags), whose parse options are
the dataset's own (the cache key holds them). Handles are written exactly where the footers have
them: planning keeps them within the handle budget (``arrowstream._formats.footers``), which bounds the entry too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._core.plan_types import FileEntry
from .base import FileFooter, FileFormat
from .parquet import parsed_metadata, serialized_metadata
from .text_settings import TextLayout, TextSettings

if TYPE_CHECKING:
    from .footers import FooterTable

COLUMNS = ("format", "schema", "unit_rows", "unit_bytes", "kept_units", "spans", "text_compression",
           "text_ranges", "text_lines", "text_names", "text_quoted", "text_lone_cr", "parquet_footer")


def shaping_options(file_format: FileFormat) -> dict[str, Any]:
    """What of a configured format shapes its footers (text: parse options and unit size), JSON-able."""
    settings: TextSettings | None = getattr(file_format, "settings", None)
    return {"parse_options": settings.state() if settings is not None else None,
            "unit_bytes": getattr(file_format, "unit_bytes", None)}


def tabled(table: FooterTable) -> bool:
    """Whether ``table`` can be written as columns (every file format's can): handles are byte ranges or
    Parquet footers, extras text layouts."""
    return (all(isinstance(h, (tuple, pq.FileMetaData)) for h in table.handles.values())
            and all(isinstance(x, TextLayout) for x in table.extras.values()))


def _lists(offsets: np.ndarray, values: np.ndarray) -> pa.Array:
    """A list<int64> column of the files' slices ``values[offsets[i]:offsets[i + 1]]`` (no copy per file)."""
    if len(offsets) and offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError(f"{offsets[-1]} units are more than an entry's list<int64> columns hold")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32), pa.int32()), pa.array(values, pa.int64()))


def _sparse(num_files: int, values: dict[int, Any], type: pa.DataType) -> pa.Array:
    """A column of ``num_files`` nulls but at the indices of ``values`` (the few files with a handle or extra)."""
    if not values:
        return pa.nulls(num_files, type)
    column: list[Any] = [None] * num_files
    for index, value in values.items():
        column[index] = value
    return pa.array(column, type)


def _flat(pairs: Sequence[tuple[int, int]]) -> list[int]:
    return [bound for pair in pairs for bound in pair]


def footer_columns(table: FooterTable, schema_index: np.ndarray) -> dict[str, pa.Array]:
    """The columns of ``table``'s footers (see the module docstring), ``schema_index`` into the entry's
    schemas: the counts as the table holds them, file by file only where a file keeps a handle or a layout."""
    num_files = len(table)
    layouts = {i: x for i, x in table.extras.items() if isinstance(x, TextLayout)}
    spans = {i: _flat(h) for i, h in table.handles.items() if isinstance(h, tuple)}   # IPC, ORC: byte ranges
    parquet = {i: serialized_metadata(h) for i, h in table.handles.items() if isinstance(h, pq.FileMetaData)}
    return {
        "format": pa.array(table.formats, pa.string()).take(pa.array(table.format_index, pa.int8())),
        "schema": pa.array(schema_index, pa.int32()),
        "unit_rows": _lists(table.unit_offsets, table.unit_rows),
        "unit_bytes": _lists(table.unit_offsets, table.unit_bytes),
        "kept_units": _lists(table.kept_offsets, table.kept_units),
        "spans": _sparse(num_files, spans, pa.list_(pa.int64())),
        "text_compression": _sparse(num_files, {i: x.compression for i, x in layouts.items()}, pa.string()),
        "text_ranges": _sparse(num_files, {i: _flat(x.ranges) for i, x in layouts.items()}, pa.list_(pa.int64())),
        "text_lines": _sparse(num_files, {i: list(x.lines) for i, x in layouts.items()}, pa.list_(pa.int64())),
        "text_names": _sparse(num_files, {i: list(x.names) for i, x in layouts.items()}, pa.list_(pa.string())),
        "text_quoted": _sparse(num_files, {i: x.quoted_newlines for i, x in layouts.items()}, pa.bool_()),
        "text_lone_cr": _sparse(num_files, {i: x.lone_cr for i, x in layouts.items()}, pa.bool_()),
        "parquet_footer": _sparse(num_files, parquet, pa.binary()),
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


def _present(column: pa.ChunkedArray) -> list[int]:
    """The indices of the files a sparse column holds a value for."""
    return np.flatnonzero(column.combine_chunks().is_valid().to_numpy(zero_copy_only=False)).tolist()


def footer_table_of(table: pa.Table, schemas: Sequence[pa.Schema], listing: dict[str, pa.Array],
                    file_format: FileFormat) -> FooterTable | None:
    """The footers a table holds as a :class:`~arrowstream._formats.footers.FooterTable` on the current ``listing``
    (its path, name, size, tag and version columns, which the caller checked the table was written from):
    column by column, no ``FileFooter`` per file, the counts checked as ``check_counts`` checks them, all at
    once; handles (byte ranges, Parquet footers) and text layouts rebuilt for the files that have them.
    None when a check fails: :func:`footers_of` then rebuilds the files one by one, and names the file whose
    counts cannot be. ValueError when a Parquet footer does not describe its file's units."""
    from .footers import FooterTable  # imports this package: here, not at the top

    num_files = len(listing["path"])
    if table.num_rows != num_files:
        raise ValueError(f"{table.num_rows} files in an entry of a listing of {num_files}")
    formats = table.column("format")
    if formats.null_count or pc.any(pc.not_equal(formats, file_format.name)).as_py():
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
    handles, extras = _kept_per_file(table, unit_offsets, unit_rows, unit_bytes, file_format)
    if handles is None or extras is None:
        return None
    large = {name: listing[name].cast(pa.large_string()) for name in ("path", "name", "tag", "version")}
    return FooterTable(paths=large["path"], names=large["name"], tags=large["tag"], versions=large["version"],
                       sizes=listing["size"].to_numpy(), formats=[file_format.name],
                       format_index=np.zeros(num_files, dtype=np.int8),
                       schemas=list(schemas), schema_index=schema_index.astype(np.int32),
                       unit_offsets=unit_offsets, unit_rows=unit_rows, unit_bytes=unit_bytes,
                       kept_offsets=kept_offsets, kept_units=kept_units, handles=handles, extras=extras)


def _kept_per_file(table: pa.Table, unit_offsets: np.ndarray, unit_rows: np.ndarray, unit_bytes: np.ndarray,
                   file_format: FileFormat) -> tuple[dict[int, Any] | None, dict[int, Any] | None]:
    """The handles and text layouts of the files that keep one, by file index; (None, None) when one is
    where it cannot be (a Parquet footer beside byte ranges or of another format, a layout of no text format)."""
    handles: dict[int, Any] = {}
    spans = table.column("spans").combine_chunks()
    for index in _present(table.column("spans")):
        handles[index] = _pairs(spans[index].values.to_numpy(zero_copy_only=False))
    footers = table.column("parquet_footer").combine_chunks()
    for index in _present(table.column("parquet_footer")):
        if index in handles or file_format.name != "parquet":
            return None, None
        units = slice(int(unit_offsets[index]), int(unit_offsets[index + 1]))
        handles[index] = parsed_metadata(footers[index].as_py(), unit_rows[units].tolist(),
                                         unit_bytes[units].tolist())
    present = _present(table.column("text_names"))
    settings: TextSettings | None = getattr(file_format, "settings", None)
    if present and settings is None:
        return None, None
    extras: dict[int, Any] = {}
    if present:
        assert settings is not None
        columns = {name: table.column(name).combine_chunks() for name in
                   ("text_compression", "text_ranges", "text_lines", "text_names", "text_quoted", "text_lone_cr")}
        for index in present:
            ranges, lines = (columns[name][index].values for name in ("text_ranges", "text_lines"))
            extras[index] = TextLayout(settings, columns["text_compression"][index].as_py(),
                                       (_pairs(ranges.to_numpy(zero_copy_only=False)) if ranges is not None
                                        else None) or (),
                                       _units(lines.to_numpy(zero_copy_only=False) if lines is not None else None),
                                       tuple(columns["text_names"][index].as_py()),
                                       bool(columns["text_quoted"][index].as_py()),
                                       bool(columns["text_lone_cr"][index].as_py()))
    return handles, extras
