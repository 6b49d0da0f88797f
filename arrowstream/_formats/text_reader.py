"""Reading a CSV or JSON Lines file's units: byte ranges of an uncompressed file, or the whole file as a
stream (compressed, or rows the scan cannot find), each parsed with the planned names and types."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from .._core.plan_types import FileEntry
from .._storage.filesystem import Storage, display_url
from ..errors import MalformedRowError
from .base import FileFooter, sliced
from .opened import MetadataMismatch
from .rowscan import RowScanner
from .text_parse import check_utf8, parse_rows, parse_unit
from .text_settings import TextLayout

BLOCK_BYTES = 8 << 20      # bytes read at a time by scans and streams


def open_stream(storage: Storage, entry: FileEntry, compression: str | None) -> pa.NativeFile:
    """The file's bytes from its start, decompressed when ``compression`` names a codec."""
    raw = storage.open_input(entry)
    return pa.CompressedInputStream(raw, compression) if compression else raw


def read_blocks(source: pa.NativeFile, size: int = BLOCK_BYTES) -> Iterator[bytes]:
    """The rest of ``source``, ``size`` bytes at a time."""
    while True:
        block = source.read(size)
        if not block:
            return
        yield block


def read_blocks_then_end(source: pa.NativeFile) -> Iterator[bytes | None]:
    """:func:`read_blocks`, then ``None`` for the end."""
    yield from read_blocks(source)
    yield None


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
        layout, schema = self._layout, self._footer.schema

        def parse(chunk: bytes) -> pa.Table:
            return parse_rows(chunk, layout.settings, layout.names, schema, include, use_threads, layout.quoted_newlines)

        return parse_unit(parse, data, expected, layout.settings, schema, include, self._url, first_line, byte_start)

    def _unit_data(self, unit: int) -> bytes:
        start, end = self._layout.ranges[unit]
        if self._source is None:
            self._source = self._storage.open_input(self._footer.entry)
        self._source.seek(start)
        return self._source.read(end - start)  # type: ignore[no-any-return]

    def _stream_units(self, include: list[str], use_threads: bool) -> Iterator[pa.Table]:
        """A compressed (or unscannable) file, read as a stream by pyarrow's own streaming reader; when a row
        does not parse, again in stretches of whole rows (to name or skip it) after the rows handed out."""
        layout = self._layout
        done = 0
        try:
            with open_stream(self._storage, self._footer.entry, layout.compression) as stream:
                for table in self._parse_stream(stream, include, use_threads):
                    done += table.num_rows
                    yield table
            if done == self._footer.unit_rows[0] or not layout.scanned:
                return
        except pa.ArrowInvalid:
            if not layout.scanned:
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
        with open_stream(self._storage, self._footer.entry, layout.compression) as stream:
            scanner = RowScanner(settings.quote, settings.skip_empty)
            skip, buffer, buffer_at = settings.leading_rows, b"", 0
            data_at: int | None = None if skip else 0   # where the data rows not yet parsed begin
            data_line = counted = rows = 0
            for block in read_blocks_then_end(stream):
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
                if counted and (block is None or end - data_at >= BLOCK_BYTES):
                    chunk = buffer[data_at - buffer_at:end - buffer_at]
                    yield self._parse(chunk, counted, include, use_threads, data_line, data_at)
                    rows += counted
                    data_line += chunk.count(b"\n")
                    counted = 0
                    buffer, buffer_at, data_at = buffer[end - buffer_at:], end, end
            if rows != self._footer.unit_rows[0]:
                raise MetadataMismatch(
                    f"it holds {rows} rows, {self._footer.unit_rows[0]} in the plan", fallback=MalformedRowError(
                        f"{self._url}: holds {rows} rows now but held {self._footer.unit_rows[0]} when the dataset "
                        "was planned; the file changed since: rebuild the dataset"))

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
        if self._layout.compression is not None or not self._layout.scanned:
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
