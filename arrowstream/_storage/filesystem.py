"""Filesystem access: one fsspec filesystem per process, retries of transient errors (``_storage/retry.py``).

The :class:`Storage` object travels to workers by pickle. It carries the protocol and the
``storage_options`` (credentials included), never an open filesystem: each process opens its
own, which is what keeps fork, spawn and forkserver workers from sharing an event loop or a
socket with the parent (DESIGN guarantee 12). ``storage_options`` never appear in a repr, a
log line, an error message or a checkpoint state.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import fsspec
import pyarrow as pa

from .._core.install import install_hint
from ..errors import MissingDependencyError
from .backends import backend_options, single_attempt
from .cache import DataCache
from .credentials import CredentialProvider, as_provider
from .failures import is_expired_credentials
from .pinned import Pin, check_in_process
from .prefetch import PartsFile, Prefetcher
from .retry import RetryPolicy

if TYPE_CHECKING:
    from .._core.plan_types import FileEntry

logger = logging.getLogger("arrowstream")

T = TypeVar("T")

_LOCAL_PROTOCOLS = frozenset({"file", "local"})
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure",
           "abfss": "azure", "adl": "azure"}
def is_local_protocol(protocol: str) -> bool:
    """Whether files of ``protocol`` are on this machine's file system."""
    return protocol in _LOCAL_PROTOCOLS


def display_url(protocol: str, path: str) -> str:
    """The name a user recognizes for ``path``: ``s3://bucket/key`` or a local path."""
    if protocol in _LOCAL_PROTOCOLS or "://" in path:  # local, or a full URL already (Iceberg data files)
        return path
    return f"{protocol}://{path.lstrip('/')}"


def current_options(storage_options: dict[str, Any] | None,
                    credential_provider: Callable[[], dict[str, Any]] | CredentialProvider | None,
                    what: str = "while opening the filesystem") -> dict[str, Any]:
    """``storage_options`` with what ``credential_provider`` returns now laid over them (``what``: what
    they are for, named in the provider's errors)."""
    options = dict(storage_options or {})
    provider = as_provider(credential_provider)
    return options if provider is None else provider.options(options, what)


class Storage:
    """The filesystem of a dataset: protocol and options, opened lazily once per process."""

    def __init__(self, protocol: str, storage_options: dict[str, Any] | None = None,
                 retry: RetryPolicy | None = None,
                 credential_provider: Callable[[], dict[str, Any]] | CredentialProvider | None = None,
                 filesystem: fsspec.AbstractFileSystem | None = None) -> None:
        """``filesystem``: one already open in this process with these options (discovery's), reused."""
        self.protocol = protocol
        self._options = dict(storage_options or {})
        self._credential_provider = as_provider(credential_provider)
        self.retry = retry or RetryPolicy()
        self._fs: fsspec.AbstractFileSystem | None = filesystem
        self._pid = -1 if filesystem is None else os.getpid()
        self.read_ahead = 0        # splits fetched ahead by each worker (remote storage): see reading()
        self.read_lanes = 1        # splits read at once (interleave): see reading()
        self.cache: DataCache | None = None   # the local cache of remote data: see reading()
        self._prefetcher: Prefetcher | None = None
        self._prefetcher_pid = -1

    @property
    def is_local(self) -> bool:
        return is_local_protocol(self.protocol)

    def options(self, what: str = "") -> dict[str, Any]:
        """``storage_options`` with what the credential provider returns now laid over them."""
        return current_options(self._options, self._credential_provider, what or self._opening())

    def _opening(self) -> str:
        """What a filesystem is opened for, as the provider's errors say it."""
        from torch.utils.data import get_worker_info

        worker = get_worker_info()
        where = "in the main process" if worker is None else f"in DataLoader worker {worker.id}"
        return f"while opening the {self.protocol}:// filesystem {where}"

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None or self._pid != os.getpid():
            self._fs = open_filesystem(self.protocol, self.options(), fresh=True, retry=self.retry)
            self._pid = os.getpid()
        return self._fs

    def refresh_credentials(self, what: str = "") -> bool:
        """Ask the credential provider again and reopen the filesystem; False without a provider.

        ``what`` (the object being read) is named in the provider's errors."""
        if self._credential_provider is None:
            return False
        options = self.options(f"while refreshing credentials for {what}" if what else "")
        self._fs, self._pid = open_filesystem(self.protocol, options, fresh=True, retry=self.retry), os.getpid()
        if self._prefetcher is not None and self._prefetcher_pid == os.getpid():
            self._prefetcher.replace_filesystem(self._fs)
        return True

    def credential_failure(self, exc: BaseException, what: str, refreshes: int) -> Exception | None:
        """The credential provider's part in a failure that outlasted retries and refreshes, as an error
        naming it: credentials still expired after ``refreshes`` new answers, or options the backend
        could not use. None without a provider, or when the failure is the store's."""
        provider = self._credential_provider
        if provider is None:
            return None
        if is_expired_credentials(exc):
            return provider.expired(exc, what, refreshes) if refreshes else None
        return provider.fault(exc, f"for {what}", self.protocol, self._options)

    def call(self, fn: Callable[[], T], what: str) -> T:
        """Run ``fn`` with retries of transient errors, refreshing expired credentials (at most 3 times)."""
        return self.retry.call(fn, what, credentials=self)

    def pin(self, entry: FileEntry) -> Pin:
        """What the reads of ``entry`` are pinned to: its planned size and version."""
        return Pin(entry.path, display_url(self.protocol, entry.path), entry.size, entry.version, self.protocol)

    def check_unchanged(self, entry: FileEntry) -> None:
        """A local or ``memory://`` file: ``FileChangedError`` unless it has its planned size and
        modification time (one stat). Remote files need no check: each of their reads is pinned."""
        if self.is_local or self.protocol == "memory":
            check_in_process(self.pin(entry), None if self.is_local else self.fs)

    def open_input(self, entry: FileEntry, memory_map: bool = False) -> pa.NativeFile:
        """Open one file for random-access reading (memory-mapped when local and asked for).

        The size known from the listing is passed on, which saves object stores a HEAD request
        per open: a remote file is opened with one request for the bytes it reads. A local file is
        checked against its planned size and modification time first (before it is mapped: a file
        truncated under a map would kill the process with SIGBUS when read).
        """
        self.check_unchanged(entry)
        if self.is_local:
            return pa.memory_map(entry.path) if memory_map else pa.OSFile(entry.path)
        if entry.size > 0:
            return pa.PythonFile(PartsFile(self.fs, self.pin(entry), self.prefetcher, self.cache), mode="r")
        return pa.PythonFile(self.fs.open(entry.path, "rb"), mode="r")

    def reading(self, read_ahead: int, read_lanes: int, cache: DataCache | None = None) -> Storage:
        """This storage for readers that fetch ``read_ahead`` splits ahead of the ``read_lanes`` splits they
        read at once, through ``cache`` (remote storage only; a copy: the filesystem already open is shared, the
        prefetcher is its own)."""
        storage = object.__new__(type(self))  # not copy.copy: __getstate__ would drop the open filesystem
        storage.__dict__.update(self.__dict__)
        storage.read_ahead, storage.read_lanes = read_ahead, read_lanes
        storage.cache = None if self.is_local else cache
        return storage._without_prefetcher()

    def _without_prefetcher(self) -> Storage:
        """This storage with no prefetcher yet (its own is made when first asked)."""
        self._prefetcher, self._prefetcher_pid = None, -1
        return self

    @property
    def prefetcher(self) -> Prefetcher | None:
        """This process's read-ahead of remote splits (``read_ahead`` splits deep), if any."""
        if self.is_local or self.read_ahead == 0:
            return None
        if self._prefetcher is None or self._prefetcher_pid != os.getpid():
            self._prefetcher = Prefetcher(self.fs, self.read_ahead + self.read_lanes, self.cache)
            self._prefetcher_pid = os.getpid()
        return self._prefetcher

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fs"] = None
        state["_pid"] = -1
        state["_prefetcher"] = None
        state["_prefetcher_pid"] = -1
        return state

    def __repr__(self) -> str:
        return f"Storage(protocol={self.protocol!r}, storage_options=<{len(self._options)} hidden>)"


def open_filesystem(protocol: str, options: dict[str, Any], fresh: bool = False,
                    retry: RetryPolicy | None = None) -> fsspec.AbstractFileSystem:
    """``fsspec.filesystem`` with a clear error when the backend's extra is missing.

    With ``retry``, the backend makes one attempt per call and cuts a request after the policy's
    ``timeout`` (``_storage/backends.py``; what ``options`` say about timeouts wins).
    """
    try:
        if retry is None:
            return fsspec.filesystem(protocol, skip_instance_cache=fresh, **options)
        tuned = backend_options(protocol, options, retry.timeout)
        return single_attempt(fsspec.filesystem(protocol, skip_instance_cache=fresh, **tuned), protocol)
    except ImportError as exc:
        extra = _EXTRAS.get(protocol)
        hint = install_hint(extra) if extra else f"install the fsspec backend for {protocol!r}"
        raise MissingDependencyError(
            f"reading {protocol}:// URLs needs a package that is not installed ({exc}); {hint}") from None
    except ValueError as exc:
        if "Protocol not known" in str(exc):
            from ..errors import InvalidArgumentError
            raise InvalidArgumentError(
                f"path: unknown URL scheme {protocol!r}; use a local path or an fsspec URL "
                "such as s3://, gs://, az:// or memory://") from None
        raise
