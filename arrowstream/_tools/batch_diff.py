"""Batches as comparable snapshots, and the first difference between two of them (for ``testing``).

A snapshot copies what a batch holds at once: a loader may hand out tensors on shared memory that
a later batch reuses. Arrays are compared byte for byte (so a NaN equals the same NaN, and ``-0.0``
differs from ``0.0``, as the resume guarantee says), everything else value by value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

_PLAIN = (str, bytes, int, float, type(None))


@dataclass(frozen=True)
class ArraySnapshot:
    """A tensor's or ndarray's dtype (as the batch had it), shape and values (a numpy copy)."""

    kind: str          # "tensor" or "ndarray"
    dtype: str
    values: np.ndarray


@dataclass(frozen=True)
class ArrowSnapshot:
    """A RecordBatch's (or Table's) schema and each column's values as Python lists."""

    schema: pa.Schema
    columns: dict[str, list[Any]]


def snapshot(value: Any) -> Any:
    """A copy of ``value`` that :func:`first_difference` compares: arrays, Arrow batches, mappings and
    sequences of them, and plain values."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds each value exactly
            tensor = tensor.float()
        return ArraySnapshot("tensor", str(value.dtype), tensor.numpy().copy())
    if isinstance(value, np.ndarray):
        return ArraySnapshot("ndarray", str(value.dtype), value.copy())
    if isinstance(value, (pa.RecordBatch, pa.Table)):
        return ArrowSnapshot(value.schema, {name: value.column(name).to_pylist() for name in value.schema.names})
    if isinstance(value, Mapping):
        return {key: snapshot(item) for key, item in value.items()}
    if isinstance(value, list):   # a column of plain values (str, numbers) is copied as it is: they do not change
        return list(value) if all(isinstance(item, _PLAIN) for item in value) else [snapshot(item) for item in value]
    if isinstance(value, tuple):
        return tuple(snapshot(item) for item in value)
    return value


def first_difference(expected: Any, actual: Any, where: str = "the batch") -> str | None:
    """Where and how two snapshots differ first (None when they are the same)."""
    if isinstance(expected, ArraySnapshot) or isinstance(actual, ArraySnapshot):
        return _array_difference(expected, actual, where)
    if isinstance(expected, ArrowSnapshot) or isinstance(actual, ArrowSnapshot):
        return _arrow_difference(expected, actual, where)
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        return _mapping_difference(expected, actual, where)
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        return _sequence_difference(expected, actual, where)
    if not same_value(expected, actual):
        return f"{where}: expected {_show(expected)}, got {_show(actual)}"
    return None


def _mapping_difference(expected: Mapping[Any, Any], actual: Mapping[Any, Any], where: str) -> str | None:
    if list(expected) != list(actual):
        return f"{where}: expected keys {list(expected)}, got {list(actual)}"
    for key in expected:
        found = first_difference(expected[key], actual[key], _key_path(where, key))
        if found is not None:
            return found
    return None


def _key_path(where: str, key: Any) -> str:
    return f"column {key!r}" if where == "the batch" else f"{where}[{key!r}]"


def _sequence_difference(expected: Any, actual: Any, where: str) -> str | None:
    if type(expected) is not type(actual):
        return f"{where}: expected a {type(expected).__name__}, got a {type(actual).__name__}"
    if len(expected) != len(actual):
        return f"{where}: expected {len(expected)} items, got {len(actual)}"
    if expected and isinstance(expected[0], (ArraySnapshot, ArrowSnapshot, Mapping)):
        for index, (left, right) in enumerate(zip(expected, actual, strict=True)):
            found = first_difference(left, right, f"{where}[{index}]")
            if found is not None:
                return found
        return None
    return _values_difference(expected, actual, where)


def _values_difference(expected: list[Any] | tuple[Any, ...], actual: list[Any] | tuple[Any, ...],
                       where: str) -> str | None:
    """Row values (a list column, an Arrow column): the first row that differs."""
    if len(expected) != len(actual):
        return f"{where}: expected {len(expected)} rows, got {len(actual)}"
    for index, (left, right) in enumerate(zip(expected, actual, strict=True)):
        if not same_value(left, right):
            return f"{where}, row {index}: expected {_show(left)}, got {_show(right)}"
    return None


def _array_difference(expected: Any, actual: Any, where: str) -> str | None:
    if not isinstance(expected, ArraySnapshot) or not isinstance(actual, ArraySnapshot):
        return f"{where}: expected {_kind(expected)}, got {_kind(actual)}"
    if (expected.kind, expected.dtype) != (actual.kind, actual.dtype):
        return f"{where}: expected {_kind(expected)}, got {_kind(actual)}"
    left, right = expected.values, actual.values
    if left.shape != right.shape:
        return f"{where}: expected shape {tuple(left.shape)}, got {tuple(right.shape)}"
    if left.dtype == object:
        return _values_difference(left.reshape(-1).tolist(), right.reshape(-1).tolist(), where)
    if left.tobytes() == right.tobytes():
        return None
    width = max(left.dtype.itemsize, 1)
    differs = (np.frombuffer(left.tobytes(), np.uint8).reshape(-1, width)
               != np.frombuffer(right.tobytes(), np.uint8).reshape(-1, width)).any(axis=1)
    flat = int(np.flatnonzero(differs)[0])
    index = tuple(int(i) for i in np.unravel_index(flat, left.shape))
    at = index[0] if len(index) == 1 else index
    return (f"{where}, element {at}: expected {_show(left.reshape(-1)[flat].item())}, "
            f"got {_show(right.reshape(-1)[flat].item())}")


def _arrow_difference(expected: Any, actual: Any, where: str) -> str | None:
    if not isinstance(expected, ArrowSnapshot) or not isinstance(actual, ArrowSnapshot):
        return f"{where}: expected {_kind(expected)}, got {_kind(actual)}"
    if not expected.schema.equals(actual.schema, check_metadata=True):
        return f"{where}: expected schema {expected.schema.to_string()!r}, got {actual.schema.to_string()!r}"
    for name, values in expected.columns.items():
        found = _values_difference(values, actual.columns[name], _key_path(where, name))
        if found is not None:
            return found
    return None


def same_value(left: Any, right: Any) -> bool:
    """Plain values, equal with NaN equal to NaN, through lists, tuples and dicts."""
    if isinstance(left, float) and isinstance(right, float) and math.isnan(left) and math.isnan(right):
        return True
    if type(left) is not type(right):
        return False
    if isinstance(left, (list, tuple)):
        return len(left) == len(right) and all(same_value(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, dict):
        return list(left) == list(right) and all(same_value(left[k], right[k]) for k in left)
    return bool(left == right)


def _kind(value: Any) -> str:
    if isinstance(value, ArraySnapshot):
        return f"{'an' if value.kind == 'ndarray' else 'a'} {value.kind} of {value.dtype}"
    if isinstance(value, ArrowSnapshot):
        return "an Arrow batch"
    return f"a {type(value).__name__}"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
