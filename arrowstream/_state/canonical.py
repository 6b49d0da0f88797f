"""A worker's state under ``order="canonical"``: the cursors of the canonical slots it reads.

Every worker state says the same head (:class:`~arrowstream._state.worker.WorkerHead`: the (rank, worker) slot that
wrote it, its epoch, counters, whether its epoch is complete, its options); a canonical one adds ``canonical``: the
number of canonical slots and the state of each one the worker read: the worker state of that canonical slot as its
front writes one (a dataset's :class:`~arrowstream._state.worker.WorkerState`, a mixture's
:class:`~arrowstream._state.mixture.MixWorkerState`) for rank ``c`` among ``slots`` ranks without workers (see
:mod:`arrowstream._layout.canonical`). Those states do not depend on the topology that read them: a checkpoint of
any topology is the same set of canonical slots' states, which any other topology that divides them resumes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._core.fields import REMEDY
from .._core.order import Slot
from ..errors import StateError, StateMismatchError
from .mixture import MixWorkerState
from .versions import DATASET
from .worker import WorkerHead, WorkerState, read_head


@dataclass(frozen=True)
class CanonicalState:
    """One worker's state under ``order="canonical"``: its head, and the states of the canonical slots it reads, in
    order (contiguous canonical slots of ``slots``)."""

    head: WorkerHead
    slots: int
    states: tuple[Any, ...]   # WorkerState (a dataset's), MixWorkerState (a mixture's): as ``head.reads`` says

    @classmethod
    def of(cls, reads: str, epoch: int, slot: Slot, slots: int, states: tuple[Any, ...],
           options: dict[str, Any]) -> CanonicalState:
        """The state of (rank, worker) ``slot`` in ``epoch`` whose canonical slots stand at ``states`` (of ``slots``):
        its counters their sums, its epoch complete when all of theirs are; ``options``: what its head says."""
        head = WorkerHead(reads, epoch, slot, sum(s.rows for s in states), states[0].batches,
                          sum(s.rows_dropped for s in states), all(s.epoch_complete for s in states), options)
        return cls(head, slots, states)

    @property
    def epoch(self) -> int:
        return self.head.epoch

    @property
    def batches(self) -> int:
        """Global batches this worker has given its part of (each canonical slot's chunks)."""
        return self.head.batches

    def moved(self, positions: Sequence[Any], names: Sequence[str] = ()) -> CanonicalState:
        """This state of the same epoch moved to ``positions`` (each canonical slot's, after one batch), as a
        chunk's batches carry them: a dataset's ``Position`` (the epoch goes on), a mixture's ``MixPosition``
        (``names``: its sources, in order)."""
        states = tuple(state.at(at, names) if isinstance(state, MixWorkerState) else
                       dataclasses.replace(state, cursor=at.cursor, rows=at.rows, batches=at.batches,
                                           rows_dropped=at.rows_dropped, epoch_complete=False)
                       for state, at in zip(self.states, positions, strict=True))
        head = self.head
        return CanonicalState.of(head.reads, head.epoch, head.slot, self.slots, states, head.options)

    def to_dict(self) -> dict[str, Any]:
        return {**self.head.to_dict(), "canonical": {"slots": self.slots,
                                                     "states": [state.to_dict() for state in self.states]}}

    @classmethod
    def from_dict(cls, state: Any, where: str = "worker state", reads: str = DATASET) -> CanonicalState:
        """Parse a canonical worker state of a loader that reads ``reads`` (``StateMismatchError`` for one of
        ``order="topology"`` or of the other front, ``StateError`` naming the field for a bad one). Each canonical
        slot's state is parsed as its front's worker state; they must be of contiguous canonical slots of one epoch,
        standing at one global batch."""
        fields, head = read_head(state, reads, where)
        if "canonical" not in fields.value:
            raise StateMismatchError(
                f"the {where} was taken with order='topology' (it holds a worker's cursor, not canonical slots'); "
                "this dataset has order='canonical'. Build it with the order of the run that took the checkpoint")
        canonical = fields.mapping("canonical")
        slots = canonical.integer("slots", 1)
        raw = canonical.sequence("states")
        if not raw or len(raw) > slots:
            raise StateError(f"the {where}.canonical.states holds {len(raw)} states, expected 1 to {slots} (the "
                             f"canonical slots one worker reads); {REMEDY}")
        parse = WorkerState.from_dict if reads == DATASET else MixWorkerState.from_dict
        states = tuple(parse(item, f"{where}.canonical.states[{i}]") for i, item in enumerate(raw))
        first = states[0].slot.rank
        for i, inner in enumerate(states):
            at = f"{where}.canonical.states[{i}]"
            if (inner.slot.world_size, inner.slot.num_workers, inner.slot.rank) != (slots, 0, first + i):
                raise StateError(f"the {at}.slot is rank {inner.slot.rank} of world_size={inner.slot.world_size} with "
                                 f"num_workers={inner.slot.num_workers}, expected canonical slot {first + i} of {slots} "
                                 f"(rank {first + i} of {slots}, no workers): a worker's canonical slots are "
                                 f"contiguous; {REMEDY}")
            if inner.elastic is not None:
                raise StateError(f"the {at}.elastic is set, but a canonical slot's epoch is never re-planned (any "
                                 f"topology that divides the canonical slots reads them as they are); {REMEDY}")
            if inner.epoch != head.epoch or inner.batches != head.batches:
                raise StateError(f"the {at} stands at epoch {inner.epoch}, batch {inner.batches}, the worker at epoch "
                                 f"{head.epoch}, batch {head.batches}: the canonical slots of a worker move "
                                 f"together; {REMEDY}")
        if (sum(s.rows for s in states), sum(s.rows_dropped for s in states)) != (head.rows, head.rows_dropped):
            raise StateError(f"the {where}.counters say {head.rows} rows ({head.rows_dropped} dropped), its canonical "
                             f"slots' states {sum(s.rows for s in states)} ({sum(s.rows_dropped for s in states)}); "
                             f"{REMEDY}")
        return cls(head, slots, states)


def canonical_states(saved: Sequence[CanonicalState], slots: int, where: str) -> dict[int, Any]:
    """The canonical slots' states of a checkpoint's worker states (``saved``, any topology's), by canonical slot;
    refused (``StateMismatchError``) when taken with other ``canonical_slots``, when none is there, or when they do
    not stand at one (epoch, global batch)."""
    found: dict[int, Any] = {}
    for state in saved:
        if state.slots != slots:
            raise StateMismatchError(
                f"checkpoint was taken with canonical_slots={state.slots}, this one has canonical_slots={slots}: the "
                f"canonical sequence differs. Build it with canonical_slots={state.slots}")
        for inner in state.states:
            if inner.slot.rank in found:
                raise StateError(f"the {where} holds canonical slot {inner.slot.rank} twice; {REMEDY}")
            found[inner.slot.rank] = inner
    if not found:
        raise StateMismatchError(f"the {where} holds no canonical slot's state; pass loader.state_dict() (or "
                                 "merge_state_dicts) unchanged")
    steps = {(s.epoch, s.batches) for s in found.values()}
    if len(steps) != 1:
        raise StateMismatchError(
            f"the {where}'s canonical slots stand at different (epoch, global batch): {sorted(steps)[:4]}; a "
            "checkpoint's canonical slots move together. Pass the states of one step (loader.state_dict() of every "
            "rank at the same step, merged)")
    return found


def rank_states(saved: Sequence[CanonicalState], slots: int, rank: int, world_size: int,
                where: str) -> dict[int, Any]:
    """The states of the canonical slots rank ``rank`` of ``world_size`` reads, by canonical slot, from a checkpoint's
    worker states (``saved``, any topology's; :func:`canonical_states`); ``StateMismatchError`` when one is not there
    (one rank's state of another world size holds only that rank's)."""
    found = canonical_states(saved, slots, where)
    per_rank = slots // world_size
    wanted = range(rank * per_rank, (rank + 1) * per_rank)
    missing = [c for c in wanted if c not in found]
    if missing:
        raise StateMismatchError(
            f"the {where} lacks canonical slots {missing[:8]} that rank {rank} of {world_size} reads: a rank's own "
            "state holds only its canonical slots. Load the checkpoint of every rank "
            "(arrowstream.gather_state_dict(loader), or merge_state_dicts)")
    return {c: found[c] for c in wanted}


def is_canonical(state: Any) -> bool:
    """Whether a worker state (a dict, of any version) is a canonical one."""
    return isinstance(state, dict) and "canonical" in state
