"""One output schema for a mixture's sources: equal names, types equal or safely widened, a field nullable
where any source's is."""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.types as pat

from .._core.nullability import conformer, join_types
from ..errors import InvalidArgumentError, SchemaMismatchError

SAFE_CASTS = "int8/16/32 into a wider int, uint into a wider int (int and uint: the narrowest int that holds " \
             "both), float16/32 into float64, string and string_view into large_string, binary and binary_view " \
             "into large_binary, a field not nullable into a nullable one (inside structs, lists and maps too)"
# what sources of string (or binary) columns of different kinds are read as: every kind widens into it
_LARGE = (pa.large_string(), pa.large_binary())


def widens(narrow: pa.DataType, wide: pa.DataType) -> bool:
    """Whether every value of ``narrow`` is a value of ``wide`` (a safe cast, or the same type)."""
    if narrow == wide:
        return True
    if pat.is_signed_integer(narrow) and pat.is_signed_integer(wide):
        return bool(narrow.bit_width <= wide.bit_width)
    if pat.is_unsigned_integer(narrow) and pat.is_signed_integer(wide):
        return bool(narrow.bit_width < wide.bit_width)
    if pat.is_unsigned_integer(narrow) and pat.is_unsigned_integer(wide):
        return bool(narrow.bit_width <= wide.bit_width)
    if pat.is_floating(narrow) and pat.is_floating(wide):
        return bool(narrow.bit_width <= wide.bit_width)
    return bool(((pat.is_string(narrow) or pat.is_string_view(narrow)) and pat.is_large_string(wide))
                or ((pat.is_binary(narrow) or pat.is_binary_view(narrow)) and pat.is_large_binary(wide)))


def _signed_holding(kinds: list[pa.DataType]) -> list[pa.DataType]:
    """The narrowest signed int that holds every value of ``kinds`` when they are ints of both signs (int8 and
    uint8: int16); none otherwise, or when it would need more than 64 bits (uint64)."""
    if not kinds or not all(pat.is_integer(kind) for kind in kinds):
        return []
    bits = max([kind.bit_width for kind in kinds if pat.is_signed_integer(kind)]
               + [2 * kind.bit_width for kind in kinds if pat.is_unsigned_integer(kind)])
    return [pa.int16() if bits <= 16 else pa.int32() if bits <= 32 else pa.int64()] if bits <= 64 else []


def _holding(kinds: list[pa.DataType]) -> pa.DataType | None:
    """The type every one of ``kinds`` widens into: one of them, else the narrowest that holds them all (int8
    and uint8: int16; string and string_view: large_string), else, for nested types that differ only in
    their fields' nullability, the one with each field nullable where any is; None when there is none."""
    candidates = [*kinds, *_signed_holding(kinds), *_LARGE]
    held = next((t for t in candidates if all(widens(kind, t) for kind in kinds)), None)
    return held if held is not None else join_types(kinds)


def unify(schemas: Mapping[str, pa.Schema], source_column: str | None) -> pa.Schema:
    """The mixture's schema: the first source's column order, each column of the type every source's
    type widens into, nullable where any source's is (at every depth); else ``SchemaMismatchError`` naming
    the column and both sources."""
    names = list(schemas)
    first = names[0]
    columns = schemas[first].names
    for name in names[1:]:
        if sorted(schemas[name].names) != sorted(columns):
            missing = sorted(set(columns) - set(schemas[name].names))
            extra = sorted(set(schemas[name].names) - set(columns))
            raise SchemaMismatchError(
                f"sources {first!r} and {name!r} have other columns: {name!r} lacks {missing} and has {extra} "
                f"that {first!r} lacks; give each source columns=[...] (selected_fields for Iceberg) with the same names")
    fields = []
    for column in columns:
        types = {name: schemas[name].field(column).type for name in names}
        target = _holding(list(types.values()))
        if target is None:
            # a source that cannot be joined with the first, else (each can, not all at once) one that differs
            other = next((name for name in names[1:] if _holding([types[first], types[name]]) is None), None)
            if other is None:
                other = next(name for name in names[1:] if types[name] != types[first])
            raise SchemaMismatchError(
                f"column {column!r} is {types[first]} in source {first!r} and {types[other]} in source {other!r}, "
                f"and no safe cast brings both to one type; mixtures apply only safe casts ({SAFE_CASTS}): "
                "cast in the data, or select other columns")
        # nullable where a source's is: every value of each source fits (a batch of a source that is not
        # nullable there is cast, see caster); not nullable where none is
        fields.append(pa.field(column, target, any(schemas[name].field(column).nullable for name in names)))
    if source_column is not None:
        if source_column in columns:
            raise InvalidArgumentError(f"source_column: {source_column!r} is already a column of the sources; "
                                       "choose another name")
        fields.append(pa.field(source_column, pa.string()))
    return pa.schema(fields)


def caster(source: pa.Schema, target: pa.Schema, name: str, source_column: str | None):  # type: ignore[no-untyped-def]
    """A function from a batch of ``source`` to one of ``target`` (columns in order, safe casts, the
    source's name as ``source_column``)."""
    data = pa.schema([target.field(c) for c in target.names if c != source_column])
    conform = conformer(source, data)   # (a field not nullable where the mixture's is, at any depth, is cast too)
    label = pa.scalar(name, pa.string())
    label_field = None if source_column is None else target.field(source_column)

    def cast(batch: pa.RecordBatch) -> pa.RecordBatch:
        if conform is not None:
            batch = conform(batch)
        if label_field is not None:
            column = pa.repeat(label, batch.num_rows) if batch.num_rows else pa.array([], pa.string())
            # appended in place: a column Python has no class for (intervals) cannot be handed to Python
            batch = batch.append_column(label_field, column)
        return batch

    return cast
