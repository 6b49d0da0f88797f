"""Parquet: row groups are the units; statistics prune the row groups a filter excludes."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from .._discovery import FileEntry
from .._storage import Storage
from ._base import FileFooter


class ParquetFile:
    """An open Parquet file; reads runs of row groups."""

    def __init__(self, storage: Storage, footer: FileFooter) -> None:
        self._source = storage.open_input(footer.entry)
        self._file = pq.ParquetFile(self._source, metadata=footer.handle)

    def read_units(self, units: Sequence[int], columns: list[str], batch_rows: int,
                   use_threads: bool) -> Iterator[pa.RecordBatch]:
        batches: Iterator[pa.RecordBatch] = self._file.iter_batches(
            batch_size=batch_rows, row_groups=list(units), columns=columns, use_threads=use_threads)
        return batches

    def close(self) -> None:
        self._file.close()
        self._source.close()


class ParquetFormat:
    name = "parquet"
    label = "Parquet"
    unit = "row group"

    def inspect(self, storage: Storage, entry: FileEntry, filter: pc.Expression | None,
                filter_columns: list[str]) -> FileFooter:
        with storage.open_input(entry) as source:
            return self.inspect_source(source, entry, filter, filter_columns)

    def inspect_source(self, source: Any, entry: FileEntry, filter: pc.Expression | None,
                       filter_columns: list[str]) -> FileFooter:
        fragment = ds.ParquetFileFormat().make_fragment(source)
        metadata = fragment.metadata
        schema = fragment.physical_schema
        rows = tuple(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
        if sum(rows) != metadata.num_rows:
            raise ValueError(f"the footer announces {metadata.num_rows} rows but its row groups {sum(rows)} "
                             f"({', '.join(map(str, rows[:8]))}{', ...' if len(rows) > 8 else ''})")
        sizes = tuple(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
        kept: tuple[int, ...] = tuple(range(len(rows)))
        if filter is not None and all(name in schema.names for name in filter_columns):
            kept = tuple(f.row_groups[0].id for f in fragment.split_by_row_group(filter, schema=schema))
        return FileFooter(entry, self.name, schema, rows, sizes, kept, metadata)

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


PARQUET = ParquetFormat()
