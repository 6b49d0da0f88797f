"""Discovery: turn ``path`` (dir, glob, file, or a list of them) into a sorted file list, once."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from ._failures import is_missing, is_permission
from ._storage import open_filesystem
from .errors import ArgumentTypeError, DatasetNotFoundError, EmptyDatasetError, FileReadError, InvalidArgumentError

_GLOB_CHARS = frozenset("*?[")
_TAG_KEYS = ("ETag", "etag", "generation", "version_id", "mtime", "LastModified", "last_modified",
             "updated", "created")


@dataclass(frozen=True)
class FileEntry:
    """One data file: its filesystem path, a portable name, size and modification tag."""

    path: str
    name: str
    size: int
    tag: str


def _modification_tag(info: dict[str, Any]) -> str:
    for key in _TAG_KEYS:
        value = info.get(key)
        if value is not None:
            return f"{key}={value}"
    return ""


def _is_hidden(relative: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative.split("/") if part)


def _as_strings(path: Any) -> list[str]:
    if isinstance(path, (str, os.PathLike)):
        return [os.fspath(path)]
    if isinstance(path, Sequence) and not isinstance(path, bytes):
        if not path:
            raise InvalidArgumentError("path: the list of paths is empty; pass at least one file, directory or glob")
        out = []
        for item in path:
            if not isinstance(item, (str, os.PathLike)):
                raise ArgumentTypeError(f"path: list items must be str or os.PathLike, got {type(item).__name__}")
            out.append(os.fspath(item))
        return out
    raise ArgumentTypeError(f"path: expected a str, os.PathLike or a list of them, got {type(path).__name__}")


def _list_one(fs: fsspec.AbstractFileSystem, protocol: str, url: str, path: str) -> dict[str, dict[str, Any]]:
    if any(c in path for c in _GLOB_CHARS):
        found = fs.glob(path, detail=True)
        files = {p: i for p, i in found.items() if i.get("type") == "file"}
        if not files:
            raise DatasetNotFoundError(f"path: the glob {url!r} matches no file; check the pattern")
        return files
    try:
        info = fs.info(path)
    except Exception as exc:  # backends raise their own types: classified below, never swallowed
        if is_missing(exc):
            raise DatasetNotFoundError(f"path: {url!r} does not exist; check the path and the storage_options") from None
        if is_permission(exc):
            raise FileReadError(f"path: {url!r} cannot be read ({type(exc).__name__}: {exc}); check permissions or "
                                "credentials") from None
        raise FileReadError(f"path: {url!r} cannot be listed ({type(exc).__name__}: {exc})") from exc
    if info.get("type") == "directory":
        found = fs.find(path, detail=True, withdirs=False)
        root = path.rstrip("/")
        files = {p: i for p, i in found.items()
                 if i.get("type") == "file" and not _is_hidden(p[len(root):])}
        if not files:
            raise EmptyDatasetError(
                f"path: the directory {url!r} holds no data files (names starting with '.' or '_' are "
                "skipped); point `path` at the files or a glob such as 'dir/**/*.parquet'")
        return files
    return {path: info}


def discover_files(path: Any, storage_options: dict[str, Any] | None,
                   ) -> tuple[str, list[FileEntry], fsspec.AbstractFileSystem]:
    """List the files of ``path`` once: returns the fsspec protocol, the files sorted by path, and the
    filesystem that listed them (the main process reads the footers with it).

    Directories are listed recursively, skipping names that start with ``.`` or ``_``
    (``_SUCCESS``, ``.crc``), as pyarrow.dataset does. Names are relative to the files'
    common folder, so they carry no machine-local absolute path.
    """
    urls = _as_strings(path)
    protocol = ""
    infos: dict[str, dict[str, Any]] = {}
    fs: fsspec.AbstractFileSystem | None = None
    for url in urls:
        try:
            this_fs, this_path = url_to_fs(url, **(storage_options or {}))
        except (ImportError, ValueError):
            scheme = url.split("://", 1)[0] if "://" in url else "file"
            open_filesystem(scheme, storage_options or {})  # raises the clear error
            raise
        this_protocol = this_fs.protocol if isinstance(this_fs.protocol, str) else this_fs.protocol[0]
        if fs is None:
            fs, protocol = this_fs, this_protocol
        elif this_protocol != protocol:
            raise InvalidArgumentError(
                f"path: all paths must be on one filesystem, got {protocol}:// and {this_protocol}:// "
                f"({url!r}); build one dataset per filesystem")
        infos.update(_list_one(this_fs, protocol, url, this_path))
    paths = sorted(infos)
    root = posixpath.commonpath(paths) if len(paths) > 1 else posixpath.dirname(paths[0])
    if root in paths:  # a single file given twice
        root = posixpath.dirname(root)
    entries = [FileEntry(path=p, name=posixpath.relpath(p, root) if root else p,
                         size=int(infos[p].get("size") or 0), tag=_modification_tag(infos[p]))
               for p in paths]
    assert fs is not None
    return protocol, entries, fs

