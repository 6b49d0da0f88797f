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

from .._core.fields import REMEDY, Fields
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
    past: tuple[tuple[int, int], ...] = ()   # each one's (batches, rows) handed out past its state; (): none

    @classmethod
    def of(cls, reads: str, epoch: int, slot: Slot, slots: int, states: tuple[Any, ...],
           options: dict[str, Any], past: tuple[tuple[int, int], ...] = ()) -> CanonicalState:
        """The state of (rank, worker) ``slot`` in ``epoch`` whose canonical slots stand at ``states`` (of ``slots``)
        and handed out ``past`` batches and rows past them (each one's; a worker reads a span of batches at a time,
        and a resume passes over those again): its counters their sums, its epoch complete when all of theirs are;
        ``options``: what its head says."""
        past = past if any(batches for batches, _ in past) else ()
        head = WorkerHead(reads, epoch, slot, sum(s.rows for s in states) + sum(rows for _, rows in past),
                          states[0].batches + (past[0][0] if past else 0), sum(s.rows_dropped for s in states),
                          all(s.epoch_complete for s in states), options)
        return cls(head, slots, states, past)

    def past_of(self, index: int) -> tuple[int, int]:
        """The batches and rows canonical slot ``index`` (of this worker's, from 0) handed out past its state."""
        return self.past[index] if self.past else (0, 0)

    @property
    def epoch(self) -> int:
        return self.head.epoch

    @property
    def batches(self) -> int:
        """Global batches this worker has given its part of (each canonical slot's chunks)."""
        return self.head.batches

    def moved(self, positions: Sequence[Any], names: Sequence[str] = (), past: int = 0,
              past_rows: Sequence[int] = ()) -> CanonicalState:
        """This state of the same epoch moved to ``positions`` (each canonical slot's) and ``past`` batches past them
        (``past_rows``: each one's rows in them), as a chunk's batches carry them: a dataset's ``Position`` (the epoch
        goes on), a mixture's ``MixPosition`` (``names``: its sources, in order)."""
        states = tuple(state.at(at, names) if isinstance(state, MixWorkerState) else
                       dataclasses.replace(state, cursor=at.cursor, rows=at.rows, batches=at.batches,
                                           rows_dropped=at.rows_dropped, epoch_complete=False)
                       for state, at in zip(self.states, positions, strict=True))
        head = self.head
        return CanonicalState.of(head.reads, head.epoch, head.slot, self.slots, states, head.options,
                                 tuple((past, rows) for rows in past_rows))

    def to_dict(self) -> dict[str, Any]:
        canonical: dict[str, Any] = {"slots": self.slots, "states": [state.to_dict() for state in self.states]}
        if self.past:
            canonical["past"] = [{"batches": batches, "rows": rows} for batches, rows in self.past]
        return {**self.head.to_dict(), "canonical": canonical}

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
        past = _past(canonical, len(states))
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
            passed, _ = past[i] if past else (0, 0)
            if inner.epoch != head.epoch or inner.batches + passed != head.batches:
                raise StateError(f"the {at} stands at epoch {inner.epoch}, batch {inner.batches + passed}, the worker "
                                 f"at epoch {head.epoch}, batch {head.batches}: the canonical slots of a worker move "
                                 f"together{f' ({passed} of its batches past its cursor)' if passed else ''}; {REMEDY}")
            if passed and inner.epoch_complete:
                raise StateError(f"the {at} says its epoch is complete, but {where}.canonical.past[{i}] has batches "
                                 f"handed out past it; {REMEDY}")
        rows = sum(s.rows for s in states) + sum(r for _, r in past)
        if (rows, sum(s.rows_dropped for s in states)) != (head.rows, head.rows_dropped):
            raise StateError(f"the {where}.counters say {head.rows} rows ({head.rows_dropped} dropped), its canonical "
                             f"slots' states {rows} ({sum(s.rows_dropped for s in states)}); {REMEDY}")
        return cls(head, slots, states, past)


MAX_PAST = 4096
"""The most batches a canonical slot's state says were handed out past it (a span read at once is far fewer)."""


def _past(canonical: Fields, count: int) -> tuple[tuple[int, int], ...]:
    """``canonical.past`` of a canonical state's fields (format v14; absent: none), one per state."""
    if "past" not in canonical.value:
        return ()
    raw = canonical.sequence("past")
    if len(raw) != count:
        raise StateError(f"the state's {canonical.where}.past holds {len(raw)} entries, its states {count}: one per canonical slot; "
                         f"{REMEDY}")
    past = []
    for i, item in enumerate(raw):
        entry = Fields(item, f"{canonical.where}.past[{i}]")
        batches, rows = entry.integer("batches", 0, MAX_PAST), entry.integer("rows", 0)
        if rows and not batches:
            raise StateError(f"the state's {entry.where} says {batches} batch(es) and {rows} row(s) handed out past the "
                             f"canonical slot's state, expected 0 to {MAX_PAST} batches holding their rows; {REMEDY}")
        past.append((batches, rows))
    return tuple(past) if any(batches for batches, _ in past) else ()


@dataclass(frozen=True)
class SlotAt:
    """Where one canonical slot stands in a checkpoint: its state, and the batches and rows it handed out past it."""

    state: Any   # WorkerState (a dataset's), MixWorkerState (a mixture's)
    past: tuple[int, int] = (0, 0)

    @property
    def batches(self) -> int:
        return int(self.state.batches) + self.past[0]


def canonical_states(saved: Sequence[CanonicalState], slots: int, where: str) -> dict[int, SlotAt]:
    """The canonical slots of a checkpoint's worker states (``saved``, any topology's), by canonical slot; refused
    (``StateMismatchError``) when taken with other ``canonical_slots``, when none is there, or when they do not stand
    at one (epoch, global batch)."""
    found: dict[int, SlotAt] = {}
    for state in saved:
        if state.slots != slots:
            raise StateMismatchError(
                f"checkpoint was taken with canonical_slots={state.slots}, this one has canonical_slots={slots}: the "
                f"canonical sequence differs. Build it with canonical_slots={state.slots}")
        for index, inner in enumerate(state.states):
            if inner.slot.rank in found:
                raise StateError(f"the {where} holds canonical slot {inner.slot.rank} twice; {REMEDY}")
            found[inner.slot.rank] = SlotAt(inner, state.past_of(index))
    if not found:
        raise StateMismatchError(f"the {where} holds no canonical slot's state; pass loader.state_dict() (or "
                                 "merge_state_dicts) unchanged")
    steps = {(s.state.epoch, s.batches) for s in found.values()}
    if len(steps) != 1:
        raise StateMismatchError(
            f"the {where}'s canonical slots stand at different (epoch, global batch): {sorted(steps)[:4]}; a "
            "checkpoint's canonical slots move together. Pass the states of one step (loader.state_dict() of every "
            "rank at the same step, merged)")
    return found


def rank_states(saved: Sequence[CanonicalState], slots: int, rank: int, world_size: int,
                where: str) -> dict[int, SlotAt]:
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
