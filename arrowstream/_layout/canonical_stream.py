"""A worker's stream under ``order="canonical"``: the chunks of its canonical slots, side by side.

A (rank, worker) slot reads contiguous canonical slots (:mod:`arrowstream._layout.canonical`), each one stream of its
own (a dataset slot's stream, :mod:`arrowstream._layout.share_parts`, in batches of ``chunk`` rows). Its batch ``k``
is chunk ``k`` of each, in canonical order: :class:`CanonicalStream`. Every canonical slot yields the same number
of chunks, so they end together; one that does not is an error, never a batch short of a slot's rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .._core.fields import REMEDY
from .._core.order import Slot
from .._mixing.stream import MixStream
from .._state.canonical import CanonicalState
from .._state.versions import DATASET
from ..errors import StateError, WorkerError


@dataclass(frozen=True)
class CanonicalPosition:
    """Where a canonical worker stands after a batch: each of its canonical slots' position, and the batches it handed
    out past them (the same for every canonical slot), with each canonical slot's rows in them.

    A dataset's worker reads its canonical slots a span of batches at a time; the position after each batch inside a
    span is the positions where the span started and the batches past them (a resume passes over those again), so a
    span costs one position of each canonical slot, not one per batch (a canonical slot's batches are a few rows). A
    mixture's has a position after every batch: a state past them could not say its rows of each source."""

    positions: tuple[Any, ...]   # a dataset's Position, a mixture's MixPosition
    past: int = 0
    past_rows: tuple[int, ...] = ()

    def __reduce__(self) -> tuple[type[CanonicalPosition], tuple[Any, ...]]:
        # it travels with every part of a chunk: plain arguments (the positions where a span starts, shared by the
        # span's batches, pickled once per chunk)
        return CanonicalPosition, (self.positions, self.past, self.past_rows)

    @property
    def batches(self) -> int:
        return int(self.positions[0].batches) + self.past

    @property
    def rows(self) -> int:
        return sum(int(position.rows) for position in self.positions) + sum(self.past_rows)


FILL_ROWS = 65_536
"""Rows a canonical worker reads at once when its batches are asked one at a time (:meth:`CanonicalStream.next_record`):
each canonical slot's part of them is one span, and a span costs a call of every canonical slot's stream."""


def fill_batches(batch_rows: int) -> int:
    """Batches of ``batch_rows`` rows read at once (:data:`FILL_ROWS`, 1 to 64)."""
    return max(1, min(64, FILL_ROWS // max(batch_rows, 1)))


class OutOfStepError(WorkerError):
    """Canonical slots of one worker that do not end together (never expected: their chunks are evened); a bug to
    report, never a batch short of a slot's rows."""


class CanonicalStream:
    """The batches of a (rank, worker) slot under ``order="canonical"``: chunk ``k`` of each of its canonical slots'
    ``streams``, in order. ``slot``: the (rank, worker) slot; ``slots``: the canonical slots there are;
    ``options``: what its states' head says; ``reads``: what its loader reads (a dataset, a mixture).

    Batches asked one at a time (:meth:`next_record`) are read ``per_fill`` at a time from every canonical slot (one
    span each, one gather for all of them) and handed out from there: a canonical slot's chunk is a few rows, and
    asking each for one at a time would cost a stream call per chunk. The position and state stand after the last
    batch handed out."""

    def __init__(self, streams: Sequence[MixStream[Any, Any]], slot: Slot, slots: int, options: dict[str, Any],
                 reads: str = DATASET, per_fill: int = 1) -> None:
        self._streams = list(streams)
        # a mixture's: a position after every batch (a state past them could not say its rows of each source)
        self._every = reads != DATASET
        self._slot, self._slots, self._options, self._reads = slot, slots, options, reads
        self._per_fill = max(per_fill, 1)
        self._fill: pa.RecordBatch | None = None   # batches read by next_record, not all handed out yet
        self._bounds: list[int] = []   # where each of its batches starts, and its end
        self._at: list[CanonicalPosition] = []   # the position after each
        self._next = 0   # its next batch to hand out
        self._last: CanonicalPosition | None = None   # after the last batch handed out of them
        self._base: tuple[Any, ...] | None = None   # where the canonical slots stood before the last span read

    @property
    def _ready(self) -> int:
        """Batches read, not handed out yet."""
        return len(self._at) - self._next

    @property
    def batches(self) -> int:
        """Batches handed out (read ahead ones not counted)."""
        return self._streams[0].batches - self._ready

    @property
    def batch_size(self) -> int:
        return sum(stream.batch_size for stream in self._streams)

    @property
    def epoch(self) -> int:
        return self._streams[0].epoch

    def next_record(self) -> pa.RecordBatch:
        if not self._ready:
            self._fill, sizes, self._at, _ = self._read(self._per_fill)
            self._bounds = np.cumsum([0, *sizes]).tolist()
            self._next = 0
        return self._hand_out(1)[0]

    def next_span(self, max_batches: int) -> tuple[pa.RecordBatch, list[int], list[CanonicalPosition],
                                                   list[int] | None]:
        if self._ready:   # batches read ahead first (their rows of each source are not counted apart)
            return (*self._hand_out(max(max_batches, 1)), None)
        return self._read(max_batches)

    def _hand_out(self, wanted: int) -> tuple[pa.RecordBatch, list[int], list[CanonicalPosition]]:
        """Up to ``wanted`` batches read ahead, as one slice of the fill (no copy), their rows and the position after
        each."""
        assert self._fill is not None
        first, last, bounds = self._next, min(self._next + wanted, len(self._at)), self._bounds
        self._next = last
        positions = self._at[first:last]
        self._last = positions[-1]
        span = self._fill.slice(bounds[first], bounds[last] - bounds[first])
        return span, [bounds[i + 1] - bounds[i] for i in range(first, last)], positions

    def _read(self, max_batches: int) -> tuple[pa.RecordBatch, list[int], list[CanonicalPosition], list[int] | None]:
        """Up to ``max_batches`` next batches of every canonical slot, side by side."""
        base = self._base
        if base is None and not self._every:
            base = tuple(stream.position() for stream in self._streams)
        spans = []
        for index, stream in enumerate(self._streams):
            try:
                spans.append(stream.next_span(max_batches, every=self._every))
            except StopIteration:
                self._end_together(index)
                raise
        counts = {len(sizes) for _, sizes, _, _ in spans}
        if len(counts) != 1:
            raise OutOfStepError(f"the canonical slots of rank {self._slot.rank} worker {self._slot.worker_id} gave "
                                 f"{sorted(counts)} chunks at once; they move together")
        per_batch = np.asarray([sizes for _, sizes, _, _ in spans], dtype=np.int64).T   # batch i, canonical slot j
        # inside the span: where it started and the batches past it; after its last batch: where each slot stands
        end = tuple(at[-1] for _, _, at, _ in spans)
        if self._every:
            positions = [CanonicalPosition(tuple(at)) for at in zip(*(at for _, _, at, _ in spans), strict=True)]
        else:
            assert base is not None
            past_rows = np.cumsum(per_batch, axis=0).tolist()
            positions = [CanonicalPosition(base, i + 1, tuple(past_rows[i])) for i in range(len(per_batch) - 1)]
            positions.append(CanonicalPosition(end))
        self._base = end
        sizes = per_batch.sum(axis=1).tolist()
        sources = [counts for _, _, _, counts in spans]   # rows of each source (a mixture's metrics count them)
        per_source = None if any(c is None for c in sources) else [sum(column) for column in zip(*sources, strict=True)]
        self._last = None
        if len(spans) == 1:
            return spans[0][0], sizes, positions, per_source
        return _side_by_side([span for span, _, _, _ in spans], per_batch.tolist()), sizes, positions, per_source

    def _end_together(self, ended: int) -> None:
        """Canonical slot ``ended`` has no chunk left: every other must end here too (asked, so that its state says
        its epoch is complete)."""
        for index, stream in enumerate(self._streams):
            if index == ended:
                continue
            try:
                stream.next_record()
            except StopIteration:
                continue
            raise OutOfStepError(f"canonical slot {index} of rank {self._slot.rank} worker {self._slot.worker_id} has "
                                 f"chunks left where another has none; they move together")

    def next_piece(self) -> None:
        return None

    def position(self) -> CanonicalPosition:
        if self._ready:
            assert self._last is not None
            return self._last
        return CanonicalPosition(tuple(stream.position() for stream in self._streams))

    def state(self, position: CanonicalPosition | None = None) -> CanonicalState:
        if position is None and self._ready:
            position = self._last
        if position is None:
            states = tuple(stream.state() for stream in self._streams)
            past: tuple[tuple[int, int], ...] = ()
        else:
            states = tuple(stream.state(at) for stream, at in zip(self._streams, position.positions, strict=True))
            past = tuple((position.past, rows) for rows in position.past_rows)
        return CanonicalState.of(self._reads, self.epoch, self._slot, self._slots, states, self._options, past)


def pass_over(stream: MixStream[Any, Any], past: tuple[int, int], number: int) -> None:
    """Canonical slot ``number``'s ``stream``, opened at its state in a checkpoint, moved past the batches and rows
    the checkpoint says it handed out past that state (``past``); a ``StateError`` if it holds other rows there."""
    batches, rows = past
    passed, seen = 0, 0
    while passed < batches:
        try:
            _, sizes, _, _ = stream.next_span(batches - passed, every=False)
        except StopIteration:
            break
        passed, seen = passed + len(sizes), seen + sum(sizes)
    if (passed, seen) != (batches, rows):
        raise StateError(f"the checkpoint says canonical slot {number} handed out {batches} batch(es) of {rows} row(s) "
                         f"past its state, but the data holds {passed} of {seen} row(s) there; it is not a position this "
                         f"plan reaches, so resuming from it would lose or repeat rows. {REMEDY}")


def _side_by_side(spans: list[pa.RecordBatch], per_batch: list[list[int]]) -> pa.RecordBatch:
    """Batches of several spans, each batch ``i`` the ``i``-th batch of every span in turn (``per_batch[i]``: its
    rows in each span), as one record batch: one gather.

    Example:
        >>> spans = [pa.record_batch({"x": [0, 1, 2, 3]}), pa.record_batch({"x": [10, 11]})]
        >>> _side_by_side(spans, [[2, 1], [2, 1]]).column("x").to_pylist()
        [0, 1, 10, 2, 3, 11]
    """
    sizes = np.asarray(per_batch, dtype=np.int64)   # batch i, span j
    starts = np.cumsum([0, *(span.num_rows for span in spans[:-1])])
    within = np.cumsum(sizes, axis=0) - sizes   # where batch i's rows start in span j
    source = (starts[None, :] + within).ravel()
    lengths = sizes.ravel()
    out = np.cumsum(lengths) - lengths
    indices = np.repeat(source - out, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)
    gathered = pa.Table.from_batches(spans).take(pa.array(indices)).combine_chunks().to_batches()
    return gathered[0] if len(gathered) == 1 else pa.concat_batches(gathered)
