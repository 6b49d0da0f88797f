"""Dynamic assignment (``assignment="dynamic"``): a rank's epoch as one stream of work that its workers
lease, in order, as they finish what they hold. What a worker does with its leases (reads them, leaves a
rest of them at a checkpoint) is :mod:`arrowstream._layout.ledger`.

**Work.** A rank's rows of an epoch are fixed by the static assignment across ranks (longest processing
time over ranks, in the epoch's order), cut to what it yields (``even_batches``, ``drop_last``). They
are laid end to end as one *virtual stream*: first replays (the rest of old workers' shuffle windows,
after a resume), then explicit splits, then the rank's fresh splits from a row on. :class:`Work` is
that stream; a fresh epoch is only the fresh splits
(:func:`~arrowstream._layout.ledger.fresh_work`).

**Leases.** The virtual stream is cut into leases at item ends, and the last rows also inside long
items, into smaller leases, so that workers finish together (:func:`lease_bounds`). Workers take leases
in order from a shared counter (:class:`LocalPool` in one process); a worker's stream is its leases'
replays (handed out as they are), then its leases' splits through the usual pipeline (interleave, shuffle
windows of its own), so its cursor reads as a static worker's does, and it yields full batches across its
leases. What it has left at the end, fewer than a batch, is its *last rows*: once the pool is dry every
worker knows every worker's total, and cuts its last rows into pieces that make whole batches laid end to
end in worker order (:func:`last_pieces`); the trainer stitches them (``arrowstream._worker.stitch``). The
rank yields ``ceil(rows / batch_size)`` batches whatever the timing, all full but one, and ``len(loader)``
stays exact.

Pure: no I/O, no torch (``tests/test_layers.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .._core.order import Slot
from .._core.plan_types import Split, split_rows
from .replan import Replay, replay_part, split_part, split_rest

TAIL_FRACTION = 8        # the last 1/8 of a rank's rows (at least) is leased in small pieces
TAIL_LEASES_PER_WORKER = 8    # a tail lease is about rows / (workers x this): fewer cuts inside row groups
MAX_TAIL_LEASES_PER_WORKER = 64   # where converting costs the most against decoding (see tail_pieces)


def tail_pieces(read_s: float, convert_s: float) -> int:
    """Tail leases per worker for an epoch, from what the loader's workers measured so far: the default
    (8), or up to 8 times more where converting (a ``transform``) costs more than reading. A tail lease
    that starts inside a row group decodes the group again from its start; that costs little where
    converting is most of the work, and finer leases let the workers finish closer together. Doubled for
    each doubling of ``convert_s / read_s`` from 2 on."""
    pieces = TAIL_LEASES_PER_WORKER
    if read_s <= 0:   # nothing measured yet
        return pieces
    while pieces < MAX_TAIL_LEASES_PER_WORKER and convert_s >= read_s * 2 * pieces / TAIL_LEASES_PER_WORKER:
        pieces *= 2
    return pieces


@dataclass(frozen=True)
class Work:
    """A rank's rows of one dynamic epoch, in lease order: ``replays``, then ``splits``, then
    ``fresh[fresh_from_row:]`` (the rank's fresh splits from that row; ``fresh`` is recomputed from the
    plan, never saved)."""

    replays: tuple[Replay[Slot], ...]
    splits: tuple[Split, ...]
    fresh: Sequence[Split] = ()
    fresh_from_row: int = 0

    @functools.cached_property
    def items(self) -> tuple[npt.NDArray[np.int64], int]:
        """Rows of each item in lease order (replays, splits, fresh splits), and the index of the first
        fresh split in ``fresh`` (whose rows are counted from ``fresh_from_row``); computed once (``len(loader)``
        asks for the rows of a plan of a million splits)."""
        fresh_rows = split_rows(self.fresh)
        ends = np.cumsum(fresh_rows)
        first = int(np.searchsorted(ends, self.fresh_from_row, side="right"))
        tail = fresh_rows[first:].copy()
        if len(tail):
            tail[0] = ends[first] - self.fresh_from_row
        head = np.array([r.rows for r in self.replays] + [s.num_rows for s in self.splits], dtype=np.int64)
        return np.concatenate([head, tail]), first

    @property
    def num_rows(self) -> int:
        return int(self.items[0].sum())


# -- leases ---------------------------------------------------------------------------------------


def _cut(starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], from_row: int, piece: int) -> list[npt.NDArray[np.int64]]:
    """Cuts of the items that end after ``from_row`` and are longer than ``piece``, from ``from_row`` on,
    into equal pieces of at most ``piece`` rows."""
    cuts = []
    for index in np.flatnonzero((ends > from_row) & (ends - starts > piece)):
        lo, hi = max(int(starts[index]), from_row), int(ends[index])
        count = -(-(hi - lo) // piece)
        cuts.append(lo + (np.arange(count, dtype=np.int64) * (hi - lo)) // count)
    return cuts


def last_part_start(total: int) -> int:
    """Where the last part of a stream of ``total`` rows starts: its last eighth, whose leases are laid out
    when the workers reach it (see :func:`lease_bounds`)."""
    return total - total // TAIL_FRACTION


def lease_bounds(item_rows: npt.NDArray[np.int64], batch_size: int, num_workers: int,
                 pieces_per_worker: int = TAIL_LEASES_PER_WORKER) -> npt.NDArray[np.int64]:
    """Where leases start and end in the virtual stream of items of ``item_rows`` rows: at item ends,
    and in the last part of the stream (the tail) also inside items longer than a tail piece, cut into
    equal pieces of about ``rows / (workers x TAIL_LEASES_PER_WORKER)`` rows (at least a batch); the
    last eighth (from the first of those lease starts at or after :func:`last_part_start`) cut again in
    pieces of about ``rows / (workers x pieces_per_worker)`` where that is finer.
    ``bounds[i]:bounds[i + 1]`` is lease ``i``. The leases before the last eighth are the same whatever
    ``pieces_per_worker``: the workers decide it when they reach the last eighth, by what they measured
    (:func:`tail_pieces`).

    A lease ends where its last item ends wherever that falls in a batch: a cut at row ``x`` of a unit
    costs about ``x`` rows decoded twice, at least a page per column (the lease after the cut decodes
    the unit from its start; a cut a few rows in, where leases ended when they held whole batches,
    cost ~70% of a 400,000-row unit with 1 MB pages), so only the tail, which balances the workers'
    ends, cuts items. The workers' last rows, fewer than a batch each, are stitched into whole batches
    (:func:`last_pieces`). Shrinking tail leases (guided self-scheduling) were measured too: shorter
    tails with a costly ``transform``, more decoding with costly files (benchmarks/results)."""
    total = int(item_rows.sum())
    if total == 0:
        return np.zeros(1, dtype=np.int64)
    ends = np.cumsum(item_rows)
    starts = ends - item_rows
    workers = max(num_workers, 1)
    piece = max(batch_size, total // (workers * TAIL_LEASES_PER_WORKER))
    tail_start = max(0, total - max(total // TAIL_FRACTION, piece * workers * 4))
    bounds = np.unique(np.concatenate([np.zeros(1, dtype=np.int64), ends,
                                       *_cut(starts, ends, tail_start, piece)]).astype(np.int64))
    fine = max(batch_size, total // (workers * pieces_per_worker))
    if fine >= piece:
        return bounds
    # the last eighth starts at the first lease start of the default layout from 7/8 of the rows on (no cut
    # of its own), and is cut again in finer pieces
    last = int(bounds[fixed_leases(bounds)])
    cuts = [bounds[bounds <= last], ends[ends > last], *_cut(starts, ends, last, fine)]
    return np.unique(np.concatenate(cuts).astype(np.int64))


def fixed_leases(bounds: npt.NDArray[np.int64]) -> int:
    """How many leases come before the last eighth: those that start before 7/8 of the rows, the same with
    any tail pieces (see :func:`lease_bounds`)."""
    return int(np.searchsorted(bounds, last_part_start(int(bounds[-1])), side="left"))


@dataclass(frozen=True)
class StitchTag:
    """A piece of a worker's last rows that makes one batch with other workers' last rows: the
    ``group``-th batch of the rank's stitched ones, made of ``parts`` pieces (see :func:`last_pieces`);
    ``first``: this piece starts it."""

    group: int
    parts: int
    first: bool


def last_pieces(lease_rows: npt.NDArray[np.int64], owners: npt.NDArray[np.int64], worker: int, num_workers: int,
                batch_size: int) -> list[tuple[int, StitchTag | None]]:
    """How worker ``worker`` hands out its last rows, fewer than a batch, once every lease is taken.

    A worker yields full batches over its leases end to end; what is left of its leased rows
    (``total % batch_size``) is its last rows. Laid end to end in worker order, the workers' last rows
    are cut into batches: each worker's last rows become one or two pieces (cut where a batch of the
    stitched stream ends), each piece tagged with its batch, or None where the piece is the worker's
    only one and a batch alone (a partial batch, as with one worker): the worker hands it out itself.
    The trainer hands the tagged batches out in order, so a worker's second piece never goes out
    before its first. So a rank yields ``ceil(rows / batch_size)``
    batches whatever the timing, every one full but the last, and no lease has to end on a batch.
    ``owners`` (who took each lease) and the leases' rows are the pool's once it is dry, the same for
    every worker: the workers agree on the pieces without a message.
    """
    if (owners < 0).any():
        raise ValueError("last_pieces: the pool is not dry")
    totals = np.bincount(owners, weights=lease_rows, minlength=max(num_workers, 1)).astype(np.int64)
    left = totals % batch_size
    starts = np.concatenate([[0], np.cumsum(left)]).astype(np.int64)
    end = int(starts[-1])
    lo, hi = int(starts[worker]), int(starts[worker + 1])
    pieces: list[tuple[int, StitchTag | None]] = []
    while lo < hi:
        group = lo // batch_size
        group_lo, group_hi = group * batch_size, min((group + 1) * batch_size, end)
        cut = min(hi, group_hi)
        # the workers with last rows in this batch
        parts = int(((starts[1:] > group_lo) & (starts[:-1] < group_hi) & (left > 0)).sum())
        pieces.append((cut - lo, None if parts == 1 else StitchTag(group, parts, lo == group_lo)))
        lo = cut
    if len(pieces) == 2 and pieces[1][1] is None:
        # a batch alone, after a piece stitched with others: it waits for that batch (handed out first,
        # or the worker's position would pass over rows still held)
        pieces[1] = (pieces[1][0], StitchTag(int(starts[worker + 1] - 1) // batch_size, 1, True))
    return pieces


@dataclass(frozen=True)
class LeasedItems:
    """What one lease holds: parts of replays (each a :class:`Replay` of its own) and splits."""

    replays: tuple[Replay[Slot], ...]
    splits: tuple[Split, ...]


class Leases:
    """The leases of one :class:`Work`: their bounds, and what each holds (computed when asked)."""

    def __init__(self, work: Work, batch_size: int, num_workers: int,
                 pieces_per_worker: int = TAIL_LEASES_PER_WORKER) -> None:
        self.work = work
        self._rows, self._first_fresh = work.items
        self._starts = np.concatenate([[0], np.cumsum(self._rows)]).astype(np.int64)
        self.bounds = lease_bounds(self._rows, batch_size, num_workers, pieces_per_worker)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def _item(self, index: int) -> Replay[Slot] | Split:
        work = self.work
        if index < len(work.replays):
            return work.replays[index]
        index -= len(work.replays)
        if index < len(work.splits):
            return work.splits[index]
        fresh_index = self._first_fresh + index - len(work.splits)
        split = work.fresh[fresh_index]
        if fresh_index == self._first_fresh:   # the first fresh split counts from fresh_from_row
            before = int(split_rows(work.fresh)[:fresh_index].sum())
            split = split_rest(split, work.fresh_from_row - before)
        return split

    def items(self, lease: int) -> LeasedItems:
        """The replays and splits of lease ``lease``, in order (a replay part is a replay of its own)."""
        lo, hi = int(self.bounds[lease]), int(self.bounds[lease + 1])
        first = int(np.searchsorted(self._starts, lo, side="right")) - 1
        replays: list[Replay[Slot]] = []
        splits: list[Split] = []
        index = first
        while index < len(self._rows) and self._starts[index] < hi:
            start = int(self._starts[index])
            a, b = max(lo - start, 0), min(hi - start, int(self._rows[index]))
            if b > a:
                item = self._item(index)
                if isinstance(item, Replay):
                    replays.append(replay_part(item, a, b))
                else:
                    splits.append(split_part(item, a, b))
            index += 1
        return LeasedItems(tuple(replays), tuple(splits))

    def rows(self, lease: int) -> int:
        return int(self.bounds[lease + 1] - self.bounds[lease])

    def counts(self, leases: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """How many splits and how many replays :meth:`items` gives for each of ``leases`` (without
        making them)."""
        lo, hi = self.bounds[leases], self.bounds[leases + 1]
        first = np.searchsorted(self._starts, lo, side="right") - 1
        stop = np.searchsorted(self._starts, hi, side="left")   # items before `stop` start before hi
        nonempty = self._rows > 0
        is_replay = np.arange(len(self._rows)) < len(self.work.replays)
        out = []
        for kind in (nonempty & ~is_replay, nonempty & is_replay):
            counted = np.concatenate([[0], np.cumsum(kind)])
            out.append((counted[stop] - counted[first]).astype(np.int64))
        return out[0], out[1]


class PoolLeases:
    """A worker's view of one iteration's leases: laid out with the pool's tail pieces as they are when
    asked (the leases before the last eighth are the same with any, and no lease of the last eighth is
    handed out before the pool has decided them: see :func:`lease_bounds`); each layout built once."""

    def __init__(self, lay_out: Callable[[int], Leases], pieces: Callable[[], int]) -> None:
        self._lay_out, self._pieces = lay_out, pieces
        self._laid: dict[int, Leases] = {}

    def of(self, pieces: int) -> Leases:
        leases = self._laid.get(pieces)
        if leases is None:
            leases = self._laid[pieces] = self._lay_out(pieces)
        return leases

    @property
    def current(self) -> Leases:
        return self.of(self._pieces())

    def items(self, lease: int) -> LeasedItems:
        return self.current.items(lease)


class LocalPool:
    """Leases handed out in order to the workers of one process (``num_workers=0``, and tests); the
    loader's workers share a :class:`~arrowstream._worker.lease_pool.SharedPool` instead. ``owners()[i]``: the
    worker that took lease ``i``, -1 while nobody has; ``loaded``: the leases are of a loaded checkpoint's
    rest of ``epoch``, not of its fresh rows."""

    def __init__(self, num_leases: int, epoch: int = 0, loaded: bool = False) -> None:
        self.epoch = epoch
        self.loaded = loaded
        self.pieces = TAIL_LEASES_PER_WORKER
        self._owners = np.full(num_leases, -1, dtype=np.int64)
        self._next = 0

    def __len__(self) -> int:
        return len(self._owners)

    def take(self, worker: int, decide: object = None) -> int | None:
        """The next lease (one process lays out its leases alone: the default tail, ``decide`` unused)."""
        if self._next >= len(self._owners):
            return None
        lease, self._next = self._next, self._next + 1
        self._owners[lease] = worker
        return lease

    def owners(self) -> npt.NDArray[np.int64]:
        return self._owners.copy()

    def snapshot(self) -> tuple[int, npt.NDArray[np.int64]]:
        return self.pieces, self.owners()

    @property
    def fixed(self) -> int:
        """Leases laid out before the last eighth: all of them (one process lays out the default tail)."""
        return len(self._owners)
