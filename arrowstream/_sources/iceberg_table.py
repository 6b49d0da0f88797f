"""Iceberg tables: the catalog, the table, and one pinned snapshot with its schema, filter and projection.

:func:`iceberg_catalog` opens a pyiceberg catalog (public: a user's script creates tables through it
without importing pyiceberg first), :func:`load_table` asks it for the table; :func:`open_source` pins the snapshot and
the schema the rows are read in (as pyiceberg does: the current snapshot in the table's current
schema, an explicit one in its own, a checkpoint's schema over both), binds the row filter and the
selected fields. The :class:`IcebergSource` it returns is what ``_sources.iceberg_files.plan_iceberg`` plans.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .._core.install import install_hint
from .._formats.base import sliced
from ..errors import (
    DatasetNotFoundError,
    EmptyDatasetError,
    InvalidArgumentError,
    MissingDependencyError,
    StateMismatchError,
)


def import_pyiceberg() -> None:
    try:
        import pyiceberg  # noqa: F401
    except ImportError:
        raise MissingDependencyError(
            f'reading Iceberg tables needs pyiceberg, which is not installed; {install_hint("iceberg")}'
        ) from None


def default_catalog_config(root: str = ".") -> dict[str, str]:
    """pyiceberg's SQL catalog on SQLite with a local warehouse, both under ``root`` (created if missing)."""
    root = os.path.abspath(root)
    os.makedirs(root, exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{os.path.join(root, 'catalog.db')}",
            "warehouse": f"file://{os.path.join(root, 'warehouse')}"}


@dataclass
class IcebergSource:
    """The table, the pinned snapshot and what to read of it."""

    table_name: str
    table: Any
    snapshot_id: int
    schema_id: int            # the schema the rows are read in
    row_filter: Any           # a pyiceberg BooleanExpression
    selected_fields: tuple[str, ...]
    arrow_filter: pc.Expression | None
    output_columns: list[str]

    def baseline_batches(self, batch_size: int) -> Iterator[pa.RecordBatch]:
        """The snapshot's rows through pyiceberg's own scan, in batches of at most ``batch_size`` rows: the
        raw loop ``arrowstream bench`` compares the loader with on a table."""
        scan = self.table.scan(snapshot_id=self.snapshot_id, row_filter=self.row_filter,
                               selected_fields=self.selected_fields)
        for batch in scan.to_arrow_batch_reader():
            yield from sliced(batch, batch_size)


def iceberg_catalog(catalog_config: dict[str, Any] | None = None) -> Any:
    """The pyiceberg catalog that ``catalog_config`` names, as :class:`~arrowstream.IcebergDataset` opens it:
    to create namespaces and tables and append rows without importing pyiceberg first, so that a missing
    pyiceberg is a ``MissingDependencyError`` that says what to install.

    Args:
        catalog_config: pyiceberg's catalog properties (``{"type": "sql", "uri": ..., "warehouse": ...}``,
            a REST, Glue or Hive catalog); ``"name"`` names it (default ``"default"``). ``None``: the default
            SQLite catalog under the current folder (:func:`~arrowstream.iceberg_catalog_config`).

    Returns:
        The ``pyiceberg.catalog.Catalog``.

    Raises:
        MissingDependencyError: pyiceberg is not installed (the message says how to install the iceberg extra).
        InvalidArgumentError: pyiceberg cannot load a catalog of these properties.

    Example:
        >>> import arrowstream, pyarrow as pa, tempfile
        >>> config = arrowstream.iceberg_catalog_config(tempfile.mkdtemp())
        >>> catalog = arrowstream.iceberg_catalog(config)
        >>> catalog.create_namespace("db")
        >>> events = pa.table({"x": pa.array(range(10), pa.int64())})
        >>> catalog.create_table("db.events", schema=events.schema).append(events)
        >>> arrowstream.IcebergDataset("db.events", catalog_config=config).num_rows
        10
    """
    return _catalog(catalog_config)[1]


def _catalog(catalog_config: dict[str, Any] | None) -> tuple[str, Any]:
    """The catalog's name and the catalog."""
    import_pyiceberg()
    from pyiceberg.catalog import load_catalog

    config = dict(catalog_config if catalog_config is not None else default_catalog_config())
    name = str(config.pop("name", "default"))
    try:
        return name, load_catalog(name, **config)
    except (ValueError, ImportError) as exc:
        raise InvalidArgumentError(
            f"catalog_config: pyiceberg cannot load catalog {name!r} of type {config.get('type')!r} ({exc}); "
            "see pyiceberg's catalog configuration (sql, rest, glue, hive)") from None


def load_table(table_name: str, catalog_config: dict[str, Any] | None) -> Any:
    import_pyiceberg()
    from pyiceberg.exceptions import NoSuchTableError

    if not isinstance(table_name, str) or not table_name:
        raise InvalidArgumentError(f"table: expected a table identifier such as 'db.events', got {table_name!r}")
    name, catalog = _catalog(catalog_config)
    try:
        return catalog.load_table(table_name)
    except NoSuchTableError:
        raise DatasetNotFoundError(
            f"table: {table_name!r} does not exist in catalog {name!r}; check the identifier (namespace.table) "
            "and catalog_config") from None


def open_source(table: Any, table_name: str, snapshot_id: int | None, row_filter: Any,
                selected_fields: Sequence[str] | None, schema_id: int | None = None) -> IcebergSource:
    """Pin the snapshot and the schema, bind the filter and the projection.

    As in pyiceberg: the current snapshot is read in the table's current schema, an explicit
    ``snapshot_id`` in the schema of that snapshot; ``schema_id`` (from a checkpoint) overrides both.
    """
    from pyiceberg.expressions import AlwaysTrue, BooleanExpression
    from pyiceberg.expressions.parser import parse
    from pyparsing import ParseBaseException

    metadata = table.metadata
    if snapshot_id is None:
        current = table.current_snapshot()
        if current is None:
            raise EmptyDatasetError(f"table: {table_name!r} has no snapshot yet (no rows were ever committed); "
                                    "append data to it first")
        snapshot_id = int(current.snapshot_id)
        default_schema = metadata.current_schema_id
    else:
        snapshot = table.snapshot_by_id(snapshot_id)
        if snapshot is None:
            known = [s.snapshot_id for s in table.snapshots()][-5:]
            raise InvalidArgumentError(
                f"snapshot_id: {table_name!r} has no snapshot {snapshot_id} (expired or never existed; latest ones: "
                f"{known}); pass one of its snapshots, or None for the latest")
        default_schema = snapshot.schema_id if snapshot.schema_id is not None else metadata.current_schema_id
    schema_id = default_schema if schema_id is None else schema_id
    if row_filter is None:
        row_filter = AlwaysTrue()
    elif isinstance(row_filter, str):
        try:
            row_filter = parse(row_filter)
        except (ParseBaseException, ValueError) as exc:
            raise InvalidArgumentError(f"row_filter: cannot parse {row_filter!r} ({exc})") from None
    elif not isinstance(row_filter, BooleanExpression):
        raise InvalidArgumentError(
            f"row_filter: expected a pyiceberg expression or a string such as \"id > 10\", got {type(row_filter).__name__}")
    fields = ("*",) if selected_fields is None else tuple(selected_fields)
    if not fields or not all(isinstance(f, str) for f in fields):
        raise InvalidArgumentError(f"selected_fields: expected a non-empty list of column names, got {selected_fields!r}")
    source = IcebergSource(table_name, table, snapshot_id, schema_id, row_filter, fields, None, [])
    try:
        projected = _projected(source)
    except ValueError as exc:
        raise InvalidArgumentError(f"selected_fields: {exc} (table {table_name!r}); pick columns of the table") from None
    try:
        source.arrow_filter = _arrow_filter(source, requested_schema(source))
    except ValueError as exc:
        raise InvalidArgumentError(f"row_filter: {exc} (table {table_name!r}); filter on columns of the table") from None
    names = [field.name for field in projected.fields]
    # the columns in the order asked for, like `columns=` of file datasets (nested selections: schema order)
    source.output_columns = list(fields) if sorted(fields) == sorted(names) else names
    return source


def _schema(source: IcebergSource) -> Any:
    schema = next((s for s in source.table.metadata.schemas if s.schema_id == source.schema_id), None)
    if schema is None:
        raise StateMismatchError(f"table: {source.table_name!r} has no schema {source.schema_id} any more; "
                                 "start without loading the checkpoint")
    return schema


def _projected(source: IcebergSource) -> Any:
    schema = _schema(source)
    return schema if "*" in source.selected_fields else schema.select(*source.selected_fields, case_sensitive=True)


def requested_schema(source: IcebergSource) -> Any:
    """The columns to read: the selected ones and those the filter needs."""
    from pyiceberg.expressions.visitors import bind, extract_field_ids

    full = _schema(source)
    if "*" in source.selected_fields:
        return full
    filter_ids = extract_field_ids(bind(full, source.row_filter, case_sensitive=True))
    extra = [full.find_column_name(i) for i in sorted(filter_ids)]
    names = list(source.selected_fields) + [n for n in extra if n is not None and n not in source.selected_fields]
    return full.select(*names, case_sensitive=True)


def _arrow_filter(source: IcebergSource, requested: Any) -> pc.Expression | None:
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.expressions.visitors import bind
    from pyiceberg.io.pyarrow import expression_to_pyarrow

    if source.row_filter == AlwaysTrue():
        return None
    expression: pc.Expression = expression_to_pyarrow(bind(requested, source.row_filter, case_sensitive=True))
    return expression
