"""The arrowstream error hierarchy.

Every error subclasses :class:`ArrowStreamError` and the builtin it refines, so
``except ValueError`` or ``except FileNotFoundError`` keeps working. Warnings subclass
``UserWarning``.
"""

from __future__ import annotations


class ArrowStreamError(Exception):
    """Base class of every error raised by arrowstream."""


class InvalidArgumentError(ArrowStreamError, ValueError):
    """An argument has a value arrowstream cannot work with."""


class ArgumentTypeError(ArrowStreamError, TypeError):
    """An argument has the wrong type."""


class DatasetNotFoundError(ArrowStreamError, FileNotFoundError):
    """A path given to the dataset does not exist."""


class EmptyDatasetError(ArrowStreamError, ValueError):
    """The dataset holds no files or no rows."""


class CorruptFileError(ArrowStreamError, ValueError):
    """A file is not a readable file of the expected format."""


class MalformedRowError(CorruptFileError):
    """A row of a CSV or JSON Lines file does not parse (the error names the file, line and byte)."""


class FileReadError(ArrowStreamError, OSError):
    """A file could not be read (permissions, or storage errors that outlasted retries)."""


class FileChangedError(FileReadError):
    """A file is not the version the dataset was planned on: it was rewritten, truncated or extended since."""


class StalePlanCacheError(FileChangedError):
    """A plan cache entry describes a file as it was before a rewrite that kept its size and modification time:
    the error names the entry; remove it (or pass ``plan_cache=False``) and build the dataset again."""


class SchemaMismatchError(ArrowStreamError, ValueError):
    """Files of one dataset disagree on their columns or types."""


class NullValueError(ArrowStreamError, ValueError):
    """A numeric column holds nulls and no fill value was given for it."""


class ConversionError(ArrowStreamError, ValueError):
    """A column's values cannot be represented in the chosen output format."""


class StateError(ArrowStreamError, ValueError):
    """A checkpoint state is malformed or cannot be used."""


class StateVersionError(StateError):
    """A checkpoint state has a format version this arrowstream cannot read."""


class StateMismatchError(StateError):
    """A checkpoint state was taken on other data, options or topology."""


class TopologyError(ArrowStreamError, RuntimeError):
    """Rank and world size cannot be known for sure: their sources (explicit, Accelerate,
    torch.distributed, Horovod) disagree, a launcher started several processes but none is set
    up, or a collective was called without torch.distributed."""


class WorkerError(ArrowStreamError, RuntimeError):
    """A loader worker could not hand its batches to the trainer: a batch it could not send, or it died."""


class UnknownLengthError(ArrowStreamError, TypeError):
    """A count asked before reading that only reading tells: ``len(loader)``, ``num_batches`` and the rows
    ``drop_last`` drops, with a ``filter`` or ``bad_rows="skip"``. A ``TypeError``, as ``len()`` of an object
    without a length, so ``list(loader)`` and torch's length hints go on without one."""


class SharedMemoryError(ArrowStreamError, OSError):
    """Shared memory (``/dev/shm``) has no room for what the loader must put there."""


class NotSupportedYetError(ArrowStreamError, NotImplementedError):
    """A documented option whose implementation has not landed yet."""


class MissingDependencyError(ArrowStreamError, ImportError):
    """An optional dependency is needed and not installed."""


class RepeatedEpochWarning(UserWarning):
    """A loader reads a finished epoch again, the same batches in the same order: ``set_epoch`` was not
    called with a new epoch before the loop.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error", RepeatedEpochWarning)  # a loop that forgets set_epoch fails
    """


class TrimWarning(UserWarning):
    """``even_batches`` leaves out more than one batch of some worker in an epoch (ranks' shares of the rows
    differ by more than a batch per worker): the rows it trims are named, with their share of the epoch.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error", TrimWarning)  # a job that must not lose rows to evening fails
    """


class PlainLoaderWarning(UserWarning):
    """torch's plain ``DataLoader`` (which has no ``state_dict``) reads an arrowstream dataset: the batches are
    right, but the run cannot be checkpointed and resumed. Shown once per dataset (with workers, by worker 0, on
    its stderr). Use ``create_dataloader``'s loader, or torchdata's ``StatefulDataLoader(dataset,
    batch_size=None)``.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", PlainLoaderWarning)  # a loop that does not resume, on purpose
    """


__all__ = [
    "ArgumentTypeError",
    "ArrowStreamError",
    "ConversionError",
    "CorruptFileError",
    "DatasetNotFoundError",
    "EmptyDatasetError",
    "FileChangedError",
    "FileReadError",
    "InvalidArgumentError",
    "MalformedRowError",
    "MissingDependencyError",
    "NotSupportedYetError",
    "NullValueError",
    "PlainLoaderWarning",
    "RepeatedEpochWarning",
    "SchemaMismatchError",
    "SharedMemoryError",
    "StalePlanCacheError",
    "StateError",
    "StateMismatchError",
    "StateVersionError",
    "TopologyError",
    "TrimWarning",
    "UnknownLengthError",
    "WorkerError",
]
