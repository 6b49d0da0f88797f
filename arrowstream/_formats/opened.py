"""The check a worker makes when it opens a planned file: is the file's own metadata the one the plan holds?

A plan (read from the files, or from a plan cache entry) describes each file by its metadata: units and their rows,
schema, and for Parquet the footer itself (the ``FileMetaData`` handle, whose statistics pruned the row groups a
filter excludes). Size and modification time, which a worker checks before every read, do not tell a file rewritten
with both kept (``cp -p``, ``rsync -t``, a restore from backup, ``os.utime``) from the file that was planned. So a
worker also compares what it opens with what the plan holds: where the format's reader reads the file's metadata
anyway (ORC, Arrow IPC, a Parquet file without a handle), the schema and the number of units (a Parquet file's row
groups' rows and sizes too; ORC and IPC units' rows are counted as they are read), at no I/O; where the plan hands
the reader a Parquet footer, that footer against the file's own (one read of its tail), which covers the statistics
of the row groups the plan pruned and so never reads; and where a Parquet file without a handle had row groups
pruned, the plan's filter against the file's statistics. The last two are made once per state of a file
(:func:`file_state`) per process (:func:`verified`). A difference is a :class:`MetadataMismatch`, which the split
reader turns into the error naming what the plan came from (``_worker.reader.SplitReader``). Text has no metadata of its
own: the rows of each unit, counted against the scan the plan holds when the unit is parsed, are its check.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import pyarrow as pa

_MAX_REMEMBERED = 1 << 16   # files a process remembers having checked (then it forgets them all and checks again)
_checked: dict[tuple[Any, ...], Any] = {}


class MetadataMismatch(Exception):   # internal: never raised to users (see the module docstring)
    """A file's own metadata is not what the plan holds of it; the argument says what differs. ``fallback``: the
    error for a plan read from the files (by default a ``FileChangedError``), where the mismatch has a cause
    beside a change (a text unit's rows: an unbalanced quote too)."""

    def __init__(self, difference: str, fallback: Exception | None = None) -> None:
        super().__init__(difference)
        self.fallback = fallback


def schema_difference(planned: pa.Schema, now: pa.Schema) -> str:
    """How ``now`` differs from ``planned`` in names, types or nullability ("" where it does not)."""
    if planned.equals(now):
        return ""
    for index, (was, field) in enumerate(zip(planned, now, strict=False)):
        if not was.equals(field):
            return f"column {index} is {_described(was)} in the plan, {_described(field)} in the file"
    return f"{len(planned)} columns in the plan, {len(now)} in the file"


def _described(field: pa.Field) -> str:
    return f"'{field.name}: {field.type}{'' if field.nullable else ' not null'}'"


def units_difference(unit: str, planned: tuple[int, ...] | list[int], now: tuple[int, ...] | list[int]) -> str:
    """How the rows of a file's units ``now`` differ from ``planned`` ("" where they do not)."""
    planned, now = tuple(planned), tuple(now)
    if planned == now:
        return ""
    if len(planned) != len(now):
        return f"{len(planned)} {unit}s of {sum(planned)} rows in the plan, {len(now)} of {sum(now)} in the file"
    index = next(i for i, (a, b) in enumerate(zip(planned, now, strict=True)) if a != b)
    return f"{unit} {index} holds {planned[index]} rows in the plan, {now[index]} in the file"


def file_state(path: str, status: os.stat_result | None = None) -> tuple[str, int, int, int, int]:
    """What tells one state of a local file from another: size, modification time, inode number and inode
    change time (the last two are what ``os.utime`` cannot restore)."""
    status = status if status is not None else os.stat(path)
    return (path, status.st_size, status.st_mtime_ns, status.st_ino, status.st_ctime_ns)


def verified(key: tuple[Any, ...], handle: Any = None) -> bool:
    """Whether this process checked what ``key`` names (a file's state and what was checked of it) before and
    found it as planned; with ``handle``, against that very object (a plan's footer)."""
    if key not in _checked:
        return False
    found = _checked[key]
    return found is None if handle is None else found is not None and found() is handle


def remember(key: tuple[Any, ...], handle: Any = None) -> None:
    """Note that what ``key`` names was found as planned (against ``handle``, held weakly: a footer that is gone
    matches nothing, and an object made later at its address is not taken for it)."""
    if len(_checked) >= _MAX_REMEMBERED:
        _checked.clear()
    _checked[key] = weakref.ref(handle) if handle is not None else None
