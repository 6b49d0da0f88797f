"""Arrow IPC files (Feather v2): record batches are the units; local files are memory-mapped.

pyarrow reads a record batch by index but gives its row count only by reading it, body and all.
Planning reads the file footer (the list of record-batch blocks) and each batch's message header
instead: a few flatbuffer fields, read here directly, so no column data is read to plan.

pyarrow does not check the batches it reads from a file, so each batch is validated in full when
read (offsets within their data, UTF-8, null counts): a damaged file is a ``CorruptFileError``, never
out-of-bounds reads or a pyarrow error far from the file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import ipc

from .._core.plan_types import FileEntry
from .._storage.filesystem import Storage, display_url
from ..errors import CorruptFileError
from .base import FileFooter, MetadataFormat, sliced
from .opened import MetadataMismatch, schema_difference

_MAGIC = b"ARROW1"
_FOOTER_SCHEMA, _FOOTER_RECORD_BATCHES = 1, 3   # Footer table fields (File.fbs)
_MESSAGE_HEADER_TYPE, _MESSAGE_HEADER, _MESSAGE_BODY_LENGTH = 1, 2, 3   # Message fields (Message.fbs)
_RECORD_BATCH = 3                               # MessageHeader union: RecordBatch
_BATCH_LENGTH = 0                               # RecordBatch.length
_BLOCK = struct.Struct("<qi4xq")                # Block: offset, metaDataLength, bodyLength


class _Table:
    """A flatbuffer table: scalar fields and offsets by field index."""

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf, self.pos = buf, pos
        self._vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        self._vtable_size = struct.unpack_from("<H", buf, self._vtable)[0]

    def _field(self, index: int) -> int:
        entry = 4 + 2 * index
        if entry >= self._vtable_size:
            return 0
        return int(struct.unpack_from("<H", self.buf, self._vtable + entry)[0])

    def scalar(self, index: int, fmt: str) -> int:
        offset = self._field(index)
        return int(struct.unpack_from(fmt, self.buf, self.pos + offset)[0]) if offset else 0

    def ref(self, index: int) -> int | None:
        """Position of what an offset field points to (a table or a vector)."""
        offset = self._field(index)
        if not offset:
            return None
        at = self.pos + offset
        return at + int(struct.unpack_from("<I", self.buf, at)[0])


def _root(buf: bytes) -> _Table:
    return _Table(buf, struct.unpack_from("<I", buf, 0)[0])


def record_batch_blocks(footer: bytes) -> list[tuple[int, int, int]]:
    """(offset, metadata length, body length) of every record batch, from the footer flatbuffer."""
    vector = _root(footer).ref(_FOOTER_RECORD_BATCHES)
    if vector is None:
        return []
    count = struct.unpack_from("<I", footer, vector)[0]
    return [_BLOCK.unpack_from(footer, vector + 4 + i * _BLOCK.size) for i in range(count)]


def message_rows(metadata: bytes) -> int:
    """Rows of the record batch whose encapsulated message header is ``metadata``."""
    start = 8 if metadata[:4] == b"\xff\xff\xff\xff" else 4   # continuation marker since format 0.15
    message = _root(metadata[start:])
    if message.scalar(_MESSAGE_HEADER_TYPE, "<B") != _RECORD_BATCH:
        raise ValueError("a record-batch block of the footer does not hold a record batch")
    header = message.ref(_MESSAGE_HEADER)
    if header is None:
        raise ValueError("a record-batch message has no header")
    return _Table(message.buf, header).scalar(_BATCH_LENGTH, "<q")


def batch_sizes(source: pa.NativeFile) -> list[tuple[int, int]]:
    """(rows, body bytes) of every record batch of an IPC file, reading only metadata."""
    return [(rows, body) for rows, _, body in batch_list(source)]


def batch_list(source: pa.NativeFile) -> list[tuple[int, tuple[int, int], int]]:
    """(rows, byte range of the whole message, body bytes) of every record batch of an IPC file."""
    size = source.size()
    source.seek(size - 10)
    tail = source.read(10)
    if tail[4:] != _MAGIC:
        raise ValueError("not an Arrow IPC file (no ARROW1 magic at its end)")
    footer_length = struct.unpack("<i", tail[:4])[0]
    source.seek(size - 10 - footer_length)
    footer = source.read(footer_length)
    out = []
    for offset, metadata_length, body_length in record_batch_blocks(footer):
        source.seek(offset)
        out.append((message_rows(source.read(metadata_length)),
                    (offset, offset + metadata_length + body_length), body_length))
    return out


def _is_stream(source: pa.NativeFile) -> bool:
    """Whether ``source`` opens as an IPC stream: with the continuation marker of format 0.15 on, or
    without it (pre-1.0 writers, ``IpcWriteOptions(use_legacy_format=True)``)."""
    source.seek(0)
    try:
        ipc.open_stream(source)
    except (pa.ArrowException, OSError, ValueError):
        return False
    return True


class IpcFile:
    """An open IPC file. Local files are memory-mapped and batches point into the map (columns are
    selected afterwards: pyarrow copies a batch read with ``included_fields``); remote files read only
    the buffers of the selected columns."""

    def __init__(self, storage: Storage, footer: FileFooter) -> None:
        self._url = display_url(storage.protocol, footer.entry.path)
        self._mapped = storage.is_local
        self._source = storage.open_input(footer.entry, memory_map=True)
        self._schema = footer.schema
        self._num_batches = len(footer.unit_rows)
        self._readers: dict[tuple[str, ...], ipc.RecordBatchFileReader] = {}

    def _reader(self, columns: list[str]) -> ipc.RecordBatchFileReader:
        key = () if self._mapped else tuple(columns)
        if key not in self._readers:
            fields = (list(range(len(self._schema))) if columns == self._schema.names  # names may repeat
                      else sorted(self._schema.get_field_index(name) for name in columns))
            options = None if self._mapped else ipc.IpcReadOptions(included_fields=fields)
            reader = ipc.open_file(self._source, options=options)
            # the file's schema and number of record batches, which the reader read, are the plan's (see _opened;
            # each batch's rows are counted as it is read)
            planned = self._schema if options is None else pa.schema([self._schema.field(i) for i in fields])
            difference = schema_difference(planned, reader.schema)
            if not difference and reader.num_record_batches != self._num_batches:
                difference = (f"{self._num_batches} record batches in the plan, {reader.num_record_batches} in "
                              "the file")
            if difference:
                raise MetadataMismatch(difference)
            self._readers[key] = reader
        return self._readers[key]

    def read_units(self, units: Sequence[int], columns: list[str], batch_rows: int,
                   use_threads: bool) -> Iterator[pa.RecordBatch]:
        reader = self._reader(columns)
        for index in units:
            batch = reader.get_batch(index)
            if self._mapped and columns != self._schema.names:
                batch = batch.select(columns)
            try:   # pyarrow trusts what it reads: a flipped byte makes a negative null count or offsets past the data
                batch.validate(full=True)
            except pa.ArrowInvalid as exc:
                raise CorruptFileError(
                    f"{self._url}: Arrow IPC record batch {index} is malformed ({str(exc).splitlines()[0]}); the file "
                    "is corrupt: rewrite it, or leave it out of `path`") from None
            yield from sliced(batch, batch_rows)

    def close(self) -> None:
        self._readers.clear()
        self._source.close()


class IpcFormat(MetadataFormat):
    name = "arrow"
    label = "Arrow IPC"
    unit = "record batch"
    units = "record batches"

    def inspect(self, storage: Storage, entry: FileEntry, filter: pc.Expression | None,
                filter_columns: list[str]) -> FileFooter:
        with storage.open_input(entry) as source:
            if source.read(len(_MAGIC)) != _MAGIC and _is_stream(source):
                raise CorruptFileError(
                    f"{display_url(storage.protocol, entry.path)}: is an Arrow IPC *stream*, which has no footer to "
                    "plan from; rewrite it as an IPC file (pyarrow.ipc.new_file, or "
                    "feather.write_feather(..., version=2))")
            source.seek(0)
            reader = ipc.open_file(source)
            batches = batch_list(source)
            # planning skips a unit of no rows, so it is never read: check it has none (a flipped byte in its
            # header can hide the length field, which then reads as 0); rare in real files, so cheap
            for index in [i for i, (rows, _, _) in enumerate(batches) if rows == 0]:
                held = reader.get_batch(index).num_rows
                if held:
                    raise ValueError(f"record batch {index} announces 0 rows in its header but holds {held}")
            schema = reader.schema
        return FileFooter(entry, self.name, schema, tuple(r for r, _, _ in batches), tuple(b for _, _, b in batches),
                          tuple(range(len(batches))), tuple(span for _, span, _ in batches))

    def open(self, storage: Storage, footer: FileFooter) -> IpcFile:
        return IpcFile(storage, footer)

    def byte_ranges(self, footer: FileFooter, units: Sequence[int], columns: list[str]) -> list[tuple[int, int]]:
        """The whole record-batch messages (a remote read then takes the columns' buffers from them)."""
        return [footer.handle[unit] for unit in units] if footer.handle else []

    def baseline_batches(self, source: Any, footer: FileFooter, columns: list[str],
                         batch_size: int) -> Iterator[pa.RecordBatch]:
        """pyarrow's IPC file reader, record batch after record batch."""
        reader = ipc.open_file(source)
        for index in range(reader.num_record_batches):
            yield from sliced(reader.get_batch(index).select(columns), batch_size)


IPC = IpcFormat()
