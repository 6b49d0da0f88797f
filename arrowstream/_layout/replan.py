"""The rest of an epoch re-planned over another topology: what an old slot left, cut into new slots' stretches.

One for a dataset (:mod:`arrowstream._layout.elastic`) and for each source of a mixture
(:mod:`arrowstream._mixing.elastic`): a dataset is a mixture of one source whose old slots each read one
stream of splits. From an old slot's cursor in the splits it read as one stream (:func:`items_left`), the
rows it had not handed out are *items*:

* a :class:`Replay`: the rest of the shuffle window it stood in, read again the way the old slot read it
  (its splits, its window seeds) and handed out in its shuffled order from where it stood; its size and
  where the window ends follow from row counts (:func:`window_end`);
* a range for each lane it had open (the rows past the lane's cursor) and each split it had not opened:
  a :class:`~arrowstream._core.plan_types.Split` like any other.

The items of every old slot, old slot after old slot, are one sequence of rows, cut into as many contiguous
stretches as there are new slots, of equal rows within one (:func:`cut_items`, on
:func:`~arrowstream._core.order.cut_evenly`): an item across a cut is handed out in parts (:func:`item_part`).

What the two differ by stays with them: how an old slot's splits are found (a dataset's plan and slot, a
mixture's parts), what seeds a replay's windows (the ``slot`` of a :class:`Replay`), and how a new slot
reads its stretch (a dataset's share of replays then ranges; a mixture's parts, with the parts an old slot
had not opened handed on whole).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import pyarrow as pa

from .._core.cursor import Cursor
from .._core.interleave import interleave_runs
from .._core.order import cut_evenly
from .._core.piece import Piece
from .._core.plan_types import Split

K = TypeVar("K")
T = TypeVar("T")


@dataclass(frozen=True)
class Replay(Generic[K]):
    """The rest of an old slot's shuffle window: ``rows`` rows from ``start`` in the stream of ``splits``.

    ``slot`` is what seeds the old slot's windows, so that the window is read again as it was: a dataset's
    :class:`~arrowstream._core.order.Slot` (``window_seed(seed, epoch, slot, window)``), a mixture source's
    part seeds (window -> seed)."""

    slot: K
    splits: tuple[Split, ...]
    start: Cursor
    rows: int


class _CountReader:
    """Reads row counts, not rows: one column-less piece per split, for planning."""

    def read(self, split: Split, position: int, offset: int) -> Iterator[Piece]:
        if offset < split.num_rows:
            batch = pa.RecordBatch.from_arrays([pa.nulls(split.num_rows - offset)], names=["n"])
            yield Piece(batch, position, offset, split.num_rows, None)

    def close(self) -> None:
        pass


def window_end(splits: Sequence[Split], start: Cursor, block_size: int | None, lanes: int,
               buffer_rows: int) -> tuple[int, Cursor]:
    """The rows of the window that starts at ``start`` and the stream cursor past it."""
    begin = dataclasses.replace(start, window_index=0, window_offset=0)
    size = 0
    for run in interleave_runs([_CountReader() for _ in range(lanes)], splits, block_size, begin):
        if size + run.num_rows >= buffer_rows:
            return buffer_rows, run.after(buffer_rows - size)
        size += run.num_rows
    return size, Cursor.end(len(splits))


def split_rest(split: Split, offset: int) -> Split:
    """The rows of ``split`` from source offset ``offset`` on."""
    rows = split.num_rows - offset
    return dataclasses.replace(split, row_start=split.row_start + offset, num_rows=rows,
                               num_bytes=split.num_bytes * rows // max(split.num_rows, 1))


def split_part(split: Split, a: int, b: int) -> Split:
    """Rows ``[a, b)`` of ``split``."""
    rest = split_rest(split, a) if a else split
    rows = b - a
    if rows == rest.num_rows:
        return rest
    return dataclasses.replace(rest, num_rows=rows, num_bytes=rest.num_bytes * rows // max(rest.num_rows, 1))


def replay_part(replay: Replay[K], a: int, b: int) -> Replay[K]:
    """Rows ``[a, b)`` of what ``replay`` hands out, as a replay of its own."""
    start = dataclasses.replace(replay.start, window_offset=replay.start.window_offset + a)
    return Replay(replay.slot, replay.splits, start, b - a)


def item_rows(item: Replay[K] | Split) -> int:
    """Rows of an item of a re-planned epoch."""
    return item.rows if isinstance(item, Replay) else item.num_rows


def item_part(item: Replay[K] | Split, a: int, b: int) -> Replay[K] | Split:
    """Rows ``[a, b)`` of an item of a re-planned epoch, as an item of its own."""
    return replay_part(item, a, b) if isinstance(item, Replay) else split_part(item, a, b)


def window_left(splits: Sequence[Split], cursor: Cursor, slot: K, *, block_size: int | None, lanes: int,
                buffer_rows: int) -> tuple[Replay[K] | None, Cursor]:
    """The rest of the shuffle window an old slot stood in at ``cursor`` in ``splits`` (read as one stream,
    ``lanes`` interleaved), as a replay seeded by ``slot`` (None: it stood in none, or at its end), and the
    stream cursor past that window (``cursor`` itself without one): the first step of :func:`items_left`."""
    if not (buffer_rows and cursor.window_offset):
        return None, cursor
    size, end = window_end(splits, cursor, block_size, lanes, buffer_rows)
    if size <= cursor.window_offset:
        return None, end
    return Replay(slot, tuple(splits), cursor, size - cursor.window_offset), end


def ranges_left(splits: Sequence[Split], end: Cursor) -> list[Split]:
    """The rows of ``splits`` past the stream cursor ``end`` (where no window is open): the rest of each open
    lane, then every split not opened; the second step of :func:`items_left`."""
    rest = [split_rest(splits[position], offset) for position, offset in end.lanes
            if position < len(splits) and offset < splits[position].num_rows]
    rest += [s for s in splits[end.next_split_index:] if s.num_rows]
    return rest


def items_left(splits: Sequence[Split], cursor: Cursor, slot: K, *, block_size: int | None, lanes: int,
              buffer_rows: int) -> list[Replay[K] | Split]:
    """What an old slot left of ``splits`` (read as one stream, ``lanes`` interleaved) from ``cursor``: the
    rest of the shuffle window it stood in (a replay seeded by ``slot``, :func:`window_left`), the rests of its
    open lanes, the splits it had not opened (:func:`ranges_left`).

    A shuffle window's extent follows from the splits' row counts, so they must be the rows the old slot
    read (a dataset refuses a slot inside a window when a filter may drop rows).
    """
    replay, end = window_left(splits, cursor, slot, block_size=block_size, lanes=lanes, buffer_rows=buffer_rows)
    items: list[Replay[K] | Split] = [] if replay is None else [replay]
    items.extend(ranges_left(splits, end))
    return items


def cut_items(items: Sequence[T], num_slots: int, rows: Callable[[T], int],
              part: Callable[[T, int, int], T]) -> list[list[T]]:
    """``items`` (``rows(item)`` rows each) as one sequence of rows, cut into ``num_slots`` contiguous stretches
    of equal rows (within one): each new slot's items in order, an item across a cut in parts
    (``part(item, lo, hi)``: its rows ``[lo, hi)``)."""
    out: list[list[T]] = [[] for _ in range(num_slots)]
    for index, slot, lo, hi in cut_evenly([rows(item) for item in items], num_slots):
        out[slot].append(part(items[index], lo, hi))
    return out
