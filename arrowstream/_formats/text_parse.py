"""Parsing stretches of whole CSV or JSON Lines rows with known names and types, and rows that do not parse:
found by bisection, named by file, line and byte offset, or skipped (``bad_rows="skip"``) as gaps."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from ..errors import MalformedRowError
from .opened import MetadataMismatch
from .rowscan import row_starts
from .text_settings import TextSettings

logger = logging.getLogger("arrowstream")

ROW_OK = "__arrowstream_row_ok"   # a column of the tables parse_unit returns with gaps: False for a skipped row


def owned(data: bytes) -> pa.Buffer:
    """``data`` copied into memory Arrow owns. A buffer over Python bytes, handed to pyarrow's parser threads,
    may be released by one of them while Python shuts down, which aborts the process."""
    out = pa.BufferOutputStream()
    out.write(data)
    return out.getvalue()


def parse_rows(data: bytes, settings: TextSettings, names: Sequence[str], schema: pa.Schema,
               include: list[str] | None, use_threads: bool, newlines: bool) -> pa.Table:
    """Parse headerless data rows with fixed names and types."""
    if settings.kind == "csv":
        read, parse, convert = settings.csv_options(list(names), schema, include, use_threads, newlines)
        read.block_size = max(read.block_size, min(len(data) + 1, 64 << 20)) if newlines else read.block_size
        return pa_csv.read_csv(owned(data), read_options=read, parse_options=parse, convert_options=convert)
    try:
        read_json, parse_json = settings.json_options(schema, use_threads)
        table = pa_json.read_json(owned(data), read_options=read_json, parse_options=parse_json)
    except pa.ArrowInvalid as exc:
        if "straddl" not in str(exc):
            raise
        read_json, parse_json = settings.json_options(schema, use_threads, block_size=len(data) + 1)
        table = pa_json.read_json(owned(data), read_options=read_json, parse_options=parse_json)
    return check_utf8(table.select(include) if include is not None else table)


def _holds_strings(data_type: pa.DataType) -> bool:
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type) or pa.types.is_string_view(data_type):
        return True
    return any(_holds_strings(data_type.field(i).type) for i in range(data_type.num_fields))


def check_utf8(table: pa.Table) -> pa.Table:
    """``table``, its string columns checked for UTF-8: pyarrow's JSON reader keeps bytes that are not UTF-8
    in string columns (its CSV reader checks them), which would fail later, naming no row."""
    for name, column in zip(table.column_names, table.columns, strict=True):
        if _holds_strings(column.type):
            try:
                column.validate(full=True)
            except pa.ArrowInvalid:
                raise pa.ArrowInvalid(f"column {name!r}: invalid UTF8 data (bytes that are not UTF-8 in a string)"
                                      ) from None
    return table


def _bad_rows(parse: Callable[[bytes], pa.Table], data: bytes, starts: npt.NDArray[np.int64], first_only: bool,
              ) -> list[tuple[int, str]]:
    """(row index, pyarrow's message) of the rows of ``data`` that do not parse, by bisection."""
    bounds = [*starts.tolist(), len(data)]
    bad: list[tuple[int, str]] = []

    def probe(lo: int, hi: int) -> None:
        if (first_only and bad) or hi <= lo:
            return
        try:
            table = parse(data[bounds[lo]:bounds[hi]])
            if table.num_rows == hi - lo:
                return
            message = f"parsed into {table.num_rows} rows instead of {hi - lo}"
        except (pa.ArrowInvalid, ValueError) as exc:
            message = str(exc).splitlines()[0]
        if hi - lo == 1:
            bad.append((lo, message))
            return
        mid = (lo + hi) // 2
        probe(lo, mid)
        probe(mid, hi)

    probe(0, len(starts))
    return bad


def locate_bad_rows(parse: Callable[[bytes], pa.Table], data: bytes, starts: npt.NDArray[np.int64],
                    settings: TextSettings, url: str, first_line: int, byte_start: int,
                    ) -> list[tuple[int, int, int, str]]:
    """(row index, line, byte offset, pyarrow's message) of the rows of ``data`` that do not parse; raises
    :class:`MalformedRowError` for the first one unless ``bad_rows`` is ``"skip"``."""
    bad = _bad_rows(parse, data, starts, first_only=settings.bad_rows == "error")
    if not bad:   # each row parses alone, not all together: pyarrow splits rows differently than the scan
        raise MalformedRowError(
            f"{url}: bytes [{byte_start}, {byte_start + len(data)}) do not parse together although each row does "
            "alone (a quote character inside an unquoted field? pass parse_options={'quote_char': False} if the "
            "file does not quote fields; or rows of different types: set parse_options={'column_types': ...})")
    where = [(row, first_line + data[:int(starts[row])].count(b"\n") + 1, byte_start + int(starts[row]), msg)
             for row, msg in bad]
    if settings.bad_rows == "error":
        _, line, offset, message = where[0]
        label = "CSV" if settings.kind == "csv" else "JSON"
        if "invalid utf8" in message.lower():
            encoding = "pass parse_options={'encoding': ...} if the file has another encoding, or " \
                if settings.kind == "csv" else ""
            hint = (f"the row holds bytes that are not UTF-8: {encoding}name the column in "
                    "parse_options={'column_types': {...: 'binary'}} to read it as bytes; else fix the row")
        elif message.startswith("parsed into") and settings.kind == "csv":
            hint = ("a quote character inside an unquoted field? pass parse_options={'quote_char': False} if fields "
                    "are never quoted; or fix the row")
        elif "conversion error" in message or "changed from" in message:
            hint = ("if the column's type inferred from the first MiB is too narrow, set it with "
                    "parse_options={'column_types': {...}}; else fix the row")
        else:
            hint = "fix the row"
        raise MalformedRowError(
            f"{url}: line {line} (byte {offset}) is not a valid {label} row: {message}; {hint}, or pass "
            "parse_options={'bad_rows': 'skip'} to skip rows that do not parse (each is logged)")
    return where


def parse_unit(parse: Callable[[bytes], pa.Table], data: bytes, expected: int, settings: TextSettings,
               schema: pa.Schema, include: list[str], url: str, first_line: int, byte_start: int) -> pa.Table:
    """The ``expected`` rows of ``data`` (starting at a row start, at ``byte_start`` of ``url`` after
    ``first_line`` line breaks), by ``parse``; a row that does not parse is an error, or with
    ``bad_rows="skip"`` a logged gap: a null row, ``False`` in the extra column :data:`ROW_OK`.
    ``schema`` and ``include``: the columns parsed (for a unit whose rows are all skipped)."""
    try:
        table = parse(data)
        if table.num_rows == expected:
            return table
    except (pa.ArrowInvalid, ValueError):
        pass
    starts = row_starts(data, settings)
    if len(starts) != expected:
        raise MetadataMismatch(
            f"bytes [{byte_start}, {byte_start + len(data)}) hold {len(starts)} rows by themselves, {expected} in the "
            "scan of the whole file", fallback=MalformedRowError(
                f"{url}: bytes [{byte_start}, {byte_start + len(data)}) hold {len(starts)} rows by themselves but "
                f"{expected} in the planning scan of the whole file: the file changed since planning (rebuild the "
                "dataset), or a quote character before them is unbalanced (a quote inside an unquoted field: pass "
                "parse_options={'quote_char': False} if fields are never quoted)"))
    where = locate_bad_rows(parse, data, starts, settings, url, first_line, byte_start)
    label = "CSV" if settings.kind == "csv" else "JSON"
    for _, line, offset, message in where:
        logger.warning("skipped a bad %s row of %s at line %d (byte %d): %s", label, url, line, offset, message)
    rows = np.ones(len(starts), dtype=bool)
    rows[[row for row, _, _, _ in where]] = False
    bounds = [*starts.tolist(), len(data)]
    good = b"".join(data[bounds[i]:bounds[i + 1]] for i in np.flatnonzero(rows).tolist())
    table = parse(good) if good else schema.empty_table().select(include)
    index = np.full(len(starts), -1, dtype=np.int64)
    index[rows] = np.arange(int(rows.sum()))
    taken = table.take(pa.array(index, mask=~rows))
    return taken.append_column(ROW_OK, pa.array(rows))
