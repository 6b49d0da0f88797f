"""The source seam: what a dataset reads rows from, planned to one :class:`~arrowstream._planning.plan.Plan`.

A :class:`Origin` knows its data: files of one format (:class:`FileOrigin`), a snapshot of an
Iceberg table (:class:`arrowstream._sources.iceberg.IcebergOrigin`), and next a mixture of
sources. It says what the ranks compare before planning, plans (listing, footers, splits), says
what identifies the data a state was taken on, and, when a loaded state was taken on other data of
the same source (an Iceberg snapshot since superseded), gives the source of that data. What comes
after the plan (the epoch layout, the worker runtime, the stream, the state) is the same for every
source; readers open files through the formats the plan names (``arrowstream._formats``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from .._formats import FILE_FORMATS, get_format
from .._planning.cache import CacheOutcome, PlanCacheSetting, check_plan_cache, plan_cache_for
from .._planning.discovery import discover_files
from .._planning.plan import plan_files
from .._state.identity import DataIdentity, shape_of
from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    from .._planning.options import Options
    from .._planning.plan import Plan
    from .._storage.credentials import CredentialProvider
    from .._storage.filesystem import Storage
    from .._storage.retry import RetryPolicy



def path_names(path: Any) -> Any:
    """The path(s) as given, as normalised strings (``data/`` and ``./data`` alike; URLs as written)."""
    if isinstance(path, (list, tuple)):
        return [path_names(item) for item in path]
    if not isinstance(path, (str, os.PathLike)):
        return path
    name = os.fspath(path)
    if not isinstance(name, str):
        return name
    return (name.rstrip("/") or name) if "://" in name else os.path.normpath(name)


class Origin:
    """What a dataset reads rows from; see the module docstring. Subclasses set ``format`` and
    ``plans_on_rank0`` and implement the methods."""

    format: str  # the name the state records ("parquet", ..., "iceberg")
    cache_outcome: CacheOutcome | None = None   # what its last planning did with the plan cache (reports)
    # under torch.distributed, whether rank 0 plans and hands the plan to the other ranks (else each plans)
    plans_on_rank0: bool

    @property
    def table_name(self) -> str | None:
        """The table a table source reads (reports show it); None for files."""
        return None

    def arguments(self) -> dict[str, Any]:
        """What decides the data, compared between ranks before planning; no credentials."""
        raise NotImplementedError

    def plan(self, options: Options, retry: RetryPolicy) -> tuple[Storage, Plan]:
        """List the data and read its metadata: the storage to read it from and the plan."""
        raise NotImplementedError

    def identity(self, plan: Plan) -> DataIdentity:
        """What a state remembers of the data of ``plan``."""
        raise NotImplementedError

    def follow(self, saved: DataIdentity, current: DataIdentity, front: str = "IcebergDataset") -> Origin | None:
        """The source of the data a loaded state was taken on, when it is other data of this source
        (the dataset plans it instead); None to keep this one. Raises when that data cannot be read, naming
        ``front``, the class the user built."""
        return None

    def for_workers(self) -> Origin:
        """This source as it travels to worker processes (no catalog connection: the plan has it all)."""
        return self

    def baseline_batches(self, plan: Plan, storage: Storage, batch_size: int) -> Iterator[pa.RecordBatch]:
        """The rows of ``plan`` through the source's own pyarrow (or pyiceberg) reader, in batches of at most
        ``batch_size`` rows: the raw loop ``arrowstream bench`` compares the loader with."""
        raise NotImplementedError


def check_file_format(format: Any) -> str:
    """The name of a file format given by the user (``"json"`` is JSON Lines); an arrowstream error if unknown."""
    if format == "json":  # JSON Lines by its other name
        format = "jsonl"
    if format == "iceberg":
        raise InvalidArgumentError("format: Iceberg tables are read by arrowstream.IcebergDataset(table=..., "
                                   "catalog_config=...), not from a path")
    if format not in FILE_FORMATS:
        raise InvalidArgumentError(f"format: unknown format {format!r}; use one of {[*FILE_FORMATS, 'json']} "
                                   "('json' is JSON Lines)")
    return str(format)


class FileOrigin(Origin):
    """Files of one format under a path (a directory, a glob, files; local or any fsspec URL)."""

    plans_on_rank0 = True

    def __init__(self, path: Any, format: str, storage_options: dict[str, Any] | None,
                 credential_provider: Callable[[], dict[str, Any]] | CredentialProvider | None,
                 plan_cache: Any = None) -> None:
        self.path, self.format = path, format
        self._storage_options, self._credential_provider = storage_options, credential_provider
        # not in arguments(): where the footers are kept decides nothing about the data or the batches
        self._plan_cache: PlanCacheSetting = check_plan_cache(plan_cache)
        self.cache_outcome: CacheOutcome | None = None   # what the last plan did with the cache

    def arguments(self) -> dict[str, Any]:
        return {"path": path_names(self.path)}

    def plan(self, options: Options, retry: RetryPolicy) -> tuple[Storage, Plan]:
        storage, entries = discover_files(self.path, self._storage_options, self._credential_provider, retry)
        file_format = get_format(self.format)
        if options.parse_options is not None:   # text: parse options and unit size travel in every footer
            file_format = file_format.configured(options.parse_options, options.split_bytes)
        cache = plan_cache_for(self._plan_cache, storage.protocol, self.path, file_format, options.filter)
        plan = plan_files(storage, entries, file_format, columns=list(options.columns) if options.columns else None,
                          filter=options.filter, split_bytes=options.split_bytes, cache=cache)
        self.cache_outcome = cache.outcome if cache is not None else CacheOutcome(None, "off")
        return storage, plan

    def identity(self, plan: Plan) -> DataIdentity:
        return DataIdentity(plan.data_fingerprint, len(plan.files), plan.num_rows, layout=shape_of(plan))

    def for_workers(self) -> FileOrigin:
        # workers never list files: the credentials stay with the storage (which refreshes them)
        return FileOrigin(self.path, self.format, None, None, plan_cache=False)

    def baseline_batches(self, plan: Plan, storage: Storage, batch_size: int) -> Iterator[pa.RecordBatch]:
        """File after file, each through its format's own pyarrow reader (``baseline_batches``)."""
        columns = list(plan.read_columns)
        for footer in plan.files:
            opened = contextlib.nullcontext(footer.entry.path) if storage.is_local else storage.fs.open(footer.entry.path, "rb")
            with opened as handle:
                yield from get_format(footer.format).baseline_batches(handle, footer, columns, batch_size)
