"""The rows a dynamic ledger leaves, checked against the plan (the ledger: :mod:`arrowstream._assignment.dynamic_epoch`).

A rank's rows of a dynamic epoch are its fresh splits in the epoch's order, cut to the rows it yields;
a row's *position* is its place among them (0 to rows - 1). A ledger leaves replays (the rest of old
workers' shuffle windows), explicit splits, and the fresh rows from ``fresh_from_row`` on. Loading it
checks, as a static worker state's cursor is checked against its counters (:mod:`arrowstream._state.position`):

- every split it names lies among the rows the epoch had leased (the rank's fresh rows before
  ``fresh_from_row``: leases are taken in order), and its explicit splits leave each row once;
- each replay is a window an old worker of this rank could have stood in: its slot one of the rank's,
  its cursor a position over its splits, its rows inside that window (whose size follows from row counts);
- the rows it leaves and the rows it counts as yielded (``yielded``: how many, and the sum of their
  positions and of their squares) make up the rank's rows of the epoch: the same count and the same two
  sums. Which rows a replay leaves follows from its window's order, seeded by the epoch, the slot and the
  window, and from its cursor (which lane reads first, where a block stands): a ledger whose replays,
  splits or epoch were changed leaves other rows than the count and the sums leave out, and is refused.
  The squares catch what the sum alone misses: two lanes of a window exchanged (another ``turn_index``,
  the lanes swapped) move as many rows up as down. Only a change of several fields that keeps the count
  and both sums could pass.

Pure: no I/O, no torch (``tests/test_layers.py``); a window's rows are positions, never rows read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .._core.cursor import Cursor
from .._core.fields import REMEDY, Fields, shorten
from .._core.hashing import permutation_part
from .._core.interleave import block_size_for, interleave_runs
from .._core.order import Slot, window_seed
from .._core.piece import Piece
from .._core.plan_types import Split, SplitTable, split_rows
from .._layout.replan import Replay
from ..errors import StateError

if TYPE_CHECKING:
    from .._core.plan_types import OrderOptions, PlanView
    from .._layout.leases import Work

POSITION_SUM_MODULUS = 2**53 - 111   # a prime: the sum stays exact in any JSON reader's doubles
_ROW_BITS = 40   # a row of a file as one int64: file << 40 | row


def _intervals(plan: PlanView, splits: Sequence[Split]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The rows of ``splits`` (in their order) as half-open intervals of keys: file << 40 | row in the file."""
    table = SplitTable.from_splits(splits)
    files = plan.files   # units of every file in one column: file i's are unit_offsets[i]:unit_offsets[i + 1]
    rows_before = np.concatenate([[0], np.cumsum(files.unit_rows)]).astype(np.int64)
    file_first = np.asarray(files.unit_offsets, dtype=np.int64)[table.file_index]
    first_unit_row = rows_before[file_first + table.unit_start] - rows_before[file_first]
    start = (table.file_index << _ROW_BITS) + first_unit_row + table.row_start
    return start, start + table.num_rows


@dataclasses.dataclass(frozen=True)
class Tally:
    """Rows counted: how many, the sum of their positions and the sum of their squares (the sums modulo
    :data:`POSITION_SUM_MODULUS`)."""

    rows: int
    sum: int
    square_sum: int

    @classmethod
    def of_range(cls, first: int, rows: int) -> Tally:
        """The positions ``first`` to ``first + rows - 1``."""
        def squares(n: int) -> int:   # 0^2 + ... + (n - 1)^2
            return (n - 1) * n * (2 * n - 1) // 6

        return cls(rows, (rows * first + rows * (rows - 1) // 2) % POSITION_SUM_MODULUS,
                   (squares(first + rows) - squares(first)) % POSITION_SUM_MODULUS)

    @classmethod
    def of_positions(cls, positions: npt.NDArray[np.int64]) -> Tally:
        """The positions ``positions``, summed exactly: a square of a position passes 64 bits from 2^32
        on, so each is cut in 21-bit halves whose products sum in 64 bits (up to 2^42 for a position and
        2^20 rows at a time; larger ones as Python ints)."""
        if len(positions) and int(positions.max()) >= 1 << 42:
            as_ints = positions.astype(object)
            return cls(len(positions), int(as_ints.sum()) % POSITION_SUM_MODULUS,
                       int((as_ints * as_ints).sum()) % POSITION_SUM_MODULUS)
        total = squares = 0
        for at in range(0, len(positions), 1 << 20):
            part = positions[at:at + (1 << 20)]
            high, low = part >> 21, part & ((1 << 21) - 1)
            total += int(part.sum())
            squares += (int((high * high).sum()) << 42) + (int((high * low).sum()) << 22) + int((low * low).sum())
        return cls(len(positions), total % POSITION_SUM_MODULUS, squares % POSITION_SUM_MODULUS)

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.rows + other.rows, (self.sum + other.sum) % POSITION_SUM_MODULUS,
                     (self.square_sum + other.square_sum) % POSITION_SUM_MODULUS)

    def __sub__(self, other: Tally) -> Tally:
        return Tally(self.rows - other.rows, (self.sum - other.sum) % POSITION_SUM_MODULUS,
                     (self.square_sum - other.square_sum) % POSITION_SUM_MODULUS)


class EpochRows:
    """A rank's rows of one dynamic epoch (its fresh splits, cut), placed: where each of a ledger's splits
    lies among them."""

    def __init__(self, plan: PlanView, fresh: Sequence[Split], head: Sequence[Replay[Slot]] = ()) -> None:
        self._plan = plan
        # an epoch re-planned for another world size: the stretch's replays (parts of old windows) come first,
        # positions 0 to head_rows - 1, replay after replay; its fresh splits follow
        self.head = tuple(head)
        self.head_rows = sum(replay.rows for replay in self.head)
        start, end = _intervals(plan, fresh)
        rows = end - start
        first = np.cumsum(rows) - rows + self.head_rows   # the position of each fresh split's first row
        held = np.flatnonzero(rows > 0)   # a split of no rows holds no position (and may start where another does)
        order = held[np.argsort(start[held], kind="stable")]
        self._start, self._end, self._first = start[order], end[order], first[order]
        self.num_rows = self.head_rows + int(rows.sum())

    @property
    def tally(self) -> Tally:
        """Every row of the epoch."""
        return Tally.of_range(0, self.num_rows)

    def place(self, splits: Sequence[Split]) -> npt.NDArray[np.int64]:
        """The position of each split's first row, or -1 where the split is not inside one fresh split."""
        if not splits:
            return np.zeros(0, dtype=np.int64)
        start, end = _intervals(self._plan, splits)
        if not len(self._start):
            return np.full(len(start), -1, dtype=np.int64)
        at = np.maximum(np.searchsorted(self._start, start, side="right") - 1, 0)
        inside = (start >= self._start[at]) & (end <= self._end[at])
        return np.where(inside, self._first[at] + start - self._start[at], -1)


class _PositionReader:
    """Reads positions, not rows: split ``i`` of a replay as one piece of its rows' positions (``firsts[i]``
    is the position of its first row)."""

    def __init__(self, firsts: npt.NDArray[np.int64]) -> None:
        self._firsts = firsts

    def read(self, split: Split, position: int, offset: int) -> Iterator[Piece]:
        if offset < split.num_rows:
            first = int(self._firsts[position])
            column = pa.array(np.arange(first + offset, first + split.num_rows, dtype=np.int64))
            yield Piece(pa.RecordBatch.from_arrays([column], names=["position"]), position, offset, split.num_rows, None)

    def close(self) -> None:
        pass


def window_positions(replay: Replay[Slot], firsts: npt.NDArray[np.int64], *,
                     options: OrderOptions) -> npt.NDArray[np.int64]:
    """The positions of the rows of the shuffle window ``replay`` stands in, in the order they are read (before
    the window's permutation; ``firsts``: the position of the first row of each of the replay's splits)."""
    lengths = split_rows(replay.splits)
    if options.interleave == 1:   # one lane: its split from its offset, then the next splits, in arithmetic
        return _serial_positions(replay.start, firsts, lengths, options.shuffle_buffer_size)
    return _rotation_positions(replay.start, replay.splits, firsts, options.shuffle_buffer_size,
                               options.interleave, block_size_for(options.batch_size, options.interleave))


def _rotation_positions(start: Cursor, splits: Sequence[Split], firsts: npt.NDArray[np.int64], limit: int,
                        lanes: int, block_size: int | None) -> npt.NDArray[np.int64]:
    """The first ``limit`` positions of the stream of ``splits`` from ``start``, read by ``lanes`` lanes in
    rotation: :func:`~arrowstream._core.interleave.interleave_runs` itself, over positions instead of rows."""
    readers = [_PositionReader(firsts) for _ in range(lanes)]
    begin = dataclasses.replace(start, window_index=0, window_offset=0)
    parts, size = [], 0
    for run in interleave_runs(readers, splits, block_size, begin):
        rows = min(run.num_rows, limit - size)
        parts.append(run.batch.column(0).to_numpy()[:rows])
        size += rows
        if size >= limit:
            break
    stream: npt.NDArray[np.int64] = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return stream


def _serial_positions(start: Cursor, firsts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
                      limit: int) -> npt.NDArray[np.int64]:
    """The first ``limit`` positions of a stream of one lane (``interleave=1``) from ``start``, as
    :func:`~arrowstream._core.interleave.interleave_runs` reads it: the lane's split from its offset (if it has
    one), then every split from ``next_split_index`` on."""
    if not start.lanes:
        return np.zeros(0, dtype=np.int64)
    (position, offset), following = start.lanes[0], slice(start.next_split_index, None)
    head = position < len(lengths)
    begins = np.concatenate([firsts[position:position + 1] + offset if head else [], firsts[following]])
    counts = np.concatenate([lengths[position:position + 1] - offset if head else [], lengths[following]])
    begins, counts = begins.astype(np.int64), counts.astype(np.int64)
    before = np.cumsum(counts) - counts
    keep = before < limit
    begins, counts, before = begins[keep], np.minimum(counts[keep], limit - before[keep]), before[keep]
    total = int(counts.sum())
    return np.repeat(begins - before, counts) + np.arange(total, dtype=np.int64)


def replay_positions(replay: Replay[Slot], window: npt.NDArray[np.int64], *, seed: int,
                     epoch: int) -> npt.NDArray[np.int64]:
    """The positions of the rows ``replay`` hands out, in no order: rows ``window_offset`` to ``window_offset +
    rows - 1`` of its ``window`` (:func:`window_positions`) in the order
    :func:`~arrowstream._core.window.shuffle_windows` permutes it, seeded by the epoch, the slot and the window."""
    offset = replay.start.window_offset
    places = permutation_part(len(window), window_seed(seed, epoch, replay.slot, replay.start.window_index), offset,
                              offset + replay.rows)
    chosen: npt.NDArray[np.int64] = window[places]
    return chosen


@dataclasses.dataclass(frozen=True)
class Rank:
    """Where a ledger belongs: the rank's rows of its epoch, the rank, the world size and the stream options."""

    rows: EpochRows
    rank: int
    world_size: int
    options: OrderOptions


def rows_left(plan: PlanView, work: Work, epoch: int, rank: Rank, where: str) -> Tally:
    """Check the rows ``work`` (a ledger of ``epoch``) leaves against the rank's rows of the epoch, as the
    module docstring says; return their tally."""
    rows, leased = rank.rows, rank.rows.head_rows + work.fresh_from_row
    # explicit splits: among the leased rows, each row once
    firsts, lengths = _leased(rows, work.splits, leased, f"{where}.splits",
                              "which the fresh rows leave too: the ledger leaves some rows twice")
    order = np.argsort(firsts, kind="stable")
    overlap = np.flatnonzero(firsts[order][1:] < (firsts + lengths)[order][:-1])
    if len(overlap):
        first, second = sorted((int(order[overlap[0]]), int(order[overlap[0] + 1])))
        raise StateError(f"the state's {where} leaves some rows twice: its splits[{first}] and splits[{second}] "
                         f"overlap; {REMEDY}")
    left = Tally.of_range(leased, rows.num_rows - leased)
    for first, length in zip(firsts.tolist(), lengths.tolist(), strict=True):
        left += Tally.of_range(first, length)
    # replays: windows of this rank's old workers over leased rows, their rows inside the window
    windows: dict[tuple[Any, ...], npt.NDArray[np.int64]] = {}
    for number, replay in enumerate(work.replays):
        name = f"{where}.replays[{number}]"
        inherited = _head_part(replay, rows.head)
        if inherited is not None:   # the rest of an old window the re-planned stretch replays: its rows in order
            left += Tally.of_range(inherited, replay.rows)
            continue
        window = _replay_window(replay, rows, leased, rank, name, windows)
        offset = replay.start.window_offset
        if offset + replay.rows > len(window):
            raise StateError(f"the state's {name} leaves {replay.rows} row(s) from row {offset} of a shuffle window of "
                             f"{len(window)} rows (the one its start cursor stands in, over its splits); {REMEDY}")
        left += Tally.of_positions(replay_positions(replay, window, seed=rank.options.seed, epoch=epoch))
    return left


def _head_part(replay: Replay[Slot], head: Sequence[Replay[Slot]]) -> int | None:
    """The position of the first row ``replay`` hands out where it is a part of one of ``head``'s replays (the
    same old window, from a later row on, within it): None where it is none."""
    at = 0
    for item in head:
        offset = replay.start.window_offset - item.start.window_offset
        if (item.slot, item.splits) == (replay.slot, replay.splits) \
                and dataclasses.replace(item.start, window_offset=0) == dataclasses.replace(replay.start, window_offset=0) \
                and 0 <= offset and offset + replay.rows <= item.rows:
            return at + offset
        at += item.rows
    return None


def _leased(rows: EpochRows, splits: Sequence[Split], leased: int, name: str,
            why: str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Where ``splits`` (the ledger's ``name``) start in the rank's epoch, and their rows: checked to be rows of
    the epoch leased before ``leased`` (``why``: what it means when they are not)."""
    firsts = rows.place(splits)
    lengths = split_rows(splits)
    for index in np.flatnonzero(firsts < 0)[:1]:
        raise _outside(splits[int(index)], f"{name}[{index}]")
    for index in np.flatnonzero(firsts + lengths > leased)[:1]:
        raise StateError(f"the state's {name}[{index}] ({shorten(_as_list(splits[int(index)]))}) names rows "
                         f"{int(firsts[index])} to {int(firsts[index] + lengths[index]) - 1} of the rank's epoch, "
                         f"from fresh_from_row={leased - rows.head_rows} on, {why}; {REMEDY}")
    return firsts, lengths


def _replay_window(replay: Replay[Slot], rows: EpochRows, leased: int, rank: Rank, name: str,
                   windows: dict[tuple[Any, ...], npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    """The positions of the window ``replay`` stands in, as read (see :func:`window_positions`), checked: a
    window of an old worker of this rank over leased rows. ``windows`` keeps those already read (the parts of
    one window, cut by leases, share it)."""
    options, slot = rank.options, replay.slot
    if (slot.world_size, slot.rank) != (rank.world_size, rank.rank):
        raise StateError(f"the state's {name}.slot is a worker of rank {slot.rank} of world_size={slot.world_size}, but "
                         f"the ledger is rank {rank.rank}'s of world_size={rank.world_size}: a replay is the window of "
                         f"an old worker of the same rank, or a part of one its re-planned epoch replays; {REMEDY}")
    if not options.shuffle_buffer_size:
        raise StateError(f"the state's {name} replays a shuffle window, but shuffle_buffer_size=0; {REMEDY}")
    start = replay.start   # its replay fields say how many replays the worker had read before: not read here
    firsts, lengths = _leased(rows, replay.splits, leased, f"{name}.splits",
                              "which its workers had not leased: a window holds leased rows only")
    _check_start(start, lengths.tolist(), options, f"{name}.start")
    key = (replay.splits, dataclasses.replace(start, window_offset=0))
    window = windows.get(key)
    if window is None:
        window = windows[key] = window_positions(replay, firsts, options=options)
    return window


def _check_start(start: Cursor, lengths: list[int], options: OrderOptions, where: str) -> None:
    """A replay's cursor, where its window starts: a rotation of ``interleave`` lanes at most over the replay's
    splits. A lane may stand on a split past them, unopened (offset 0): a dynamic worker's lanes stand on the
    splits it would lease next, and one that leased no more reads nothing there. Which rows the window then
    holds is checked by the count and the sums (:func:`rows_left`)."""
    block_size = block_size_for(options.batch_size, options.interleave)
    if len(start.lanes) > options.interleave:
        raise StateError(f"the state's {where} has {len(start.lanes)} lanes, but interleave={options.interleave}; "
                         f"{REMEDY}")
    for number, (position, offset) in enumerate(start.lanes):
        rows = lengths[position] if position < len(lengths) else 0
        if offset > rows:
            raise StateError(f"the state's {where}.lanes[{number}] is [{position}, {offset}], but split {position} of "
                             f"the replay has {rows} row(s); {REMEDY}")
    if block_size is None and (start.turn_index or start.block_offset):
        raise StateError(f"the state's {where} has turn_index={start.turn_index}, block_offset={start.block_offset}, "
                         f"but interleave=1 has no rotation of blocks; {REMEDY}")
    if block_size is not None and start.block_offset >= block_size:
        raise StateError(f"the state's {where} has block_offset={start.block_offset}, but a block holds {block_size} "
                         f"rows; {REMEDY}")


def _as_list(split: Split) -> list[int]:
    return [split.file_index, split.unit_start, split.unit_stop, split.row_start, split.num_rows, split.num_bytes]


def _outside(split: Split, where: str) -> StateError:
    return StateError(f"the state's {where} names rows {shorten(_as_list(split))} that the rank does not read in this "
                      f"epoch; {REMEDY}")


def yielded_to_dict(rank: Rank, left: Tally) -> dict[str, int]:
    """The ``yielded`` field of a ledger that leaves the rows of ``left``: the rest of the rank's rows of the epoch."""
    yielded = rank.rows.tally - left
    return {"rows": yielded.rows, "position_sum": yielded.sum, "position_square_sum": yielded.square_sum}


def check_yielded(value: Any, rank: Rank, left: Tally, epoch: int, where: str) -> None:
    """Check a ledger's ``yielded`` field (None: a state of version 8, which has none) against the rows it
    leaves, ``left``."""
    if value is None:
        return
    fields = Fields(value, f"{where}.yielded")
    epoch_rows = rank.rows.tally
    yielded = Tally(fields.integer("rows", 0, epoch_rows.rows),
                    fields.integer("position_sum", 0, POSITION_SUM_MODULUS - 1),
                    fields.integer("position_square_sum", 0, POSITION_SUM_MODULUS - 1))
    found = yielded + left
    if found.rows != epoch_rows.rows:
        change = "repeat" if found.rows > epoch_rows.rows else "lose"
        raise StateError(f"the state's {where} leaves {left.rows} row(s) of epoch {epoch} and its yielded.rows counts "
                         f"{yielded.rows} yielded: {found.rows} in all, but the rank reads {epoch_rows.rows} rows in the "
                         f"epoch, so resuming would {change} {abs(found.rows - epoch_rows.rows)} row(s) (its replays, "
                         f"splits or fresh_from_row do not say what the checkpoint left); {REMEDY}")
    if found != epoch_rows:
        raise StateError(f"the state's {where} leaves {left.rows} row(s) of epoch {epoch}, as many as it should, but not "
                         f"the rows that its yielded.position_sum and yielded.position_square_sum leave out: its "
                         f"replays, splits or epoch name other rows than the checkpoint left, and resuming would lose "
                         f"some rows and repeat others; {REMEDY}")
