"""A worker's splits read ``K`` at a time, their rows handed out in rotation, a block per turn.

The splits of a worker (in its reading order) are read by up to ``K`` *lanes*. On its turn a
lane hands out a block of ``block_size`` rows and the turn passes to the next lane. A lane whose
split runs dry opens the next split nobody has opened yet, in the middle of a block if need be;
with none left, it leaves the rotation. Every decision depends only on how many rows each split
yields, never on how the reader cut them into pieces, so the order is a pure function of the
data and can be replayed from any :class:`~arrowstream._core.cursor.Cursor`.

With ``K = 1`` there is one lane and no blocks: the splits are read one after the other.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from .cursor import Cursor, Run
from .piece import Piece
from .plan_types import Split, split_available


class PieceReader(Protocol):
    """What a lane reads with: :class:`~arrowstream._worker.reader.SplitReader`, or a test's reader."""

    def read(self, split: Split, position: int, offset: int) -> Iterator[Piece]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class _Turn:
    """The rotation just before a piece of lane ``turn`` is handed out."""

    lanes: tuple[tuple[int, int], ...]
    next_split_index: int
    turn_index: int
    block_offset: int         # rows of the current block already handed out
    block_size: int | None    # None: one lane, no rotation


def _cursor_after_piece(before: _Turn, piece: Piece, rows: int) -> Cursor:
    """The cursor once the first ``rows`` rows of ``piece`` (lane ``before.turn_index``) are handed out."""
    lanes = list(before.lanes)
    lanes[before.turn_index] = (piece.position, piece.offset_of(rows) if rows < piece.num_rows else piece.end)
    if before.block_size is None:
        return Cursor(tuple(lanes), before.next_split_index)
    turn, taken = before.turn_index, before.block_offset + rows
    if taken >= before.block_size:
        turn, taken = (turn + 1) % len(lanes), 0
    return Cursor(tuple(lanes), before.next_split_index, turn, taken)


class _Lane:
    """One open split of the rotation and where its reading stands."""

    __slots__ = ("offset", "pieces", "position", "reader", "rest")

    def __init__(self, position: int, offset: int, reader: PieceReader) -> None:
        self.position = position
        self.offset = offset
        self.reader = reader
        self.pieces: Iterator[Piece] | None = None
        self.rest: Piece | None = None      # the part of a piece that did not fit the last block


def interleave_runs(readers: Sequence[PieceReader], splits: Sequence[Split], block_size: int | None,
                     start: Cursor) -> Iterator[Run]:
    """The rows of ``splits`` from ``start`` on, read by ``len(start.lanes)`` lanes in rotation.

    ``readers`` has one reader per lane (each keeps its own file open); ``block_size`` is the
    block a lane hands out per turn, ``None`` for no rotation (one lane). Runs with no rows mark
    source rows a filter dropped, so the cursor can move past them.
    """
    # leased splits (dynamic assignment) grow as the lanes ask for them (see split_available): their
    # length now says nothing of the next split's index
    lanes = [_Lane(position, offset, readers[k]) for k, (position, offset) in enumerate(start.lanes)]
    next_split = start.next_split_index if hasattr(splits, "lease_through") else min(start.next_split_index, len(splits))
    turn, taken = start.turn_index, start.block_offset
    while lanes:
        lane = lanes[turn]
        if lane.pieces is None:
            lane.pieces = (lane.reader.read(splits[lane.position], lane.position, lane.offset)
                           if split_available(splits, lane.position) else iter(()))
        piece = lane.rest or next(lane.pieces, None)
        lane.rest = None
        if piece is None:  # this split is done: open the next one, or leave the rotation
            if split_available(splits, next_split):
                lane.position, lane.offset, lane.pieces = next_split, 0, None
                next_split += 1
            else:
                lanes.pop(turn)
                lane.reader.close()
                turn, taken = (turn % len(lanes) if lanes else 0), 0
            continue
        if block_size is not None and piece.num_rows > block_size - taken:
            lane.rest = piece.tail(block_size - taken)
            piece = piece.head(block_size - taken)
        before = _Turn(tuple((other.position, other.offset) for other in lanes), next_split, turn, taken,
                       block_size)
        yield Run(piece.batch, functools.partial(_cursor_after_piece, before, piece))
        lane.offset = piece.end
        if block_size is not None:
            taken += piece.num_rows
            if taken >= block_size:
                turn, taken = (turn + 1) % len(lanes), 0


def block_size_for(batch_size: int, interleave: int) -> int | None:
    """Rows a lane hands out per turn: a batch holds about equal parts of ``interleave`` splits."""
    return None if interleave == 1 else -(-batch_size // interleave)
