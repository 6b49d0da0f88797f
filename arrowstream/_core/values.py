"""Values that an output format cannot hold: found where a batch is read, named by column and file.

Python's ``datetime``, ``time`` and ``timedelta`` have microsecond resolution and a limited range
(years 1 to 9999, +-999,999,999 days). A column whose values become Python objects (every column
of a ``dict`` batch; nested and other non-numeric columns of ``torch``/``numpy`` batches) is
converted as microseconds, pandas or not, and a value that a Python object cannot hold raises a
:class:`~arrowstream.errors.ConversionError` instead of Arrow's raw error. The reader checks each
piece it reads (vectorized: a cast and a min/max per temporal column), so the error names the file;
schemas without such columns cost nothing.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ConversionError

# types pyarrow reads and writes (Arrow IPC) but has no Python array class for: a column of them
# cannot even be looked at from Python, only passed on inside a record batch
NO_PYTHON_CLASS = frozenset({pa.lib.Type_INTERVAL_MONTHS, pa.lib.Type_INTERVAL_DAY_TIME})

Check = Callable[[pa.RecordBatch, str], None]


class GcPaused:
    """Pause the cyclic garbage collector while Python objects are made in bulk.

    Converting a column to Python objects allocates one container per row; in a process that
    imported torch, the collector then runs every few hundred allocations over a large heap.
    Measured on a list<float> column of 8,192 rows: 10.7 ms with the collector, 0.75 ms without.
    """

    def __enter__(self) -> None:
        self._enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._enabled:
            gc.enable()


def children(t: pa.DataType) -> list[pa.DataType]:
    """The types nested directly in ``t`` (list items, struct fields, map entries, union members,
    dictionary values, extension storage)."""
    if isinstance(t, pa.ExtensionType):
        return [t.storage_type]
    if pa.types.is_dictionary(t):
        return [t.value_type]
    return [t.field(i).type for i in range(t.num_fields)]


def contains(t: pa.DataType, test: Callable[[pa.DataType], bool]) -> bool:
    return test(t) or any(contains(child, test) for child in children(t))


def has_no_python_class(t: pa.DataType) -> bool:
    return contains(t, lambda x: x.id in NO_PYTHON_CLASS)


def _is_python_temporal(t: pa.DataType) -> bool:
    """Timestamps, dates, times and durations: the types whose Python objects have limits."""
    return bool(pa.types.is_temporal(t) and not pa.types.is_interval(t))


def python_type(t: pa.DataType) -> pa.DataType:
    """``t`` with nanosecond units made microseconds (what Python objects hold), nested too."""
    if pa.types.is_timestamp(t) and t.unit == "ns":
        return pa.timestamp("us", t.tz)
    if pa.types.is_time64(t) and t.unit == "ns":
        return pa.time64("us")
    if pa.types.is_duration(t) and t.unit == "ns":
        return pa.duration("us")
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(python_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(python_type(t.key_type)),
                       t.item_field.with_type(python_type(t.item_type)), t.keys_sorted)
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(python_type(t.value_type)), t.list_size)
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(python_type(t.value_type)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(python_type(t.value_type)))
    return t   # other nested types (views, unions, dictionaries) are not cast: Arrow has no such cast


def _finer_than_micros(column: pa.Array, name: str, url: str) -> ConversionError:
    where = f"{url}: column" if url else "column"
    return ConversionError(
        f"{where} {name!r} ({column.type}) holds values finer than microseconds, which Python objects "
        f"(datetime, time, timedelta) cannot hold; use output_format='numpy' or 'torch' (nanoseconds kept) "
        f"or 'arrow', or leave the column out with columns=[...]")


def _out_of_range(column: pa.Array, name: str, url: str, exc: BaseException) -> ConversionError:
    where = f"{url}: column" if url else "column"
    return ConversionError(
        f"{where} {name!r} ({column.type}) holds a value that no Python object can hold (datetime, date, "
        f"time and timedelta hold microseconds of years 1 to 9999; {type(exc).__name__}: {exc}); use "
        "output_format='numpy' or 'torch' (values in the column's unit) or 'arrow', or leave the column "
        "out with columns=[...]")


def no_python_class(t: pa.DataType, name: str, url: str) -> ConversionError:
    where = f"{url}: column" if url else "column"
    return ConversionError(
        f"{where} {name!r} is {t}, a type pyarrow cannot convert to Python or NumPy values; "
        "use output_format='arrow' (with num_workers=0) or leave the column out with columns=[...]")


def _in_python_units(column: pa.Array, name: str, url: str) -> pa.Array:
    """``column`` cast to the units Python objects hold; a ``ConversionError`` naming the column and file
    for a type without Python class or a value finer than a microsecond."""
    if has_no_python_class(column.type):
        raise no_python_class(column.type, name, url)
    target = python_type(column.type)
    if target == column.type:
        return column
    try:
        return column.cast(target, safe=True)
    except pa.ArrowInvalid:
        raise _finer_than_micros(column, name, url) from None


def to_objects(column: pa.Array, name: str, url: str = "") -> list[Any]:
    """The column as Python objects (Arrow's ``to_pylist``), nanoseconds as whole microseconds."""
    column = _in_python_units(column, name, url)
    try:
        with GcPaused():
            return list(column.to_pylist())
    except (ValueError, OverflowError, TypeError, KeyError, pa.ArrowException) as exc:
        raise _out_of_range(column, name, url, exc) from None


def _temporal_leaves(array: pa.Array) -> Iterator[pa.Array]:
    """The arrays of timestamps, dates, times and durations inside ``array`` (its rows only)."""
    t = array.type
    if _is_python_temporal(t):
        yield array
    elif isinstance(array, pa.ExtensionArray):
        yield from _temporal_leaves(array.storage)
    elif pa.types.is_dictionary(t):
        yield from _temporal_leaves(array.dictionary_decode())
    elif pa.types.is_struct(t):
        for child in array.flatten():
            yield from _temporal_leaves(child)
    elif (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
          or pa.types.is_map(t)):
        yield from _temporal_leaves(array.flatten())



_LEAF_CONTAINERS = (pa.types.is_struct, pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list,
                    pa.types.is_map, pa.types.is_dictionary)


def _leaves_found(t: pa.DataType) -> bool:
    """Whether :func:`_temporal_leaves` reaches every temporal value of type ``t`` (not inside
    views, unions or run-end encoding)."""
    if _is_python_temporal(t) or not contains(t, _is_python_temporal):
        return True
    if isinstance(t, pa.ExtensionType) or any(test(t) for test in _LEAF_CONTAINERS):
        return all(_leaves_found(child) for child in children(t))
    return False


def check_objects(column: pa.Array, name: str, url: str) -> None:
    """Raise what :func:`to_objects` would raise, vectorized: a cast and a min/max per leaf."""
    column = _in_python_units(column, name, url)
    if not _leaves_found(column.type):  # rare: convert the piece itself, to name the file
        to_objects(column, name, url)
        return
    for leaf in _temporal_leaves(column):
        if leaf.null_count == len(leaf):
            continue
        # min and max of the integers (Arrow has no min_max kernel for durations) as Python objects
        width = pa.int32() if pa.types.is_date32(leaf.type) or pa.types.is_time32(leaf.type) else pa.int64()
        extremes = pc.min_max(leaf.view(width))
        try:
            pa.array([extremes["min"].as_py(), extremes["max"].as_py()], width).view(leaf.type).to_pylist()
        except (ValueError, OverflowError) as exc:
            raise _out_of_range(column, name, url, exc) from None


def needs_object_check(t: pa.DataType) -> bool:
    """Whether Python objects of ``t`` can fail to hold its values."""
    return contains(t, lambda x: _is_python_temporal(x) or x.id in NO_PYTHON_CLASS)
