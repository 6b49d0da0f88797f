"""Listing on the local filesystem as pyarrow reads it: symbolic links followed, never silently.

fsspec's local ``find`` and ``glob`` list a symbolic link as type ``"other"`` and do not descend into
a linked folder, so the files behind links were left out of a dataset without a word, where
pyarrow.dataset reads them. Here links to files and folders are followed and listed under the
link's own path (the path pyarrow reports), with the size and modification time of the target. A
link that leads back into a folder being listed (a loop, which pyarrow follows some 40 levels
deep) and a dangling link (which pyarrow skips) are errors naming the link.

A listing maps each file's path to its ``(size, modification time, inode number, inode change time)``
(:data:`LocalFiles`): a tuple per file rather than an fsspec info dict, since a restart of a large
dataset lists every file and pays for whatever is made per file (issue 19: 50,000 files). The last
two are what ``os.utime`` cannot restore: the plan cache tells a file rewritten with its size and
modification time kept (``cp -p``, ``rsync -t``, a restore) from the file it cached by them.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from operator import attrgetter

from fsspec.utils import glob_translate

from ..errors import DatasetNotFoundError, InvalidArgumentError

# path -> (st_size, st_mtime, st_ino, st_ctime_ns) of the file or of a link's target
LocalFiles = dict[str, tuple[int, float, int, int]]
_HIDDEN_PREFIXES = (".", "_")
_name = attrgetter("name")


def _target_status(link: str, url: str) -> os.stat_result:
    """The status of what ``link`` points to; a dangling link or a loop of links is an error naming it."""
    try:
        return os.stat(link)
    except FileNotFoundError:
        raise DatasetNotFoundError(
            f"path: the symbolic link {link!r} (listing {url!r}) points to {os.readlink(link)!r}, which does not "
            "exist; restore its target or remove the link") from None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise InvalidArgumentError(
            f"path: the symbolic link {link!r} (listing {url!r}) is part of a loop of links; remove the "
            "link or point `path` at the data it should reach") from None


class _Walk:
    """One listing: the files found, the folders being listed (by real path) to detect loops.

    ``skipped`` are the prefixes of names left out at every level below the folder listed (``()``
    for none: ``str.startswith(())`` is false).
    """

    def __init__(self, url: str, skipped: tuple[str, ...], max_depth: int | None) -> None:
        self.url, self.skipped, self.max_depth = url, skipped, max_depth
        self.files: LocalFiles = {}

    def folder(self, folder: str, ancestors: frozenset[str], depth: int) -> None:
        if self.max_depth is not None and depth > self.max_depth:
            return
        with os.scandir(folder) as scan:   # in name order: the first of several bad links is the one named
            entries = sorted(scan, key=_name)
        prefix = folder if folder.endswith("/") else folder + "/"   # posixpath.join: a name holds no "/"
        files, skipped, lstat = self.files, self.skipped, os.lstat
        for entry in entries:   # one pass per file, no call of our own: the loop of a 50,000-file listing
            name = entry.name
            if name.startswith(skipped):
                continue
            if entry.is_file(follow_symlinks=False):   # a regular file, never a link: the common case first
                path = prefix + name
                status = lstat(path)   # entry.stat(follow_symlinks=False) makes the same call, ~10% slower
                files[path] = (status.st_size, status.st_mtime, status.st_ino, status.st_ctime_ns)
            elif entry.is_dir(follow_symlinks=False):
                path = prefix + name
                self.folder(path, ancestors | {os.path.realpath(path)}, depth + 1)
            elif entry.is_symlink():
                self.link(prefix + name, ancestors, depth)

    def link(self, path: str, ancestors: frozenset[str], depth: int) -> None:
        status = _target_status(path, self.url)
        if stat.S_ISREG(status.st_mode):
            self.files[path] = (status.st_size, status.st_mtime, status.st_ino, status.st_ctime_ns)
        elif stat.S_ISDIR(status.st_mode):
            target = os.path.realpath(path)
            if target in ancestors:
                raise InvalidArgumentError(
                    f"path: the symbolic link {path!r} (listing {self.url!r}) points to {os.readlink(path)!r}, a "
                    "folder that holds the link itself: following it would list the same files for ever; remove "
                    "the link or point `path` at a folder without it")
            self.folder(path, ancestors | {target}, depth + 1)


def list_local(path: str, url: str) -> LocalFiles:
    """The files of a local folder (recursively, names starting with ``.`` or ``_`` skipped) or the
    one file ``path`` names, symbolic links followed, each with its size, modification time, inode
    number and inode change time;
    ``{}`` for a folder without files. Names are checked below ``path`` only: a hidden folder given
    as ``path`` is listed, and so is a hidden file given by name.

    Example:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> os.makedirs(os.path.join(folder, "real"))
        >>> open(os.path.join(folder, "real", "a.parquet"), "wb").close()
        >>> os.symlink(os.path.join(folder, "real"), os.path.join(folder, "data"))
        >>> sorted(os.path.relpath(p, folder) for p in list_local(os.path.join(folder, "data"), "data"))
        ['data/a.parquet']
    """
    if os.path.islink(path):
        status = _target_status(path, url)
    else:
        try:
            status = os.stat(path)
        except FileNotFoundError:
            raise DatasetNotFoundError(f"path: {url!r} does not exist; check the path and the storage_options") from None
    if not stat.S_ISDIR(status.st_mode):
        return ({path: (status.st_size, status.st_mtime, status.st_ino, status.st_ctime_ns)}
                if stat.S_ISREG(status.st_mode) else {})
    walk = _Walk(url, _HIDDEN_PREFIXES, None)
    walk.folder(path.rstrip("/") or "/", frozenset({os.path.realpath(path)}), 1)
    return walk.files


def glob_local(pattern: str, url: str) -> LocalFiles:
    """The files matching a glob on the local filesystem, symbolic links followed (the same patterns
    and depth rule as fsspec's ``glob``: ``**`` any depth, ``*``, ``?`` and ``[...]`` one level)."""
    first = min(i for i in (pattern.find(c) for c in "*?[") if i >= 0)
    root = pattern[:pattern.rindex("/", 0, first) + 1] if "/" in pattern[:first] else "./"
    depth = None if "**" in pattern else pattern[len(root):].count("/") + 1
    matcher = re.compile(glob_translate(pattern))
    if not os.path.isdir(root):
        return {}
    walk = _Walk(url, (), depth)
    walk.folder(root.rstrip("/") or "/", frozenset({os.path.realpath(root)}), 1)
    return {p: status for p, status in walk.files.items() if matcher.match(p)}
