"""Where a worker stands in its epoch, and rows on their way to a batch that know it.

A :class:`Cursor` names the next row of a worker's stream in terms of its reading order alone,
so the rows that follow can be re-read from it: the splits open in rotation (``lanes``), the
next split a lane will open, whose turn it is, and, with a shuffle buffer, which window of the
stream is being handed out and how far. A :class:`Run` is consecutive rows of the stream that
can say where the stream stands after any prefix of them, so a batch cut anywhere has an exact
cursor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import StateError
from .fields import REMEDY, Fields, check_int, shorten


@dataclass(frozen=True, slots=True)
class Cursor:
    """The position just past the last row handed out, in one worker's epoch.

    With a shuffle buffer, ``lanes``/``next_split_index``/``turn_index``/``block_offset`` are
    where the current window starts in the interleaved stream, and ``window_offset`` rows of it
    (in shuffled order) were handed out; without one, they are the position itself and the
    window fields are 0. In an epoch re-planned for a new topology (elastic resume), a worker
    first reads the rest of old workers' shuffle windows (``replay_index``/``replay_offset``),
    then its splits; the replay fields are 0 in every other epoch.
    """

    lanes: tuple[tuple[int, int], ...]   # (split index in reading order, source row offset) per open split
    next_split_index: int                # the split the next lane to run dry opens
    turn_index: int = 0                  # the lane whose block comes next
    block_offset: int = 0                # rows of that block already handed out
    window_index: int = 0                # the shuffle window, counted from the start of the epoch
    window_offset: int = 0               # rows of that window already handed out
    replay_index: int = 0                # elastic epoch: the replayed window of the old topology being read
    replay_offset: int = 0               # rows of that replay already handed out

    def __reduce__(self) -> tuple[type[Cursor], tuple[Any, ...]]:
        # positions travel with every batch of a chunk: plain arguments unpickle several times faster than the
        # field-by-field state a slotted dataclass pickles
        return Cursor, (self.lanes, self.next_split_index, self.turn_index, self.block_offset, self.window_index,
                        self.window_offset, self.replay_index, self.replay_offset)

    @classmethod
    def start(cls, num_splits: int, num_lanes: int) -> Cursor:
        """The first row of an epoch of ``num_splits`` splits read ``num_lanes`` at a time."""
        opened = min(num_lanes, num_splits)
        return cls(tuple((index, 0) for index in range(opened)), opened)

    @classmethod
    def end(cls, num_splits: int) -> Cursor:
        """Past the last row of an epoch of ``num_splits`` splits."""
        return cls((), num_splits)

    def at_end(self, split_rows: Sequence[int]) -> bool:
        """True when no row is left after this cursor in an epoch of splits of ``split_rows`` rows
        (counted before the filter: with one, rows the filter drops may be all that is left)."""
        num_splits = len(split_rows)
        return (self.window_offset == 0
                and all(split_rows[index] == 0 for index in range(self.next_split_index, num_splits))
                and all(index >= num_splits or offset >= split_rows[index] for index, offset in self.lanes))

    def to_dict(self) -> dict[str, Any]:
        return {"lanes": [list(lane) for lane in self.lanes], "next_split_index": self.next_split_index,
                "turn_index": self.turn_index, "block_offset": self.block_offset,
                "window_index": self.window_index, "window_offset": self.window_offset,
                "replay_index": self.replay_index, "replay_offset": self.replay_offset}

    @classmethod
    def from_dict(cls, cursor: Any, where: str = "cursor") -> Cursor:
        """Parse the ``cursor`` of a worker state: every field an int >= 0, the lanes distinct splits
        opened before ``next_split_index``, ``turn_index`` one of them; else ``StateError``. How
        far each may go depends on the plan (see :mod:`arrowstream._state.position`)."""
        fields = Fields(cursor, where)
        lanes = []
        for number, lane in enumerate(fields.sequence("lanes")):
            name = f"{where}.lanes[{number}]"
            if not isinstance(lane, (list, tuple)) or len(lane) != 2:
                raise StateError(f"the state's {name} is {shorten(lane)}, expected [split index, row offset]; {REMEDY}")
            lanes.append((check_int(lane[0], f"{name}[0] (split index)"), check_int(lane[1], f"{name}[1] (row offset)")))
        parsed = cls(tuple(lanes), *(fields.integer(key) for key in (
            "next_split_index", "turn_index", "block_offset", "window_index", "window_offset", "replay_index",
            "replay_offset")))
        positions = [index for index, _ in parsed.lanes]
        if len(set(positions)) != len(positions) or any(p >= parsed.next_split_index for p in positions):
            raise StateError(f"the state's {where} has lanes {shorten(positions)} with next_split_index="
                             f"{parsed.next_split_index}: lanes read distinct splits opened before the next one; {REMEDY}")
        if parsed.turn_index >= max(len(lanes), 1):
            raise StateError(f"the state's {where}.turn_index is {parsed.turn_index}, but there are {len(lanes)} "
                             f"lane(s); {REMEDY}")
        return parsed


class Run:
    """Consecutive rows of a worker's stream; ``after(n)`` is the cursor past the first ``n``."""

    __slots__ = ("_after", "_base", "batch")

    def __init__(self, batch: pa.RecordBatch, after: Callable[[int], Cursor], base: int = 0) -> None:
        self.batch = batch
        self._after = after
        self._base = base

    @property
    def num_rows(self) -> int:
        return int(self.batch.num_rows)

    def after(self, rows: int) -> Cursor:
        """The cursor once the first ``rows`` rows of this run are handed out."""
        return self._after(self._base + rows)

    def head(self, rows: int) -> Run:
        """The first ``rows`` rows, zero-copy."""
        return Run(self.batch.slice(0, rows), self._after, self._base)

    def tail(self, rows: int) -> Run:
        """The rows from ``rows`` on, zero-copy."""
        return Run(self.batch.slice(rows), self._after, self._base + rows)


@dataclass(frozen=True)
class Position:
    """A worker's cursor and counters right after one batch of a chunk."""

    cursor: Cursor
    rows: int
    batches: int
    rows_dropped: int

    def __reduce__(self) -> tuple[type[Position], tuple[Any, ...]]:
        return Position, (self.cursor, self.rows, self.batches, self.rows_dropped)   # (see Cursor.__reduce__)
