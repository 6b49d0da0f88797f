"""``StructuredDataset``: a planned, resumable stream of Arrow batches for ``StatefulDataLoader``."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ._assignment import Assignment, check_assignment
from ._core.order import Slot, SlotGrid
from ._core.row_ids import check_row_id_names
from ._core.stream import EpochStream
from ._layout.layout import Epochs, batch_limits, check_known, slot_rows, slot_yields
from ._layout.trims import Trim, TrimWatch
from ._loader.plain import LoaderWatch, Streamed
from ._planning.auto_buffer import adopted, resolve_buffer
from ._planning.collective import collective_world_size, plan_arguments, plan_together
from ._planning.options import (
    Options,
    check_bool,
    check_even_batches,
    check_int,
    check_storage_arguments,
    validate_options,
)
from ._planning.plan import Plan
from ._planning.topology import resolve_topology
from ._sources.files import FileOrigin, Origin, check_file_format
from ._state.identity import DataIdentity, check_data_identity
from ._state.resume import Against, checked_state, loaded_state, nothing_left, pending_for_epoch, replanned_epoch
from ._state.worker import Leftovers, WorkerState
from ._storage.credentials import as_provider
from ._storage.filesystem import Storage
from ._storage.retry import RetryPolicy, check_retry
from ._worker.convert import check_output_columns, resolve_fill_nulls
from ._worker.iterator import Opened, SlotIterator
from ._worker.runtime import (
    WorkerRuntime,
    WorkerSide,
    open_stream,
    read_schema,
    trainer_convert,
)
from ._worker.shm import guard_feeder, share
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from ._core.cursor import Position
    from ._loader.dataset import ArrowStreamDataLoader


@dataclasses.dataclass(frozen=True, eq=False)
class Reading:
    """What a dataset reads that loading a checkpoint may change (see :meth:`StructuredDataset.reading`)."""

    origin: Origin
    storage: Storage
    plan: Plan
    options: Options


class StructuredDataset(Streamed, IterableDataset):  # type: ignore[type-arg]
    """Batches of a tabular dataset, read once per epoch, resumable mid-epoch.

    Files are listed and their footers read once, here in the constructor; the rows are cut
    into splits (row-group ranges) that are handed to the (rank, worker) slots of the loader
    by longest-processing-time scheduling. Each worker reads only its own splits and yields
    whole batches of ``batch_size`` rows. Use :meth:`create_dataloader` for the loader, or hand
    the dataset to your own ``StatefulDataLoader(dataset, batch_size=None, num_workers=N)``.

    Args:
        path: A directory (read recursively), a glob, one file, or a list of them; local or any
            fsspec URL (``s3://``, ``gs://``, ``az://``, ``memory://``).
        format: ``"parquet"`` (row groups are the units of splits), ``"orc"`` (stripes),
            ``"arrow"`` (Arrow IPC / Feather v2 files; record batches, memory-mapped when local),
            ``"csv"`` or ``"jsonl"`` (also ``"json"``: newline-delimited JSON; stretches of bytes cut at
            row starts, found by a scan at planning; ``.gz``/``.bz2``/``.zst`` files whole). See
            docs/formats.md.
        batch_size: Rows per yielded batch.
        shuffle: Shuffle the split order, seeded by ``seed`` and the epoch (:meth:`set_epoch`).
        seed: The shuffle seed.
        shuffle_buffer_size: Rows; above 0, each worker also shuffles its rows, window by window:
            every ``shuffle_buffer_size`` consecutive rows of its stream are handed out in a seeded
            random order (``seed``, epoch, worker, window). Memory grows with it (about twice the
            buffer's rows while a window is shuffled); a resume re-reads at most one window. It
            works with ``shuffle=False`` too (rows shuffled, splits in order). ``0``: split order
            only. Left out (``None`` or ``"auto"``), ``shuffle=True`` gets a buffer of about 64 MiB of
            decoded rows per worker (bytes per row from the files' metadata; at least 4 batches, at
            most 131,072 rows), and none with ``shuffle=False`` or a filter; a loaded checkpoint's
            size is then kept. See docs/shuffle.md.
        interleave: Splits each worker reads at a time; above 1, rows come from them in rotation,
            ``ceil(batch_size / interleave)`` rows per turn, so a batch mixes ``interleave`` splits
            (files, with ``shuffle=True``). Each open split keeps its file open; at most 1024.
        columns: Columns to read (projection); all when ``None``.
        filter: A ``pyarrow.compute`` expression (or DNF tuples); row groups whose statistics
            exclude it are never read, and the rest are filtered row by row.
        output_format: ``"torch"``, ``"numpy"``, ``"arrow"`` or ``"dict"``.
        transform: A callable applied to each batch inside the worker.
        drop_last: Drop each worker's last short batch of an epoch (the count is kept).
        split_bytes: Target split size in bytes (Parquet: uncompressed row-group bytes; ORC: stripe
            bytes on disk; IPC: record-batch bodies as stored); ``None`` makes one split per unit
            (row group, stripe, record batch). Splits never cut a unit unless there are fewer
            splits than slots. CSV/JSON Lines: bytes of text; units are ``min(split_bytes, 8 MiB)``.
            See docs/formats.md.
        parse_options: CSV and JSON Lines only: pyarrow's read, parse and convert options by name
            (``delimiter``, ``header``, ``column_names``, ``column_types``, ``null_values``, ...) and
            ``bad_rows`` (``"error"``, the default, or ``"skip"``: rows that do not parse are logged and
            left out). Column types are inferred once, from the first file. See docs/formats.md.
        fill_nulls: Value that replaces nulls of numeric, bool and fixed-size-list columns in
            ``torch``/``numpy`` batches: a dict by column, or one value for every column whose
            type it suits (``0``: int and float columns). Without it such a null raises
            ``NullValueError``; fill values a column cannot hold raise at construction.
        storage_options: fsspec options (credentials); never written into state or logs.
        credential_provider: A callable returning storage options with fresh credentials, laid
            over ``storage_options``; picklable (a module-level function or a ``functools.partial``
            of one) for workers started by spawn or forkserver, which is checked here and refused
            when such a loader is made. It is called when each process opens its filesystem and
            again whenever the store answers that the credentials expired; the request then
            continues where it stood. Its failures name it. See docs/storage.md.
        read_ahead: On object stores, how many splits after the ones being read each worker
            fetches in the background (coalesced byte ranges, concurrently); ``0`` turns
            read-ahead off. Memory: about that many splits' compressed bytes per worker, plus
            the splits being read. Local files are read directly.
        plan_locally: Plan in this process, with no collective. By default, under an initialised
            ``torch.distributed`` with several ranks, building a dataset is a collective: every rank
            must build the same one (same path and options, compared with rank 0's; a difference is
            a ``TopologyError`` on every rank) within ``ARROWSTREAM_HANDSHAKE_TIMEOUT`` seconds of
            each other (300 by default), and rank 0 plans for all. Pass ``True`` for a dataset that
            only some ranks build, for example evaluation on rank 0 alone with ``rank=0,
            world_size=1, plan_locally=True`` (explicit ``rank``/``world_size`` may then differ from
            torch.distributed's; without them the rank still comes from it). See docs/distributed.md.
        retry: How storage requests are retried (:class:`arrowstream.RetryPolicy`: attempts, backoff,
            the per-request timeout that cuts a stalled connection, deadlines per request and per
            split); ``None`` for the defaults. The backends' own retries are turned down, so these
            are all the attempts made. See docs/storage.md.
        plan_cache: Where the files' metadata is kept so a restart reads no footer: ``None`` (default:
            ``$ARROWSTREAM_CACHE_DIR``, else the user cache folder), a folder, or ``False`` (no cache).
            Keyed by the listing and the options that shape units. See docs/large-datasets.md.
        assignment: ``"static"`` (default): each worker reads the splits the plan gives it.
            ``"dynamic"``: a rank's workers lease its rows, in the epoch's order, as they finish what
            they hold, so a slow worker (costly files, a slow store, a costly ``transform``) takes
            less; each rank's rows, ``len(loader)`` and ``even_batches`` stay as with ``"static"``,
            the order of batches depends on timing, and a checkpoint resumes exactly the rows not yet
            yielded, with any number of workers. See docs/stragglers.md.
        with_row_ids: Add two columns to every batch: ``_file`` (int32), the row's file as an index into
            :attr:`files`, and ``_row`` (int64), the row's number inside that file, from 0, counted over all
            its rows before any filter (an Iceberg data file's: before its positional deletes). They pass
            through shuffling, interleave, ``filter``, ``columns`` and ``transform`` (which sees them) and
            change no row's place. Columns of those names in the files are refused. See docs/formats.md.
        data_identity: What a loaded checkpoint must match of the data. ``"strict"`` (default): the files'
            relative names, sizes, modification times (ETags, generations), unit row counts and schema, so a
            copy, a re-upload or a ``touch`` is refused, naming this option. ``"layout"``: the same without
            modification times, so a checkpoint resumes on a copy of its data elsewhere (``s3://b/data`` to
            ``/nvme/data``); a rewrite in place that keeps every size and row count is then accepted too.
            Reads stay pinned to the files as listed now. See docs/resume.md, "Moving or copying the data".

    Example:
        >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
        >>> folder = tempfile.mkdtemp()
        >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(folder, "part.parquet"))
        >>> dataset = arrowstream.StructuredDataset(folder, batch_size=4)
        >>> [len(batch["x"]) for batch in dataset]
        [4, 4, 2]
        >>> shuffled = arrowstream.StructuredDataset(folder, batch_size=4, shuffle_buffer_size=10)
        >>> sorted(int(x) for batch in shuffled for x in batch["x"]) == list(range(10))
        True

        Evaluation on rank 0 alone, under torchrun as in one process: every row, no collective.

        >>> evaluation = arrowstream.StructuredDataset(folder, batch_size=4, rank=0, world_size=1,
        ...                                            plan_locally=True)
        >>> sum(len(batch["x"]) for batch in evaluation)
        10
    """

    def __init__(self, path: Any, format: str = "parquet", batch_size: int = 1024, *,
                 shuffle: bool = False, seed: int = 0, shuffle_buffer_size: int | str | None = None,
                 interleave: int = 1, columns: list[str] | None = None, filter: Any = None, output_format: str = "torch",
                 transform: Callable[[Any], Any] | None = None, drop_last: bool = False,
                 split_bytes: int | None = None, fill_nulls: Any = None, parse_options: dict[str, Any] | None = None,
                 storage_options: dict[str, Any] | None = None, accelerator: Any = None,
                 rank: int | None = None, world_size: int | None = None, even_batches: bool = True,
                 group_size: int = 1, read_ahead: int = 1,
                 credential_provider: Callable[[], dict[str, Any]] | None = None, plan_locally: bool = False,
                 retry: RetryPolicy | None = None, plan_cache: Any = None, assignment: str = "static",
                 with_row_ids: bool = False, data_identity: str = "strict") -> None:
        super().__init__()
        # a Origin (arrowstream._sources.files) comes from a front door such as IcebergDataset; else files of a format
        source: Origin | None = path if isinstance(path, Origin) else None
        if source is None:
            format = check_file_format(format)
        self._options: Options = validate_options(
            format=format if source is None else source.format, batch_size=batch_size, shuffle=shuffle, seed=seed,
            shuffle_buffer_size=shuffle_buffer_size, interleave=interleave, columns=columns, filter=filter,
            output_format=output_format, transform=transform, drop_last=drop_last, split_bytes=split_bytes,
            fill_nulls=fill_nulls, parse_options=parse_options, with_row_ids=with_row_ids)
        check_storage_arguments(storage_options, credential_provider)
        # wrapped once: its picklability is checked here, for loaders that start workers by spawn or forkserver
        self._credential_provider = as_provider(credential_provider)
        self._origin: Origin = source or FileOrigin(path, format, storage_options, self._credential_provider,
                                                    plan_cache)
        self._retry = check_retry(retry)
        plan_locally = check_bool("plan_locally", plan_locally)
        self._topology = resolve_topology(rank, world_size, accelerator, group_size, plan_locally=plan_locally)
        self._rank, self._world_size = self._topology.data_rank, self._topology.data_world_size
        # with one reader of distinct data there is nothing to even out
        self._even_batches = check_even_batches(even_batches, self._world_size, self._options)
        self._read_ahead_depth = check_int("read_ahead", read_ahead, 0)
        # how the rank's rows reach its workers (_assignment): asked, never tested by name
        self._policy: Assignment = check_assignment(assignment, self._options, self._topology.group_size)
        self._assignment = self._policy.name
        self._data_identity = check_data_identity(data_identity)   # what a checkpoint must match (_state.identity)
        # shared, so that set_epoch reaches persistent workers
        self._epoch_cell = share(torch.zeros(1, dtype=torch.int64), "StructuredDataset: the epoch cell")
        self._loader_watch = LoaderWatch("StructuredDataset")   # a loader that batches again, or cannot resume
        self._pending: WorkerState | None = None
        self._trim_watch = TrimWatch()   # warns when even_batches trims more than a batch of a worker
        self._active: SlotIterator[Position, WorkerState] | None = None
        self._side = WorkerSide()  # the loader's transport settings; this process's runtime and meter
        # what decides the plan and the batches, compared between ranks (transform by its qualified name)
        arguments = plan_arguments(self._origin.arguments(), self._options, self._even_batches,
                                   self._topology.world_size, self._topology.group_size)
        storage, plan = plan_together(self._origin, self._options, self._retry, arguments,
                                      collective=not plan_locally and collective_world_size() > 1)
        self._options = resolve_buffer(self._options, [plan])   # shuffle_buffer_size left out: sized by the plan
        self._use_plan(storage, plan, replanned=None)

    def _use_plan(self, storage: Storage, plan: Plan, *, replanned: Leftovers | None) -> None:
        """Read ``plan`` from now on; ``replanned``: the epoch re-planned for a loaded checkpoint of another
        topology, which stays (``None``: none)."""
        self._storage, self._plan = storage.reading(self._read_ahead_depth, self._options.interleave), plan
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

    def _against(self) -> Against:
        """What a loaded worker state is checked against, as the plan stands now."""
        return Against(self._epochs, self._options, self._data, self._state_options, self._data_identity,
                       self._checked_sources)

    def follow_origin(self, saved: WorkerState) -> None:
        """Make the dataset read what a loaded state was taken on, when the source has moved on since
        (an Iceberg table: the checkpoint's pinned snapshot); planned here, as a worker would not. For
        arrowstream's loader and assignment policies."""
        followed = self._origin.follow(saved.data, self._data)
        if followed is not None:
            self._origin = followed
            self._use_plan(*followed.plan(self._options, self._retry), replanned=self._epochs.elastic)

    # -- the loader ---------------------------------------------------------------------------

    @classmethod
    def create_dataloader(cls, path: Any, format: str = "parquet", batch_size: int = 1024, *,
                          num_workers: int = 0, **kwargs: Any) -> tuple[ArrowStreamDataLoader, StructuredDataset]:
        """Build the dataset and its ``StatefulDataLoader``; returns ``(loader, dataset)``.

        Dataset keywords are those of :class:`StructuredDataset`; every other keyword
        (``persistent_workers``, ``pin_memory``, ``prefetch_factor``, ``multiprocessing_context``,
        ``collate_fn``, ``snapshot_every_n_steps`` ...) goes to the loader. Under torch.distributed it is
        a collective unless ``plan_locally=True`` (a loader of some ranks only: see ``plan_locally``).

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> folder = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(folder, "part.parquet"))
            >>> loader, dataset = arrowstream.StructuredDataset.create_dataloader(
            ...     path=folder, batch_size=4, shuffle=True, seed=0)
            >>> dataset.set_epoch(0)
            >>> sum(len(batch["x"]) for batch in loader)
            10
            >>> evaluation, _ = arrowstream.StructuredDataset.create_dataloader(  # e.g. on rank 0 only
            ...     path=folder, batch_size=4, rank=0, world_size=1, plan_locally=True)
            >>> sum(len(batch["x"]) for batch in evaluation)
            10
        """
        from ._loader.dataset import build_dataloader

        return build_dataloader(cls, dataset_args={"path": path, "format": format, "batch_size": batch_size},
                                num_workers=num_workers, **kwargs)

    # -- epochs -------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return int(self._epoch_cell[0])

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to read next; with ``shuffle=True`` each epoch has its own order.

        Call it before iterating the loader each epoch. It reaches persistent workers too.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidArgumentError(f"set_epoch: epoch must be an int >= 0, got {epoch!r}")
        self._epoch_cell[0] = epoch

    # -- facts from the plan ------------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This rank's place among the ranks that read distinct data (its group's, with ``group_size``)."""
        return self._rank

    @property
    def world_size(self) -> int:
        """How many ranks read distinct data (groups, with ``group_size``)."""
        return self._world_size

    @property
    def num_rows(self) -> int:
        """Rows in the dataset before the filter."""
        return self._plan.num_rows

    @property
    def num_files(self) -> int:
        return len(self._plan.files)

    @property
    def schema(self) -> pa.Schema:
        """The batches' Arrow schema (``output_format="arrow"``; the other formats hold these columns): the
        output columns, each field nullable where any file's is (at any depth), ``_file`` and ``_row`` last
        with ``with_row_ids=True``.

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> folder = tempfile.mkdtemp()
            >>> strict = pa.schema([pa.field("x", pa.int64(), nullable=False)])
            >>> pq.write_table(pa.table({"x": [1, 2]}, schema=strict), os.path.join(folder, "a.parquet"))
            >>> pq.write_table(pa.table({"x": [3, None]}), os.path.join(folder, "b.parquet"))
            >>> dataset = arrowstream.StructuredDataset(folder, batch_size=4, output_format="arrow")
            >>> dataset.schema.field("x").nullable, next(iter(dataset)).column("x").to_pylist()
            (True, [1, 2, 3, None])
        """
        return read_schema(self._plan, self._options)

    @property
    def files(self) -> tuple[str, ...]:
        """The dataset's files in plan order, as errors name them (a local path, or ``s3://bucket/key``; an
        Iceberg data file's URL): ``with_row_ids=True``'s ``_file`` column is an index into it.

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> folder = tempfile.mkdtemp()
            >>> for name in ("a", "b"):
            ...     pq.write_table(pa.table({"x": list(range(5))}), os.path.join(folder, f"{name}.parquet"))
            >>> dataset = arrowstream.StructuredDataset(folder, batch_size=10, with_row_ids=True)
            >>> batch = next(iter(dataset))
            >>> row = 7   # where did the 8th row come from?
            >>> os.path.basename(dataset.files[batch["_file"][row]]), int(batch["_row"][row])
            ('b.parquet', 2)
        """
        if self._file_names is None:
            self._file_names = tuple(self._plan.url(i) for i in range(len(self._plan.files)))
        return self._file_names

    @property
    def batch_size(self) -> int:
        return self._options.batch_size

    @property
    def output_format(self) -> str:
        return self._options.output_format

    def num_splits(self, num_workers: int = 0) -> int:
        """Splits of an epoch when read by ``num_workers`` workers per rank."""
        return len(self._plan.splits_for(self._grid(num_workers).num_slots, self._options.planning))

    def slot_rows(self, num_workers: int = 0) -> list[int]:
        """Rows (before the filter) each slot reads per epoch, for every (rank, worker) slot."""
        return slot_rows(self._plan, self._grid(num_workers), self._options.planning)

    def batch_limits(self, num_workers: int = 0) -> list[int] | None:
        """Batches each slot may yield per epoch under ``even_batches`` (every slot of every rank);
        ``None`` when the batches are not evened out (one rank, or ``even_batches=False``)."""
        return batch_limits(self.slot_rows(num_workers), self._world_size, self._options, self._even_batches)

    def slot_yields(self, num_workers: int = 0) -> list[tuple[int, int, int]]:
        """Per (rank, worker) slot of every rank, in an epoch planned for this topology: its rows, the
        batches it yields and the rows it yields (``even_batches`` and ``drop_last`` applied)."""
        return slot_yields(self.slot_rows(num_workers), self.batch_limits(num_workers), self._options.batch_size,
                           self._options.drop_last)

    def rows_dropped_per_epoch(self, num_workers: int = 0) -> int:
        """Rows ``drop_last`` drops each epoch on this rank (each worker's short last batch; with
        ``assignment="dynamic"``, the rank's)."""
        return self._policy.rows_dropped(self, num_workers)

    def rows_trimmed_per_epoch(self, num_workers: int = 0) -> int:
        """Rows ``even_batches`` leaves out each epoch on this rank, so that every rank yields
        the same number of batches (the last rows of the workers with the most batches; with
        ``assignment="dynamic"``, the last rows of the rank's share)."""
        return self._policy.rows_trimmed(self, num_workers)

    def _trim(self, num_workers: int) -> Trim | None:
        """What ``even_batches`` trims of this rank's epoch (None: nothing is evened, or a filter decides)."""
        if not self._even_batches or self._options.drops_rows:
            return None
        return self._policy.trim(self, num_workers)

    def warn_trims(self, num_workers: int) -> None:
        """Warn (once per epoch) when ``even_batches`` trims more than one batch of a worker this epoch."""
        self._trim_watch.starting(self.epoch, self._rank, self._trim(num_workers), self._policy.replanned_from(self))

    def num_batches(self, num_workers: int = 0) -> int:
        """Exact batches per epoch on this rank; ``TypeError`` when a filter makes it unknowable.
        With ``even_batches`` (the default on more than one rank) every rank has the same number."""
        check_known(self._options, "number of batches is")
        return self._policy.num_batches(self, num_workers)

    # -- iteration ----------------------------------------------------------------------------

    def _grid(self, num_workers: int) -> SlotGrid:
        """This dataset's ranks with ``num_workers`` workers each."""
        return SlotGrid(self._world_size, num_workers)

    def _slot(self) -> Slot:
        info = get_worker_info()
        if info is None:
            return self._grid(0).slot(self._rank, 0)
        return self._grid(info.num_workers).slot(self._rank, info.id)

    def __iter__(self) -> SlotIterator[Position, WorkerState]:
        # a DataLoader of the user's with a batch_size of its own is refused, torch's plain one warned (_loader.plain)
        self._loader_watch.check(self, sys._getframe(1))
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
        epoch = self.epoch
        pending = pending_for_epoch(pending, slot, epoch, functools.partial(self._nothing_left, slot=slot))
        stream, runtime = self._stream(slot, epoch, pending), self.worker_runtime()
        files_between = self._epochs.files_between
        return Opened(stream, runtime.converters, runtime.meter, runtime.transport,
                      files_between=lambda start, end: files_between(slot, epoch, start.cursor, end.cursor),
                      by_record=True)

    def batches_left(self, state: WorkerState, slot: Slot) -> int | None:
        """Batches a worker state of ``slot`` has still to hand out in its epoch, from the plan;
        ``None`` when a filter (or ``bad_rows='skip'``) decides, which only reading tells."""
        return self._epochs.batches_left(state, slot)

    def _nothing_left(self, state: WorkerState, slot: Slot) -> bool:
        """True when a worker state of ``slot`` has handed out every row of its epoch it ever will."""
        return nothing_left(self.batches_left(state, slot), self._options,
                            lambda wanted: self._stream(slot, state.epoch, state).holds(wanted))

    @property
    def assignment(self) -> str:
        """How a rank's splits go to its workers: ``"static"`` (a fixed share each) or ``"dynamic"`` (leased).

        Example:
            >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq, arrowstream
            >>> folder = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), f"{folder}/part.parquet")
            >>> arrowstream.StructuredDataset(folder, rank=0, world_size=1, plan_locally=True).assignment
            'static'
        """
        return self._assignment

    @property
    def policy(self) -> Assignment:
        """The assignment policy that :attr:`assignment` names (``arrowstream._assignment``): what the loader,
        ``len`` and the state ask of how rows go to workers."""
        return self._policy

    @property
    def options(self) -> Options:
        """The options this dataset reads with, as resolved (a frozen value; for arrowstream's own modules)."""
        return self._options

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
    def identity(self) -> DataIdentity:
        """What the data is (names, sizes, modification tags, unit rows, schema), as states record it."""
        return self._data

    @property
    def data_identity(self) -> str:
        """What a loaded checkpoint must match of the data: ``"strict"`` or ``"layout"`` (see ``data_identity``)."""
        return self._data_identity

    @property
    def state_options(self) -> dict[str, Any]:
        """The options a worker state carries and a loaded one is compared on (for arrowstream's own modules;
        not to be changed)."""
        return self._state_options

    @property
    def origin(self) -> Origin:
        """What rows exist: the files or the table this dataset reads (for arrowstream's own modules)."""
        return self._origin

    def baseline_batches(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        """The rows through the source's own readers (pyarrow's, pyiceberg's), for ``arrowstream bench``."""
        return self._origin.baseline_batches(self._plan, self._storage, batch_size)

    @property
    def epochs(self) -> Epochs:
        """The plan's epochs (layouts, an epoch re-planned from a loaded checkpoint): for arrowstream's loader."""
        return self._epochs

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

    def _stream(self, slot: Slot, epoch: int, start: WorkerState | None) -> EpochStream:
        runtime = self.worker_runtime()
        start = start or self._epochs.start(slot, epoch)
        return open_stream(runtime, self._epochs.layouts.layout(epoch, slot.grid, start.elastic), slot, start,
                           self._options, self._data, self._state_options)

    # -- state --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This worker's position: a small JSON dict (see docs/state-format.md)."""
        if self._active is not None:
            return self._active.state().to_dict()
        if self._pending is not None:
            return self._pending.to_dict()
        return self._epochs.start(self._slot(), self.epoch).to_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a worker state: the next iteration continues right after it.

        The state is checked against the plan here too, for a plain ``StatefulDataLoader``
        (``ArrowStreamDataLoader.load_state_dict`` has checked it already, in the main process).
        """
        saved = WorkerState.from_dict(state_dict)
        before = self.reading()
        try:
            self.use_planning(saved.options["planning"])
            self.adopt_buffer(saved.options)   # shuffle_buffer_size left out: the checkpoint's
            self.follow_origin(saved)
            self._pending = loaded_state(self._against(), saved, self._slot())
        except BaseException:   # a refused state leaves the dataset reading what it read
            self.read_as(before)
            raise
        self._active = None

    def check_state(self, state_dict: dict[str, Any], elastic: bool = False, *, slot: Slot | None = None,
                    where: str = "worker state", done: str | None = None) -> WorkerState:
        """Parse and check a worker state against this dataset without loading it; ``elastic``:
        for another topology, where ``even_batches`` may differ (it is on with several ranks only).

        With ``slot`` (the (rank, worker) the state must come from), its cursor and counters are also
        checked against the plan: a position the worker's stream reaches (see ``arrowstream._state.position``).
        ``where`` names the state in errors; ``done`` says why the checkpoint counts the worker as done
        with its epoch, which it then must be.
        """
        saved = WorkerState.from_dict(state_dict, where)
        self.follow_origin(saved)
        return checked_state(self._against(), saved, elastic, slot, where, done)

    def begin_elastic_epoch(self, epoch: int, world_size: int, num_workers: int,
                            saved: list[tuple[WorkerState, bool]]) -> None:
        """Re-plan the rest of ``epoch`` from the states of every old (rank, worker) slot, in slot
        order (each with whether its loader had finished the epoch), for this topology."""
        self._epochs.elastic = replanned_epoch(self._epochs, self._options, epoch, world_size, num_workers, saved)
        self._pending, self._active = None, None

    def load_ledger(self, outers: list[dict[str, Any]]) -> int:
        """Resume from the ledgers of loader states (one rank's, or every rank's of a merged checkpoint), as the
        assignment policy keeps them (``assignment="dynamic"``); the saved epoch. For arrowstream's loader."""
        epoch = self._policy.load_ledger(self, outers)
        self._active = None
        return epoch

    def _sizes(self) -> str:
        return f"dataset.num_batches(num_workers); rows: dataset.num_rows ({self._plan.num_rows:,}, before any filter)"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pending": None, "_active": None, "_origin": self._origin.for_workers()}

    def __repr__(self) -> str:
        return (f"StructuredDataset(format={self._options.format!r}, files={len(self._plan.files)}, "
                f"rows={self._plan.num_rows}, splits={len(self._plan.splits)}, "
                f"batch_size={self._options.batch_size}, shuffle={self._options.shuffle}, "
                f"epoch={self.epoch}, storage={self._storage!r}, pid={os.getpid()})")
