"""The plan cache: the footers of a listing kept on disk, so that a restart or a resume reads none.

Planning lists the files (cheap: one request per folder) and reads every file's metadata (one or
more requests per file; CSV and JSON Lines: a scan of every byte). The footers, once reconciled,
depend only on the files and on the options that shape units, so they are kept in one entry per
dataset (protocol, path as given, format, parse options, text unit size, filter), with the listing
they were read from (path, size, modification tag and version of every file; the inode number and
inode change time of a local one, which ``os.utime`` cannot restore, so that a rewrite that keeps size
and modification time is a stale listing) inside. A start with the same listing takes them from the
entry and runs only the cheap rest of planning (column and schema checks, splits).

The footers come back as planning kept them, handles included: a Parquet ``FileMetaData`` that the
cold plan kept (within the handle budget of its storage, ``arrowstream._formats.footers.handle_budget``, which is part
of the key) is kept as its Thrift bytes and read back, so that workers read no footer and remote
splits get their read-ahead (byte ranges of column chunks) after a warm restart too. They are as
safe as the rest of the entry: remote reads are pinned to the listed version, local files are
checked by size and modification tag, a worker compares each file it opens with the plan
(``_formats._opened``; a difference names this entry: ``StalePlanCacheError``), and readers count
every unit's rows.

An entry is one file: a magic line, a JSON header (format version, the key material, the schemas,
the data fingerprints planning computed of the files), an Arrow IPC stream of one row per file (units,
byte ranges, text layouts), and a SHA-256 of header and payload. It is written and read column by
column from and into the plan's ``FooterTable``, file by file only where a file keeps a handle or a
text layout. It holds no pickle (a cache folder may be shared, and unpickling runs code) and no
credentials (storage options are not part of it). Writes go to a temporary
file in the folder, then ``os.replace``: readers see a whole entry or none, and processes that start
together each write a whole one. An entry that does not verify (damaged, cut short, of another
version, of another listing) is logged and rebuilt, never trusted; a folder that cannot be written
is logged once and planning goes on without the cache. The folder is bounded in bytes: an entry
read is touched, the oldest are removed after a write.

The entry's bytes (header, columns, checksum) and its checks are ``arrowstream._planning.cache_entry``'s. An Iceberg
snapshot's entry (``arrowstream._sources.iceberg_cache``) is a ``PlanCache`` too: keyed by the snapshot, checked against
the scan tasks' paths and sizes (a snapshot's files are never rewritten in place: no tags needed).

The trust boundary: the SHA-256 catches damage, not intent. An entry that verifies and whose key and
listing are the dataset's is taken as a whole, its data fingerprint included: wrong counts are caught
when readers count rows, a changed fingerprint is not (checking it means computing it, which is what
keeping it saves). A cache folder is as trusted as the checkpoints it plans resumes for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import struct
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from .._core.plan_types import FileEntry
from .._formats import FileFormat
from .._formats.footer_table import shaping_options, tabled
from .._formats.footers import FooterTable, handle_budget
from .._storage.filesystem import is_local_protocol
from ..errors import ArgumentTypeError, InvalidArgumentError
from .cache_entry import (
    CACHE_VERSION,
    OtherVersionError,
    encode,
    entry_footers,
    is_tagged,
    is_untagged,
    listing_of,
    read_entry_table,
    stale_key,
    stale_listing,
    verified_entry,
)

logger = logging.getLogger("arrowstream")

CACHE_DIR_ENV = "ARROWSTREAM_CACHE_DIR"
MAX_BYTES_ENV = "ARROWSTREAM_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 1 << 30          # 1 GiB of entries per cache folder
_SUFFIX = ".plan"
_TEMP_PREFIX = ".tmp-"
_ABANDONED_TEMP_S = 3600             # a temporary file this old was left by a process that died mid-write
_warned_folders: set[str] = set()

PlanCacheSetting = str | Literal[False] | None
T = TypeVar("T")


def check_plan_cache(value: Any) -> PlanCacheSetting:
    """``plan_cache`` as given: None (the default folder), a folder, or False (no cache)."""
    if value is None or value is False:
        return value
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bool):
        folder = os.fspath(value)
        if isinstance(folder, str) and folder.strip():
            return folder
    raise (ArgumentTypeError if not isinstance(value, (str, os.PathLike)) else InvalidArgumentError)(
        f"plan_cache: expected None (the default folder: ${CACHE_DIR_ENV}, else the user cache folder), a folder "
        f"path, or False (no cache), got {value!r}; see docs/large-datasets.md")


def default_folder() -> str:
    """``$ARROWSTREAM_CACHE_DIR``, else ``$XDG_CACHE_HOME/arrowstream``, else ``~/.cache/arrowstream``."""
    chosen = os.environ.get(CACHE_DIR_ENV, "").strip()
    if chosen:
        return chosen
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "arrowstream")


def cache_folder(setting: PlanCacheSetting) -> str | None:
    """The folder a ``plan_cache`` setting names; None for no cache."""
    if setting is False:
        return None
    return os.path.abspath(os.path.expanduser(setting if setting is not None else default_folder()))


def max_bytes() -> int:
    """The bound on a cache folder's entries: ``$ARROWSTREAM_CACHE_MAX_BYTES``, else 1 GiB."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        return max(int(text), 0)
    except ValueError:
        raise InvalidArgumentError(f"{MAX_BYTES_ENV}={text!r} is not a number of bytes; set it to an integer such as "
                                   f"{DEFAULT_MAX_BYTES} or unset it") from None


def _without_userinfo(path: Any) -> Any:
    """The path(s) as given, without ``user:password@`` in URLs (the cache never holds credentials)."""
    if isinstance(path, (list, tuple)):
        return [_without_userinfo(p) for p in path]
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)
    text = text if isinstance(text, str) else repr(text)
    if "://" in text:
        return re.sub(r"^([A-Za-z][\w+.-]*://)[^/@]*@", r"\1", text).rstrip("/") or text
    return os.path.abspath(text)


def _filter_key(filter: pc.Expression | None) -> dict[str, str] | None:
    """The filter as text and as a digest of its serialized form (``x > 5`` and ``x > 5.0`` print alike)."""
    if filter is None:
        return None
    serialized = filter.__reduce__()[1][0]   # pyarrow's own IPC form of the expression
    return {"text": str(filter), "sha256": hashlib.sha256(bytes(serialized)).hexdigest()}


def key_material(protocol: str, path: Any, file_format: FileFormat, filter: pc.Expression | None) -> dict[str, Any]:
    """What decides an entry, but the listing: it names the entry file and is checked when read."""
    return {
        "cache_version": CACHE_VERSION,
        "pyarrow": int(pa.__version__.split(".")[0]),
        "protocol": protocol,
        "path": _without_userinfo(path),
        "format": file_format.name,
        **shaping_options(file_format),                              # text: parse options, unit size
        "filter": _filter_key(filter),                              # prunes units by statistics
        "handle_budget": handle_budget(is_local_protocol(protocol)),  # which footers keep handles
    }


@dataclass
class CacheOutcome:
    """What a planning did with the cache: ``hit``, ``built``, ``rebuilt`` (with why), or ``off``."""

    path: str | None
    action: str
    reason: str = ""


class PlanCache:
    """One dataset's entry in a cache folder; see the module docstring."""

    # files may be rewritten in place: a listing is checked only where every file has a modification tag or a
    # version (an Iceberg snapshot's files never are: see ``arrowstream._sources.iceberg_cache``)
    needs_tags = True

    def __init__(self, folder: str, material: dict[str, Any], file_format: FileFormat) -> None:
        self.folder, self.material, self.file_format = folder, material, file_format
        digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]
        self.path = os.path.join(folder, f"{digest}{_SUFFIX}")
        self.outcome = CacheOutcome(self.path, "built")

    # -- reading ---------------------------------------------------------------------------------
    def load(self, entries: Sequence[FileEntry]) -> FooterTable | None:
        """The cached footers of ``entries``; None (logged, to be rebuilt) when there are none to trust."""
        return self._load(entries, lambda header, table, listing: entry_footers(header, table, listing, entries,
                                                                          self.file_format))

    def _load(self, entries: Sequence[FileEntry], decode: Callable[[dict[str, Any], pa.Table, dict[str, pa.Array]], T],
              ) -> T | None:
        """What ``decode`` makes of the entry (header, table, current listing) when its key and listing are those
        of ``entries``; None (logged, to be rebuilt) when there is none to trust. ``decode`` raises ValueError,
        KeyError, TypeError or IndexError on an entry it cannot read: the entry is then damaged."""
        untagged = CacheOutcome(None, "off", "the listing gives no modification tag of some files")
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError as exc:
            if self.needs_tags and not all(map(is_tagged, entries)):
                self.outcome = untagged
            elif isinstance(exc, FileNotFoundError):
                self.outcome = CacheOutcome(self.path, "built", "no entry yet")
            else:
                self._miss(f"it cannot be read ({exc})")
            return None
        listing = listing_of(entries)
        if self.needs_tags and is_untagged(listing["tag"], listing["version"]):   # as columns: built to be checked
            self.outcome = untagged
            return None
        try:
            header, payload = verified_entry(data)
            stale = stale_key(header, self.material)
            table = read_entry_table(payload) if not stale else None
            stale = stale or stale_listing(table, listing, entries)
            if stale:
                self._miss(stale)
                return None
            assert table is not None
            decoded = decode(header, table, listing)
        except OtherVersionError as exc:   # written by another release: stale, not damaged
            self._miss(str(exc))
            return None
        except (ValueError, KeyError, TypeError, IndexError, struct.error, pa.ArrowException, OSError) as exc:
            self._miss(f"it is damaged ({exc})", damaged=True)
            return None
        with contextlib.suppress(OSError):
            os.utime(self.path)   # most recently used
        self.outcome = CacheOutcome(self.path, "hit")
        return decoded

    def _miss(self, reason: str, damaged: bool = False) -> None:
        self.outcome = CacheOutcome(self.path, "rebuilt", reason)
        (logger.warning if damaged else logger.info)(
            "arrowstream: the plan cache entry %s is not used: %s; reading the footers again and rebuilding it",
            self.path, reason)

    # -- writing ---------------------------------------------------------------------------------
    def store(self, entries: Sequence[FileEntry], footers: FooterTable) -> None:
        """Write the entry of ``footers``, the footers of ``entries``, with the data fingerprints planning
        computed of them (``footers.known_fingerprints``), atomically; a folder that cannot take it is logged once."""
        if not tabled(footers) or (self.needs_tags and is_untagged(footers.tags, footers.versions)):
            return   # footers the cache cannot write (none of the file formats'), or files it could not tell apart
        self._write(lambda: encode(self.material, footers, entries=entries))

    def _write(self, encoded: Callable[[], bytes]) -> None:
        """Write the entry ``encoded`` makes, atomically, then bound the folder; a folder that cannot take it
        is logged once."""
        try:
            data = encoded()
            os.makedirs(self.folder, exist_ok=True)
            descriptor, temporary = tempfile.mkstemp(dir=self.folder, prefix=_TEMP_PREFIX, suffix=_SUFFIX)
            try:
                with os.fdopen(descriptor, "wb") as f:
                    f.write(data)
                os.replace(temporary, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
            limit = max_bytes()
            evict(self.folder, limit, keep=self.path)
            if not os.path.exists(self.path):
                self.outcome = CacheOutcome(None, "off", f"the entry alone is over {MAX_BYTES_ENV}={limit}")
        except OSError as exc:
            if self.folder not in _warned_folders:
                _warned_folders.add(self.folder)
                logger.warning("arrowstream: cannot write the plan cache in %s (%s); planning goes on without it "
                               "(set plan_cache= or $%s to a writable folder, or plan_cache=False)",
                               self.folder, exc, CACHE_DIR_ENV)
            self.outcome = CacheOutcome(None, "off", f"cannot write: {exc}")


def evict(folder: str, limit: int, keep: str | None = None) -> None:
    """Remove the least recently used entries until the folder's entries hold at most ``limit`` bytes,
    and temporary files that a process left when it died mid-write."""
    entries = []
    now = time.time()
    with os.scandir(folder) as scan:
        for item in scan:
            if not item.name.endswith(_SUFFIX):
                continue
            with contextlib.suppress(OSError):
                status = item.stat()
                if item.name.startswith(_TEMP_PREFIX):
                    if now - status.st_mtime > _ABANDONED_TEMP_S:
                        os.unlink(item.path)
                    continue
                entries.append((status.st_mtime, item.path, status.st_size))
    total = sum(size for _, _, size in entries)
    oldest_first = sorted(entries)
    # the entry just written goes last, and only when it alone is over the bound
    for _, path, size in [e for e in oldest_first if e[1] != keep] + [e for e in oldest_first if e[1] == keep]:
        if total <= limit:
            break
        with contextlib.suppress(OSError):
            os.unlink(path)
            total -= size
            logger.info("arrowstream: removed the plan cache entry %s (least recently used; the folder holds "
                        "more than %d bytes)", path, limit)


def plan_cache_for(setting: PlanCacheSetting, protocol: str, path: Any, file_format: FileFormat,
                   filter: pc.Expression | None) -> PlanCache | None:
    """The entry of a dataset in the folder ``setting`` names; None when the cache is off."""
    folder = cache_folder(setting)
    if folder is None:
        return None
    return PlanCache(folder, key_material(protocol, path, file_format, filter), file_format)
