"""CSV and JSON Lines: stretches of bytes are the units.

Text files carry no metadata, so planning scans every file once, in the main process (files in
parallel), for where its rows start. A unit is the rows whose first byte lies in one stretch of
``unit_bytes`` of the file; its byte range runs from its first row's start to the next unit's, so
units never cut a row and a reader seeks straight to its unit. The scan knows CSV quoting (RFC
4180: a quote opens and closes a field, a doubled quote is a quote): a line break inside a quoted
field does not end a row. Empty lines are not rows (pyarrow skips them), header lines are not rows.

Compressed files (``.gz``, ``.bz2``, ``.zst``) cannot be entered in the middle: a file is one unit,
read as a stream. So is a file whose rows the scan cannot find: CSV with ``escape_char`` (an escaped
quote would fool the quote count), JSON with ``newlines_in_values``, and a file with a lone ``\\r``
outside quotes (a line break to pyarrow, not to the scan); their rows are counted by pyarrow's own
parser at planning.

Every unit is parsed with the column names and types inferred once, from the first file, and the
rows it parses into must be the rows the scan counted (else a clear error). A row pyarrow cannot
parse is found by bisection and named by file, line and byte offset; ``bad_rows="skip"`` turns such
rows into gaps that the reader drops like filtered rows, each logged.

Its jobs lie in modules of their own: the parse options and a file's layout (``_text_settings``), the
row scanner (``_rowscan``), parsing and bad rows (``_text_parse``), reading units (``_text_reader``);
this module is the format: planning (inference, the scan into units, one schema for all files).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from .._core.plan_types import FileEntry
from .._storage.filesystem import Storage, display_url
from ..errors import CorruptFileError, MalformedRowError, SchemaMismatchError
from .base import FileFooter, sliced
from .rowscan import RowScanner, scan_units
from .sniff import wrong_format_hint
from .text_parse import ROW_OK, locate_bad_rows, owned
from .text_reader import TextFile, open_stream, read_blocks
from .text_settings import TextLayout, TextSettings

__all__ = ["CSV", "JSONL", "ROW_OK", "TextFile", "TextFormat", "TextSettings"]

UNIT_BYTES = 8 << 20        # a unit when split_bytes does not ask for less
_INFER_BYTES = 1 << 20      # types are inferred from the rows in a file's first MiB (pyarrow's first block)
_COMPRESSION = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd"}


def _fits(inferred: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether text that infers as ``inferred`` parses as ``wanted`` (integers as floats, anything as string)."""
    if pa.types.is_string(wanted) or pa.types.is_large_string(wanted):
        return True
    return bool(pa.types.is_integer(inferred) and pa.types.is_floating(wanted))


class TextFormat:
    """CSV or JSON Lines. The module's instances read plans; planning uses one made with the dataset's
    options (``configured``), whose settings then travel in every footer."""

    def __init__(self, kind: str, settings: TextSettings | None = None, unit_bytes: int = UNIT_BYTES) -> None:
        self.name = kind
        self.label = "CSV" if kind == "csv" else "JSON Lines"
        self.unit, self.units = "byte range", "byte ranges"
        self.row_ok_column: str | None = ROW_OK
        self.settings = settings or TextSettings(kind, ())
        self.unit_bytes = unit_bytes

    def configured(self, parse_options: TextSettings | None, split_bytes: int | None) -> TextFormat:
        unit = min(split_bytes, UNIT_BYTES) if split_bytes else UNIT_BYTES
        return TextFormat(self.name, parse_options if parse_options is not None else self.settings, unit)

    def _infer(self, head: bytes, complete: bool, url: str) -> pa.Schema:
        """Column names and types from the start of a file (pyarrow's inference on its first block);
        a row there that does not parse is named like one met while reading."""
        settings = self.settings
        if settings.kind == "csv":
            read, parse_csv, convert = settings.csv_options(None, None, None, True)

            asked = dict(settings.get("column_types", ()))

            def infer(data: bytes) -> pa.Schema:
                schema = pa_csv.open_csv(owned(data), read_options=read, parse_options=parse_csv,
                                         convert_options=convert).schema
                # pyarrow infers binary for a column with bytes that are not UTF-8: asked for as string, such a
                # row is named like any row that does not parse (or skipped), not a silent change of type
                binary = [f.name for f in schema if f.name not in asked and pa.types.is_binary(f.type)]
                if binary:
                    convert.column_types = {**convert.column_types, **dict.fromkeys(binary, pa.string())}
                    schema = pa_csv.open_csv(owned(data), read_options=read, parse_options=parse_csv,
                                             convert_options=convert).schema
                return schema
        else:
            read_json, parse_json = settings.json_options(None, True)

            def infer(data: bytes) -> pa.Schema:
                return pa_json.open_json(owned(data), read_options=read_json, parse_options=parse_json).schema
        if not settings.scannable:
            return infer(head)
        scanner = RowScanner(settings.quote, settings.skip_empty)
        starts, _ = scanner.feed(head)
        if complete:
            starts = np.concatenate((starts, scanner.finish(head[scanner.row_start:])[0]))
        elif len(starts) > settings.leading_rows + 1:   # the rows that end in the head
            head = head[:scanner.row_start]
        try:
            return infer(head)
        except pa.ArrowInvalid as exc:
            failure = str(exc).splitlines()[0]
        if len(starts) <= settings.leading_rows:
            raise MalformedRowError(f"{url}: the first lines (the header or skipped rows) do not parse: {failure}; "
                                    "check the file and parse_options (delimiter, quote_char, skip_rows, header)")
        header_end = int(starts[settings.leading_rows])
        header = head[:header_end] if settings.kind == "csv" else b""
        data = head[header_end:]

        if settings.kind == "csv":
            def parse(chunk: bytes) -> pa.Table:
                return pa_csv.read_csv(owned(header + chunk), read_options=read, parse_options=parse_csv,
                                       convert_options=convert)
        else:
            def parse(chunk: bytes) -> pa.Table:
                return pa_json.read_json(owned(chunk), read_options=read_json, parse_options=parse_json)
        relative = starts[settings.leading_rows:] - header_end
        relative = relative[relative < len(data)]
        bad = locate_bad_rows(parse, data, relative, settings, url, head[:header_end].count(b"\n"), header_end)
        good = np.ones(len(relative), dtype=bool)
        good[[row for row, _, _, _ in bad]] = False
        bounds = [*relative.tolist(), len(data)]
        return infer(header + b"".join(data[bounds[i]:bounds[i + 1]] for i in np.flatnonzero(good).tolist()))

    def inspect(self, storage: Storage, entry: FileEntry, filter: pc.Expression | None,
                filter_columns: list[str]) -> FileFooter:
        settings = self.settings
        suffix = "." + entry.path.rsplit(".", 1)[-1].lower() if "." in entry.path else ""
        compression = _COMPRESSION.get(suffix)
        if entry.size == 0:
            return FileFooter(entry, self.name, pa.schema([]), (), (), (), None,
                              TextLayout(settings, compression, (), (), (), False))
        lone_cr = False
        with open_stream(storage, entry, compression) as stream:
            head = stream.read(_INFER_BYTES)
            if not head.strip():
                return FileFooter(entry, self.name, pa.schema([]), (), (), (), None,
                                  TextLayout(settings, compression, (), (), (), False))
            url = display_url(storage.protocol, entry.path)
            hint = wrong_format_hint(head, self.name)   # a Parquet file read as CSV: say so, not "bad row"
            if hint is not None:
                raise CorruptFileError(f"{url}: {hint}")
            schema = self._infer(head, len(head) < _INFER_BYTES, url)
            if settings.scannable:   # the scan goes on from the head: each byte is read once
                unit_bytes = self.unit_bytes if compression is None else 1 << 62   # compressed: one unit
                units, size, quoted, lone_cr = scan_units(itertools.chain([head], read_blocks(stream)), settings,
                                                          unit_bytes)
                rows = sum(u[1] for u in units)
        names = tuple(schema.names)
        if not settings.scannable or lone_cr:   # pyarrow finds the rows: one unit, counted by pyarrow's parse
            rows, quoted = self._count_rows(storage, entry, compression, schema), False
        elif compression is None:
            starts = [u[0] for u in units]
            ranges = tuple(zip(starts, [*starts[1:], size], strict=True)) if starts else ()
            return FileFooter(entry, self.name, schema, tuple(u[1] for u in units), tuple(e - s for s, e in ranges),
                              tuple(range(len(units))), None,
                              TextLayout(settings, None, ranges, tuple(u[2] for u in units), names, quoted))
        return FileFooter(entry, self.name, schema, (rows,) if rows else (), (entry.size,) if rows else (),
                          (0,) if rows else (), None,
                          TextLayout(settings, compression, ((0, entry.size),), (0,), names, quoted, lone_cr))

    def _count_rows(self, storage: Storage, entry: FileEntry, compression: str | None, schema: pa.Schema) -> int:
        """Rows of a file whose rows the scan cannot find, by pyarrow's own streaming parse (one column)."""
        settings = self.settings
        with open_stream(storage, entry, compression) as stream:
            if settings.kind == "csv":
                read, parse, convert = settings.csv_options(None, None, [schema.names[0]], True)
                batches = pa_csv.open_csv(stream, read_options=read, parse_options=parse, convert_options=convert)
            else:
                read_json, parse_json = settings.json_options(None, True)
                batches = pa_json.open_json(stream, read_options=read_json, parse_options=parse_json)
            return sum(batch.num_rows for batch in batches)

    def reconcile(self, footers: list[FileFooter], protocol: str) -> list[FileFooter]:
        """Every file read with the types inferred from the first file with rows; another file's inferred
        type must fit in them (an int column is read as double where the first file has doubles)."""
        with_rows = [f for f in footers if any(f.unit_rows)]
        if not with_rows:
            return footers
        reference = with_rows[0]
        ref_url = display_url(protocol, reference.entry.path)
        out = []
        for footer in footers:
            fields = []
            for fld in footer.schema:
                index = reference.schema.get_field_index(fld.name)
                if index < 0 or not any(footer.unit_rows):
                    fields.append(fld)
                    continue
                wanted = reference.schema.field(index)
                if fld.type != wanted.type and not pa.types.is_null(fld.type) and not _fits(fld.type, wanted.type):
                    raise SchemaMismatchError(
                        f"column {fld.name!r} reads as {fld.type} in {display_url(protocol, footer.entry.path)} but "
                        f"as {wanted.type} in {ref_url} (types inferred from each file's first rows); pass "
                        f"parse_options={{'column_types': {{{fld.name!r}: '{fld.type}'}}}} (or the type you want)")
                fields.append(wanted)
            schema = pa.schema(fields)
            out.append(footer if schema == footer.schema else FileFooter(
                footer.entry, footer.format, schema, footer.unit_rows, footer.unit_bytes, footer.kept_units,
                footer.handle, footer.extra))
        return out

    def open(self, storage: Storage, footer: FileFooter) -> TextFile:
        return TextFile(storage, footer)

    def byte_ranges(self, footer: FileFooter, units: Sequence[int], columns: list[str]) -> list[tuple[int, int]]:
        layout: TextLayout = footer.extra
        if layout.compression is not None or not layout.settings.scannable:
            return []
        return [layout.ranges[unit] for unit in units]

    def physical_rows(self, footer: FileFooter, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Rows as the scan counts them: the file's data rows (no header, no empty line), skipped bad rows included."""
        return rows

    def baseline_batches(self, source: Any, footer: FileFooter, columns: list[str],
                         batch_size: int) -> Iterator[pa.RecordBatch]:
        """pyarrow's own streaming reader (its inference, its threads)."""
        layout: TextLayout = footer.extra
        stream = pa.input_stream(source, compression=layout.compression)
        if self.name == "csv":
            read, parse, convert = layout.settings.csv_options(None, None, columns, True)
            batches = pa_csv.open_csv(stream, read_options=read, parse_options=parse, convert_options=convert)
        else:
            read_json, parse_json = layout.settings.json_options(None, True)
            batches = (b.select(columns) for b in pa_json.open_json(stream, read_options=read_json,
                                                                     parse_options=parse_json))
        for batch in batches:
            yield from sliced(batch, batch_size)


CSV = TextFormat("csv")
JSONL = TextFormat("jsonl")
