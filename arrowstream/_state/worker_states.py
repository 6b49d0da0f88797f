"""Any worker state, read by what its loader read: the one entry point for both fronts' worker states.

From version 12 a dataset's worker state and a mixture's are one kind, ``"arrowstream.worker"``, with the same
head (:class:`~arrowstream._state.worker.WorkerHead`: ``reads``, ``epoch``, ``slot``, ``counters``,
``epoch_complete``, ``options``) and ``elastic``; its ``reads`` says which parser reads the rest. Older states of
either kind (a dataset's ``"arrowstream.worker"`` 1-11, a mixture's ``"arrowstream.mixture_worker"`` 1-4) are
migrated first (:func:`~arrowstream._state.versions.upgraded_worker`).
"""

from __future__ import annotations

from typing import Any

from .._core.fields import Fields
from .mixture import MixWorkerState
from .versions import MIXTURE, upgraded_worker
from .worker import WorkerHead, WorkerState

AnyWorkerState = WorkerState | MixWorkerState
"""A worker state parsed: a dataset's or a mixture's."""


def read_worker_state(state: Any, where: str = "worker state", reads: str | None = None) -> AnyWorkerState:
    """A worker state of either kind and any version, parsed by its ``reads`` (a dataset's
    :class:`~arrowstream._state.worker.WorkerState`, a mixture's :class:`~arrowstream._state.mixture.MixWorkerState`);
    ``reads``: the front the caller reads, and a state of the other is refused (``StateMismatchError``) as its
    loader refuses it. ``StateError`` naming the field for a malformed one.

    Example:
        >>> from arrowstream._core.cursor import Cursor
        >>> from arrowstream._core.order import SlotGrid
        >>> from arrowstream._state.identity import DataIdentity
        >>> saved = WorkerState(DataIdentity("f" * 32, 1, 10), {"planning": 2}, 0, SlotGrid(1, 0).slot(0, 0),
        ...                     Cursor.start(1, 1), 4, 1, 0, False).to_dict()
        >>> read_worker_state(saved).head.reads, read_worker_state(saved).rows
        ('dataset', 4)
    """
    upgraded = upgraded_worker(state)
    found = WorkerHead.from_fields(Fields(upgraded, where)).reads
    parse = MixWorkerState.from_dict if (reads or found) == MIXTURE else WorkerState.from_dict
    return parse(upgraded, where)

