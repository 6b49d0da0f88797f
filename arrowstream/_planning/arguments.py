"""A front door's arguments, checked in the order it takes them, into the values its plan is made from.

``StructuredDataset.__init__`` hands its arguments here and gets one value back (:class:`DatasetArguments`): the
origin of its rows, the options as validated (the shuffle buffer still to be sized by the plan), the topology and
the reading knobs. ``Mixture.__init__`` does the same (:class:`MixtureArguments`): its sources as named, weights,
``epoch_rows``, ``source_column`` and the options its sources share. Each bad argument raises the arrowstream
error that names it (``_planning.options``, ``_planning.topology``, ``_storage``, ``_sources.mixture``); nothing
is listed or read here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._mixing.quotas import MAX_EPOCH_ROWS
from .._sources.files import FileOrigin, Origin, check_file_format
from .._sources.mixture import IcebergSource, Source, check_weights
from .._storage.cache import DataCache
from .._storage.credentials import as_provider
from .._storage.retry import RetryPolicy, check_retry
from ..errors import ArgumentTypeError, InvalidArgumentError
from .cache import check_plan_cache
from .options import Options, check_bool, check_even_batches, check_int, check_storage_arguments, validate_options
from .topology import Topology, resolve_topology


@dataclass(frozen=True, eq=False)
class DatasetArguments:
    """What a dataset reads, and how, as checked: everything its plan and its epochs are made from."""

    origin: Origin
    options: Options
    credential_provider: Callable[[], dict[str, Any]] | None   # wrapped once: its picklability checked
    retry: RetryPolicy
    topology: Topology
    plan_locally: bool
    even_batches: bool   # as resolved: off with one reader of distinct data
    read_ahead: int
    cache: DataCache | None   # the local cache of remote data (None: none)


def check_dataset_arguments(path: Any, format: str, *, storage_options: Any, credential_provider: Any,
                            plan_cache: Any, retry: Any, plan_locally: Any, rank: Any, world_size: Any,
                            accelerator: Any, group_size: Any, even_batches: Any, read_ahead: Any,
                            cache: Any = None, cache_limit: Any = None, **options: Any) -> DatasetArguments:
    """The dataset's arguments checked; ``path`` may be an :class:`Origin` (a front door such as
    ``IcebergDataset`` made it), else the files of ``format`` under it; ``options``: the keywords of
    :func:`~arrowstream._planning.options.validate_options` but ``format``."""
    source: Origin | None = path if isinstance(path, Origin) else None
    if source is None:
        format = check_file_format(format)
    checked = validate_options(format=format if source is None else source.format, **options)
    check_storage_arguments(storage_options, credential_provider)
    # wrapped once: its picklability is checked here, for loaders that start workers by spawn or forkserver
    provider = as_provider(credential_provider)
    origin = source or FileOrigin(path, format, storage_options, provider, plan_cache)
    checked_retry = check_retry(retry)
    plan_locally = check_bool("plan_locally", plan_locally)
    topology = resolve_topology(rank, world_size, accelerator, group_size, plan_locally=plan_locally)
    # with one reader of distinct data there is nothing to even out
    even = check_even_batches(even_batches, topology.data_world_size, checked)
    return DatasetArguments(origin, checked, provider, checked_retry, topology, plan_locally, even,
                            check_int("read_ahead", read_ahead, 0), DataCache.of(cache, cache_limit))


@dataclass(frozen=True, eq=False)
class MixtureArguments:
    """What a mixture reads, and how, as checked: its sources (still to be planned, each with ``shared``), how
    they are mixed, and the knobs they share."""

    sources: dict[str, Source | IcebergSource]
    weights: dict[str, float] | None
    epoch_rows: int | None
    source_column: str | None
    shared: dict[str, Any]   # the options every source is validated with (Source's own knobs added)
    options: Options   # the mixture's (transform and fill_nulls apart: a mixture applies them)
    transform: Callable[[Any], Any] | None
    fill_nulls: Any   # resolved against the mixture's schema, once its sources are planned
    retry: RetryPolicy
    read_ahead: int
    topology: Topology
    plan_locally: bool
    even_batches: bool   # as resolved: off with one reader of distinct data
    plan_cache: Any


def check_mixture_arguments(sources: Any, weights: Any, epoch_rows: Any, source_column: Any, *, transform: Any,
                            fill_nulls: Any, retry: Any, read_ahead: Any, plan_locally: Any, rank: Any,
                            world_size: Any, accelerator: Any, group_size: Any, even_batches: Any, plan_cache: Any,
                            **options: Any) -> MixtureArguments:
    """A mixture's arguments checked; ``options``: the keywords of
    :func:`~arrowstream._planning.options.validate_options` that every source shares (``batch_size``, ``shuffle``,
    ``seed``, ``shuffle_buffer_size``, ``interleave``, ``output_format``, ``drop_last``, ``with_row_ids``)."""
    if not isinstance(sources, Mapping) or not sources:
        raise ArgumentTypeError("sources: expected a non-empty dict of name to arrowstream.Source or "
                                f"arrowstream.IcebergSource, got {sources!r:.80}")
    for name, spec in sources.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"sources: source names are non-empty strings, got {name!r}")
        if not isinstance(spec, (Source, IcebergSource)):
            raise ArgumentTypeError(f"sources[{name!r}]: expected arrowstream.Source or arrowstream.IcebergSource, "
                                    f"got {type(spec).__name__}")
    checked_weights = check_weights(list(sources), weights)
    if epoch_rows is not None and (isinstance(epoch_rows, bool) or not isinstance(epoch_rows, int) or epoch_rows < 1):
        raise InvalidArgumentError(f"epoch_rows: expected an int >= 1 or None, got {epoch_rows!r}")
    if epoch_rows is not None and epoch_rows > MAX_EPOCH_ROWS:
        raise InvalidArgumentError(
            f"epoch_rows: {epoch_rows:,} rows per mixture epoch is above {MAX_EPOCH_ROWS:,} (2**42), the most an "
            "epoch may take; an epoch is the stretch between set_epoch calls and checkpoints' epoch numbers: pass "
            "the rows you train on between two of them")
    if source_column is not None and (not isinstance(source_column, str) or not source_column):
        raise InvalidArgumentError(f"source_column: expected a column name or None, got {source_column!r}")
    shared: dict[str, Any] = {**options, "transform": None, "fill_nulls": None}
    checked = validate_options(format="parquet", columns=None, filter=None, split_bytes=None, **shared)
    if transform is not None and not callable(transform):
        raise ArgumentTypeError(f"transform: expected a callable, got {type(transform).__name__}")
    checked_retry = check_retry(retry)
    depth = check_int("read_ahead", read_ahead, 0)
    plan_locally = check_bool("plan_locally", plan_locally)
    topology = resolve_topology(rank, world_size, accelerator, group_size, plan_locally=plan_locally)
    even = check_even_batches(even_batches, topology.data_world_size, checked)
    return MixtureArguments(dict(sources), checked_weights, epoch_rows, source_column, shared, checked, transform,
                            fill_nulls, checked_retry, depth, topology, plan_locally, even,
                            check_plan_cache(plan_cache))
