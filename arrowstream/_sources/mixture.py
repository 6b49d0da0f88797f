"""A mixture's sources: what a user names (:class:`Source`, :class:`IcebergSource`), planned through the
source seam of a dataset (one plan and one storage each), and followed to a checkpoint's data."""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._core.fields import Fields, shorten
from .._planning.collective import plan_arguments, plan_together
from .._planning.options import Options, check_storage_arguments, validate_options
from .._planning.plan import Plan
from .._planning.topology import Topology
from .._state.identity import DataIdentity, check_data_identity
from .._storage.cache import DataCache
from .._storage.credentials import as_provider
from .._storage.filesystem import Storage
from .._storage.retry import RetryPolicy
from ..errors import (
    ArgumentTypeError,
    DatasetNotFoundError,
    EmptyDatasetError,
    InvalidArgumentError,
)
from .files import FileOrigin, Origin, check_file_format
from .iceberg import IcebergOrigin
from .iceberg_table import load_table, open_source


@dataclass(frozen=True)
class Source:
    """One source of a :class:`Mixture`: files of one format, with its own reading knobs (see
    :class:`~arrowstream.StructuredDataset` for each). ``data_identity="layout"`` lets a checkpoint resume
    on a copy of this source's files elsewhere (``"strict"``, the default, refuses one: see docs/resume.md).

    Example:
        >>> import arrowstream
        >>> arrowstream.Source(path="data/code/", format="jsonl", columns=["text"]).format
        'jsonl'
    """

    path: Any
    format: str = "parquet"
    columns: list[str] | None = None
    filter: Any = None
    parse_options: dict[str, Any] | None = None
    storage_options: dict[str, Any] | None = None
    credential_provider: Callable[[], dict[str, Any]] | None = None
    split_bytes: int | None = None
    data_identity: str = "strict"   # what a loaded checkpoint must match of this source's data (see below)
    cache: str | os.PathLike[str] | None = None   # this source's local cache of remote data (see StructuredDataset)
    cache_limit: int | str | None = None


@dataclass(frozen=True)
class IcebergSource:
    """One Apache Iceberg table of a :class:`Mixture` (see :class:`~arrowstream.IcebergDataset`).

    Example:
        >>> import arrowstream
        >>> arrowstream.IcebergSource(table="db.wiki", selected_fields=["text"]).table
        'db.wiki'
    """

    table: str
    catalog_config: dict[str, Any] | None = None
    snapshot_id: int | None = None
    selected_fields: Sequence[str] | None = None
    row_filter: Any = None
    data_identity: str = "strict"   # accepted; an Iceberg table's identity holds no modification tags either way
    cache: str | os.PathLike[str] | None = None   # this table's local cache of remote data (see IcebergDataset)
    cache_limit: int | str | None = None


@dataclass
class Planned:
    """A source of the mixture, planned."""

    name: str
    origin: Origin
    options: Options
    storage: Storage
    plan: Plan
    data: dict[str, Any]
    data_identity: str = "strict"   # what a loaded checkpoint must match of this source's data (_state.identity)


def check_weights(names: list[str], weights: Any) -> dict[str, float] | None:
    if weights is None:
        return None
    if not isinstance(weights, Mapping):
        raise ArgumentTypeError(f"weights: expected a dict of source name to weight, or None, got {type(weights).__name__}")
    if sorted(weights) != sorted(names):
        raise InvalidArgumentError(f"weights: names {sorted(map(str, weights))} differ from the sources {sorted(names)}; "
                                   "give one weight per source")
    checked = {name: _weight(name, weights[name]) for name in names}
    if sum(checked.values()) <= 0:
        raise InvalidArgumentError("weights: every weight is 0; give at least one source a weight above 0")
    return checked


def _weight(name: str, value: Any) -> float:
    """One source's weight as a float: any real number (int, float, a numpy scalar, a Fraction), finite and
    >= 0; never a bool (``True`` is no weight a user means)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):   # (numpy's bool is no Real)
        raise ArgumentTypeError(f"weights: the weight of {name!r} is {shorten(value)} ({type(value).__name__}); "
                                "expected a real number >= 0 (an int, a float or a numpy scalar)")
    try:
        weight = float(value)
    except OverflowError:   # an int past a float's range
        weight = math.inf
    if not math.isfinite(weight) or weight < 0:
        raise InvalidArgumentError(f"weights: the weight of {name!r} is {shorten(value)}; expected a finite number "
                                   ">= 0 (weights are relative: any scale will do)")
    return weight


def plan_source(name: str, spec: Source | IcebergSource, shared: dict[str, Any], plan_cache: Any, *,
                even_batches: bool, topology: Topology, retry: RetryPolicy, read_ahead: int,
                collective: bool) -> Planned:
    """Plan source ``name`` of a mixture (a collective under torch.distributed, as a dataset's). A source
    that is missing or holds no rows is refused by name, whatever its weight."""
    where = f"sources[{name!r}]"
    try:
        return _plan_source(where, name, spec, shared, plan_cache, even_batches=even_batches, topology=topology,
                            retry=retry, read_ahead=read_ahead, collective=collective)
    except EmptyDatasetError as exc:
        # a plan has rows (a dataset's and a source's alike): the source cannot wait, planned, for its first rows
        raise EmptyDatasetError(
            f"{where}: {exc}; a mixture plans every source, whatever its weight (0 too), and a source with no rows "
            f"cannot be planned: leave {name!r} out of sources and weights until it has rows, then add it at an "
            "epoch boundary (it starts at its first pass)") from exc
    except DatasetNotFoundError as exc:
        raise DatasetNotFoundError(f"{where}: {exc}") from exc


def _plan_source(where: str, name: str, spec: Source | IcebergSource, shared: dict[str, Any], plan_cache: Any, *,
                 even_batches: bool, topology: Topology, retry: RetryPolicy, read_ahead: int,
                 collective: bool) -> Planned:
    data_identity = check_data_identity(spec.data_identity, f"{where}.data_identity")
    try:
        cache = DataCache.of(spec.cache, spec.cache_limit)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{where}.{exc}") from exc
    if isinstance(spec, Source):
        fmt = check_file_format(spec.format)
        check_storage_arguments(spec.storage_options, spec.credential_provider)
        source: Origin = FileOrigin(spec.path, fmt, spec.storage_options, as_provider(spec.credential_provider),
                                    plan_cache)
        options = validate_options(format=fmt, columns=spec.columns, filter=spec.filter,
                                   split_bytes=spec.split_bytes, parse_options=spec.parse_options, **shared)
    else:
        snapshot = open_source(load_table(spec.table, spec.catalog_config), spec.table, spec.snapshot_id,
                               spec.row_filter, spec.selected_fields)
        source = IcebergOrigin(snapshot, pinned_by_user=spec.snapshot_id is not None, plan_cache=plan_cache)
        columns = None if "*" in snapshot.selected_fields else list(snapshot.output_columns)
        options = validate_options(format=source.format, columns=columns, filter=snapshot.arrow_filter,
                                   split_bytes=None, **shared)
    if options.drops_rows:
        raise InvalidArgumentError(
            f"{where}: a filter (filter=, row_filter= or parse_options bad_rows='skip') makes the rows a source "
            "gives unknown before reading, and a mixture's quotas, passes and per-batch shares are counted from "
            "metadata before the epoch starts; filter the data beforehand (write the filtered rows as the source), "
            "or filter in transform= (the quotas then count rows before it)")
    arguments = {**plan_arguments(source.arguments(), options, even_batches, topology.world_size,
                                  topology.group_size), "mixture_source": name}
    storage, plan = plan_together(source, options, retry, arguments, collective=collective)
    return Planned(name, source, options, storage.reading(read_ahead, options.interleave, cache), plan,
                   source.identity(plan).to_dict(), data_identity)

def followed_source(planned: Planned, saved: Any, retry: RetryPolicy, read_ahead: int) -> Planned | None:
    """``planned``, planned again on the data a checkpoint was taken on (``saved``: its data identity) when
    the source can follow it (an Iceberg table not pinned here); None when it is that data or cannot follow."""
    if not isinstance(saved, dict) or saved == planned.data:
        return None
    where = f"the checkpoint's data of source {planned.name!r}"
    followed = planned.origin.follow(DataIdentity.from_dict(Fields(saved, where)),
                                     DataIdentity.from_dict(Fields(planned.data, where)), front="Mixture")
    if followed is None:
        return None
    storage, plan = followed.plan(planned.options, retry)
    reading = storage.reading(read_ahead, planned.options.interleave, planned.storage.cache)
    return Planned(planned.name, followed, planned.options, reading, plan, followed.identity(plan).to_dict(),
                   planned.data_identity)
