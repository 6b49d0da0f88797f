"""The per-worker reader: rows of one split from a source offset, as Arrow pieces, in any format.

All I/O of a worker happens here. A piece remembers where its rows came from in the split
(*source offsets*), so the stream above can name the exact position after any row, also when
a filter drops rows. Transient storage errors re-open the file and continue after the last
piece handed out: nothing is lost or repeated.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .._core.nullability import conformer
from .._core.piece import Piece
from .._core.plan_types import Split, split_available
from .._core.row_ids import RowIds
from .._formats import UnitFile, name_units, unit_format
from .._formats.opened import MetadataMismatch
from .._planning.plan import Plan
from .._storage.failures import wrap_read_error
from .._storage.filesystem import Storage
from .._storage.pinned import Pin
from .._storage.prefetch import Prefetcher
from .._storage.retry import Attempts, forget_locals
from ..errors import ArrowStreamError, CorruptFileError, FileChangedError, StalePlanCacheError
from .metrics import Meter

_ROW_INDEX = "__arrowstream_source_offset"
SMALLEST_READ_ROWS = 1024   # a smaller read costs more per row than the rows it spares decoding


class ReadAhead:
    """Tells the storage's prefetcher which byte ranges the splits being read and the next ones need.

    One per process, shared by the interleaved readers: when the split at ``position`` of the
    slot's reading order starts, it and the ``depth`` splits after it are fetched (coalesced,
    concurrently); a split's bytes are released when it has been read.
    """

    def __init__(self, plan: Plan, prefetcher: Prefetcher, depth: int) -> None:
        self._plan, self._prefetcher, self._depth = plan, prefetcher, depth
        self._order: Sequence[Split] = ()
        self._token = 0

    def begin(self, order: Sequence[Split]) -> None:
        """A new reading order (an epoch of this slot); drops what was fetched for the last one."""
        for position in range(len(self._order)):
            self._prefetcher.release((self._token, position))
        self._token += 1
        self._order = order

    def started(self, position: int) -> None:
        split_available(self._order, position + self._depth)   # leased splits: lease as far ahead as is fetched
        for ahead in range(position, min(len(self._order), position + 1 + self._depth)):
            if self._prefetcher.scheduled((self._token, ahead)):
                continue
            split = self._order[ahead]
            footer = self._plan.files[split.file_index]
            units = list(range(split.unit_start, split.unit_stop))
            ranges = unit_format(footer.format).byte_ranges(footer, units, self._plan.read_columns)
            pin = Pin(footer.entry.path, self._plan.url(split.file_index), footer.entry.size, footer.entry.version,
                      self._plan.protocol)
            self._prefetcher.schedule((self._token, ahead), pin, ranges)

    def finished(self, position: int) -> None:
        self._prefetcher.release((self._token, position))


class UnitCache:
    """Whole units (row groups, stripes) decoded once for the readers of one process that read parts of them at
    about the same time (the canonical slots of ``order="canonical"``, whose stretches cut units: several of them
    read one row group's parts in the same few batches), the last few kept, up to ``max_bytes``."""

    def __init__(self, max_bytes: int = 128 * 2**20, max_units: int = 64) -> None:
        self._kept: dict[tuple[int, int], pa.RecordBatch] = {}
        self._used: dict[tuple[int, int], int] = {}   # rows of each kept unit cut out so far
        self._max_bytes, self._max_units = max_bytes, max_units

    def used(self, key: tuple[int, int], rows: int) -> None:
        """``rows`` of a kept unit were cut out: once all of them were, it is let go (its memory reused at once)."""
        batch = self._kept.get(key)
        if batch is None:
            return
        self._used[key] = self._used.get(key, 0) + rows
        if self._used[key] >= batch.num_rows:
            del self._kept[key], self._used[key]

    def get(self, key: tuple[int, int]) -> pa.RecordBatch | None:
        batch = self._kept.pop(key, None)
        if batch is not None:
            self._kept[key] = batch   # the most recent last
        return batch

    def put(self, key: tuple[int, int], batch: pa.RecordBatch) -> None:
        self._kept[key] = batch
        while len(self._kept) > 1 and (len(self._kept) > self._max_units
                                       or sum(b.nbytes for b in self._kept.values()) > self._max_bytes):
            oldest = next(iter(self._kept))
            del self._kept[oldest]
            self._used.pop(oldest, None)


class SplitReader:
    """Reads splits of one plan for one worker; keeps the current file open between splits. With a ``unit_cache``,
    a part of one unit is cut from the whole unit decoded once (for readers that share one)."""

    def __init__(self, plan: Plan, storage: Storage, read_batch_rows: int, use_threads: bool,
                 read_ahead: ReadAhead | None = None, meter: Meter | None = None,
                 check: Callable[[pa.RecordBatch, str], None] | None = None,
                 first_read_rows: int | None = None, row_ids: RowIds | None = None,
                 unit_cache: UnitCache | None = None) -> None:
        self._unit_cache = unit_cache
        self._plan = plan
        self._row_ids = row_ids   # with_row_ids: each piece gets its rows' file and position in it
        self._check = check   # of each piece's values against the output format (errors name the file)
        self._meter = meter
        self._storage = storage
        self._read_ahead = read_ahead
        self._read_batch_rows = read_batch_rows
        # rows decoded no further ahead than wanted, if given: a reader whose rows are wanted a few at a time
        # (a mixture's source) reads its first ``first_read_rows`` rows in reads sized to what is left of
        # them, across splits, so its first batch (or shuffle window) waits for no rows beyond it
        self._first_rows_left = first_read_rows or 0
        self.use_threads = use_threads   # pyarrow's threads decode the columns of a read together
        self.threads_by_default = use_threads   # (a dynamic worker turns them on for its epoch's last eighth)
        self._output_columns = plan.schema.names
        self._open_index = -1
        self._open_file: UnitFile | None = None
        self._row_ok: str | None = None   # the open file's format's column of rows it parsed (text)

    def close(self) -> None:
        if self._open_file is not None:
            self._open_file.close()
        self._open_file, self._open_index = None, -1

    def _file(self, file_index: int) -> UnitFile:
        if file_index != self._open_index:
            self.close()
            footer = self._plan.files[file_index]
            file_format = unit_format(footer.format)
            self._open_file = file_format.open(self._storage, footer)   # checks the file's metadata (_opened)
            self._open_index, self._row_ok = file_index, file_format.row_ok_column
            # a format that prunes units by statistics checks the pruned ones too (they are never read)
            check_pruned = getattr(self._open_file, "check_pruned", None)
            if (check_pruned is not None and self._plan.filter is not None
                    and len(footer.kept_units) < len(footer.unit_rows)):
                check_pruned(self._plan.filter)
        assert self._open_file is not None
        return self._open_file

    def read(self, split: Split, position: int, offset: int) -> Iterator[Piece]:
        """Pieces of ``split`` from source ``offset`` to its end, retrying transient errors."""
        if self._read_ahead is not None:
            self._read_ahead.started(position)
        try:
            yield from self._read_retrying(split, position, offset)
        finally:
            if self._read_ahead is not None:
                self._read_ahead.finished(position)

    def _read_retrying(self, split: Split, position: int, offset: int) -> Iterator[Piece]:
        url = self._plan.url(split.file_index)
        policy = self._storage.retry
        attempts = Attempts(policy, url, policy.split_deadline, per="split", credentials=self._storage)
        while offset < split.num_rows:
            started = time.monotonic()   # time lost to a failure counts from here, or from the last piece
            try:
                for piece in self._read_once(split, position, offset):
                    offset = piece.end
                    attempts.progressed()
                    yield piece
                    started = time.monotonic()
                if self._meter is not None:
                    self._meter.split_done(split.num_bytes)
                return
            except Exception as exc:
                self.close()
                forget_locals(exc)
                if isinstance(exc, MetadataMismatch):   # the file is not what the plan holds of it: never retried
                    raise self._not_planned(split, exc) from None
                if isinstance(exc, ArrowStreamError):   # already names the file and the remedy (a malformed row)
                    raise
                self._check_unchanged(split)   # a local file changed under the read is named as changed
                # retried from the row it stopped at, or a FileReadError (or the provider's error) saying why not
                wait = attempts.after(exc, time.monotonic() - started, at=f" at row {offset}")
                if wait is None:
                    label = unit_format(self._plan.files[split.file_index].format).label
                    raise wrap_read_error(exc, url, label) from exc
                time.sleep(wait)

    def _check_unchanged(self, split: Split) -> None:
        with contextlib.suppress(FileNotFoundError):   # a file that disappeared is named as such by the caller
            self._storage.check_unchanged(self._plan.files[split.file_index].entry)

    def _read_once(self, split: Split, position: int, offset: int) -> Iterator[Piece]:
        footer = self._plan.files[split.file_index]
        begin = split.row_start + offset          # row inside the span of the split's units
        end = split.row_start + split.num_rows
        units: list[int] = []
        span_row = 0                              # span row of the first row of units[0]
        cursor = 0
        for unit in range(split.unit_start, split.unit_stop):
            rows = footer.unit_rows[unit]
            if cursor + rows > begin and cursor < end:
                if not units:
                    span_row = cursor
                units.append(unit)
            cursor += rows
        if not units:
            return
        first_row = span_row
        # with row ids: the file's row (as the reader yields them) at source offset 0 of the split
        ids_at = None if self._row_ids is None else (split.file_index, self._row_ids.split_first_row(
            split.file_index, split.unit_start, split.row_start))
        announced = sum(footer.unit_rows[unit] for unit in units)
        # a split that ends where its last unit ends reads the units to their end, so that a unit holding
        # more rows than announced is noticed too; one that ends inside a unit leaves its tail to the next
        to_the_end = end == first_row + announced
        # a local file: its size and modification time checked (a stat) before its bytes are touched (a map
        # of a file truncated since would be SIGBUS) and after each batch is read (rows of one version only)
        self._storage.check_unchanged(footer.entry)
        read_rows = self._read_batch_rows
        if self._first_rows_left > 0:   # the whole split in reads of this size: a read's size is fixed once it starts
            read_rows = min(read_rows, max(self._first_rows_left, SMALLEST_READ_ROWS))
        if not to_the_end:   # a split that ends inside a unit: decode no further than its end (a lease's first rows)
            read_rows = min(read_rows, end - first_row)
        if self._unit_cache is not None and len(units) == 1 and not (to_the_end and begin == span_row):
            # a part of one unit (its rows counted against the plan there): shared with the readers reading its others
            yield from self._from_unit(split, position, units[0], span_row, begin, end, announced, ids_at)
            return
        batches = self._file(split.file_index).read_units(units, self._plan.read_columns, read_rows, self.use_threads)
        for batch in batches:
            self._storage.check_unchanged(footer.entry)
            lo = max(begin - span_row, 0)
            hi = min(end - span_row, batch.num_rows)
            if hi > lo:
                self._first_rows_left -= hi - lo
                piece = self._piece(batch.slice(lo, hi - lo), position, span_row + lo - split.row_start, ids_at)
                if self._check is not None:
                    self._check(piece.batch, self._plan.url(split.file_index))
                yield piece
            span_row += batch.num_rows
            if span_row >= end and not to_the_end:
                return
        if span_row != end:
            raise self._miscounted(split, units, announced, span_row - first_row)

    def _from_unit(self, split: Split, position: int, unit: int, span_row: int, begin: int, end: int, announced: int,
                   ids_at: tuple[int, int] | None) -> Iterator[Piece]:
        """Rows ``[begin, end)`` (of the split's span of units) of ``unit``, which starts at ``span_row``: cut from the
        whole unit, decoded once for every reader of the process's unit cache (its rows checked against the plan)."""
        assert self._unit_cache is not None
        footer = self._plan.files[split.file_index]
        key = (split.file_index, unit)
        whole = self._unit_cache.get(key)
        if whole is None:
            batches = list(self._file(split.file_index).read_units([unit], self._plan.read_columns,
                                                                   max(announced, 1), self.use_threads))
            rows = sum(batch.num_rows for batch in batches)
            if rows != announced:
                raise self._miscounted(split, [unit], announced, rows)
            whole = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
            self._unit_cache.put(key, whole)
        self._storage.check_unchanged(footer.entry)
        lo, hi = begin - span_row, end - span_row
        self._first_rows_left -= hi - lo
        self._unit_cache.used(key, hi - lo)
        piece = self._piece(whole.slice(lo, hi - lo), position, begin - split.row_start, ids_at)
        if self._check is not None:
            self._check(piece.batch, self._plan.url(split.file_index))
        yield piece

    def _not_planned(self, split: Split, mismatch: MetadataMismatch) -> Exception:
        """The error for a file whose own metadata is not what the plan holds of it (``mismatch`` says how),
        though its size and modification time are: the plan cache entry the plan came from is stale (named, with
        the way out), or the file was rewritten during the run with its modification time restored. A mismatch
        with another possible cause (rows counted, the file may be corrupt) is its own error, naming the entry
        the plan came from, if any."""
        url = self._plan.url(split.file_index)
        label = unit_format(self._plan.files[split.file_index].format).label
        entry = self._plan.cache_entry
        if mismatch.fallback is not None:
            if entry is None:
                return mismatch.fallback
            return type(mismatch.fallback)(
                f"{mismatch.fallback}; the dataset was planned from the plan cache entry {entry}: if the file was "
                f"rewritten keeping its size and modification time, the entry is stale: remove it (rm {entry}) or "
                "build the dataset with plan_cache=False, then build the dataset again")
        if entry is not None:
            return StalePlanCacheError(
                f"the plan cache entry {entry} is stale: it holds {label} metadata of {url} that the file does not "
                f"have ({mismatch}), its size and modification time unchanged (rewritten in place with them "
                f"restored, as cp -p, rsync -t or a restore do); remove the entry (rm {entry}) or build the dataset "
                "with plan_cache=False, then build the dataset again: its metadata is read from the file afresh")
        return FileChangedError(
            f"{url}: changed since planning, keeping its size and modification time: its {label} metadata is not the "
            f"one the dataset was planned on ({mismatch}); the dataset changed while it was read: re-plan (build "
            "the dataset again) or resume from a checkpoint taken on the new data")

    def _miscounted(self, split: Split, units: list[int], announced: int, rows: int) -> Exception:
        """The row-count contract broken: units yielded other than their metadata announced (the file is corrupt,
        or changed keeping its size and modification time; a plan from the plan cache: the entry is named)."""
        file_format = unit_format(self._plan.files[split.file_index].format)
        return self._not_planned(split, MetadataMismatch("", fallback=CorruptFileError(
            f"{self._plan.url(split.file_index)}: {file_format.label} {name_units(file_format.unit, units)} "
            f"yielded {rows} rows where the metadata the dataset was planned on announced {announced}; the file "
            "is corrupt or changed after planning: rewrite it (or rebuild the dataset, with plan_cache=False if the "
            "change kept its size and modification time), or leave it out of `path`")))

    def _piece(self, batch: pa.RecordBatch, position: int, start: int, ids_at: tuple[int, int] | None) -> Piece:
        """The piece of the split's rows ``batch`` (from source offset ``start``): filtered, projected, and with
        ``ids_at`` (the file, and its row at source offset 0) the row ids added."""
        end = start + batch.num_rows
        filter = self._plan.filter
        row_ok = self._row_ok
        if row_ok is not None and batch.schema.get_field_index(row_ok) >= 0:   # rows the format skipped: gaps
            filter = pc.field(row_ok) if filter is None else filter & pc.field(row_ok)
            if self._meter is not None:
                self._meter.skipped(batch.num_rows - batch.column(row_ok).true_count)
        if filter is None:
            if batch.schema.names != self._output_columns:
                batch = batch.select(self._output_columns)
            batch = self._conformed(batch)
            if ids_at is not None:
                batch = self._with_ids(batch, ids_at, np.arange(start, end, dtype=np.int64))
            return Piece(batch, position, start, end, None)
        indexed = batch.append_column(_ROW_INDEX, pa.array(np.arange(start, end, dtype=np.int64)))
        kept = indexed.filter(filter)
        offsets = kept.column(_ROW_INDEX).to_numpy()
        out = self._conformed(kept.select(self._output_columns))
        if ids_at is not None:
            out = self._with_ids(out, ids_at, offsets)
        return Piece(out, position, start, end, offsets)

    def _conformed(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` (of the output columns) in the plan's schema: the batches of a file whose field is not
        nullable where another file's is (at any depth) are cast, so that they concatenate with the others'."""
        conform = conformer(batch.schema, self._plan.schema)
        return batch if conform is None else conform(batch)

    def _with_ids(self, batch: pa.RecordBatch, ids_at: tuple[int, int], offsets: npt.NDArray[np.int64]) -> pa.RecordBatch:
        assert self._row_ids is not None
        file_index, first_row = ids_at
        return self._row_ids.attach(batch, file_index, offsets + first_row)


def row_ids_for(plan: Plan, file_base: int = 0) -> RowIds:
    """How the readers of ``plan`` add row ids: files numbered from ``file_base``, rows placed in their file by
    its format (:meth:`~arrowstream._formats.UnitFormat.physical_rows`)."""
    files = plan.files

    def physical(file_index: int, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        footer = files[file_index]
        return unit_format(footer.format).physical_rows(footer, rows)

    return RowIds(files.unit_offsets, files.unit_rows, file_base, physical)
