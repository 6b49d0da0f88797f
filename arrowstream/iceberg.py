"""``IcebergDataset``: one snapshot of an Apache Iceberg table, planned into row-group / stripe splits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ._iceberg import IcebergSource, load_table, open_source, plan_iceberg
from ._planning import Plan
from ._state import WorkerState, check_same_table
from ._storage import Storage
from .dataset import StructuredDataset
from .errors import InvalidArgumentError, StateMismatchError

if TYPE_CHECKING:
    from .loader import ArrowStreamDataLoader


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
                 **kwargs: Any) -> None:
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
        self._table = load_table(table, catalog_config)
        self._pinned_by_user = snapshot_id is not None
        self._source: IcebergSource = open_source(self._table, table, snapshot_id, row_filter, selected_fields)
        columns = None if "*" in self._source.selected_fields else list(self._source.output_columns)
        super().__init__(None, format="iceberg", batch_size=batch_size, columns=columns,
                         filter=self._source.arrow_filter, **kwargs)

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
        from .loader import build_dataloader

        loader, dataset = build_dataloader(
            cls, dataset_args={"table": table, "catalog_config": catalog_config, "batch_size": batch_size},
            num_workers=num_workers, **kwargs)
        return loader, dataset

    @property
    def snapshot_id(self) -> int:
        """The snapshot this dataset reads."""
        return self._source.snapshot_id

    def _arguments(self, path: Any) -> dict[str, Any]:
        source = self._source  # the snapshot too: ranks that loaded the table around a commit differ there
        return {**super()._arguments(path), "table": source.table_name, "snapshot_id": source.snapshot_id,
                "row_filter": str(source.row_filter), "selected_fields": list(source.selected_fields)}

    def _make_plan(self, path: Any, storage_options: dict[str, Any] | None) -> tuple[Storage, Plan, tuple[int, int] | None]:
        storage, plan = plan_iceberg(self._source, self._options.split_bytes, self._retry)
        return storage, plan, (self._source.snapshot_id, self._source.schema_id)

    def _follow_snapshot(self, saved: WorkerState) -> None:
        """Re-plan on the checkpoint's snapshot when the table moved on since (unless pinned here)."""
        check_same_table(saved.data, self._data, repr(self._source.table_name))
        wanted = saved.data.snapshot_id
        if wanted is None or self._pinned_by_user or (wanted, saved.data.schema_id) == (
                self._source.snapshot_id, self._source.schema_id):
            return
        if self._table is None:
            raise StateMismatchError("this IcebergDataset was copied into a worker; load the state in the main process")
        if self._table.snapshot_by_id(wanted) is None:
            # a checkpoint that names the table's uuid was checked above; an older one may be from a recreated table
            recreated = "" if saved.data.table_uuid is not None else (
                " or the table was dropped and recreated (this checkpoint does not record the table's uuid)")
            raise StateMismatchError(
                f"the checkpoint was taken on snapshot {wanted} of {self._source.table_name!r}, which has expired{recreated} "
                f"(the table now starts at {[s.snapshot_id for s in self._table.snapshots()][:3]}); the rest of that "
                "epoch cannot be read exactly. Start the run without loading the checkpoint, or restore the snapshot")
        self._source = open_source(self._table, self._source.table_name, wanted, self._source.row_filter,
                                   None if "*" in self._source.selected_fields else self._source.selected_fields,
                                   saved.data.schema_id)
        self._use_plan(*self._make_plan(None, None))

    def _use_plan(self, storage: Storage, plan: Plan, snapshot: tuple[int, int] | None) -> None:
        super()._use_plan(storage, plan, snapshot)
        # the table's uuid joins the data identity: a state taken on a table since dropped and recreated under
        # its name is refused as such (check_same_table), not as an expired snapshot
        self._data = replace(self._data, table_uuid=str(self._table.metadata.table_uuid))

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        source = self._source
        state["_table"] = None  # a catalog connection does not travel to workers; the plan has all they need
        state["_source"] = IcebergSource(source.table_name, None, source.snapshot_id, source.schema_id,
                                         source.row_filter, source.selected_fields, source.arrow_filter,
                                         source.output_columns)
        return state

    def __repr__(self) -> str:
        return (f"IcebergDataset(table={self._source.table_name!r}, snapshot_id={self._source.snapshot_id}, "
                f"files={len(self._plan.files)}, rows={self._plan.num_rows}, batch_size={self._options.batch_size})")
