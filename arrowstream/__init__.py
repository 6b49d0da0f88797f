"""arrowstream: columnar data into PyTorch, read once, resumed exactly.

Example:
    >>> from arrowstream import StructuredDataset
    >>> loader, dataset = StructuredDataset.create_dataloader(  # doctest: +SKIP
    ...     path="data/", batch_size=1024, num_workers=4, shuffle=True, seed=0)
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import errors
from .errors import (
    ArgumentTypeError,
    ArrowStreamError,
    ConversionError,
    CorruptFileError,
    DatasetNotFoundError,
    EmptyDatasetError,
    FileChangedError,
    FileReadError,
    InvalidArgumentError,
    MalformedRowError,
    MissingDependencyError,
    NotSupportedYetError,
    NullValueError,
    PlainLoaderWarning,
    RepeatedEpochWarning,
    SchemaMismatchError,
    SharedMemoryError,
    StalePlanCacheError,
    StateError,
    StateMismatchError,
    StateVersionError,
    TopologyError,
    TrimWarning,
    UnknownLengthError,
    WorkerError,
)

if TYPE_CHECKING:
    from . import testing
    from ._loader.checkpoint import gather_state_dict, merge_state_dicts
    from ._loader.dataset import ArrowStreamDataLoader
    from ._loader.mixture import MixtureDataLoader
    from ._sources.iceberg_table import default_catalog_config as iceberg_catalog_config
    from ._sources.iceberg_table import iceberg_catalog
    from ._sources.mixture import IcebergSource, Source
    from ._storage.retry import RetryPolicy
    from ._tools.describe import describe_state, format_state
    from ._worker.batch_types import DictBatch, NumpyBatch, TorchBatch
    from ._worker.metrics import gather_metrics
    from .dataset import StructuredDataset
    from .iceberg import IcebergDataset
    from .mixture import Mixture

# The one source of the version: pyproject.toml reads it from here (`dynamic = ["version"]`).
__version__ = "0.2.0"

# Names that import torch or pyarrow are loaded on first use (PEP 562), so that `import arrowstream.cli`
# (the `arrowstream` command) and `import arrowstream.errors` stay fast: `arrowstream --help` starts
# in a tenth of a second instead of the seconds torch takes. `from arrowstream import X` works as before.
_LAZY: dict[str, tuple[str, str | None]] = {  # name -> (module, attribute; None: the module itself)
    "ArrowStreamDataLoader": ("._loader.dataset", "ArrowStreamDataLoader"),
    "DictBatch": ("._worker.batch_types", "DictBatch"),
    "IcebergDataset": (".iceberg", "IcebergDataset"),
    "IcebergSource": ("._sources.mixture", "IcebergSource"),
    "Mixture": (".mixture", "Mixture"),
    "MixtureDataLoader": ("._loader.mixture", "MixtureDataLoader"),
    "NumpyBatch": ("._worker.batch_types", "NumpyBatch"),
    "RetryPolicy": ("._storage.retry", "RetryPolicy"),
    "Source": ("._sources.mixture", "Source"),
    "StructuredDataset": (".dataset", "StructuredDataset"),
    "TorchBatch": ("._worker.batch_types", "TorchBatch"),
    "describe_state": ("._tools.describe", "describe_state"),
    "format_state": ("._tools.describe", "format_state"),
    "gather_metrics": ("._worker.metrics", "gather_metrics"),
    "gather_state_dict": ("._loader.checkpoint", "gather_state_dict"),
    "iceberg_catalog": ("._sources.iceberg_table", "iceberg_catalog"),
    "iceberg_catalog_config": ("._sources.iceberg_table", "default_catalog_config"),
    "merge_state_dicts": ("._loader.checkpoint", "merge_state_dicts"),
    "testing": (".testing", None),
}


def __getattr__(name: str) -> Any:
    """Import a public name of :data:`_LAZY` on first access and keep it in the module."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _LAZY[name]
    imported = importlib.import_module(module, __name__)
    value = imported if attribute is None else getattr(imported, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public API and the public submodules imported so far: not the names this module's own code uses
    (``Any``, ``TYPE_CHECKING``, ``annotations``, ``importlib``), nor the private ones."""
    submodules = {name for name, value in globals().items()
                  if isinstance(value, ModuleType) and value.__name__.startswith(f"{__name__}.")
                  and not name.startswith("_")}
    return sorted(set(__all__) | submodules)


__all__ = [
    "ArgumentTypeError",
    "ArrowStreamDataLoader",
    "ArrowStreamError",
    "ConversionError",
    "CorruptFileError",
    "DatasetNotFoundError",
    "DictBatch",
    "EmptyDatasetError",
    "FileChangedError",
    "FileReadError",
    "IcebergDataset",
    "IcebergSource",
    "InvalidArgumentError",
    "MalformedRowError",
    "MissingDependencyError",
    "Mixture",
    "MixtureDataLoader",
    "NotSupportedYetError",
    "NullValueError",
    "NumpyBatch",
    "PlainLoaderWarning",
    "RepeatedEpochWarning",
    "RetryPolicy",
    "SchemaMismatchError",
    "SharedMemoryError",
    "Source",
    "StalePlanCacheError",
    "StateError",
    "StateMismatchError",
    "StateVersionError",
    "StructuredDataset",
    "TopologyError",
    "TorchBatch",
    "TrimWarning",
    "UnknownLengthError",
    "WorkerError",
    "__version__",
    "describe_state",
    "errors",
    "format_state",
    "gather_metrics",
    "gather_state_dict",
    "iceberg_catalog",
    "iceberg_catalog_config",
    "merge_state_dicts",
    "testing",
]
