"""A worker's stream under ``order="canonical"``: the chunks of its canonical slots, side by side.

A (rank, worker) slot reads contiguous canonical slots (:mod:`arrowstream._layout.canonical`), each one stream of its
own (a dataset slot's stream, :mod:`arrowstream._layout.share_parts`, in batches of ``chunk`` rows). Its batch ``k``
is chunk ``k`` of each, in canonical order: :class:`CanonicalStream`. Every canonical slot yields the same number
of chunks, so they end together; one that does not is an error, never a batch short of a slot's rows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .._core.order import Slot
from .._mixing.stream import MixStream
from .._state.canonical import CanonicalState
from .._state.versions import DATASET
from ..errors import WorkerError


@dataclass(frozen=True)
class CanonicalPosition:
    """Where a canonical worker stands after a batch: each of its canonical slots' position."""

    positions: tuple[Any, ...]   # a dataset's Position, a mixture's MixPosition

    def __reduce__(self) -> tuple[type[CanonicalPosition], tuple[Any, ...]]:
        return CanonicalPosition, (self.positions,)   # it travels with every part of a chunk: plain arguments

    @property
    def batches(self) -> int:
        return int(self.positions[0].batches)

    @property
    def rows(self) -> int:
        return sum(int(position.rows) for position in self.positions)


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
        self._slot, self._slots, self._options, self._reads = slot, slots, options, reads
        self._per_fill = max(per_fill, 1)
        self._ready: deque[tuple[pa.RecordBatch, CanonicalPosition]] = deque()   # read, not handed out yet
        self._last: CanonicalPosition | None = None   # after the last batch handed out of them

    @property
    def batches(self) -> int:
        """Batches handed out (read ahead ones not counted)."""
        return self._streams[0].batches - len(self._ready)

    @property
    def batch_size(self) -> int:
        return sum(stream.batch_size for stream in self._streams)

    @property
    def epoch(self) -> int:
        return self._streams[0].epoch

    def next_record(self) -> pa.RecordBatch:
        if not self._ready:
            span, sizes, positions, _ = self._read(self._per_fill)
            offset = 0
            for size, position in zip(sizes, positions, strict=True):
                self._ready.append((span.slice(offset, size), position))
                offset += size
        record, self._last = self._ready.popleft()
        return record

    def next_span(self, max_batches: int) -> tuple[pa.RecordBatch, list[int], list[CanonicalPosition],
                                                   list[int] | None]:
        if self._ready:   # batches read ahead first
            taken = [self._ready.popleft() for _ in range(min(max(max_batches, 1), len(self._ready)))]
            self._last = taken[-1][1]
            records = [record for record, _ in taken]
            span = records[0] if len(records) == 1 else pa.concat_batches(records)
            return span, [record.num_rows for record in records], [at for _, at in taken], None
        return self._read(max_batches)

    def _read(self, max_batches: int) -> tuple[pa.RecordBatch, list[int], list[CanonicalPosition], list[int] | None]:
        """Up to ``max_batches`` next batches of every canonical slot, side by side."""
        spans = []
        for index, stream in enumerate(self._streams):
            try:
                spans.append(stream.next_span(max_batches))
            except StopIteration:
                self._end_together(index)
                raise
        counts = {len(sizes) for _, sizes, _, _ in spans}
        if len(counts) != 1:
            raise OutOfStepError(f"the canonical slots of rank {self._slot.rank} worker {self._slot.worker_id} gave "
                                 f"{sorted(counts)} chunks at once; they move together")
        positions = [CanonicalPosition(tuple(at)) for at in zip(*(p for _, _, p, _ in spans), strict=True)]
        per_batch = [[sizes[i] for _, sizes, _, _ in spans] for i in range(len(positions))]
        sizes = [sum(parts) for parts in per_batch]
        sources = [counts for _, _, _, counts in spans]   # rows of each source (a mixture's board counts them)
        per_source = None if any(c is None for c in sources) else [sum(column) for column in zip(*sources, strict=True)]
        self._last = None
        if len(spans) == 1:
            return spans[0][0], sizes, positions, per_source
        return _side_by_side([span for span, _, _, _ in spans], per_batch), sizes, positions, per_source

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
        else:
            states = tuple(stream.state(at) for stream, at in zip(self._streams, position.positions, strict=True))
        return CanonicalState.of(self._reads, self.epoch, self._slot, self._slots, states, self._options)


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
