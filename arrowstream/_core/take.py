"""Gathering rows by index, for every type a file may hold.

pyarrow's ``take`` has no kernel for the view types (``string_view``, ``binary_view``: what pyarrow, Polars
and DuckDB may write), alone or inside lists, structs and maps. A shuffle window and a mixture's batches
gather rows with ``take``; :func:`take` gathers those columns as their large counterparts and casts them
back, so every column keeps its type and the other columns are gathered as they are.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa


def take(rows: pa.Table, indices: Any) -> pa.Table:
    """``rows.take(indices)``, also where a column holds a view type.

    Example:
        >>> rows = pa.table({"s": pa.array(["a", "bb", "ccc"], pa.string_view()), "x": [1, 2, 3]})
        >>> taken = take(rows, [2, 0])
        >>> taken.column("s").type, taken.column("s").to_pylist(), taken.column("x").to_pylist()
        (DataType(string_view), ['ccc', 'a'], [3, 1])
    """
    wide = _without_views(rows.schema)
    if wide is None:
        return rows.take(indices)
    return rows.cast(wide).take(indices).cast(rows.schema)


_KEPT = 8
_seen: list[tuple[pa.Schema, pa.Schema | None]] = []   # the schemas last asked about, newest first


def _without_views(schema: pa.Schema) -> pa.Schema | None:
    """``schema`` with every view type made its large counterpart; None when it holds none.

    Remembered for the last few schemas, found again by ``equals`` (well under a microsecond): hashing a
    schema, as a ``functools.lru_cache`` key, costs ~10 us at 20 columns and ~90 us at 200, on every call."""
    global _seen
    seen = _seen
    for known, wide in seen:
        if known is schema or known.equals(schema, check_metadata=True):
            return wide
    fields = [field.with_type(_wide(field.type)) for field in schema]
    wide = None if all(field.type == old.type for field, old in zip(fields, schema, strict=True)) else \
        pa.schema(fields, metadata=schema.metadata)
    _seen = [(schema, wide), *seen[:_KEPT - 1]]   # rebound, never changed: a reader thread keeps the list it had
    return wide


def _wide(t: pa.DataType) -> pa.DataType:
    if t == pa.string_view():
        return pa.large_string()
    if t == pa.binary_view():
        return pa.large_binary()
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_wide(t.key_type)), t.item_field.with_type(_wide(t.item_type)),
                       t.keys_sorted)
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_wide(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_wide(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_wide(t.value_type)), t.list_size)
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_wide(t.field(i).type)) for i in range(t.num_fields)])
    return t
