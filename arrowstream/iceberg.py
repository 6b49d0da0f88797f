"""``IcebergDataset``: one snapshot of an Apache Iceberg table, planned into row-group / stripe splits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._planning.cache import check_plan_cache
from ._sources.iceberg import IcebergOrigin
from ._sources.iceberg_table import load_table, open_source
from .dataset import StructuredDataset
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from ._loader.dataset import ArrowStreamDataLoader


class IcebergDataset(StructuredDataset):
    """Batches of one snapshot of an Iceberg table, with every guarantee of :class:`StructuredDataset`.

    The catalog comes from ``catalog_config`` (pyiceberg's ``load_catalog`` properties; the default
    is pyiceberg's SQL catalog on SQLite, ``./catalog.db``, with the warehouse ``./warehouse``).
    The snapshot (the latest by default) is pinned: it is in the loader state, and a state
    resumes on its snapshot even after the table moved on. pyiceberg plans the scan
    (``row_filter`` prunes manifests and data files); each data file (Parquet or ORC) is cut into
    splits at row groups or stripes; positional delete files are applied, columns are matched by
    field id (renamed, added, dropped columns read correctly), and equality deletes are refused.

    Args:
        table: The table identifier, ``"namespace.table"``.
        catalog_config: Properties of the catalog (``{"type": "sql", "uri": ..., "warehouse": ...}``,
            a REST, Glue or Hive catalog); ``"name"`` names it (default ``"default"``).
        snapshot_id: The snapshot to read; ``None`` for the current one.
        row_filter: A pyiceberg expression or its string form (``"label = 3 and x > 0.5"``).
        selected_fields: Columns to read; all when ``None``.
        plan_cache: Where what planning read of the snapshot's data and delete files is kept, so that a restart
            reads only the manifests: ``None`` (default: ``$ARROWSTREAM_CACHE_DIR``, else the user cache folder),
            a folder, or ``False`` (no cache). See docs/iceberg.md.
        batch_size: Rows per yielded batch.
        **kwargs: The other knobs of :class:`StructuredDataset` (``shuffle``, ``seed``,
            ``shuffle_buffer_size``, ``interleave``, ``output_format``, ``rank``, ``plan_locally`` ...).
            Under torch.distributed the ranks also compare the table, snapshot, ``row_filter`` and
            ``selected_fields`` with rank 0's (pass ``snapshot_id`` when commits may land while the
            ranks load the table).

    Example:
        >>> import arrowstream, pyarrow as pa, tempfile
        >>> from pyiceberg.catalog import load_catalog
        >>> config = arrowstream.iceberg_catalog_config(tempfile.mkdtemp())
        >>> catalog = load_catalog("default", **config)
        >>> catalog.create_namespace("db")
        >>> events = pa.table({"x": pa.array(range(10), pa.int64())})
        >>> catalog.create_table("db.events", schema=events.schema).append(events)
        >>> dataset = arrowstream.IcebergDataset("db.events", catalog_config=config, batch_size=4)
        >>> [len(batch["x"]) for batch in dataset]
        [4, 4, 2]
    """

    def __init__(self, table: str, catalog_config: dict[str, Any] | None = None, snapshot_id: int | None = None,
                 row_filter: Any = None, selected_fields: Sequence[str] | None = None, batch_size: int = 1024,
                 plan_cache: Any = None, **kwargs: Any) -> None:
        for name in ("path", "format", "columns", "filter", "storage_options", "credential_provider"):
            if name in kwargs:
                hint = {"columns": "use selected_fields=", "filter": "use row_filter=",
                        "credential_provider": "put the FileIO properties (s3.access-key-id, ...) into "
                                               "catalog_config",
                        "storage_options": "put the FileIO properties (s3.access-key-id, ...) into catalog_config, "
                                           "which pyiceberg hands to the table's FileIO"}.get(name, "the table decides it")
                raise InvalidArgumentError(f"{name}: IcebergDataset does not take {name}=; {hint}")
        if snapshot_id is not None and (isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int)):
            raise InvalidArgumentError(f"snapshot_id: expected an int or None, got {snapshot_id!r}")
        plan_cache = check_plan_cache(plan_cache)
        snapshot = open_source(load_table(table, catalog_config), table, snapshot_id, row_filter, selected_fields)
        columns = None if "*" in snapshot.selected_fields else list(snapshot.output_columns)
        super().__init__(IcebergOrigin(snapshot, pinned_by_user=snapshot_id is not None, plan_cache=plan_cache),
                         batch_size=batch_size, columns=columns, filter=snapshot.arrow_filter, **kwargs)

    @classmethod
    def create_dataloader(cls, table: str, catalog_config: dict[str, Any] | None = None,  # type: ignore[override]
                          batch_size: int = 1024, *, num_workers: int = 0,
                          **kwargs: Any) -> tuple[ArrowStreamDataLoader, IcebergDataset]:
        """Build the dataset and its ``StatefulDataLoader``; returns ``(loader, dataset)``.

        Example:
            >>> import arrowstream, pyarrow as pa, tempfile
            >>> from pyiceberg.catalog import load_catalog
            >>> config = arrowstream.iceberg_catalog_config(tempfile.mkdtemp())
            >>> catalog = load_catalog("default", **config)
            >>> catalog.create_namespace("db")
            >>> events = pa.table({"x": pa.array(range(10), pa.int64())})
            >>> catalog.create_table("db.events", schema=events.schema).append(events)
            >>> loader, dataset = arrowstream.IcebergDataset.create_dataloader(
            ...     table="db.events", catalog_config=config, batch_size=4, row_filter="x >= 3")
            >>> dataset.set_epoch(0)
            >>> sum(len(batch["x"]) for batch in loader)
            7
        """
        from ._loader.dataset import build_dataloader

        loader, dataset = build_dataloader(
            cls, dataset_args={"table": table, "catalog_config": catalog_config, "batch_size": batch_size},
            num_workers=num_workers, **kwargs)
        return loader, dataset

    @property
    def snapshot_id(self) -> int:
        """The snapshot this dataset reads."""
        return self._table_source.snapshot_id

    @property
    def _table_source(self) -> IcebergOrigin:
        assert isinstance(self._origin, IcebergOrigin)
        return self._origin

    def __repr__(self) -> str:
        source = self._table_source
        return (f"IcebergDataset(table={source.table_name!r}, snapshot_id={source.snapshot_id}, "
                f"files={len(self._plan.files)}, rows={self._plan.num_rows}, batch_size={self._options.batch_size})")
