"""The value types of a plan that the pure layers (order, interleave, stream, elastic) share.

Pure: no I/O, no torch, no fsspec (``tests/test_layers.py`` checks it). :mod:`arrowstream._planning`
builds these from the files' metadata and re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Split:
    """Rows ``[row_start, row_start + num_rows)`` of the units ``[unit_start, unit_stop)`` of one file
    (row groups, stripes, record batches); ``row_start`` counts from the first row of ``unit_start``."""

    file_index: int
    unit_start: int
    unit_stop: int
    row_start: int
    num_rows: int
    num_bytes: int
