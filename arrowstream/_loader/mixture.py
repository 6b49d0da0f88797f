"""The loader of a :class:`~arrowstream.Mixture`: the loader shell (``arrowstream._loader.shell``) with a
mixture's hooks: how its state is read and checked against the mixture's passes, and another topology (at an
epoch boundary, or the rest of an epoch re-planned, ``arrowstream._mixing.elastic``)."""

from __future__ import annotations

import copy
import inspect
import logging
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader

from .._core.fields import MAX_INT, REMEDY, Fields
from .._core.order import Slot
from .._layout.canonical_stream import CanonicalPosition
from .._mixing.stream import MixSlot
from .._planning.options import check_int
from .._state.canonical import CanonicalState
from .._state.mixture import MixElastic, MixPosition, MixWorkerState
from .._state.mixture_position import final_counters
from .._state.mixture_resume import (
    MixtureView,
    check_epochs,
    check_finished,
    check_worker_options,
    check_worker_state,
    finished_state,
    leave_tracks,
    slot_counts,
)
from .._state.versions import MIXTURE as READS_MIXTURE
from .._worker.convert import passthrough_collate
from .._worker.mixture import COMPACT
from ..errors import ArgumentTypeError, StateError, StateMismatchError
from .batches import BatchIterator
from .canonical import canonical_transfer, canonical_worker_states
from .epoch_watch import mixture_order_varies
from .options import check_loader_options
from .plain import stream_kind
from .shell import StreamLoader
from .torchdata_state import (
    InnerState,
    clear_steps_since_snapshot,
    is_inner_state,
    read_inner,
    set_iterator_finished,
    set_last_yielded_worker,
    set_worker_state,
    steps_since_snapshot,
    worker_state,
    worker_states,
)

logger = logging.getLogger("arrowstream")

class MixtureDataLoader(StreamLoader):
    """The ``StatefulDataLoader`` of a :class:`~arrowstream.Mixture` (see ``Mixture.create_dataloader``):
    ``len`` from metadata, and a state that is checked, field by field, before it is loaded. It is the
    same loader shell as :class:`~arrowstream.ArrowStreamDataLoader`: ``state_dict``, ``load_state_dict``
    (merged checkpoints, another topology), ``skip``, ``metrics`` (with the rows of each source).

    Args:
        batches_per_transfer: With workers, how many consecutive batches of one worker travel in one
            message, as for :class:`~arrowstream.ArrowStreamDataLoader` (by default about 16,384 rows'
            worth); it shapes the order of batches, so a resumed loader takes its checkpoint's.

    Example:
        >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
        >>> a = tempfile.mkdtemp()
        >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(a, "a.parquet"))
        >>> mixture = arrowstream.Mixture({"a": arrowstream.Source(a)}, batch_size=4)
        >>> loader = arrowstream.MixtureDataLoader(mixture)
        >>> len(loader), [len(batch["x"]) for batch in loader]
        (3, [4, 4, 2])
        >>> loader.skip(batches=1)   # the next epoch's first batch, passed over
        >>> mixture.set_epoch(1)
        >>> [len(batch["x"]) for batch in loader], loader.metrics()["skipped_rows"]
        ([4, 2], 4)
    """

    READS = READS_MIXTURE
    WATCH = "mixture"
    MIXTURE = True

    def __init__(self, mixture: Any, batches_per_transfer: int | None = None, **kwargs: Any) -> None:
        if stream_kind(mixture) != "mixture":
            raise ArgumentTypeError(f"dataset: MixtureDataLoader loads an arrowstream Mixture, got {type(mixture).__name__}")
        kwargs.setdefault("batch_size", None)
        kwargs.setdefault("collate_fn", passthrough_collate)
        self._replanned_epoch: int | None = None   # a checkpoint re-planned for this topology, its epoch not begun
        if mixture.canonical is not None:
            batches_per_transfer = canonical_transfer(kwargs, batches_per_transfer)
        self._start(mixture, kwargs, batches_per_transfer)

    # -- the hooks of StreamLoader ----------------------------------------------------------------------

    def _use_transport(self) -> None:
        self.dataset.worker_side.use_transport(self._transport)

    def _counted_sources(self) -> int:
        return len(self.dataset.names)

    def _meter(self) -> Any:
        return self.dataset.worker_side.metered

    def _add_metrics(self, metrics: dict[str, Any], workers: list[dict[str, Any]]) -> None:
        """The rows of each source: ``"rows/NAME"`` in the totals and in each worker's line."""
        names = self.dataset.names
        counts = [worker["per_source"] or [0] * len(names) for worker in workers]   # [] : a meter not started
        for line, count in zip(metrics["workers"], counts, strict=True):
            line.update({f"rows/{name}": count[k] for k, name in enumerate(names)})
        metrics.update({f"rows/{name}": sum(count[k] for count in counts) for k, name in enumerate(names)})

    def _order_varies(self) -> bool:
        return mixture_order_varies(self.dataset)

    def _before_iteration(self) -> None:
        self.dataset.check_canonical_epoch()   # order="canonical": in the trainer, before any worker starts
        replanned, self._replanned_epoch = self._replanned_epoch, None
        if replanned is not None and self.dataset.epoch != replanned:
            self._replanned_epoch = replanned
            raise StateMismatchError(
                f"the checkpoint is inside mixture epoch {replanned}, re-planned for this topology, but the mixture is "
                f"set to epoch {self.dataset.epoch}; call mixture.set_epoch({replanned}) to finish it first (skipping "
                "it would lose its rows)")

    def _later_epoch_starts_whole(self, inner: dict[str, Any]) -> bool:
        if self.dataset.canonical is not None:   # its checkpoints resume from the mixture, not torchdata's dict
            return False
        states = [None if s is None else MixWorkerState.from_dict(s) for s in worker_states(inner)]
        return all(s is not None and s.epoch_complete and s.epoch < self.dataset.epoch for s in states) \
            and not steps_since_snapshot(inner)

    def _epoch_start(self, worker_id: int) -> dict[str, Any]:
        mixture = self.dataset
        if mixture.canonical is not None:
            return dict(mixture.canonical_start(Slot(mixture.rank, mixture.world_size, worker_id,
                                                     self.num_workers)).to_dict())
        slot = MixSlot(mixture.epoch, mixture.rank, mixture.world_size, worker_id, self.num_workers)
        return dict(mixture.start_state(slot).to_dict())

    def _handed_out(self, inner: dict[str, Any], batches: BatchIterator) -> dict[str, Any]:
        if not batches.inside_chunk:
            return inner
        assert batches.chunk is not None   # torchdata stands after the whole chunk: step back
        inner = copy.deepcopy(inner)
        worker_id = batches.chunk.worker_id
        position = batches.chunk.positions[batches.taken - 1]
        raw = worker_state(inner, worker_id)
        if isinstance(position, CanonicalPosition):   # order="canonical": each of its canonical slots'
            set_worker_state(inner, worker_id, self._moved_state(raw, position, f"worker {worker_id} state"))
            set_last_yielded_worker(inner, (worker_id - 1) % self.num_workers)
            return inner
        after = MixWorkerState.from_dict(raw)
        set_worker_state(inner, worker_id, after.at(position, self.dataset.names).to_dict())
        set_last_yielded_worker(inner, (worker_id - 1) % self.num_workers)
        return inner

    def _expanded(self, inner: dict[str, Any]) -> dict[str, Any]:
        """torchdata's state with each worker's compact state (see ``Mixture.state_dict``) made whole."""
        mixture = self.dataset
        compact = [(index, state[COMPACT]) for index, state in enumerate(worker_states(inner))
                   if isinstance(state, dict) and COMPACT in state]
        if not compact:
            return inner
        inner = copy.deepcopy(inner)
        for worker_id, (epoch, rows, batches, dropped, complete, cursors) in compact:
            position = MixPosition(rows, batches, dropped, complete, tuple(
                (part, None if fields is None else (tuple(tuple(lane) for lane in fields[0]), *fields[1:]), taken)
                for part, fields, taken in cursors))
            slot = MixSlot(epoch, mixture.rank, mixture.world_size, worker_id, self.num_workers)
            set_worker_state(inner, worker_id, mixture.start_state(slot).at(position, mixture.names).to_dict())
        return inner

    def _load_ledger(self, outers: list[dict[str, Any]]) -> bool:
        if self.dataset.canonical is None:
            return False
        saved = canonical_worker_states(outers, READS_MIXTURE)   # every worker's, whatever the topology
        epoch = self.dataset.load_canonical(saved, "checkpoint")
        self.dataset.set_epoch(epoch)
        self._batch_iterator = None
        self._replanned_epoch = None
        self._load_torchdata({})
        return True

    def _forget_loaded(self) -> None:
        self.dataset.forget_loaded()

    def _iteration_started(self) -> None:
        self.dataset.forget_loaded()   # order="canonical": the workers have their copies of the loaded states

    def _joins_parts(self) -> bool:
        return self.dataset.canonical is not None

    def _moved_state(self, raw: Any, position: Any, where: str) -> dict[str, Any]:
        """A canonical worker state (a dict) moved to ``position`` (each of its canonical slots')."""
        state = CanonicalState.from_dict(raw, where, reads=READS_MIXTURE)
        return state.moved(position.positions, self.dataset.names, position.past, position.past_rows).to_dict()

    def _load_own(self, outer: dict[str, Any]) -> None:
        mixture = self.dataset
        fields = Fields(outer, f"rank {mixture.rank}'s mixture loader state")
        inner, parsed, states = _read_rank(fields, self.snapshot_every_n_steps)
        # its buffer (when left to the default), batch order, and the data of an Iceberg table moved on since: its
        # snapshot (before any check)
        mixture.adopt_checkpoint(states[0])
        mixture.adopt_replanned(states)
        slots = [MixSlot(s.epoch, mixture.rank, mixture.world_size, worker_id, self.num_workers)
                 for worker_id, s in enumerate(states)]
        for state, slot in zip(states, slots, strict=True):
            check_worker_options(mixture, state, slot)
        if parsed.finished:   # taken after the loop ended: every worker is done with its epoch
            # (before the positions are checked: a source left out at this epoch boundary is no source of the
            # saved epoch's positions)
            states = _finished(inner, parsed, states, mixture, mixture.rank, mixture.world_size, self.num_workers)
        check_epochs(list(zip(states, slots, strict=True)))
        for state, slot, done in zip(states, slots, parsed.done, strict=True):
            check_worker_state(mixture, state, slot)
            if done and not state.epoch_complete:   # torchdata's fetcher ended: the loader yields no more of it
                _check_nothing_left(mixture, state, slot)
        mixture.follow(states)   # (may refuse it: before the loader changes)
        mixture.finish_through(-1)
        self._follow_per_transfer(outer["batches_per_transfer"])
        self._batch_iterator = None
        self._load_torchdata(inner)

    def _load_other_topology(self, outers: list[dict[str, Any]]) -> None:
        self._load_at_boundary(outers)

    # -- another topology -------------------------------------------------------------------------------

    def _load_at_boundary(self, outers: list[dict[str, Any]]) -> None:
        """A checkpoint of other ranks or workers (every rank's, in rank order). At an epoch boundary the next
        epoch is laid out afresh for this topology from every source's position; inside an epoch, the rest
        of it is re-planned for this topology from every old worker's cursors (``arrowstream._mixing.elastic``)."""
        mixture = self.dataset
        states: list[MixWorkerState] = []
        old: list[tuple[MixWorkerState, MixSlot]] = []
        read = []
        for outer in outers:
            fields = Fields(outer, f"rank {outer.get('rank')}'s mixture loader state")
            world_size, num_workers = fields.integer("world_size", 1), fields.integer("num_workers")
            rank = fields.integer("rank", 0, world_size - 1)
            # snapshots that lag behind the batches yielded are counted at the end of an epoch (_finished); inside
            # one, the re-plan starts from the snapshots, so none may lag
            inner, parsed, ranks = _read_rank(fields, MAX_INT)
            if parsed.steps_since_snapshot and not parsed.finished:
                raise StateMismatchError(
                    f"rank {rank}'s mixture loader state was taken {parsed.steps_since_snapshot} batch(es) after its "
                    "workers' last snapshots (snapshot_every_n_steps > 1): another topology re-plans the rest of the "
                    f"epoch from the snapshots and would yield those batches again; resume with world_size={world_size}, "
                    f"num_workers={num_workers}, or take the checkpoint with snapshot_every_n_steps=1")
            read.append((rank, world_size, num_workers, inner, parsed, ranks))
        # its buffer (when left to the default), batch order, and an Iceberg table moved on since the checkpoint: its
        # snapshot; and, inside an epoch re-planned for the old topology, that re-plan: a loop that had ended is
        # counted to the end of its slots' rows in it (_finished), as _load_own counts it
        mixture.adopt_checkpoint(read[0][5][0])
        latest = max(s.epoch for *_, ranks in read for s in ranks)
        mixture.adopt_replanned([s for *_, ranks in read for s in ranks if s.epoch == latest])
        for rank, world_size, num_workers, inner, parsed, ranks in read:
            if parsed.finished:
                ranks = _finished(inner, parsed, ranks, mixture, rank, world_size, num_workers)
            old += [(s, MixSlot(s.epoch, rank, world_size, worker, num_workers)) for worker, s in enumerate(ranks)]
            states += ranks
        check_epochs(old)
        saved = (old[0][1].world_size, old[0][1].num_workers)
        if all(s.epoch_complete for s, _ in old):
            mixture.adopt_replanned(states)   # (an epoch re-planned for the old topology: its slots' rows)
            for state, slot in old:   # each at the end of its epoch
                check_finished(mixture, state, slot, f"mixture worker state of rank {slot.rank} worker {slot.worker_id}")
            epoch = mixture.follow(states)
            mixture.use_replanned(None)
            leave_tracks(mixture, epoch, saved, (mixture.world_size, self.num_workers))
            mixture.finish_through(epoch)
            self._load_torchdata({})
            return
        self._load_replanned(old, states)

    def _load_replanned(self, old: list[tuple[MixWorkerState, MixSlot]], states: list[MixWorkerState]) -> None:
        """The rest of a saved epoch, re-planned over this loader's ranks and workers."""
        mixture = self.dataset
        # inside an epoch itself re-planned (for the old topology): its slots' parts are those of that re-plan, and
        # the new one is of them (its ``before``), checked like every old cursor
        mixture.adopt_replanned([s for s in states if s.epoch == max(t.epoch for t in states)])
        before = mixture.epochs.elastic
        epoch = max(s.epoch for s in states)
        for state, slot in old:
            check_worker_state(mixture, state, slot, elastic=True)
        mixture.follow(states)
        cursors = tuple(None if s.epoch_complete or s.epoch < epoch else dict(s.cursors) for s, _ in old)
        _, first = old[0]
        elastic = MixElastic(epoch, first.world_size, first.num_workers, cursors, mixture.pass_layout,
                             before=None if before is None else before[0])
        leave_tracks(mixture, epoch, (first.world_size, first.num_workers), (mixture.world_size, self.num_workers))
        mixture.use_replanned((elastic, mixture.world_size, self.num_workers))
        mixture.slot_quotas(self.num_workers, epoch)   # re-planned now: a state that does not add up is refused here
        mixture.finish_through(-1)
        self._replanned_epoch = epoch
        logger.info("elastic resume: the rest of mixture epoch %d, saved with world_size=%d, num_workers=%d, is "
                    "re-planned for world_size=%d, num_workers=%d", epoch, first.world_size, first.num_workers,
                    mixture.world_size, self.num_workers)
        self._load_torchdata({})


def _read_rank(fields: Fields, snapshot_every_n_steps: int) -> tuple[dict[str, Any], InnerState, list[MixWorkerState]]:
    """A rank's mixture loader state (``fields``): a copy of torchdata's dict inside, every field of it that
    torchdata reads checked, and its workers' states parsed."""
    inner = copy.deepcopy(fields.value.get("dataloader"))
    if not isinstance(inner, dict) or not is_inner_state(inner):
        raise StateError(f"the {fields.where}'s dataloader is not a StatefulDataLoader state; {REMEDY}")
    parsed = read_inner(inner, snapshot_every_n_steps, f"{fields.where}'s dataloader")
    num_workers = fields.integer("num_workers")
    if parsed.num_workers != num_workers:
        raise StateError(f"the {fields.where} holds {len(parsed.worker_states)} worker state(s) for num_workers="
                         f"{num_workers}; {REMEDY}")
    states = []
    for worker_id, raw in enumerate(parsed.worker_states):
        if raw is None:
            raise StateError(f"the {fields.where} holds no state for worker {worker_id}; {REMEDY}")
        states.append(MixWorkerState.from_dict(raw, f"worker {worker_id}'s mixture state"))
    return inner, parsed, states


def _check_nothing_left(mixture: MixtureView, state: MixWorkerState, slot: MixSlot) -> None:
    """Refuse a state inside its epoch with batches left that torchdata's dict says its loader yields no more of
    (its fetcher ended)."""
    batch_size, drop_last = mixture.batch_size, mixture.options.drop_last
    _, batches, _ = final_counters(*slot_counts(mixture, state, slot), batch_size=batch_size, drop_last=drop_last)
    if state.batches < batches:
        raise StateError(f"the mixture loader state's fetcher_state.fetcher_ended is true, so the loader would yield "
                         f"nothing more of mixture epoch {state.epoch}, but its worker state stands after "
                         f"{state.batches} of its {batches} batches; {REMEDY}")


def _finished(inner: dict[str, Any], parsed: InnerState, states: list[MixWorkerState], mixture: MixtureView, rank: int,
              world_size: int, num_workers: int) -> list[MixWorkerState]:
    """The states of a loader whose loop had ended, marked done with their epoch, their counters at its end
    (checked: the batches they had left are those yielded after their snapshots), in ``inner`` too."""
    left, done = 0, []
    for worker_id, state in enumerate(states):
        slot = MixSlot(state.epoch, rank, world_size, worker_id, num_workers)
        if not state.epoch_complete:   # (counted only where a state says its epoch goes on: its last batch says so)
            finished = finished_state(mixture, state, slot)
            if state.batches > finished.batches:
                raise StateError(f"the mixture loader state's worker {worker_id} counts {state.batches} batch(es) of "
                                 f"mixture epoch {state.epoch}, but its slot yields {finished.batches}; {REMEDY}")
            left += finished.batches - state.batches
            state = finished
        done.append(state)
    if left != parsed.steps_since_snapshot:
        raise StateError(f"the mixture loader state says the epoch ended, but its workers have {left} batch(es) "
                         f"left against {parsed.steps_since_snapshot} yielded since their snapshots; {REMEDY}")
    for worker_id, state in enumerate(done):
        set_worker_state(inner, worker_id, state.to_dict())
    clear_steps_since_snapshot(inner)
    set_iterator_finished(inner, False)
    return done


_LOADER_PARAMS = (set(inspect.signature(StatefulDataLoader.__init__).parameters) - {"self", "dataset"}) | {
    "batches_per_transfer"}


def build_mixture_loader(mixture_cls: type, mixture_args: dict[str, Any], *, num_workers: int,
                         **kwargs: Any) -> tuple[MixtureDataLoader, Any]:
    """Split keywords between the mixture and the loader, build both."""
    check_int("num_workers", num_workers, 0)
    params = set(inspect.signature(mixture_cls).parameters)
    mixture_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in params}
    unknown = sorted(set(kwargs) - _LOADER_PARAMS)
    reserved = sorted(set(kwargs) & {"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"})
    if unknown or reserved:
        raise ArgumentTypeError(f"Mixture.create_dataloader: unknown keyword(s) {unknown or reserved}; mixture keywords "
                                f"are {sorted(params)}, loader keywords those of StatefulDataLoader")
    check_loader_options(num_workers, kwargs, mixture=True)
    mixture = mixture_cls(**mixture_args, **mixture_kwargs)
    return MixtureDataLoader(mixture, num_workers=num_workers, **kwargs), mixture
