"""Row provenance (``with_row_ids=True``): the file and the row inside it of every row handed out.

Two columns are added as the rows are decoded (:class:`~arrowstream._worker.reader.SplitReader`), so that every
later stage (filter, interleave, shuffle windows, mixing, conversion, ``transform``) carries them like any
other column and no stage needs to know of them:

* ``_file`` (int32): the row's file, an index into ``dataset.files`` (``mixture.files``);
* ``_row`` (int64): the row's number inside that file, from 0, over all of the file's rows before any
  filter (and, for an Iceberg data file, before its positional deletes): its physical position, so
  ``pyarrow`` finds it again (``table.slice(row, 1)``).

Pure: numpy and pyarrow, no I/O (``tests/test_layers.py``). The formats say how a row a reader yields
maps to a physical position (``UnitFormat.physical_rows``: the identity but for Iceberg's deletes).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from ..errors import InvalidArgumentError

FILE_COLUMN = "_file"
ROW_COLUMN = "_row"
ROW_ID_FIELDS = (pa.field(FILE_COLUMN, pa.int32(), nullable=False), pa.field(ROW_COLUMN, pa.int64(), nullable=False))

PhysicalRows = Callable[[int, npt.NDArray[np.int64]], npt.NDArray[np.int64]]
"""``(file_index, rows)`` -> physical positions of the rows a reader yields (numbered from 0 in the file)."""


def with_row_id_fields(schema: pa.Schema) -> pa.Schema:
    """``schema`` with ``_file`` and ``_row`` appended: the batches' schema with row ids on."""
    return pa.schema([*schema, *ROW_ID_FIELDS], metadata=schema.metadata)


def check_row_id_names(schema: pa.Schema, where: str = "the files") -> None:
    """Refuse output columns that the row ids would shadow, naming them."""
    clash = [name for name in (FILE_COLUMN, ROW_COLUMN) if name in schema.names]
    if clash:
        raise InvalidArgumentError(
            f"with_row_ids=True: {where} already have a column {clash[0]!r}, which the row ids would replace; "
            f"leave it out with columns=[...] (or rename it in the data), or pass with_row_ids=False")


def unit_first_rows(unit_rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The running count of rows before each unit of a plan's unit table (one more entry at the end)."""
    return np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(unit_rows, dtype=np.int64)])


class RowIds:
    """Adds ``_file`` and ``_row`` to the pieces of one plan's files.

    Args:
        unit_offsets: Where each file's units start in the plan's unit table (``FooterTable.unit_offsets``).
        unit_rows: The rows each unit yields (``FooterTable.unit_rows``).
        file_base: Added to every file index (a mixture's source: the files of the sources before it).
        physical: Maps the rows a reader yields of a file to their physical positions; None where the two
            are the same for every file.

    Example:
        >>> import numpy as np, pyarrow as pa
        >>> ids = RowIds(np.array([0, 2, 3]), np.array([5, 5, 7]), file_base=10)
        >>> batch = ids.attach(pa.record_batch({"x": [1, 2]}), 1, np.array([3, 4]))
        >>> batch.column("_file").to_pylist(), batch.column("_row").to_pylist()
        ([11, 11], [3, 4])
    """

    def __init__(self, unit_offsets: npt.NDArray[np.int64], unit_rows: npt.NDArray[np.int64], file_base: int = 0,
                 physical: PhysicalRows | None = None) -> None:
        self._unit_offsets = unit_offsets
        self._first_rows = unit_first_rows(unit_rows)
        self._file_base = file_base
        self._physical = physical

    def split_first_row(self, file_index: int, unit_start: int, row_start: int) -> int:
        """The number (among the rows its reader yields) of row ``row_start`` of a split's units from
        ``unit_start`` on, counted from the first row of file ``file_index``."""
        first_unit = int(self._unit_offsets[file_index])
        return int(self._first_rows[first_unit + unit_start] - self._first_rows[first_unit]) + row_start

    def attach(self, batch: pa.RecordBatch, file_index: int, rows: npt.NDArray[np.int64]) -> pa.RecordBatch:
        """``batch`` with ``_file`` and ``_row`` appended; ``rows`` holds each of its rows' numbers among the
        rows the reader yields of the file (before any filter)."""
        if self._physical is not None:
            rows = self._physical(file_index, rows)
        files = np.full(batch.num_rows, self._file_base + file_index, dtype=np.int32)
        # appended in place of rebuilding from batch.columns: a column pyarrow has no Python class for
        # (month or day-time intervals) cannot be handed to Python, only passed along
        file_field, row_field = ROW_ID_FIELDS
        return batch.append_column(file_field, pa.array(files)).append_column(row_field, pa.array(rows, pa.int64()))


def physical_after_deletes(deleted: npt.NDArray[np.int64] | None,
                           rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Physical positions of the rows a reader yields (numbered from 0) once the sorted, unique ``deleted``
    positions are taken out: the ``k``-th row left is ``k`` plus the deleted positions before it.

    Example:
        >>> physical_after_deletes(np.array([1, 2, 5]), np.array([0, 1, 2, 3])).tolist()
        [0, 3, 4, 6]
    """
    if deleted is None or not len(deleted):
        return rows
    # deleted[j] - j: how many kept rows come before the j-th deleted one
    kept_before = deleted - np.arange(len(deleted), dtype=np.int64)
    return rows + np.searchsorted(kept_before, rows, side="right")
