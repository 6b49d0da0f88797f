"""One slot's epoch of a mixture: each source's rows, taken batch by batch in proportion, and its state.

Each source's rows are a :class:`~arrowstream._mixing.source_rows.SourceRows`, which hands out exactly the rows
asked for. A :class:`MixStream` cuts batches: each takes from every source its share
(:func:`~arrowstream._mixing.quotas.shares_after`), casts them to the mixture's schema, and mixes them when
the shuffle buffer is on (:data:`~arrowstream._state.mixture.BATCH_ORDERS`). Where it stands is a :class:`~arrowstream._state.mixture.MixWorkerState` (or, for a dataset's slot read as one
source, its ``WorkerState``: see :mod:`arrowstream._state.one_source`).
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .._state.mixture import EVEN, PERMUTED, CompactCursor
from .quotas import batch_permutations, shares_along, window_seed
from .source_rows import SourceRows
from .span import batch_order, even_span_order, in_batch_order, mixed

logger = logging.getLogger("arrowstream")


@dataclass(frozen=True)
class MixSlot:
    """A slot's identity in an epoch, for seeds and states."""

    epoch: int
    rank: int
    world_size: int
    worker_id: int
    num_workers: int

    @property
    def index(self) -> int:
        return self.rank * max(self.num_workers, 1) + self.worker_id

    @property
    def num_slots(self) -> int:
        return self.world_size * max(self.num_workers, 1)


def source_seeds(seed: int, name: str, slot: MixSlot) -> Callable[[int, int], int]:
    return functools.partial(_seed_of, seed, name, slot.epoch, slot.index, slot.num_slots)


def _seed_of(seed: int, name: str, epoch: int, slot_index: int, num_slots: int, segment: int, window: int) -> int:
    return window_seed(seed, name, epoch, slot_index, num_slots, segment, window)


P = TypeVar("P")   # where the stream stands after a batch: a mixture's MixPosition, a dataset's Position
S = TypeVar("S")   # a worker's state: MixWorkerState, a dataset's WorkerState
S_co = TypeVar("S_co", covariant=True)


class StreamStart(Protocol[P, S_co]):
    """What a slot's stream starts from and reports in: a mixture's ``MixWorkerState``, or a dataset's worker state
    read as one source (``arrowstream._state.one_source.DatasetStart``)."""

    @property
    def rows(self) -> int: ...

    @property
    def batches(self) -> int: ...

    @property
    def rows_dropped(self) -> int: ...

    @property
    def epoch_complete(self) -> bool: ...

    def place(self, rows: int, batches: int, rows_dropped: int, complete: bool,
              cursors: tuple[CompactCursor, ...]) -> P:
        """Where the stream stands after a batch: its counters, whether its epoch is complete, each source's place."""

    def state_at(self, position: P, names: Sequence[str], complete: bool) -> S_co:
        """The worker's state at ``position`` (the sources' places of sources ``names``, in order)."""


class MixStream(Generic[P, S]):
    """A slot's batches of a mixture epoch: each takes every source's share, cast to one schema."""

    def __init__(self, sources: Sequence[SourceRows], quotas: Sequence[int], *,
                 cast: Callable[[str, pa.RecordBatch], pa.RecordBatch] | None,
                 batch_size: int, drop_last: bool, max_batches: int | None, batch_order: str | None, seed: int,
                 slot: MixSlot, start: StreamStart[P, S], ends_when_asked: bool = False,
                 last_pieces: Callable[[], list[tuple[int, Any]]] | None = None) -> None:
        """``batch_order``: one of :data:`~arrowstream._state.mixture.BATCH_ORDERS`, or None: the sources one after
        another; ``cast``: of each source's rows to the mixture's schema (None: taken as they are). ``ends_when_asked``: the epoch is complete once a batch past its last one is asked for (a
        dataset's stream, whose state after its last batch has always said so only then), not with its last
        batch. A single source whose rows are known only by reading (``SourceRows.rows_known``) is planned by
        reading ahead; a mixture of several never is (mixtures refuse filters: quotas count metadata rows).
        ``last_pieces`` (a dynamic worker's, of one source whose rows are known by reading): how its last rows, fewer
        than a batch, are handed out, as pieces of (rows, tag) asked for once they are reached; a tagged piece is
        stitched with other workers' (:meth:`next_piece`, see ``arrowstream._layout.leases.last_pieces``)."""
        if any(not source.rows_known for source in sources) and len(sources) != 1:
            raise AssertionError("only a stream of one source may have rows known only by reading")
        self._sources = list(sources)
        self._reading = not sources[0].rows_known if sources else False
        self._ends_when_asked = ends_when_asked
        self._left: int | None = None   # rows known only by reading: the rows left when the epoch ends
        self._position: P | None = None   # where it stands, once asked (until it moves)
        self._quotas = list(quotas)
        self._total = sum(quotas)
        self._cast = cast
        # one source whose batches are its rows in the order taken (a dataset's slot): no shares to compute
        self._one = self._sources[0] if len(self._sources) == 1 and batch_order != PERMUTED else None
        self._batch_size, self._drop_last, self._max_batches = batch_size, drop_last, max_batches
        self._batch_order, self._seed, self._slot = batch_order, seed, slot
        self._start = start
        self.rows, self.batches, self.rows_dropped = start.rows, start.batches, start.rows_dropped
        self.complete = start.epoch_complete
        if last_pieces is not None and not (self._reading and ends_when_asked and max_batches is None):
            raise AssertionError("only a stream of one source whose rows are known by reading, that ends when asked "
                                 "and has no even_batches limit, stitches its last rows (a dynamic worker's)")
        self._last_pieces = last_pieces
        self._pieces: deque[tuple[int, Any]] | None = None

    def _finish(self) -> None:
        left = self._total - self.rows if self._left is None else self._left
        trimmed = self._max_batches is not None and self.batches >= self._max_batches
        if not trimmed:   # never read rows even_batches trims
            for source in self._sources:
                source.drain()
        if self._reading and self._max_batches is not None and self.batches >= self._max_batches:
            logger.info("even_batches: rank %d worker %d stops after %d batch(es) of epoch %d; the rest of its "
                        "rows are trimmed this epoch", self._slot.rank, self._slot.worker_id, self.batches,
                        self._slot.epoch)
        elif self._max_batches is not None and self.batches >= self._max_batches and left:
            logger.info("even_batches: rank %d worker %d stops after %d batch(es) of mixture epoch %d; %d row(s) of "
                        "its quotas are trimmed", self._slot.rank, self._slot.worker_id, self.batches,
                        self._slot.epoch, left)
        elif self._drop_last and left:
            self.rows_dropped += left
            logger.info("drop_last: rank %d worker %d dropped its last %d row(s) of mixture epoch %d",
                        self._slot.rank, self._slot.worker_id, left, self._slot.epoch)
        self.complete = True

    def __iter__(self) -> MixStream[P, S]:
        return self

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def epoch(self) -> int:
        return self._slot.epoch

    def _plan(self, max_batches: int) -> tuple[list[int], bool]:
        """Up to ``max_batches`` next batches, planned without reading: the slot's rows after each, and whether
        the epoch ends with them (no batch after the last: so the state after the epoch's last batch says the
        epoch is complete, as the state taken after the loop must, whichever batch a span or a transfer ends
        with). Each source's rows after each: :func:`~arrowstream._mixing.quotas.shares_along`."""
        rows, size = self.rows, self._batch_size
        if self._reading:
            return self._plan_read(max_batches)
        left = self._total - rows
        # the batches left: full ones, then the rest of the quotas (none with drop_last), up to even_batches' limit
        possible = left // size + (1 if left % size and not self._drop_last else 0)
        if self._max_batches is not None:
            possible = max(0, min(possible, self._max_batches - self.batches))
        count = min(possible, max_batches)
        plan = [min(rows + size * j, self._total) for j in range(1, count + 1)]
        if self._ends_when_asked:
            return plan, count < self._asked(max_batches)
        return plan, count == possible

    def _asked(self, max_batches: int) -> int:
        """Batches asked for, up to even_batches' limit (one at least, so that the limit ends the epoch)."""
        if self._max_batches is None:
            return max(max_batches, 1)
        return min(max(max_batches, 1), max(self._max_batches - self.batches, 0))

    def _plan_read(self, max_batches: int) -> tuple[list[int], bool]:
        """:meth:`_plan` of one source whose rows are known only by reading: the rows held after reading ahead
        ``max_batches`` batches (never rows even_batches trims) decide; the epoch ends when fewer are left."""
        rows, size = self.rows, self._batch_size
        asked = self._asked(max_batches)
        held = self._sources[0].fill(size * asked) if asked else 0
        full = min(held // size, asked)
        plan = [rows + size * j for j in range(1, full + 1)]
        if full < asked and held > full * size and not self._drop_last:   # the runs ended: a short last batch
            plan.append(rows + held)
        ends = len(plan) < asked if self._ends_when_asked else held <= size * len(plan) and held < size * asked
        if ends:
            self._left = held - (plan[-1] - rows if plan else 0)
        return plan, ends

    def _permutations(self, sizes: list[int], first: int) -> list[npt.NDArray[np.int64]]:
        """The order of each batch's rows (batch ``first`` on, of ``sizes`` rows), those of the same size
        computed together."""
        orders: list[npt.NDArray[np.int64]] = [np.empty(0, np.int64)] * len(sizes)
        for size in set(sizes):
            numbers = [j for j, rows in enumerate(sizes) if rows == size]
            together = batch_permutations(size, self._seed, self._slot.epoch, self._slot.index, self._slot.num_slots,
                                          [first + j for j in numbers])
            for j, order in zip(numbers, together, strict=True):
                orders[j] = order
        return orders

    def __next__(self) -> pa.RecordBatch:
        return self.next_record()

    def next_record(self) -> pa.RecordBatch:
        """The next batch, as Arrow."""
        source = self._one
        if source is None:
            return self.next_span(1)[0]
        # one source: the batch is its next rows, and the position after it is found only when asked
        self._position = None
        if self.complete:
            raise StopIteration
        if self._ends_when_asked and not self._reading:   # (a dataset's: _plan(1) in short)
            size, left = self._batch_size, self._total - self.rows
            if left <= 0 or (left < size and self._drop_last) or (self._max_batches is not None
                                                                 and self.batches >= self._max_batches):
                self._finish()
                raise StopIteration
            rows, ends = min(size, left), False
        elif self._ends_when_asked and self._max_batches is None:   # rows known by reading: _plan_read(1) in short
            size = self._batch_size
            held = source.fill(size)
            if held >= size:
                rows = size
            elif held and not self._drop_last:
                rows = held
                if self._last_pieces is not None:   # the last rows: read to the end
                    rows, tag = self._next_piece(held)
                    if tag is not None:   # stitched with other workers' rows: next_piece() hands it out
                        raise StopIteration
                    self._pieces.popleft()   # type: ignore[union-attr]
            else:
                self._left = held
                self._finish()
                raise StopIteration
            ends = False
        else:
            plan, ends = self._plan(1)
            if not plan:
                self._finish()
                raise StopIteration
            rows = plan[0] - self.rows
        batch = source.take(rows)
        if self._cast is not None:
            batch = self._cast(source.name, batch)
        self.rows += rows
        self.batches += 1
        if ends:
            self._finish()
        return batch

    def _next_piece(self, held: int) -> tuple[int, Any]:
        """The next piece of the last rows (``held`` rows left), laid out when first asked."""
        if self._pieces is None:
            assert self._last_pieces is not None
            self._pieces = deque(self._last_pieces())
            if sum(rows for rows, _ in self._pieces) != held:
                raise AssertionError(f"worker {self._slot.worker_id} holds {held} last row(s), its leases leave "
                                     f"{sum(rows for rows, _ in self._pieces)}")
        return self._pieces[0]

    def next_piece(self) -> tuple[Any, pa.RecordBatch] | None:
        """The next piece of this slot's last rows that other workers' rows make a batch with, and its tag; None
        when the next rows (if any) are not such a piece, or the slot hands out its last rows itself (a mixture's,
        a static dataset's: only a dynamic worker's are stitched)."""
        if self.complete or self._last_pieces is None:
            return None
        source = self._sources[0]
        held = source.fill(self._batch_size)
        if not 0 < held < self._batch_size:
            return None
        rows, tag = self._next_piece(held)
        if tag is None:
            return None
        self._pieces.popleft()   # type: ignore[union-attr]
        self._position = None
        batch = source.take(rows)
        self.rows += rows
        self.batches += 1
        return tag, batch

    def next_span(self, max_batches: int, every: bool = True) -> tuple[pa.RecordBatch, list[int], list[P], list[int]]:
        """Up to ``max_batches`` next batches as one record batch (one concatenation), with each batch's
        rows, the position after each, and the rows of each source among them; the batches are those
        ``next()`` would give, one after another.

        The batches are planned first (each source's share of each), then each source's rows of the whole
        span are taken in one pass, with its cursor after each batch's share. ``every=False``: the position after
        the last batch only (a list of one), which costs one cursor instead of one per batch (a canonical slot's
        batches are a few rows each, see :mod:`arrowstream._layout.canonical_stream`)."""
        if self._last_pieces is not None:   # a dynamic worker's: batch by batch, its last rows as pieces
            return self._record_span(max_batches)
        if max_batches <= 1 and self._ends_when_asked and self._one is not None:   # a dataset's one batch
            batch = self.next_record()
            return batch, [batch.num_rows], [self.position()], [batch.num_rows]
        self._position = None
        if self.complete:
            raise StopIteration
        plan, ends = self._plan(max_batches)
        if not plan:
            self._finish()
            raise StopIteration
        if self._one is not None:
            return self._one_span(self._one, plan, ends, every)
        sources = self._sources
        before = [source.taken for source in sources]
        if self._reading:   # one source: every row of the batches is its
            marks = [[after - self.rows for after in plan]]
        else:
            marks = [[after - start for after in source_after]
                     for source_after, start in zip(shares_along(before, self._quotas, plan), before, strict=True)]
        pieces, cursors = [], []
        cast = self._cast
        for source, source_marks in zip(sources, marks, strict=True):
            taken, after = source.take_marked(source_marks if every else source_marks[-1:])
            pieces.append(taken if cast is None else [cast(source.name, piece) for piece in taken])
            cursors.append(after)
        first, dropped = self.batches, self.rows_dropped
        sizes = [plan[0] - sum(before), *(now - then for then, now in itertools.pairwise(plan))]
        place_of, ends_at = self._start.place, plan if every else plan[-1:]
        placed = [place_of(rows, batch, dropped, False, place)
                  for batch, rows, place in zip(range(first + 1 + len(plan) - len(ends_at), first + 1 + len(plan)),
                                                ends_at, zip(*cursors, strict=True), strict=True)]
        counts = [source_marks[-1] for source_marks in marks]
        giving = sum(1 for count in counts if count)   # sources that give rows to the span
        if self._batch_order == EVEN and giving > 1:
            span = mixed(pieces, even_span_order(marks))   # (one source alone: its even order is its own)
        elif self._batch_order == PERMUTED:   # each batch's rows by its own permutation (as if taken alone)
            span = mixed(pieces, batch_order(marks, self._permutations(sizes, first)))
        elif giving == 1 or len(plan) == 1:   # batch order is the order the rows were taken in
            flat = [piece for source_pieces in pieces for piece in source_pieces]
            span = flat[0] if len(flat) == 1 else pa.concat_batches(flat)
        else:
            span = in_batch_order(pieces, marks)
        self.rows = plan[-1]
        self.batches += len(plan)
        if ends:
            self._finish()
        return span, sizes, placed, counts

    def _record_span(self, max_batches: int) -> tuple[pa.RecordBatch, list[int], list[P], list[int]]:
        """:meth:`next_span` as :meth:`next_record` one after another (up to a piece that is stitched)."""
        records: list[pa.RecordBatch] = []
        positions: list[P] = []
        while len(records) < max(max_batches, 1):
            try:
                records.append(self.next_record())
            except StopIteration:
                break
            positions.append(self.position())
        if not records:
            raise StopIteration
        span = records[0] if len(records) == 1 else pa.concat_batches(records)
        return span, [record.num_rows for record in records], positions, [span.num_rows]

    def _one_span(self, source: SourceRows, plan: list[int], ends: bool,
                  every: bool = True) -> tuple[pa.RecordBatch, list[int], list[P], list[int]]:
        """:meth:`next_span`'s batches of one source taken in order: the marks are the plan's, the span its pieces."""
        before = source.taken
        marks = [row - before for row in plan]
        taken, places = source.take_marked(marks if every else marks[-1:])
        if self._cast is not None:
            taken = [self._cast(source.name, piece) for piece in taken]
        span = taken[0] if len(taken) == 1 else pa.concat_batches(taken)
        first, dropped, place = self.batches, self.rows_dropped, self._start.place
        if not every:
            sizes = [marks[0], *(now - then for then, now in itertools.pairwise(plan))]
            placed = [place(plan[-1], first + len(plan), dropped, False, (places[-1],))]
        elif len(plan) == 1:
            sizes, placed = [marks[0]], [place(plan[0], first + 1, dropped, False, (places[0],))]
        else:
            sizes = [marks[0], *(now - then for then, now in itertools.pairwise(plan))]
            placed = [place(rows, batch, dropped, False, (where,))
                      for batch, rows, where in zip(range(first + 1, first + 1 + len(plan)), plan, places, strict=True)]
        self.rows = plan[-1]
        self.batches += len(plan)
        if ends:
            self._finish()
        return span, sizes, placed, [marks[-1]]

    def position(self) -> P:
        """Where the stream stands: after the last batch it gave."""
        if self._position is None:   # (asked once or twice a batch, e.g. before and after a chunk in a worker)
            one = self._one
            places = (one.compact_cursor(),) if one is not None else tuple(source.compact_cursor()
                                                                           for source in self._sources)
            self._position = self._start.place(self.rows, self.batches, self.rows_dropped, self.complete, places)
        return self._position

    def state(self, position: P | None = None) -> S:
        """The worker's state where it stands now, or at ``position`` (one of :meth:`position`'s, taken before the
        stream went on)."""
        names = [source.name for source in self._sources]
        if position is None:
            return self._start.state_at(self.position(), names, self.complete)
        return self._start.state_at(position, names, False)

    def holds(self, rows: int) -> bool:
        """Whether at least ``rows`` rows are left in the epoch (reads ahead as far as needed when the rows are known
        only by reading)."""
        if self.complete:
            return False
        if self._reading:
            self._position = None   # reading ahead may move past rows a filter dropped
            return self._sources[0].fill(rows) >= rows
        return self._total - self.rows >= rows
