"""The layout of a mixture: quotas, passes, every slot's rows of every source, and each batch's share.

Pure: numpy and the plan's value types, no I/O (``tests/test_layers.py`` checks it).

A source of ``n`` rows is read in *passes*. Pass ``p`` is the source's splits in a seeded order
(seed, source name, pass), read as one sequence of ``n`` rows; a source's *position* counts the rows
of its passes taken so far, over every epoch. A mixture epoch takes ``quota`` rows from a source: the
positions ``[start, start + quota)``, which may cross into the next pass.

An epoch's rows of a source are laid out over the (rank, worker) slots in *spans* (``pass_layout="spans"``,
from mixture state version 4 on): the epoch's positions ``[start, start + quota)``, cut at pass ends into
pieces, each piece cut into one contiguous stretch per slot, in slot order. Slot ``s`` takes
:func:`span_taken` rows of the epoch's first ``x``, within one row of ``x / slots`` (the extra rows on a
cyclic run of slots that starts at a place of the source's own, so that sources' extras spread). All slots
advance through a pass together (a pass ends at the same moment on every slot), no row of a source comes
twice before all its rows came once, every slot reads whole stretches of splits, and an epoch reads the
positions ``[start, start + quota)`` whole: where a source stands at an epoch boundary is its position alone,
whatever topology read the epochs before (a checkpoint resumes on any topology at a boundary). Everything
a slot's spans are is arithmetic on (rows, start, quota, slots): an epoch of a million passes costs no more
to lay out than one of a single pass.

States of mixture state version 3 and older laid passes out in *tracks* (``pass_layout="tracks"``): each
slot a contiguous stretch of each pass (:func:`tracks`), read across epochs, so that what an epoch boundary
leaves of a pass depends on the topology; a run resumed from such a state keeps them on its topology.

Inside a slot, a batch takes from each source its share of the slot's epoch rows, the rounding carried
from batch to batch (:func:`shares_after`): each source stays within one row of its proportion.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from .._core.hashing import derive_seed, derive_seeds, mix64, permutation, permutations
from .._core.plan_types import Split, SplitTable

_PASS_DOMAIN = 0x6D69785F70617373  # "mix_pass": the split order of a pass
_WINDOW_DOMAIN = 0x6D69785F77696E64  # "mix_wind": shuffle windows of a source's rows in a slot
_BATCH_DOMAIN = 0x6D69785F62617463  # "mix_batc": the row order inside a batch


def name_seed(name: str) -> int:
    """A stable 63-bit number for a source name (never Python's salted ``hash``)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") >> 1


def quotas(rows: Mapping[str, int], weights: Mapping[str, float] | None, epoch_rows: int | None) -> dict[str, int]:
    """Rows each source gives a mixture epoch: ``weight × epoch_rows`` by largest remainder (ties to the
    earlier source), summing to ``epoch_rows`` exactly. ``weights=None``: each source's share of the rows;
    ``epoch_rows=None``: the sum of the sources' rows (then each source gives its rows, once)."""
    names = list(rows)
    total = sum(rows.values()) if epoch_rows is None else epoch_rows
    if weights is None:
        whole = sum(rows.values())
        exact = [Fraction(total * rows[name], whole) if whole else Fraction(0) for name in names]
    else:
        weight_sum = sum(Fraction(weights[name]) for name in names)
        exact = [Fraction(weights[name]) * total / weight_sum for name in names]
    given = [math.floor(value) for value in exact]
    left = total - sum(given)
    by_remainder = sorted(range(len(names)), key=lambda i: (-(exact[i] - given[i]), i))
    for i in by_remainder[:left]:
        given[i] += 1
    return dict(zip(names, given, strict=True))


def quotas_at(history: Sequence[tuple[int, Mapping[str, int]]], epoch: int) -> Mapping[str, int]:
    """The quotas in effect in ``epoch``: those of the last change at or before it."""
    return next(q for first, q in reversed(history) if first <= epoch) if history[0][0] <= epoch else {}


def positions(history: Sequence[tuple[int, Mapping[str, int]]], epoch: int) -> dict[str, int]:
    """Each source's position when ``epoch`` starts: the rows every earlier epoch took of it, by the quotas
    in effect then (``history``: the epoch each set of quotas starts, in order)."""
    out: dict[str, int] = {}
    for index, (first, quota) in enumerate(history):
        last = min(epoch, history[index + 1][0] if index + 1 < len(history) else epoch)
        for name, rows in quota.items():
            out[name] = out.get(name, 0) + rows * max(0, last - first)
        for name in quota:
            out.setdefault(name, 0)
    return out


@dataclass(frozen=True)
class Tracks:
    """The slots' stretches of one pass of ``rows`` rows: slot ``s`` reads ``[starts[s], starts[s] + lengths[s])``."""

    rows: int
    starts: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    rank_in_order: npt.NDArray[np.int64]  # the longer tracks first: who takes the extra row of a round


def tracks(rows: int, num_slots: int, pass_index: int) -> Tracks:
    """The tracks of pass ``pass_index``: ``rows // num_slots`` rows each, the ``rows % num_slots`` longer
    ones on slots that rotate from pass to pass, so that over passes every slot reads as many rows."""
    base, extra = divmod(rows, num_slots)
    lengths = np.full(num_slots, base, dtype=np.int64)
    longer = (pass_index * extra + np.arange(extra, dtype=np.int64)) % num_slots
    lengths[longer] += 1
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    order = np.concatenate([np.sort(longer), np.setdiff1d(np.arange(num_slots), longer)])
    rank_in_order = np.empty(num_slots, dtype=np.int64)
    rank_in_order[order] = np.arange(num_slots)
    return Tracks(rows, starts, lengths, rank_in_order)


def consumed(track: Tracks, position: int) -> npt.NDArray[np.int64]:
    """Rows of its track each slot has taken when the pass stands at ``position``: monotone in it, summing
    to it exactly, each within one row of ``position / slots``."""
    rounds, rest = divmod(position, len(track.lengths))
    taken: npt.NDArray[np.int64] = np.minimum(track.lengths, rounds + (track.rank_in_order < rest)).astype(np.int64)
    return taken


@dataclass(frozen=True)
class Segment:
    """A slot's rows of one pass in one epoch: positions ``[start, stop)`` of the pass's sequence."""

    pass_index: int
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


def epoch_segments(rows: int, start: int, quota: int, num_slots: int) -> list[list[Segment]]:
    """Every slot's segments of a source's epoch: positions ``[start, start + quota)`` over its passes."""
    per_slot: list[list[Segment]] = [[] for _ in range(num_slots)]
    if quota == 0:
        return per_slot
    end = start + quota
    for pass_index in range(start // rows, (end - 1) // rows + 1):
        origin = pass_index * rows
        track = tracks(rows, num_slots, pass_index)
        before = consumed(track, max(start, origin) - origin)
        after = consumed(track, min(end, origin + rows) - origin)
        for slot in range(num_slots):
            if after[slot] > before[slot]:
                first = int(track.starts[slot])
                per_slot[slot].append(Segment(pass_index, first + int(before[slot]), first + int(after[slot])))
    return per_slot


SPANS, TRACKS = "spans", "tracks"
PASS_LAYOUTS = (SPANS, TRACKS)
"""How a mixture lays a source's passes out over the slots (``options.pass_layout``): see the module's text."""

MAX_EPOCH_ROWS = 2**42
"""The most rows a mixture epoch may take (about 4.4 trillion): positions stay far inside 64-bit integers for a
million epochs."""


def span_first(name: str, num_slots: int) -> int:
    """The slot where a source's extra rows of an epoch start (a place of the source's own, by its name)."""
    return name_seed(name) % num_slots


def span_taken(x: int, num_slots: int, slot: int, first: int) -> int:
    """Rows of the epoch's first ``x`` that ``slot`` takes (spans): ``x // slots``, and one more on the
    ``x % slots`` slots from ``first`` on (cyclically)."""
    rounds, rest = divmod(x, num_slots)
    return rounds + ((slot - first) % num_slots < rest)


def span_before(x: int, num_slots: int, slot: int, first: int) -> int:
    """Rows of the epoch's first ``x`` that the slots before ``slot`` take together (spans)."""
    rounds, rest = divmod(x, num_slots)
    end = first + rest   # the slots with one more: [first, end), cyclically
    extra = max(0, min(slot, end) - first) + (max(0, min(slot, end - num_slots)) if end > num_slots else 0)
    return slot * rounds + extra


def span_pieces(rows: int, start: int, quota: int) -> int:
    """Pieces of an epoch's span (passes it touches)."""
    return 0 if quota == 0 else (start + quota - 1) // rows - start // rows + 1


def span_piece(rows: int, start: int, quota: int, index: int) -> tuple[int, int, int]:
    """Piece ``index`` of an epoch's span: its pass, and the span's positions where it starts and ends
    (counted from the epoch's start)."""
    first_pass = start // rows
    begin = 0 if index == 0 else (first_pass + index) * rows - start
    end = min(quota, (first_pass + index + 1) * rows - start)
    return first_pass + index, begin, end


def span_segment(rows: int, start: int, quota: int, num_slots: int, slot: int, first: int, index: int) -> Segment:
    """Slot ``slot``'s segment of piece ``index`` of an epoch's span (empty where it takes none of it)."""
    pass_index, begin, end = span_piece(rows, start, quota, index)
    offset = start + begin - pass_index * rows   # the piece's first position in its pass
    lo = offset + span_before(end, num_slots, slot, first) - span_before(begin, num_slots, slot, first)
    taken = span_taken(end, num_slots, slot, first) - span_taken(begin, num_slots, slot, first)
    return Segment(pass_index, lo, lo + taken)


def slot_quotas(rows: int, start: int, quota: int, num_slots: int) -> list[int]:
    """Rows of a source each slot takes in an epoch (they sum to ``quota``)."""
    return [sum(s.num_rows for s in segments) for segments in epoch_segments(rows, start, quota, num_slots)]


def pass_order(num_splits: int, *, shuffle: bool, seed: int, name: str, pass_index: int) -> npt.NDArray[np.int64]:
    """The order of a source's splits in a pass: natural, or seeded by (seed, source name, pass)."""
    if not shuffle:
        return np.arange(num_splits, dtype=np.int64)
    return permutation(num_splits, derive_seed(_PASS_DOMAIN, seed, name_seed(name), pass_index))


def segment_splits(splits: SplitTable, order: npt.NDArray[np.int64], segment: Segment) -> tuple[Split, ...]:
    """The rows of ``segment`` as splits (the first and last cut to row ranges), in the pass's order."""
    ordered_rows = splits.num_rows[order]
    ends = np.cumsum(ordered_rows)
    first = int(np.searchsorted(ends, segment.start, side="right"))
    last = int(np.searchsorted(ends, segment.stop, side="left"))
    out: list[Split] = []
    for place in range(first, last + 1):
        split = splits[int(order[place])]
        begin = int(ends[place] - ordered_rows[place])
        lo, hi = max(segment.start, begin) - begin, min(segment.stop, int(ends[place])) - begin
        if hi <= lo:
            continue
        out.append(Split(split.file_index, split.unit_start, split.unit_stop, split.row_start + lo, hi - lo,
                         split.num_bytes * (hi - lo) // max(split.num_rows, 1)))
    return tuple(out)


def window_seed(seed: int, name: str, epoch: int, slot_index: int, num_slots: int, segment: int,
                window: int) -> int:
    """The seed of a shuffle window of a source's rows in one slot's segment of an epoch."""
    return derive_seed(_WINDOW_DOMAIN, seed, name_seed(name), epoch, slot_index, num_slots, segment, window)


def window_seeds(seed: int, name: str, epoch: int, slot_index: int, num_slots: int,
                 segments: npt.NDArray[np.int64], window: int) -> npt.NDArray[np.uint64]:
    """:func:`window_seed` of window ``window`` of each of ``segments``, vectorized."""
    folded = derive_seeds(segments.astype(np.uint64), _WINDOW_DOMAIN, seed, name_seed(name), epoch, slot_index,
                          num_slots)
    folded ^= np.uint64(mix64(np.array([window & (2**64 - 1)], dtype=np.uint64))[0])
    return mix64(folded)


def span_segments(rows: int, start: int, quota: int, num_slots: int, slot: int, first: int,
                  pieces: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """:func:`span_segment` of each of ``pieces``, vectorized: each segment's first position in its pass and
    its rows."""
    pass_index = start // rows + pieces
    begin = np.where(pieces == 0, 0, pass_index * rows - start)
    end = np.minimum(quota, (pass_index + 1) * rows - start)
    offset = start + begin - pass_index * rows

    def taken(x: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        rounds, rest = np.divmod(x, num_slots)
        out: npt.NDArray[np.int64] = rounds + ((slot - first) % num_slots < rest)
        return out

    def before(x: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        rounds, rest = np.divmod(x, num_slots)
        stop = first + rest
        extra = np.maximum(0, np.minimum(slot, stop) - first) + np.maximum(0, np.minimum(slot, stop - num_slots))
        out: npt.NDArray[np.int64] = slot * rounds + extra
        return out

    return offset + before(end) - before(begin), taken(end) - taken(begin)


def batch_permutation(rows: int, seed: int, epoch: int, slot_index: int, num_slots: int, batch: int) -> npt.NDArray[np.int64]:
    """The order of a batch's rows when the shuffle buffer mixes the sources inside it."""
    return permutation(rows, derive_seed(_BATCH_DOMAIN, seed, epoch, slot_index, num_slots, batch))


def batch_permutations(rows: int, seed: int, epoch: int, slot_index: int, num_slots: int,
                       batches: Sequence[int]) -> npt.NDArray[np.int64]:
    """:func:`batch_permutation` of each of ``batches`` (all of ``rows`` rows), as the rows of one array."""
    return permutations(rows, derive_seeds(np.asarray(batches, dtype=np.uint64), _BATCH_DOMAIN, seed, epoch,
                                           slot_index, num_slots))


def shares_after(taken: Sequence[int], quotas: Sequence[int], rows: int) -> list[int]:
    """How many rows of each source a slot has handed out once it has handed out ``rows`` rows of its
    epoch, given ``taken`` before: never less than ``taken``, never more than the quota, each as close to
    ``rows × quota / total`` as the rows before allow (within one row), summing to ``rows``."""
    total = sum(quotas)
    if total == 0:
        return list(taken)
    # in units of 1/total: source k's ideal is rows * quota, exactly (integers, no Fraction per batch)
    scaled = [rows * q for q in quotas]
    new = [min(q, max(t, s // total)) for t, q, s in zip(taken, quotas, scaled, strict=True)]
    count, given = len(new), sum(new)
    while given < rows:  # the sources furthest below their ideal take one more, in turn
        k = max((k for k in range(count) if new[k] < quotas[k]), key=lambda k: (scaled[k] - new[k] * total, -k))
        new[k] += 1
        given += 1
    while given > rows:  # (only with rows taken above the ideal before) the furthest above give one back
        k = max((k for k in range(count) if new[k] > taken[k]), key=lambda k: (new[k] * total - scaled[k], -k))
        new[k] -= 1
        given -= 1
    return new


def shares_along(taken: Sequence[int], quotas: Sequence[int], rows: Sequence[int]) -> list[list[int]]:
    """:func:`shares_after` for each of ``rows`` (rising), each from the one before (``taken`` before the
    first): each source's rows handed out after each, source by source (``out[k][j]``: source ``k`` after
    ``rows[j]``). The same numbers, for less Python work per batch: one source takes every row, and where
    rows are missing after the rounding down they go to the sources furthest below their ideal in one sort
    (each such source takes one: every one of them is less than one row below its ideal and their gaps add
    up to the rows missing, so more of them are below it than rows are missing), instead of one search per row.
    """
    total = sum(quotas)
    count = len(quotas)
    if not rows:
        return [[] for _ in quotas]
    if count == 1 and taken[0] <= rows[0] and rows[-1] <= total:
        return [list(rows)]   # (rising rows: each is at least the one before and at most the quota)
    if total == 0 or rows[-1] > total:   # (not in an epoch: its rows are its quotas' sum)
        return [list(column) for column in zip(*_shares_each(taken, quotas, rows), strict=True)]
    out: list[list[int]] = []
    now = list(taken)
    pairs = list(zip(range(count), quotas, strict=True))
    for row in rows:
        new = [min(quota, max(before, row * quota // total)) for before, quota in zip(now, quotas, strict=True)]
        missing = row - sum(new)
        if missing > 0:
            below = sorted((new[k] * total - row * quota, k) for k, quota in pairs if new[k] < quota)
            for _, k in below[:missing]:
                new[k] += 1
        elif missing < 0:   # rows taken above the ideal before: shares_after gives them back
            new = shares_after(now, quotas, row)
        out.append(new)
        now = new
    return [list(column) for column in zip(*out, strict=True)]


def _shares_each(taken: Sequence[int], quotas: Sequence[int], rows: Sequence[int]) -> list[list[int]]:
    """:func:`shares_after` for each of ``rows``, one after another (batch by batch)."""
    out: list[list[int]] = []
    for row in rows:
        taken = shares_after(taken, quotas, row)
        out.append(taken)
    return out
