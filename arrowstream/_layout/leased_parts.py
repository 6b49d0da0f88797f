"""A dynamic worker's leases as the parts of one source: how a worker under ``assignment="dynamic"`` is read by the
one stream.

What a worker leases (:class:`~arrowstream._layout.ledger.LeasedShare`: replays, then splits) is one source's parts
that grow while it reads (:class:`LeasedParts`): each leased replay is a part read as its old worker read it (its
seeds, from its cursor, capped at its rows), then all its leased splits are one part with the slot's seeds whose
split list grows as leases are taken (window continuity across leases included). The rows are known only by reading
(the pool decides when it is dry), and the last rows, fewer than a batch, may be stitched with other workers'
(``MixStream``'s ``last_pieces``). The parts read with the worker's own cursors (``replay_index`` /
``replay_offset`` over its replays, then its splits' cursor), so where the stream stands is the worker's
:class:`~arrowstream._state.worker.WorkerState` as it always was: the ledger (:mod:`arrowstream._layout.ledger`)
reads it (``tests/test_dynamic_stream.py`` reads both ways).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .._core.cursor import Cursor, Position, Run
from .._core.order import Slot, window_seed
from .._core.plan_types import split_rows
from .._core.stream import open_runs
from .._mixing.parts import Part, Parts
from .._mixing.source_rows import ReadAhead, SourceRows
from .._mixing.stream import MixSlot, MixStream
from .._state.mixture import CompactCursor, SourceCursor
from .._state.worker import WorkerState
from .elastic import replay_runs, with_replay_index
from .ledger import LeasedShare, LeasedSplits, start_cursor

if TYPE_CHECKING:
    from .._core.interleave import PieceReader

END = Cursor((), 1 << 62, replay_index=1 << 62)
"""Where a dynamic worker stands once its epoch is complete: past every replay and split it could lease."""


class LeasedParts(Parts):
    """A worker's ``share`` as a source's parts, leased as they are asked for (:meth:`has_part`): replay ``i`` is part
    ``i``, the splits (growing as leases are taken) the part after the replays. Each part reads itself
    (:attr:`Part.runs`) with the worker's cursors, as ``leased_runs`` read the worker's rows before (``tests/reference_stream.py``)."""

    def __init__(self, readers: Sequence[PieceReader], share: LeasedShare, *, seed: int, epoch: int, slot: Slot,
                 batch_size: int, interleave: int, buffer_rows: int, read_ahead: ReadAhead | None) -> None:
        self._readers, self._share = readers, share
        self._seed, self._epoch, self._slot = seed, epoch, slot
        self._batch_size, self._interleave, self._buffer_rows = batch_size, interleave, buffer_rows
        self._read_ahead = read_ahead

    def __len__(self) -> int:   # the parts leased so far
        share = self._share
        return len(share.replays) + (1 if share.splits else 0)

    def has_part(self, index: int) -> bool:
        """Whether the worker has a part ``index``, leasing until it knows."""
        share = self._share
        if share.replay(index) is not None:
            return True
        return index == len(share.replays) and share.has_split(0)

    def part(self, index: int) -> Part:
        share = self._share
        if index < len(share.replays):
            replay = share.replays[index]
            return Part(replay.splits, replay.rows, functools.partial(window_seed, self._seed, self._epoch, replay.slot),
                        replay.start, functools.partial(self._replay_runs, index))
        return Part(tuple(share.splits), int(split_rows(share.splits).sum()),
                    functools.partial(window_seed, self._seed, self._epoch, self._slot), None,
                    functools.partial(self._split_runs, index))

    def rows_before(self, index: int) -> int:   # rows known so far (an upper bound: read to know)
        return sum(part.rows for part in self[:index])

    def _replay_runs(self, index: int) -> tuple[Iterator[Run], Cursor]:
        """Replay ``index`` read again as its old worker read it, with the worker's cursors; the stream stands at
        the start before its first row, or past the replays before it."""
        if self._read_ahead is not None:
            self._read_ahead.begin(())   # none while replaying
        runs = replay_runs(self._readers, self._share.replays[index], index, 0, Cursor((), 0), seed=self._seed,
                           epoch=self._epoch, batch_size=self._batch_size, interleave=self._interleave,
                           buffer_rows=self._buffer_rows)
        return runs, start_cursor(self._interleave) if index == 0 else Cursor((), 0, replay_index=index)

    def _split_runs(self, index: int) -> tuple[Iterator[Run], Cursor]:
        """The worker's splits (those leased, and those it leases as it reads them) through the usual pipeline with
        its slot's seeds, after ``index`` replays."""
        splits = LeasedSplits(self._share)
        if self._read_ahead is not None:
            self._read_ahead.begin(splits)
        base = dataclasses.replace(start_cursor(self._interleave), replay_index=index)
        runs = open_runs(self._readers, splits, batch_size=self._batch_size, interleave=self._interleave,
                         buffer_rows=self._buffer_rows, window_seed=functools.partial(window_seed, self._seed,
                                                                                      self._epoch, self._slot),
                         start=base)
        if index:
            runs = (with_replay_index(run, index) for run in runs)
        return runs, start_cursor(self._interleave) if index == 0 else Cursor((), 0, replay_index=index)


class LeasedStart:
    """A dynamic worker's state ``state`` (at the start of its epoch) as the start of the one stream over its
    leases: the positions hold the worker's cursor as its parts give it; the end of the epoch is :data:`END`."""

    def __init__(self, state: WorkerState) -> None:
        if state.rows or state.batches or state.epoch_complete:
            raise AssertionError(f"a dynamic worker starts its epoch from its first lease, not from {state!r}")
        self._state, self._first = state, state.cursor
        self.rows, self.batches, self.rows_dropped = 0, 0, state.rows_dropped
        self.epoch_complete = False
        self.source = SourceCursor(0, None, 0)

    def place(self, rows: int, batches: int, rows_dropped: int, complete: bool,
              cursors: tuple[CompactCursor, ...]) -> Position:
        """The position after a batch (or piece): the counters, the cursor of where the worker's one source stands."""
        if complete:
            return Position(END, rows, batches, rows_dropped)
        cursor = cursors[0][1]
        return Position(self._first if cursor is None else cursor, rows, batches, rows_dropped)

    def state_at(self, position: Position, names: Sequence[str], complete: bool) -> WorkerState:
        """The worker state at ``position`` (``complete``: whether the epoch is complete there)."""
        del names   # one source
        state = self._state   # (built whole: dataclasses.replace costs a few us a batch)
        return WorkerState(state.data, state.options, state.epoch, state.slot, END if complete else position.cursor,
                           position.rows, position.batches, position.rows_dropped, complete, state.elastic)

    def __repr__(self) -> str:
        return f"LeasedStart({self._state!r})"


def leased_stream(readers: Sequence[PieceReader], share: LeasedShare, start: WorkerState, *, seed: int,
                  batch_size: int, interleave: int, buffer_rows: int, read_ahead: ReadAhead | None = None,
                  last_pieces: Callable[[], list[tuple[int, Any]]] | None = None) -> MixStream[Position, WorkerState]:
    """The one stream of a dynamic worker's leases (``share``, of the slot and epoch of ``start``): its batches, then
    its last rows, as pieces by ``last_pieces`` when given (see :func:`~arrowstream._layout.leases.last_pieces`)."""
    slot, epoch = start.slot, start.epoch
    parts = LeasedParts(readers, share, seed=seed, epoch=epoch, slot=slot, batch_size=batch_size,
                        interleave=interleave, buffer_rows=buffer_rows, read_ahead=read_ahead)
    begin = LeasedStart(start)
    where = f"the leases of rank {slot.rank} worker {slot.worker_id} in epoch {epoch}"
    source = SourceRows("dataset", readers, parts, batch_size=batch_size, interleave=interleave, buffer_rows=buffer_rows,
                        start=begin.source, url=where, rows_known=False, whole_cursors=True)
    # drop_last and even_batches are in the leased work already (cut to whole batches); the end is the pool's
    return MixStream([source], [0], cast=None, batch_size=batch_size, drop_last=False, max_batches=None,
                     batch_order=None, seed=seed,
                     slot=MixSlot(epoch, slot.rank, slot.world_size, slot.worker_id, slot.num_workers),
                     start=begin, ends_when_asked=True, last_pieces=last_pieces)
