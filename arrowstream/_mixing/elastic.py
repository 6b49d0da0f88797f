"""A mixture epoch re-planned for another topology from a mid-epoch checkpoint (elastic resume).

For every source, what each old (rank, worker) slot had not handed out is cut into *items*, as for a
dataset (:mod:`arrowstream._layout.elastic`): the rest of a shuffle window it stood in (read again the way the
old worker read it, its seeds, and handed out from where it stood), then the rest of the splits it had
open and the splits of its parts it had not opened. The items of a source, old slot after old slot, are
then cut into as many contiguous stretches as there are new slots, of equal rows within one: each new
slot's quota of the source for the rest of the epoch. A new slot reads its stretches as parts
(:class:`~arrowstream._mixing.stream.Part`) and cuts batches in proportion to its quotas, as in any epoch.

Pure: a function of the plans' splits, the old cursors and the options, so a checkpoint taken inside the
re-planned epoch resumes exactly with the new topology (its states keep the old cursors, ``elastic``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._core.cursor import Cursor
from .._core.fields import REMEDY, Fields, shorten
from .._core.interleave import block_size_for
from .._core.order import cut_evenly
from .._core.plan_types import Split
from .._layout.elastic import split_part, split_rest, window_end
from .._state.mixture import SourceCursor
from ..errors import StateError
from .parts import ComposedParts, ListParts, Part, Parts, SliceParts
from .quotas import PASS_LAYOUTS, SPANS, TRACKS
from .stream import MixSlot, source_seeds


@dataclass(frozen=True)
class MixElastic:
    """An epoch re-planned from the states of another topology: each old slot's place in each source
    (``None``: that worker was done with the epoch)."""

    epoch: int
    world_size: int
    num_workers: int
    cursors: tuple[dict[str, SourceCursor] | None, ...]
    pass_layout: str = SPANS   # how the old slots' epoch laid its passes out (see _mix_plan.PASS_LAYOUTS)

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "world_size": self.world_size, "num_workers": self.num_workers,
                "cursors": [None if c is None else {n: v.to_dict() for n, v in c.items()} for c in self.cursors],
                "pass_layout": self.pass_layout}

    @classmethod
    def from_dict(cls, value: Any, where: str) -> MixElastic:
        fields = Fields(value, where)
        cursors: list[dict[str, SourceCursor] | None] = []
        for index, entry in enumerate(fields.sequence("cursors")):
            if entry is None:
                cursors.append(None)
                continue
            if not isinstance(entry, dict):
                raise StateError(f"the {where}.cursors[{index}] is {shorten(entry)}, expected a dict or null; {REMEDY}")
            cursors.append({str(n): SourceCursor.from_dict(v, f"{where}.cursors[{index}].{n}") for n, v in entry.items()})
        pass_layout = fields.value.get("pass_layout", TRACKS)   # absent before mixture state version 4: tracks
        if pass_layout not in PASS_LAYOUTS:
            raise StateError(f"the {where}.pass_layout is {shorten(pass_layout)}, expected one of "
                             f"{list(PASS_LAYOUTS)}; {REMEDY}")
        parsed = cls(fields.integer("epoch"), fields.integer("world_size", 1), fields.integer("num_workers"),
                     tuple(cursors), pass_layout)
        if len(parsed.cursors) != parsed.world_size * max(parsed.num_workers, 1):
            raise StateError(f"the {where} has {len(parsed.cursors)} old slot(s) for world_size={parsed.world_size}, "
                             f"num_workers={parsed.num_workers}; {REMEDY}")
        return parsed


@dataclass(frozen=True)
class _Item:
    """Rows left by an old slot: a replay (``start`` set: the rest of its window, its old seeds) or ranges."""

    splits: tuple[Split, ...]
    rows: int
    start: Cursor | None = None
    seeds: Callable[[int], int] | None = None


@dataclass(frozen=True)
class _Tail:
    """An old slot's parts after the one it stood in, whole (spans): its rows ``[lo, hi)`` of them."""

    parts: Parts
    lo: int
    hi: int

    @property
    def rows(self) -> int:
        return self.hi - self.lo


def _left_by(parts: Parts, cursor: SourceCursor, *, batch_size: int, interleave: int, buffer_rows: int,
             whole_parts: bool) -> list[_Item | _Tail]:
    """What an old slot had not handed out of its parts of a source, from its cursor: the rest of the part it
    stood in as items, then the parts after it (``whole_parts``: as one :class:`_Tail`, else as items)."""
    items: list[_Item | _Tail] = []
    segment = cursor.segment
    if segment < len(parts) and cursor.cursor is not None:
        part, start = parts[segment], cursor.cursor
        end = start
        if buffer_rows and start.window_offset:
            size, end = window_end(part.splits, start, block_size_for(batch_size, interleave), interleave, buffer_rows)
            if size > start.window_offset:
                items.append(_Item(tuple(part.splits), size - start.window_offset, start, part.seeds))
        ranges = [split_rest(part.splits[position], offset) for position, offset in end.lanes
                  if position < len(part.splits) and offset < part.splits[position].num_rows]
        ranges += [s for s in part.splits[end.next_split_index:] if s.num_rows]
        items += [_Item((split,), split.num_rows) for split in ranges]
        segment += 1
    if whole_parts:
        lo = parts.rows_before(min(segment, len(parts)))
        if parts.rows > lo:
            items.append(_Tail(parts, lo, parts.rows))
        return items
    for part in parts[segment:]:
        items += [_Item((split,), split.num_rows) for split in part.splits if split.num_rows]
    return items


def replanned_parts(old_parts: Sequence[Parts], elastic: MixElastic, name: str, new_slots: Sequence[MixSlot], *,
                    seed: int, batch_size: int, interleave: int, buffer_rows: int) -> list[Parts]:
    """Every new slot's parts of source ``name`` for the rest of the epoch (``old_parts``: each old slot's
    parts of it in the epoch). In spans, the parts an old slot had not opened go to the new slots whole
    (:class:`~arrowstream._mixing.parts.SliceParts`: nothing walks them); in tracks (states of mixture state
    version 3 and older), as ranges of splits, as those versions did."""
    whole_parts = elastic.pass_layout == SPANS
    items: list[_Item | _Tail] = []
    for old, (parts, cursors) in enumerate(zip(old_parts, elastic.cursors, strict=True)):
        if cursors is None:
            continue
        cursor = cursors.get(name, SourceCursor(0, None, 0))
        quota = parts.rows
        left = _left_by(parts, cursor, batch_size=batch_size, interleave=interleave, buffer_rows=buffer_rows,
                        whole_parts=whole_parts)
        if sum(item.rows for item in left) != quota - cursor.taken:
            raise StateError(f"old worker {old}'s state of source {name!r} took {cursor.taken} of its {quota} row(s) "
                             f"but its cursor leaves {sum(item.rows for item in left)}: not a position its epoch "
                             f"reaches; {REMEDY}")
        items += left
    out: list[_NewParts] = [_NewParts(source_seeds(seed, name, slot)) for slot in new_slots]
    for index, slot, lo, hi in cut_evenly([item.rows for item in items], len(new_slots)):
        out[slot].place(items[index], lo, hi)
    return [new.parts() for new in out]


class _NewParts:
    """A new slot's parts of a source as they are given out: lists of parts and old slots' whole parts."""

    def __init__(self, seeds: Callable[[int, int], int]) -> None:
        self._seeds = seeds
        self._pieces: list[list[Part] | SliceParts] = []

    def place(self, item: _Item | _Tail, lo: int, hi: int) -> None:
        """Rows ``[lo, hi)`` of ``item`` after the parts so far."""
        given = sum(len(piece) for piece in self._pieces)   # a new part's index among the new slot's parts
        if isinstance(item, _Tail):
            self._pieces.append(SliceParts(item.parts, item.lo + lo, item.lo + hi, self._seeds, given))
            return
        last = self._pieces[-1] if self._pieces else None
        if not isinstance(last, list):
            last = []
            self._pieces.append(last)
        _place(last, item, lo, hi, functools.partial(self._seeds, given))

    def parts(self) -> Parts:
        pieces = [ListParts(piece) if isinstance(piece, list) else piece for piece in self._pieces]
        if len(pieces) == 1 and isinstance(pieces[0], ListParts):
            return pieces[0]
        return ComposedParts(pieces)


def _place(parts: list[Part], item: _Item, lo: int, hi: int, seeds: Callable[[int], int]) -> None:
    """Rows ``[lo, hi)`` of ``item`` at the end of a new slot's parts (ranges join the ranges before them);
    ``seeds``: a new part's (the new slot's, by part)."""
    if item.start is not None:
        assert item.seeds is not None
        start = dataclasses.replace(item.start, window_offset=item.start.window_offset + lo)
        parts.append(Part(item.splits, hi - lo, item.seeds, start))
        return
    piece = split_part(item.splits[0], lo, hi)
    if parts and parts[-1].start is None:   # ranges after ranges: one part, one stream
        last = parts[-1]
        parts[-1] = Part((*last.splits, piece), last.rows + piece.num_rows, last.seeds)
        return
    parts.append(Part((piece,), piece.num_rows, seeds))
