"""Parquet: row groups are the units; statistics prune the row groups a filter excludes.

Encrypted files (Parquet modular encryption) are refused by name: with an encrypted footer
(``PARE`` magic) at planning, with a plaintext footer when an encrypted column is read.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow._parquet as _pq
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .._core.plan_types import FileEntry
from .._storage.filesystem import Storage, display_url
from ..errors import CorruptFileError
from .base import FileFooter, LocalFooters, MetadataFormat
from .opened import MetadataMismatch, file_state, remember, schema_difference, units_difference, verified

_ENCRYPTION_MARKERS = ("encrypted", "decrypt")
_FRAGMENTS = ds.ParquetFileFormat()   # one for every footer read: making one per file costs as much as a read
_LOCAL_FS = pafs.LocalFileSystem()


def _encrypted(exc: BaseException, url: str) -> CorruptFileError | None:
    """The error for an encrypted file when ``exc`` is pyarrow's refusal to read one without keys."""
    if not isinstance(exc, OSError) or not any(marker in str(exc).lower() for marker in _ENCRYPTION_MARKERS):
        return None
    return CorruptFileError(
        f"{url}: is an encrypted Parquet file (Parquet modular encryption), which arrowstream does not support "
        f"(pyarrow: {str(exc).splitlines()[0]}); decrypt it (pyarrow.parquet.read_table with "
        "decryption_properties, then write_table without encryption), or leave it out of `path`")


def plain_footer(tail: bytes, metadata: pq.FileMetaData) -> bool:
    """Whether a file's footer is its metadata alone, from the file's last 8 bytes (the footer's length,
    ``PAR1``). An encrypted file with a plaintext footer signs it: its length counts 28 bytes more than
    the metadata. pyarrow aborts the whole process when such a footer's encrypted columns are touched
    (serialized for the plan cache, their byte ranges asked for read-ahead), so planning keeps no handle
    of it: a worker reads the footer itself, and an encrypted column raises a named error there."""
    return len(tail) == 8 and tail[4:] == b"PAR1" and struct.unpack("<I", tail[:4])[0] == metadata.serialized_size


def serialized_metadata(metadata: pq.FileMetaData) -> bytes:
    """A footer as the bytes of a Parquet metadata file (Thrift, as in the file; what the plan cache keeps)."""
    sink = pa.BufferOutputStream()
    metadata.write_metadata_file(sink)
    return bytes(sink.getvalue())


def parsed_metadata(data: bytes, unit_rows: Sequence[int], unit_bytes: Sequence[int]) -> pq.FileMetaData:
    """The footer :func:`serialized_metadata` wrote, checked to describe the units it is kept for (rows and
    bytes of every row group); ValueError when ``data`` does not parse or describes other row groups."""
    try:
        metadata = pq.read_metadata(pa.BufferReader(data))
    except (OSError, pa.ArrowException) as exc:   # Thrift that does not parse is an OSError
        raise ValueError(f"a Parquet footer that does not parse ({str(exc).splitlines()[0] if str(exc) else exc!r})"
                         ) from exc
    groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
    if (tuple(g.num_rows for g in groups) != tuple(unit_rows)
            or tuple(g.total_byte_size for g in groups) != tuple(unit_bytes)):
        raise ValueError(f"a Parquet footer of {len(groups)} row groups that are not the file's {len(unit_rows)} units")
    return metadata


_TAIL_BYTES = 64 << 10   # read from a file's end at once: the footer of most files and its last 8 bytes


def _local_footer(path: str) -> tuple[os.stat_result, bytes, int] | None:
    """A local file's status, its last bytes and its footer's length (the footer is the Thrift before the
    last 8 bytes), in one pread (two for a footer larger than :data:`_TAIL_BYTES`); None where the file
    does not end as a plain Parquet file does (``PAR1``; an encrypted footer ends ``PARE``) or its footer's
    length does not fit the file: the careful read then names the file, or reads what it can."""
    fd = os.open(path, os.O_RDONLY)
    try:
        status = os.fstat(fd)
        size = status.st_size
        if size < 12:   # PAR1, a footer length, PAR1
            return None
        tail = os.pread(fd, min(size, _TAIL_BYTES), size - min(size, _TAIL_BYTES))
        if len(tail) < 8 or tail[-4:] != b"PAR1":
            return None
        length = int.from_bytes(tail[-8:-4], "little")
        if length + 12 > size:
            return None
        if length + 8 > len(tail):
            tail = os.pread(fd, length + 8, size - length - 8)
            if len(tail) != length + 8:
                return None
    finally:
        os.close(fd)
    return status, tail, length


def _parsed(tail: bytes) -> pq.FileMetaData:
    """The footer at the end of ``tail``, parsed by pyarrow's reader as it parses a file's (its checks of
    the footer's length included; an error it raises is an exception). Not ``_reconstruct_filemetadata``
    (pickle's way, ~15 µs a file less): that lets the C++ exception of a footer that does not parse
    through, which aborts the whole process (found by a flipped byte in a footer)."""
    reader = _pq.ParquetReader()
    reader.open(pa.BufferReader(tail), pre_buffer=False)
    return reader.metadata


def _schema_of(metadata: pq.FileMetaData, kinds: list[tuple[Any, dict[bytes, bytes] | None, tuple[str, str], int]],
               schemas: list[pa.Schema], path: str) -> int | None:
    """The index in ``schemas`` of the Arrow schema of a file of this footer. The Arrow schema follows from
    the Parquet schema and the key-value metadata (``ARROW:schema`` and the rest) alone: files equal in
    these (and in the writer and format version, for safety) share the one made for the first of them,
    which is read the way :meth:`ParquetFormat.inspect` reads it (a fragment's ``physical_schema``). None
    when that read finds another footer than the one given (the file changed in between)."""
    parquet_schema, key_values = metadata.schema, metadata.metadata
    writer = (metadata.created_by, metadata.format_version)
    for known_schema, known_values, known_writer, index in reversed(kinds):
        if known_writer == writer and known_values == key_values and known_schema.equals(parquet_schema):
            return int(index)
    fragment = _FRAGMENTS.make_fragment(path, filesystem=_LOCAL_FS)
    read = fragment.metadata
    if (read.metadata != key_values or (read.created_by, read.format_version) != writer
            or not read.schema.equals(parquet_schema)):
        return None
    index = _shared(schemas, fragment.physical_schema)
    kinds.append((parquet_schema, key_values, writer, index))
    return index


def _shared(schemas: list[pa.Schema], schema: pa.Schema) -> int:
    """The index of ``schema`` in ``schemas``, appended when no equal one (metadata included) is there."""
    for index, known in enumerate(schemas):
        if known.equals(schema, check_metadata=True):
            return index
    schemas.append(schema)
    return len(schemas) - 1


def _int64(values: array[int]) -> npt.NDArray[np.int64]:
    return np.frombuffer(values, dtype=np.int64) if len(values) else np.zeros(0, dtype=np.int64)


def footer_difference(footer: FileFooter, metadata: pq.FileMetaData, schema: pa.Schema) -> str:
    """How a file's footer ``metadata`` (its Arrow schema ``schema``) differs from what the plan holds of the file,
    as far as row groups, their rows and sizes, and the schema tell ("" where they agree)."""
    groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
    difference = units_difference("row group", footer.unit_rows, [g.num_rows for g in groups])
    difference = difference or schema_difference(footer.schema, schema)
    if not difference and tuple(footer.unit_bytes) != tuple(g.total_byte_size for g in groups):
        difference = "row groups of other sizes in bytes than the plan's"
    return difference


def _check_footer(footer: FileFooter) -> None:
    """A local file whose footer the plan hands the reader (its handle): the file's own footer must be that one
    (statistics, encodings and offsets included), checked once per state of the file (see ``_opened``)."""
    path = footer.entry.path
    key = (file_state(path), "footer")
    if verified(key, footer.handle):
        return
    read = _local_footer(path)
    if read is None:
        raise MetadataMismatch("its end is not that of a plain Parquet file any more")
    status, tail, _ = read
    try:
        metadata = _parsed(tail)
    except (OSError, pa.ArrowException) as exc:   # Thrift that does not parse is an OSError
        raise MetadataMismatch(f"its footer does not parse ({str(exc).splitlines()[0] if str(exc) else exc!r})"
                               ) from None
    if not metadata.equals(footer.handle):
        raise MetadataMismatch(footer_difference(footer, metadata, metadata.schema.to_arrow_schema())
                               or "other statistics, encodings or offsets of its column chunks than the plan's")
    remember((file_state(path, status), "footer"), footer.handle)


class ParquetFile:
    """An open Parquet file; reads runs of row groups. Its footer is checked to be the one the plan holds
    (see ``_opened``)."""

    def __init__(self, storage: Storage, footer: FileFooter) -> None:
        self._url = display_url(storage.protocol, footer.entry.path)
        self._local = storage.is_local
        self._footer = footer
        self._source = storage.open_input(footer.entry)
        try:
            if footer.handle is not None and self._local:   # remote reads are pinned to the planned version
                _check_footer(footer)
            self._file = pq.ParquetFile(self._source, metadata=footer.handle)
            if footer.handle is None:   # the reader read the file's footer: compared with the plan's units
                difference = footer_difference(footer, self._file.metadata, self._file.schema_arrow)
                if difference:
                    raise MetadataMismatch(difference)
        except BaseException:
            self._source.close()
            raise
        self._names = footer.schema.names

    def check_pruned(self, filter: pc.Expression) -> None:
        """The row groups the plan pruned by statistics (so never reads) are those ``filter`` prunes by the file's
        statistics now: checked where the footer read at opening is not the plan's (a plan without the handle)
        on a local file (remote reads are pinned to the planned version), once per state of the file."""
        footer = self._footer
        if footer.handle is not None or not self._local:
            return   # the whole footer was checked at opening (local), or is the planned version's (remote)
        key = (file_state(footer.entry.path), "pruned", bytes(filter.__reduce__()[1][0]), tuple(footer.kept_units))
        if verified(key):
            return
        fragment = _FRAGMENTS.make_fragment(footer.entry.path, filesystem=_LOCAL_FS)
        try:
            kept = tuple(f.row_groups[0].id for f in fragment.split_by_row_group(filter, schema=footer.schema))
        except (OSError, pa.ArrowException) as exc:
            raise MetadataMismatch(f"the filter does not apply to its statistics ({str(exc).splitlines()[0]})"
                                   ) from None
        if kept != tuple(footer.kept_units):
            raise MetadataMismatch(f"by its statistics the filter keeps row groups {list(kept)}, by the plan's "
                                   f"{list(footer.kept_units)} (a pruned row group is never read)")
        remember(key)

    def read_units(self, units: Sequence[int], columns: list[str], batch_rows: int,
                   use_threads: bool) -> Iterator[pa.RecordBatch]:
        try:
            yield from self._file.iter_batches(
                batch_size=batch_rows, row_groups=list(units),
                columns=None if columns == self._names else columns,  # all of them: names may repeat
                use_threads=use_threads)
        except OSError as exc:   # a plaintext footer with encrypted columns
            encrypted = _encrypted(exc, self._url)
            if encrypted is None:
                raise
            raise encrypted from exc

    def close(self) -> None:
        self._file.close()
        self._source.close()


class ParquetFormat(MetadataFormat):
    name = "parquet"
    label = "Parquet"
    unit = "row group"
    units = "row groups"

    def inspect(self, storage: Storage, entry: FileEntry, filter: pc.Expression | None,
                filter_columns: list[str]) -> FileFooter:
        try:
            with storage.open_input(entry) as source:
                footer = self.inspect_source(source, entry, filter, filter_columns)
                # the tail: in the block the footer was read with (remote), or one pread (local)
                tail = source.read_at(8, entry.size - 8) if entry.size >= 8 else b""
                return footer if plain_footer(tail, footer.handle) else footer.without_handle()
        except OSError as exc:   # an encrypted footer
            encrypted = _encrypted(exc, display_url(storage.protocol, entry.path))
            if encrypted is None:
                raise
            raise encrypted from exc

    def inspect_source(self, source: Any, entry: FileEntry, filter: pc.Expression | None,
                       filter_columns: list[str]) -> FileFooter:
        fragment = _FRAGMENTS.make_fragment(source)
        metadata = fragment.metadata
        schema = fragment.physical_schema
        groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
        rows = tuple(group.num_rows for group in groups)
        if sum(rows) != metadata.num_rows:
            raise ValueError(f"the footer announces {metadata.num_rows} rows but its row groups {sum(rows)} "
                             f"({', '.join(map(str, rows[:8]))}{', ...' if len(rows) > 8 else ''})")
        sizes = tuple(group.total_byte_size for group in groups)
        kept: tuple[int, ...] = tuple(range(len(rows)))
        if filter is not None and all(name in schema.names for name in filter_columns):
            kept = tuple(f.row_groups[0].id for f in fragment.split_by_row_group(filter, schema=schema))
        return FileFooter(entry, self.name, schema, rows, sizes, kept, metadata)

    def read_local(self, paths: Sequence[str], handles: bool = True) -> LocalFooters | None:
        """The footers of local files the short way: one pread of a file's tail, its Thrift footer parsed
        into ``FileMetaData`` by a reader of those bytes (no fragment, no file object), its row groups'
        rows and bytes read into columns. The Arrow schema is the ``physical_schema`` of a fragment (as
        :meth:`inspect` reads it), made once per distinct Parquet schema and key-value metadata from the
        first file that has them and shared by the files that have the same. None at the first file that
        is not a plain Parquet file (no ``PAR1`` at its end, a footer that does not fit it or does not
        parse, a signed plaintext footer, see :func:`plain_footer`: such a file keeps no handle): the
        careful read then names what is wrong, or reads what it can."""
        statuses: list[os.stat_result] = []
        rows, sizes, offsets, announced, schema_index = array("q"), array("q"), array("q", [0]), array("q"), array("i")
        schemas: list[pa.Schema] = []
        kinds: list[tuple[Any, dict[bytes, bytes] | None, tuple[str, str], int]] = []   # what makes a schema: its index
        kept: dict[int, Any] = {}
        for index, path in enumerate(paths):
            read = _local_footer(path)
            if read is None:
                return None
            status, tail, length = read
            metadata = _parsed(tail)
            if metadata.serialized_size != length:   # signed (encrypted columns), or bytes past the Thrift
                return None
            known = _schema_of(metadata, kinds, schemas, path)
            if known is None:
                return None
            for group in map(metadata.row_group, range(metadata.num_row_groups)):
                rows.append(group.num_rows)
                sizes.append(group.total_byte_size)
            offsets.append(len(rows))
            announced.append(metadata.num_rows)
            schema_index.append(known)
            statuses.append(status)
            if handles:
                kept[index] = metadata
        return LocalFooters(statuses, schemas, np.frombuffer(schema_index, dtype=np.int32) if schema_index
                            else np.zeros(0, np.int32), _int64(offsets), _int64(rows), _int64(sizes),
                            _int64(announced), kept)

    def open(self, storage: Storage, footer: FileFooter) -> ParquetFile:
        return ParquetFile(storage, footer)

    def byte_ranges(self, footer: FileFooter, units: Sequence[int], columns: list[str]) -> list[tuple[int, int]]:
        """The column chunks of ``columns`` in the row groups ``units``."""
        metadata = footer.handle
        if metadata is None:
            return []
        wanted = set(columns)
        ranges = []
        for unit in units:
            group = metadata.row_group(unit)
            for index in range(group.num_columns):
                chunk = group.column(index)
                if chunk.path_in_schema.split(".")[0] not in wanted:
                    continue
                start = chunk.data_page_offset
                if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
                    start = chunk.dictionary_page_offset
                ranges.append((start, start + chunk.total_compressed_size))
        return ranges

    def baseline_batches(self, source: Any, footer: FileFooter, columns: list[str],
                         batch_size: int) -> Iterator[pa.RecordBatch]:
        """pyarrow's ``ParquetFile.iter_batches``."""
        yield from pq.ParquetFile(source).iter_batches(batch_size=batch_size, columns=columns)


PARQUET = ParquetFormat()
