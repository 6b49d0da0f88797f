"""The checks planning makes of the files' metadata: column names valid UTF-8, the filter evaluable on the
columns, ``columns`` present and unambiguous, every distinct schema agreeing with the reference file's on
the columns read. Each raises an arrowstream error that names the file and says what to do."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._core.nullability import join_fields
from .._formats.footers import FooterTable
from .._storage.filesystem import display_url
from ..errors import CorruptFileError, InvalidArgumentError, SchemaMismatchError


def check_names(schema: pa.Schema, url: str, label: str) -> None:
    """Refuse a schema whose field names (nested ones too) are not valid UTF-8."""
    try:
        schema.to_string(show_field_metadata=False, show_schema_metadata=False)
        schema.names  # noqa: B018 (decoding is the check)
    except UnicodeDecodeError as exc:
        raise CorruptFileError(
            f"{url}: a column name in the {label} metadata is not valid UTF-8 "
            f"({exc.object[max(exc.start - 16, 0):exc.end + 16]!r}); the file is corrupt: rewrite it with UTF-8 "
            "column names, or leave it out of `path`") from None


def _referenced(filter: pc.Expression, schema: pa.Schema) -> list[str]:
    """Column names a filter expression reads, found by elimination on empty tables."""
    empty = schema.empty_table()
    needed = []
    for name in schema.names:
        try:
            empty.drop_columns([name]).filter(filter)
        except (pa.ArrowException, ValueError, TypeError, KeyError):
            needed.append(name)
    return needed


def check_filter(filter: pc.Expression, schema: pa.Schema, url: str) -> list[str]:
    """Validate ``filter`` on ``schema``; return the columns it reads."""
    try:
        schema.empty_table().filter(filter)
    except (pa.ArrowException, ValueError, TypeError, KeyError) as exc:
        raise InvalidArgumentError(
            f"filter: {filter} cannot be evaluated on the columns of {url} ({exc}); "
            f"the file has columns {schema.names}") from None
    return _referenced(filter, schema)


def _type_of(schema: pa.Schema, name: str) -> str:
    """The type of column ``name`` (of each column of that name, where several share it)."""
    return ", ".join(str(f.type) for f in schema if f.name == name)


def check_schemas(footers: FooterTable, protocol: str, required: list[str], all_columns: bool) -> pa.Schema:
    """Refuse files whose columns differ from the reference (the first file with rows) in more than their
    nullability: each distinct schema is checked once, at its first file, which is the first file the error
    can name. Return the reference's schema with each column of ``required`` nullable where any file's is,
    at any depth (a struct's field, a list's item): the schema of every batch (see ``_core.nullability``)."""
    with_rows = np.flatnonzero(footers.file_rows() > 0)
    if not len(with_rows):
        with_rows = np.arange(len(footers))
    _, firsts = np.unique(footers.schema_index[with_rows], return_index=True)
    reference = int(with_rows[0])
    ref_schema = joined = footers.schema_of(reference)
    for first in sorted(int(with_rows[f]) for f in firsts):
        schema = footers.schema_of(first)
        if first != reference and not schema.equals(ref_schema):   # equal schemas: nothing can differ
            _check_schema(schema, display_url(protocol, footers.path(first)), ref_schema,
                          display_url(protocol, footers.path(reference)), required, all_columns)
            joined = _joined(joined, schema, set(required))
    return joined


def _joined(joined: pa.Schema, schema: pa.Schema, required: set[str]) -> pa.Schema:
    """``joined`` with each column of ``required`` joined with ``schema``'s of that name (its n-th of that
    name, where several share it), which :func:`_check_schema` found joinable."""
    fields, seen = [], Counter[str]()
    for field in joined:
        if field.name in required:
            other = schema.field(schema.get_all_field_indices(field.name)[seen[field.name]])
            seen[field.name] += 1
            both = join_fields([field, other])
            assert both is not None, "checked by _check_schema"
            field = both
        fields.append(field)
    return pa.schema(fields, metadata=joined.metadata)


def _check_schema(schema: pa.Schema, url: str, ref_schema: pa.Schema, ref_url: str, required: list[str],
                  all_columns: bool) -> None:
    names = set(schema.names)
    if all_columns and names != set(ref_schema.names):
        extra = sorted(names - set(ref_schema.names))
        missing = sorted(set(ref_schema.names) - names)
        raise SchemaMismatchError(
            f"{url} has columns that differ from {ref_url}: missing {missing}, extra {extra}; "
            "pass `columns=[...]` with the columns all files share, or fix the files")
    for name in required:
        if name not in names:
            raise SchemaMismatchError(
                f"{url} has no column {name!r}, which {ref_url} has; "
                "leave the column out of `columns` or fix the file")
        ours = [schema.field(i) for i in schema.get_all_field_indices(name)]
        theirs = [ref_schema.field(i) for i in ref_schema.get_all_field_indices(name)]
        # types that differ only in nullability join (nullable where either is): the batches are cast
        if len(ours) != len(theirs) or any(join_fields([a, b]) is None for a, b in zip(theirs, ours, strict=True)):
            raise SchemaMismatchError(
                f"column {name!r} is {_type_of(schema, name)} in {url} but {_type_of(ref_schema, name)} in "
                f"{ref_url}; rewrite the files with one type, or leave the column out of `columns`")


def check_columns(columns: list[str] | None, schema: pa.Schema, url: str) -> None:
    if columns is None:
        return
    unknown = [c for c in columns if c not in schema.names]
    if unknown:
        raise InvalidArgumentError(f"columns: {unknown} not found in {url}; its columns are {schema.names}")
    shared = sorted({c for c in columns if schema.names.count(c) > 1})
    if shared:
        raise InvalidArgumentError(
            f"columns: {shared} each name several columns of {url}, so `columns` cannot choose "
            "between them; leave them out of `columns`, or rewrite the file with distinct names")
