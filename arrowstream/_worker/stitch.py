"""The last rows of a dynamic epoch, stitched: the workers' pieces made into whole batches in the trainer.

Under ``assignment="dynamic"`` a lease ends where its last item ends, not on a batch, so each worker
ends its epoch with fewer than a batch of rows. The workers cut them into pieces that make whole
batches when laid end to end in worker order (see ``arrowstream._layout.leases.last_pieces``) and send each piece as
Arrow. The trainer's :class:`Stitcher` holds the pieces until a batch's pieces are all there, then
converts the batch whole (the output format, ``transform``, ``collate_fn``, pinning: what a worker
would have done) and hands the batches out in order.

A piece counts as handed out when its batch is: until then, its worker's position (for a checkpoint)
stays after its last batch handed out, so a checkpoint names the rows of pieces held as not yielded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .._layout.leases import StitchTag
from ..errors import ArrowStreamError


@dataclass(frozen=True)
class StitchPiece:
    """A piece of a worker's last rows, as Arrow, and which batch it belongs to."""

    tag: StitchTag
    record: pa.RecordBatch


class Stitcher:
    """Pieces in, whole batches out, in the order of their groups. ``convert``: an Arrow record batch
    to the batch the loader yields."""

    def __init__(self, convert: Callable[[pa.RecordBatch], Any]) -> None:
        self._convert = convert
        self._held: dict[int, list[tuple[int, StitchPiece, Any]]] = {}   # group -> (worker, piece, position)
        self._next_group = 0

    def add(self, piece: StitchPiece, worker: int, position: Any) -> None:
        self._held.setdefault(piece.tag.group, []).append((worker, piece, position))

    def ready(self) -> tuple[Any, dict[int, Any]] | None:
        """The next batch whose pieces are all there (the groups in order: a worker's first piece is in
        the earlier group), with each of its workers' position after its piece; None if there is none."""
        parts = self._held.get(self._next_group)
        if not parts or len(parts) < parts[0][1].tag.parts:
            return None
        del self._held[self._next_group]
        self._next_group += 1
        parts.sort(key=lambda part: part[0])   # worker order, as the pieces were cut
        records = [piece.record for _, piece, _ in parts]
        batch = self._convert(pa.concat_batches(records) if len(records) > 1 else records[0])
        return batch, {worker: position for worker, _, position in parts}

    def check_done(self) -> None:
        """At the end of the epoch: nothing held (a piece held would be rows never handed out)."""
        if self._held:
            held = sorted((group, len(parts), parts[0][1].tag.parts) for group, parts in self._held.items())
            raise ArrowStreamError(
                f"assignment='dynamic': the epoch ended with the last rows of some workers not made into batches "
                f"(group, pieces held, pieces expected: {held}); no rows were handed out twice, but these were "
                "not handed out. This is a bug in arrowstream: please report it with the loader's options")
