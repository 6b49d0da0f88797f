"""A dataset slot's share of an epoch as the parts of one source: how a dataset's slot is read as a mixture of one.

A slot's :class:`~arrowstream._layout.elastic.Share` is its replays (in an epoch re-planned for another topology:
the rests of old workers' shuffle windows) then its splits. As a source's parts
(:class:`~arrowstream._mixing.parts.Part`), each replay is a part read from the old worker's cursor with the old
worker's window seeds, and the splits are one part with the slot's own seeds: a
:class:`~arrowstream._mixing.stream.MixStream` of one :class:`~arrowstream._mixing.stream.SourceRows` over them gives
exactly the batches the slot's share gives (``tests/test_one_source.py``). Part ``i < len(share.replays)`` is replay
``i``; the splits' part, when they hold rows, is the last one.
"""

from __future__ import annotations

import functools

from .._core.order import Slot, window_seed
from .._core.plan_types import split_rows
from .._mixing.parts import ListParts, Part
from .elastic import Share


def share_parts(share: Share, *, seed: int, epoch: int, slot: Slot) -> ListParts:
    """``share`` (of ``slot`` in ``epoch``, shuffled by ``seed``) as a source's parts: each replay, then the splits
    as one part when they hold rows."""
    parts = [Part(replay.splits, replay.rows, functools.partial(window_seed, seed, epoch, replay.slot), replay.start)
             for replay in share.replays]
    rows = int(split_rows(share.splits).sum())
    if rows:
        parts.append(Part(tuple(share.splits), rows, functools.partial(window_seed, seed, epoch, slot)))
    return ListParts(parts)
