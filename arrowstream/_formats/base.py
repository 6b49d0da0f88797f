"""The reader contract: what a file format tells planning, and how a worker reads from it.

A format cuts each file into *units* (Parquet row groups, ORC stripes, IPC record batches) whose
row and byte counts come from metadata alone. Splits are runs of units; a worker reads a run of
units of one file as consecutive Arrow batches, projecting columns. Everything else (row offsets,
filters, shuffles, resume) is format-free and lives above this contract.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Self

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .._core.plan_types import FileEntry
from .._storage.filesystem import Storage
from ..errors import CorruptFileError

if TYPE_CHECKING:
    from .text_settings import TextSettings


@dataclass(frozen=True)
class FileFooter:
    """What planning learned from one file's metadata.

    ``unit_rows`` and ``unit_bytes`` count the rows a reader yields from each unit (after any
    deleted rows are taken out) and its size; ``kept_units`` are the units a filter may match.
    ``handle`` is format data that saves a worker from reading the metadata again (a Parquet
    ``FileMetaData``); ``extra`` is what a wrapping format needs (Iceberg: deletes, projection).
    """

    entry: FileEntry
    format: str
    schema: pa.Schema
    unit_rows: tuple[int, ...]
    unit_bytes: tuple[int, ...]
    kept_units: tuple[int, ...]
    handle: Any = field(default=None, compare=False)
    extra: Any = field(default=None, compare=False)

    def without_handle(self) -> FileFooter:
        return FileFooter(self.entry, self.format, self.schema, self.unit_rows, self.unit_bytes,
                          self.kept_units, None, self.extra)

    @property
    def handle_bytes(self) -> int:
        """Bytes the handle adds to a pickled plan."""
        if isinstance(self.handle, tuple):  # byte ranges of units
            return 16 * len(self.handle)
        size = getattr(self.handle, "serialized_size", 0)
        return int(size) if isinstance(size, int) else 0


class UnitFile(Protocol):
    """One open file in a worker, checked when opened to be the file the plan describes (see ``_opened``). A file
    of a format that prunes units by statistics also has ``check_pruned(filter)``: the units the plan pruned
    (never read) are those ``filter`` prunes by the file's statistics (``_worker.reader.SplitReader`` calls it)."""

    def read_units(self, units: Sequence[int], columns: list[str], batch_rows: int,
                   use_threads: bool) -> Iterator[pa.RecordBatch]:
        """The rows of ``units`` (ascending, consecutive), in order, in batches of at most
        ``batch_rows`` rows, with (at least) ``columns``: exactly the rows ``unit_rows`` announced
        for them (the reader counts them and raises ``CorruptFileError`` naming the unit otherwise)."""
        ...

    def close(self) -> None:
        ...


class UnitFormat(Protocol):
    """What a worker needs of a format: a planned file opened, its units read.

    Every format is one, Iceberg's data files included (planned from the table's scan tasks, not
    file by file); readers find it by the name in a footer (:func:`~arrowstream._formats.unit_format`).
    """

    name: str
    label: str  # how errors name it: "Parquet", "ORC", ...
    unit: str   # how errors name a unit: "row group", "stripe", ...
    units: str  # how a report counts them: "row groups", "stripes", ...
    # a bool column the format's batches may carry, false for a row it could not parse and skipped
    # (text with bad_rows="skip"): the reader drops those rows like filtered ones and counts them; None: never
    row_ok_column: str | None

    def open(self, storage: Storage, footer: FileFooter) -> UnitFile:
        """Open a planned file for reading its units."""
        ...

    def byte_ranges(self, footer: FileFooter, units: Sequence[int], columns: list[str]) -> list[tuple[int, int]]:
        """The ``[start, end)`` byte ranges reading ``units`` with ``columns`` needs, from the planned
        metadata (for read-ahead); empty when the metadata did not travel with the plan."""
        ...

    def physical_rows(self, footer: FileFooter, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The positions in the file (``with_row_ids``' ``_row``) of the rows its reader yields, numbered from 0:
        ``rows`` itself where the reader yields every row the file holds (Iceberg: its deleted rows it does not)."""
        ...


class FileFormat(UnitFormat, Protocol):
    """A format planned file by file from each file's own metadata: metadata in the main process, units
    in the workers."""

    def configured(self, parse_options: TextSettings | None, split_bytes: int | None) -> FileFormat:
        """This format as the dataset's options set it up for planning (text: its parse options and unit
        size travel in every footer); the format itself when it has nothing to set."""
        ...

    def inspect(self, storage: Storage, entry: FileEntry, filter: pc.Expression | None,
                filter_columns: list[str]) -> FileFooter:
        """Read the metadata of one file; prune units that ``filter`` excludes when it can."""
        ...

    def reconcile(self, footers: list[FileFooter], protocol: str) -> list[FileFooter]:
        """The footers of all files, made to read with one schema where the format infers types file by
        file (text); unchanged where each file's metadata states its types."""
        ...

    def baseline_batches(self, source: Any, footer: FileFooter, columns: list[str],
                         batch_size: int) -> Iterator[pa.RecordBatch]:
        """The rows of a whole file through pyarrow's own reader for the format, in batches of at most
        ``batch_size`` rows: the raw loop ``arrowstream bench`` compares the loader with (no units, no
        checks). ``source`` is a local path or an open binary file."""
        ...


class MetadataFormat:
    """What a format whose files state their schema and counts in metadata (Parquet, ORC, Arrow IPC)
    answers to the parts of :class:`FileFormat` that only text needs."""

    row_ok_column: str | None = None

    def physical_rows(self, footer: FileFooter, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return rows

    def configured(self, parse_options: TextSettings | None, split_bytes: int | None) -> Self:
        return self

    def reconcile(self, footers: list[FileFooter], protocol: str) -> list[FileFooter]:
        return footers

    def read_local(self, paths: Sequence[str], handles: bool = True) -> LocalFooters | None:
        """The footers of local files, in order, read the short way (no filter, no retries, no wrapping:
        planning checks what it returns and reads the files the careful way on any doubt); with their
        handles when ``handles`` (else none: the plan keeps none); None: the format has no short way, or
        some file is not one it reads the short way."""
        return None


@dataclass(frozen=True)
class LocalFooters:
    """What :meth:`MetadataFormat.read_local` read of a run of local files, as columns (no object per
    file or unit): each file's status when it was read, its schema (an index into ``schemas``, equal
    schemas one object), its units' rows and bytes (file ``i``'s are ``unit_offsets[i]:unit_offsets[i + 1]``),
    the rows it announces in all, and the handles kept, by file index."""

    statuses: list[os.stat_result]
    schemas: list[pa.Schema]
    schema_index: npt.NDArray[np.int32]
    unit_offsets: npt.NDArray[np.int64]
    unit_rows: npt.NDArray[np.int64]
    unit_bytes: npt.NDArray[np.int64]
    num_rows: npt.NDArray[np.int64]
    handles: dict[int, Any]

    def __len__(self) -> int:
        return len(self.statuses)


def name_units(unit: str, units: Sequence[int]) -> str:
    """How an error names a run of units: ``row group 3``, ``stripes 2-4``."""
    if len(units) == 1:
        return f"{unit} {units[0]}"
    plural = unit + ("es" if unit.endswith(("ch", "sh", "s", "x")) else "s")
    return f"{plural} {units[0]}-{units[-1]}"


def check_counts(footer: FileFooter, url: str, label: str, unit: str) -> None:
    """Refuse metadata whose row or byte counts cannot be (negative, or lists that disagree), before
    any plan is built on them: a negative count would make every total and every cursor wrong."""
    for index, (rows, size) in enumerate(zip(footer.unit_rows, footer.unit_bytes, strict=False)):
        if rows < 0 or size < 0:
            raise CorruptFileError(
                f"{url}: the {label} metadata announces {rows} rows in {size} bytes for {unit} {index}, a count "
                "that cannot be negative: the file is corrupt; rewrite it, or leave it out of `path`")
    if len(footer.unit_rows) != len(footer.unit_bytes) or any(
            not 0 <= kept < len(footer.unit_rows) for kept in footer.kept_units):
        raise CorruptFileError(
            f"{url}: the {label} metadata lists {len(footer.unit_rows)} row counts and {len(footer.unit_bytes)} "
            f"sizes of {unit}s: the file is corrupt; rewrite it, or leave it out of `path`")


def sliced(batch: pa.RecordBatch, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """``batch`` in zero-copy slices of at most ``batch_rows`` rows."""
    for start in range(0, batch.num_rows, batch_rows):
        yield batch.slice(start, batch_rows)
