"""Nullability joined: one type for types that differ only in their fields' nullability (at any depth), each
field nullable where any of them makes it so, and the cast of a batch into a schema that joined its own.

What a dataset's files (``_planning.checks``) and a mixture's sources (``_mixing.schema``) share: a field nullable in
one file (or source) and not in another is nullable in the batches; a batch read where it is not is cast, so
that batches of both concatenate; a field nullable nowhere stays not nullable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.types as pat


def _children(kind: pa.DataType) -> list[pa.Field] | None:
    """The fields of a nested type (a struct's, a list's item, a map's key and item); None for other types."""
    if pat.is_struct(kind):
        return [kind.field(i) for i in range(kind.num_fields)]
    if pat.is_map(kind):
        return [kind.key_field, kind.item_field]
    if pat.is_list(kind) or pat.is_large_list(kind) or pat.is_fixed_size_list(kind):
        return [kind.value_field]
    return None   # (list views too: pyarrow 26 cannot cast one to another)


def _with_children(kind: pa.DataType, fields: list[pa.Field]) -> pa.DataType:
    """``kind`` (a nested type, see :func:`_children`) with ``fields`` as its fields."""
    if pat.is_struct(kind):
        return pa.struct(fields)
    if pat.is_map(kind):
        return pa.map_(fields[0], fields[1], keys_sorted=kind.keys_sorted)
    if pat.is_fixed_size_list(kind):
        return pa.list_(fields[0], kind.list_size)
    return pa.large_list(fields[0]) if pat.is_large_list(kind) else pa.list_(fields[0])


def join_types(kinds: Sequence[pa.DataType]) -> pa.DataType | None:
    """The type of ``kinds`` when they are one type but for the nullability of fields at any depth (a struct's
    field, a list's item): each field nullable where any kind's is (every value of each fits); None when they
    differ otherwise.

    Example:
        >>> strict = pa.struct([pa.field("c", pa.int64(), nullable=False)])
        >>> join_types([strict, pa.struct([("c", pa.int64())])])
        StructType(struct<c: int64>)
        >>> join_types([strict, pa.struct([("d", pa.int64())])]) is None
        True
    """
    first = kinds[0]
    if all(kind == first for kind in kinds):
        return first
    fields = [_children(kind) for kind in kinds]
    known = [f for f in fields if f is not None]
    if len(known) != len(kinds) or any(len(f) != len(known[0]) for f in known):
        return None
    joined = []
    for index, field in enumerate(known[0]):
        column = [f[index] for f in known]
        child = join_fields(column)
        if child is None or (pat.is_struct(first) and any(f.name != field.name for f in column)):
            return None   # (a list's or a map's fields may have other names: pyarrow's types ignore them)
        joined.append(child)
    out = _with_children(first, joined)
    # the same shape but for nullability (the same kind of list, list size, sorted keys), else none
    return out if all(_with_children(kind, joined) == out for kind in kinds) else None


def join_fields(fields: Sequence[pa.Field]) -> pa.Field | None:
    """The first of ``fields`` (its name and metadata) with their types joined (:func:`join_types`), nullable
    where any is; None when their types cannot be joined."""
    kind = join_types([f.type for f in fields])
    if kind is None:
        return None
    return pa.field(fields[0].name, kind, any(f.nullable for f in fields), fields[0].metadata)


def conformer(source: pa.Schema, target: pa.Schema) -> Callable[[pa.RecordBatch], pa.RecordBatch] | None:
    """A function from a batch of ``source`` to one of ``target`` (its columns, in its order, cast); None
    when ``source``'s fields are ``target``'s (names, types and nullability: metadata aside), and nothing
    needs doing. Fields are compared whole: one that is not nullable where ``target``'s is (or a struct's or
    a list's field inside it) is cast too, else batches of both would not concatenate."""
    if source.equals(target):
        return None
    names = target.names if source.names != target.names else None

    def conform(batch: pa.RecordBatch) -> pa.RecordBatch:
        return (batch if names is None else batch.select(names)).cast(target)

    return conform
