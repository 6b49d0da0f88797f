"""A local cache of remote data: the byte ranges read of pinned object versions, kept on local disk under a size
limit that every process using the folder shares.

An entry is one range ``[start, end)`` of one version of one object, as a read asked for it (data and footers
alike): its file name is a hash of (store, object, version, start, end), so the folder holds no name, credential or
signed URL, and a changed object (another version) is never served, its old entries being unreachable until they
are evicted. An entry file is a header (a magic number, the data's length, its CRC-32 and the first bytes of its
key's hash) and the data; it is written to a temporary file and renamed into place, so a reader sees a whole entry
or none, and every read checks the header and the checksum: a damaged, truncated or foreign file is deleted and the
range fetched again (warned once per process).

The limit holds across processes: a process reserves an entry's size in the folder's account (a small file under
an exclusive ``flock``) before it writes, and evicts when the reservation would pass the limit, so the folder never
holds more than the limit plus the entries being written. Eviction is scan-resistant: entries never hit go first,
the newest of them first, then those hit, least recently hit first; one new entry in 32 goes in as just hit, so a
new working set wins over an old one in time (the bimodal insertion of hardware caches). Least recently *used*
first would evict, in a cache smaller than an epoch, every entry just before the next epoch reads it again, and
save no GET at all; this keeps the first rows an epoch read, about the limit's share of them, for the next epoch,
which reads them first again and keeps them as hit. An entry's place in that order is its file's modification
time: the time of its last hit, or, never hit, a time before any hit that is the earlier the later it was written.
An eviction frees the folder down to 90% of the limit, so its scan of the folder is paid once per tenth of the
limit written. A folder that cannot be written (read-only, full) turns the cache off in that process with one
warning: reads go to the store, never fail for the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import random
import re
import struct
import time
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import DatasetNotFoundError, InvalidArgumentError
from .pinned import Pin, read_ranges

logger = logging.getLogger("arrowstream")

LAYOUT = "arrowstream-cache-v1"   # the folder inside the one given, by layout version
MAGIC = b"ASC1"
_HEADER = struct.Struct("<4sQI16s")   # magic, data length, CRC-32 of the data, key hash prefix
HOT_INSERT = 32   # one new entry in this many is inserted as just hit (bimodal insertion)
EVICT_TO = 0.9    # an eviction frees the folder down to this share of the limit (scans are amortized)
LARGEST = 0.25    # an entry larger than this share of the limit is not kept
STALE_WRITE_S = 3600.0   # a temporary file this old is a write that died (its process killed): deleted
COLD_BEFORE = 3.0e9   # an entry never hit has the modification time COLD_BEFORE - now: before any hit's (now >
#                       1.5e9 s, so until 2065), and the earlier the later it was written (the newest evicted first)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class CacheWarning(UserWarning):
    """The data cache could not be used in this process (a folder that cannot be written, a full disk) or held a
    damaged entry: reads go on from the store."""


def parse_size(value: Any, name: str = "cache_limit") -> int:
    """Bytes from an int or a string such as ``"200GB"``, ``"512 MiB"`` (decimal and binary units).

    Example:
        >>> parse_size("1.5GB"), parse_size("64 MiB"), parse_size(4096)
        (1500000000, 67108864, 4096)
    """
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name}: expected a size in bytes (an int) or a string such as '200GB', got "
                                   f"{value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (match := re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", value)):
        unit = match.group(2).lower()
        if unit not in _UNITS:
            raise InvalidArgumentError(f"{name}: unknown unit {match.group(2)!r} in {value!r}; use B, KB, MB, GB, TB "
                                       "or KiB, MiB, GiB, TiB")
        size = int(float(match.group(1)) * _UNITS[unit])
    else:
        raise InvalidArgumentError(f"{name}: expected a size in bytes (an int) or a string such as '200GB', got "
                                   f"{value!r}")
    if size <= 0:
        raise InvalidArgumentError(f"{name}: expected a size above 0, got {value!r}")
    return size


@dataclass
class CacheCounts:
    """What one process's cache did: ranges served from it and fetched from the store, their bytes, entries it
    evicted and damaged ones it dropped."""

    hits: int = 0
    misses: int = 0
    bytes_from_cache: int = 0
    bytes_from_store: int = 0
    evictions: int = 0
    dropped: int = 0


PROCESS_COUNTS = CacheCounts()
"""What every data cache of this process did (a worker's metrics read it: see ``_worker/metrics.py``)."""


@dataclass
class DataCache:
    """The data cache in ``folder`` with room for ``limit`` bytes (see the module). Picklable: a worker process
    gets the folder and the limit, and opens the cache on its first read."""

    folder: str
    limit: int
    counts: CacheCounts = field(default_factory=CacheCounts)
    _off: str = ""   # why it is off in this process ("": on)
    _warned: set[str] = field(default_factory=set)
    _random: random.Random = field(default_factory=random.Random)

    @classmethod
    def of(cls, cache: Any, cache_limit: Any) -> DataCache | None:
        """The cache the arguments ask for (``cache``: a folder, or None for none), checked."""
        if cache is None or cache is False:
            if cache_limit is not None:
                raise InvalidArgumentError("cache_limit: set without cache; pass cache='/local/folder' too")
            return None
        if not isinstance(cache, (str, os.PathLike)):
            raise InvalidArgumentError(f"cache: expected a local folder (a str or path), or None, got {cache!r}")
        folder = os.fspath(cache)
        if "://" in folder:
            raise InvalidArgumentError(f"cache: expected a folder on local disk, got {folder!r}")
        if cache_limit is None:
            raise InvalidArgumentError("cache_limit: needed with cache (say how much local disk the cache may "
                                       "take, such as cache_limit='200GB')")
        return cls(os.path.abspath(folder), parse_size(cache_limit))

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "limit": self.limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["folder"], state["limit"])   # type: ignore[misc]

    # -- the folder --------------------------------------------------------------------------------

    @property
    def root(self) -> str:
        return os.path.join(self.folder, LAYOUT)

    def _path(self, digest: str) -> str:
        return os.path.join(self.root, "data", digest[:2], digest)

    @contextlib.contextmanager
    def _account(self) -> Iterator[list[int]]:
        """The folder's account of bytes held and reserved, locked for this process (a list of one int to change)."""
        path = os.path.join(self.root, "account")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, 32, 0)
            used = [int(raw) if raw.strip().isdigit() else self._scan_total()]
            yield used
            data = str(max(used[0], 0)).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        finally:
            os.close(fd)   # (closing releases the lock)

    def entries(self, stale_writes: bool = False) -> list[tuple[float, int, str]]:
        """Every entry: (last hit, size, path); ``stale_writes``: temporary files of writes that died deleted."""
        found = []
        data = os.path.join(self.root, "data")
        now = time.time()
        with contextlib.suppress(FileNotFoundError):
            for bucket in os.scandir(data):
                if not bucket.is_dir():
                    continue
                for entry in os.scandir(bucket.path):
                    with contextlib.suppress(FileNotFoundError):
                        status = entry.stat()
                        if not entry.name.startswith("."):
                            found.append((status.st_mtime, status.st_size, entry.path))
                        elif stale_writes and now - status.st_mtime > STALE_WRITE_S:   # a write that died
                            os.unlink(entry.path)
        return found

    def _scan_total(self) -> int:
        return sum(size for _, size, _ in self.entries())

    def _turn_off(self, reason: str, exc: BaseException) -> None:
        self._off = reason
        warnings.warn(f"arrowstream: the data cache in {self.folder} is off in this process ({reason}: {exc}); "
                      "reads go to the store", CacheWarning, stacklevel=4)

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(f"arrowstream: {message}", CacheWarning, stacklevel=4)

    # -- entries -----------------------------------------------------------------------------------

    @staticmethod
    def key(protocol: str, path: str, version: str, start: int, end: int) -> str:
        """The hash that names the entry of ``[start, end)`` of ``path`` at ``version`` on store ``protocol``."""
        raw = "\0".join((protocol, path, version, str(start), str(end))).encode()
        return hashlib.sha256(raw).hexdigest()

    def get(self, digest: str, length: int) -> bytes | None:
        """The entry ``digest`` of ``length`` bytes, checked, or None (none there, or a damaged one, dropped)."""
        if self._off:
            return None
        path = self._path(digest)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._turn_off("cannot read it", exc)
            return None
        if len(raw) >= _HEADER.size:
            magic, size, crc, prefix = _HEADER.unpack_from(raw)
            data = raw[_HEADER.size:]
            if (magic, size, prefix) == (MAGIC, length, bytes.fromhex(digest[:32])) and len(data) == size \
                    and zlib.crc32(data) == crc:
                with contextlib.suppress(OSError):
                    os.utime(path)   # hit: the most recently hit
                return data
        self._drop(path, len(raw))
        return None

    def _add(self, **deltas: int) -> None:
        """Count in this cache's counts and the process's."""
        for counts in (self.counts, PROCESS_COUNTS):
            for name, delta in deltas.items():
                setattr(counts, name, getattr(counts, name) + delta)

    def _drop(self, path: str, size: int) -> None:
        """A damaged, truncated or foreign entry: deleted (and its bytes out of the account), fetched again."""
        self._add(dropped=1)
        self._warn_once("damaged", f"the data cache in {self.folder} held a damaged entry ({os.path.basename(path)}: "
                                   "truncated, altered or not written by arrowstream); it was deleted and the range "
                                   "fetched from the store")
        try:
            with self._account() as used:
                os.unlink(path)
                used[0] -= size
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._turn_off("cannot delete a damaged entry", exc)

    def put(self, digest: str, data: bytes) -> None:
        """Keep ``data`` as entry ``digest``: room reserved first (evicting where needed), then written atomically."""
        if self._off:
            return
        size = _HEADER.size + len(data)
        if size > self.limit * LARGEST:
            return
        path = self._path(digest)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with self._account() as used:
                if used[0] + size > self.limit:
                    used[0] = self._evict(size)
                used[0] += size
            try:
                temporary = os.path.join(os.path.dirname(path), f".{digest[:16]}.{os.getpid()}.tmp")
                with open(temporary, "wb") as f:
                    f.write(_HEADER.pack(MAGIC, len(data), zlib.crc32(data), bytes.fromhex(digest[:32])))
                    f.write(data)
                if self._random.randrange(HOT_INSERT):   # never hit: evicted first, the newest first
                    now = time.time()
                    os.utime(temporary, (now, COLD_BEFORE - now))
                os.replace(temporary, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                with self._account() as used:
                    used[0] -= size
                raise
        except OSError as exc:
            self._turn_off("cannot write it", exc)

    def _evict(self, wanted: int) -> int:
        """Entries deleted, least recently hit first, until ``wanted`` more bytes fit under :data:`EVICT_TO` of the
        limit; the bytes held then (the account set from the scan). Called under the account's lock."""
        entries = sorted(self.entries(stale_writes=True))
        total = sum(size for _, size, _ in entries)
        target = self.limit * EVICT_TO - wanted
        for _, size, path in entries:
            if total <= target:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                self._add(evictions=1)
            total -= size
        return max(total, 0)

    def read(self, protocol: str, path: str, version: str, ranges: Sequence[tuple[int, int]],
             fetch: Callable[[Sequence[tuple[int, int]]], list[bytes]]) -> list[bytes]:
        """The bytes of each range of ``path`` at ``version``: from the cache where it holds them, the others by
        ``fetch`` (one call for all of them), kept for the next read."""
        if not version:   # a file listed without a version: its bytes cannot be told apart from another's
            out = fetch(ranges)
            self._add(misses=len(ranges), bytes_from_store=sum(len(part) for part in out))
            return out
        digests = [self.key(protocol, path, version, start, end) for start, end in ranges]
        parts: list[bytes | None] = [self.get(digest, end - start) for digest, (start, end) in zip(digests, ranges)]
        missing = [i for i, part in enumerate(parts) if part is None]
        self._add(hits=len(ranges) - len(missing), bytes_from_cache=sum(len(part) for part in parts if part is not None))
        if missing:
            fetched = fetch([ranges[i] for i in missing])
            self._add(misses=len(missing), bytes_from_store=sum(len(data) for data in fetched))
            for i, data in zip(missing, fetched, strict=True):
                parts[i] = data
                self.put(digests[i], data)
        return [part for part in parts if part is not None]


def read_through(cache: DataCache | None, fs: Any, pin: Pin, ranges: Sequence[tuple[int, int]],
                 store: Callable[[Sequence[tuple[int, int]]], list[bytes]] | None = None) -> list[bytes]:
    """The bytes of each range of the pinned file: through ``cache`` where there is one, else from the store
    (``store``; default: pinned ranged requests of ``fs``)."""
    fetch = store if store is not None else lambda missing: read_ranges(fs, pin, missing)
    if cache is None:
        return fetch(ranges)
    return cache.read(pin.protocol, pin.path, pin.version, ranges, fetch)


class HandleStore:
    """How the ranges of a file another library opened are fetched (``handle``: a pyarrow ``NativeFile``, such as
    pyiceberg's FileIO gives; ``url`` names it in errors); closing it closes the handle."""

    def __init__(self, handle: Any, url: str) -> None:
        self._handle, self._url = handle, url

    def __call__(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        out = []
        for start, end in ranges:
            read = self._handle.read_at(end - start, start)
            data = read if isinstance(read, bytes) else read.to_pybytes()
            if len(data) != end - start:
                raise ConnectionResetError(f"short read of {self._url} [{start}, {end}): got {len(data)} bytes")
            out.append(data)
        return out

    def close(self) -> None:
        self._handle.close()


def cache_summary(folder: str) -> dict[str, Any]:
    """What a cache folder holds: its entries, their bytes, and the hot ones, hit since they were written or written
    as hit (one new entry in 32), which eviction takes last (for ``arrowstream cache show``); a folder that holds no
    cache is a ``FileNotFoundError`` naming it."""
    cache = DataCache(os.path.abspath(folder), 1)
    if not os.path.isdir(cache.root):
        raise DatasetNotFoundError(f"{folder}: holds no arrowstream data cache (no {LAYOUT} folder in it); pass the "
                                   "folder given as cache=")
    entries = cache.entries()
    return {"folder": cache.folder, "entries": len(entries), "bytes": sum(size for _, size, _ in entries),
            "hot": sum(1 for last, _, _ in entries if last > COLD_BEFORE - last)}


def clear_cache(folder: str) -> dict[str, Any]:
    """Delete every entry of a cache folder, under its account's lock (a process writing goes on; what it reads
    next comes from the store); what it held."""
    summary = cache_summary(folder)
    cache = DataCache(summary["folder"], 1)
    with cache._account() as used:
        for _, _, path in cache.entries():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        used[0] = 0
    return summary


def run_cache_command(command: str, folder: str, as_json: bool) -> int:
    """``arrowstream cache show|clear DIR``."""
    import json

    summary = cache_summary(folder) if command == "show" else clear_cache(folder)
    if as_json:
        print(json.dumps(summary, indent=1))
    elif command == "show":
        print(f"{summary['folder']}: {summary['entries']:,} entries, {summary['bytes']:,} bytes, {summary['hot']:,} "
              "of them hot (hit since written, or written as hit: evicted last)")
    else:
        print(f"{summary['folder']}: deleted {summary['entries']:,} entries, {summary['bytes']:,} bytes")
    return 0
