"""A slot's parts of a source in a mixture epoch, as a sequence that knows its rows without walking them.

An epoch of a source that runs through a million passes (a tiny source, a large ``epoch_rows``) has a
million parts per slot; nothing that starts an epoch, counts its batches or checks a state may walk them.
A :class:`Parts` answers ``len``, ``[i]``, :attr:`~Parts.rows` and :meth:`~Parts.rows_before`: by arithmetic
on an epoch's spans (:class:`SpanParts`, see :mod:`arrowstream._mixing.quotas`), from a list (:class:`ListParts`:
tracks, the items of a re-planned epoch), as an old slot's rows handed to a new one (:class:`SliceParts`), or
several of these one after another (:class:`ComposedParts`).
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
import numpy.typing as npt

from .._core.cursor import Cursor, Run
from .._core.plan_types import Split, SplitTable
from .._layout.replan import split_part
from .quotas import (
    Segment,
    pass_order,
    segment_splits,
    span_piece,
    span_pieces,
    span_segment,
    span_segments,
    span_taken,
    window_seed,
    window_seeds,
)

_ORDERS_KEPT = 4   # pass orders a span keeps (a slot reads one or two passes at a time)


@dataclass(frozen=True)
class Part:
    """A stretch of a slot's rows of a source in an epoch, read as one stream: ``splits`` through the usual
    pipeline from ``start`` (None: their first row), shuffle windows seeded by ``seeds`` (window -> seed),
    ``rows`` rows of it. A segment of a pass is one; so is the rest of an old worker's shuffle window, or
    ranges of splits, in an epoch re-planned for another topology (``arrowstream._mixing.elastic``).
    ``runs``: a part that reads itself (a dynamic worker's leases, ``arrowstream._layout.leased_parts``): its runs,
    and the cursor the stream stands at before its first row, instead of the pipeline over ``splits``."""

    splits: tuple[Split, ...]
    rows: int
    seeds: Callable[[int], int]
    start: Cursor | None = None
    runs: Callable[[], tuple[Iterator[Run], Cursor]] | None = None


class Parts(Sequence[Part]):
    """A slot's parts of a source in an epoch, in reading order."""

    @property
    def rows(self) -> int:
        """Rows of every part together."""
        return self.rows_before(len(self))

    def rows_before(self, index: int) -> int:   # pragma: no cover - every subclass answers
        """Rows of the parts before part ``index`` (``len(self)``: all of them)."""
        raise NotImplementedError

    def index_of_row(self, row: int) -> int:
        """The part that holds the slot's row ``row`` of the source (``len(self)`` past the last)."""
        return self._search(row, 0, len(self))

    def has_part(self, index: int) -> bool:
        """Whether there is a part ``index`` (parts that grow while they are read find out here: a dynamic worker
        leases until it knows)."""
        return index < len(self)

    def _search(self, row: int, lo: int, hi: int) -> int:
        """:meth:`index_of_row` among parts ``[lo, hi)``."""
        while lo < hi:   # the first part whose rows end after ``row``
            mid = (lo + hi) // 2
            if self.rows_before(mid + 1) > row:
                hi = mid
            else:
                lo = mid + 1
        return lo

    @overload
    def __getitem__(self, index: int) -> Part: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Part]: ...

    def __getitem__(self, index: int | slice) -> Part | Sequence[Part]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        return self.part(index % len(self))

    def part(self, index: int) -> Part:   # pragma: no cover - every subclass answers
        raise NotImplementedError

    def __iter__(self) -> Iterator[Part]:
        return (self.part(i) for i in range(len(self)))


class ListParts(Parts):
    """Parts given one by one (tracks, and the items of an epoch re-planned for another topology)."""

    def __init__(self, parts: Sequence[Part]) -> None:
        self._parts = tuple(parts)
        self._before = [0, *itertools.accumulate(part.rows for part in self._parts)]

    def __len__(self) -> int:
        return len(self._parts)

    def part(self, index: int) -> Part:
        return self._parts[index]

    def rows_before(self, index: int) -> int:
        return self._before[index]

    def index_of_row(self, row: int) -> int:
        return bisect.bisect_right(self._before, row) - 1 if row < self._before[-1] else len(self._parts)


class SpanParts(Parts):
    """A slot's segments of an epoch's span of a source, one part per piece (empty where it takes none):
    ``rows`` rows a pass, the epoch's positions ``[start, start + quota)``, ``num_slots`` slots, extra rows
    from slot ``first`` on; part ``i`` reads its shuffle windows with ``seeds(offset + i, window)``."""

    def __init__(self, splits: SplitTable, *, rows: int, start: int, quota: int, num_slots: int, slot: int,
                 first: int, shuffle: bool, seed: int, name: str, epoch: int, offset: int = 0) -> None:
        self._splits = splits
        self._rows, self._start, self._quota = rows, start, quota
        self._num_slots, self._slot, self._first = num_slots, slot, first
        self._shuffle, self._seed, self._name, self._epoch = shuffle, seed, name, epoch
        self._seeds = functools.partial(window_seed, seed, name, epoch, slot, num_slots)
        self._offset = offset
        self._length = span_pieces(rows, start, quota)
        self._only = splits[0] if len(splits) == 1 else None
        self._hint = 0   # the part the last index_of_row found: the next one asked for is usually right after it

    def __len__(self) -> int:
        return self._length

    def segment(self, index: int) -> Segment:
        return span_segment(self._rows, self._start, self._quota, self._num_slots, self._slot, self._first, index)

    def part(self, index: int) -> Part:
        segment = self.segment(index)
        if not segment.num_rows:
            splits: tuple[Split, ...] = ()
        elif self._only is not None:   # one split: the segment's rows of it, whatever the pass's order
            only = self._only
            splits = (Split(only.file_index, only.unit_start, only.unit_stop, only.row_start + segment.start,
                            segment.num_rows, only.num_bytes * segment.num_rows // max(only.num_rows, 1)),)
        else:
            splits = segment_splits(self._splits, self._order(segment.pass_index), segment)
        return Part(splits, segment.num_rows, functools.partial(self._seeds, self._offset + index))

    def index_of_row(self, row: int) -> int:
        """:meth:`Parts.index_of_row`: a slot reads on from the part it stood in, so the parts just after the
        last one found are tried before a search."""
        hint = self._hint
        if self.rows_before(hint) <= row:
            for index in range(hint, min(hint + 3, self._length)):
                if self.rows_before(index + 1) > row:
                    self._hint = index
                    return index
        index = self._search(row, 0, self._length)
        self._hint = min(index, max(self._length - 1, 0))
        return index

    def _order(self, pass_index: int) -> npt.NDArray[np.int64]:
        return _pass_order(len(self._splits), self._shuffle, self._seed, self._name, pass_index)

    def rows_before(self, index: int) -> int:
        if index >= self._length:
            return span_taken(self._quota, self._num_slots, self._slot, self._first)
        _, begin, _ = span_piece(self._rows, self._start, self._quota, index)
        return span_taken(begin, self._num_slots, self._slot, self._first)

    @property
    def only(self) -> Split | None:
        """The source's one split, if it has one (each part is then a range of its rows)."""
        return self._only

    def segments(self, pieces: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The first position in its pass and the rows of this slot's segment of each of ``pieces``."""
        return span_segments(self._rows, self._start, self._quota, self._num_slots, self._slot, self._first, pieces)

    def first_window_seeds(self, pieces: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        """The seed of the first shuffle window of the part of each of ``pieces``."""
        return window_seeds(self._seed, self._name, self._epoch, self._slot, self._num_slots, self._offset + pieces, 0)


def _pass_order(num_splits: int, shuffle: bool, seed: int, name: str, pass_index: int) -> npt.NDArray[np.int64]:
    if num_splits <= 1 or not shuffle:   # one order for every pass
        return _cached_order(num_splits, False, 0, "", 0)
    return _cached_order(num_splits, shuffle, seed, name, pass_index)


@functools.lru_cache(maxsize=_ORDERS_KEPT)
def _cached_order(num_splits: int, shuffle: bool, seed: int, name: str, pass_index: int) -> npt.NDArray[np.int64]:
    order = pass_order(num_splits, shuffle=shuffle, seed=seed, name=name, pass_index=pass_index)
    order.flags.writeable = False
    return order


class SliceParts(Parts):
    """An old slot's rows ``[lo, hi)`` of a source (in its own row count), as parts of a new slot: the old
    parts that hold them, the first and last cut, each read as a stream of its own with the new slot's
    seeds (``seeds(offset + i, window)``): how an epoch laid out in spans hands the parts an old worker had
    not opened to the new workers, without walking them (see :mod:`arrowstream._mixing.elastic`)."""

    def __init__(self, parts: Parts, lo: int, hi: int, seeds: Callable[[int, int], int], offset: int) -> None:
        self._parts, self._lo, self._hi = parts, lo, hi
        self._first = parts.index_of_row(lo)
        self._length = parts.index_of_row(hi - 1) - self._first + 1
        self._seeds, self._offset = seeds, offset

    def __len__(self) -> int:
        return self._length

    def part(self, index: int) -> Part:
        old = self._first + index
        begin, end = self._parts.rows_before(old), self._parts.rows_before(old + 1)
        lo, hi = max(begin, self._lo) - begin, min(end, self._hi) - begin
        splits = self._parts.part(old).splits
        return Part(cut_splits(splits, lo, hi), hi - lo, functools.partial(self._seeds, self._offset + index))

    def rows_before(self, index: int) -> int:
        return min(max(self._parts.rows_before(self._first + index), self._lo), self._hi) - self._lo

    def index_of_row(self, row: int) -> int:
        return min(self._parts.index_of_row(self._lo + row) - self._first, self._length)


def cut_splits(splits: Sequence[Split], lo: int, hi: int) -> tuple[Split, ...]:
    """Rows ``[lo, hi)`` of ``splits`` read one after another, as splits (the first and last cut)."""
    out: list[Split] = []
    begin = 0
    for split in splits:
        end = begin + split.num_rows
        a, b = max(lo, begin), min(hi, end)
        if b > a:
            out.append(split if (a, b) == (begin, end) else split_part(split, a - begin, b - begin))
        begin = end
    return tuple(out)


class ComposedParts(Parts):
    """Parts of several sequences, one after another (a new slot's parts of an epoch re-planned for it)."""

    def __init__(self, pieces: Sequence[Parts]) -> None:
        self._pieces = [piece for piece in pieces if len(piece)]
        self._firsts = [0, *itertools.accumulate(len(piece) for piece in self._pieces)]
        self._rows = [0, *itertools.accumulate(piece.rows for piece in self._pieces)]

    def __len__(self) -> int:
        return self._firsts[-1]

    def pieces(self) -> list[tuple[int, Parts]]:
        """Each sequence with the index of its first part among these."""
        return list(zip(self._firsts, self._pieces, strict=False))

    def _locate(self, index: int) -> int:
        return bisect.bisect_right(self._firsts, index) - 1

    def part(self, index: int) -> Part:
        k = self._locate(index)
        return self._pieces[k].part(index - self._firsts[k])

    def rows_before(self, index: int) -> int:
        if index >= len(self):
            return self._rows[-1]
        k = self._locate(index)
        return self._rows[k] + self._pieces[k].rows_before(index - self._firsts[k])

    def index_of_row(self, row: int) -> int:
        if row >= self._rows[-1]:
            return len(self)
        k = bisect.bisect_right(self._rows, row) - 1
        return self._firsts[k] + self._pieces[k].index_of_row(row - self._rows[k])


def replay_indices(parts: Parts) -> list[int]:
    """The parts of ``parts`` that start inside a window (``start``: the rest of an old worker's window, in an epoch
    re-planned for another topology), without walking parts that cannot: only a list of items holds them (a span's
    and an old slot's slice never do)."""
    if isinstance(parts, ListParts):
        return [index for index in range(len(parts)) if parts.part(index).start is not None]
    if isinstance(parts, ComposedParts):
        return [first + index for first, piece in parts.pieces() for index in replay_indices(piece)]
    return []
