"""Where CSV and JSON Lines rows start, from the bytes alone (numpy only; no parsing, no I/O).

A row ends at a line break (``\\n``) outside quotes. With a quote character (CSV, RFC 4180), a quote opens
or closes a quoted field and a doubled quote inside one is a quote: both flip the quote parity, so
counting quotes before a line break tells whether it is inside a field. A ``\\r`` before the ``\\n`` is
part of the row (pyarrow strips it); a lone ``\\r`` is no line break. Bytes are fed block by block, so
a quoted field, a row, or a ``\\r\\n`` may span blocks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from ._text_settings import TextSettings


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
        self.quoted_newlines = False

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
        if self._quote is not None:
            quotes = np.flatnonzero(arr == self._quote)
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


def scan_units(blocks: Iterator[bytes], settings: TextSettings, unit_bytes: int,
               ) -> tuple[list[tuple[int, int, int]], int, bool]:
    """(first row start, rows, line breaks before it) per non-empty unit, the stream's size, and whether
    quoted line breaks were seen. Rows are bucketed by ``start // unit_bytes``."""
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
    return [tuple(units[k]) for k in sorted(units)], size, scanner.quoted_newlines  # type: ignore[misc]
