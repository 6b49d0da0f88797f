"""What a loaded checkpoint must match of the data: ``data_identity="strict"`` or ``"layout"``.

A state remembers the data it was taken on by two digests (see ``docs/state-format.md``):

- the data ``fingerprint`` (strict): every file's relative name, size, modification tag (mtime, ETag,
  generation) and unit row counts, and the schema;
- its :class:`DataShape`: the same without the modification tags, kept as one digest per part (names, sizes,
  unit row counts, schema) so that a refusal can say which part differs.

Names are relative to the files' common folder (Iceberg: to the table's location), so a copy of the data
under another root, bucket or scheme has the same layout. ``"strict"`` (the default) refuses a copy,
whose tags differ, and names the option that accepts it; ``"layout"`` accepts a copy, and would accept a
rewrite in place that keeps every size and row count too, which is why it is not the default. Whatever the
mode, reads are pinned to the tags of the files listed now (``_storage.pinned``): a file that changes during an
epoch after a resume still raises ``FileChangedError``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .._core.fields import REMEDY, Fields, shorten
from ..errors import ArgumentTypeError, InvalidArgumentError, StateError, StateMismatchError

if TYPE_CHECKING:
    from .._core.plan_types import PlanView

STRICT, LAYOUT = "strict", "layout"
DATA_IDENTITIES = (STRICT, LAYOUT)
_RESTART = "start without loading the checkpoint"


def check_data_identity(value: Any, name: str = "data_identity") -> str:
    """``value``, checked: ``"strict"`` or ``"layout"``; an arrowstream error naming ``name`` if not."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name}: expected 'strict' or 'layout', got {type(value).__name__} {shorten(value)}")
    if value not in DATA_IDENTITIES:
        raise InvalidArgumentError(
            f"{name}: expected 'strict' (a checkpoint resumes only on the files it was taken on: names, sizes, "
            f"modification times or ETags, row counts, schema) or 'layout' (the same without modification times "
            f"or ETags: a copy of the data elsewhere), got {shorten(value)}")
    return value


@dataclass(frozen=True)
class DataShape:
    """The data without its modification tags: a digest of each part, and sizes that messages can show."""

    names: str    # the files' relative names, in order
    sizes: str    # their sizes in bytes
    rows: str     # the row counts of their units (row groups, stripes, record batches, stretches of text)
    schema: str   # the schema of the files, as the plan reads them (names and types of every column)
    num_bytes: int
    num_columns: int

    def to_dict(self) -> dict[str, Any]:
        return {"names": self.names, "sizes": self.sizes, "rows": self.rows, "schema": self.schema,
                "num_bytes": self.num_bytes, "num_columns": self.num_columns}

    @classmethod
    def from_dict(cls, data: Fields) -> DataShape:
        return cls(data.string("names"), data.string("sizes"), data.string("rows"), data.string("schema"),
                   data.integer("num_bytes"), data.integer("num_columns"))


def _digest(*parts: bytes | memoryview) -> str:
    digest = hashlib.sha256()
    for part in parts:   # each part's length first: ("ab", "c") and ("a", "bc") differ
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()[:32]


def _int64_bytes(values: Any) -> bytes:
    return np.ascontiguousarray(values, dtype="<i8").tobytes()


def _string_bytes(names: pa.Array) -> tuple[bytes, bytes | memoryview]:
    """The characters of ``names`` and where each ends, from the array's buffers (no string per name)."""
    names = names.cast(pa.large_string())
    offsets = np.frombuffer(names.buffers()[1], dtype="<i8")[names.offset:names.offset + len(names) + 1]
    start, stop = (int(offsets[0]), int(offsets[-1])) if len(offsets) else (0, 0)
    data = names.buffers()[2]
    return _int64_bytes(offsets - start), b"" if data is None else memoryview(data)[start:stop]


def shape_of(plan: PlanView) -> DataShape:
    """The layout of ``plan``'s files, hashed from its columns (a few MB for 50,000 files)."""
    files = plan.files
    schema = plan.identity.get("schema") or []
    offsets = np.asarray(files.unit_offsets, dtype=np.int64)
    first, last = (int(offsets[0]), int(offsets[-1])) if len(offsets) else (0, 0)   # the files' units, from 0
    return DataShape(names=_digest(*_string_bytes(files.names)), sizes=_digest(_int64_bytes(files.sizes)),
                  rows=_digest(_int64_bytes(offsets - first), _int64_bytes(files.unit_rows[first:last])),
                  schema=_digest(repr(schema).encode()),
                  num_bytes=int(np.sum(files.sizes, dtype=np.int64)), num_columns=len(schema))


def _differences(saved: DataIdentity, current: DataIdentity, saved_layout: DataShape, layout: DataShape) -> list[str]:
    """What differs between two layouts, saved vs current, one phrase each."""
    found = []
    if saved.num_files != current.num_files or saved_layout.names != layout.names:
        same = " (as many, other names or places)" if saved.num_files == current.num_files else ""
        found.append(f"file names: saved {saved.num_files} file(s), now {current.num_files}{same}")
    if saved_layout.sizes != layout.sizes:
        same = " (the same in total, not file by file)" if saved_layout.num_bytes == layout.num_bytes else ""
        found.append(f"file sizes: saved {saved_layout.num_bytes} bytes in all, now {layout.num_bytes}{same}")
    if saved.num_rows != current.num_rows or saved_layout.rows != layout.rows:
        same = " (the same in total, not unit by unit)" if saved.num_rows == current.num_rows else ""
        found.append(f"row counts of the files' row groups (or stripes, batches): saved {saved.num_rows} rows, "
                     f"now {current.num_rows}{same}")
    if saved_layout.schema != layout.schema:
        found.append(f"schema: saved {saved_layout.num_columns} column(s) (digest {saved_layout.schema[:12]}), now "
                     f"{layout.num_columns} (digest {layout.schema[:12]})")
    return found


def check_same_data(saved: DataIdentity, current: DataIdentity, data_identity: str = STRICT,
                    what: str = "this dataset") -> None:
    """Refuse a state taken on other data than ``current``, as ``data_identity`` compares them: saved vs
    current, naming the parts that differ and the option that accepts a copy."""
    if saved.fingerprint == current.fingerprint:
        return
    layout = current.layout
    assert layout is not None, "a planned dataset knows its layout"
    if saved.layout is None:   # a checkpoint of an earlier release: its fingerprint is all it has
        raise StateMismatchError(
            f"checkpoint was taken on {saved.num_files} file(s) with {saved.num_rows} rows (fingerprint "
            f"{saved.fingerprint[:12]}), {what} has {current.num_files} file(s) with {current.num_rows} rows "
            f"(fingerprint {current.fingerprint[:12]}); the files, their sizes or modification times differ. This "
            "checkpoint was written by an earlier arrowstream and records no layout, so data_identity='layout' "
            f"cannot tell a copy of its data from other data: point the dataset at the same data, or {_RESTART}")
    differences = _differences(saved, current, saved.layout, layout)
    if not differences:
        if data_identity == LAYOUT:
            return   # the same files elsewhere, or touched: their modification tags are all that differ
        raise StateMismatchError(
            f"checkpoint was taken on {saved.num_files} file(s) modified or copied since: {what} has the same names, "
            f"sizes, row counts and schema, but other modification tags (mtime, ETag or generation; data "
            f"fingerprint saved {saved.fingerprint[:12]}, now {current.fingerprint[:12]}). If this is a copy of the "
            "same data (cp, rsync, a re-upload, another folder or bucket), pass data_identity='layout' to resume on "
            f"it; if the files were rewritten, their rows may differ: {_RESTART}")
    mode = ", other data even without modification tags (data_identity='layout')" if data_identity == LAYOUT else ""
    raise StateMismatchError(
        f"checkpoint was taken on {saved.num_files} file(s) with {saved.num_rows} rows (fingerprint "
        f"{saved.fingerprint[:12]}), {what} has {current.num_files} file(s) with {current.num_rows} rows (fingerprint "
        f"{current.fingerprint[:12]}){mode}; what differs: {'; '.join(differences)}. Point the dataset at the data "
        f"the checkpoint was taken on (or a copy of it), or {_RESTART}")


def shape_field(data: Fields) -> DataShape | None:
    """The optional ``layout`` of a state's data identity (absent in states of earlier releases)."""
    value = data.value.get("layout")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise StateError(f"the state's {data.name('layout')} is {shorten(value)}, expected a dict or null; {REMEDY}")
    return DataShape.from_dict(Fields(value, data.name("layout")))


@dataclass(frozen=True)
class DataIdentity:
    """What the state remembers of the data: enough to refuse other data, nothing more."""

    fingerprint: str
    num_files: int
    num_rows: int
    snapshot_id: int | None = None  # the Iceberg snapshot read, and the schema it is read in; None for files
    schema_id: int | None = None
    table_uuid: str | None = None   # the Iceberg table's uuid (a table dropped and recreated gets a new one)
    layout: DataShape | None = None    # the data without modification tags (data_identity="layout"); None in older states

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"fingerprint": self.fingerprint, "num_files": self.num_files,
                                "num_rows": self.num_rows, "snapshot_id": self.snapshot_id, "schema_id": self.schema_id}
        if self.table_uuid is not None:  # Iceberg only: file states are unchanged, the version stays 5
            data["table_uuid"] = self.table_uuid
        if self.layout is not None:   # optional on load: states of earlier releases have none
            data["layout"] = self.layout.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Fields) -> DataIdentity:
        table_uuid = data.value.get("table_uuid")   # optional: absent in file states and older Iceberg ones
        if table_uuid is not None and not isinstance(table_uuid, str):
            raise StateError(f"the state's {data.name('table_uuid')} is {shorten(table_uuid)}, expected a string or "
                             f"null; {REMEDY}")
        return cls(data.string("fingerprint"), data.integer("num_files"), data.integer("num_rows"),
                   data.optional_integer("snapshot_id"), data.optional_integer("schema_id"), table_uuid,
                   shape_field(data))
