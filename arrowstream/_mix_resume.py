"""Checks of a mixture's saved states, and following a checkpoint into the mixture (a new one between epochs).

Inside an epoch, a state loads only into the mixture it was taken with: the same sources, data, quotas
and options. At an epoch boundary (every worker done with its epoch), the mixture may differ: other
weights, ``epoch_rows``, sources added (they start at their first pass) or removed; every kept source
goes on at its exact position in its passes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._fields import REMEDY, Fields
from ._identity import check_same_data
from ._mix_elastic import MixElastic
from ._mix_plan import SPANS, TRACKS, positions, quotas_at
from ._mix_state import MixWorkerState
from ._mix_stream import MixSlot
from ._state import DataIdentity
from .errors import StateError, StateMismatchError

if TYPE_CHECKING:
    from ._mix_sources import Planned
    from .mixture import Mixture

_FINISH = ("finish the saved epoch with the saved mixture (same sources, weights and epoch_rows), then change it "
           "at the next epoch boundary; or resume with the saved mixture")


def _describe(epochs: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{name}: quota {quota}" for name, (_, quota) in epochs.items())


def _check_source_data(source: Planned, saved: dict[str, Any]) -> None:
    """Refuse a checkpoint taken on other data of ``source`` (as its ``data_identity`` compares them)."""
    if saved == source.data:
        return
    where = f"the checkpoint's data of source {source.name!r}"
    before, now = DataIdentity.from_dict(Fields(saved, where)), DataIdentity.from_dict(Fields(source.data, where))
    table = ("snapshot_id", "schema_id", "table_uuid")
    if any(getattr(before, key) != getattr(now, key) for key in table):
        raise StateMismatchError(
            f"source {source.name!r} is not the data the checkpoint was taken on: saved "
            f"{ {k: getattr(before, k) for k in table} }, current { {k: getattr(now, k) for k in table} }; a source's "
            "passes count its rows, so resume on the same data (or start the source afresh under a new name)")
    check_same_data(before, now, source.data_identity, f"source {source.name!r}")


def follow(mixture: Mixture, saved: list[MixWorkerState]) -> int:
    """Make ``mixture`` stand where the checkpoint of ``saved`` (every worker's state) stands; returns
    the saved epoch. Refuses, naming saved vs current, a mid-epoch checkpoint of another mixture."""
    epoch = max(state.epoch for state in saved)
    latest = [state for state in saved if state.epoch == epoch]
    first = latest[0]
    for state in latest[1:]:
        if (state.epochs, state.history) != (first.epochs, first.history):
            raise StateError(f"the workers' states disagree on the sources of mixture epoch {epoch}; {REMEDY}")
    starts, in_effect = positions(first.history, epoch), quotas_at(first.history, epoch)
    for name, e in first.epochs.items():
        if (starts.get(name, 0), in_effect.get(name, 0)) != (e.start, e.quota):
            raise StateError(f"the checkpoint's source {name!r} starts mixture epoch {epoch} at row {e.start} of its "
                             f"passes with quota {e.quota}, but its history {first.history} gives "
                             f"{starts.get(name, 0)} and {in_effect.get(name, 0)}; {REMEDY}")
    mixture._follow_sources(first.data)   # an Iceberg table moved on since: its checkpoint's snapshot
    for source in mixture._sources:
        if source.name in first.data:
            _check_source_data(source, first.data[source.name])
    saved_quotas = {name: (e.start, e.quota) for name, e in first.epochs.items()}
    boundary = all(state.epoch_complete for state in latest)
    if not boundary:
        current = {name: (0, quota) for name, quota in mixture.quotas().items()}
        if sorted(current) != sorted(saved_quotas) or any(current[n][1] != saved_quotas[n][1] for n in current):
            raise StateMismatchError(
                f"the checkpoint is inside mixture epoch {epoch}, taken with sources and quotas "
                f"{{{_describe(saved_quotas)}}}; this mixture has {{{_describe(current)}}}. Mid-epoch, the mixture "
                f"cannot change: {_FINISH}")
        mixture._history = [(e, dict(q)) for e, q in first.history]
    else:   # the next epoch may differ: kept sources go on from where the saved epoch left them
        names = set(mixture.names)
        kept = [(e, {n: q for n, q in quotas.items() if n in names}) for e, quotas in first.history if e <= epoch]
        mixture._history = [*kept, (epoch + 1, mixture.quotas())]
    mixture._epoch_cell[0] = epoch
    return epoch


def leave_tracks(mixture: Mixture, epoch: int, saved: tuple[int, int], current: tuple[int, int]) -> None:
    """A checkpoint whose passes were laid out in tracks (mixture state version 3 or older), resumed on another
    topology: from ``epoch + 1`` on the mixture lays its passes out in spans, which is exact only where every
    source's pass ends with ``epoch`` (what tracks leave of a pass depends on the topology that read it);
    elsewhere, a ``StateMismatchError`` with the way out."""
    if mixture._pass_layout != TRACKS:
        return
    after = positions(mixture._history, epoch + 1)
    inside = {s.name: after.get(s.name, 0) % s.plan.num_rows for s in mixture._sources
              if s.plan.num_rows and after.get(s.name, 0) % s.plan.num_rows}
    if inside:
        raise StateMismatchError(
            f"the checkpoint (world_size={saved[0]}, num_workers={saved[1]}) was taken by an arrowstream whose mixture "
            "read each pass of a source in per-worker tracks, so what mixture epoch "
            f"{epoch} leaves of a pass depends on the topology; this loader runs world_size={current[0]}, "
            f"num_workers={current[1]}, and source(s) {sorted(inside)} stand inside a pass after epoch {epoch} (at row "
            f"{', '.join(f'{n}: {r:,}' for n, r in sorted(inside.items()))}). Resume with world_size={saved[0]}, "
            f"num_workers={saved[1]}; or start the mixture's passes afresh without loading the checkpoint")
    mixture.use_pass_layout(SPANS)


def adopt_replanned(mixture: Mixture, states: list[MixWorkerState]) -> None:
    """States taken inside an epoch re-planned for their topology: the mixture lays that epoch out again
    from the old cursors they keep (every worker's the same)."""
    replanned = [s for s in states if s.elastic is not None]
    mixture._epochs.elastic = None
    if not replanned:
        return
    first = replanned[0]
    if any(s.elastic != first.elastic for s in replanned):
        raise StateError(f"the workers' states disagree on the epoch they were re-planned from; {REMEDY}")
    elastic = MixElastic.from_dict(first.elastic, "mixture worker state's elastic")
    if elastic.epoch != first.epoch:
        raise StateError(f"the mixture worker state in epoch {first.epoch} was re-planned from epoch {elastic.epoch}; "
                         f"{REMEDY}")
    mixture._epochs.elastic = (elastic, first.world_size, first.num_workers)


def check_worker_options(mixture: Mixture, state: MixWorkerState, slot: MixSlot, elastic: bool = False) -> None:
    """Refuse ``state`` unless it is of the worker ``slot`` and of the mixture's options (what its batches are
    counted with). ``elastic``: a state of another topology, whose epoch is re-planned for this one (its own
    ``even_batches``, the default of its world size, laid out its epoch)."""
    saved_slot = (state.rank, state.world_size, state.worker_id, state.num_workers)
    current_slot = (slot.rank, slot.world_size, slot.worker_id, slot.num_workers)
    if saved_slot != current_slot:
        raise StateMismatchError(f"this mixture worker state belongs to (rank, world_size, worker, num_workers) = "
                                 f"{saved_slot}, but it is loaded into {current_slot}; {REMEDY}")
    options = mixture.state_options()
    if elastic:
        options["even_batches"] = state.options.get("even_batches")
    changed = sorted(k for k in set(options) | set(state.options) if options.get(k) != state.options.get(k))
    if changed:
        raise StateMismatchError(
            "the mixture's options differ from the checkpoint's: " + ", ".join(
                f"{k}: saved {state.options.get(k)!r}, current {options.get(k)!r}" for k in changed)
            + "; build the mixture with the saved options to resume")


def check_worker_state(mixture: Mixture, state: MixWorkerState, slot: MixSlot,
                       elastic: bool = False) -> MixWorkerState:
    """``state``, refused unless it is a position the worker ``slot`` reaches in the mixture as it stands
    (``elastic``: see :func:`check_worker_options`)."""
    check_worker_options(mixture, state, slot, elastic)
    if state.epoch_complete:
        return state
    known = set(mixture.names)
    unknown = sorted(set(state.epochs) - known)
    if unknown:
        raise StateMismatchError(f"the checkpoint is inside mixture epoch {state.epoch} with source(s) {unknown} that this "
                                 f"mixture lacks: {_FINISH}")
    # the epoch as the state's own history lays it out (follow() has matched it with the mixture's)
    parts_of = mixture._epochs.parts(state.history, slot)
    mine = {name: parts_of[name].rows for name in state.epochs}
    total = sum(mine.values())
    batch_size = mixture.batch_size
    if state.rows > total or sum(c.taken for c in state.cursors.values()) != state.rows \
            or not (state.batches - 1) * batch_size < state.rows <= state.batches * batch_size \
            and not state.rows == state.batches == 0:
        raise StateError(f"the mixture worker state of rank {slot.rank} worker {slot.worker_id} counts {state.rows} "
                         f"row(s) in {state.batches} batch(es) of {batch_size}, its sources "
                         f"{ {n: c.taken for n, c in state.cursors.items()} } of quotas {mine}: not a position its "
                         f"epoch reaches; {REMEDY}")
    for name, cursor in state.cursors.items():
        ideal = state.rows * mine[name] / total if total else 0
        if cursor.taken > mine[name] or abs(cursor.taken - ideal) >= 1 + 1e-9 * total:
            raise StateError(f"the mixture worker state has {cursor.taken} row(s) of source {name!r} after {state.rows} "
                             f"row(s); its share is {ideal:.1f} of quota {mine[name]}: not a position its epoch "
                             f"reaches; {REMEDY}")
        segments = parts_of[name]
        before = segments.rows_before(min(cursor.segment, len(segments)))
        inside = segments.rows_before(cursor.segment + 1) - before if cursor.segment < len(segments) else 0
        if cursor.segment > len(segments) or not before <= cursor.taken <= before + inside:
            raise StateError(f"the mixture worker state of source {name!r} stands in segment {cursor.segment} of "
                             f"{len(segments)} with {cursor.taken} row(s) taken: not a position its epoch reaches; "
                             f"{REMEDY}")
    return state
