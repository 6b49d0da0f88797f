"""The trainer's side of chunks: a worker loader's chunks handed out batch by batch, and the state
moved back to the last batch handed out when it is taken inside a chunk (see ``_transport``).

:class:`PerBatchCollate` is the collate step in the workers: a user's ``collate_fn`` applied to each
batch of a chunk, then the chunk packed. :class:`BatchIterator` unpacks the chunks in the trainer.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from ._state import WorkerState
from ._torchdata_state import set_last_yielded_worker, set_worker_state, worker_state
from ._transport import Chunk
from ._watchdog import guard_reads, name_dead_workers, worker_death
from .errors import ArrowStreamError


class PerBatchCollate:
    """A user's ``collate_fn`` (or None), applied in the worker to each batch of a chunk; then the
    chunk is packed in the worker's own thread, so a failure to pack reaches the trainer."""

    def __init__(self, collate_fn: Any) -> None:
        self.collate_fn = collate_fn

    def __call__(self, item: Any) -> Any:
        if isinstance(item, Chunk):
            return (item if self.collate_fn is None else item.map_batches(self.collate_fn)).pack()
        return item if self.collate_fn is None else self.collate_fn(item)


def worker_batches(inner: Any) -> BatchIterator:
    """A worker loader's iterator, watched (a dead worker named, reads guarded) and unpacked batch by batch."""
    name_dead_workers(inner)
    guard_reads(inner)
    return BatchIterator(inner)


class BatchIterator:
    """Yields the batches of the chunks a worker loader delivers, one by one."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.chunk: Chunk | None = None
        self.taken = 0
        self._pending: list[Any] = []
        self.delivered: dict[int, Any] = {}   # worker id -> its position after its last batch handed out

    @property
    def inside_chunk(self) -> bool:
        return self.chunk is not None and 0 < self.taken < len(self.chunk)

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> Any:
        if self.taken == len(self._pending):
            try:
                item = next(self._inner)
            except (StopIteration, ArrowStreamError):
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
            if not isinstance(item, Chunk):  # e.g. a dataset that is not chunked
                self.chunk, self._pending, self.taken = None, [], 0
                return item
            self.chunk, self._pending, self.taken = item, item.batches(), 0
        batch = self._pending[self.taken]
        self._pending[self.taken] = None
        self.taken += 1
        assert self.chunk is not None
        self.delivered[self.chunk.worker_id] = self.chunk.positions[self.taken - 1]
        return self.chunk.finish(batch)

    def __len__(self) -> int:
        return len(self._inner)


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
    set_worker_state(state, worker_id, dataclasses.replace(
        WorkerState.from_dict(worker_state(state, worker_id)), cursor=position.cursor, rows=position.rows,
        batches=position.batches, rows_dropped=position.rows_dropped, epoch_complete=False).to_dict())
    set_last_yielded_worker(state, (worker_id - 1) % num_workers)
    return state


