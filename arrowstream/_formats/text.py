"""CSV and JSON Lines: stretches of bytes are the units.

Text files carry no metadata, so planning scans every file once, in the main process (files in
parallel), for where its rows start. A unit is the rows whose first byte lies in one stretch of
``unit_bytes`` of the file; its byte range runs from its first row's start to the next unit's, so
units never cut a row and a reader seeks straight to its unit. The scan knows CSV quoting (RFC
4180: a quote opens and closes a field, a doubled quote is a quote): a line break inside a quoted
field does not end a row. Empty lines are not rows (pyarrow skips them), header lines are not rows.

Compressed files (``.gz``, ``.bz2``, ``.zst``) cannot be entered in the middle: a file is one unit,
read as a stream. So is a file whose rows the scan cannot find: CSV with ``escape_char`` (an escaped
quote would fool the quote count) and JSON with ``newlines_in_values``; their rows are counted by
pyarrow's own parser at planning.

Every unit is parsed with the column names and types inferred once, from the first file, and the
rows it parses into must be the rows the scan counted (else a clear error). A row pyarrow cannot
parse is found by bisection and named by file, line and byte offset; ``bad_rows="skip"`` turns such
rows into gaps that the reader drops like filtered rows, each logged.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from .._discovery import FileEntry
from .._storage import Storage, display_url
from ..errors import ArgumentTypeError, InvalidArgumentError, MalformedRowError, SchemaMismatchError
from ._base import FileFooter, sliced

logger = logging.getLogger("arrowstream")

UNIT_BYTES = 8 << 20        # a unit when split_bytes does not ask for less
_BLOCK_BYTES = 8 << 20      # bytes read at a time by scans and streams
_INFER_BYTES = 1 << 20      # types are inferred from the rows in a file's first MiB (pyarrow's first block)
ROW_OK = "__arrowstream_row_ok"
_COMPRESSION = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd"}

_CSV_PARSE = ("delimiter", "quote_char", "double_quote", "escape_char", "newlines_in_values", "ignore_empty_lines")
_CSV_READ = ("column_names", "skip_rows", "skip_rows_after_names", "encoding")
_CSV_CONVERT = ("null_values", "true_values", "false_values", "strings_can_be_null", "quoted_strings_can_be_null",
                "timestamp_parsers", "decimal_point", "check_utf8")
_COMMON = ("column_types", "bad_rows")
CSV_KEYS = (*_CSV_PARSE, *_CSV_READ, *_CSV_CONVERT, "header", *_COMMON)
JSON_KEYS = ("newlines_in_values", "unexpected_field_behavior", *_COMMON)


def _data_type(name: str, value: Any) -> pa.DataType:
    if isinstance(value, pa.DataType):
        return value
    if isinstance(value, str):
        try:
            return pa.type_for_alias(value)
        except ValueError:
            pass
    raise InvalidArgumentError(f"parse_options: column_types[{name!r}] = {value!r} is not a pyarrow type; "
                               "pass a pyarrow.DataType or a name such as 'int64', 'float32', 'string'")


@dataclass(frozen=True)
class TextSettings:
    """The parse options of a CSV or JSON Lines dataset, validated (picklable, travels with the plan)."""

    kind: str                                   # "csv" or "jsonl"
    options: tuple[tuple[str, Any], ...]        # the user's keys, sorted, types resolved
    bad_rows: str = "error"

    @classmethod
    def from_user(cls, kind: str, options: Mapping[str, Any] | None) -> TextSettings:
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ArgumentTypeError(f"parse_options: expected a dict of option -> value, got {type(options).__name__}")
        allowed = CSV_KEYS if kind == "csv" else JSON_KEYS
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise InvalidArgumentError(f"parse_options: {unknown} are not {kind} options; known: {sorted(allowed)}")
        resolved = dict(options)
        bad_rows = resolved.pop("bad_rows", "error")
        if bad_rows not in ("error", "skip"):
            raise InvalidArgumentError(f"parse_options: bad_rows must be 'error' or 'skip', got {bad_rows!r}")
        if "column_types" in resolved:
            types = resolved["column_types"]
            if not isinstance(types, Mapping):
                raise ArgumentTypeError("parse_options: column_types must be a dict of column name -> type")
            resolved["column_types"] = tuple(sorted((str(k), _data_type(k, v)) for k, v in types.items()))
        encoding = str(resolved.get("encoding", "utf8")).lower().replace("-", "").replace("_", "")
        if encoding.startswith(("utf16", "utf32", "ucs")):
            raise InvalidArgumentError(f"parse_options: encoding {resolved['encoding']!r} is not byte-compatible with "
                                       "ASCII line breaks; convert the files to UTF-8")
        for key in ("column_names", "null_values", "true_values", "false_values", "timestamp_parsers"):
            if key in resolved:
                if isinstance(resolved[key], str) or not isinstance(resolved[key], Sequence):
                    raise ArgumentTypeError(f"parse_options: {key} must be a list of strings, got {resolved[key]!r}")
                resolved[key] = tuple(resolved[key])
        for key in ("skip_rows", "skip_rows_after_names"):
            value = resolved.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(f"parse_options: {key} must be an int >= 0, got {value!r}")
        settings = cls(kind, tuple(sorted(resolved.items())), bad_rows)
        if bad_rows == "skip" and not settings.scannable:
            raise InvalidArgumentError("parse_options: bad_rows='skip' needs rows the scan can find, which "
                                       f"{'escape_char' if kind == 'csv' else 'newlines_in_values'} prevents; "
                                       "leave one of the two out")
        if kind == "csv":   # let pyarrow check the values now, in the main process
            settings.csv_options(None, None, None, True)
        elif resolved.get("unexpected_field_behavior", "error") not in ("error", "ignore"):
            raise InvalidArgumentError(  # 'infer' would give units columns the others lack
                "parse_options: unexpected_field_behavior must be 'error' (a field the first file's rows lack is an "
                f"error) or 'ignore' (it is left out), got {resolved['unexpected_field_behavior']!r}; list late "
                "fields in column_types to read them")
        return settings

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)

    def state(self) -> dict[str, Any]:
        """JSON-able form for the options fingerprint."""
        return {"kind": self.kind, "bad_rows": self.bad_rows,
                **{k: [list(map(str, t)) for t in v] if k == "column_types" else v for k, v in self.options}}

    @property
    def scannable(self) -> bool:
        """Whether a scan of the bytes finds where rows start (else files are whole units)."""
        if self.kind == "csv":
            return self.get("escape_char", False) is False
        return not self.get("newlines_in_values", False)

    @property
    def quote(self) -> int | None:
        if self.kind != "csv":
            return None
        quote = self.get("quote_char", '"')
        return None if quote is False else ord(quote)

    @property
    def skip_empty(self) -> bool:
        return self.kind != "csv" or bool(self.get("ignore_empty_lines", True))

    @property
    def leading_rows(self) -> int:
        """Rows before the data: skipped rows, the header, rows skipped after the header."""
        if self.kind != "csv":
            return 0
        header = self.get("header", True) and self.get("column_names") is None
        return int(self.get("skip_rows", 0)) + int(bool(header)) + int(self.get("skip_rows_after_names", 0))

    def csv_options(self, names: list[str] | None, schema: pa.Schema | None, include: list[str] | None,
                    use_threads: bool, newlines: bool = False,
                    ) -> tuple[pa_csv.ReadOptions, pa_csv.ParseOptions, pa_csv.ConvertOptions]:
        """pyarrow's options: as the user gave them when ``names`` is None (the file with its header),
        else for headerless stretches of data rows with known names and types."""
        opts = dict(self.options)
        read = {k: opts[k] for k in _CSV_READ if k in opts}
        parse = {k: opts[k] for k in _CSV_PARSE if k in opts}
        convert = {k: opts[k] for k in _CSV_CONVERT if k in opts}
        if names is None:
            read.setdefault("autogenerate_column_names", not opts.get("header", True) and "column_names" not in opts)
            if "column_names" in read:
                read["column_names"] = list(read["column_names"])
            convert["column_types"] = dict(opts.get("column_types", ()))
        else:
            read = {"column_names": names, **({"encoding": read["encoding"]} if "encoding" in read else {})}
            assert schema is not None
            convert["column_types"] = {f.name: f.type for f in schema}
        if include is not None:
            convert["include_columns"] = include
        if newlines:
            parse["newlines_in_values"] = True
        for key in ("null_values", "true_values", "false_values", "timestamp_parsers"):
            if key in convert:
                convert[key] = list(convert[key])
        try:
            return (pa_csv.ReadOptions(use_threads=use_threads, **read), pa_csv.ParseOptions(**parse),
                    pa_csv.ConvertOptions(**convert))
        except (TypeError, ValueError, pa.ArrowInvalid) as exc:
            raise InvalidArgumentError(f"parse_options: pyarrow refuses them: {exc}") from None

    def json_options(self, schema: pa.Schema | None, use_threads: bool, block_size: int | None = None,
                     ) -> tuple[pa_json.ReadOptions, pa_json.ParseOptions]:
        opts = dict(self.options)
        parse: dict[str, Any] = {"newlines_in_values": bool(opts.get("newlines_in_values", False))}
        if schema is not None:
            parse["explicit_schema"] = schema
            parse["unexpected_field_behavior"] = opts.get("unexpected_field_behavior", "error")
        elif "column_types" in opts:
            parse["explicit_schema"] = pa.schema(list(opts["column_types"]))
        read = {"use_threads": use_threads, **({"block_size": block_size} if block_size else {})}
        return pa_json.ReadOptions(**read), pa_json.ParseOptions(**parse)


# -- finding rows ------------------------------------------------------------------------------------------------


class RowScanner:
    """Where rows start, in a stream of bytes fed block by block (offsets count from the stream's start).

    A row ends at a line break outside quotes; a row that is empty (or only ``\\r``) is no row when
    ``skip_empty``. ``feed`` returns the starts of the rows that ended in the block and the line
    breaks before each start; ``finish`` adds a last row that has no line break.
    """

    def __init__(self, quote: int | None, skip_empty: bool) -> None:
        self._quote, self._skip_empty = quote, skip_empty
        self._in_quote = 0
        self._row_start = 0      # start of the row being read
        self._row_lines = 0      # line breaks before it
        self._pos = 0            # bytes fed
        self._lines = 0          # line breaks fed
        self._last = -1          # the byte before this block
        self.quoted_newlines = False

    def _keep(self, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], arr: npt.NDArray[np.uint8],
              ) -> npt.NDArray[np.bool_]:
        lengths = ends - starts
        if not self._skip_empty:
            return np.ones(len(starts), dtype=bool)
        first = np.full(len(starts), -1, dtype=np.int16)
        inside = (starts >= self._pos) & (starts < self._pos + len(arr))
        first[inside] = arr[starts[inside] - self._pos]
        first[starts == self._pos - 1] = self._last
        empty: npt.NDArray[np.bool_] = (lengths == 0) | ((lengths == 1) & (first == 13))
        return ~empty

    def feed(self, block: bytes) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        arr = np.frombuffer(block, dtype=np.uint8)
        breaks = np.flatnonzero(arr == 10)
        ends = breaks
        if self._quote is not None:
            quotes = np.flatnonzero(arr == self._quote)
            if quotes.size:
                outside = ((np.searchsorted(quotes, breaks) + self._in_quote) & 1) == 0
                if not outside.all():
                    self.quoted_newlines = True
                ends = breaks[outside]
                self._in_quote ^= quotes.size & 1
            elif self._in_quote:
                self.quoted_newlines = self.quoted_newlines or bool(breaks.size)
                ends = breaks[:0]
        ends_global = ends.astype(np.int64) + self._pos
        starts = np.concatenate(([self._row_start], ends_global[:-1] + 1)).astype(np.int64) if ends.size else \
            np.zeros(0, dtype=np.int64)
        # line breaks before each start: those before the block plus those in it before the start
        lines = np.concatenate(([self._row_lines],
                                self._lines + np.searchsorted(breaks, ends[:-1]) + 1)).astype(np.int64) \
            if ends.size else np.zeros(0, dtype=np.int64)
        keep = self._keep(starts, ends_global, arr) if ends.size else np.zeros(0, dtype=bool)
        if ends.size:
            self._row_start = int(ends_global[-1]) + 1
            self._row_lines = self._lines + int(np.searchsorted(breaks, ends[-1])) + 1
        self._pos += len(block)
        self._lines += int(breaks.size)
        if block:
            self._last = block[-1]
        return starts[keep], lines[keep]

    def finish(self, tail: bytes) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The last row when the stream does not end with a line break (``tail``: its bytes)."""
        rest = tail.strip(b"\r") if self._skip_empty else tail
        if self._row_start < self._pos and rest:
            return np.array([self._row_start], dtype=np.int64), np.array([self._row_lines], dtype=np.int64)
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)

    @property
    def row_start(self) -> int:
        return self._row_start


def row_starts(data: bytes, settings: TextSettings) -> npt.NDArray[np.int64]:
    """Starts of the rows of ``data`` (which starts at a row start), from a fresh scan."""
    scanner = RowScanner(settings.quote, settings.skip_empty)
    starts, _ = scanner.feed(data)
    last, _ = scanner.finish(data[scanner.row_start:])
    return np.concatenate((starts, last))


def _blocks(source: pa.NativeFile, size: int = _BLOCK_BYTES) -> Iterator[bytes]:
    while True:
        block = source.read(size)
        if not block:
            return
        yield block


def _blocks_then_end(source: pa.NativeFile) -> Iterator[bytes | None]:
    yield from _blocks(source)
    yield None


@dataclass(frozen=True)
class TextLayout:
    """Where a text file's units lie (travels in ``FileFooter.extra``)."""

    settings: TextSettings
    compression: str | None
    ranges: tuple[tuple[int, int], ...]     # byte range of each unit (whole file when compressed)
    lines: tuple[int, ...]                  # line breaks before each unit's first row
    names: tuple[str, ...]                  # the file's column names
    quoted_newlines: bool                   # a quoted field holds a line break: parse with newlines_in_values


def scan_units(blocks: Iterator[bytes], settings: TextSettings, unit_bytes: int,
               ) -> tuple[list[tuple[int, int, int]], int, bool]:
    """(first row start, rows, line breaks before it) per non-empty unit, the stream's size, and whether
    quoted line breaks were seen. Rows are bucketed by ``start // unit_bytes``."""
    scanner = RowScanner(settings.quote, settings.skip_empty)
    skip = settings.leading_rows
    units: dict[int, list[int]] = {}

    def add(starts: npt.NDArray[np.int64], lines: npt.NDArray[np.int64]) -> None:
        nonlocal skip
        if skip:
            drop = min(skip, len(starts))
            starts, lines, skip = starts[drop:], lines[drop:], skip - drop
        if not len(starts):
            return
        buckets = starts // unit_bytes
        keys, first, counts = np.unique(buckets, return_index=True, return_counts=True)
        for key, at, count in zip(keys.tolist(), first.tolist(), counts.tolist(), strict=True):
            if key in units:
                units[key][1] += count
            else:
                units[key] = [int(starts[at]), count, int(lines[at])]

    size = 0
    pending = b""                                   # the bytes of the row still open
    for block in blocks:
        add(*scanner.feed(block))
        size += len(block)
        open_bytes = size - scanner.row_start
        pending = block[len(block) - open_bytes:] if open_bytes <= len(block) else pending + block
    add(*scanner.finish(pending))
    return [tuple(units[k]) for k in sorted(units)], size, scanner.quoted_newlines  # type: ignore[misc]


# -- parsing ------------------------------------------------------------------------------------------------------


def _owned(data: bytes) -> pa.Buffer:
    """``data`` copied into memory Arrow owns. A buffer over Python bytes, handed to pyarrow's parser threads,
    may be released by one of them while Python shuts down, which aborts the process."""
    out = pa.BufferOutputStream()
    out.write(data)
    return out.getvalue()


def _open_stream(storage: Storage, entry: FileEntry, compression: str | None) -> pa.NativeFile:
    raw = storage.open_input(entry)
    return pa.CompressedInputStream(raw, compression) if compression else raw


def parse_rows(data: bytes, settings: TextSettings, names: Sequence[str], schema: pa.Schema,
               include: list[str] | None, use_threads: bool, newlines: bool) -> pa.Table:
    """Parse headerless data rows with fixed names and types."""
    if settings.kind == "csv":
        read, parse, convert = settings.csv_options(list(names), schema, include, use_threads, newlines)
        read.block_size = max(read.block_size, min(len(data) + 1, 64 << 20)) if newlines else read.block_size
        return pa_csv.read_csv(_owned(data), read_options=read, parse_options=parse, convert_options=convert)
    try:
        read_json, parse_json = settings.json_options(schema, use_threads)
        table = pa_json.read_json(_owned(data), read_options=read_json, parse_options=parse_json)
    except pa.ArrowInvalid as exc:
        if "straddl" not in str(exc):
            raise
        read_json, parse_json = settings.json_options(schema, use_threads, block_size=len(data) + 1)
        table = pa_json.read_json(_owned(data), read_options=read_json, parse_options=parse_json)
    return check_utf8(table.select(include) if include is not None else table)


def _holds_strings(data_type: pa.DataType) -> bool:
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type) or pa.types.is_string_view(data_type):
        return True
    return any(_holds_strings(data_type.field(i).type) for i in range(data_type.num_fields))


def check_utf8(table: pa.Table) -> pa.Table:
    """``table``, its string columns checked for UTF-8: pyarrow's JSON reader keeps bytes that are not UTF-8
    in string columns (its CSV reader checks them), which would fail later, naming no row."""
    for name, column in zip(table.column_names, table.columns, strict=True):
        if _holds_strings(column.type):
            try:
                column.validate(full=True)
            except pa.ArrowInvalid:
                raise pa.ArrowInvalid(f"column {name!r}: invalid UTF8 data (bytes that are not UTF-8 in a string)"
                                      ) from None
    return table


def _bad_rows(parse: Callable[[bytes], pa.Table], data: bytes, starts: npt.NDArray[np.int64], first_only: bool,
              ) -> list[tuple[int, str]]:
    """(row index, pyarrow's message) of the rows of ``data`` that do not parse, by bisection."""
    bounds = [*starts.tolist(), len(data)]
    bad: list[tuple[int, str]] = []

    def probe(lo: int, hi: int) -> None:
        if (first_only and bad) or hi <= lo:
            return
        try:
            table = parse(data[bounds[lo]:bounds[hi]])
            if table.num_rows == hi - lo:
                return
            message = f"parsed into {table.num_rows} rows instead of {hi - lo}"
        except (pa.ArrowInvalid, ValueError) as exc:
            message = str(exc).splitlines()[0]
        if hi - lo == 1:
            bad.append((lo, message))
            return
        mid = (lo + hi) // 2
        probe(lo, mid)
        probe(mid, hi)

    probe(0, len(starts))
    return bad


def locate_bad_rows(parse: Callable[[bytes], pa.Table], data: bytes, starts: npt.NDArray[np.int64],
                    settings: TextSettings, url: str, first_line: int, byte_start: int,
                    ) -> list[tuple[int, int, int, str]]:
    """(row index, line, byte offset, pyarrow's message) of the rows of ``data`` that do not parse; raises
    :class:`MalformedRowError` for the first one unless ``bad_rows`` is ``"skip"``."""
    bad = _bad_rows(parse, data, starts, first_only=settings.bad_rows == "error")
    if not bad:   # each row parses alone, not all together: pyarrow splits rows differently than the scan
        raise MalformedRowError(
            f"{url}: bytes [{byte_start}, {byte_start + len(data)}) do not parse together although each row does "
            "alone (a quote character inside an unquoted field? pass parse_options={'quote_char': False} if the "
            "file does not quote fields; or rows of different types: set parse_options={'column_types': ...})")
    where = [(row, first_line + data[:int(starts[row])].count(b"\n") + 1, byte_start + int(starts[row]), msg)
             for row, msg in bad]
    if settings.bad_rows == "error":
        _, line, offset, message = where[0]
        label = "CSV" if settings.kind == "csv" else "JSON"
        if "invalid utf8" in message.lower():
            encoding = "pass parse_options={'encoding': ...} if the file has another encoding, or " \
                if settings.kind == "csv" else ""
            hint = (f"the row holds bytes that are not UTF-8: {encoding}name the column in "
                    "parse_options={'column_types': {...: 'binary'}} to read it as bytes; else fix the row")
        elif message.startswith("parsed into") and settings.kind == "csv":
            hint = ("a quote character inside an unquoted field? pass parse_options={'quote_char': False} if fields "
                    "are never quoted; or fix the row")
        elif "conversion error" in message or "changed from" in message:
            hint = ("if the column's type inferred from the first MiB is too narrow, set it with "
                    "parse_options={'column_types': {...}}; else fix the row")
        else:
            hint = "fix the row"
        raise MalformedRowError(
            f"{url}: line {line} (byte {offset}) is not a valid {label} row: {message}; {hint}, or pass "
            "parse_options={'bad_rows': 'skip'} to skip rows that do not parse (each is logged)")
    return where


class TextFile:
    """An open CSV or JSON Lines file: parses units, checking their rows against the scan's count."""

    def __init__(self, storage: Storage, footer: FileFooter) -> None:
        self._storage, self._footer = storage, footer
        self._layout: TextLayout = footer.extra
        self._url = display_url(storage.protocol, footer.entry.path)
        self._source: pa.NativeFile | None = None

    def _parse(self, data: bytes, expected: int, include: list[str], use_threads: bool,
               first_line: int, byte_start: int) -> pa.Table:
        """The ``expected`` rows of ``data``; a row that does not parse is an error or a gap (``bad_rows``)."""
        layout, settings = self._layout, self._layout.settings
        schema = self._footer.schema

        def parse(chunk: bytes) -> pa.Table:
            return parse_rows(chunk, settings, layout.names, schema, include, use_threads, layout.quoted_newlines)

        try:
            table = parse(data)
            if table.num_rows == expected:
                return table
        except (pa.ArrowInvalid, ValueError):
            pass
        starts = row_starts(data, settings)
        if len(starts) != expected:
            raise MalformedRowError(
                f"{self._url}: bytes [{byte_start}, {byte_start + len(data)}) hold {len(starts)} rows by themselves but "
                f"{expected} in the planning scan of the whole file: the file changed since planning (rebuild the "
                "dataset), or a quote character before them is unbalanced (a quote inside an unquoted field: pass "
                "parse_options={'quote_char': False} if fields are never quoted)")
        where = locate_bad_rows(parse, data, starts, settings, self._url, first_line, byte_start)
        label = "CSV" if settings.kind == "csv" else "JSON"
        for _, line, offset, message in where:
            logger.warning("skipped a bad %s row of %s at line %d (byte %d): %s", label, self._url, line, offset,
                           message)
        rows = np.ones(len(starts), dtype=bool)
        rows[[row for row, _, _, _ in where]] = False
        bounds = [*starts.tolist(), len(data)]
        good = b"".join(data[bounds[i]:bounds[i + 1]] for i in np.flatnonzero(rows).tolist())
        table = parse(good) if good else schema.empty_table().select(include)
        index = np.full(len(starts), -1, dtype=np.int64)
        index[rows] = np.arange(int(rows.sum()))
        taken = table.take(pa.array(index, mask=~rows))
        return taken.append_column(ROW_OK, pa.array(rows))

    def _unit_data(self, unit: int) -> bytes:
        start, end = self._layout.ranges[unit]
        if self._source is None:
            self._source = self._storage.open_input(self._footer.entry)
        self._source.seek(start)
        return self._source.read(end - start)  # type: ignore[no-any-return]

    def _stream_units(self, include: list[str], use_threads: bool) -> Iterator[pa.Table]:
        """A compressed (or unscannable) file, read as a stream by pyarrow's own streaming reader; when a row
        does not parse, again in stretches of whole rows (to name or skip it) after the rows handed out."""
        layout, settings = self._layout, self._layout.settings
        done = 0
        try:
            with _open_stream(self._storage, self._footer.entry, layout.compression) as stream:
                for table in self._parse_stream(stream, include, use_threads):
                    done += table.num_rows
                    yield table
            if done == self._footer.unit_rows[0] or not settings.scannable:
                return
        except pa.ArrowInvalid:
            if not settings.scannable:
                raise
        for table in self._stream_stretches(include, use_threads):
            if done >= table.num_rows:
                done -= table.num_rows
                continue
            yield table.slice(done)
            done = 0

    def _stream_stretches(self, include: list[str], use_threads: bool) -> Iterator[pa.Table]:
        """A compressed file in stretches of whole rows found by the scan, each parsed like a unit."""
        layout, settings = self._layout, self._layout.settings
        with _open_stream(self._storage, self._footer.entry, layout.compression) as stream:
            scanner = RowScanner(settings.quote, settings.skip_empty)
            skip, buffer, buffer_at = settings.leading_rows, b"", 0
            data_at: int | None = None if skip else 0   # where the data rows not yet parsed begin
            data_line = counted = rows = 0
            for block in _blocks_then_end(stream):
                if block is None:
                    starts, lines = scanner.finish(buffer[scanner.row_start - buffer_at:])
                    end = buffer_at + len(buffer)
                else:
                    buffer += block
                    starts, lines = scanner.feed(block)
                    end = scanner.row_start
                if data_at is None:
                    if len(starts) <= skip:
                        skip -= len(starts)
                        continue
                    data_at, data_line = int(starts[skip]), int(lines[skip])
                    starts = starts[skip:]
                counted += len(starts)
                if counted and (block is None or end - data_at >= _BLOCK_BYTES):
                    chunk = buffer[data_at - buffer_at:end - buffer_at]
                    yield self._parse(chunk, counted, include, use_threads, data_line, data_at)
                    rows += counted
                    data_line += chunk.count(b"\n")
                    counted = 0
                    buffer, buffer_at, data_at = buffer[end - buffer_at:], end, end
            if rows != self._footer.unit_rows[0]:
                raise MalformedRowError(
                    f"{self._url}: holds {rows} rows now but held {self._footer.unit_rows[0]} when the dataset was "
                    "planned; the file changed since: rebuild the dataset")

    def _parse_stream(self, stream: pa.NativeFile, include: list[str], use_threads: bool) -> Iterator[pa.Table]:
        """The whole file through pyarrow's streaming reader, with the planned types."""
        settings, schema = self._layout.settings, self._footer.schema
        if settings.kind == "csv":
            read, parse, convert = settings.csv_options(None, None, include, use_threads, self._layout.quoted_newlines)
            convert.column_types = {f.name: f.type for f in schema}
            for batch in pa_csv.open_csv(stream, read_options=read, parse_options=parse, convert_options=convert):
                yield pa.Table.from_batches([batch])
            return
        read_json, parse_json = settings.json_options(schema, use_threads)
        for batch in pa_json.open_json(stream, read_options=read_json, parse_options=parse_json):
            yield check_utf8(pa.Table.from_batches([batch]).select(include))

    def read_units(self, units: Sequence[int], columns: list[str], batch_rows: int,
                   use_threads: bool) -> Iterator[pa.RecordBatch]:
        if self._layout.compression is not None or not self._layout.settings.scannable:
            tables: Iterator[pa.Table] = self._stream_units(columns, use_threads)
        else:
            tables = (self._parse(self._unit_data(unit), self._footer.unit_rows[unit], columns, use_threads, self._layout.lines[unit],
                                       self._layout.ranges[unit][0]) for unit in units)
        for table in tables:
            for batch in table.to_batches():
                yield from sliced(batch, batch_rows)

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
        self._source = None


def _fits(inferred: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether text that infers as ``inferred`` parses as ``wanted`` (integers as floats, anything as string)."""
    if pa.types.is_string(wanted) or pa.types.is_large_string(wanted):
        return True
    return bool(pa.types.is_integer(inferred) and pa.types.is_floating(wanted))


# -- the formats --------------------------------------------------------------------------------------------------


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
                schema = pa_csv.open_csv(_owned(data), read_options=read, parse_options=parse_csv,
                                         convert_options=convert).schema
                # pyarrow infers binary for a column with bytes that are not UTF-8: asked for as string, such a
                # row is named like any row that does not parse (or skipped), not a silent change of type
                binary = [f.name for f in schema if f.name not in asked and pa.types.is_binary(f.type)]
                if binary:
                    convert.column_types = {**convert.column_types, **dict.fromkeys(binary, pa.string())}
                    schema = pa_csv.open_csv(_owned(data), read_options=read, parse_options=parse_csv,
                                             convert_options=convert).schema
                return schema
        else:
            read_json, parse_json = settings.json_options(None, True)

            def infer(data: bytes) -> pa.Schema:
                return pa_json.open_json(_owned(data), read_options=read_json, parse_options=parse_json).schema
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
                return pa_csv.read_csv(_owned(header + chunk), read_options=read, parse_options=parse_csv,
                                       convert_options=convert)
        else:
            def parse(chunk: bytes) -> pa.Table:
                return pa_json.read_json(_owned(chunk), read_options=read_json, parse_options=parse_json)
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
        with _open_stream(storage, entry, compression) as stream:
            head = stream.read(_INFER_BYTES)
            if not head.strip():
                return FileFooter(entry, self.name, pa.schema([]), (), (), (), None,
                                  TextLayout(settings, compression, (), (), (), False))
            schema = self._infer(head, len(head) < _INFER_BYTES, display_url(storage.protocol, entry.path))
            if settings.scannable:   # the scan goes on from the head: each byte is read once
                unit_bytes = self.unit_bytes if compression is None else 1 << 62   # compressed: one unit
                units, size, quoted = scan_units(itertools.chain([head], _blocks(stream)), settings, unit_bytes)
                rows = sum(u[1] for u in units)
        names = tuple(schema.names)
        if not settings.scannable:
            rows, quoted = self._count_rows(storage, entry, compression, schema), False
        elif compression is None:
            starts = [u[0] for u in units]
            ranges = tuple(zip(starts, [*starts[1:], size], strict=True)) if starts else ()
            return FileFooter(entry, self.name, schema, tuple(u[1] for u in units), tuple(e - s for s, e in ranges),
                              tuple(range(len(units))), None,
                              TextLayout(settings, None, ranges, tuple(u[2] for u in units), names, quoted))
        return FileFooter(entry, self.name, schema, (rows,) if rows else (), (entry.size,) if rows else (),
                          (0,) if rows else (), None,
                          TextLayout(settings, compression, ((0, entry.size),), (0,), names, quoted))

    def _count_rows(self, storage: Storage, entry: FileEntry, compression: str | None, schema: pa.Schema) -> int:
        """Rows of a file whose rows the scan cannot find, by pyarrow's own streaming parse (one column)."""
        settings = self.settings
        with _open_stream(storage, entry, compression) as stream:
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
