"""arrowstream: columnar data into PyTorch, read once, resumed exactly.

Example:
    >>> from arrowstream import StructuredDataset
    >>> loader, dataset = StructuredDataset.create_dataloader(  # doctest: +SKIP
    ...     path="data/", batch_size=1024, num_workers=4, shuffle=True, seed=0)
"""

from __future__ import annotations

from . import errors
from ._checkpoint import gather_state_dict, merge_state_dicts
from ._iceberg_table import default_catalog_config as iceberg_catalog_config
from ._metrics import gather_metrics
from ._mix_loader import MixtureDataLoader
from ._mix_sources import IcebergSource, Source
from ._retry import RetryPolicy
from .dataset import StructuredDataset
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
    RepeatedEpochWarning,
    SchemaMismatchError,
    SharedMemoryError,
    StateError,
    StateMismatchError,
    StateVersionError,
    TopologyError,
    WorkerError,
)
from .iceberg import IcebergDataset
from .loader import ArrowStreamDataLoader
from .mixture import Mixture

__version__ = "0.1.0"

__all__ = [
    "ArgumentTypeError",
    "ArrowStreamDataLoader",
    "ArrowStreamError",
    "ConversionError",
    "CorruptFileError",
    "DatasetNotFoundError",
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
    "RepeatedEpochWarning",
    "RetryPolicy",
    "SchemaMismatchError",
    "SharedMemoryError",
    "Source",
    "StateError",
    "StateMismatchError",
    "StateVersionError",
    "StructuredDataset",
    "TopologyError",
    "WorkerError",
    "__version__",
    "errors",
    "gather_metrics",
    "gather_state_dict",
    "iceberg_catalog_config",
    "merge_state_dicts",
]
