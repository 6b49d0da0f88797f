"""What a mixture followed from a checkpoint, shared with the copies of it that torchdata never hands the state.

A user's own ``StatefulDataLoader(mixture, batch_size=None, num_workers=N)`` hands each worker its state, never
the trainer's mixture; a worker started afresh for a later epoch (``persistent_workers=False``) is a copy of the
trainer's mixture. When the state changed the mixture's history of quotas (a new mixture at an epoch boundary: each
kept source goes on from its position), that copy would start every source where the trainer's own history says,
and read rows twice or skip them. So the process that follows a checkpoint writes the history it follows into a
cell of shared memory made with the mixture (as its epoch cell is), with the data of each source it was counted on,
and every copy takes it where it stands on that same data (an Iceberg table that moved on since is read as it is
now, by a fresh worker, as a dataset's is: docs/mixing.md).

The cell: a generation, the length of the JSON, the JSON. A copy remembers the generation it took; a later one is
news. It is written when a checkpoint is loaded, never per batch.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from .shm import share

History = list[tuple[int, dict[str, int]]]

CAPACITY = 1 << 16   # bytes of JSON: a history of a few hundred changes of a few sources
_HEADER = 16   # generation and length, two int64


class FollowedCell:
    """A mixture's followed history of quotas, shared by the trainer's mixture and every worker's copy of it."""

    def __init__(self, what: str) -> None:
        self._cell = share(torch.zeros(_HEADER + CAPACITY, dtype=torch.uint8), f"{what}: the followed history")
        self._taken = 0   # the generation this copy stands on

    def _header(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        return self._cell.numpy()[:_HEADER].view(np.int64)

    def publish(self, history: History, data: Mapping[str, Any]) -> None:
        """Write ``history`` (counted on each source's ``data``) for every copy of the mixture to take."""
        text = json.dumps({"history": history, "data": dict(data)}).encode()
        header = self._header()
        if len(text) > CAPACITY:
            header[1] = 0   # nothing to take: a copy keeps its own history
            warnings.warn(
                f"the mixture's history of quotas ({len(text):,} bytes of JSON) does not fit the {CAPACITY:,} bytes it "
                "shares with the workers a plain StatefulDataLoader starts afresh each epoch: those workers would "
                "start each source where the mixture's own history says; keep persistent_workers=True, or read it "
                "with Mixture.create_dataloader, to go on from the checkpoint's positions", UserWarning, stacklevel=3)
        else:
            self._cell.numpy()[_HEADER:_HEADER + len(text)] = np.frombuffer(text, dtype=np.uint8)
            header[1] = len(text)
        header[0] = self._taken = int(header[0]) + 1

    def news(self, data: Mapping[str, Any]) -> History | None:
        """The history another process followed since this copy last looked, if it was counted on this copy's
        ``data`` of every source the two share; None otherwise."""
        header = self._header()
        generation, length = int(header[0]), int(header[1])
        if generation == self._taken:
            return None
        self._taken = generation
        if not length:
            return None
        followed = json.loads(bytes(self._cell.numpy()[_HEADER:_HEADER + length]))
        if any(followed["data"].get(name, value) != value for name, value in data.items()):
            return None   # other data (an Iceberg table moved on since): read as it is now, from this copy's history
        return [(int(epoch), {str(n): int(q) for n, q in quotas.items()}) for epoch, quotas in followed["history"]]
