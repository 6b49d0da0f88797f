"""The trainer's side of ``order="canonical"``: a rank's batch is its workers' parts, worker after worker.

Under ``order="canonical"`` each worker of a rank reads its own canonical slots and yields, for every global batch,
its part of the rank's batch (``arrowstream._layout.canonical``). torch's loader hands the workers' items over in
its round robin, worker 0 first; :class:`PartsZip` takes one item of each worker and hands out their concatenation,
so every batch the loop sees is a whole batch of the rank, and a ``state_dict()`` between two is taken where every
worker has handed out the same number of parts. :func:`concat_parts` puts parts of any output format together.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from .._core.fields import MAX_INT, REMEDY, Fields
from .._state.canonical import CanonicalState
from ..errors import ArgumentTypeError, InvalidArgumentError, StateError, StateMismatchError, WorkerError
from .batches import BatchIterator
from .torchdata_state import (
    is_inner_state,
    read_inner,
    set_last_yielded_worker,
    set_worker_state,
    worker_state,
)


def concat_parts(parts: Sequence[Any]) -> Any:
    """Parts of one batch (as a worker's ``collate_fn`` left them: a dict of tensors, arrays or lists, a record batch,
    a tensor, an array, a list) put together in order; ``ArgumentTypeError`` for a type it cannot join.

    Example:
        >>> concat_parts([{"x": [1, 2]}, {"x": [3]}])
        {'x': [1, 2, 3]}
    """
    first = parts[0]
    if len(parts) == 1:
        return first
    if isinstance(first, Mapping):
        return type(first)({key: concat_parts([part[key] for part in parts]) for key in first})  # type: ignore[call-arg]
    if isinstance(first, torch.Tensor):
        return torch.cat(list(parts))
    if isinstance(first, np.ndarray):
        return np.concatenate(list(parts))
    if isinstance(first, pa.RecordBatch):
        return pa.concat_batches(list(parts))
    if isinstance(first, pa.Table):
        return pa.concat_tables(list(parts))
    if isinstance(first, list):
        return [value for part in parts for value in part]
    if isinstance(first, tuple):
        return type(first)(concat_parts([part[i] for part in parts]) for i in range(len(first)))
    raise ArgumentTypeError(
        f"order='canonical' with several workers joins each worker's part of a batch in the trainer, and cannot "
        f"join a {type(first).__name__} (what transform or collate_fn returned): return a dict of tensors, arrays "
        "or lists (or a record batch), use num_workers=0 or 1, or order='topology'")


class PartsZip:
    """A worker loader's batches (``batches``: its chunks unpacked one by one, each from its chunk's worker), joined
    one part of each worker at a time, worker 0's first; ``pin``: pinned again after the join (torch pinned the
    parts). The workers send chunks of parts (``batches_per_transfer``) in the loader's round robin: the parts of
    worker 0's chunk come first, so the parts of each worker wait here until every worker's next part is in.
    :meth:`handed_out` says where each worker stands after its part of the last batch handed out."""

    def __init__(self, batches: BatchIterator, workers: int, pin: Callable[[Any], Any] | None = None) -> None:
        self._batches, self._workers, self._pin = batches, workers, pin
        self._waiting: list[deque[tuple[Any, Any]]] = [deque() for _ in range(workers)]
        self._after: dict[int, Any] = {}   # worker -> its position after its part of the last batch handed out

    def __iter__(self) -> PartsZip:
        return self

    def __next__(self) -> Any:
        while not all(self._waiting):
            try:
                part = next(self._batches)
            except StopIteration:
                if any(self._waiting):
                    raise WorkerError(
                        f"order='canonical': workers {[w for w, left in enumerate(self._waiting) if left]} have parts "
                        f"of a batch the others ended their epoch without; the workers' canonical slots end together, "
                        "so this is a bug: please report it with the loader's arguments") from None
                raise
            chunk = self._batches.chunk
            assert chunk is not None, "a worker loader's batches come in chunks"
            self._waiting[chunk.worker_id].append((part, chunk.positions[self._batches.taken - 1]))
        parts = []
        for worker, waiting in enumerate(self._waiting):
            part, self._after[worker] = waiting.popleft()
            parts.append(part)
        batch = concat_parts(parts)
        return batch if self._pin is None else self._pin(batch)

    def handed_out(self) -> dict[int, Any]:
        """Each worker's position after its part of the last batch handed out (for the workers that handed any)."""
        return dict(self._after)

    def __len__(self) -> int:
        return len(self._batches) // self._workers


def rank_batches(batches: BatchIterator, inner: Any, num_workers: int) -> PartsZip | BatchIterator:
    """A loader's batches under ``order="canonical"`` (``inner``: torch's iterator): with several workers, one part
    of each joined (:class:`PartsZip`), pinned again where torch pins."""
    if num_workers < 2:
        return batches
    pin = None
    if inner._pin_memory:   # torch pinned each worker's part; the joined batch is pinned again
        from torch.utils.data._utils.pin_memory import pin_memory

        device = inner._pin_memory_device or None

        def pin(batch: Any) -> Any:
            return pin_memory(batch, device)  # type: ignore[no-untyped-call]
    return PartsZip(batches, num_workers, pin)


def handed_out_state(inner: dict[str, Any], parts: PartsZip, moved: Callable[[Any, Any, str], dict[str, Any]],
                     num_workers: int) -> dict[str, Any]:
    """torchdata's state, each worker moved back to its part of the last batch handed out (torchdata's stands after
    each worker's last chunk fetched, some of whose parts wait in ``parts``); ``moved(state, position, where)``: a
    worker's state dict at a position of its epoch."""
    state = copy.deepcopy(inner)
    for worker, position in parts.handed_out().items():
        set_worker_state(state, worker, moved(worker_state(state, worker), position, f"worker {worker} state"))
    set_last_yielded_worker(state, num_workers - 1)   # the next batch starts with worker 0's part
    return state


def canonical_transfer(kwargs: dict[str, Any], batches_per_transfer: int | None) -> int | None:
    """``batches_per_transfer`` under ``order="canonical"``, checked with the loader's other keywords: with several
    workers ``in_order`` must stay on (the trainer joins the workers' parts in their round robin), with workers
    ``snapshot_every_n_steps`` must be 1 (each chunk of parts carries its worker's state)."""
    workers = kwargs.get("num_workers", 0)
    if workers and kwargs.get("snapshot_every_n_steps", 1) != 1:
        raise InvalidArgumentError(
            f"order='canonical' with workers needs snapshot_every_n_steps=1 (got "
            f"{kwargs.get('snapshot_every_n_steps')!r}): a checkpoint is every canonical slot's state after the last "
            "batch, which each worker sends with its part")
    if isinstance(workers, int) and workers >= 2 and kwargs.get("in_order") is False:
        raise InvalidArgumentError(
            "order='canonical' with several workers needs in_order=True: the trainer joins one part of each "
            "worker's into a batch, in the workers' round robin; leave in_order out")
    return batches_per_transfer


def canonical_worker_states(outers: list[dict[str, Any]], reads: str) -> list[CanonicalState]:
    """Every worker's canonical state in loader states (one rank's, or every rank's of a merged checkpoint) of a
    loader that reads ``reads``: the states an ``order="canonical"`` checkpoint resumes from, whatever its topology.
    A state taken after batches its workers had not yet snapshot (``snapshot_every_n_steps`` above 1) is refused:
    its canonical slots would stand before them."""
    saved = []
    for outer in outers:
        fields = Fields(outer, f"rank {outer.get('rank')}'s loader state")
        inner = fields.value.get("dataloader")
        if not isinstance(inner, dict) or not is_inner_state(inner):
            raise StateError(f"the {fields.where}'s dataloader is not a StatefulDataLoader state; {REMEDY}")
        parsed = read_inner(inner, MAX_INT, f"{fields.where}'s dataloader")
        if parsed.steps_since_snapshot:
            raise StateMismatchError(
                f"the {fields.where} was taken {parsed.steps_since_snapshot} batch(es) after its workers' last "
                "snapshot (snapshot_every_n_steps > 1), so its canonical slots' states stand before its last "
                "batches; order='canonical' needs snapshot_every_n_steps=1")
        for worker, raw in enumerate(parsed.worker_states):
            where = f"checkpoint's rank {outer.get('rank')} worker {worker} state"
            if raw is None:
                raise StateError(f"the {where} is missing; {REMEDY}")
            saved.append(CanonicalState.from_dict(raw, where, reads))
    return saved
