"""Per-worker metrics: what each worker read and converted, and how long it waited for the trainer.

Each process that produces batches (a loader worker, or the trainer itself with
``num_workers=0``) counts in one :class:`Meter`. A worker's meter copies its values after each
item it hands over into its row of a :class:`Board`: a small float64 tensor in shared memory
that the loader creates before its workers start, so the trainer reads every worker's numbers
whenever it likes, without a message through the loader's queue. A mixture's rows of each source
are counted in the same row, with the same write. The counters add up over the loader's life (all
epochs); take differences for a rate over a window.

A row is written while the trainer may read it: its last cell counts the writes, odd while one is
under way (a sequence lock), and the trainer reads a row again until it reads one write whole, so the
numbers it sees belong together (the rows of each source add up to the rows).

Times are ``time.perf_counter()`` seconds: on Linux the monotonic clock, one for every process
of a machine.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._storage.cache import PROCESS_COUNTS
from .shm import share

# a board row, in this order
FIELDS = ("rows", "batches", "bytes", "splits_done", "read_s", "convert_s", "idle_s", "first_s", "last_s",
          "rows_skipped", "leases", "cache_hits", "cache_misses", "cache_bytes", "store_bytes", "cache_evictions")
COUNTS = ("rows", "batches", "bytes", "splits_done", "rows_skipped", "leases", "cache_hits", "cache_misses",
          "cache_bytes", "store_bytes", "cache_evictions")
_CACHE_AT = slice(FIELDS.index("cache_hits"), FIELDS.index("cache_evictions") + 1)   # the data cache's counts
_CACHE_COUNTS = ("hits", "misses", "bytes_from_cache", "bytes_from_store", "evictions")   # as CacheCounts names them
TIMES = ("read_s", "convert_s", "idle_s")


class Meter:
    """The counters of one worker, written by that worker only."""

    __slots__ = ("_cache_from", "_row", "batches", "bytes", "convert_s", "first_s", "idle_s", "last_s", "leases",
                 "per_source", "read_s", "rows", "rows_skipped", "splits_done")

    def __init__(self, row: np.ndarray | None = None, sources: int = 0) -> None:
        """``row``: this worker's row of a board; a worker restarted for a new epoch goes on from it.
        ``sources``: a mixture's number of sources, whose rows it counts too."""
        self._row = row
        width = len(FIELDS) + sources
        values: list[float] = [0.0] * width if row is None else row[:width].tolist()
        self.rows, self.batches, self.bytes, self.splits_done = (int(v) for v in values[:4])
        self.read_s, self.convert_s, self.idle_s, self.first_s, self.last_s = (float(v) for v in values[4:9])
        self.rows_skipped, self.leases = int(values[9]), int(values[10])
        self.per_source = [int(v) for v in values[len(FIELDS):]]
        # the data cache's counts: this process's from now on, over the row's (a restarted worker goes on from them)
        self._cache_from = [int(v) - n for v, n in zip(values[_CACHE_AT], _process_cache(), strict=True)]

    def batch(self, rows: int, batches: int, read_s: float, convert_s: float, idle_s: float, now: float,
              per_source: Sequence[int] | None = None) -> None:
        """Count ``batches`` handed over, holding ``rows`` rows (``per_source`` of each source, where this meter
        counts a mixture's sources)."""
        self.rows += rows
        self.batches += batches
        self.read_s += read_s
        self.convert_s += convert_s
        self.idle_s += idle_s
        if not self.first_s:
            self.first_s = now - read_s - convert_s
        self.last_s = now
        if per_source is not None and self.per_source:   # a mixture's meter (a dataset's counts no sources)
            self.per_source = [int(a + b) for a, b in zip(self.per_source, per_source, strict=True)]
        row = self._row
        if row is not None:
            row[-1] += 1   # odd: a write under way
            row[:-1] = (*self.values(), *self.per_source)
            row[-1] += 1

    def packed(self, seconds: float, now: float) -> None:
        """Count ``seconds`` of converting after the hand-over: a chunk's batches through a ``collate_fn``
        and packed into shared memory, in the worker, before the loader's queue takes it."""
        self.batch(0, 0, 0.0, seconds, 0.0, now)

    def split_done(self, num_bytes: int) -> None:
        """A split read to its end: ``num_bytes`` is its size in storage (from the file metadata)."""
        self.splits_done += 1
        self.bytes += num_bytes

    def leased(self) -> None:
        """A lease taken (``assignment="dynamic"``)."""
        self.leases += 1

    def skipped(self, rows: int) -> None:
        """``rows`` rows of text that did not parse, left out (``bad_rows="skip"``)."""
        self.rows_skipped += rows

    def values(self) -> tuple[float, ...]:
        cache = [base + n for base, n in zip(self._cache_from, _process_cache(), strict=True)]
        return (self.rows, self.batches, self.bytes, self.splits_done, self.read_s, self.convert_s, self.idle_s,
                self.first_s, self.last_s, self.rows_skipped, self.leases, *cache)


def _process_cache() -> list[int]:
    """What this process's data caches did so far (``_storage/cache.py``), in the order of :data:`FIELDS`."""
    return [getattr(PROCESS_COUNTS, name) for name in _CACHE_COUNTS]


class Board:
    """One row of counters per worker of a loader, in memory shared with the workers: :data:`FIELDS`, a
    mixture's rows of each of its ``sources``, and the count of writes (see the module)."""

    def __init__(self, num_workers: int, sources: int = 0) -> None:
        self.sources = sources
        self.tensor = share(torch.zeros((num_workers, len(FIELDS) + sources + 1), dtype=torch.float64),
                            f"ArrowStreamDataLoader: the metrics board of its {num_workers} worker(s)")

    def row(self, worker_id: int) -> np.ndarray:
        row: np.ndarray = self.tensor[worker_id].numpy()
        return row

    def read(self) -> list[dict[str, Any]]:
        """Each worker's counters (``"per_source"``: a list), each row as one write left it."""
        return [_values(_whole(row)) for row in self.tensor.numpy()]


def _whole(row: np.ndarray) -> list[float]:
    """``row`` as one write left it: read again while a write is under way or one came between. A worker taken off
    the CPU inside a write holds the row odd until it runs again, so after a few tries the reader sleeps between
    them; a worker killed inside a write leaves it odd for good: after a second, take it as it is."""
    deadline = None
    for tries in itertools.count():
        writes = float(row[-1])
        values: list[float] = row.tolist()
        if writes == values[-1] and writes % 2 == 0:
            break
        if tries >= 100:
            now = time.monotonic()
            deadline = deadline or now + 1.0
            if now > deadline:
                break
            time.sleep(0.0001)
    return values[:-1]


def _values(values: Sequence[float]) -> dict[str, Any]:
    return {**dict(zip(FIELDS, values)), "per_source": [int(v) for v in values[len(FIELDS):]]}


def worker_values(board: Board | None, meter: Meter | None) -> list[dict[str, Any]]:
    """Each worker's counters: the loader's board, or with ``num_workers=0`` this process's meter."""
    if board is not None:
        return board.read()
    meter = meter or Meter()
    return [_values((*meter.values(), *meter.per_source))]


def _described(raw: dict[str, float]) -> dict[str, Any]:
    """A meter's values with the derived ones: utilization, elapsed time, rows per second."""
    out: dict[str, Any] = {name: int(raw[name]) for name in COUNTS}
    out.update({name: float(raw[name]) for name in TIMES})
    busy = out["read_s"] + out["convert_s"]
    out["utilization"] = busy / (busy + out["idle_s"]) if busy + out["idle_s"] > 0 else 0.0
    elapsed = raw["last_s"] - raw["first_s"] if raw["first_s"] else 0.0
    out["elapsed_s"] = elapsed
    out["rows_per_s"] = out["rows"] / elapsed if elapsed > 0 else 0.0
    return out


def summarize(workers: Sequence[dict[str, Any]], rank: int) -> dict[str, Any]:
    """Totals over the workers of one rank, and each worker's line (see :meth:`metrics`)."""
    lines = []
    for index, raw in enumerate(workers):
        line = {"rank": rank, "worker": index, **_described(raw)}
        lines.append(line)
    started = [w["first_s"] for w in workers if w["first_s"]]
    total = {name: sum(float(w[name]) for w in workers) for name in FIELDS}
    total["first_s"] = min(started) if started else 0.0
    total["last_s"] = max((w["last_s"] for w in workers), default=0.0)
    # the tail: from the first worker's last batch to the last one's (after an epoch: how long the
    # workers that finished first waited for the others)
    ended = [w["last_s"] for w in workers if w["last_s"]]
    tail = max(ended) - min(ended) if ended else 0.0
    return {**_described(total), "tail_s": tail, "workers": lines}


def merge(per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The metrics of several ranks as one: counts and times added (a mixture's rows per source too),
    workers listed together.

    Elapsed time is the longest of the ranks' (their clocks are not compared), so ``rows_per_s``
    is the job's rate while the slowest rank ran.
    """
    out: dict[str, Any] = {name: sum(m.get(name, 0) for m in per_rank) for name in COUNTS + TIMES}
    # a mixture's rows of each source ("rows/NAME"), in the order the ranks name them
    sources = dict.fromkeys(key for m in per_rank for key in m if key.startswith("rows/"))
    out.update({key: sum(m.get(key, 0) for m in per_rank) for key in sources})
    busy = out["read_s"] + out["convert_s"]
    out["utilization"] = busy / (busy + out["idle_s"]) if busy + out["idle_s"] > 0 else 0.0
    out["elapsed_s"] = max((m["elapsed_s"] for m in per_rank), default=0.0)
    out["rows_per_s"] = out["rows"] / out["elapsed_s"] if out["elapsed_s"] > 0 else 0.0
    out["workers"] = [line for m in per_rank for line in m["workers"]]
    return out


def flatten(metrics: dict[str, Any]) -> dict[str, float]:
    """``{"rows": ..., "rank0/worker1/rows": ...}``: one level, numbers only, as loggers take them
    (gathered metrics add each rank's totals, ``"rank1/rows"``)."""
    flat = {key: value for key, value in metrics.items() if key not in ("workers", "ranks")}
    for rank, totals in enumerate(metrics.get("ranks", ())):
        flat.update({f"rank{rank}/{key}": value for key, value in totals.items()})
    for line in metrics["workers"]:
        prefix = f"rank{line['rank']}/worker{line['worker']}/"
        flat.update({prefix + key: value for key, value in line.items() if key not in ("rank", "worker")})
    return flat


def gather_metrics(metrics: dict[str, Any], group: Any = None) -> dict[str, Any]:
    """The metrics of every rank as one dict, on every rank (a collective: all ranks call it).

    ``metrics`` is this rank's ``loader.metrics()``. Counts and times are added over the ranks (a
    mixture's rows of each source, ``"rows/NAME"``, too), ``workers`` lists every rank's workers,
    ``ranks`` holds each rank's totals, and ``elapsed_s``/``rows_per_s`` follow the slowest rank. Without an
    initialised ``torch.distributed`` it is this rank's metrics with ``ranks`` added.

    Example:
        >>> import arrowstream
        >>> mine = {"rows": 8, "batches": 2, "bytes": 64, "splits_done": 1, "read_s": 0.5, "convert_s": 0.25,
        ...         "idle_s": 0.25, "utilization": 0.75, "elapsed_s": 1.0, "rows_per_s": 8.0, "workers": []}
        >>> arrowstream.gather_metrics(mine)["ranks"][0]["rows"]
        8
    """
    import torch.distributed as dist

    if "workers" not in metrics:
        from ..errors import ArgumentTypeError
        raise ArgumentTypeError("metrics: expected what loader.metrics() returns (flat=False), got a dict "
                                "without 'workers'")
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        per_rank: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(per_rank, metrics, group=group)
    else:
        per_rank = [metrics]
    merged = merge(per_rank)
    merged["ranks"] = [{key: value for key, value in m.items() if key != "workers"} for m in per_rank]
    return merged
