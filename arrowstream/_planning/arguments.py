"""A dataset's arguments, checked in the order the front door takes them, into the values its plan is made from.

``StructuredDataset.__init__`` hands its arguments here and gets one value back (:class:`DatasetArguments`): the
origin of its rows, the options as validated (the shuffle buffer still to be sized by the plan), the topology and
the reading knobs. Each bad argument raises the arrowstream error that names it (``_planning.options``,
``_planning.topology``, ``_storage``); nothing is listed or read here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._sources.files import FileOrigin, Origin, check_file_format
from .._storage.credentials import as_provider
from .._storage.retry import RetryPolicy, check_retry
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


def check_dataset_arguments(path: Any, format: str, *, storage_options: Any, credential_provider: Any,
                            plan_cache: Any, retry: Any, plan_locally: Any, rank: Any, world_size: Any,
                            accelerator: Any, group_size: Any, even_batches: Any, read_ahead: Any,
                            **options: Any) -> DatasetArguments:
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
                            check_int("read_ahead", read_ahead, 0))
