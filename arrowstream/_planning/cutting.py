"""Cutting a plan into splits: the plan's splits from the footers' columns, and the cuts of units for
idle slots by each planning version (:data:`REFINERS`).

A split is a contiguous range of rows of one file that never cuts a unit (Parquet row group, ORC
stripe, IPC record batch) unless the plan has fewer splits than slots: then single units are cut into
row ranges, so no worker idles. Deterministic, no I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .._core.plan_types import PLANNING_VERSIONS, Split, SplitTable
from .._formats.footers import FooterTable, as_table

if TYPE_CHECKING:
    from .._formats import FileFooter


def base_splits(footers: Sequence[FileFooter] | FooterTable, split_bytes: int | None) -> SplitTable:
    """The plan's splits: each kept unit with rows, or with ``split_bytes`` runs of neighbouring kept units
    whose bytes fit it, file by file. From the footers' columns: no object per unit."""
    table = as_table(footers)
    counts = np.diff(table.kept_offsets)
    file_index = np.repeat(np.arange(len(table), dtype=np.int64), counts)
    unit = table.kept_units
    rows = table.unit_rows[table.unit_offsets[file_index] + unit]
    size = table.unit_bytes[table.unit_offsets[file_index] + unit]
    has_rows = rows != 0   # a unit of no rows is never read
    file_index, unit, rows, size = file_index[has_rows], unit[has_rows], rows[has_rows], size[has_rows]
    if split_bytes is None:
        return SplitTable(file_index, unit, unit + 1, np.zeros_like(unit), rows, size)
    return _joined_runs(file_index, unit, rows, size, split_bytes)


def _joined_runs(file_index: npt.NDArray[np.int64], unit: npt.NDArray[np.int64], rows: npt.NDArray[np.int64],
                 size: npt.NDArray[np.int64], split_bytes: int) -> SplitTable:
    """Units (with rows, in file order) joined into runs of neighbours of one file while their bytes fit
    ``split_bytes``: one pass over plain ints (the greedy join is sequential by nature)."""
    starts: list[int] = []    # the position of each run's first unit
    run_bytes, last_file, last_unit = 0, -1, -2
    for position, (f, u, b) in enumerate(zip(file_index.tolist(), unit.tolist(), size.tolist(), strict=True)):
        if f == last_file and u == last_unit + 1 and run_bytes + b <= split_bytes:
            run_bytes += b
        else:
            starts.append(position)
            run_bytes = b
        last_file, last_unit = f, u
    first = np.asarray(starts, dtype=np.int64)
    if not len(first):
        return SplitTable(first, first, first, first, first, first)
    last = np.append(first[1:], len(unit)) - 1
    return SplitTable(file_index[first], unit[first], unit[last] + 1, np.zeros_like(first),
                      np.add.reduceat(rows, first), np.add.reduceat(size, first))


def _single_units(split: Split, footer: FileFooter) -> list[Split]:
    if split.unit_stop - split.unit_start == 1:
        return [split]
    return [Split(split.file_index, rg, rg + 1, 0, footer.unit_rows[rg], footer.unit_bytes[rg])
            for rg in range(split.unit_start, split.unit_stop)]


def _row_ranges(split: Split, sizes: Sequence[int]) -> list[Split]:
    """``split`` cut into consecutive row ranges of ``sizes`` rows (summing to its rows), bytes pro rata."""
    out, start = [], split.row_start
    for rows in sizes:
        out.append(Split(split.file_index, split.unit_start, split.unit_stop, start, rows,
                         split.num_bytes * rows // max(split.num_rows, 1)))
        start += rows
    return out


def _units_or_none(splits: Sequence[Split], num_slots: int, footers: Sequence[FileFooter]) -> list[Split] | None:
    """The splits, or their single units, when there are enough of them for ``num_slots``; None: units must be cut."""
    if len(splits) >= num_slots:
        return list(splits)
    singles = [s for split in splits for s in _single_units(split, footers[split.file_index])]
    return singles if len(singles) >= num_slots else None


def refine_splits_v1(splits: Sequence[Split], num_slots: int, footers: Sequence[FileFooter]) -> list[Split]:
    """Planning version 1 (states of version 5 and before): units cut into ranges of about
    ``total_rows // num_slots`` rows, each unit on its own; the remainder ranges left slots uneven."""
    units = _units_or_none(splits, num_slots, footers)
    if units is not None:
        return units
    target = max(sum(s.num_rows for s in splits) // num_slots, 1)
    out = []
    for unit in (s for split in splits for s in _single_units(split, footers[split.file_index])):
        pieces = -(-unit.num_rows // target)
        base, extra = divmod(unit.num_rows, pieces)
        out += _row_ranges(unit, [base + (1 if k < extra else 0) for k in range(pieces)])
    return out


def _balanced_cuts(unit_rows: Sequence[int], num_slots: int) -> list[list[int]]:
    """The row counts each unit is cut into, in row order, so that LPT gives every slot
    ``total // num_slots`` or one more row.

    The cut *is* an LPT run: each piece goes to the least-loaded slot (ties: the lowest) and takes
    the rest of the unit with the most rows left (ties: the first), up to what fills that slot (the
    first ``total % num_slots`` slots to fill may take one row more). Pieces come out in
    non-increasing size (the most rows left only shrinks, the room of the least-loaded slot too), so
    ``assign_lpt``, which takes pieces heaviest first, replays this run whatever the epoch's order
    among equal pieces, and lands on the same loads. Each piece ends a unit or fills a slot: at most
    ``len(unit_rows) + num_slots`` pieces.
    """
    level, extra = divmod(sum(unit_rows), num_slots)
    loads = [(0, slot) for slot in range(num_slots)]
    rests = [(-rows, index) for index, rows in enumerate(unit_rows) if rows > 0]
    heapq.heapify(rests)
    cuts: list[list[int]] = [[] for _ in unit_rows]
    while rests:
        load, slot = heapq.heappop(loads)
        neg_rest, index = heapq.heappop(rests)
        piece = min(-neg_rest, level + (1 if extra else 0) - load)
        assert piece > 0, "a slot below its share is always left while rows are"
        cuts[index].append(piece)
        if load + piece == level + 1:
            extra -= 1
        heapq.heappush(loads, (load + piece, slot))
        if piece < -neg_rest:
            heapq.heappush(rests, (neg_rest + piece, index))
    return cuts


def refine_splits(splits: Sequence[Split], num_slots: int, footers: Sequence[FileFooter]) -> list[Split]:
    """Make at least ``num_slots`` splits when the rows allow, so that no worker idles (planning version 2).

    First whole row groups come apart; if that is not enough, row groups are cut into row ranges
    (each inside one unit) so that after LPT assignment every slot has ``total_rows // num_slots``
    rows or one more (see :func:`_balanced_cuts`). Pure and deterministic.
    """
    units = _units_or_none(splits, num_slots, footers)
    if units is not None:
        return units
    singles = [s for split in splits for s in _single_units(split, footers[split.file_index])]
    cuts = _balanced_cuts([s.num_rows for s in singles], num_slots)
    return [piece for unit, sizes in zip(singles, cuts) for piece in _row_ranges(unit, sizes)]


REFINERS: dict[int, Callable[[Sequence[Split], int, Sequence[FileFooter]], list[Split]]] = {
    1: refine_splits_v1,
    2: refine_splits,
}
assert tuple(REFINERS) == PLANNING_VERSIONS
