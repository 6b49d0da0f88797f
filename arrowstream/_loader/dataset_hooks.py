"""What a ``StructuredDataset`` reads, and the hooks arrowstream's loader, policies and tools call on it.

The front door (``arrowstream/dataset.py``) checks the arguments and offers the public API. It stands on
:class:`DatasetHooks`, which owns what follows from the checked arguments (the origin and its plan, the storage,
the resolved options, the epochs) and how a loaded checkpoint changes it or a refused one puts it back
(:meth:`DatasetHooks.reading`, :meth:`DatasetHooks.read_as`). The loader, the assignment policies
(``_assignment.views.PolicyDataset``) and the tools read its public values; the per-batch path is not here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from torch.utils.data import get_worker_info

from .._assignment.canonical import CanonicalOrder
from .._core.order import Slot, SlotGrid
from .._core.row_ids import check_row_id_names
from .._layout.layout import Epochs
from .._layout.trims import TrimWatch
from .._planning.auto_buffer import adopted, resolve_buffer
from .._planning.collective import collective_world_size, plan_arguments, plan_together
from .._state.canonical import CanonicalState
from .._state.resume import Against, checked_state, loaded_state, replanned_epoch
from .._state.worker import Leftovers, WorkerState
from .._worker.convert import check_output_columns, resolve_fill_nulls
from .._worker.runtime import WorkerRuntime, WorkerSide, trainer_convert
from .._worker.shm import guard_feeder
from .._worker.slot_epoch import open_slot_epoch
from ..errors import StateMismatchError
from .front import FrontDoor

if TYPE_CHECKING:
    from .._assignment import Assignment
    from .._core.cursor import Position
    from .._planning.arguments import DatasetArguments
    from .._planning.options import Options
    from .._planning.plan import Plan
    from .._sources.files import Origin
    from .._state.identity import DataIdentity
    from .._storage.filesystem import Storage
    from .._worker.iterator import Opened, SlotIterator


@dataclasses.dataclass(frozen=True, eq=False)
class Reading:
    """What a dataset reads that loading a checkpoint may change (see :meth:`DatasetHooks.reading`)."""

    origin: Origin
    storage: Storage
    plan: Plan
    options: Options


class DatasetHooks(FrontDoor):
    """A dataset's plan and what follows from it, for the front door ``StructuredDataset`` to stand on.

    Built from the checked arguments (``arrowstream._planning.arguments``), the assignment policy and
    ``data_identity``: the origin is planned here, under torch.distributed together with the other ranks
    unless ``plan_locally``.
    """

    def __init__(self, arguments: DatasetArguments, policy: Assignment, data_identity: str) -> None:
        super().__init__("StructuredDataset")   # the epoch cell, the loader watch (_loader.front)
        self._origin, self._options = arguments.origin, arguments.options
        self._credential_provider, self._retry = arguments.credential_provider, arguments.retry
        self._topology = topology = arguments.topology
        self._rank, self._world_size = topology.data_rank, topology.data_world_size
        self._even_batches, self._read_ahead_depth = arguments.even_batches, arguments.read_ahead
        self._cache = arguments.cache   # the local cache of remote data (None: none)
        self._policy, self._assignment = policy, policy.name   # how the rank's rows reach its workers (_assignment)
        self._data_identity = data_identity   # what a checkpoint must match (_state.identity)
        self._pending: WorkerState | None = None
        self._trim_watch = TrimWatch()   # warns when even_batches trims more than a batch of a worker
        self._active: SlotIterator[Position, WorkerState] | None = None
        self._side = WorkerSide()  # the loader's transport settings; this process's runtime and meter
        # what decides the plan and the batches, compared between ranks (transform by its qualified name)
        compared = plan_arguments(self._origin.arguments(), self._options, self._even_batches, topology.world_size,
                                  topology.group_size)
        storage, plan = plan_together(self._origin, self._options, self._retry, compared,
                                      collective=not arguments.plan_locally and collective_world_size() > 1)
        self._options = resolve_buffer(self._options, [plan])   # shuffle_buffer_size left out: sized by the plan
        self._use_plan(storage, plan, replanned=None)

    @property
    def even_batches(self) -> bool:
        """Whether every rank yields the same number of batches each epoch (``even_batches`` as resolved: off with
        one rank).

        Example:
            >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq, arrowstream
            >>> folder = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), f"{folder}/part.parquet")
            >>> arrowstream.StructuredDataset(folder, rank=0, world_size=1, plan_locally=True).even_batches
            False
        """
        return self._even_batches

    @property
    def data_identity(self) -> str:
        """What a loaded checkpoint must match of the data: ``"strict"`` or ``"layout"`` (see ``data_identity``)."""
        return self._data_identity

    # -- what the dataset reads ---------------------------------------------------------------

    def _use_plan(self, storage: Storage, plan: Plan, *, replanned: Leftovers | None) -> None:
        """Read ``plan`` from now on; ``replanned``: the epoch re-planned for a loaded checkpoint of another
        topology, which stays (``None``: none)."""
        self._storage, self._plan = storage.reading(self._read_ahead_depth, self._options.interleave,
                                                    self._cache), plan
        check_output_columns(self._options.output_format, plan.schema)
        if self._options.with_row_ids:
            check_row_id_names(plan.schema)
        self._file_names: tuple[str, ...] | None = None   # dataset.files, made when first asked
        self._fill_nulls = resolve_fill_nulls(self._options.fill_nulls, plan.schema)
        self._data = self._origin.identity(plan)
        self._state_options = {**self._options.state_options(), "even_batches": self._even_batches}
        self._state_options.update(self._policy.state_options())
        self._policy.use_plan(self)   # what the policy lays out of the plan (dynamic: its epochs), laid out again
        self._epochs = Epochs(plan, self._options, self._even_batches, self._data, self._state_options, replanned,
                              assign=self._policy.assign)
        self._checked_sources: set[Leftovers] = set()  # leftovers found valid for this plan
        self._side.forget()

    def _use_options(self, options: Options | None) -> None:
        """Read with ``options`` from now on (None: as before): the plan's epochs are laid out again."""
        if options is not None:
            self._options = options
            self._use_plan(self._storage, self._plan, replanned=self._epochs.elastic)

    def use_planning(self, planning: int) -> None:
        """Cut splits for slots as planning version ``planning`` does (a loaded checkpoint's), in this epoch
        and the later ones (see docs/state-format.md, Planning version). For arrowstream's loader."""
        if planning != self._options.planning:
            self._use_options(dataclasses.replace(self._options, planning=planning))

    def adopt_buffer(self, saved_options: Any) -> None:
        """Shuffle rows with the buffer of a checkpoint's options, when this dataset's size was left to the
        default: in the checkpoint's epoch and the later ones (``_planning.auto_buffer``). For arrowstream's loader."""
        self._use_options(adopted(self._options, saved_options))

    def reading(self) -> Reading:
        """What loading a checkpoint may change of what this dataset reads: the data it follows (an Iceberg
        table's snapshot), its plan, the planning version and buffer; :meth:`read_as` puts it back when the
        checkpoint is refused. For arrowstream's loader.

        Example:
            >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq, arrowstream
            >>> folder = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), f"{folder}/part.parquet")
            >>> dataset = arrowstream.StructuredDataset(folder)
            >>> before = dataset.reading()
            >>> dataset.use_planning(1)
            >>> dataset.read_as(before)
            >>> dataset.options.planning
            2
        """
        return Reading(self._origin, self._storage, self._plan, self._options)

    def read_as(self, reading: Reading) -> None:
        """Read as :meth:`reading` said, from now on (a refused checkpoint leaves the dataset as it was); the
        epoch re-planned for a loaded checkpoint of another topology, if any, stays."""
        if reading.origin is not self._origin or reading.plan is not self._plan or reading.options is not self._options:
            self._origin, self._options = reading.origin, reading.options
            self._use_plan(reading.storage, reading.plan, replanned=self._epochs.elastic)

    def follow_origin(self, saved: WorkerState) -> None:
        """Make the dataset read what a loaded state was taken on, when the source has moved on since
        (an Iceberg table: the checkpoint's pinned snapshot); planned here, as a worker would not. For
        arrowstream's loader and assignment policies."""
        followed = self._origin.follow(saved.data, self._data, front=type(self).__name__)
        if followed is not None:
            self._origin = followed
            self._use_plan(*followed.plan(self._options, self._retry), replanned=self._epochs.elastic)

    # -- values for arrowstream's own modules -------------------------------------------------

    @property
    def policy(self) -> Assignment:
        """The assignment policy that :attr:`assignment` names (``arrowstream._assignment``): what the loader,
        ``len`` and the state ask of how rows go to workers."""
        return self._policy

    @property
    def identity(self) -> DataIdentity:
        """What the data is (names, sizes, modification tags, unit rows, schema), as states record it."""
        return self._data

    @property
    def state_options(self) -> dict[str, Any]:
        """The options a worker state carries and a loaded one is compared on (for arrowstream's own modules;
        not to be changed)."""
        return self._state_options

    @property
    def origin(self) -> Origin:
        """What rows exist: the files or the table this dataset reads (for arrowstream's own modules)."""
        return self._origin

    @property
    def epochs(self) -> Epochs:
        """The plan's epochs (layouts, an epoch re-planned from a loaded checkpoint): for arrowstream's loader."""
        return self._epochs

    @property
    def plan(self) -> Plan:
        """The plan: the files' footers and the splits cut from them (a value; for arrowstream's tools).

        Example:
            >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq, arrowstream
            >>> folder = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), f"{folder}/part.parquet")
            >>> arrowstream.StructuredDataset(folder, batch_size=4).plan.num_rows
            10
        """
        return self._plan

    @property
    def credential_provider(self) -> Callable[[], dict[str, Any]] | None:
        """The ``credential_provider`` this dataset was built with, wrapped once (its picklability checked), or
        ``None``: the loader checks it against its ``multiprocessing_context``.

        Example:
            >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq, arrowstream
            >>> folder = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), f"{folder}/part.parquet")
            >>> arrowstream.StructuredDataset(folder).credential_provider is None
            True
        """
        return self._credential_provider

    @property
    def worker_side(self) -> WorkerSide:
        """The dataset's handle on the processes that read it: the loader hands it its transport before any worker
        starts, and reads the trainer's meter from it (for arrowstream's loader).

        Example:
            >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq, arrowstream
            >>> folder = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), f"{folder}/part.parquet")
            >>> arrowstream.StructuredDataset(folder).worker_side.transport.batches_per_transfer
            1
        """
        return self._side

    def baseline_batches(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        """The rows through the source's own readers (pyarrow's, pyiceberg's), for ``arrowstream bench``."""
        return self._origin.baseline_batches(self._plan, self._storage, batch_size)

    def trainer_converter(self) -> Callable[[pa.RecordBatch], Any]:
        """How a record batch of this dataset becomes an output batch in the trainer's process (where
        ``assignment="dynamic"`` stitches the workers' last rows into whole batches), for arrowstream's loader.

        Example:
            >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq, arrowstream
            >>> folder = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), f"{folder}/part.parquet")
            >>> convert = arrowstream.StructuredDataset(folder, output_format="dict").trainer_converter()
            >>> convert(pa.record_batch({"x": [1, 2]}))
            {'x': [1, 2]}
        """
        return trainer_convert(self._plan, self._options, self._fill_nulls)

    def warn_trims(self, num_workers: int) -> None:
        """Warn (once per epoch) when ``even_batches`` trims more than one batch of a worker this epoch."""
        # what even_batches trims of this rank's epoch (None: nothing is evened, or a filter decides)
        trim = None if not self._even_batches or self._options.drops_rows else self._policy.trim(self, num_workers)
        self._trim_watch.starting(self.epoch, self._rank, trim, self._policy.replanned_from(self))

    # -- a worker's epoch ---------------------------------------------------------------------

    def _grid(self, num_workers: int) -> SlotGrid:
        """This dataset's ranks with ``num_workers`` workers each."""
        return SlotGrid(self._world_size, num_workers)

    def _slot(self) -> Slot:
        info = get_worker_info()
        if info is None:
            return self._grid(0).slot(self._rank, 0)
        return self._grid(info.num_workers).slot(self._rank, info.id)

    def _iterate(self, caller: FrameType | None) -> SlotIterator[Position, WorkerState]:
        """``iter(dataset)`` called from ``caller`` (a frame): this process's iterator over its slot's rows."""
        # a DataLoader of the user's with a batch_size of its own is refused, torch's plain one warned (_loader.plain)
        self._loader_watch.check(self, caller)
        info = get_worker_info()
        if info is not None:  # before the worker's first message: see _shm
            guard_feeder(info.id)
        pending, self._pending = self._pending, None
        slot = self._slot()
        if info is None:   # the trainer's process (a loader with workers warns in its own __iter__)
            self.warn_trims(0)
        self._active = self._policy.iterate(self, slot, pending)
        return self._active

    def worker_runtime(self) -> WorkerRuntime:
        """This process's readers and converters, built once (for arrowstream's assignment policies)."""
        return self._side.runtime(self._plan, self._storage, self._options, self._fill_nulls)

    def open_epoch(self, slot: Slot, pending: WorkerState | None) -> Opened[Position, WorkerState]:
        """The stream of ``slot`` over the splits the epoch layout gives it, from ``pending`` (a loaded worker
        state) or the start of the dataset's epoch: how ``assignment="static"`` opens a worker's epoch."""
        return open_slot_epoch(self.worker_runtime, self._epochs, self._options, slot, self.epoch, pending)

    def batches_left(self, state: WorkerState, slot: Slot) -> int | None:
        """Batches a worker state of ``slot`` has still to hand out in its epoch, from the plan;
        ``None`` when a filter (or ``bad_rows='skip'``) decides, which only reading tells."""
        return self._epochs.batches_left(state, slot)

    # -- checkpoints --------------------------------------------------------------------------

    def _against(self) -> Against:
        """What a loaded worker state is checked against, as the plan stands now."""
        return Against(self._epochs, self._options, self._data, self._state_options, self._data_identity,
                       self._checked_sources)

    def _load_worker_state(self, saved: WorkerState) -> None:
        """Resume from ``saved`` at the next iteration, following what it was taken on (planning version, buffer,
        data); a refused state leaves the dataset reading what it read."""
        before = self.reading()
        try:
            self.use_planning(saved.options["planning"])
            self.adopt_buffer(saved.options)   # shuffle_buffer_size left out: the checkpoint's
            self.follow_origin(saved)
            self._pending = loaded_state(self._against(), saved, self._slot())
        except BaseException:
            self.read_as(before)
            raise
        self._active = None

    def load_canonical(self, saved: list[CanonicalState], where: str) -> int:
        """Resume from the worker states of a checkpoint of ``order="canonical"`` (any topology that divides the
        canonical slots: each canonical slot's state, as it stands), following what they were taken on (planning
        version, buffer, data); returns the saved epoch. A refused checkpoint leaves the dataset reading what it
        read. For arrowstream's loader (``where`` names the checkpoint in errors)."""
        policy = self._policy
        if not isinstance(policy, CanonicalOrder):
            raise StateMismatchError(
                f"the {where} was taken with order='canonical' (canonical_slots={saved[0].slots}); this dataset has "
                f"order='topology'. Build it with order='canonical', canonical_slots={saved[0].slots} to resume")
        before = self.reading()
        try:
            first = saved[0].states[0]
            self.use_planning(first.options["planning"])
            self.adopt_buffer(saved[0].head.options)   # shuffle_buffer_size left out: the checkpoint's
            self.follow_origin(first)
            epoch = policy.resume(self, saved, where)
        except BaseException:
            self.read_as(before)
            raise
        self._pending, self._active = None, None
        return epoch

    def forget_loaded(self) -> None:
        """An empty state is loaded: under ``order="canonical"``, forget the canonical slots' loaded states."""
        if isinstance(self._policy, CanonicalOrder):
            self._policy.forget()

    def check_state(self, state_dict: dict[str, Any], elastic: bool = False, *, slot: Slot | None = None,
                    where: str = "worker state", done: str | None = None, followed: bool = False) -> WorkerState:
        """Parse and check a worker state against this dataset without loading it; ``elastic``:
        for another topology, where ``even_batches`` may differ (it is on with several ranks only).

        With ``slot`` (the (rank, worker) the state must come from), its cursor and counters are also
        checked against the plan: a position the worker's stream reaches (see ``arrowstream._state.position``).
        ``where`` names the state in errors; ``done`` says why the checkpoint counts the worker as done
        with its epoch, which it then must be. ``followed``: the dataset plans as the checkpoint the state is part
        of did (arrowstream's loader has made it), so a state of another planning version is refused as one
        that disagrees with the checkpoint's others.
        """
        saved = WorkerState.from_dict(state_dict, where)
        self.follow_origin(saved)
        return checked_state(self._against(), saved, elastic, slot, where, done, followed)

    def begin_elastic_epoch(self, epoch: int, world_size: int, num_workers: int,
                            saved: list[tuple[WorkerState, bool]]) -> None:
        """Re-plan the rest of ``epoch`` from the states of every old (rank, worker) slot, in slot
        order (each with whether its loader had finished the epoch), for this topology."""
        self._epochs.elastic = replanned_epoch(self._epochs, self._options, epoch, world_size, num_workers, saved)
        self._pending, self._active = None, None

    def use_replanned(self, source: Leftovers | None) -> None:
        """Count this epoch as the one a loaded checkpoint was re-planned into for this topology (``len``, trimmed
        rows); ``None``: as planned. For arrowstream's loader, which has checked ``source`` against the plan.

        Example:
            >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq, arrowstream
            >>> folder = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), f"{folder}/part.parquet")
            >>> dataset = arrowstream.StructuredDataset(folder, batch_size=4)
            >>> dataset.use_replanned(None)
            >>> dataset.epochs.elastic is None
            True
        """
        self._epochs.elastic = source

    def load_ledger(self, outers: list[dict[str, Any]]) -> int:
        """Resume from the ledgers of loader states (one rank's, or every rank's of a merged checkpoint), as the
        assignment policy keeps them (``assignment="dynamic"``); the saved epoch. For arrowstream's loader."""
        epoch = self._policy.load_ledger(self, outers)
        self._active = None
        return epoch

    def __getstate__(self) -> dict[str, Any]:
        # workers get the dataset by pickle (spawn, forkserver): without the trainer's iteration, the origin theirs
        return {**self.__dict__, "_pending": None, "_active": None, "_origin": self._origin.for_workers()}
