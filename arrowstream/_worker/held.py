"""A small source's rows, read once per process and held, for a mixture that reads it in many passes.

A mixture epoch may take a source's rows many times over (a source of 37 rows in an epoch of millions):
each pass of it is a part of its own, and reading each part from storage again decodes the same row
groups thousands of times. A :class:`HeldSource` reads a small source once, with the
:class:`~arrowstream._worker.reader.SplitReader` it is given (its checks, retries, row ids and metrics, once),
and keeps its rows as one table; a :class:`HeldReader` hands out any split of it as the same pieces, with
the same source offsets, as the reader would; :meth:`HeldSource.indices` names a split's rows in the
table, for parts read whole at once (:mod:`arrowstream._mixing.bulk`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .._core.piece import Piece
from .._core.plan_types import Split
from .._planning.plan import Plan
from .reader import SplitReader

HELD_ROWS = 1 << 16          # a source of at most this many rows ...
HELD_BYTES = 16 << 20        # ... and this many bytes in storage ...
HELD_PASSES = 4              # ... of which a slot's epoch reads parts of this many passes or more is held


def holds(plan: Plan, passes: int) -> bool:
    """Whether a mixture holds the rows of a source of ``plan`` whose parts in a slot's epoch touch ``passes``
    passes: small, read again and again (a source read once an epoch is read as it is needed: its first
    batch decodes no further than that batch needs), and no filter drops rows."""
    return (passes >= HELD_PASSES and 0 < plan.num_rows <= HELD_ROWS and plan.filter is None
            and int(plan.splits.num_bytes.sum()) <= HELD_BYTES)


class HeldSource:
    """A small plan's rows, read on first use: every unit range of its splits, in one table."""

    def __init__(self, reader: SplitReader, plan: Plan) -> None:
        self._reader, self._plan = reader, plan
        self._table: pa.Table | None = None
        self._starts: dict[tuple[int, int, int], int] = {}   # (file, first unit, end unit) -> its first row

    @property
    def table(self) -> pa.Table:
        """Every row of the source, each unit range whole (read now if not yet)."""
        if self._table is None:
            self._table = self._read()
        return self._table

    def _read(self) -> pa.Table:
        splits, batches, row = self._plan.splits, [], 0
        for index in range(len(splits)):
            split = splits[index]
            key = (split.file_index, split.unit_start, split.unit_stop)
            if key in self._starts:
                continue
            footer = self._plan.files[split.file_index]
            rows = sum(footer.unit_rows[split.unit_start:split.unit_stop])
            whole = Split(split.file_index, split.unit_start, split.unit_stop, 0, rows, split.num_bytes)
            self._starts[key] = row
            batches += [piece.batch for piece in self._reader.read(whole, index, 0)]
            row += rows
        self._reader.close()
        return pa.Table.from_batches(batches, schema=batches[0].schema).combine_chunks()

    def first_row(self, split: Split) -> int:
        """The table's row of ``split``'s first row."""
        self.table   # noqa: B018 (read on first use)
        return self._starts[(split.file_index, split.unit_start, split.unit_stop)] + split.row_start

    def indices(self, splits: tuple[Split, ...]) -> npt.NDArray[np.int64]:
        """The table's rows of ``splits``, one after another."""
        if len(splits) == 1:
            first = self.first_row(splits[0])
            return np.arange(first, first + splits[0].num_rows, dtype=np.int64)
        return np.concatenate([np.arange(self.first_row(s), self.first_row(s) + s.num_rows, dtype=np.int64)
                               for s in splits]) if splits else np.empty(0, np.int64)

    def close(self) -> None:
        self._reader.close()


class HeldReader:
    """Reads splits of a held source: slices of its table (a :class:`~arrowstream._core.interleave.PieceReader`)."""

    def __init__(self, source: HeldSource) -> None:
        self._source = source

    def read(self, split: Split, position: int, offset: int) -> Iterator[Piece]:
        """Pieces of ``split`` from source ``offset`` to its end (one slice of the held rows)."""
        if offset < split.num_rows:
            rows = self._source.table.slice(self._source.first_row(split) + offset, split.num_rows - offset)
            batches = rows.to_batches()
            batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
            yield Piece(batch, position, offset, split.num_rows, None)

    def close(self) -> None:
        pass
