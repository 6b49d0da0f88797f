"""A dataset worker's state from the stream of one source, both ways, without a format change.

A dataset slot's share is read as one source's parts (``arrowstream._layout.share_parts``): part ``i`` is replay
``i`` of the share, the splits are the part after the replays. A dataset :class:`~arrowstream._core.cursor.Cursor`
counts the replays instead (``replay_index`` / ``replay_offset`` inside the replays, then the splits' cursor with
``replay_index = len(replays)``), so a :class:`~arrowstream._state.worker.WorkerState` (version 10, unchanged) maps to
where the source stands (:func:`source_cursor`) and back (:func:`dataset_cursor`). A replay resumed from an offset
is read from the old worker's cursor moved that far into its window, as ``_layout.elastic.replay_runs`` reads it.
:class:`DatasetStart` is what the stream asks of its start: where its source starts, the positions it travels with, and the state at one.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .._core.cursor import Cursor, Position
from .mixture import CompactCursor, SourceCursor
from .worker import WorkerState

DATASET = "dataset"
"""The name of a dataset slot's one source (in its stream, and the errors of a part that gave fewer rows)."""


def source_cursor(cursor: Cursor, rows: int, replay_starts: Sequence[Cursor]) -> SourceCursor:
    """Where the source of a share with replays starting at ``replay_starts`` stands at the dataset cursor
    ``cursor``, ``rows`` rows of the share handed out."""
    index = cursor.replay_index
    if index < len(replay_starts):
        if not cursor.replay_offset:
            return SourceCursor(index, None, rows)
        start = replay_starts[index]
        return SourceCursor(index, replace(start, window_offset=start.window_offset + cursor.replay_offset), rows)
    return SourceCursor(len(replay_starts), replace(cursor, replay_index=0, replay_offset=0), rows)


def dataset_cursor(place: CompactCursor, replay_rows: Sequence[int], num_splits: int, interleave: int) -> Cursor:
    """The dataset cursor of a source standing at ``place`` (``(part, cursor or its fields or None, taken)``) in a share
    of replays of ``replay_rows`` rows and ``num_splits`` splits read ``interleave`` at a time."""
    return _Mapping(tuple(replay_rows), num_splits, interleave).cursor(place)


@dataclass(frozen=True)
class _Mapping:
    """:func:`dataset_cursor` of one share, with what it needs for every batch computed once."""

    replay_rows: tuple[int, ...]
    num_splits: int
    interleave: int
    replays_before: tuple[int, ...] = field(init=False)
    first_split: Cursor = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "replays_before", (0, *itertools.accumulate(self.replay_rows)))
        object.__setattr__(self, "first_split", Cursor.start(self.num_splits, self.interleave))

    def cursor(self, place: CompactCursor) -> Cursor:
        part, fields, taken = place
        if isinstance(fields, Cursor):
            fields = (fields.lanes, fields.next_split_index, fields.turn_index, fields.block_offset,
                      fields.window_index, fields.window_offset)
        replays = len(self.replay_rows)
        first = self.first_split
        if part < replays:
            offset = taken - self.replays_before[part]
            if offset >= self.replay_rows[part]:
                return Cursor(first.lanes, first.next_split_index, first.turn_index, first.block_offset,
                              first.window_index, first.window_offset, part + 1, 0)
            return Cursor(first.lanes, first.next_split_index, first.turn_index, first.block_offset,
                          first.window_index, first.window_offset, part, offset)
        if fields is None:
            fields = (first.lanes, first.next_split_index, first.turn_index, first.block_offset, first.window_index,
                      first.window_offset)
        return Cursor(fields[0], fields[1], fields[2], fields[3], fields[4], fields[5], replays, 0)

    def end(self) -> Cursor:
        return Cursor((), self.num_splits, replay_index=len(self.replay_rows))


class DatasetStart:
    """A dataset worker's state ``state`` as the start of the stream of one source over its share (replays of
    ``replay_starts`` / ``replay_rows``, then ``num_splits`` splits read ``interleave`` at a time): the counters the
    stream starts from, where its source starts (:attr:`source`), the :class:`~arrowstream._core.cursor.Position`
    after each batch (:meth:`place`) and the worker state at one (:meth:`state_at`)."""

    def __init__(self, state: WorkerState, replay_starts: Sequence[Cursor], replay_rows: Sequence[int],
                 num_splits: int, interleave: int) -> None:
        self._state = state
        self._mapping = _Mapping(tuple(replay_rows), num_splits, interleave)
        self._end = self._mapping.end()
        self._replays = len(replay_rows)
        self.rows, self.batches, self.rows_dropped = state.rows, state.batches, state.rows_dropped
        self.epoch_complete = state.epoch_complete
        self.source = source_cursor(state.cursor, state.rows, replay_starts)

    @property
    def cursors(self) -> dict[str, SourceCursor]:
        """Where the one source starts, by its name."""
        return {DATASET: self.source}

    def place(self, rows: int, batches: int, rows_dropped: int, complete: bool,
              cursors: tuple[CompactCursor, ...]) -> Position:
        """The position after a batch: the counters, and the dataset cursor of where the one source stands (the
        end of the epoch once it is complete)."""
        if complete:
            return Position(self._end, rows, batches, rows_dropped)
        part, cursor, _ = place = cursors[0]
        if (part == self._replays and isinstance(cursor, Cursor) and cursor.replay_index == part
                and not cursor.replay_offset):   # in the splits, the source's cursor as it is (an epoch not re-planned)
            return Position(cursor, rows, batches, rows_dropped)
        return Position(self._mapping.cursor(place), rows, batches, rows_dropped)

    def state_at(self, position: Position, names: Sequence[str], complete: bool) -> WorkerState:
        """The worker state at ``position`` (``complete``: whether the epoch is complete there)."""
        del names   # one source
        return replace(self._state, cursor=self._end if complete else position.cursor, rows=position.rows,
                       batches=position.batches, rows_dropped=position.rows_dropped, epoch_complete=complete)

    def __repr__(self) -> str:
        return f"DatasetStart({self._state!r})"


