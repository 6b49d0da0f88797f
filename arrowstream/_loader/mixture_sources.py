"""A mixture's sources as planned, and what follows from them: :class:`PlannedMixture`, the base of the hooks.

``MixtureHooks`` (``_loader/mixture_hooks.py``) stands on it, and the front door ``Mixture`` on the hooks. Here: every
source planned from the checked arguments (``arrowstream._planning.arguments.MixtureArguments``), the mixture's
schema, its quotas and the history of quotas it stands on (shared with the other processes of the mixture:
``arrowstream._worker.followed``), the epochs' layout of every source's passes over the slots, the rows and batches
of each slot, and the sources followed to a checkpoint's data. The loader, the resume checks
(``_state/mixture_resume.py``'s ``MixtureView``) and the tools read its public values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from .._core.order import even_batch_limits, natural_batches
from .._core.row_ids import check_row_id_names, with_row_id_fields
from .._layout.layout import slot_yields
from .._layout.trims import TrimWatch, slot_trim
from .._mixing.layout import MixEpochs, SourcePlan
from .._mixing.quotas import SPANS, positions, quotas, quotas_at
from .._mixing.schema import unify
from .._mixing.stream import MixSlot
from .._planning.auto_buffer import resolve_buffer
from .._planning.collective import collective_world_size
from .._sources.mixture import Planned, followed_source, plan_source
from .._state.mixture import EVEN
from .._worker.convert import check_output_columns, resolve_fill_nulls
from .._worker.followed import FollowedCell
from ..errors import EmptyDatasetError, StateMismatchError
from .front import FrontDoor
from .mixture_canonical import CanonicalLayout, CanonicalView

if TYPE_CHECKING:
    from .._planning.arguments import MixtureArguments
    from .._planning.options import Options

History = list[tuple[int, dict[str, int]]]


class PlannedMixture(FrontDoor):
    """A mixture's sources, planned here from its checked arguments (under torch.distributed together with the
    other ranks unless ``plan_locally``), their quotas and history, and the layout of its epochs."""

    def __init__(self, arguments: MixtureArguments) -> None:
        super().__init__("Mixture")   # the epoch cell, the loader watch (_loader.front)
        self._weights, self._epoch_rows = arguments.weights, arguments.epoch_rows
        self._source_column = arguments.source_column
        self._options, self._transform = arguments.options, arguments.transform
        self._retry, self._read_ahead_depth = arguments.retry, arguments.read_ahead
        self._topology = arguments.topology
        self._rank, self._world_size = self._topology.data_rank, self._topology.data_world_size
        self._even_batches = arguments.even_batches
        collective = not arguments.plan_locally and collective_world_size() > 1
        self._sources = [plan_source(name, spec, arguments.shared, arguments.plan_cache,
                                     even_batches=self._even_batches, topology=self._topology, retry=self._retry,
                                     read_ahead=self._read_ahead_depth, collective=collective)
                         for name, spec in arguments.sources.items()]
        # shuffle_buffer_size left out: sized by the sources' plans (a worker holds a window of each)
        self._options = resolve_buffer(self._options, [s.plan for s in self._sources])
        self._schema = unify(self._source_schemas(), self._source_column)
        check_output_columns(self._options.output_format, self._schema)
        self._fill_nulls = resolve_fill_nulls(arguments.fill_nulls, self._schema)
        self._quotas = quotas({s.name: s.plan.num_rows for s in self._sources}, self._weights, self._epoch_rows)
        for s in self._sources:
            if self._quotas[s.name] and not s.plan.num_rows:
                raise EmptyDatasetError(f"sources[{s.name!r}] has no rows but its weight asks for "
                                        f"{self._quotas[s.name]} per epoch; leave it out until it has rows")
        # the quotas in effect from each epoch on: a checkpoint loaded at an epoch boundary may change them
        self._history: History = [(0, dict(self._quotas))]
        # the history a checkpoint loaded in any process of this mixture made it follow: for the workers a plain
        # StatefulDataLoader starts afresh, copies of this mixture that torchdata never hands the state
        self._followed = FollowedCell("Mixture")
        # how passes are laid out over the slots (_mixing.quotas.PASS_LAYOUTS): a run resumed from a state of version 3
        # or older keeps that state's tracks on its topology (adopt_checkpoint)
        self._pass_layout = SPANS
        self._epochs = self._layout()
        # how the shuffle buffer mixes a batch's sources (_state.mixture.BATCH_ORDERS): a run resumed from a state of
        # version 1 or 2 keeps that state's order (adopt_checkpoint)
        self._batch_order = EVEN
        self._trim_watch = TrimWatch("mixture epoch")   # warns when even_batches trims more than a batch of a worker
        self._canonical: CanonicalLayout | None = None   # order="canonical" (use_canonical)

    def _source_schemas(self) -> dict[str, pa.Schema]:
        """Each source's batches' schema as read: its output columns, and the row ids when asked."""
        if not self._options.with_row_ids:
            return {s.name: s.plan.schema for s in self._sources}
        for s in self._sources:
            check_row_id_names(s.plan.schema, f"the files of source {s.name!r}")
        return {s.name: with_row_id_fields(s.plan.schema) for s in self._sources}

    def file_bases(self) -> list[int]:
        """Where each source's files start in :attr:`files` (in the order of the sources)."""
        counts = [len(s.plan.files) for s in self._sources]
        return [sum(counts[:i]) for i in range(len(counts))]

    def _layout(self) -> MixEpochs:
        o = self._options
        return MixEpochs([SourcePlan(s.name, s.plan.splits, s.plan.num_rows) for s in self._sources], shuffle=o.shuffle,
                         seed=o.seed, batch_size=o.batch_size, interleave=o.interleave, buffer_rows=o.shuffle_buffer_size,
                         pass_layout=self._pass_layout)

    def _follow_sources(self, saved: Mapping[str, Any]) -> None:
        """Read what a checkpoint was taken on where a source has moved on since (an Iceberg table not pinned
        here: the checkpoint's snapshot), planned again here, as a mixture built on that data would: its quotas
        (those in effect from the last change of the mixture on, in the history too) counted on its rows. A source
        that cannot follow stays, and the checkpoint's data check refuses it. (:meth:`follow` then takes the
        checkpoint's history; a plain ``StatefulDataLoader``'s :meth:`load_state_dict` checks the state against
        this one.)"""
        followed = [followed_source(planned, saved.get(planned.name), self._retry, self._read_ahead_depth)
                    for planned in self._sources]
        if any(f is not None for f in followed):
            self._sources = [f or planned for f, planned in zip(followed, self._sources, strict=True)]
            self._schema = unify(self._source_schemas(), self._source_column)
            self._quotas = quotas({s.name: s.plan.num_rows for s in self._sources}, self._weights, self._epoch_rows)
            *earlier, (since, _) = self._history
            self._history = [*earlier, (since, dict(self._quotas))]
            self._epochs = self._layout()

    # -- quotas and their history -------------------------------------------------------------

    def _stood(self) -> History:
        """The history of quotas this mixture stands on: its own, or the one another process of it followed since
        (a checkpoint loaded in a worker of a plain ``StatefulDataLoader``: arrowstream._worker.followed)."""
        news = self._followed.news({s.name: s.data for s in self._sources})
        if news is not None:
            self._history = news
        return self._history

    def _use_history(self, history: History) -> None:
        """Stand on ``history`` from now on, in this process and every copy of this mixture that looks later."""
        self._history = history
        self._followed.publish(history, {s.name: s.data for s in self._sources})

    @property
    def names(self) -> list[str]:
        """The sources' names, in order."""
        return [s.name for s in self._sources]

    def quotas(self, epoch: int | None = None) -> dict[str, int]:
        """Rows each source gives in ``epoch`` (``None``: the epochs from the last change of the mixture on)."""
        if epoch is None:
            return dict(self._quotas)
        return dict(quotas_at(self._stood(), epoch))

    @property
    def history(self) -> History:
        """The quotas in effect from each epoch on, as checkpoints loaded at epoch boundaries changed them."""
        return [(epoch, dict(q)) for epoch, q in self._stood()]

    def epoch_starts(self, epoch: int) -> dict[str, int]:
        """Each source's position (rows of its passes taken before) when ``epoch`` starts."""
        taken = positions(self._stood(), epoch)
        return {name: taken.get(name, 0) for name in self._quotas}

    def limits_of(self, history: History, epoch: int, world_size: int, num_workers: int, even_batches: bool,
                  lacking: Mapping[str, int] | None = None, *, batch_size: int | None = None,
                  drop_last: bool | None = None) -> list[int]:
        """Batches each slot of a topology yields in ``epoch`` of a mixture with ``history`` (``lacking``: see
        :meth:`slot_totals`), of ``batch_size`` rows and ``drop_last`` (None: this mixture's)."""
        rows = self.slot_totals(history, epoch, world_size, num_workers, lacking)
        batch_size = self._options.batch_size if batch_size is None else batch_size
        drop_last = self._options.drop_last if drop_last is None else drop_last
        if even_batches:
            return even_batch_limits(rows, world_size, batch_size, drop_last)
        return [natural_batches(r, batch_size, drop_last) for r in rows]

    def slot_totals(self, history: History, epoch: int, world_size: int, num_workers: int,
                    lacking: Mapping[str, int] | None = None) -> list[int]:
        """Rows each slot of a topology takes in ``epoch`` of a mixture with ``history``; ``lacking``: the rows of
        one pass of the sources of ``history`` that this mixture lacks (a checkpoint's, left out since), counted too."""
        rows = [sum(q.values()) for q in self._epochs.slot_rows(history, epoch, world_size, num_workers)]
        if lacking:
            if self._epochs.replanned(MixSlot(epoch, 0, world_size, 0, num_workers)) is not None:
                raise StateMismatchError(
                    f"the checkpoint ends mixture epoch {epoch}, which was re-planned for its topology, with source(s) "
                    f"{sorted(lacking)} that this mixture lacks: their rows in that epoch cannot be counted without "
                    "them; resume with the saved mixture for one epoch, then leave them out at the next epoch boundary")
            starts, in_effect = positions(history, epoch), quotas_at(history, epoch)
            for name, source_rows in lacking.items():
                per_slot = self._epochs.source_slot_rows(name, source_rows, starts[name], in_effect[name], len(rows))
                rows = [r + extra for r, extra in zip(rows, per_slot, strict=True)]
        return rows

    def warn_trims(self, num_workers: int) -> None:
        """Warn (once per epoch) when ``even_batches`` trims more than one batch of a worker this epoch."""
        if not self._even_batches or self._canonical is not None:   # canonical: at most a row per canonical slot
            return
        per_rank = max(num_workers, 1)
        mine = slice(self._rank * per_rank, (self._rank + 1) * per_rank)
        o = self._options
        rows = self.slot_totals(self._stood(), self.epoch, self._world_size, num_workers)
        limits = even_batch_limits(rows, self._world_size, o.batch_size, o.drop_last)
        yields = slot_yields(rows[mine], limits[mine], o.batch_size, o.drop_last)
        elastic = self._epochs.replanned(MixSlot(self.epoch, self._rank, self._world_size, 0, num_workers))
        self._trim_watch.starting(self.epoch, self._rank,
                                  slot_trim(yields, self._options.batch_size, self._options.drop_last),
                                  None if elastic is None else (elastic.world_size, elastic.num_workers))

    # -- a worker's epoch ---------------------------------------------------------------------

    # -- the layout of its epochs -------------------------------------------------------------

    @property
    def epochs(self) -> MixEpochs:
        """Every slot's parts of every source in an epoch (an epoch re-planned for another topology too): for
        arrowstream's own modules.

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> a = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(a, "a.parquet"))
            >>> arrowstream.Mixture({"a": arrowstream.Source(a)}, batch_size=4).epochs.pass_layout
            'spans'
        """
        return self._epochs

    @property
    def pass_layout(self) -> str:
        """How this mixture lays its sources' passes out over the slots (``arrowstream._mixing.quotas.PASS_LAYOUTS``).

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> a = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(a, "a.parquet"))
            >>> arrowstream.Mixture({"a": arrowstream.Source(a)}, batch_size=4).pass_layout
            'spans'
        """
        return self._pass_layout

    @property
    def planned_sources(self) -> tuple[Planned, ...]:
        """The sources as planned (each a frozen value: name, plan, storage, data): for arrowstream's own modules.

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> a = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(a, "a.parquet"))
            >>> [s.plan.num_rows for s in arrowstream.Mixture({"a": arrowstream.Source(a)}).planned_sources]
            [10]
        """
        return tuple(self._sources)

    def use_pass_layout(self, pass_layout: str) -> None:
        """Lay this epoch's and later epochs' passes out as ``pass_layout`` says (see _mixing.quotas.PASS_LAYOUTS)."""
        self._pass_layout = self._epochs.pass_layout = pass_layout

    def state_options(self) -> dict[str, Any]:
        """The options a checkpoint must match to resume inside an epoch."""
        o = self._options
        options = {"batch_size": o.batch_size, "shuffle": o.shuffle, "seed": o.seed,
                   "shuffle_buffer_size": o.shuffle_buffer_size, "interleave": o.interleave, "drop_last": o.drop_last,
                   "even_batches": self._even_batches, "source_column": self._source_column,
                   "batch_order": self._batch_order, "pass_layout": self._pass_layout}
        if self._canonical is not None:
            options.update(self._canonical.canonical.state_options())
        return options

    # -- order="canonical" ----------------------------------------------------------------------

    def use_canonical(self, slots: int) -> None:
        """Lay the epochs out over ``slots`` canonical slots (``order="canonical"``; ``arrowstream._layout.canonical``)."""
        self._canonical = CanonicalLayout.of(slots, self._options.batch_size, self._world_size)

    @property
    def canonical(self) -> CanonicalLayout | None:
        """The canonical order (None: ``order="topology"``)."""
        return self._canonical

    def canonical_options(self) -> Options:
        """The options a canonical slot reads with (batches of the chunk)."""
        assert self._canonical is not None
        return self._canonical.options(self._options, self._sources)

    def canonical_epochs(self) -> MixEpochs:
        """The canonical slots' epochs."""
        assert self._canonical is not None
        return self._canonical.epochs(self._epochs, self._options, self._sources)

    def canonical_state_options(self) -> dict[str, Any]:
        """What a canonical slot's state must match: the mixture's options, its batches the chunk, evened."""
        inner = self.canonical_options()
        return {**self.state_options(), "batch_size": inner.batch_size,
                "shuffle_buffer_size": inner.shuffle_buffer_size, "even_batches": True}

    def canonical_view(self) -> CanonicalView:
        """The mixture as the checks of a canonical slot's state see it."""
        return CanonicalView(self, self.canonical_epochs(), self.canonical_options(),
                             self.canonical_state_options())

    def canonical_chunks(self, epoch: int | None = None) -> int:
        """Global batches of ``epoch`` (this one) under ``order="canonical"``: every canonical slot's chunks."""
        assert self._canonical is not None
        epoch = self.epoch if epoch is None else epoch
        return self._canonical.limits(self.canonical_epochs(), self._stood(), epoch, self._options.drop_last)[0]
