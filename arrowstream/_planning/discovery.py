"""Discovery: turn ``path`` (dir, glob, file, or a list of them) into a sorted file list, once."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from .._core.plan_types import FileEntry
from .._core.values import GcPaused
from .._storage.backends import backend_options, single_attempt
from .._storage.credentials import CredentialProvider, as_provider
from .._storage.failures import is_expired_credentials, is_missing, is_permission
from .._storage.filesystem import Storage, current_options, open_filesystem
from .._storage.pinned import version_of
from .._storage.retry import RetryPolicy
from ..errors import (
    ArgumentTypeError,
    ArrowStreamError,
    DatasetNotFoundError,
    EmptyDatasetError,
    FileReadError,
    InvalidArgumentError,
)
from .walk import LocalFiles, glob_local, list_local

_GLOB_CHARS = frozenset("*?[")
# what, in "\0"-joined names, makes a name other than what relpath gives: an empty one, one starting with
# "/" or "." (a "." or ".." part; a hidden name takes the careful way too), ending in "/", holding "//" or "/."
_NOT_PLAIN = ("\0\0", "\0.", "\0/", "/\0", "//", "/.")
_Files = TypeVar("_Files")
_TAG_KEYS = ("ETag", "etag", "generation", "version_id", "mtime", "LastModified", "last_modified",
             "updated", "created")


def _modification_tag(info: dict[str, Any]) -> str:
    for key in _TAG_KEYS:
        value = info.get(key)
        if value is not None:
            return f"{key}={value}"
    return ""


def _is_hidden(relative: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative.split("/") if part)


def _one_string(path: str | os.PathLike[str]) -> str:
    text = os.fspath(path)
    if not isinstance(text, str):
        raise ArgumentTypeError(f"path: expected a str path, got {type(text).__name__} {text!r}")
    if not text.strip():
        raise InvalidArgumentError(f"path: {text!r} names no file or folder (the current directory is never read "
                                   "for an empty path); pass a file, directory or glob, such as '.' for this folder")
    return text


def _as_strings(path: Any) -> list[str]:
    if isinstance(path, (str, os.PathLike)):
        return [_one_string(path)]
    if isinstance(path, Sequence) and not isinstance(path, bytes):
        if not path:
            raise InvalidArgumentError("path: the list of paths is empty; pass at least one file, directory or glob")
        out = []
        for item in path:
            if not isinstance(item, (str, os.PathLike)):
                raise ArgumentTypeError(f"path: list items must be str or os.PathLike, got {type(item).__name__}")
            out.append(_one_string(item))
        return out
    raise ArgumentTypeError(f"path: expected a str, os.PathLike or a list of them, got {type(path).__name__}")


def _list_local(fs: fsspec.AbstractFileSystem, url: str, path: str) -> LocalFiles:
    """``_list_remote`` on the local filesystem, symbolic links followed as pyarrow follows them (see
    ``_planning.walk``). Its filters have nothing to take out here: the walk lists files only and skips hidden
    names below ``path`` at every level, where ``_is_hidden`` looks. The collector is paused: a
    tuple per file, in a process that imported torch, cost ~0.1 s of a 50,000-file listing."""
    if any(c in path for c in _GLOB_CHARS):
        with GcPaused():
            files = glob_local(path, url)
        if not files:
            raise DatasetNotFoundError(f"path: the glob {url!r} matches no file; check the pattern")
        return files
    with GcPaused():
        files = list_local(path, url)
    if not files:
        _raise_no_files(fs, url, path)
    return files


def _list_remote(fs: fsspec.AbstractFileSystem, url: str, path: str) -> dict[str, dict[str, Any]]:
    """The files under ``path`` (a glob, a directory or a file), with one listing request where the
    backend allows: ``find`` lists a directory recursively and returns a file given by name; only an
    empty answer costs a second request, to tell a missing path from an empty directory."""
    if any(c in path for c in _GLOB_CHARS):
        files = {p: i for p, i in fs.glob(path, detail=True).items() if i.get("type") == "file"}
        if not files:
            raise DatasetNotFoundError(f"path: the glob {url!r} matches no file; check the pattern")
        return files
    found = fs.find(path, detail=True, withdirs=False)
    root = path.rstrip("/")
    files = {p: i for p, i in found.items() if i.get("type") == "file" and not _is_hidden(p[len(root):])}
    if not files:
        _raise_no_files(fs, url, path, listed_any=bool(found))
    return files


def _raise_no_files(fs: fsspec.AbstractFileSystem, url: str, path: str, listed_any: bool = False) -> NoReturn:
    if not listed_any and fs.info(path).get("type") != "directory":  # FileNotFoundError when missing
        raise DatasetNotFoundError(f"path: {url!r} does not exist; check the path and the storage_options")
    raise EmptyDatasetError(
        f"path: the directory {url!r} holds no data files (names starting with '.' or '_' are "
        "skipped); point `path` at the files or a glob such as 'dir/**/*.parquet'")


def _listed(storage: Storage, url: str, path: str,
            list_files: Callable[[fsspec.AbstractFileSystem, str, str], _Files]) -> _Files:
    """``list_files`` with the storage's retries and credential refresh; backend errors classified."""
    try:
        return storage.call(lambda: list_files(storage.fs, url, path), what=url)
    except ArrowStreamError:
        raise
    except Exception as exc:  # backends raise their own types: classified here, never swallowed
        if is_missing(exc):
            raise DatasetNotFoundError(f"path: {url!r} does not exist; check the path and the storage_options") from None
        if is_expired_credentials(exc):  # with a provider, storage.call names it once refreshes run out
            raise FileReadError(f"path: {url!r} cannot be listed: the storage credentials expired ({type(exc).__name__}: "
                                f"{exc}); pass credential_provider= to refresh them during a run (see "
                                "docs/storage.md)") from None
        if is_permission(exc):
            raise FileReadError(f"path: {url!r} cannot be read ({type(exc).__name__}: {exc}); check permissions or "
                                "credentials") from None
        raise FileReadError(f"path: {url!r} cannot be listed ({type(exc).__name__}: {exc})") from exc


def discover_files(path: Any, storage_options: dict[str, Any] | None,
                   credential_provider: Callable[[], dict[str, Any]] | CredentialProvider | None = None,
                   retry: RetryPolicy | None = None) -> tuple[Storage, list[FileEntry]]:
    """List the files of ``path`` once: returns the dataset's storage (its filesystem is the one that
    listed, which the main process goes on to read the footers with) and the files sorted by path.

    Directories are listed recursively, skipping names that start with ``.`` or ``_``
    (``_SUCCESS``, ``.crc``), as pyarrow.dataset does; on the local filesystem symbolic links to
    files and folders are followed, as pyarrow does, and a loop or a dangling link is an error
    naming the link (see ``arrowstream._planning.walk``). Names are relative to the files'
    common folder, so they carry no machine-local absolute path. Listing requests get the
    storage's retries of transient errors and its credential refresh.
    """
    urls = _as_strings(path)
    provider = as_provider(credential_provider)
    options = current_options(storage_options, provider, f"while opening the filesystem to list {urls[0]}")
    storage: Storage | None = None
    infos: dict[str, dict[str, Any]] = {}   # a remote listing's fsspec info per path
    statuses: LocalFiles = {}                # a local listing's (size, mtime, inode, ctime) per path
    retry = retry or RetryPolicy()
    for url in urls:
        scheme = url.split("://", 1)[0] if "://" in url else "file"
        try:   # a filesystem of its own, its backend's retries turned down (_storage/backends.py)
            fs, fs_path = url_to_fs(url, skip_instance_cache=True, **backend_options(scheme, options, retry.timeout))
        except (ImportError, ValueError):
            open_filesystem(scheme, options)  # raises the clear error
            raise
        except Exception as exc:  # the backend refused the options: the provider's, when it gave some
            fault = None if provider is None else provider.fault(exc, f"for {url}", scheme, storage_options or {})
            if fault is not None:
                raise fault from exc
            raise
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        single_attempt(fs, protocol)
        if storage is None:
            storage = Storage(protocol, storage_options, retry=retry, credential_provider=provider, filesystem=fs)
        elif protocol != storage.protocol:
            raise InvalidArgumentError(
                f"path: all paths must be on one filesystem, got {storage.protocol}:// and {protocol}:// "
                f"({url!r}); build one dataset per filesystem")
        if isinstance(fs, LocalFileSystem):   # symbolic links followed, as pyarrow does (see _planning.walk)
            statuses.update(_listed(storage, url, fs_path, _list_local))
        else:
            infos.update(_listed(storage, url, fs_path, _list_remote))
    assert storage is not None and not (statuses and infos)   # one protocol: all paths local or none
    if statuses:
        return storage, _local_entries(statuses)
    paths = sorted(infos)
    names = _names(paths)
    entries = [FileEntry(path=p, name=name, size=int(infos[p].get("size") or 0),
                         tag=_modification_tag(infos[p]), version=version_of(storage.protocol, infos[p]))
               for p, name in zip(paths, names)]
    return storage, entries


def _local_entries(statuses: LocalFiles) -> list[FileEntry]:
    """The entries of a local listing, in one loop: what the remote loop makes of fsspec's local info
    ``{"size": st_size, "mtime": st_mtime}`` (tag ``mtime=<st_mtime>``, version ``str(st_mtime)``),
    without a dict, a tag lookup or a call per file (a third of a 50,000-file listing's cost), and the
    inode number and change time the plan cache compares."""
    paths = sorted(statuses)
    entries = []
    with GcPaused():   # an entry per file, as in _list_local
        for path, name in zip(paths, _names(paths)):
            size, mtime, inode, changed_ns = statuses[path]
            version = repr(mtime)   # str(float) is repr(float), as in version_of and f"mtime={mtime}"
            entries.append(FileEntry(path, name, size, "mtime=" + version, version, inode, changed_ns))
    return entries


def _names(paths: list[str]) -> list[str]:
    """The names of sorted ``paths``: each one relative to their common folder (to its folder for a
    single path), as ``_relative`` makes it. Where the first and the last path lie below the common
    folder of the two, every path does (sorted strings), so that folder is ``commonpath`` of all, no
    path is the folder itself, and one prefix is cut off all paths at once when no name has an empty,
    ``.`` or ``..`` part (a name starting with ``.`` takes the careful way too)."""
    if len(paths) > 1:
        root = posixpath.commonpath([paths[0], paths[-1]])
        prefix = root if root.endswith("/") else root + "/"
        if paths[0].startswith(prefix) and paths[-1].startswith(prefix):
            names = [p[len(prefix):] for p in paths]
            joined = "\0" + "\0".join(names) + "\0"
            if not any(s in joined for s in _NOT_PLAIN):
                return names   # every name plain: what _relative cuts off a normal path, relpath of any other
            return [_relative(p, root) for p in paths]
        root = posixpath.commonpath(paths)   # the careful way (and its ValueError on relative and absolute paths)
    else:
        root = posixpath.dirname(paths[0])
    if root in paths:  # a single file given twice
        root = posixpath.dirname(root)
    return [_relative(p, root) for p in paths]


def _relative(path: str, root: str) -> str:
    """``posixpath.relpath(path, root)`` (``path`` itself without a root), by cutting the prefix where
    ``path`` is already normal (no ``//``, ``.`` or trailing ``/``), which is what listings give:
    ``relpath`` costs ~40 µs a file, a third of a cold plan of small local files."""
    if not root:
        return path
    prefix = root if root.endswith("/") else root + "/"   # commonpath is normal: "/" ends in one already
    if path.startswith(prefix) and len(path) > len(prefix) and posixpath.normpath(path) == path:
        return path[len(prefix):]
    return posixpath.relpath(path, root)
