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
    def from_dict(cls, cursor: dict[str, Any]) -> Cursor:
        """Parse the ``cursor`` of a worker state; ``KeyError``/``TypeError``/``ValueError`` if malformed."""
        lanes = tuple((int(index), int(offset)) for index, offset in cursor["lanes"])
        return cls(lanes, int(cursor["next_split_index"]), int(cursor["turn_index"]), int(cursor["block_offset"]),
                   int(cursor["window_index"]), int(cursor["window_offset"]), int(cursor["replay_index"]),
                   int(cursor["replay_offset"]))


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
