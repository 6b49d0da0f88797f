"""Weighted mixtures of sources: :class:`Mixture`, :class:`Source` and :class:`IcebergSource`.

See docs/mixing.md for the semantics: quotas per epoch, passes, per-batch shares, resume and changing
the mixture between epochs.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ._assignment import check_assignment
from ._core.order import even_batch_limits, natural_batches
from ._core.row_ids import check_row_id_names, with_row_id_fields
from ._layout.layout import slot_yields
from ._layout.trims import TrimWatch, slot_trim
from ._loader.plain import LoaderWatch, Streamed
from ._mixing.elastic import MixElastic
from ._mixing.layout import MixEpochs, SourcePlan
from ._mixing.quotas import MAX_EPOCH_ROWS, SPANS, positions, quotas, quotas_at
from ._mixing.schema import caster, unify
from ._mixing.stream import MixSlot
from ._planning.auto_buffer import adopted, resolve_buffer
from ._planning.cache import check_plan_cache
from ._planning.collective import collective_world_size
from ._planning.options import Options, check_bool, check_even_batches, check_int, validate_options
from ._planning.topology import resolve_topology
from ._sources.mixture import IcebergSource, Planned, Source, check_weights, followed_source, plan_source
from ._state.mixture import EVEN, MixPosition, MixWorkerState, SourceCursor, SourceEpoch
from ._storage.retry import RetryPolicy, check_retry
from ._worker.convert import check_output_columns, resolve_fill_nulls
from ._worker.followed import FollowedCell
from ._worker.iterator import Opened, SlotIterator
from ._worker.metrics import Meter
from ._worker.mixture import (
    COMPACT,
    MixOutput,
    MixReading,
    MixSide,
    finished_stream,
    open_stream,
    opened,
    start_in_epoch,
)
from ._worker.shm import guard_feeder, share
from .errors import ArgumentTypeError, EmptyDatasetError, InvalidArgumentError, StateMismatchError

if TYPE_CHECKING:
    from ._loader.mixture import MixtureDataLoader


_SHARES_FIXED = "each batch's share of every source is fixed per worker slot"


@dataclasses.dataclass(frozen=True, eq=False)
class MixtureReading:
    """What a mixture reads that loading a checkpoint may change (see :meth:`Mixture.reading`)."""

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


def _check_assignment(assignment: Any, options: Options, group_size: int) -> None:
    """A mixture's ``assignment=``: a policy whose slots read what the layout gives them (``"static"``) is taken;
    another policy a dataset takes is refused with the reason; anything else gets the dataset's error."""
    if not check_assignment(assignment, options, group_size).fixed_slots:
        raise InvalidArgumentError(
            f"assignment: a Mixture takes assignment='static' only, got {assignment!r}: {_SHARES_FIXED} (each "
            "(rank, worker) slot reads a fixed stretch of every source, laid out before the epoch and cut into "
            "batches by the slot's quotas); leasing splits to whichever worker is free would leave a worker "
            "with runs of one source, and its batches without their shares. Leave assignment out for a mixture; "
            "against a slow worker raise read_ahead or num_workers, or read a single source with "
            "StructuredDataset(..., assignment='dynamic') (docs/stragglers.md)")


class Mixture(Streamed, IterableDataset):  # type: ignore[type-arg]
    """Batches of several sources mixed by weight, each epoch exactly ``weight × epoch_rows`` rows of each.

    A source is read in passes (every row once per pass, its own order per pass); a pass that runs out
    inside an epoch starts the next, and one left unfinished at the end of an epoch goes on in the next,
    so no row of a source comes twice before all its rows came once. Every batch holds each source in
    proportion to its quota, within one row. Build it with :meth:`create_dataloader`. See docs/mixing.md.

    Args:
        sources: Name to :class:`Source` or :class:`IcebergSource`.
        weights: Name to weight (any scale); ``None``: each source's share of the rows.
        epoch_rows: Rows per mixture epoch; ``None``: the sum of the sources' rows.
        source_column: A column name: each row's source name is added under it.
        with_row_ids: Add ``_file`` (an index into :attr:`files`, over every source) and ``_row`` (the row's
            number inside that file) to every batch, as :class:`~arrowstream.StructuredDataset` does.
        batch_size: Rows per batch; this and every other keyword are those of
            :class:`~arrowstream.StructuredDataset`, shared by every source.
        assignment: ``"static"``, the only one a mixture takes: each (rank, worker) slot reads its own stretch
            of every source, which is what gives every batch each source's share. ``"dynamic"`` is refused
            (an :class:`~arrowstream.errors.InvalidArgumentError` saying why); any other value as a dataset
            refuses it.

    Example:
        >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
        >>> a, b = tempfile.mkdtemp(), tempfile.mkdtemp()
        >>> pq.write_table(pa.table({"x": list(range(100))}), os.path.join(a, "a.parquet"))
        >>> pq.write_table(pa.table({"x": list(range(1000, 1010))}), os.path.join(b, "b.parquet"))
        >>> loader, mixture = arrowstream.Mixture.create_dataloader(
        ...     sources={"big": arrowstream.Source(a), "small": arrowstream.Source(b)},
        ...     weights={"big": 0.5, "small": 0.5}, epoch_rows=40, batch_size=8, source_column="source")
        >>> mixture.set_epoch(0)
        >>> batches = list(loader)
        >>> [batch["source"].count("small") for batch in batches]
        [4, 4, 4, 4, 4]
    """

    def __init__(self, sources: Mapping[str, Source | IcebergSource], weights: Mapping[str, float] | None = None,
                 epoch_rows: int | None = None, source_column: str | None = None, batch_size: int = 1024, *,
                 shuffle: bool = False, seed: int = 0, shuffle_buffer_size: int | str | None = None,
                 interleave: int = 1, output_format: str = "torch", transform: Callable[[Any], Any] | None = None,
                 drop_last: bool = False, fill_nulls: Any = None, accelerator: Any = None,
                 rank: int | None = None, world_size: int | None = None, even_batches: bool = True,
                 group_size: int = 1, read_ahead: int = 1, plan_locally: bool = False,
                 retry: RetryPolicy | None = None, plan_cache: Any = None, with_row_ids: bool = False,
                 assignment: str = "static") -> None:
        super().__init__()
        if not isinstance(sources, Mapping) or not sources:
            raise ArgumentTypeError("sources: expected a non-empty dict of name to arrowstream.Source or "
                                    f"arrowstream.IcebergSource, got {sources!r:.80}")
        for name, spec in sources.items():
            if not isinstance(name, str) or not name:
                raise InvalidArgumentError(f"sources: source names are non-empty strings, got {name!r}")
            if not isinstance(spec, (Source, IcebergSource)):
                raise ArgumentTypeError(f"sources[{name!r}]: expected arrowstream.Source or arrowstream.IcebergSource, "
                                        f"got {type(spec).__name__}")
        names = list(sources)
        self._weights = check_weights(names, weights)
        if epoch_rows is not None and (isinstance(epoch_rows, bool) or not isinstance(epoch_rows, int) or epoch_rows < 1):
            raise InvalidArgumentError(f"epoch_rows: expected an int >= 1 or None, got {epoch_rows!r}")
        if epoch_rows is not None and epoch_rows > MAX_EPOCH_ROWS:
            raise InvalidArgumentError(
                f"epoch_rows: {epoch_rows:,} rows per mixture epoch is above {MAX_EPOCH_ROWS:,} (2**42), the most an "
                "epoch may take; an epoch is the stretch between set_epoch calls and checkpoints' epoch numbers: pass "
                "the rows you train on between two of them")
        if source_column is not None and (not isinstance(source_column, str) or not source_column):
            raise InvalidArgumentError(f"source_column: expected a column name or None, got {source_column!r}")
        self._epoch_rows, self._source_column = epoch_rows, source_column
        shared: dict[str, Any] = {"batch_size": batch_size, "shuffle": shuffle, "seed": seed,
                  "shuffle_buffer_size": shuffle_buffer_size, "interleave": interleave,
                  "output_format": output_format, "transform": None, "drop_last": drop_last, "fill_nulls": None,
                  "with_row_ids": with_row_ids}
        self._options = validate_options(format="parquet", columns=None, filter=None, split_bytes=None, **shared)
        if transform is not None and not callable(transform):
            raise ArgumentTypeError(f"transform: expected a callable, got {type(transform).__name__}")
        self._transform = transform
        self._retry = check_retry(retry)
        self._read_ahead_depth = check_int("read_ahead", read_ahead, 0)
        plan_locally = check_bool("plan_locally", plan_locally)
        self._topology = resolve_topology(rank, world_size, accelerator, group_size, plan_locally=plan_locally)
        self._rank, self._world_size = self._topology.data_rank, self._topology.data_world_size
        _check_assignment(assignment, self._options, self._topology.group_size)   # before planning
        self._even_batches = check_even_batches(even_batches, self._world_size, self._options)
        plan_cache = check_plan_cache(plan_cache)
        collective = not plan_locally and collective_world_size() > 1
        self._sources = [self._plan_source(name, spec, shared, plan_cache, collective) for name, spec in sources.items()]
        # shuffle_buffer_size left out: sized by the sources' plans (a worker holds a window of each)
        self._options = resolve_buffer(self._options, [s.plan for s in self._sources])
        self._schema = unify(self._source_schemas(), source_column)
        check_output_columns(output_format, self._schema)
        self._fill_nulls = resolve_fill_nulls(fill_nulls, self._schema)
        self._quotas = quotas({s.name: s.plan.num_rows for s in self._sources}, self._weights, epoch_rows)
        for s in self._sources:
            if self._quotas[s.name] and not s.plan.num_rows:
                raise EmptyDatasetError(f"sources[{s.name!r}] has no rows but its weight asks for "
                                        f"{self._quotas[s.name]} per epoch; leave it out until it has rows")
        # the quotas in effect from each epoch on: a checkpoint loaded at an epoch boundary may change them
        self._history: list[tuple[int, dict[str, int]]] = [(0, dict(self._quotas))]
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
        self._epoch_cell = share(torch.zeros(1, dtype=torch.int64), "Mixture: the epoch cell")
        self._loader_watch = LoaderWatch("Mixture")   # a loader that batches again, or cannot resume
        self._finished_epoch = -1   # epochs up to it were finished by a checkpoint loaded with another topology
        self._pending: MixWorkerState | None = None
        self._trim_watch = TrimWatch("mixture epoch")   # warns when even_batches trims more than a batch of a worker
        self._active: SlotIterator[MixPosition, MixWorkerState] | None = None
        self._side = MixSide()   # the loader's transport and metrics; this process's meter

    def _plan_source(self, name: str, spec: Source | IcebergSource, shared: dict[str, Any], plan_cache: Any,
                     collective: bool) -> Planned:
        return plan_source(name, spec, shared, plan_cache, even_batches=self._even_batches, topology=self._topology,
                           retry=self._retry, read_ahead=self._read_ahead_depth, collective=collective)

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

    @property
    def files(self) -> tuple[str, ...]:
        """Every source's files, the sources in order, each source's in its plan's order, as errors name them:
        ``with_row_ids=True``'s ``_file`` column is an index into it (``source_column`` names the source too).

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> a, b = tempfile.mkdtemp(), tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(4))}), os.path.join(a, "a.parquet"))
            >>> pq.write_table(pa.table({"x": list(range(4))}), os.path.join(b, "b.parquet"))
            >>> mixture = arrowstream.Mixture({"a": arrowstream.Source(a), "b": arrowstream.Source(b)},
            ...                               batch_size=8, with_row_ids=True, output_format="dict")
            >>> batch = next(iter(mixture))
            >>> sorted((os.path.basename(mixture.files[f]), r) for f, r in zip(batch["_file"], batch["_row"]))[:2]
            [('a.parquet', 0), ('a.parquet', 1)]
        """
        return tuple(s.plan.url(i) for s in self._sources for i in range(len(s.plan.files)))

    def _layout(self) -> MixEpochs:
        o = self._options
        return MixEpochs([SourcePlan(s.name, s.plan.splits, s.plan.num_rows) for s in self._sources], shuffle=o.shuffle,
                         seed=o.seed, batch_size=o.batch_size, interleave=o.interleave, buffer_rows=o.shuffle_buffer_size,
                         pass_layout=self._pass_layout)

    def _stood(self) -> list[tuple[int, dict[str, int]]]:
        """The history of quotas this mixture stands on: its own, or the one another process of it followed since
        (a checkpoint loaded in a worker of a plain ``StatefulDataLoader``: arrowstream._worker.followed)."""
        news = self._followed.news({s.name: s.data for s in self._sources})
        if news is not None:
            self._history = news
        return self._history

    def _use_history(self, history: list[tuple[int, dict[str, int]]]) -> None:
        """Stand on ``history`` from now on, in this process and every copy of this mixture that looks later."""
        self._history = history
        self._followed.publish(history, {s.name: s.data for s in self._sources})

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

    @classmethod
    def create_dataloader(cls, sources: Mapping[str, Source | IcebergSource], weights: Mapping[str, float] | None = None,
                          epoch_rows: int | None = None, source_column: str | None = None, batch_size: int = 1024, *,
                          num_workers: int = 0, assignment: str = "static",
                          **kwargs: Any) -> tuple[MixtureDataLoader, Mixture]:
        """Build the mixture and its ``StatefulDataLoader``; returns ``(loader, mixture)``. Mixture
        keywords are those of :class:`Mixture`; every other keyword goes to the loader.

        ``assignment`` is ``"static"`` (the default, and the only one a mixture takes): every batch holds each
        source in its share because each (rank, worker) slot reads a fixed stretch of every source.
        ``assignment="dynamic"`` is refused with an :class:`~arrowstream.errors.InvalidArgumentError` saying why
        (see docs/mixing.md, "Stragglers").

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> a = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(a, "a.parquet"))
            >>> loader, mixture = arrowstream.Mixture.create_dataloader(
            ...     sources={"a": arrowstream.Source(a)}, batch_size=4)
            >>> sum(len(batch["x"]) for batch in loader)
            10
        """
        from ._loader.mixture import build_mixture_loader

        return build_mixture_loader(cls, {"sources": sources, "weights": weights, "epoch_rows": epoch_rows,
                                              "source_column": source_column, "batch_size": batch_size,
                                              "assignment": assignment},
                                    num_workers=num_workers, **kwargs)

    # -- epochs -------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return int(self._epoch_cell[0])

    def set_epoch(self, epoch: int) -> None:
        """Select the mixture epoch to read next; call it before iterating the loader each epoch."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidArgumentError(f"set_epoch: epoch must be an int >= 0, got {epoch!r}")
        self._epoch_cell[0] = epoch

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def batch_size(self) -> int:
        return self._options.batch_size

    @property
    def options(self) -> Options:
        """The options this mixture reads with, as resolved (a frozen value; for arrowstream's own modules)."""
        return self._options

    @property
    def names(self) -> list[str]:
        """The sources' names, in order."""
        return [s.name for s in self._sources]

    @property
    def schema(self) -> pa.Schema:
        """The batches' Arrow schema (after safe casts; with ``source_column`` last)."""
        return self._schema

    def quotas(self, epoch: int | None = None) -> dict[str, int]:
        """Rows each source gives in ``epoch`` (``None``: the epochs from the last change of the mixture on)."""
        if epoch is None:
            return dict(self._quotas)
        return dict(quotas_at(self._stood(), epoch))

    @property
    def history(self) -> list[tuple[int, dict[str, int]]]:
        """The quotas in effect from each epoch on, as checkpoints loaded at epoch boundaries changed them."""
        return [(epoch, dict(q)) for epoch, q in self._stood()]

    def source_rows(self) -> dict[str, int]:
        """Rows of one pass of each source."""
        return {s.name: s.plan.num_rows for s in self._sources}

    def epoch_starts(self, epoch: int) -> dict[str, int]:
        """Each source's position (rows of its passes taken before) when ``epoch`` starts."""
        taken = positions(self._stood(), epoch)
        return {name: taken.get(name, 0) for name in self._quotas}

    def passes(self, epoch: int) -> dict[str, tuple[int, int]]:
        """Per source: the pass its epoch starts in and the row of that pass it starts at."""
        return {s.name: divmod(start, s.plan.num_rows) if s.plan.num_rows else (0, 0)
                for s, start in zip(self._sources, self.epoch_starts(epoch).values(), strict=True)}

    def slot_quotas(self, num_workers: int = 0, epoch: int | None = None) -> list[dict[str, int]]:
        """Per (rank, worker) slot of every rank: rows of each source it takes in ``epoch`` (this one)."""
        return self._epochs.slot_rows(self._stood(), self.epoch if epoch is None else epoch, self._world_size,
                                      num_workers)

    def batch_limits(self, num_workers: int = 0, epoch: int | None = None) -> list[int]:
        """Batches each slot yields in ``epoch`` (``even_batches`` and ``drop_last`` applied)."""
        return self.limits_of(self._stood(), self.epoch if epoch is None else epoch, self._world_size, num_workers,
                              self._even_batches)

    def limits_of(self, history: list[tuple[int, dict[str, int]]], epoch: int, world_size: int, num_workers: int,
                  even_batches: bool, lacking: Mapping[str, int] | None = None, *, batch_size: int | None = None,
                  drop_last: bool | None = None) -> list[int]:
        """Batches each slot of a topology yields in ``epoch`` of a mixture with ``history`` (``lacking``: see
        :meth:`slot_totals`), of ``batch_size`` rows and ``drop_last`` (None: this mixture's)."""
        rows = self.slot_totals(history, epoch, world_size, num_workers, lacking)
        batch_size = self._options.batch_size if batch_size is None else batch_size
        drop_last = self._options.drop_last if drop_last is None else drop_last
        if even_batches:
            return even_batch_limits(rows, world_size, batch_size, drop_last)
        return [natural_batches(r, batch_size, drop_last) for r in rows]

    def slot_totals(self, history: list[tuple[int, dict[str, int]]], epoch: int, world_size: int, num_workers: int,
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

    def num_batches(self, num_workers: int = 0) -> int:
        """Exact batches of this epoch on this rank (every rank the same with ``even_batches``)."""
        per_rank = max(num_workers, 1)
        return sum(self.batch_limits(num_workers)[self._rank * per_rank:(self._rank + 1) * per_rank])

    def warn_trims(self, num_workers: int) -> None:
        """Warn (once per epoch) when ``even_batches`` trims more than one batch of a worker this epoch."""
        if not self._even_batches:
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

    # -- reading ------------------------------------------------------------------------------

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
                               {s.name: s.data for s in self._sources}, None if elastic is None else elastic.to_dict())
        if slot.epoch <= self._finished_epoch:
            from ._state.mixture_resume import finished_state

            state = finished_state(self, state, slot)
        return state

    def state_options(self) -> dict[str, Any]:
        """The options a checkpoint must match to resume inside an epoch."""
        o = self._options
        return {"batch_size": o.batch_size, "shuffle": o.shuffle, "seed": o.seed,
                "shuffle_buffer_size": o.shuffle_buffer_size, "interleave": o.interleave, "drop_last": o.drop_last,
                "even_batches": self._even_batches, "source_column": self._source_column,
                "batch_order": self._batch_order, "pass_layout": self._pass_layout}

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

    def use_pass_layout(self, pass_layout: str) -> None:
        """Lay this epoch's and later epochs' passes out as ``pass_layout`` says (see _mixing.quotas.PASS_LAYOUTS)."""
        self._pass_layout = self._epochs.pass_layout = pass_layout

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
        from ._state.mixture_resume import followed_history, saved_epoch

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
        from ._state.mixture_resume import replanned_from

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

    @property
    def worker_side(self) -> MixSide:
        """The mixture's handle on the processes that read it: the loader hands it its transport and board of rows
        per source before any worker starts, and reads the trainer's meter from it (for arrowstream's loader).

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> a = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(a, "a.parquet"))
            >>> arrowstream.Mixture({"a": arrowstream.Source(a)}).worker_side.transport.batches_per_transfer
            1
        """
        return self._side

    def __iter__(self) -> SlotIterator[MixPosition, MixWorkerState]:
        # a DataLoader of the user's with a batch_size of its own is refused, torch's plain one warned (_loader.plain)
        self._loader_watch.check(self, sys._getframe(1))
        info = get_worker_info()
        if info is not None:
            guard_feeder(info.id)
        pending, self._pending = self._pending, None
        if info is None:   # the trainer's process (a loader with workers warns in its own __iter__)
            self.warn_trims(0)
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
        reading = MixReading(
            options, tuple(self._sources), self.file_bases(), self._epochs.parts(self._stood(), slot),
            casts={s.name: caster(schemas[s.name], self._schema, s.name, self._source_column) for s in self._sources},
            fill_nulls=self._fill_nulls,
            limit=self.batch_limits(slot.num_workers, slot.epoch)[slot.index] if self._even_batches else None,
            batch_order=self._batch_order if options.shuffle_buffer_size > 0 else None)
        return opened(self._side, open_stream(reading, slot, start, meter), output, meter)

    # -- state --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This worker's position: a small JSON dict (see docs/mixing.md)."""
        if self._active is not None:
            if self._side.transport.send_chunks and get_worker_info() is not None:
                # in a MixtureDataLoader's worker: torchdata takes this after every chunk and diffs it key by
                # key; the loader makes the whole state of it (MixtureDataLoader.state_dict)
                epoch, position = self._active.position()
                if position is not None:
                    return {COMPACT: [epoch, *position]}
            return self._active.state().to_dict()
        if self._pending is not None:
            return self._pending.to_dict()
        return self.start_state(self._slot()).to_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a worker state (checked here too, for a plain ``StatefulDataLoader``).

        As arrowstream's loader does, the mixture first reads as the checkpoint was taken (:meth:`adopt_checkpoint`:
        an Iceberg source whose table moved on since goes back to the checkpoint's snapshot), then checks the state;
        a refused state leaves the mixture as it was (:meth:`reading`, :meth:`read_as`).
        """
        from ._state.mixture_resume import check_worker_state, followed_history, saved_epoch

        state = MixWorkerState.from_dict(state_dict)
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

    _called = "mixture"   # in the errors of len() and [i] (Streamed)
    stream_kind = "mixture"   # read by MixtureDataLoader (Streamed)

    def _sizes(self) -> str:
        return (f"mixture.num_batches(num_workers); rows per epoch: sum(mixture.quotas().values()) "
                f"({sum(self._quotas.values()):,})")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pending": None, "_active": None,
                "_sources": [Planned(s.name, s.origin.for_workers(), s.options, s.storage, s.plan, s.data,
                                     s.data_identity) for s in self._sources]}

    def __repr__(self) -> str:
        return (f"Mixture(sources={self.names}, quotas={self._quotas}, batch_size={self._options.batch_size}, "
                f"shuffle={self._options.shuffle}, epoch={self.epoch})")
