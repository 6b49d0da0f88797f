"""Where CSV and JSON Lines rows start, from the bytes alone (numpy only; no parsing, no I/O).

A row ends at a line break (``\\n``) outside quotes. With a quote character (CSV, RFC 4180), a quote opens
or closes a quoted field and a doubled quote inside one is a quote: both flip the quote parity, so
counting quotes before a line break tells whether it is inside a field. A ``\\r`` before the ``\\n`` is
part of the row (pyarrow strips it). A lone ``\\r`` outside quotes is a line break to pyarrow (old Mac
line ends) but not to this scan: the scanner notes it (``lone_cr``), and planning then leaves the rows of
that file to pyarrow (one unit, counted by pyarrow's own parse), so no row is lost to the difference.
Bytes are fed block by block, so a quoted field, a row, or a ``\\r\\n`` may span blocks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from .text_settings import TextSettings


class RowScanner:
    """Where rows start, in a stream of bytes fed block by block (offsets count from the stream's start).

    A row ends at a line break outside quotes; a row that is empty (or only ``\\r``) is no row when
    ``skip_empty``. ``feed`` returns the starts of the rows that ended in the block and the line
    breaks before each start; ``finish`` adds a last row that has no line break.
    """

    def __init__(self, quote: int | None, skip_empty: bool) -> None:
        self._quote, self._skip_empty = quote, skip_empty
        self._in_quote = 0
        self._row_start = 0      # start of the row being read
        self._row_lines = 0      # line breaks before it
        self._pos = 0            # bytes fed
        self._lines = 0          # line breaks fed
        self._last = -1          # the byte before this block
        self._cr_open = False    # the last byte fed is a \r outside quotes (lone unless a \n follows)
        self.quoted_newlines = False
        self.lone_cr = False     # a \r outside quotes, not before a \n: a line break to pyarrow

    def _keep(self, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], arr: npt.NDArray[np.uint8],
              ) -> npt.NDArray[np.bool_]:
        lengths = ends - starts
        if not self._skip_empty:
            return np.ones(len(starts), dtype=bool)
        first = np.full(len(starts), -1, dtype=np.int16)
        inside = (starts >= self._pos) & (starts < self._pos + len(arr))
        first[inside] = arr[starts[inside] - self._pos]
        first[starts == self._pos - 1] = self._last
        empty: npt.NDArray[np.bool_] = (lengths == 0) | ((lengths == 1) & (first == 13))
        return ~empty

    def feed(self, block: bytes) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        arr = np.frombuffer(block, dtype=np.uint8)
        breaks = np.flatnonzero(arr == 10)
        ends = breaks
        quotes = np.flatnonzero(arr == self._quote) if self._quote is not None else breaks[:0]
        if block and not self.lone_cr:
            self._note_lone_cr(arr, quotes)
        if self._quote is not None:
            if quotes.size:
                outside = ((np.searchsorted(quotes, breaks) + self._in_quote) & 1) == 0
                if not outside.all():
                    self.quoted_newlines = True
                ends = breaks[outside]
                self._in_quote ^= quotes.size & 1
            elif self._in_quote:
                self.quoted_newlines = self.quoted_newlines or bool(breaks.size)
                ends = breaks[:0]
        ends_global = ends.astype(np.int64) + self._pos
        starts = np.concatenate(([self._row_start], ends_global[:-1] + 1)).astype(np.int64) if ends.size else \
            np.zeros(0, dtype=np.int64)
        # line breaks before each start: those before the block plus those in it before the start
        lines = np.concatenate(([self._row_lines],
                                self._lines + np.searchsorted(breaks, ends[:-1]) + 1)).astype(np.int64) \
            if ends.size else np.zeros(0, dtype=np.int64)
        keep = self._keep(starts, ends_global, arr) if ends.size else np.zeros(0, dtype=bool)
        if ends.size:
            self._row_start = int(ends_global[-1]) + 1
            self._row_lines = self._lines + int(np.searchsorted(breaks, ends[-1])) + 1
        self._pos += len(block)
        self._lines += int(breaks.size)
        if block:
            self._last = block[-1]
        return starts[keep], lines[keep]

    def _note_lone_cr(self, arr: npt.NDArray[np.uint8], quotes: npt.NDArray[np.intp]) -> None:
        """Set ``lone_cr`` if the block (with the byte before it) has a ``\\r`` outside quotes and no ``\\n`` after it."""
        if self._cr_open and arr[0] != 10:
            self.lone_cr = True
            return
        crs = np.flatnonzero(arr == 13)
        if not crs.size:
            self._cr_open = False
            return
        if quotes.size:
            crs = crs[((np.searchsorted(quotes, crs) + self._in_quote) & 1) == 0]
        elif self._in_quote:
            crs = crs[:0]
        inner = crs[crs < len(arr) - 1]
        if inner.size and bool((arr[inner + 1] != 10).any()):
            self.lone_cr = True
        # a \r that ends the block is lone unless the next block starts with \n (at the stream's end it
        # ends the last row, as pyarrow ends it too: no difference)
        self._cr_open = bool(crs.size) and int(crs[-1]) == len(arr) - 1

    def finish(self, tail: bytes) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The last row when the stream does not end with a line break (``tail``: its bytes)."""
        rest = tail.strip(b"\r") if self._skip_empty else tail
        if self._row_start < self._pos and rest:
            return np.array([self._row_start], dtype=np.int64), np.array([self._row_lines], dtype=np.int64)
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)

    @property
    def row_start(self) -> int:
        return self._row_start


def row_starts(data: bytes, settings: TextSettings) -> npt.NDArray[np.int64]:
    """Starts of the rows of ``data`` (which starts at a row start), from a fresh scan."""
    scanner = RowScanner(settings.quote, settings.skip_empty)
    starts, _ = scanner.feed(data)
    last, _ = scanner.finish(data[scanner.row_start:])
    return np.concatenate((starts, last))


class Scan(NamedTuple):
    """What :func:`scan_units` found in a stream."""

    units: list[tuple[int, int, int]]   # (first row start, rows, line breaks before it) per non-empty unit
    size: int                           # the stream's bytes
    quoted_newlines: bool               # a quoted field holds a line break
    lone_cr: bool                       # a \r outside quotes ends a line for pyarrow but not for this scan


def scan_units(blocks: Iterator[bytes], settings: TextSettings, unit_bytes: int) -> Scan:
    """(first row start, rows, line breaks before it) per non-empty unit, the stream's size, whether
    quoted line breaks were seen and whether a lone ``\\r`` was. Rows are bucketed by ``start // unit_bytes``."""
    scanner = RowScanner(settings.quote, settings.skip_empty)
    skip = settings.leading_rows
    units: dict[int, list[int]] = {}

    def add(starts: npt.NDArray[np.int64], lines: npt.NDArray[np.int64]) -> None:
        nonlocal skip
        if skip:
            drop = min(skip, len(starts))
            starts, lines, skip = starts[drop:], lines[drop:], skip - drop
        if not len(starts):
            return
        buckets = starts // unit_bytes
        keys, first, counts = np.unique(buckets, return_index=True, return_counts=True)
        for key, at, count in zip(keys.tolist(), first.tolist(), counts.tolist(), strict=True):
            if key in units:
                units[key][1] += count
            else:
                units[key] = [int(starts[at]), count, int(lines[at])]

    size = 0
    pending = b""                                   # the bytes of the row still open
    for block in blocks:
        add(*scanner.feed(block))
        size += len(block)
        open_bytes = size - scanner.row_start
        pending = block[len(block) - open_bytes:] if open_bytes <= len(block) else pending + block
    add(*scanner.finish(pending))
    return Scan([tuple(units[k]) for k in sorted(units)], size,  # type: ignore[misc]
                scanner.quoted_newlines, scanner.lone_cr)
