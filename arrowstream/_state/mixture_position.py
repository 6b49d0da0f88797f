"""A mixture worker state checked against the plan: its counters, each source's share of its rows, and each
source's cursor where its ``taken`` says (as :mod:`arrowstream._state.position` checks a dataset's state).

Pure, and O(1) in the parts of an epoch (an epoch of a tiny source may have millions): a source's cursor is
checked against the one part it names, found by arithmetic (:class:`~arrowstream._mixing.parts.Parts`).

A slot reads a part of a source through the pipeline (interleaved lanes, shuffle windows) from its start, or,
in an epoch re-planned for another topology, from where an old slot stood in a shuffle window. A mixture has
no filter, so where that pipeline stands after ``n`` rows of the part is a function of row counts alone
(:func:`part_cursor`): a state whose cursor is anything else would resume at other rows than its ``taken``
counts, and is refused. The rows of each source after each batch follow from the batch sizes
(:func:`~arrowstream._mixing.quotas.shares_after`, replayed from the last batch where every share is whole).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._core.cursor import Cursor
from .._core.fields import REMEDY
from .._core.order import natural_batches, rows_yielded
from .._mixing.quotas import shares_after
from ..errors import StateError
from .mixture import MixWorkerState, SourceCursor
from .position import cursor_at

if TYPE_CHECKING:
    from .._mixing.parts import Part, Parts

SHARES_REPLAYED = 1024
"""Batches of a slot whose shares are replayed to check a state's rows of each source exactly; a state further
from the last batch where every share is whole (quotas that share no factor with the slot's rows) is held to
within one row of each source's proportion."""

_FIELDS = ("lanes", "next_split_index", "turn_index", "block_offset", "window_index", "window_offset", "replay_index",
           "replay_offset")


def refuse(where: str, what: str) -> StateError:
    """A ``StateError`` for a field of a mixture worker state (``where``: which, as "<the state>'s <field>") that is
    no position its epoch reaches."""
    return StateError(f"the {where} {what}: not a position its epoch reaches, so resuming from it would lose or "
                      f"repeat rows; {REMEDY}")


def _with_window(stream: Cursor, window_index: int, window_offset: int) -> Cursor:
    return Cursor(stream.lanes, stream.next_split_index, stream.turn_index, stream.block_offset, window_index,
                  window_offset)


def _rows_before(start: Cursor, split_rows: Sequence[int]) -> int:
    """Rows of the stream before ``start``'s lanes (where its window starts)."""
    return sum(split_rows[:start.next_split_index]) - sum(split_rows[p] - o for p, o in start.lanes)


def part_cursor(part: Part, rows: int, *, interleave: int, block_size: int | None, buffer_rows: int) -> Cursor:
    """The pipeline's cursor once the first ``rows`` rows of ``part`` are handed out (0: where it opens), as
    :class:`~arrowstream._core.stream.RunQueue` reports it: past the last row handed out, a lane that ran dry not yet
    moved on; with a shuffle buffer, where the window starts and the rows of it handed out (at a window's last
    row: where the next one starts)."""
    split_rows = [split.num_rows for split in part.splits]
    start = part.start
    if rows == 0:
        return Cursor.start(len(split_rows), interleave) if start is None else start
    if start is None:
        if not buffer_rows:
            return cursor_at(split_rows, interleave, block_size, rows)
        window = (rows - 1) // buffer_rows
        first, handed = window * buffer_rows, rows - window * buffer_rows   # rows before the window, of it
    else:   # the rest of an old slot's shuffle window (an epoch re-planned for another topology)
        window, first, handed = start.window_index, _rows_before(start, split_rows), start.window_offset + rows
    size = min(buffer_rows, sum(split_rows) - first)
    if handed < size:
        begin = start if start is not None else cursor_at(split_rows, interleave, block_size, first)
        return _with_window(begin, window, handed)
    return _with_window(cursor_at(split_rows, interleave, block_size, first + size), window + 1, 0)


def _differences(found: Cursor, expected: Cursor) -> str:
    """The fields where ``found`` is not ``expected``, as 'field saved (expected ...)'."""
    out = []
    for field in _FIELDS:
        a, b = getattr(found, field), getattr(expected, field)
        if a != b:
            show = (lambda v: [list(lane) for lane in v]) if field == "lanes" else (lambda v: v)
            out.append(f"{field} {show(a)} where the stream stands at {show(b)}")
    return ", ".join(out)


def check_source_cursor(cursor: SourceCursor, parts: Parts, *, interleave: int, block_size: int | None,
                        buffer_rows: int, where: str) -> None:
    """Refuse ``cursor`` unless it stands where its ``taken`` says in the slot's ``parts`` of the source: in part
    ``segment``, after ``taken - parts.rows_before(segment)`` rows of it, at the pipeline's cursor there (null:
    none of the part handed out yet)."""
    count = len(parts)
    if cursor.segment > count:
        raise refuse(f"{where}.segment", f"is {cursor.segment}, but the slot reads {count} part(s) of the source")
    before = parts.rows_before(cursor.segment)
    inside = parts.rows_before(cursor.segment + 1) - before if cursor.segment < count else 0
    handed = cursor.taken - before
    if not 0 <= handed <= inside:
        raise refuse(where, f"stands in part {cursor.segment} of {count} (rows {before} to {before + inside} of "
                                 f"the slot's) with taken={cursor.taken}")
    if cursor.cursor is None:
        if handed:
            raise refuse(f"{where}.cursor", f"is null (the first row of part {cursor.segment}), but taken="
                                            f"{cursor.taken} says {handed} row(s) of that part were handed out")
        return
    if cursor.segment == count:
        raise refuse(f"{where}.cursor", f"is not null past the slot's last part of the source (part {cursor.segment})")
    expected = part_cursor(parts[cursor.segment], handed, interleave=interleave, block_size=block_size,
                           buffer_rows=buffer_rows)
    if cursor.cursor != expected:
        raise refuse(f"{where}.cursor", f"has {_differences(cursor.cursor, expected)}, after {handed} of the "
                                        f"{inside} row(s) of part {cursor.segment} that taken={cursor.taken} says")


def _ideal_period(quotas: Sequence[int]) -> int:
    """The least rows at which every source's share of a slot's rows is whole (then a slot's rows of each
    source are exactly their share, whatever the batches before)."""
    total = sum(quotas)
    return math.lcm(*(total // math.gcd(total, quota) for quota in quotas))


def shares_at(quotas: Sequence[int], batch_size: int, batches: int) -> list[int] | None:
    """A slot's rows of each source after its first ``batches`` batches (of ``batch_size`` rows, the last one
    short at the end of its quotas), as its stream takes them (:func:`~arrowstream._mixing.quotas.shares_after`,
    replayed from the last batch where every share is whole); None when that is more than
    :data:`SHARES_REPLAYED` batches back."""
    total = sum(quotas)
    if total == 0:
        return [0] * len(quotas)
    period = _ideal_period(quotas)
    every = period // math.gcd(period, batch_size)   # batches between two points where every share is whole
    whole = batches - batches % every
    if batches - whole > SHARES_REPLAYED:
        return None
    rows = min(whole * batch_size, total)
    taken = [rows * quota // total for quota in quotas]
    for batch in range(whole + 1, batches + 1):
        taken = shares_after(taken, quotas, min(batch * batch_size, total))
    return taken


def final_counters(rows: int, limit: int | None, *, batch_size: int, drop_last: bool) -> tuple[int, int, int]:
    """``(rows, batches, rows_dropped)`` of a slot with ``rows`` rows in its epoch once its stream is done, as
    :class:`~arrowstream._mixing.stream.MixStream` counts them: ``limit`` is its batches under ``even_batches``
    (None: without; the rows it trims are not counted as dropped), else ``drop_last`` drops a short last batch."""
    natural = natural_batches(rows, batch_size, drop_last)
    batches = natural if limit is None else min(limit, natural)
    given = rows_yielded(rows, batches, batch_size, drop_last)
    return given, batches, rows - given if drop_last and limit is None else 0


def check_counters(state: MixWorkerState, names: Sequence[str], quotas: Sequence[int], limit: int | None, *,
                   batch_size: int, drop_last: bool, where: str) -> None:
    """Refuse the counters of ``state`` (inside its epoch) unless they are those of a slot with ``quotas`` rows of
    the sources ``names`` (in the mixture's order) after some of its batches: ``limit`` is its batches under
    ``even_batches`` (None: without)."""
    total = sum(quotas)
    most = natural_batches(total, batch_size, drop_last) if limit is None else limit
    if state.batches > most:
        raise refuse(f"{where}'s batches", f"is {state.batches}, but the slot yields {most} batch(es) of {batch_size} "
                                           f"in its epoch ({total} row(s))")
    if state.rows != min(state.batches * batch_size, total):
        raise refuse(f"{where}'s rows", f"is {state.rows}, but {state.batches} batch(es) of {batch_size} of the slot's "
                                        f"{total} row(s) hold {min(state.batches * batch_size, total)}")
    if state.rows_dropped:
        raise refuse(f"{where}'s rows_dropped", f"is {state.rows_dropped} inside the epoch (drop_last drops rows only "
                                                "when the epoch ends)")
    taken = [state.cursors[name].taken for name in names]
    shares = shares_at(quotas, batch_size, state.batches)
    for name, quota, had, share in zip(names, quotas, taken, shares or taken, strict=True):
        ideal = state.rows * quota / total if total else 0
        if had > quota or had != share or abs(had - ideal) >= 1 + 1e-9 * total:
            exact = f"takes {share}" if shares is not None else f"takes {ideal:.1f} (within one row)"
            raise refuse(f"{where}'s sources.{name}.taken", f"is {had}, but after {state.batches} batch(es) the slot "
                                                            f"{exact} of its {quota} row(s) of the source")
    if sum(taken) != state.rows:
        raise refuse(f"{where}'s sources", f"take {sum(taken)} row(s) together, but the slot handed out {state.rows}")
