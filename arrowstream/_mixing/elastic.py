"""A mixture epoch re-planned for another topology from a mid-epoch checkpoint (elastic resume).

For every source, what each old (rank, worker) slot had not handed out is cut into items as for a dataset
(:mod:`arrowstream._layout.replan`, one for both): what it left of the part it stood in from its cursor
(the rest of a shuffle window it stood in, read again with the part's seeds; the rests of its open lanes;
the splits it had not opened), then the parts it had not opened. The items of a source, old slot after old
slot, are cut into as many contiguous stretches as there are new slots, of equal rows within one: each new
slot's quota of the source for the rest of the epoch. A new slot reads its stretches as parts
(:class:`~arrowstream._mixing.stream.Part`) and cuts batches in proportion to its quotas, as in any epoch.

What is the mixture's own: an old slot's rows of a source are :class:`~arrowstream._mixing.parts.Parts`, and
in spans the parts it had not opened go on whole (a :class:`_Tail`, handed to a new slot as
:class:`~arrowstream._mixing.parts.SliceParts`: nothing walks them).

Pure: a function of the plans' splits, the old cursors and the options, so a checkpoint taken inside the
re-planned epoch resumes exactly with the new topology (its states keep the old cursors, ``elastic``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._core.cursor import Cursor
from .._core.fields import REMEDY
from .._core.interleave import block_size_for
from .._core.plan_types import Split
from .._layout.replan import Replay, cut_items, item_part, item_rows, items_left
from .._state.mixture import MixElastic, SourceCursor
from ..errors import StateError
from .parts import ComposedParts, ListParts, Part, Parts, SliceParts, replay_indices
from .quotas import SPANS
from .stream import MixSlot, source_seeds


@dataclass(frozen=True)
class _Tail:
    """An old slot's parts after the one it stood in, whole (spans): its rows ``[lo, hi)`` of them."""

    parts: Parts
    lo: int
    hi: int

    @property
    def rows(self) -> int:
        return self.hi - self.lo


_Replay = Replay[Callable[[int], int]]
"""The rest of a window an old slot stood in, seeded as it was: by its part's seeds (window -> seed)."""

_Item = _Replay | Split | _Tail
"""Rows an old slot left of a source: the rest of a window it stood in, a range, or the parts it had not
opened, whole."""


def _item_rows(item: _Item) -> int:
    return item.rows if isinstance(item, _Tail) else item_rows(item)


def _item_part(item: _Item, a: int, b: int) -> _Item:
    return _Tail(item.parts, item.lo + a, item.lo + b) if isinstance(item, _Tail) else item_part(item, a, b)


def _left_by(parts: Parts, cursor: SourceCursor, *, batch_size: int, interleave: int, buffer_rows: int,
             whole_parts: bool) -> list[_Item]:
    """What an old slot had not handed out of its parts of a source, from its cursor: what it left of the part
    it stood in (:func:`~arrowstream._layout.replan.items_left`), then the parts after it (``whole_parts``: as one
    :class:`_Tail`, else as ranges)."""
    items: list[_Item] = []
    segment = cursor.segment
    if segment < len(parts) and cursor.cursor is not None:
        part = parts[segment]
        if part.start is not None:   # a replay of an epoch itself re-planned: the rest of it, still as it was seeded
            handed = cursor.taken - parts.rows_before(segment)
            if part.rows > handed:
                items.append(Replay(part.seeds, part.splits, cursor.cursor, part.rows - handed))
        else:
            items += items_left(part.splits, cursor.cursor, part.seeds, block_size=block_size_for(batch_size, interleave),
                                lanes=interleave, buffer_rows=buffer_rows)
        segment += 1
    # the parts after it; a replay among them (the old slot's epoch was itself re-planned) goes on as it was seeded
    replays = [index for index in replay_indices(parts) if index >= segment]
    for index in [*replays, len(parts)]:
        if whole_parts:
            lo, hi = parts.rows_before(min(segment, len(parts))), parts.rows_before(index)
            if hi > lo:
                items.append(_Tail(parts, lo, hi))
        else:
            for part in parts[segment:index]:
                items += [split for split in part.splits if split.num_rows]
        if index < len(parts):
            part = parts[index]
            items.append(Replay(part.seeds, part.splits, part.start or Cursor.start(len(part.splits), interleave),
                                part.rows))
        segment = index + 1
    return items


def replanned_parts(old_parts: Sequence[Parts], elastic: MixElastic, name: str, new_slots: Sequence[MixSlot], *,
                    seed: int, batch_size: int, interleave: int, buffer_rows: int) -> list[Parts]:
    """Every new slot's parts of source ``name`` for the rest of the epoch (``old_parts``: each old slot's
    parts of it in the epoch). In spans, the parts an old slot had not opened go to the new slots whole
    (:class:`~arrowstream._mixing.parts.SliceParts`: nothing walks them); in tracks (states of mixture state
    version 3 and older), as ranges of splits, as those versions did."""
    whole_parts = elastic.pass_layout == SPANS
    items: list[_Item] = []
    for old, (parts, cursors) in enumerate(zip(old_parts, elastic.cursors, strict=True)):
        if cursors is None:
            continue
        cursor = cursors.get(name, SourceCursor(0, None, 0))
        quota = parts.rows
        left = _left_by(parts, cursor, batch_size=batch_size, interleave=interleave, buffer_rows=buffer_rows,
                        whole_parts=whole_parts)
        rows = sum(map(_item_rows, left))
        if rows != quota - cursor.taken:
            raise StateError(f"old worker {old}'s state of source {name!r} took {cursor.taken} of its {quota} row(s) "
                             f"but its cursor leaves {rows}: not a position its epoch reaches; {REMEDY}")
        items += left
    cut = cut_items(items, len(new_slots), _item_rows, _item_part)
    return [_new_parts(mine, source_seeds(seed, name, slot)) for slot, mine in zip(new_slots, cut, strict=True)]


def _new_parts(items: Sequence[_Item], seeds: Callable[[int, int], int]) -> Parts:
    """A new slot's parts of a source, its items in order: a replay as a part read the way its old slot read
    it, ranges after ranges as one part (one stream), an old slot's whole parts as a :class:`SliceParts` of them;
    ``seeds``: the new slot's (by part, window), for every part but a replay."""
    pieces: list[list[Part] | SliceParts] = []
    given = 0   # a new part's index among the new slot's parts
    for item in items:
        if isinstance(item, _Tail):
            pieces.append(SliceParts(item.parts, item.lo, item.hi, seeds, given))
            given += len(pieces[-1])
            continue
        parts = pieces[-1] if pieces else None
        if not isinstance(parts, list):
            parts = []
            pieces.append(parts)
        if isinstance(item, Replay):
            parts.append(Part(item.splits, item.rows, item.slot, item.start))
        elif parts and parts[-1].start is None:   # ranges after ranges: one part, one stream
            last = parts[-1]
            parts[-1] = Part((*last.splits, item), last.rows + item.num_rows, last.seeds)
            continue
        else:
            parts.append(Part((item,), item.num_rows, functools.partial(seeds, given)))
        given += 1
    out = [ListParts(piece) if isinstance(piece, list) else piece for piece in pieces]
    if len(out) == 1 and isinstance(out[0], ListParts):
        return out[0]
    return ComposedParts(out)
