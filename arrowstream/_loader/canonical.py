"""The trainer's side of ``order="canonical"``: a rank's batch is its workers' parts, worker after worker.

Under ``order="canonical"`` each worker of a rank reads its own canonical slots and yields, for every global batch,
its part of the rank's batch (``arrowstream._layout.canonical``). torch's loader hands the workers' items over in
its round robin, worker 0 first; :class:`PartsZip` takes one item of each worker and hands out their concatenation,
so every batch the loop sees is a whole batch of the rank, and a ``state_dict()`` between two is taken where every
worker has handed out the same number of parts. :func:`concat_parts` puts parts of any output format together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from ..errors import ArgumentTypeError, InvalidArgumentError


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
    """A worker loader's items, ``workers`` at a time (one of each, in its round robin), handed out as one batch;
    ``pin``: pinned again after the join (torch pinned the parts)."""

    def __init__(self, items: Iterator[Any], workers: int, pin: Callable[[Any], Any] | None = None) -> None:
        self._items, self._workers, self._pin = items, workers, pin

    def __iter__(self) -> PartsZip:
        return self

    def __next__(self) -> Any:
        parts = [next(self._items)]
        for _ in range(self._workers - 1):
            try:
                parts.append(next(self._items))
            except StopIteration:
                raise AssertionError(f"order='canonical': a worker ended its epoch {len(parts)} part(s) into a "
                                     f"batch of {self._workers}; the workers' canonical slots end together") from None
        batch = concat_parts(parts)
        return batch if self._pin is None else self._pin(batch)

    def __len__(self) -> int:
        return len(self._items) // self._workers   # type: ignore[arg-type]


def rank_batches(batches: Iterator[Any], inner: Any, num_workers: int) -> Iterator[Any]:
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


def canonical_transfer(kwargs: dict[str, Any], batches_per_transfer: int | None) -> int | None:
    """``batches_per_transfer`` under ``order="canonical"``: one with several workers (the trainer joins one part of
    each worker's into a batch); ``snapshot_every_n_steps`` must be 1 with workers (each part carries its state)."""
    workers = kwargs.get("num_workers", 0)
    if workers and kwargs.get("snapshot_every_n_steps", 1) != 1:
        raise InvalidArgumentError(
            f"order='canonical' with workers needs snapshot_every_n_steps=1 (got "
            f"{kwargs.get('snapshot_every_n_steps')!r}): a checkpoint is every canonical slot's state after the last "
            "batch, which each worker sends with its part")
    if isinstance(workers, int) and workers >= 2:
        if kwargs.get("in_order") is False:
            raise InvalidArgumentError(
                "order='canonical' with several workers needs in_order=True: the trainer joins one part of each "
                "worker's into a batch, in the workers' round robin; leave in_order out")
        if batches_per_transfer not in (None, 1):
            raise InvalidArgumentError(
                f"order='canonical' with {workers} workers sends one part of a batch per message (the trainer joins "
                f"one of each worker's); batches_per_transfer={batches_per_transfer!r} is refused: leave it out")
        return 1
    return batches_per_transfer
