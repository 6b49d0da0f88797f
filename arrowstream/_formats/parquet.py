"""Parquet: row groups are the units; statistics prune the row groups a filter excludes.

Encrypted files (Parquet modular encryption) are refused by name: with an encrypted footer
(``PARE`` magic) at planning, with a plaintext footer when an encrypted column is read.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .._discovery import FileEntry
from .._storage import Storage, display_url
from ..errors import CorruptFileError
from ._base import FileFooter, LocalFooter, MetadataFormat

_ENCRYPTION_MARKERS = ("encrypted", "decrypt")
_FRAGMENTS = ds.ParquetFileFormat()   # one for every footer read: making one per file costs as much as a read
_LOCAL_FS = pafs.LocalFileSystem()
_NO_COLUMNS = pa.schema([])   # the schema a dataset of fragments asks for: each fragment keeps its own


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


def _tail(path: str) -> bytes:
    """The last 8 bytes of a local file."""
    with open(path, "rb") as file:
        file.seek(0, 2)
        file.seek(max(file.tell() - 8, 0))
        return file.read(8)


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


class ParquetFile:
    """An open Parquet file; reads runs of row groups."""

    def __init__(self, storage: Storage, footer: FileFooter) -> None:
        self._url = display_url(storage.protocol, footer.entry.path)
        self._source = storage.open_input(footer.entry)
        self._file = pq.ParquetFile(self._source, metadata=footer.handle)
        self._names = footer.schema.names

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

    def read_local(self, paths: Sequence[str], handles: bool = True) -> list[LocalFooter]:
        """The footers of local files as pyarrow.dataset reads them: fragments of one dataset of the paths on
        pyarrow's local filesystem, made in C++ (no Python file object, ~8 µs a file less than one
        ``make_fragment`` each). A handle is kept only of a footer that is its metadata alone (one pread of
        the file's last 8 bytes: see :func:`plain_footer`)."""
        dataset = ds.FileSystemDataset.from_paths(list(paths), schema=_NO_COLUMNS, format=_FRAGMENTS,
                                                  filesystem=_LOCAL_FS)
        footers = []
        for path, fragment in zip(paths, dataset.get_fragments(), strict=True):
            if fragment.path != path:
                raise ValueError(f"pyarrow listed {fragment.path!r} for {path!r}")
            metadata = fragment.metadata
            groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
            handle = metadata if handles and plain_footer(_tail(path), metadata) else None
            footers.append(LocalFooter(fragment.physical_schema, tuple(group.num_rows for group in groups),
                                       tuple(group.total_byte_size for group in groups), metadata.num_rows, handle))
        return footers

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
