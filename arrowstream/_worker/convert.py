"""Output conversion: one Arrow record batch to the user's batch type, one call per column.

| output_format | numeric and bool columns | temporal columns | fixed-size lists of numbers | other columns |
| --- | --- | --- | --- | --- |
| ``torch`` | 1-D tensor (zero-copy without nulls) | 1-D int64 tensor in the column's unit | 2-D tensor | Python list |
| ``numpy`` | 1-D ndarray (zero-copy without nulls) | ``datetime64``/``timedelta64`` of the column's unit | 2-D ndarray | Python list |
| ``arrow`` | the ``pyarrow.RecordBatch`` itself, every type, zero-copy | | | |
| ``dict`` | Python lists, ``None`` for nulls | | | |

Temporal columns are timestamps (any unit, UTC values when there is a time zone), dates (days for
date32, milliseconds for date64), times of day (since midnight) and durations; a month_day_nano
interval is a structured ndarray (months, days, nanoseconds) or an (n, 3) int64 tensor. Dictionary
columns follow the rule of their values. Python objects hold microseconds (see :mod:`._values`).
docs/formats.md has the table of every type.

Null policy: a null in a numeric, bool, temporal or fixed-size-list column of a ``torch``/``numpy``
batch raises :class:`~arrowstream.errors.NullValueError` naming the column, unless
``fill_nulls`` gives a value for it (a dict by column, or one value for every number column it suits).
No null ever becomes an arbitrary number. The reader checks each piece first (:func:`make_value_check`),
so the errors name the file too.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._core.values import (
    check_objects,
    has_no_python_class,
    needs_object_check,
    no_python_class,
    to_objects,
)
from ..errors import InvalidArgumentError, NullValueError

if TYPE_CHECKING:
    from .batch_types import DictBatch, TorchBatch

__all__ = ["check_output_columns", "column_kind", "compact", "compact_array",
           "finish_objects", "make_converter", "make_value_check", "passthrough_collate", "resolve_fill_nulls",
           "to_pydict_quietly"]

Converter = Callable[[pa.RecordBatch], Any]

_MONTH_DAY_NANO = np.dtype([("months", "<i4"), ("days", "<i4"), ("nanoseconds", "<i8")])


def _is_number(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


def _is_temporal(t: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t)
                or pa.types.is_duration(t))


def column_kind(t: pa.DataType) -> str:
    """How a column of type ``t`` becomes a ``torch``/``numpy`` value: ``"array"`` (1-D numbers),
    ``"temporal"`` (1-D, in the column's unit), ``"interval"`` (month_day_nano), ``"matrix"``
    (fixed-size list of numbers), ``"list"`` (Python objects) or ``"none"`` (pyarrow has no Python
    class for it). A dictionary column has the kind of its values."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if _is_number(t):
        return "array"
    if _is_temporal(t):
        return "temporal"
    if pa.types.is_interval(t) and t.id == pa.lib.Type_INTERVAL_MONTH_DAY_NANO:
        return "interval"
    if pa.types.is_fixed_size_list(t) and _is_number(t.value_type):
        return "matrix"
    if has_no_python_class(t):
        return "none"
    return "list"


def _fill_type(t: pa.DataType, kind: str) -> pa.DataType:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return t.value_type if kind == "matrix" else t


def _accepts(value_type: pa.DataType, value: Any) -> bool:
    if pa.types.is_boolean(value_type):
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return bool(pa.types.is_floating(value_type)) or isinstance(value, int)


def resolve_fill_nulls(fill_nulls: Any, schema: pa.Schema) -> dict[str, Any]:
    """Fill value by column, checked against the column types before any worker starts.

    A dict names its columns, and each value must suit its column (an int for int columns and
    for temporal columns, in the column's unit; a bool for bool columns). A single value fills
    every number column it suits: ``0`` the int and float columns, ``float("nan")`` the float
    columns, ``False`` the bool columns.
    """
    if fill_nulls is None:
        return {}
    resolved: dict[str, Any] = {}
    if not isinstance(fill_nulls, Mapping):
        for name in schema.names:
            field_type = schema.field(name).type
            kind = column_kind(field_type)
            if kind in ("array", "matrix") and _accepts(_fill_type(field_type, kind), fill_nulls):
                resolved[name] = fill_nulls
        return resolved
    unknown = [name for name in fill_nulls if name not in schema.names]
    if unknown:
        raise InvalidArgumentError(f"fill_nulls: {unknown} are not output columns; the columns are {schema.names}")
    for name, value in fill_nulls.items():
        field_type = schema.field(name).type
        kind = column_kind(field_type)
        if kind not in ("array", "matrix", "temporal"):
            raise InvalidArgumentError(f"fill_nulls: column {name!r} is {field_type}; fill values apply to "
                                       "numeric, bool, temporal and fixed-size-list columns (others keep None)")
        value_type = _fill_type(field_type, kind)
        if not _accepts(value_type, value):
            hint = ("an int (a float would be truncated)" if pa.types.is_integer(value_type)
                    else "an int in the column's unit" if kind == "temporal" else "a value of its type")
            raise InvalidArgumentError(f"fill_nulls: column {name!r} is {field_type}, got {value!r}; give {hint}")
        try:
            pa.scalar(value, type=value_type)
        except (pa.ArrowException, OverflowError) as exc:
            raise InvalidArgumentError(f"fill_nulls: {value!r} does not fit column {name!r} ({field_type}): {exc}") from None
        resolved[name] = value
    return resolved


def check_output_columns(output_format: str, schema: pa.Schema) -> None:
    """Refuse repeated column names where the batch is a dict by name (every format but ``arrow``)."""
    repeated = sorted(name for name, count in Counter(schema.names).items() if count > 1)
    if repeated and output_format != "arrow":
        others = [name for name in schema.names if name not in repeated]
        raise InvalidArgumentError(
            f"output_format={output_format!r}: the columns {repeated} appear more than once in the files, "
            f"and a {output_format} batch holds one value per name; pass columns={others} to leave them out, "
            "or use output_format='arrow', which keeps every column")


def _null_error(name: str, count: int, url: str) -> NullValueError:
    where = f"{url}: column" if url else "column"
    return NullValueError(
        f"{where} {name!r} has {count} null(s) in this batch and cannot become a "
        f"tensor; pass fill_nulls={{{name!r}: value}} (or fill_nulls=value for all number columns), "
        f"drop the rows with filter=pc.field({name!r}).is_valid(), or use output_format='arrow'")


def _nulls(column: pa.Array) -> int:
    """Nulls of a column, counting those inside the values of a fixed-size list."""
    count = column.null_count
    if pa.types.is_fixed_size_list(column.type):
        count += column.flatten().null_count
    return int(count)


def _no_nulls(column: pa.Array, name: str, fill: Any) -> pa.Array:
    if column.null_count == 0:
        return column
    if fill is not None and pa.types.is_fixed_size_list(column.type):
        return pc.fill_null(column, pa.scalar([fill] * column.type.list_size, type=column.type))
    if fill is None:
        raise _null_error(name, column.null_count, "")
    return pc.fill_null(column, pa.scalar(fill, type=column.type))


def make_value_check(output_format: str, schema: pa.Schema,
                     fill_nulls: Mapping[str, Any] | None = None) -> Callable[[pa.RecordBatch, str], None] | None:
    """A check of each batch as read, before conversion, whose errors name the file (the reader
    passes its URL): nulls that ``torch``/``numpy`` would refuse, values Python objects cannot
    hold, types pyarrow cannot convert. None when no column of ``schema`` needs it."""
    if output_format == "arrow":
        return None
    fills = fill_nulls or {}
    nulls, objects = [], []
    for i, fld in enumerate(schema):
        kind = "list" if output_format == "dict" else column_kind(fld.type)
        if kind in ("list", "none") and needs_object_check(fld.type):
            objects.append((i, fld.name))
        elif kind in ("array", "temporal", "interval", "matrix") and fills.get(fld.name) is None:
            nulls.append((i, fld.name))
    if not nulls and not objects:
        return None

    def check(batch: pa.RecordBatch, url: str) -> None:
        for i, name in nulls:
            count = _nulls(batch.column(i))
            if count:
                raise _null_error(name, count, url)
        for i, name in objects:
            if has_no_python_class(schema.field(i).type):  # batch.column(i) itself would fail
                raise no_python_class(schema.field(i).type, name, url)
            check_objects(batch.column(i), name, url)
    return check


def finish_objects(batch: Any, output_format: str) -> Any:
    """The trainer's half of ``objects_later``: Python objects from the Arrow left in ``batch``."""
    if output_format == "dict":
        return to_pydict_quietly(batch)
    for key, value in batch.items():
        if isinstance(value, pa.Array):
            batch[key] = to_objects(value, key)
    return batch


def _temporal(column: pa.Array, to_torch: bool) -> np.ndarray:
    """Timestamps, dates, times and durations as integers of their unit (``to_torch``: int64),
    else NumPy ``datetime64``/``timedelta64`` of that unit; zero-copy for 64-bit types."""
    t = column.type
    wide = not (pa.types.is_date32(t) or pa.types.is_time32(t))
    ints: np.ndarray = column.view(pa.int64() if wide else pa.int32()).to_numpy(zero_copy_only=False)
    if not wide:
        ints = ints.astype(np.int64)
    if to_torch:
        return ints
    unit = "D" if pa.types.is_date32(t) else "ms" if pa.types.is_date64(t) else t.unit
    family = "datetime64" if pa.types.is_timestamp(t) or pa.types.is_date(t) else "timedelta64"
    return ints.view(f"{family}[{unit}]")


def _month_day_nano(column: pa.Array, to_torch: bool) -> np.ndarray:
    data = column.buffers()[1]
    values: np.ndarray = np.frombuffer(data, dtype=_MONTH_DAY_NANO, count=len(column), offset=column.offset * 16)
    if not to_torch:
        return values
    out = np.empty((len(column), 3), dtype=np.int64)
    for j, part in enumerate(_MONTH_DAY_NANO.names or ()):
        out[:, j] = values[part]
    return out


def _column(batch: pa.RecordBatch, i: int, kind: str, name: str) -> pa.Array:
    if kind == "none":  # batch.column(i) itself would fail
        raise no_python_class(batch.schema.field(i).type, name, "")
    return batch.column(i)


def _to_numpy(column: pa.Array, kind: str, name: str, fill: Any, objects_later: bool = False,
              to_torch: bool = False, encoded: bool = False) -> Any:
    """One column as NumPy (``kind`` from :func:`column_kind`; ``encoded``: a dictionary column)."""
    if kind == "list":
        return compact_array(column) if objects_later else to_objects(column, name)
    if encoded:
        column = column.dictionary_decode()
    column = _no_nulls(column, name, fill)
    if kind == "array":
        return column.to_numpy(zero_copy_only=False)
    if kind == "temporal":
        return _temporal(column, to_torch)
    if kind == "interval":
        return _month_day_nano(column, to_torch)
    values = _no_nulls(column.flatten(), name, fill).to_numpy(zero_copy_only=False)
    return values.reshape(len(column), column.type.list_size)


def make_converter(output_format: str, schema: pa.Schema, fill_nulls: Mapping[str, Any] | None = None,
                   in_worker: bool = False, objects_later: bool = False, torch_values: bool = False) -> Converter:
    """A function that turns a record batch of ``schema`` into the ``output_format`` batch.

    ``in_worker``: the batch will be pickled to another process, so it must own its buffers.
    ``objects_later``: leave what would become Python objects as compact Arrow (whole batches
    for ``"dict"``, other columns for ``"numpy"``); the trainer makes the objects with
    :func:`finish_objects`. Unpickling Python objects costs more than making them from Arrow.
    ``torch_values``: ``"numpy"`` arrays holding what ``"torch"`` tensors hold (integers for
    temporal columns), which the trainer makes tensors of.
    """
    if output_format == "arrow" or (output_format == "dict" and objects_later):
        return compact if in_worker else _identity
    if output_format == "dict":
        return to_pydict_quietly
    fills = fill_nulls or {}
    # per column, decided once from the schema: name, kind, fill value, dictionary-encoded
    plan = [(fld.name, column_kind(fld.type), fills.get(fld.name), pa.types.is_dictionary(fld.type))
            for fld in schema]
    if output_format == "numpy":
        def to_numpy(batch: pa.RecordBatch) -> dict[str, Any]:
            return {name: _to_numpy(_column(batch, i, kind, name), kind, name, fill, objects_later, torch_values,
                                    encoded)
                    for i, (name, kind, fill, encoded) in enumerate(plan)}
        return to_numpy

    def to_torch(batch: pa.RecordBatch) -> TorchBatch:
        out: TorchBatch = {}
        for i, (name, kind, fill, encoded) in enumerate(plan):
            value = _to_numpy(_column(batch, i, kind, name), kind, name, fill, to_torch=True, encoded=encoded)
            out[name] = value if kind == "list" else _tensor(value)
        return out
    return to_torch


_warned = False


def _tensor(array: np.ndarray) -> Any:
    """``torch.from_numpy``, sharing the Arrow buffer; read-only buffers are fine here.

    torch warns once per process that a read-only array makes a tensor that must not be
    written; the batch owns its buffer alone, so the first conversion silences that warning.
    """
    import torch

    global _warned
    if _warned:
        return torch.from_numpy(array)
    _warned = True
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*")
        return torch.from_numpy(array)


def _identity(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def compact_array(array: pa.Array) -> pa.Array:
    """An array that owns exactly its values (see :func:`compact`)."""
    return pa.concat_arrays([array, array.slice(0, 0)])


def compact(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A copy of ``batch`` that owns exactly its rows.

    A zero-copy slice keeps its parent's whole buffers alive, and pickling it (worker to
    trainer) sends them all: for a 1,024-row slice of a 65,536-row read, 64 times the data.
    """
    return pa.concat_batches([batch, batch.slice(0, 0)])


def to_pydict_quietly(batch: pa.RecordBatch) -> DictBatch:
    """The batch as Python lists by column (see :func:`._values.to_objects`)."""
    return {name: to_objects(_column(batch, i, column_kind(fld.type), name), name)
            for i, (name, fld) in enumerate(zip(batch.schema.names, batch.schema))}


def passthrough_collate(batch: Any) -> Any:
    """The loader's default ``collate_fn``: batches arrive assembled, nothing to collate."""
    return batch
