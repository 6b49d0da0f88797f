"""Read-ahead for object stores: the byte ranges of the next splits, fetched while this one is read.

Planning knows, from metadata, which byte ranges each split needs (Parquet: the column chunks of
the selected columns in its row groups; ORC: its stripes; IPC: its record batches). A worker
hands the ranges of the splits after the current one to a :class:`Prefetcher`, which fetches
them in the background, coalesced (neighbours closer than ``MAX_GAP`` merge into one request)
and concurrently. Every read is pinned to the planned version of the file (see ``arrowstream._storage.pinned``).
Files of remote storage are opened as :class:`PartsFile`,
which serves a read from fetched bytes when they cover it, waits for a fetch in flight that will,
and otherwise asks the store for exactly the bytes read (one ranged request, no read-ahead
block). Memory is bounded: at most ``depth`` splits are fetched ahead, and a split's bytes are
dropped once the split has been read. Threads too: the fetching threads end when no split is held
(a slot's reading of the epoch is over, or was dropped), and start again with the next fetch.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..errors import FileChangedError
from .cache import DataCache, read_through
from .pinned import Pin

logger = logging.getLogger("arrowstream")

MAX_GAP = 64 << 10          # ranges closer than this are fetched as one
MAX_REQUEST = 64 << 20      # no merged request larger than this
SMALL_READ = 64 << 10       # a smaller read fetches this much (metadata is read in small pieces)


def coalesce(ranges: Sequence[tuple[int, int]], max_gap: int = MAX_GAP,
             max_request: int = MAX_REQUEST) -> list[tuple[int, int]]:
    """Sorted, merged ``[start, end)`` ranges: neighbours less than ``max_gap`` apart become one."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if out and start - out[-1][1] <= max_gap and end - out[-1][0] <= max_request:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


class _Fetch:
    """The ranges of one split of one file, fetched in the background."""

    def __init__(self, pin: Pin, ranges: list[tuple[int, int]], future: Future[list[bytes]]) -> None:
        self.path, self.ranges, self.future = pin.path, ranges, future

    def covering(self, path: str, start: int, end: int) -> int | None:
        if path != self.path:
            return None
        for index, (lo, hi) in enumerate(self.ranges):
            if lo <= start and end <= hi:
                return index
        return None


class Prefetcher:
    """Background fetches of split byte ranges for one process; see the module docstring."""

    def __init__(self, fs: Any, depth: int, cache: DataCache | None = None) -> None:
        self._fs, self._cache = fs, cache
        self.depth = depth
        # one thread per split that may be in flight: the splits ahead are fetched at the same time; made with
        # the first fetch, ended once no split is held (see _idle)
        self._pool: ThreadPoolExecutor | None = None
        self._running: set[Future[list[bytes]]] = set()   # fetches not done, of this pool or an ended one
        self._fetches: dict[Any, _Fetch] = {}
        self._lock = threading.Lock()
        self.requests = 0          # ranged requests made by fetches (for tests and metrics)
        self.direct_requests = 0   # reads no fetch covered

    def replace_filesystem(self, fs: Any) -> None:
        """Fetch with ``fs`` from now on (credentials were refreshed); fetches in flight are dropped."""
        with self._lock:
            fetches, self._fetches = list(self._fetches.values()), {}
            self._fs = fs
            pool = self._idle()
        for fetch in fetches:
            fetch.future.cancel()
        _end(pool)

    def schedule(self, key: Any, pin: Pin, ranges: Sequence[tuple[int, int]]) -> None:
        """Fetch ``ranges`` of the file in the background, unless ``key`` is fetched or the depth is full."""
        with self._lock:
            if key in self._fetches or len(self._fetches) >= self.depth or not ranges:
                return
            merged = coalesce(ranges)
            self.requests += len(merged)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=max(self.depth, 1),
                                                thread_name_prefix="arrowstream-read-ahead")
            future = self._pool.submit(read_through, self._cache, self._fs, pin, merged)
            self._running.add(future)
            future.add_done_callback(self._running.discard)
            self._fetches[key] = _Fetch(pin, merged, future)

    def read(self, path: str, start: int, end: int) -> bytes | None:
        """The bytes ``[start, end)`` of ``path`` if a fetch covers them (waiting for it), else None."""
        with self._lock:
            found = [(fetch, index) for fetch in self._fetches.values()
                     if (index := fetch.covering(path, start, end)) is not None]
        for fetch, index in found:
            try:
                parts = fetch.future.result()
            except FileChangedError:   # not the planned version: reading it again will not help
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: the reader reads it itself, with its retries
                logger.debug("read-ahead of %s failed (%s); reading directly", path, type(exc).__name__)
                continue
            lo = fetch.ranges[index][0]
            return parts[index][start - lo:end - lo]
        return None

    def release(self, key: Any) -> None:
        """Drop the bytes of a split that has been read (or will not be)."""
        with self._lock:
            fetch = self._fetches.pop(key, None)
            pool = self._idle()
        if fetch is not None:
            fetch.future.cancel()
        _end(pool)

    def scheduled(self, key: Any) -> bool:
        with self._lock:
            return key in self._fetches

    def close(self, wait: bool = False) -> None:
        """Drop every fetch and end the threads; ``wait``: until the fetches already under way are over too.
        A later fetch starts new threads."""
        with self._lock:
            fetches, self._fetches = list(self._fetches.values()), {}
            pool = self._idle()
        for fetch in fetches:
            fetch.future.cancel()
        _end(pool)
        if wait:
            futures.wait(list(self._running))

    def _idle(self) -> ThreadPoolExecutor | None:
        """With the lock held: the pool to end when no split is held any more (taken from this prefetcher)."""
        if self._fetches or self._pool is None:
            return None
        pool, self._pool = self._pool, None
        return pool


def _end(pool: ThreadPoolExecutor | None) -> None:
    """End an idle pool's threads: at once when idle, after the fetch they are in otherwise (cancelled:
    its bytes are dropped)."""
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


class PartsFile(io.RawIOBase):
    """A remote file read through a :class:`Prefetcher`; every other read is one ranged request, through ``cache``
    where there is one. ``store``: how a range is fetched (default: a pinned ranged request of ``fs``; a file another
    library opened gives its own, see :class:`~arrowstream._storage.cache.HandleStore`, closed with this file)."""

    def __init__(self, fs: Any, pin: Pin, prefetcher: Prefetcher | None, cache: DataCache | None = None,
                 store: Callable[[Sequence[tuple[int, int]]], list[bytes]] | None = None) -> None:
        super().__init__()
        self._fs, self._pin, self._prefetcher, self._cache, self._store = fs, pin, prefetcher, cache, store
        self._path, self._size = pin.path, pin.size
        self._position = 0
        self._block: tuple[int, bytes] | None = None   # the last small-read block

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def close(self) -> None:
        closing = getattr(self._store, "close", None)
        if closing is not None and not self.closed:
            closing()
        super().close()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        start, end = self._position, min(self._position + len(view), self._size)
        if end <= start:
            return 0
        data = self._prefetcher.read(self._path, start, end) if self._prefetcher is not None else None
        if data is None:
            data = self._read_direct(start, end)
        view[:len(data)] = data
        self._position = start + len(data)
        return len(data)

    def _read_direct(self, start: int, end: int) -> bytes:
        """One ranged request; a small read takes a block around it (the tail, for the last bytes)."""
        block = self._block
        if block is not None and block[0] <= start and end <= block[0] + len(block[1]):
            return block[1][start - block[0]:end - block[0]]
        lo, hi = start, end
        if end - start < SMALL_READ:
            lo = start if start < self._size - SMALL_READ else max(0, self._size - SMALL_READ)
            hi = min(self._size, lo + SMALL_READ)
        if self._prefetcher is not None:
            self._prefetcher.direct_requests += 1
        data = read_through(self._cache, self._fs, self._pin, [(lo, hi)], self._store)[0]
        if hi - lo <= SMALL_READ:
            self._block = (lo, data)
        return data[start - lo:end - lo]
