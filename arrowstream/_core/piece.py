"""What a reader hands the pure layers: output rows of one split that know their source offsets.

Pure: no I/O, no torch, no fsspec (``tests/test_layers.py`` checks it). :mod:`arrowstream._worker.reader`
makes pieces and re-exports the type.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa


@dataclass(frozen=True, slots=True)
class Piece:
    """Consecutive output rows of one split, with their source offsets inside the split."""

    batch: pa.RecordBatch
    position: int                           # index of the split in the slot's reading order
    start: int                              # source offset of the first row (no filter)
    end: int                                # source offset just past the rows this piece covers
    offsets: npt.NDArray[np.int64] | None   # source offset of each row, when a filter dropped rows

    @property
    def num_rows(self) -> int:
        return int(self.batch.num_rows)

    def offset_of(self, row: int) -> int:
        """Source offset of output row ``row`` of this piece (``row < num_rows``)."""
        return int(self.offsets[row]) if self.offsets is not None else self.start + row

    def head(self, row: int) -> Piece:
        """The first ``row`` rows (``row < num_rows``), zero-copy."""
        offsets = self.offsets[:row] if self.offsets is not None else None
        return Piece(self.batch.slice(0, row), self.position, self.start, self.offset_of(row), offsets)

    def tail(self, row: int) -> Piece:
        """The rows from ``row`` on, zero-copy."""
        offsets = self.offsets[row:] if self.offsets is not None else None
        return Piece(self.batch.slice(row), self.position, self.offset_of(row), self.end, offsets)
