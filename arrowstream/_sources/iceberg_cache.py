"""The plan cache of an Iceberg snapshot: what planning read of a snapshot's data and delete files, kept on disk.

Planning a snapshot asks pyiceberg for its scan tasks (the manifests: partition values, the files that may
match the row filter), then reads from storage every data file's footer and every positional delete file.
The second part is what an entry keeps: per data file (path as the scan task gives it, size) its own
format's footer (Parquet or ORC: schema, units' rows and bytes, kept units; a Parquet ``FileMetaData``
where the plan keeps it as a handle) and the positions deleted in it (an int64 list column). A snapshot
is immutable (Iceberg never rewrites a data or delete file in place), so the entry is keyed by the
table's uuid, the snapshot, the schema, the row filter and the selected fields, and checked against the
scan tasks' paths and sizes alone: a start whose tasks differ rebuilds it. A warm start still reads
the manifests (pyiceberg plans the tasks), and no data file footer and no delete file.

The entry is written, read, verified, bounded and rebuilt by ``arrowstream._planning.cache.PlanCache``; it holds neither
the catalog's configuration nor the FileIO's properties (credentials stay out).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .._core.plan_types import FileEntry
from .._formats import FileFormat
from .._formats.footer_table import tabled
from .._formats.footers import FooterTable, handle_budget
from .._planning.cache import PlanCache, PlanCacheSetting, cache_folder
from .._planning.cache_entry import CACHE_VERSION, encode, entry_footers
from .iceberg_table import IcebergSource

Deleted = npt.NDArray[np.int64] | None   # a data file's deleted positions, sorted; None: no deletes


def key_material(source: IcebergSource, file_format: FileFormat) -> dict[str, Any]:
    """What decides a snapshot's entry, but the scan tasks (checked inside): no catalog or FileIO setting."""
    return {
        "cache_version": CACHE_VERSION,
        "pyarrow": int(pa.__version__.split(".")[0]),
        "protocol": "iceberg",
        "table_uuid": str(source.table.metadata.table_uuid),
        "snapshot_id": source.snapshot_id,
        "schema_id": source.schema_id,
        "row_filter": str(source.row_filter),
        "selected_fields": list(source.selected_fields),
        "format": file_format.name,                 # of the data files
        "handle_budget": handle_budget(False),      # which Parquet footers the plan keeps as handles
    }


class IcebergPlanCache(PlanCache):
    """One snapshot's entry (see the module docstring): the data files' footers and their deleted positions."""

    needs_tags = False   # a snapshot's files are never rewritten in place: paths and sizes tell them

    def load_snapshot(self, entries: Sequence[FileEntry]) -> tuple[FooterTable, list[Deleted]] | None:
        """The footers of the data files ``entries`` (the scan tasks', in plan order) and their deleted
        positions; None (logged, to be rebuilt) when the entry is missing, stale or damaged."""
        def decode(header: dict[str, Any], table: pa.Table, listing: dict[str, pa.Array]) -> tuple[
                FooterTable, list[Deleted]]:
            return (entry_footers(header, table, listing, entries, self.file_format),
                    deleted_of(table.column("deleted"), len(entries)))

        return self._load(entries, decode)

    def store_snapshot(self, footers: FooterTable, deleted: Sequence[Deleted]) -> None:
        """Write the entry of the data files' ``footers`` and their ``deleted`` positions."""
        if tabled(footers):
            self._write(lambda: encode(self.material, footers, {"deleted": deleted_column(deleted)}))


def deleted_column(deleted: Sequence[Deleted]) -> pa.Array:
    """The files' deleted positions as one large_list<int64> column, null where a file has no deletes
    (one copy of all positions, no Python object per position)."""
    lengths = np.array([0 if d is None else len(d) for d in deleted], dtype=np.int64)
    offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths, dtype=np.int64)])
    present = [d for d in deleted if d is not None]
    values = np.concatenate(present).astype(np.int64, copy=False) if present else np.zeros(0, dtype=np.int64)
    return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values, pa.int64()),
                                         mask=pa.array([d is None for d in deleted], pa.bool_()))


def deleted_of(column: pa.ChunkedArray, num_files: int) -> list[Deleted]:
    """The deleted positions :func:`deleted_column` wrote, one array per file; ValueError when the column is not
    one it wrote (positions not sorted, not distinct or negative: readers cut batches by them)."""
    array = column.combine_chunks()
    if not isinstance(array, pa.LargeListArray) or not pa.types.is_int64(array.type.value_type):
        raise ValueError(f"deleted positions of type {array.type} where large_list<int64> belongs")
    if len(array) != num_files:
        raise ValueError(f"deleted positions of {len(array)} files in an entry of {num_files}")
    offsets = array.offsets.to_numpy()
    values = array.values.to_numpy(zero_copy_only=False)
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    out: list[Deleted] = []
    for i in range(num_files):
        positions = values[offsets[i]:offsets[i + 1]] if valid[i] else None
        if positions is not None and len(positions) and (positions[0] < 0 or (np.diff(positions) <= 0).any()):
            raise ValueError(f"the deleted positions of file {i} are not sorted, distinct and non-negative")
        out.append(positions if positions is not None and len(positions) else None)
    return out


def iceberg_cache_for(setting: PlanCacheSetting, source: IcebergSource,
                      file_format: FileFormat) -> IcebergPlanCache | None:
    """The snapshot's entry in the folder ``setting`` names; None when the cache is off."""
    folder = cache_folder(setting)
    if folder is None:
        return None
    return IcebergPlanCache(folder, key_material(source, file_format), file_format)
