"""Weighted mixtures of sources: :class:`Mixture`, :class:`Source` and :class:`IcebergSource`.

See docs/mixing.md for the semantics: quotas per epoch, passes, per-batch shares, resume and changing
the mixture between epochs. The front door: its arguments (checked into one value by
``arrowstream._planning.arguments``) and its public API. What follows from them (the sources as planned, the
quotas and the layout of the epochs: ``arrowstream._loader.mixture_sources.PlannedMixture``; a worker's epoch and
how a loaded checkpoint changes them, the hooks of arrowstream's loader and tools:
``arrowstream._loader.mixture_hooks.MixtureHooks``) is its base.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from torch.utils.data import get_worker_info

from ._assignment import check_assignment, check_order
from ._layout.canonical import DEFAULT_CANONICAL_SLOTS, check_workers
from ._loader.mixture_hooks import MixtureHooks
from ._planning.arguments import check_mixture_arguments
from ._sources.mixture import IcebergSource, Source
from ._state.canonical import CanonicalState
from ._state.mixture import MixPosition, MixWorkerState
from ._state.versions import MIXTURE
from ._storage.retry import RetryPolicy
from ._worker.iterator import SlotIterator
from ._worker.mixture import COMPACT
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from ._loader.mixture import MixtureDataLoader
    from ._planning.options import Options

_SHARES_FIXED = "each batch's share of every source is fixed per worker slot"


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


class Mixture(MixtureHooks):
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
        order: ``"topology"`` (default) or ``"canonical"``: as for :class:`~arrowstream.StructuredDataset`, the
            epoch laid out over ``canonical_slots`` fixed slots, each a slot of the mixture with its quotas of
            every source, so that every global batch holds the same rows of every source on any topology that
            divides them, and a checkpoint resumes that sequence there. See docs/distributed.md.
        canonical_slots: With ``order="canonical"``: see :class:`~arrowstream.StructuredDataset`.
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
                 assignment: str = "static", order: str = "topology",
                 canonical_slots: int = DEFAULT_CANONICAL_SLOTS) -> None:
        arguments = check_mixture_arguments(
            sources, weights, epoch_rows, source_column, transform=transform, fill_nulls=fill_nulls, retry=retry,
            read_ahead=read_ahead, plan_locally=plan_locally, rank=rank, world_size=world_size,
            accelerator=accelerator, group_size=group_size, even_batches=even_batches, plan_cache=plan_cache,
            batch_size=batch_size, shuffle=shuffle, seed=seed, shuffle_buffer_size=shuffle_buffer_size,
            interleave=interleave, output_format=output_format, drop_last=drop_last, with_row_ids=with_row_ids)
        _check_assignment(assignment, arguments.options, arguments.topology.group_size)   # before planning
        canonical = check_order(order, canonical_slots, check_assignment(assignment, arguments.options,
                                                                          arguments.topology.group_size),
                                arguments.options, arguments.topology.group_size).topology_free
        super().__init__(arguments)   # every source planned there
        if canonical:
            self.use_canonical(canonical_slots)

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

    # -- facts of the mixture -----------------------------------------------------------------

    @property
    def schema(self) -> pa.Schema:
        """The batches' Arrow schema (after safe casts; with ``source_column`` last)."""
        return self._schema

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

    def source_rows(self) -> dict[str, int]:
        """Rows of one pass of each source."""
        return {s.name: s.plan.num_rows for s in self._sources}

    def passes(self, epoch: int) -> dict[str, tuple[int, int]]:
        """Per source: the pass its epoch starts in and the row of that pass it starts at."""
        return {s.name: divmod(start, s.plan.num_rows) if s.plan.num_rows else (0, 0)
                for s, start in zip(self._sources, self.epoch_starts(epoch).values(), strict=True)}

    def slot_quotas(self, num_workers: int = 0, epoch: int | None = None) -> list[dict[str, int]]:
        """Per (rank, worker) slot of every rank: rows of each source it takes in ``epoch`` (this one); under
        ``order="canonical"`` the sums of the canonical slots it reads."""
        epoch = self.epoch if epoch is None else epoch
        if self._canonical is None:
            return self._epochs.slot_rows(self._stood(), epoch, self._world_size, num_workers)
        canonical = self._canonical.canonical
        check_workers(canonical, self._world_size, num_workers)
        inner = self.canonical_epochs().slot_rows(self._stood(), epoch, canonical.slots, 0)
        per = canonical.slots // (self._world_size * max(num_workers, 1))
        return [{name: sum(inner[c][name] for c in range(first, first + per)) for name in self.names}
                for first in range(0, canonical.slots, per)]

    def batch_limits(self, num_workers: int = 0, epoch: int | None = None) -> list[int]:
        """Batches each slot yields in ``epoch`` (``even_batches`` and ``drop_last`` applied); under
        ``order="canonical"`` its parts of the global batches."""
        epoch = self.epoch if epoch is None else epoch
        if self._canonical is None:
            return self.limits_of(self._stood(), epoch, self._world_size, num_workers, self._even_batches)
        check_workers(self._canonical.canonical, self._world_size, num_workers)
        return [self.canonical_chunks(epoch)] * (self._world_size * max(num_workers, 1))

    def num_batches(self, num_workers: int = 0) -> int:
        """Exact batches of this epoch on this rank (every rank the same with ``even_batches``)."""
        if self._canonical is not None:   # a rank's batch is its workers' parts of a global batch
            return self.canonical_chunks()
        per_rank = max(num_workers, 1)
        return sum(self.batch_limits(num_workers)[self._rank * per_rank:(self._rank + 1) * per_rank])

    # -- reading and state ----------------------------------------------------------------------

    def __iter__(self) -> SlotIterator[MixPosition, MixWorkerState]:
        # a worker's slot of every source (all of them with no workers), from a loaded state when there is one; the
        # caller's frame tells a loader that batches again (_loader.plain)
        return self._iterate(sys._getframe(1))

    def state_dict(self) -> dict[str, Any]:
        """This worker's position: a small JSON dict (see docs/mixing.md)."""
        if self._canonical is not None:   # order="canonical": its canonical slots' states
            if self._active is not None:
                return dict(self._active.state().to_dict())
            return self.canonical_start(self._physical()).to_dict()
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
        if self._canonical is not None:   # order="canonical": its canonical slots' states
            self.load_canonical([CanonicalState.from_dict(state_dict, reads=MIXTURE)], "worker state")
            return
        self._load_worker_state(MixWorkerState.from_dict(state_dict))

    _called = "mixture"   # in the errors of len() and [i] (Streamed)
    stream_kind = "mixture"   # read by MixtureDataLoader (Streamed)

    def _sizes(self) -> str:
        return (f"mixture.num_batches(num_workers); rows per epoch: sum(mixture.quotas().values()) "
                f"({sum(self._quotas.values()):,})")

    def __repr__(self) -> str:
        return (f"Mixture(sources={self.names}, quotas={self._quotas}, batch_size={self._options.batch_size}, "
                f"shuffle={self._options.shuffle}, epoch={self.epoch})")
