"""A snapshot of an Iceberg table as a :class:`~arrowstream._sources.files.Origin` (see ``arrowstream.iceberg``).

The snapshot is pinned: the data identity records it (and the schema it is read in, and the
table's uuid), and a loaded state taken on another snapshot of the same table is followed, unless
the user pinned one, by a source of that snapshot, which the dataset plans instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .._planning.cache import CacheOutcome, PlanCacheSetting
from .._state.compatible import check_same_table
from .._state.identity import DataIdentity, shape_of
from ..errors import StateMismatchError
from .files import Origin
from .iceberg_files import plan_iceberg
from .iceberg_table import IcebergSource, open_source

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa

    from .._planning.options import Options
    from .._planning.plan import Plan
    from .._storage.filesystem import Storage
    from .._storage.retry import RetryPolicy


@dataclass(frozen=True)
class IcebergOrigin(Origin):
    """One snapshot of a table: ``snapshot`` (table, snapshot, schema, filter and projection) and whether
    the user pinned it (then a checkpoint of another snapshot is refused, not followed); ``plan_cache``
    where the snapshot's planning is kept (``_sources.iceberg_cache``; not in ``arguments()``: where the footers
    are kept decides nothing about the data or the batches)."""

    snapshot: IcebergSource
    pinned_by_user: bool
    plan_cache: PlanCacheSetting = None
    # what the last plan did with the cache (set by plan; a record of the planning, not part of the origin's value)
    cache_outcome: CacheOutcome | None = field(default=None, compare=False, repr=False)

    format = "iceberg"
    plans_on_rank0 = False  # each rank reads the table's manifests through its own catalog connection

    # what the rest of the package reads of the snapshot (benchmarks, inspect)
    @property
    def table(self) -> Any:
        return self.snapshot.table

    @property
    def table_name(self) -> str:
        return self.snapshot.table_name

    @property
    def snapshot_id(self) -> int:
        return self.snapshot.snapshot_id

    @property
    def row_filter(self) -> Any:
        return self.snapshot.row_filter

    @property
    def selected_fields(self) -> tuple[str, ...]:
        return self.snapshot.selected_fields

    def arguments(self) -> dict[str, Any]:
        # the snapshot too: ranks that loaded the table around a commit differ there
        snapshot = self.snapshot
        return {"path": None, "table": snapshot.table_name, "snapshot_id": snapshot.snapshot_id,
                "row_filter": str(snapshot.row_filter), "selected_fields": list(snapshot.selected_fields)}

    def plan(self, options: Options, retry: RetryPolicy) -> tuple[Storage, Plan]:
        storage, plan, outcome = plan_iceberg(self.snapshot, options.split_bytes, retry, self.plan_cache)
        object.__setattr__(self, "cache_outcome", outcome)   # a record of this planning, not of the source
        return storage, plan

    def identity(self, plan: Plan) -> DataIdentity:
        # the table's uuid joins the data identity: a state taken on a table since dropped and recreated under
        # its name is refused as such (check_same_table), not as an expired snapshot
        table = self.snapshot.table
        assert table is not None, "an Iceberg source is planned where it holds its table"
        return DataIdentity(plan.data_fingerprint, len(plan.files), plan.num_rows, self.snapshot.snapshot_id,
                            self.snapshot.schema_id, str(table.metadata.table_uuid), shape_of(plan))

    def follow(self, saved: DataIdentity, current: DataIdentity, front: str = "IcebergDataset") -> IcebergOrigin | None:
        """The checkpoint's snapshot when the table moved on since (unless pinned here); ``front``: the class the
        user built (``IcebergDataset``, or ``Mixture`` of an ``IcebergSource``), named in the errors."""
        snapshot, table = self.snapshot, self.snapshot.table
        check_same_table(saved, current, repr(snapshot.table_name))
        wanted = saved.snapshot_id
        if wanted is None or self.pinned_by_user or (wanted, saved.schema_id) == (snapshot.snapshot_id,
                                                                                snapshot.schema_id):
            return None
        if table is None:
            raise StateMismatchError(
                f"the checkpoint was taken on snapshot {wanted} of Iceberg table {snapshot.table_name!r}, which has "
                f"moved on since (snapshot {snapshot.snapshot_id} now), and this {front} is a copy in a worker process "
                "started by spawn or forkserver, where no catalog connection travels (a plain StatefulDataLoader hands "
                "the state to its workers only), so it cannot go back to that snapshot. Resume with "
                f"{front}.create_dataloader(...), whose loader follows the snapshot in the trainer's process; or build "
                "your StatefulDataLoader with multiprocessing_context='fork' (or num_workers=0); or pin "
                f"snapshot_id={wanted} where you name the table")
        if table.snapshot_by_id(wanted) is None:
            # a checkpoint that names the table's uuid was checked above; an older one may be from a recreated table
            recreated = "" if saved.table_uuid is not None else (
                " or the table was dropped and recreated (this checkpoint does not record the table's uuid)")
            raise StateMismatchError(
                f"the checkpoint was taken on snapshot {wanted} of {snapshot.table_name!r}, which has expired{recreated} "
                f"(the table now starts at {[s.snapshot_id for s in table.snapshots()][:3]}); the rest of that "
                "epoch cannot be read exactly. Start the run without loading the checkpoint, or restore the snapshot")
        followed = open_source(table, snapshot.table_name, wanted, snapshot.row_filter,
                               None if "*" in snapshot.selected_fields else snapshot.selected_fields, saved.schema_id)
        return replace(self, snapshot=followed)

    def baseline_batches(self, plan: Plan, storage: Storage, batch_size: int) -> Iterator[pa.RecordBatch]:
        """The pinned snapshot's rows through pyiceberg's own scan."""
        return self.snapshot.baseline_batches(batch_size)

    def for_workers(self) -> IcebergOrigin:
        # a catalog connection does not travel to workers; the plan has all they need
        snapshot = self.snapshot
        return replace(self, snapshot=IcebergSource(snapshot.table_name, None, snapshot.snapshot_id, snapshot.schema_id,
                                                    snapshot.row_filter, snapshot.selected_fields,
                                                    snapshot.arrow_filter, snapshot.output_columns),
                       plan_cache=False)
