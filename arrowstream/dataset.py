"""``StructuredDataset``: a planned, resumable stream of Arrow batches for ``StatefulDataLoader``.

The front door: its arguments (checked into one value by ``arrowstream._planning.arguments``) and its public API.
What follows from them (the plan, the epochs, how a loaded checkpoint changes them, the hooks of arrowstream's
loader, assignment policies and tools) is ``arrowstream._loader.dataset_hooks.DatasetHooks``, its base.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ._assignment import check_assignment, check_order
from ._layout.canonical import DEFAULT_CANONICAL_SLOTS
from ._layout.layout import check_known
from ._loader.dataset_hooks import DatasetHooks
from ._planning.arguments import check_dataset_arguments
from ._state.canonical import CanonicalState
from ._state.identity import check_data_identity
from ._state.worker import WorkerState
from ._storage.retry import RetryPolicy
from ._worker.runtime import read_schema

if TYPE_CHECKING:
    from ._core.cursor import Position
    from ._loader.dataset import ArrowStreamDataLoader
    from ._worker.iterator import SlotIterator


class StructuredDataset(DatasetHooks):
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
        cache: A folder on local disk that keeps the byte ranges read from an object store (data and
            footers), so that later epochs, and later runs, read them from disk: each entry is one
            range of one version of one object (a changed object's entries are never served), checked
            on every read (a damaged one is fetched again), written atomically; every process that
            shares the folder holds ``cache_limit``. A folder that cannot be written turns it off with
            one warning. ``None`` (the default): no cache. Local files are never cached. See
            docs/storage.md "Local cache".
        cache_limit: The most bytes the cache folder holds, an int or a string such as ``"200GB"``;
            needed with ``cache``.
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
        order: ``"topology"`` (default): the epoch is laid out over the (rank, worker) slots that read it, so
            which rows make a global step depends on how many there are. ``"canonical"``: laid out over
            ``canonical_slots`` fixed slots instead, so that global batch ``k`` (every rank's ``k``-th batch,
            ranks in order) holds the same rows in the same order on every ``world_size x num_workers`` that
            divides ``canonical_slots``, with ``batch_size x world_size`` (the global batch) fixed; a checkpoint
            resumes on any such topology in that same sequence. Static assignment, no ``filter``. See
            docs/distributed.md, "The same order on any cluster".
        canonical_slots: With ``order="canonical"``, the slots the epoch is laid out over (default 64): a
            multiple of every ``world_size x num_workers`` you will run on, and a divisor of the global batch.

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
                 with_row_ids: bool = False, data_identity: str = "strict", order: str = "topology",
                 canonical_slots: int = DEFAULT_CANONICAL_SLOTS, cache: str | os.PathLike[str] | None = None,
                 cache_limit: int | str | None = None) -> None:
        arguments = check_dataset_arguments(
            path, format, storage_options=storage_options, credential_provider=credential_provider,
            plan_cache=plan_cache, retry=retry, plan_locally=plan_locally, rank=rank, world_size=world_size,
            accelerator=accelerator, group_size=group_size, even_batches=even_batches, read_ahead=read_ahead,
            cache=cache, cache_limit=cache_limit,
            batch_size=batch_size, shuffle=shuffle, seed=seed, shuffle_buffer_size=shuffle_buffer_size,
            interleave=interleave, columns=columns, filter=filter, output_format=output_format, transform=transform,
            drop_last=drop_last, split_bytes=split_bytes, fill_nulls=fill_nulls, parse_options=parse_options,
            with_row_ids=with_row_ids)
        # how the rank's rows reach its workers (_assignment): asked, never tested by name
        policy = check_assignment(assignment, arguments.options, arguments.topology.group_size)
        policy = check_order(order, canonical_slots, policy, arguments.options, arguments.topology.group_size)
        super().__init__(arguments, policy, check_data_identity(data_identity))   # planned there

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

    # -- facts from the plan ------------------------------------------------------------------

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
    def output_format(self) -> str:
        return self._options.output_format

    def num_splits(self, num_workers: int = 0) -> int:
        """Splits of an epoch when read by ``num_workers`` workers per rank."""
        return len(self._plan.splits_for(self._grid(num_workers).num_slots, self._options.planning))

    def slot_rows(self, num_workers: int = 0) -> list[int]:
        """Rows (before the filter) each (rank, worker) slot reads in this epoch, for every slot, with ``num_workers``
        workers per rank, as the assignment policy reads the epoch: under ``"static"`` the epoch layout's shares (or,
        in an epoch re-planned from a loaded checkpoint of another topology, the shares of the rows it had left,
        those each new slot reads from the re-planned start), as ``len(loader)`` counts them.

        Under ``"dynamic"`` a slot with ``num_workers`` of 0 or 1 is its rank (its work, re-planned after a resume on
        another world size); with more workers, which rows each worker reads is decided by the leases it takes at
        run time, so an ``InvalidArgumentError`` says so: :meth:`rank_yields` gives each rank's (fixed) figures.

        Example:
            >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq, arrowstream
            >>> folder = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), f"{folder}/part.parquet", row_group_size=5)
            >>> arrowstream.StructuredDataset(folder, batch_size=4).slot_rows(2)
            [5, 5]
        """
        return [rows for rows, _, _ in self.slot_yields(num_workers)]

    def batch_limits(self, num_workers: int = 0) -> list[int] | None:
        """Batches each slot may yield in this epoch under ``even_batches`` (every slot of every rank, as
        :meth:`slot_rows`, which says when a slot has no figures of its own); ``None`` when the batches are not
        evened out (one rank, or ``even_batches=False``)."""
        yields = self.slot_yields(num_workers)
        return [batches for _, batches, _ in yields] if self._even_batches else None

    def slot_yields(self, num_workers: int = 0) -> list[tuple[int, int, int]]:
        """Per (rank, worker) slot of every rank, in this epoch as the assignment policy reads it (see
        :meth:`slot_rows`): its rows, the batches it yields and the rows it yields (``even_batches`` and
        ``drop_last`` applied)."""
        return [figure.yields for figure in self._policy.slot_figures(self, num_workers)]

    def rank_yields(self, num_workers: int = 0) -> list[tuple[int, int, int]]:
        """Per rank, in this epoch as the assignment policy reads it with ``num_workers`` workers per rank (re-planned
        after a resume on another topology): its rows, the batches it yields (``len(loader)`` on that rank) and the
        rows they hold. Under ``"dynamic"`` these are fixed though each worker's are not.

        Example:
            >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq, arrowstream
            >>> folder = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), f"{folder}/part.parquet", row_group_size=5)
            >>> arrowstream.StructuredDataset(folder, batch_size=4, assignment="dynamic").rank_yields(2)
            [(10, 3, 10)]
        """
        return [figure.yields for figure in self._policy.rank_figures(self, num_workers)]

    def rows_dropped_per_epoch(self, num_workers: int = 0) -> int:
        """Rows ``drop_last`` drops each epoch on this rank (each worker's short last batch; with
        ``assignment="dynamic"``, the rank's)."""
        return self._policy.rows_dropped(self, num_workers)

    def rows_trimmed_per_epoch(self, num_workers: int = 0) -> int:
        """Rows ``even_batches`` leaves out each epoch on this rank, so that every rank yields
        the same number of batches (the last rows of the workers with the most batches; with
        ``assignment="dynamic"``, the last rows of the rank's share)."""
        return self._policy.rows_trimmed(self, num_workers)

    def num_batches(self, num_workers: int = 0) -> int:
        """Exact batches per epoch on this rank; ``TypeError`` when a filter makes it unknowable.
        With ``even_batches`` (the default on more than one rank) every rank has the same number."""
        check_known(self._options, "number of batches is")
        return self._policy.num_batches(self, num_workers)

    # -- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> SlotIterator[Position, WorkerState]:
        # a worker's share of its rank's rows (all of them with no workers), from a loaded state when there is one;
        # the caller's frame tells a loader that batches again (_loader.plain)
        return self._iterate(sys._getframe(1))

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

    # -- state --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This worker's position: a small JSON dict (see docs/state-format.md)."""
        if self._active is not None:
            return self._active.state().to_dict()
        if self._pending is not None:
            return self._pending.to_dict()
        return dict(self.policy.start_state(self, self._slot()).to_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a worker state: the next iteration continues right after it.

        The state is checked against the plan here too, for a plain ``StatefulDataLoader``
        (``ArrowStreamDataLoader.load_state_dict`` has checked it already, in the main process); a refused
        state leaves the dataset reading what it read.
        """
        if self.policy.topology_free:   # order="canonical": its canonical slots' states
            self.load_canonical([CanonicalState.from_dict(state_dict)], "worker state")
            return
        self._load_worker_state(WorkerState.from_dict(state_dict))

    def _sizes(self) -> str:
        return f"dataset.num_batches(num_workers); rows: dataset.num_rows ({self._plan.num_rows:,}, before any filter)"

    def __repr__(self) -> str:
        return (f"StructuredDataset(format={self._options.format!r}, files={len(self._plan.files)}, "
                f"rows={self._plan.num_rows}, splits={len(self._plan.splits)}, "
                f"batch_size={self._options.batch_size}, shuffle={self._options.shuffle}, "
                f"epoch={self.epoch}, storage={self._storage!r}, pid={os.getpid()})")
