"""The trainer's side of chunks: a worker loader's chunks handed out batch by batch, and the state
moved back to the last batch handed out when it is taken inside a chunk (see ``arrowstream._worker.transport``), or,
with ``in_order=False``, made to say exactly what each worker handed out (:func:`delivered_state`).

:class:`PerBatchCollate` is the collate step in the workers: a user's ``collate_fn`` applied to each
batch of a chunk, then the chunk packed. :class:`BatchIterator` unpacks the chunks in the trainer.
"""

from __future__ import annotations

import copy
import dataclasses
from time import perf_counter
from typing import Any

from .._core.cursor import Position
from .._layout.canonical_stream import CanonicalPosition
from .._state.canonical import CanonicalState
from .._state.versions import DATASET
from .._state.worker import WorkerState, read_head
from .._worker.stitch import Stitcher, StitchPiece
from .._worker.transport import Chunk
from .._worker.watchdog import guard_reads, name_dead_workers, worker_death
from ..errors import ArrowStreamError
from .torchdata_state import (
    set_last_yielded_worker,
    set_worker_state,
    snapshot_now,
    worker_key,
    worker_state,
)


class PerBatchCollate:
    """A user's ``collate_fn`` (or None), applied in the worker to each batch of a chunk; then the
    chunk is packed in the worker's own thread, so a failure to pack reaches the trainer."""

    def __init__(self, collate_fn: Any) -> None:
        self.collate_fn = collate_fn

    def __call__(self, item: Any) -> Any:
        if isinstance(item, Chunk):
            started = perf_counter()
            # a piece of last rows is collated in the trainer, once its batch is whole (see _worker.stitch)
            stitched = len(item) == 1 and isinstance(item.peek(), StitchPiece)
            packed = (item if self.collate_fn is None or stitched else item.map_batches(self.collate_fn)).pack()
            if item.on_packed is not None:
                item.on_packed(started, perf_counter())
            return packed
        return item if self.collate_fn is None else self.collate_fn(item)


def worker_batches(inner: Any, stitcher: Stitcher | None = None) -> BatchIterator:
    """A worker loader's iterator, watched (a dead worker named, reads guarded) and unpacked batch by batch."""
    name_dead_workers(inner)
    guard_reads(inner)
    return BatchIterator(inner, stitcher)


class BatchIterator:
    """Yields the batches of the chunks a worker loader delivers, one by one; with a ``stitcher``
    (``assignment='dynamic'``), the workers' pieces of last rows made into whole batches."""

    def __init__(self, inner: Any, stitcher: Stitcher | None = None) -> None:
        self._inner = inner
        self.chunk: Chunk | None = None
        self.taken = 0
        self._pending: list[Any] = []
        self._after_chunks: dict[int, Any] = {}  # worker id -> its position after its last chunk handed out whole
        self._stitcher = stitcher

    @property
    def inside_chunk(self) -> bool:
        return self.chunk is not None and 0 < self.taken < len(self.chunk)

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> Any:
        while True:
            if self._stitcher is not None:
                stitched = self._stitcher.ready()
                if stitched is not None:
                    batch, positions = stitched
                    self._after_chunks.update(positions)
                    return batch
            if self.taken == len(self._pending):
                try:
                    self._fetch()
                except StopIteration:
                    if self._stitcher is not None:
                        self._stitcher.check_done()
                    raise
                if self.chunk is None:   # not a chunk: handed out as it came
                    return self._pending.pop()
            batch = self._pending[self.taken]
            self._pending[self.taken] = None
            self.taken += 1
            assert self.chunk is not None
            out = self.chunk.finish(batch)
            if not isinstance(out, StitchPiece):
                return out
            # a piece of a worker's last rows (a chunk of its own): held until its batch is whole, and not
            # handed out until then (the chunk is forgotten, so no position moves past it)
            assert self._stitcher is not None and len(self.chunk) == 1, "a stitched piece travels alone"
            self._stitcher.add(out, self.chunk.worker_id, self.chunk.positions[0])
            self.chunk, self._pending, self.taken = None, [], 0

    def _fetch(self) -> None:
        """The next item of the workers: a chunk unpacked into ``_pending``, or an item that is not one."""
        try:
            item = next(self._inner)
        except StopIteration:
            raise
        except ArrowStreamError:
            # a worker's error ends the epoch: its workers stop now, not when the iterator is collected
            # (the traceback that reaches the user holds it, and each worker would wait its queue's timeout)
            shutdown = getattr(self._inner, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            raise
        except Exception as exc:
            error = worker_death(getattr(self._inner, "_workers", []), exc)
            if error is None:
                raise
            shutdown = getattr(self._inner, "_shutdown_workers", None)
            if shutdown is not None:  # now, rather than in a __del__ that a later fork may inherit
                shutdown()
            drop_frames(exc)
            raise error from exc
        if self.chunk is not None:  # handed out whole
            self._after_chunks[self.chunk.worker_id] = self.chunk.positions[-1]
        if not isinstance(item, Chunk):  # e.g. a dataset that is not chunked
            self.chunk, self._pending, self.taken = None, [item], 0
            return
        self.chunk, self._pending, self.taken = item, item.batches(), 0

    def __len__(self) -> int:
        return len(self._inner)

    def handed_out(self) -> dict[int, Any]:
        """Each worker's position (as its chunks carry them) after the last batch of it handed out,
        for the workers that handed out any."""
        positions = dict(self._after_chunks)
        if self.chunk is not None and self.taken:
            positions[self.chunk.worker_id] = self.chunk.positions[self.taken - 1]
        return positions

    def last_yielded_worker(self, num_workers: int) -> int | None:
        """Where torchdata's round robin should stand for the next batch to come from the rest of the
        current chunk, if any (else from the worker after the chunk's); None before the first chunk."""
        if self.chunk is None:
            return None
        return (self.chunk.worker_id - 1) % num_workers if self.inside_chunk else self.chunk.worker_id


def drop_frames(exc: BaseException | None) -> None:
    """Forget the frames of ``exc`` and the errors it was raised from: they hold torch's locals (the
    ten NamedTemporaryFile objects its open-files probe makes), which forked workers of a later
    loader would inherit and delete on exit, under the trainer's feet."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def rewind_into_chunk(inner: dict[str, Any], batches: BatchIterator, num_workers: int) -> dict[str, Any]:
    """torchdata's state stands after the whole chunk; move it back to the last batch handed out.

    The chunk's worker gets the cursor it had after that batch, and the round robin points at
    that worker again, so the rest of the chunk is the next thing the resumed loader yields.
    """
    assert batches.chunk is not None
    state = copy.deepcopy(inner)
    worker_id = batches.chunk.worker_id
    position = batches.chunk.positions[batches.taken - 1]
    set_worker_state(state, worker_id, moved_state(worker_state(state, worker_id), position, f"worker {worker_id} state"))
    set_last_yielded_worker(state, (worker_id - 1) % num_workers)
    return state


def delivered_state(inner: dict[str, Any], batches: BatchIterator, latest: dict[str, Any],
                    num_workers: int) -> dict[str, Any]:
    """torchdata's state of a loader with ``in_order=False``, made to say exactly what the trainer received.

    torchdata snapshots the workers only when the item it hands out is the next one of its round robin;
    an item handed out ahead of its turn skips the snapshot. Its state then stands at an older step and
    asks to replay the batches since, which a resumed loader would fetch again in its own order: other
    batches, so rows lost and rows repeated. Here every worker gets instead the state it sent with its
    last item the loader took (``latest``, see ``torchdata_state.latest_worker_snapshots``), moved back
    to the last batch of it handed out when the trainer is inside that item's chunk (or forward, where a
    worker sent no state with its item), and nothing is left to replay: each worker resumes from its
    own cursor, in any order of the workers.
    """
    assert set(latest) == {worker_key(i) for i in range(num_workers)}, "a state for every worker"
    state = snapshot_now(inner, latest, batches.last_yielded_worker(num_workers))
    for worker_id, position in batches.handed_out().items():
        assert isinstance(position, Position | CanonicalPosition), "chunks of a StructuredDataset carry Positions"
        raw, where = worker_state(state, worker_id), f"worker {worker_id} state"
        if read_head(raw, DATASET, where)[1].batches != position.batches:  # equal: that batch's state, or the end after
            set_worker_state(state, worker_id, moved_state(raw, position, where))
    return state


def moved_state(raw: Any, position: Position | CanonicalPosition, where: str) -> dict[str, Any]:
    """A worker's state (a dict) of this epoch, moved to ``position`` (after a batch: the epoch goes on)."""
    if isinstance(position, CanonicalPosition):   # order="canonical": each of its canonical slots'
        return CanonicalState.from_dict(raw, where).moved(position.positions, (), position.past, position.past_rows).to_dict()
    return _at(WorkerState.from_dict(raw, where), position).to_dict()


def _at(saved: WorkerState, position: Position) -> WorkerState:
    """A worker's state of this epoch, moved to ``position`` (after a batch: the epoch goes on)."""
    return dataclasses.replace(saved, cursor=position.cursor, rows=position.rows, batches=position.batches,
                               rows_dropped=position.rows_dropped, epoch_complete=False)


