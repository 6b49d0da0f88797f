"""The value types of a plan that the pure layers (order, interleave, stream, elastic) share.

Pure: no I/O, no torch, no fsspec (``tests/test_layers.py`` checks it). :mod:`arrowstream._planning`
builds these from the files' metadata and re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass

PLANNING_VERSION = 2
"""How splits are cut for a number of slots (``arrowstream._planning.REFINERS``): recorded in every worker
state (``options.planning``), so that a checkpoint keeps the layout it was taken in. 1: row groups cut into
ranges of about ``rows // slots`` (state versions up to 5); 2: cut so that every slot has ``rows // slots``
rows or one more."""
PLANNING_VERSIONS = (1, 2)


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
