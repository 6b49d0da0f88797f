"""ORC: stripes are the units.

pyarrow reads a stripe by index but does not say how many rows each stripe holds, so the stripe
list comes from the file tail ORC keeps (``FileTail`` protobuf: the footer's ``StripeInformation``
entries, already decompressed by the ORC library). A dozen lines of protobuf decoding read it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import orc

from .._core.plan_types import FileEntry
from .._storage.filesystem import Storage
from .base import FileFooter, MetadataFormat, sliced
from .opened import MetadataMismatch, schema_difference

# field numbers in orc_proto.proto
_TAIL_FOOTER = 2          # FileTail.footer
_FOOTER_STRIPES = 3       # Footer.stripes
_STRIPE_OFFSET, _STRIPE_INDEX_LENGTH, _STRIPE_DATA_LENGTH, _STRIPE_FOOTER_LENGTH, _STRIPE_ROWS = 1, 2, 3, 4, 5


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def proto_fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message: ints for varints and fixed, bytes for the rest."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            yield number, data[pos:pos + length]
            pos += length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            yield number, int.from_bytes(data[pos:pos + width], "little")
            pos += width
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def stripe_sizes(tail: bytes) -> list[tuple[int, int]]:
    """(rows, bytes on disk) of every stripe, from an ORC ``serialized_file_tail``."""
    return [(rows, size) for rows, _, size in stripe_list(tail)]


def stripe_list(tail: bytes) -> list[tuple[int, int, int]]:
    """(rows, offset, bytes on disk) of every stripe, from an ORC ``serialized_file_tail``."""
    footer = next((v for n, v in proto_fields(tail) if n == _TAIL_FOOTER), b"")
    assert isinstance(footer, bytes)
    stripes = []
    for number, value in proto_fields(footer):
        if number == _FOOTER_STRIPES and isinstance(value, bytes):
            info = {n: v for n, v in proto_fields(value) if isinstance(v, int)}
            size = sum(info.get(n, 0) for n in (_STRIPE_INDEX_LENGTH, _STRIPE_DATA_LENGTH, _STRIPE_FOOTER_LENGTH))
            stripes.append((info.get(_STRIPE_ROWS, 0), info.get(_STRIPE_OFFSET, 0), size))
    return stripes


class OrcFile:
    """An open ORC file; reads stripe after stripe (one stripe in memory at a time). Its schema and number of
    stripes, which the reader read, are checked to be the plan's (see ``_opened``); each stripe's rows are
    counted as it is read."""

    def __init__(self, storage: Storage, footer: FileFooter) -> None:
        self._source = storage.open_input(footer.entry)
        try:
            self._file = orc.ORCFile(self._source)
            difference = schema_difference(footer.schema, self._file.schema)
            if not difference and self._file.nstripes != len(footer.unit_rows):
                difference = f"{len(footer.unit_rows)} stripes in the plan, {self._file.nstripes} in the file"
            if difference:
                raise MetadataMismatch(difference)
        except BaseException:
            self._source.close()
            raise
        self._names = footer.schema.names

    def read_units(self, units: Sequence[int], columns: list[str], batch_rows: int,
                   use_threads: bool) -> Iterator[pa.RecordBatch]:
        for stripe in units:
            # all columns by position: selecting by name would read a repeated name's first column twice
            selected = None if columns == self._names else columns
            yield from sliced(self._file.read_stripe(stripe, columns=selected), batch_rows)

    def close(self) -> None:
        self._source.close()


class OrcFormat(MetadataFormat):
    name = "orc"
    label = "ORC"
    unit = "stripe"
    units = "stripes"

    def inspect(self, storage: Storage, entry: FileEntry, filter: pc.Expression | None,
                filter_columns: list[str]) -> FileFooter:
        with storage.open_input(entry) as source:
            reader = orc.ORCFile(source)
            stripes = stripe_list(reader.reader.serialized_file_tail())
            if sum(rows for rows, _, _ in stripes) != reader.nrows or len(stripes) != reader.nstripes:
                raise ValueError(f"the stripe list of the file tail ({len(stripes)} stripes) disagrees with the "
                                 f"footer ({reader.nstripes} stripes, {reader.nrows} rows)")
            rows = tuple(r for r, _, _ in stripes)
            return FileFooter(entry, self.name, reader.schema, rows, tuple(b for _, _, b in stripes),
                              tuple(range(len(stripes))), tuple((o, o + b) for _, o, b in stripes))

    def open(self, storage: Storage, footer: FileFooter) -> OrcFile:
        return OrcFile(storage, footer)

    def byte_ranges(self, footer: FileFooter, units: Sequence[int], columns: list[str]) -> list[tuple[int, int]]:
        """The whole stripes (their index, data and footer; the reader picks the columns' streams)."""
        return [footer.handle[unit] for unit in units] if footer.handle else []

    def baseline_batches(self, source: Any, footer: FileFooter, columns: list[str],
                         batch_size: int) -> Iterator[pa.RecordBatch]:
        """pyarrow's ORC reader, stripe after stripe."""
        orc_file = orc.ORCFile(source)
        for stripe in range(orc_file.nstripes):   # a stripe is read as one RecordBatch
            yield from sliced(orc_file.read_stripe(stripe, columns=columns), batch_size)


ORC = OrcFormat()
