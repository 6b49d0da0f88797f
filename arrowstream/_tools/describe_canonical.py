"""``describe_state``'s part for ``order="canonical"`` states: each worker state holds the cursors of the canonical
slots it reads (:class:`~arrowstream._state.canonical.CanonicalState`), which all stand at one global batch.

A worker is described by its head's counters (as any worker) plus the canonical slots it reads; the state as a whole
by its canonical slots: how many, the rows each gives a global batch, the global batch they stand at, and the rows
each has consumed (in runs of equal values: 64 canonical slots are a line, not a wall). Canonical slots that do not
stand at one (epoch, global batch), or sit where the topology does not read them, are refused (``StateError``), as
loading the checkpoint refuses them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._assignment.canonical import CanonicalOrder
from .._core.fields import REMEDY
from .._core.order import Slot
from .._state.canonical import CanonicalState
from .._state.compatible import check_compatible
from .._state.identity import DataIdentity
from .._state.versions import DATASET as READS_DATASET
from ..errors import StateError, StateMismatchError

if TYPE_CHECKING:
    from .._state.worker import WorkerState
    from ..dataset import StructuredDataset


@dataclass(frozen=True)
class CanonicalWorker:
    """A canonical worker state as the describe walk reads a worker: its head's counters and the states of its
    canonical slots."""

    state: CanonicalState

    @property
    def epoch(self) -> int:
        return self.state.head.epoch

    @property
    def slot(self) -> Slot:
        return self.state.head.slot

    @property
    def rows(self) -> int:
        return self.state.head.rows

    @property
    def batches(self) -> int:
        return self.state.head.batches

    @property
    def rows_dropped(self) -> int:
        return self.state.head.rows_dropped

    @property
    def epoch_complete(self) -> bool:
        return self.state.head.epoch_complete

    @property
    def options(self) -> dict[str, Any]:
        return self.state.head.options

    @property
    def data(self) -> DataIdentity:
        first: WorkerState = self.state.states[0]   # a dataset's canonical state (describe reads a dataset's)
        return first.data

    @property
    def elastic(self) -> None:
        return None   # canonical slots' states resume on any topology that divides them: never re-planned

    @property
    def first(self) -> int:
        """The first canonical slot it reads."""
        return int(self.state.states[0].slot.rank)

    def fields(self) -> dict[str, Any]:
        """What its worker line adds: the canonical slots it reads and each one's rows."""
        return {"canonical_slots": [self.first, self.first + len(self.state.states) - 1],
                "canonical_rows": self.rows_of_slots()}

    def rows_of_slots(self) -> list[int]:
        """Each of its canonical slots' rows handed out (its state's, and those past it)."""
        return [s.rows + self.state.past_of(i)[1] for i, s in enumerate(self.state.states)]


def read_canonical_worker(raw: Any, name: str, reads: str = READS_DATASET) -> CanonicalWorker:
    """A canonical worker state of a loader that reads ``reads``, parsed as ``load_state_dict`` parses it, and found
    where its (rank, worker) slot reads: canonical slots ``[p C / P, (p + 1) C / P)`` of the ``P`` physical slots
    (``StateError`` if not)."""
    worker = CanonicalWorker(CanonicalState.from_dict(raw, name, reads))
    slot, slots = worker.slot, worker.state.slots
    per, left = divmod(slots, slot.num_slots)
    if left or (worker.first, len(worker.state.states)) != (slot.index * per, per):
        raise StateError(
            f"the state's {name} holds canonical slots {worker.first}-{worker.first + len(worker.state.states) - 1} "
            f"of {slots}, but its slot (rank {slot.rank} of {slot.world_size}, worker {slot.worker_id} of "
            f"{slot.num_workers}) reads {_wanted(slot, slots)}; {REMEDY}")
    return worker


def _wanted(slot: Slot, slots: int) -> str:
    if slots % slot.num_slots:
        return f"none ({slot.num_slots} (rank, worker) slots do not divide {slots} canonical slots)"
    per = slots // slot.num_slots
    return f"canonical slots {slot.index * per}-{(slot.index + 1) * per - 1}"


def canonical_body(workers: list[CanonicalWorker], dataset: StructuredDataset | None) -> dict[str, Any]:
    """The state's ``canonical`` part: its canonical slots (how many, rows per global batch, the global batch they
    stand at, the rows each consumed: ``None`` for those of ranks the state does not hold). ``StateError`` when they
    do not stand at one (epoch, global batch) or one is held twice; with the dataset, each canonical slot's rows of
    the epoch (and each one's state is checked against the dataset's canonical order)."""
    first = workers[0]
    slots = first.state.slots
    at: dict[tuple[int, int], list[str]] = {}
    rows: list[int | None] = [None] * slots
    for worker in workers:
        if worker.state.slots != slots:
            raise StateError(f"the state's workers read {slots} and {worker.state.slots} canonical slots; {REMEDY}")
        at.setdefault((worker.epoch, worker.batches), []).append(_name(worker))
        for inner, handed in zip(worker.state.states, worker.rows_of_slots(), strict=True):
            if rows[inner.slot.rank] is not None:
                raise StateError(f"the state holds canonical slot {inner.slot.rank} twice (again in {_name(worker)}); "
                                 f"{REMEDY}")
            rows[inner.slot.rank] = handed
    if len(at) > 1:
        said = "; ".join(f"{', '.join(names)} at epoch {e}, global batch {k}" for (e, k), names in sorted(at.items()))
        raise StateError(f"the state's canonical slots stand at different (epoch, global batch): {said}; a "
                         f"checkpoint's canonical slots move together (loading it refuses it too). {REMEDY}")
    chunk = first.state.states[0].options.get("batch_size")
    body: dict[str, Any] = {"slots": slots, "chunk": chunk, "epoch": first.epoch, "global_batch": first.batches,
                            "slots_in_state": sum(r is not None for r in rows), "rows": rows, "epoch_rows": None}
    if dataset is not None:
        policy = dataset.policy
        if not isinstance(policy, CanonicalOrder) or policy.slots != slots:
            current = f"canonical_slots={policy.slots}" if isinstance(policy, CanonicalOrder) else "order='topology'"
            raise StateMismatchError(
                f"describe_state: the checkpoint was taken with order='canonical', canonical_slots={slots}, the "
                f"dataset has {current}; pass a dataset built with order='canonical', "
                f"canonical_slots={slots} (and the run's other options)")
        for worker in workers:
            for inner in worker.state.states:
                check_compatible(inner, policy.epochs.data, policy.epochs.state_options)
        body["epoch_rows"] = [kept for _, _, kept in policy.canonical_yields(first.epoch)]
    return body


def _name(worker: CanonicalWorker) -> str:
    return f"rank {worker.slot.rank} worker {worker.slot.worker_id}"


def rank_epoch_rows(dataset: StructuredDataset, num_workers: int, rank: int, epoch: int) -> int:
    """The rows rank ``rank`` yields in ``epoch`` under the dataset's canonical order (its canonical slots')."""
    return dataset.policy.rank_figures(dataset, num_workers, epoch)[rank].rows_yielded


def runs(values: list[int | None], most: int = 8) -> str:
    """Values by canonical slot, compactly: in runs of equal ones (``"0-5: 40, 6: 39, 7-63: 40"``; ``?``: not in
    the state); beyond ``most`` runs, how many slots have each value (``"890 in 24 slots, 891 in 40"``); beyond
    ``most`` values, their range. Each slot's value is in the JSON (``--json``).

    Example:
        >>> runs([4, 4, 4, 3, None, None])
        '0-2: 4, 3: 3, 4-5: ?'
        >>> print(runs([1, 2] * 8, most=4))
        1 in 8 slots, 2 in 8 (each slot's: --json)
    """
    def shown(value: int | None) -> str:
        return "?" if value is None else f"{value:,}"

    parts, start = [], 0
    for index in range(1, len(values) + 1):
        if index == len(values) or values[index] != values[start]:
            span = f"{start}" if index - 1 == start else f"{start}-{index - 1}"
            parts.append(f"{span}: {shown(values[start])}")
            start = index
    if len(parts) <= most:
        return ", ".join(parts)
    counts = Counter(values)
    known = sorted(v for v in counts if v is not None)
    if len(counts) <= most:
        ordered = [*known, None] if None in counts else known
        said = [f"{shown(v)} in {counts[v]} slots" if i == 0 else f"{shown(v)} in {counts[v]}"
                for i, v in enumerate(ordered)]
        return f"{', '.join(said)} (each slot's: --json)"
    unknown = f", {counts[None]} unknown" if None in counts else ""
    return f"{shown(known[0])} to {shown(known[-1])} over {len(values)} slots{unknown} (each slot's: --json)"
