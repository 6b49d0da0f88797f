"""The hooks arrowstream's loader, resume checks and tools call on a ``Mixture``: :class:`MixtureHooks`.

The front door (``arrowstream/mixture.py``) checks the arguments and offers the public API. It stands on
:class:`MixtureHooks`, as ``StructuredDataset`` stands on ``DatasetHooks``: a worker's epoch opened (the one
worker iterator over the slot's stream), and how a loaded checkpoint changes what the mixture reads (its buffer,
order inside batches, pass layout, sources' data, history of quotas, a re-planned epoch) or a refused one puts it
back (:meth:`MixtureHooks.reading`, :meth:`MixtureHooks.read_as`). What the mixture reads (its sources as planned,
quotas, the epochs' layout) is its base, ``_loader/mixture_sources.py``'s ``PlannedMixture``. The per-batch path
is the stream's (``_mixing/stream.py``).
"""

from __future__ import annotations

import dataclasses
import functools
from types import FrameType
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from torch.utils.data import get_worker_info

from .._assignment.canonical import refuse_plain_loader
from .._core.order import Slot
from .._layout.canonical import check_workers
from .._layout.canonical_stream import CanonicalPosition, CanonicalStream, pass_over
from .._mixing.layout import MixEpochs
from .._mixing.quotas import quotas_at
from .._mixing.schema import caster
from .._mixing.stream import MixSlot, MixStream
from .._planning.auto_buffer import adopted
from .._sources.mixture import Planned
from .._state.canonical import CanonicalState, rank_states
from .._state.mixture import MixElastic, MixPosition, MixWorkerState, SourceCursor, SourceEpoch
from .._state.mixture_resume import check_worker_state, finished_state, followed_history, replanned_from, saved_epoch
from .._state.versions import MIXTURE
from .._worker.iterator import Opened, SlotIterator
from .._worker.metrics import Meter
from .._worker.mixture import (
    MixOutput,
    MixReading,
    MixSide,
    SharedReading,
    finished_stream,
    open_stream,
    opened,
    start_in_epoch,
)
from .._worker.shm import guard_feeder
from .._worker.transport import default_batches_per_transfer
from ..errors import StateMismatchError
from .mixture_canonical import inner_start
from .mixture_sources import PlannedMixture

if TYPE_CHECKING:
    from .._planning.arguments import MixtureArguments
    from .._planning.options import Options


@dataclasses.dataclass(frozen=True, eq=False)
class MixtureReading:
    """What a mixture reads that loading a checkpoint may change (see :meth:`MixtureHooks.reading`)."""

    sources: tuple[Planned, ...]   # each source's data (an Iceberg table's snapshot), plan and storage
    schema: pa.Schema
    quotas: dict[str, int]
    history: tuple[tuple[int, dict[str, int]], ...]
    epoch: int
    finished_epoch: int
    options: Options
    epochs: MixEpochs
    elastic: tuple[MixElastic, int, int] | None   # (set on ``epochs`` in place: kept beside it)
    batch_order: str
    pass_layout: str


class MixtureHooks(PlannedMixture):
    """A mixture's worker epochs and checkpoints, for the front door ``Mixture`` to stand on."""

    def __init__(self, arguments: MixtureArguments) -> None:
        super().__init__(arguments)   # every source planned (_loader.mixture_sources)
        self._finished_epoch = -1   # epochs up to it were finished by a checkpoint loaded with another topology
        self._pending: MixWorkerState | None = None
        self._active: SlotIterator[MixPosition, MixWorkerState] | None = None
        self._side = MixSide(len(self.names))   # the loader's transport and metrics; this process's meter

    # -- a worker's epoch ---------------------------------------------------------------------

    def _slot(self) -> MixSlot:
        info = get_worker_info()
        if info is None:
            return MixSlot(self.epoch, self._rank, self._world_size, 0, 0)
        return MixSlot(self.epoch, self._rank, self._world_size, info.id, info.num_workers)

    def start_state(self, slot: MixSlot) -> MixWorkerState:
        """The state of ``slot`` before the first batch of its epoch (done with it, its counters at its end, in
        an epoch a checkpoint loaded with another topology finished)."""
        starts, quotas = self.epoch_starts(slot.epoch), quotas_at(self._stood(), slot.epoch)
        elastic = self._epochs.replanned(slot)
        state = MixWorkerState(slot.epoch, slot.rank, slot.world_size, slot.worker_id, slot.num_workers, 0, 0, 0,
                               False, self.state_options(), self.history,
                               {name: SourceEpoch(starts[name], quotas.get(name, 0)) for name in starts},
                               {name: SourceCursor(0, None, 0) for name in starts},
                               {s.name: s.data for s in self._sources}, elastic)
        if slot.epoch <= self._finished_epoch:
            state = finished_state(self, state, slot)
        return state

    def _iterate(self, caller: FrameType | None) -> SlotIterator[MixPosition, MixWorkerState]:
        """``iter(mixture)`` called from ``caller`` (a frame): this process's iterator over its slot's rows."""
        # a DataLoader of the user's with a batch_size of its own is refused, torch's plain one warned (_loader.plain)
        self._loader_watch.check(self, caller)
        info = get_worker_info()
        if info is not None:
            guard_feeder(info.id)
        pending, self._pending = self._pending, None
        if info is None:   # the trainer's process (a loader with workers warns in its own __iter__)
            self.warn_trims(0)
        if self._canonical is not None:   # order="canonical": this slot's canonical slots side by side
            self._active = self._iterate_canonical()   # type: ignore[assignment]
            return self._active   # type: ignore[return-value]
        self._active = SlotIterator(functools.partial(self._open, pending),
                                    before=lambda: pending or self.start_state(self._slot()), epoch=lambda: self.epoch)
        return self._active

    def _open(self, pending: MixWorkerState | None) -> Opened[MixPosition, MixWorkerState]:
        """This process's slot's epoch, opened (from ``pending``, a loaded state, if any)."""
        slot = self._slot()
        start = start_in_epoch(pending, slot) or self.start_state(slot)
        options = self._options
        output = MixOutput(options.output_format, self._schema, self._fill_nulls, self._transform)
        if slot.epoch <= self._finished_epoch or start.epoch_complete:   # nothing left in this epoch
            # a meter of its own: nothing is read, so the process's meter is not started (no line in the metrics)
            return opened(self._side, finished_stream(slot, start, options.batch_size), output, Meter())
        meter = self._side.meter()
        schemas = self._source_schemas()
        layout = self._epochs.with_history(
            self._stood(), even_batches=self._even_batches, drop_last=options.drop_last,
            batch_order=self._batch_order if options.shuffle_buffer_size > 0 else None)
        reading = MixReading(
            options, tuple(self._sources), self.file_bases(),
            casts={s.name: caster(schemas[s.name], self._schema, s.name, self._source_column) for s in self._sources},
            fill_nulls=self._fill_nulls,
            epoch=layout.slot_epoch(Slot(slot.rank, slot.world_size, slot.worker_id, slot.num_workers), slot.epoch))
        return opened(self._side, open_stream(reading, start, meter), output, meter)

    # -- order="canonical" ----------------------------------------------------------------------

    def _physical(self) -> Slot:
        slot = self._slot()
        return Slot(slot.rank, slot.world_size, slot.worker_id, slot.num_workers)

    def _iterate_canonical(self) -> SlotIterator[CanonicalPosition, CanonicalState]:
        """This process's iterator over its canonical slots' chunks, side by side (``order="canonical"``)."""
        assert self._canonical is not None
        info = get_worker_info()
        check_workers(self._canonical.canonical, self._world_size, 0 if info is None else info.num_workers)
        pending = self._canonical_pending(self._physical())
        self.forget_loaded()   # this process has it now (a worker's copy, or the trainer's without workers)
        return SlotIterator(functools.partial(self._open_canonical, pending),
                            before=lambda: pending or self.canonical_start(self._physical()), epoch=lambda: self.epoch)

    def _canonical_pending(self, slot: Slot) -> CanonicalState | None:
        """The loaded states of ``slot``'s canonical slots in this epoch (None: the epoch starts whole); refused when
        the checkpoint stands inside another epoch than the mixture's (its rows would be lost)."""
        layout = self._canonical
        assert layout is not None
        if layout.resume_epoch < 0:
            return None
        if layout.resume_epoch != self.epoch:
            self.check_canonical_epoch()
            return None
        loaded = [layout.resume[c] for c in layout.canonical.physical_range(slot)]
        return CanonicalState.of(MIXTURE, self.epoch, slot, layout.canonical.slots, tuple(at.state for at in loaded),
                                 self.state_options(), tuple(at.past for at in loaded))

    def check_canonical_epoch(self) -> None:
        """Under ``order="canonical"``, refuse to iterate another epoch than a loaded mid-epoch checkpoint's (its rows
        would be lost). For arrowstream's loader too, before any worker starts."""
        layout = self._canonical
        if layout is None or layout.resume_epoch < 0 or layout.resume_epoch == self.epoch:
            return
        chunks = self.canonical_chunks(layout.resume_epoch)
        if any(not at.state.epoch_complete and at.batches < chunks for at in layout.resume.values()):
            raise StateMismatchError(
                f"the checkpoint is in mixture epoch {layout.resume_epoch} (mid-epoch) but the mixture is set to "
                f"epoch {self.epoch}; call mixture.set_epoch({layout.resume_epoch}) before iterating to finish "
                "the saved epoch, or start without loading the checkpoint")

    def canonical_start(self, slot: Slot) -> CanonicalState:
        """``slot``'s state before its next batch under ``order="canonical"``: the loaded one, or its canonical slots
        at the start of the epoch."""
        layout = self._canonical
        assert layout is not None
        loaded = self._canonical_pending(slot)
        if loaded is not None:
            return loaded
        options, history, starts = self.canonical_state_options(), self._stood(), self.epoch_starts(self.epoch)
        data = {s.name: s.data for s in self._sources}
        states = tuple(inner_start(MixSlot(self.epoch, c, layout.canonical.slots, 0, 0), options, history, starts, data)
                       for c in layout.canonical.physical_range(slot))
        return CanonicalState.of(MIXTURE, self.epoch, slot, layout.canonical.slots, states, self.state_options())

    def _open_canonical(self, pending: CanonicalState | None) -> Opened[CanonicalPosition, CanonicalState]:
        """This process's canonical slots' streams of the epoch, side by side, from ``pending`` (loaded states of
        this epoch) or the epoch's start."""
        layout = self._canonical
        assert layout is not None
        # refused at the first batch (a worker's error torch hands over as any batch's, and shuts down cleanly)
        refuse_plain_loader(self._side.transport.send_chunks, "Mixture.create_dataloader, or MixtureDataLoader")
        slot = self._physical()
        start = pending if pending is not None and pending.epoch == self.epoch else self.canonical_start(slot)
        inner = self.canonical_options()
        output = MixOutput(inner.output_format, self._schema, self._fill_nulls, self._transform)
        meter = self._side.meter()
        schemas = self._source_schemas()
        epochs = self.canonical_epochs().with_history(
            self._stood(), even_batches=True, drop_last=inner.drop_last,
            batch_order=self._batch_order if inner.shuffle_buffer_size > 0 else None)
        casts = {s.name: caster(schemas[s.name], self._schema, s.name, self._source_column) for s in self._sources}
        streams: list[MixStream[MixPosition, MixWorkerState]] = []
        shared = SharedReading()   # small sources held once, parts of one unit decoded once, for all of them
        for index, (number, state) in enumerate(zip(layout.canonical.physical_range(slot), start.states, strict=True)):
            inner_slot = MixSlot(self.epoch, number, layout.canonical.slots, 0, 0)
            if state.epoch_complete:
                streams.append(finished_stream(inner_slot, state, inner.batch_size))
                continue
            reading = MixReading(inner, tuple(self._sources), self.file_bases(), casts=casts,
                                 fill_nulls=self._fill_nulls,
                                 epoch=epochs.slot_epoch(Slot(number, layout.canonical.slots, 0, 0), self.epoch))
            opened_stream = open_stream(reading, state, meter, shared)
            pass_over(opened_stream, start.past_of(index), number)
            streams.append(opened_stream)
        stream = CanonicalStream(streams, slot, layout.canonical.slots, self.state_options(), reads=MIXTURE,
                                 per_fill=default_batches_per_transfer(inner.batch_size * len(streams)))
        return opened(self._side, stream, output, meter)   # type: ignore[arg-type, return-value]

    def load_canonical(self, saved: list[CanonicalState], where: str) -> int:
        """Resume from the worker states of a checkpoint of ``order="canonical"`` (of any topology that divides the
        canonical slots): each of this rank's canonical slots goes on from its state, checked; returns the epoch. A
        refused checkpoint leaves the mixture as it was. For arrowstream's loader and :meth:`load_state_dict`."""
        layout = self._canonical
        if layout is None:
            raise StateMismatchError(
                f"the {where} was taken with order='canonical' (canonical_slots={saved[0].slots}); this mixture has "
                f"order='topology'. Build it with order='canonical', canonical_slots={saved[0].slots} to resume")
        before = self.reading()
        try:
            found = rank_states(saved, layout.canonical.slots, self._rank, self._world_size, where)
            wanted = list(found)
            first = found[wanted[0]].state
            self._adopt_saved(saved[0].head.options)   # its buffer (left to the default here), batch order, layout
            self._follow_sources(first.data)   # an Iceberg table moved on since: the checkpoint's snapshot
            view = self.canonical_view()
            for c in wanted:
                check_worker_state(view, found[c].state, MixSlot(first.epoch, c, layout.canonical.slots, 0, 0))   # type: ignore[arg-type]
            epoch = self.follow([found[c].state for c in wanted])
        except BaseException:   # a refused state leaves the mixture reading what it read
            self.read_as(before)
            raise
        layout.resume = found
        layout.resume_epoch = epoch
        self._pending, self._active = None, None
        return epoch

    def forget_loaded(self) -> None:
        """Under ``order="canonical"``, forget the canonical slots' loaded states: an empty state is loaded, or they
        were handed to the iteration of their epoch (or it is another), so a later epoch, or the same one iterated
        again, starts whole. For arrowstream's loader too, once its workers have their copies."""
        if self._canonical is not None:
            self._canonical.forget()

    @property
    def worker_side(self) -> MixSide:
        """The mixture's handle on the processes that read it: the loader hands it its transport (and metrics
        board) before any worker starts, and reads the trainer's meter from it (for arrowstream's loader).

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> a = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(a, "a.parquet"))
            >>> arrowstream.Mixture({"a": arrowstream.Source(a)}).worker_side.transport.batches_per_transfer
            1
        """
        return self._side

    # -- checkpoints --------------------------------------------------------------------------    # -- checkpoints --------------------------------------------------------------------------

    def _adopt_saved(self, saved_options: dict[str, Any]) -> None:
        """Take a checkpoint's ``shuffle_buffer_size`` (when left to the default here), its order inside
        batches (``permuted`` in a state older than the option) and its pass layout (``tracks`` in a state older
        than the option): for the checkpoint's epoch and later ones."""
        self.use_pass_layout(saved_options["pass_layout"])   # (MixWorkerState.from_dict has checked both)
        options = adopted(self._options, saved_options)   # its layout is made again with the checkpoint's buffer
        if options is not None:
            self._options = options
            self._epochs = self._layout()
        self._batch_order = saved_options["batch_order"]

    def reading(self) -> MixtureReading:
        """What loading a checkpoint may change of what this mixture reads: its sources' data (an Iceberg table's
        snapshot) with their plans, quotas and schema, its epoch and history of quotas, how it shuffles and lays its
        epochs out (its buffer, its order inside batches, its pass layout, a re-planned epoch); :meth:`read_as` puts
        it back when the checkpoint is refused. For arrowstream's loader, as ``StructuredDataset.reading``.

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> a = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(a, "a.parquet"))
            >>> mixture = arrowstream.Mixture({"a": arrowstream.Source(a)}, batch_size=4)
            >>> before = mixture.reading()
            >>> mixture.use_pass_layout("tracks")
            >>> mixture.set_epoch(3)
            >>> mixture.read_as(before)
            >>> mixture.pass_layout, mixture.epoch
            ('spans', 0)
        """
        return MixtureReading(tuple(self._sources), self._schema, dict(self._quotas), tuple(self._stood()), self.epoch,
                              self._finished_epoch, self._options, self._epochs, self._epochs.elastic,
                              self._batch_order, self._pass_layout)

    def read_as(self, reading: MixtureReading) -> None:
        """Read as :meth:`reading` said, from now on (a refused checkpoint leaves the mixture as it was)."""
        self._sources, self._schema, self._quotas = list(reading.sources), reading.schema, dict(reading.quotas)
        self._use_history(list(reading.history))
        self._epoch_cell[0] = reading.epoch
        self._finished_epoch = reading.finished_epoch
        self._options, self._epochs, self._batch_order = reading.options, reading.epochs, reading.batch_order
        self._epochs.elastic = reading.elastic
        self.use_pass_layout(reading.pass_layout)

    def adopt_checkpoint(self, state: MixWorkerState) -> None:
        """Read as the checkpoint of worker state ``state`` was taken: its shuffle buffer (when this mixture's was
        left to the default), its order inside batches and its pass layout, in its epoch and later ones; and the
        data it was taken on where a source has moved on since (an Iceberg table: the checkpoint's snapshot). For
        arrowstream's loader and :meth:`load_state_dict`, before they check the checkpoint's states.

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> a = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(a, "a.parquet"))
            >>> mixture = arrowstream.Mixture({"a": arrowstream.Source(a)}, batch_size=4)
            >>> saved = arrowstream.Mixture({"a": arrowstream.Source(a)}, batch_size=4).state_dict()
            >>> mixture.adopt_checkpoint(MixWorkerState.from_dict(saved))
            >>> mixture.pass_layout
            'spans'
        """
        self._adopt_saved(state.options)
        self._follow_sources(state.data)

    def follow(self, saved: list[MixWorkerState]) -> int:
        """Stand where the checkpoint of ``saved`` (every worker's state, checked) stands: its epoch and history of
        quotas (a new one where it ends an epoch: kept sources go on from their positions); returns the epoch.
        Refuses, naming saved vs current, a mid-epoch checkpoint of another mixture. For arrowstream's loader.

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> a = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(a, "a.parquet"))
            >>> mixture = arrowstream.Mixture({"a": arrowstream.Source(a)}, batch_size=4)
            >>> mixture.follow([MixWorkerState.from_dict(mixture.state_dict())])
            0
        """
        first = saved_epoch(saved)
        self._follow_sources(first.data)   # an Iceberg table moved on since: its checkpoint's snapshot
        self._use_history(followed_history(self, saved, first))
        self._epoch_cell[0] = first.epoch
        return first.epoch

    def adopt_replanned(self, states: list[MixWorkerState]) -> None:
        """Lay the epoch of ``states`` out again as they were re-planned for their topology, from the old cursors
        they keep (each checked); as planned where none was re-planned. For arrowstream's loader.

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> a = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(a, "a.parquet"))
            >>> mixture = arrowstream.Mixture({"a": arrowstream.Source(a)}, batch_size=4)
            >>> mixture.adopt_replanned([MixWorkerState.from_dict(mixture.state_dict())])
            >>> mixture.epochs.elastic is None
            True
        """
        self._epochs.elastic = None
        self._epochs.elastic = replanned_from(self, states)

    def use_replanned(self, replanned: tuple[MixElastic, int, int] | None) -> None:
        """Lay the epoch out as re-planned from another topology's cursors for (``world_size``, ``num_workers``);
        ``None``: as planned. For arrowstream's loader, which has checked what it hands in.

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> a = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(a, "a.parquet"))
            >>> mixture = arrowstream.Mixture({"a": arrowstream.Source(a)}, batch_size=4)
            >>> mixture.use_replanned(None)
            >>> mixture.epochs.elastic is None
            True
        """
        self._epochs.elastic = replanned

    def finish_through(self, epoch: int) -> None:
        """Count the epochs up to ``epoch`` as finished by a checkpoint loaded with another topology (their workers
        start done with them); ``-1``: none. For arrowstream's loader.

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> a = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(a, "a.parquet"))
            >>> mixture = arrowstream.Mixture({"a": arrowstream.Source(a)}, batch_size=4)
            >>> mixture.finish_through(0)
            >>> mixture.state_dict()["epoch_complete"]
            True
        """
        self._finished_epoch = epoch

    def _load_worker_state(self, state: MixWorkerState) -> None:
        """Resume from ``state`` at the next iteration (see ``Mixture.load_state_dict``); a refused state leaves the
        mixture reading what it read."""
        slot = dataclasses.replace(self._slot(), epoch=state.epoch)   # checked in its own epoch
        before = self.reading()
        try:
            self.adopt_checkpoint(state)   # its buffer, batch order, pass layout and data (an Iceberg snapshot)
            self.adopt_replanned([state])
            self._pending = check_worker_state(self, state, slot)
            # its history, as arrowstream's loader follows it (not its epoch: torchdata loads the state when the
            # loader's iterator is made, after set_epoch): at an epoch boundary a changed mixture goes on from every
            # kept source's position; inside an epoch only the same mixture is taken
            self._use_history(followed_history(self, [state], saved_epoch([state])))
        except BaseException:   # a refused state leaves the mixture reading what it read
            self.read_as(before)
            raise
        self._active = None

    def __getstate__(self) -> dict[str, Any]:
        # workers get the mixture by pickle (spawn, forkserver): without the trainer's iteration, the origins theirs
        return {**self.__dict__, "_pending": None, "_active": None,
                "_sources": [Planned(s.name, s.origin.for_workers(), s.options, s.storage, s.plan, s.data,
                                     s.data_identity) for s in self._sources]}

