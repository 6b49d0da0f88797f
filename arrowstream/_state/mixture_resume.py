"""Checks of a mixture's saved states, and following a checkpoint into the mixture (a new one between epochs).

Inside an epoch, a state loads only into the mixture it was taken with: the same sources, data, quotas
and options. At an epoch boundary (every worker done with its epoch), the mixture may differ: other
weights, ``epoch_rows``, sources added (they start at their first pass) or removed; every kept source
goes on at its exact position in its passes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .._core.fields import REMEDY, Fields
from .._core.interleave import block_size_for
from .._core.order import even_batch_limits
from .._mixing.quotas import SPANS, TRACKS, positions, quotas_at
from .._mixing.stream import MixSlot
from ..errors import StateError, StateMismatchError
from .identity import DataIdentity, check_same_data
from .mixture import MixElastic, MixWorkerState
from .mixture_position import check_counters, check_source_cursor, final_counters, refuse

if TYPE_CHECKING:
    from .._core.plan_types import OrderOptions, PlanView
    from .._mixing.layout import MixEpochs

History = list[tuple[int, dict[str, int]]]


class PlannedData(Protocol):
    """What the checks read of a planned source of the mixture (``arrowstream._sources.mixture.Planned``)."""

    @property
    def name(self) -> str: ...

    @property
    def data(self) -> dict[str, Any]: ...

    @property
    def data_identity(self) -> str: ...

    @property
    def plan(self) -> PlanView: ...


class MixtureView(Protocol):
    """What the checks of a mixture's states read of a mixture (``Mixture`` answers it): its sources as planned,
    their names and quotas, its options, its history of quotas, its epochs and how they lay passes out."""

    @property
    def planned_sources(self) -> Sequence[PlannedData]: ...

    @property
    def names(self) -> list[str]: ...

    @property
    def options(self) -> OrderOptions: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def history(self) -> History: ...

    @property
    def epochs(self) -> MixEpochs: ...

    @property
    def pass_layout(self) -> str: ...

    def quotas(self, epoch: int | None = None) -> dict[str, int]: ...

    def state_options(self) -> dict[str, Any]: ...

    def use_pass_layout(self, pass_layout: str) -> None: ...

    def slot_totals(self, history: History, epoch: int, world_size: int, num_workers: int,
                    lacking: Mapping[str, int] | None = None) -> list[int]: ...

_FINISH = ("finish the saved epoch with the saved mixture (same sources, weights and epoch_rows), then change it "
           "at the next epoch boundary; or resume with the saved mixture")


def _describe(epochs: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{name}: quota {quota}" for name, (_, quota) in epochs.items())


def _check_source_data(source: PlannedData, saved: dict[str, Any]) -> None:
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


def saved_epoch(saved: list[MixWorkerState]) -> MixWorkerState:
    """The state of the first worker in the checkpoint's latest epoch, refused unless every worker in it agrees
    on its sources (their starts, quotas, history and data) and they are those its history gives."""
    epoch = max(state.epoch for state in saved)
    latest = [state for state in saved if state.epoch == epoch]
    first = latest[0]
    for state in latest[1:]:
        if (state.epochs, state.history, state.data) != (first.epochs, first.history, first.data):
            raise StateError(f"the workers' states disagree on the sources of mixture epoch {epoch} (their starts, "
                             f"quotas, history or data); {REMEDY}")
    starts, in_effect = positions(first.history, epoch), quotas_at(first.history, epoch)
    for name, e in first.epochs.items():
        if (starts.get(name, 0), in_effect.get(name, 0)) != (e.start, e.quota):
            raise StateError(f"the checkpoint's source {name!r} starts mixture epoch {epoch} at row {e.start} of its "
                             f"passes with quota {e.quota}, but its history {first.history} gives "
                             f"{starts.get(name, 0)} and {in_effect.get(name, 0)}; {REMEDY}")
    return first


def followed_history(mixture: MixtureView, saved: list[MixWorkerState], first: MixWorkerState) -> History:
    """The history of quotas that makes ``mixture`` stand where the checkpoint of ``saved`` (every worker's state;
    ``first``: its :func:`saved_epoch`, whose sources' data ``mixture`` follows already) stands. Refuses, naming
    saved vs current, a mid-epoch checkpoint of another mixture."""
    epoch = first.epoch
    latest = [state for state in saved if state.epoch == epoch]
    for source in mixture.planned_sources:
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
        return [(e, dict(q)) for e, q in first.history]
    # the next epoch may differ: kept sources go on from where the saved epoch left them
    names = set(mixture.names)
    kept = [(e, {n: q for n, q in quotas.items() if n in names}) for e, quotas in first.history if e <= epoch]
    return [*kept, (epoch + 1, mixture.quotas())]


def check_with_mixture(mixture: MixtureView, state: MixWorkerState) -> None:
    """A worker state loaded into the mixture itself (a plain ``StatefulDataLoader``'s path; a
    ``MixtureDataLoader`` has followed its checkpoint first): refused unless taken on the mixture's data and, inside
    its epoch, with the starts and quotas the mixture gives that epoch."""
    if state.epoch_complete:   # (its epoch yields no more: the next one starts from the mixture's own history)
        return
    for source in mixture.planned_sources:
        if source.name in state.data:
            _check_source_data(source, state.data[source.name])
    history = mixture.history
    starts, in_effect = positions(history, state.epoch), quotas_at(history, state.epoch)
    current = {name: (starts.get(name, 0), in_effect.get(name, 0)) for name in mixture.names}
    saved = {name: (e.start, e.quota) for name, e in state.epochs.items()}
    if current != saved:
        raise StateMismatchError(f"the checkpoint is inside mixture epoch {state.epoch}, taken with sources and quotas "
                                 f"{{{_describe(saved)}}}; this mixture has {{{_describe(current)}}}. Mid-epoch, the "
                                 f"mixture cannot change: {_FINISH}")


def leave_tracks(mixture: MixtureView, epoch: int, saved: tuple[int, int], current: tuple[int, int]) -> None:
    """A checkpoint whose passes were laid out in tracks (mixture state version 3 or older), resumed on another
    topology: from ``epoch + 1`` on the mixture lays its passes out in spans, which is exact only where every
    source's pass ends with ``epoch`` (what tracks leave of a pass depends on the topology that read it);
    elsewhere, a ``StateMismatchError`` with the way out."""
    if mixture.pass_layout != TRACKS:
        return
    after = positions(mixture.history, epoch + 1)
    inside = {s.name: after.get(s.name, 0) % s.plan.num_rows for s in mixture.planned_sources
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


def replanned_from(mixture: MixtureView, states: list[MixWorkerState]) -> tuple[MixElastic, int, int] | None:
    """States taken inside an epoch re-planned for their topology: what the mixture lays that epoch out again
    from (the old cursors they keep, every worker's the same, each checked against its old slot's parts, and
    the topology it was re-planned for); None: the states are of an epoch as planned. ``mixture`` has no
    re-planned epoch while they are checked."""
    replanned = [s for s in states if s.elastic is not None]
    if not replanned:
        return None
    first = replanned[0]
    if any(s.elastic != first.elastic for s in replanned):
        raise StateError(f"the workers' states disagree on the epoch they were re-planned from; {REMEDY}")
    elastic = first.elastic
    assert elastic is not None, "a re-planned state"
    if elastic.epoch != first.epoch:
        raise StateError(f"the mixture worker state in epoch {first.epoch} was re-planned from epoch {elastic.epoch}; "
                         f"{REMEDY}")
    if (elastic.pass_layout, first.options.get("pass_layout")) == (SPANS, TRACKS):
        raise StateError(f"the mixture worker state's elastic.pass_layout is {SPANS!r} but its options.pass_layout "
                         f"{TRACKS!r}: an epoch laid out in spans is never followed by tracks; {REMEDY}")
    _check_old_cursors(mixture, elastic, first)
    return elastic, first.world_size, first.num_workers


def _check_old_cursors(mixture: MixtureView, elastic: MixElastic, state: MixWorkerState) -> None:
    """Refuse an old slot's cursors of the epoch ``state`` is in, re-planned from them, unless each names the
    sources of that epoch and stands where its ``taken`` says in that slot's parts of its source (the re-plan
    reads what each old slot had left from there; a source this mixture lacks, left out at the epoch's end,
    cannot be checked)."""
    chain: list[MixElastic] = []   # innermost first: each re-plan's old slots read the one before it
    link: MixElastic | None = elastic
    while link is not None:
        chain.append(link)
        link = link.before
    for depth, link in enumerate(reversed(chain)):
        where = "elastic" + ".before" * (len(chain) - 1 - depth)
        old_parts = mixture.epochs.old_parts(state.history, link)
        for index, cursors in enumerate(link.cursors):
            if cursors is None:
                continue
            if sorted(cursors) != sorted(state.epochs):
                raise StateError(f"the mixture worker state's {where}.cursors[{index}] names source(s) "
                                 f"{sorted(cursors)}, its epoch {state.epoch} has {sorted(state.epochs)}; {REMEDY}")
            parts = old_parts[index]
            for name, cursor in cursors.items():
                if name in parts:
                    check_source_cursor(cursor, parts[name], **_reading(mixture),
                                        where=f"mixture worker state's {where}.cursors[{index}].{name}")


def _reading(mixture: MixtureView) -> dict[str, Any]:
    """How the mixture's slots read a part of a source (what a cursor in it depends on)."""
    options = mixture.options
    return {"interleave": options.interleave, "block_size": block_size_for(options.batch_size, options.interleave),
            "buffer_rows": options.shuffle_buffer_size}


def check_worker_options(mixture: MixtureView, state: MixWorkerState, slot: MixSlot, elastic: bool = False) -> None:
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


def check_worker_state(mixture: MixtureView, state: MixWorkerState, slot: MixSlot,
                       elastic: bool = False) -> MixWorkerState:
    """``state``, refused unless it is a position the worker ``slot`` reaches in the mixture as it stands
    (``elastic``: see :func:`check_worker_options`): its epoch's sources as its history says, and inside the
    epoch its counters, its rows of each source and each source's cursor where they say (at its end, when it says
    it is done with its epoch)."""
    check_worker_options(mixture, state, slot, elastic)
    where = f"mixture worker state of rank {slot.rank} worker {slot.worker_id}"
    check_sources(state, where)
    if state.epoch_complete:
        check_finished(mixture, state, slot, where)
        return state
    known = set(mixture.names)
    unknown, missing = sorted(set(state.epochs) - known), sorted(known - set(state.epochs))
    if unknown:
        raise StateMismatchError(f"the checkpoint is inside mixture epoch {state.epoch} with source(s) {unknown} that "
                                 f"this mixture lacks: {_FINISH}")
    if missing:
        raise StateMismatchError(f"the checkpoint is inside mixture epoch {state.epoch} without source(s) {missing} "
                                 f"that this mixture has: {_FINISH}")
    if state.history[-1][0] > state.epoch:
        raise refuse(f"{where}'s history", f"changes the quotas from epoch {state.history[-1][0]} on, after its own "
                                           f"epoch {state.epoch} (a mixture changes at the boundary it is loaded at)")
    # the epoch as the state's own history lays it out (follow() has matched it with the mixture's)
    parts_of = mixture.epochs.parts(state.history, slot)
    names = mixture.names
    total, limit = slot_counts(mixture, state, slot)
    quotas = [parts_of[name].rows for name in names]
    assert sum(quotas) == total
    check_counters(state, names, quotas, limit, batch_size=mixture.batch_size, drop_last=mixture.options.drop_last,
                   where=where)
    for name in names:
        check_source_cursor(state.cursors[name], parts_of[name], **_reading(mixture), where=f"{where}'s sources.{name}")
    return state


def check_sources(state: MixWorkerState, where: str) -> None:
    """Refuse ``state`` unless each source's start and quota in its epoch are those its history gives."""
    starts, in_effect = positions(state.history, state.epoch), quotas_at(state.history, state.epoch)
    for name, e in state.epochs.items():
        if (starts.get(name, 0), in_effect.get(name, 0)) != (e.start, e.quota):
            raise refuse(f"{where}'s sources.{name}", f"starts mixture epoch {state.epoch} at row {e.start} of its "
                                                      f"passes with quota {e.quota}, but its history "
                                                      f"{state.history} gives {starts.get(name, 0)} and "
                                                      f"{in_effect.get(name, 0)}")
    for name in sorted(set(in_effect) - set(state.epochs)):
        if in_effect[name]:
            raise refuse(f"{where}'s sources", f"lack source {name!r}, whose quota in epoch {state.epoch} is "
                                               f"{in_effect[name]} by its history")


def check_epochs(states: Sequence[tuple[MixWorkerState, MixSlot]]) -> None:
    """Refuse a checkpoint with a worker inside an epoch before another worker's, of any rank (that worker would
    never finish it)."""
    latest = max(state.epoch for state, _ in states)
    for state, slot in states:
        if state.epoch < latest and not state.epoch_complete:
            raise StateError(f"the checkpoint's rank {slot.rank} worker {slot.worker_id} is inside mixture epoch "
                             f"{state.epoch}, another worker in epoch {latest}: a worker starts an epoch only when "
                             f"its loader does; {REMEDY}")


def counted_with(state: MixWorkerState) -> tuple[int, bool, bool]:
    """The ``batch_size``, ``drop_last`` and ``even_batches`` a state's batches were counted with."""
    options = Fields(state.options, "mixture worker state's options")
    return options.integer("batch_size", 1), options.boolean("drop_last"), options.boolean("even_batches")


def lacking_rows(mixture: MixtureView, state: MixWorkerState) -> dict[str, int]:
    """The rows of one pass of each source that gave rows to ``state``'s epoch and that ``mixture`` lacks (left
    out at this epoch boundary), as the state's data of it counts them."""
    names = set(mixture.names)
    lacking = [name for name, quota in quotas_at(state.history, state.epoch).items() if quota and name not in names]
    for name in lacking:
        if not isinstance(state.data.get(name), dict):
            raise StateError(f"the mixture worker state's epoch {state.epoch} takes rows of source {name!r}, but the "
                             f"state holds no data of it; {REMEDY}")
    return {name: DataIdentity.from_dict(Fields(state.data[name], f"the state's data of source {name!r}")).num_rows
            for name in lacking}


def slot_counts(mixture: MixtureView, state: MixWorkerState, slot: MixSlot) -> tuple[int, int | None]:
    """The rows ``slot`` takes in ``state``'s epoch (as the state's history lays it out, sources this mixture lacks
    counted too) and its batches under ``even_batches`` (None: without), as the state counts batches."""
    batch_size, drop_last, even = counted_with(state)
    totals = mixture.slot_totals(state.history, state.epoch, slot.world_size, slot.num_workers,
                                 lacking_rows(mixture, state))
    limit = even_batch_limits(totals, slot.world_size, batch_size, drop_last)[slot.index] if even else None
    return totals[slot.index], limit


def finished_state(mixture: MixtureView, state: MixWorkerState, slot: MixSlot) -> MixWorkerState:
    """``state`` done with its epoch: its counters those of its slot's stream at the end of the epoch."""
    batch_size, drop_last, _ = counted_with(state)
    rows, batches, dropped = final_counters(*slot_counts(mixture, state, slot), batch_size=batch_size,
                                            drop_last=drop_last)
    return dataclasses.replace(state, rows=rows, batches=batches, rows_dropped=dropped, epoch_complete=True)


def check_finished(mixture: MixtureView, state: MixWorkerState, slot: MixSlot, where: str) -> None:
    """Refuse a state that says its slot is done with its epoch unless its counters are those of the epoch's end
    (where a source this mixture lacks gave rows to an epoch re-planned for another topology, they cannot be
    counted: see :meth:`~arrowstream.Mixture.slot_totals`, and the state is taken as it says)."""
    if lacking_rows(mixture, state) and mixture.epochs.replanned(slot) is not None:
        return
    batch_size, drop_last, _ = counted_with(state)
    expected = final_counters(*slot_counts(mixture, state, slot), batch_size=batch_size, drop_last=drop_last)
    if (state.rows, state.batches, state.rows_dropped) != expected:
        raise refuse(f"{where}'s epoch_complete", f"is true with rows={state.rows}, batches={state.batches}, "
                                                  f"rows_dropped={state.rows_dropped}, but the slot ends mixture epoch "
                                                  f"{state.epoch} with rows={expected[0]}, batches={expected[1]}, "
                                                  f"rows_dropped={expected[2]}")
