"""The files of a plan as columns: what planning learned from every file's metadata, held compactly.

A plan of a million units holds no Python object per unit and none per file beyond what it was
given to keep: names, paths and modification tags are Arrow string arrays (one buffer each), sizes
and unit counts int64 arrays (a file's units are a slice of one array, found by its offset), equal
schemas one object. A :class:`FileFooter` is made on demand when a reader asks for a file
(``plan.files[i]``), so the readers and formats keep the type they know. The table pickles as a
few buffers, which is what fork, spawn and forkserver workers receive.
"""

from __future__ import annotations

import hashlib
import json
import operator
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .._core.plan_types import FileEntry
from . import FileFooter

# Parquet FileMetaData handles save a worker from reading a footer again, but one costs ~10x its
# serialized size in memory (a 1 KB footer: ~11 KB resident). The rule: a plan keeps the handles when
# the lead file's footer times the number of files stays under the budget of its storage, else none (the
# lead decides, so the rule is deterministic). Local files get a small budget: a worker re-reads a local
# footer in ~0.1 ms. Remote ones a larger one: a handle saves a request and feeds read-ahead (byte ranges).
LOCAL_HANDLE_BUDGET = 1 << 20
REMOTE_HANDLE_BUDGET = 16 << 20
_FINGERPRINT_CHUNK = 4096   # files turned into JSON at a time while hashing


def handle_budget(is_local: bool) -> int:
    """Serialized footer bytes a plan of that storage may keep as handles (see the rule above)."""
    return LOCAL_HANDLE_BUDGET if is_local else REMOTE_HANDLE_BUDGET


def _int64(values: array[int]) -> npt.NDArray[np.int64]:
    out = np.frombuffer(values, dtype=np.int64) if len(values) else np.zeros(0, dtype=np.int64)
    out.flags.writeable = False
    return out


class FooterTable(Sequence[FileFooter]):
    """Every file's footer, as columns; reads as the ``list[FileFooter]`` it replaces.

    ``unit_offsets[i]:unit_offsets[i + 1]`` are file ``i``'s units in ``unit_rows`` and ``unit_bytes``,
    ``kept_offsets`` the same for ``kept_units``. Handles and format extras (Iceberg deletes, text row
    layouts) are kept by file index where there are any. ``known_fingerprints`` holds the data fingerprints
    of the files computed so far (:func:`files_fingerprint`), by identity.

    Example:
        >>> import pyarrow as pa
        >>> footer = FileFooter(FileEntry("/d/a.parquet", "a.parquet", 10, "mtime=1"), "parquet",
        ...                     pa.schema([("x", pa.int64())]), (3, 4), (50, 60), (0, 1))
        >>> table = FooterTable.build([footer, footer])
        >>> len(table), table[1].unit_rows, table.num_units
        (2, (3, 4), 4)
    """

    def __init__(self, *, paths: pa.Array, names: pa.Array, tags: pa.Array, versions: pa.Array,
                 sizes: npt.NDArray[np.int64], formats: list[str], format_index: npt.NDArray[np.int8],
                 schemas: list[pa.Schema], schema_index: npt.NDArray[np.int32],
                 unit_offsets: npt.NDArray[np.int64], unit_rows: npt.NDArray[np.int64],
                 unit_bytes: npt.NDArray[np.int64], kept_offsets: npt.NDArray[np.int64],
                 kept_units: npt.NDArray[np.int64], handles: dict[int, Any], extras: dict[int, Any],
                 known_fingerprints: dict[str, str] | None = None) -> None:
        self.paths, self.names, self.tags, self.versions, self.sizes = paths, names, tags, versions, sizes
        self.formats, self.format_index, self.schemas, self.schema_index = formats, format_index, schemas, schema_index
        self.unit_offsets, self.unit_rows, self.unit_bytes = unit_offsets, unit_rows, unit_bytes
        self.kept_offsets, self.kept_units = kept_offsets, kept_units
        self.handles, self.extras = handles, extras
        # data fingerprints of these files, by the JSON of the identity they were computed with: computed
        # once per table, and kept in the plan cache's entry so that a warm restart computes none
        self.known_fingerprints: dict[str, str] = dict(known_fingerprints or {})
        self._last: tuple[int, FileFooter] | None = None   # readers ask for one file many times in a row

    @classmethod
    def build(cls, footers: Iterable[FileFooter]) -> FooterTable:
        """The table of ``footers`` (one pass; they may come from a generator), their handles kept (planning
        has dropped those over the budget: see :func:`handle_budget`)."""
        paths: list[str] = []
        names: list[str] = []
        tags: list[str] = []
        versions: list[str] = []
        sizes, rows, unit_bytes, kept = array("q"), array("q"), array("q"), array("q")
        unit_offsets, kept_offsets = array("q", [0]), array("q", [0])
        formats: list[str] = []
        format_index, schema_index = array("b"), array("i")
        schemas: list[pa.Schema] = []
        handles: dict[int, Any] = {}
        extras: dict[int, Any] = {}
        for index, footer in enumerate(footers):
            entry = footer.entry
            paths.append(entry.path)
            names.append(entry.name)
            tags.append(entry.tag)
            versions.append(entry.version)
            sizes.append(entry.size)
            if footer.format not in formats:
                formats.append(footer.format)
            format_index.append(formats.index(footer.format))
            schema_index.append(shared_schema(schemas, footer.schema))
            rows.extend(footer.unit_rows)
            unit_bytes.extend(footer.unit_bytes)
            kept.extend(footer.kept_units)
            unit_offsets.append(len(rows))
            kept_offsets.append(len(kept))
            if footer.handle is not None:
                handles[index] = footer.handle
            if footer.extra is not None:
                extras[index] = footer.extra
        return cls(paths=pa.array(paths, pa.large_string()), names=pa.array(names, pa.large_string()),
                   tags=pa.array(tags, pa.large_string()), versions=pa.array(versions, pa.large_string()),
                   sizes=_int64(sizes), formats=formats, format_index=np.frombuffer(format_index, dtype=np.int8),
                   schemas=schemas, schema_index=np.frombuffer(schema_index, dtype=np.int32),
                   unit_offsets=_int64(unit_offsets), unit_rows=_int64(rows), unit_bytes=_int64(unit_bytes),
                   kept_offsets=_int64(kept_offsets), kept_units=_int64(kept), handles=handles, extras=extras)

    @property
    def num_units(self) -> int:
        return len(self.unit_rows)

    @property
    def num_rows(self) -> int:
        return int(self.unit_rows.sum())

    def file_rows(self) -> npt.NDArray[np.int64]:
        """The rows of each file."""
        sums = np.concatenate([[0], np.cumsum(self.unit_rows, dtype=np.int64)])
        return np.asarray(sums[self.unit_offsets[1:]] - sums[self.unit_offsets[:-1]], dtype=np.int64)

    def path(self, index: int) -> str:
        return str(self.paths[index].as_py())

    def schema_of(self, index: int) -> pa.Schema:
        return self.schemas[int(self.schema_index[index])]

    def __len__(self) -> int:
        return len(self.sizes)

    @overload
    def __getitem__(self, index: int) -> FileFooter: ...

    @overload
    def __getitem__(self, index: slice) -> list[FileFooter]: ...

    def __getitem__(self, index: int | slice) -> FileFooter | list[FileFooter]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        position = operator.index(index)
        if position < 0:
            position += len(self)
        if not 0 <= position < len(self):
            raise IndexError(f"file index {index} out of range for {len(self)} files")
        last = self._last
        if last is not None and last[0] == position:
            return last[1]
        footer = self._footer(position)
        self._last = (position, footer)
        return footer

    def _footer(self, i: int) -> FileFooter:
        entry = FileEntry(self.path(i), str(self.names[i].as_py()), int(self.sizes[i]), str(self.tags[i].as_py()),
                          str(self.versions[i].as_py()))
        units = slice(int(self.unit_offsets[i]), int(self.unit_offsets[i + 1]))
        kept = slice(int(self.kept_offsets[i]), int(self.kept_offsets[i + 1]))
        return FileFooter(entry, self.formats[int(self.format_index[i])], self.schema_of(i),
                          tuple(self.unit_rows[units].tolist()), tuple(self.unit_bytes[units].tolist()),
                          tuple(self.kept_units[kept].tolist()), self.handles.get(i), self.extras.get(i))

    def __iter__(self) -> Iterator[FileFooter]:
        for i in range(len(self)):
            yield self._footer(i)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_last"] = None
        return state


def shared_schema(schemas: list[pa.Schema], schema: pa.Schema) -> int:
    """The index of ``schema`` in ``schemas``, appended when no equal one (metadata included) is there.
    The last one is tried first: files of one dataset mostly share one schema."""
    for index in range(len(schemas) - 1, -1, -1):
        known = schemas[index]
        if known is schema or known.equals(schema, check_metadata=True):
            return index
    schemas.append(schema)
    return len(schemas) - 1


def files_fingerprint(table: FooterTable, identity: dict[str, Any]) -> str:
    """The data fingerprint of a plan's files: the same digest as
    ``fingerprint({"files": [[name, size, tag, list(unit_rows)] ...], **identity})`` (what checkpoints of
    earlier releases hold), hashed a few thousand files at a time instead of as one JSON text of every unit.
    Kept in ``table.known_fingerprints``: a table asked again, or loaded from the plan cache, computes none."""
    known = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    if known not in table.known_fingerprints:
        table.known_fingerprints[known] = _computed_fingerprint(table, identity)
    return table.known_fingerprints[known]


def _computed_fingerprint(table: FooterTable, identity: dict[str, Any]) -> str:
    marker = "\x00files of the plan\x00"
    head, _, tail = json.dumps({**identity, "files": marker}, sort_keys=True, separators=(",", ":"),
                               default=str).partition(json.dumps(marker))
    digest = hashlib.sha256(head.encode())
    digest.update(b"[")
    offsets = table.unit_offsets.tolist()
    for start in range(0, len(table), _FINGERPRINT_CHUNK):
        stop = min(start + _FINGERPRINT_CHUNK, len(table))
        text = _json_files(table, start, stop)
        if text is None:   # a name or tag JSON escapes: Python's json writes it
            rows = table.unit_rows[offsets[start]:offsets[stop]].tolist()
            base = offsets[start]
            chunk = [[name, size, tag, rows[offsets[i] - base:offsets[i + 1] - base]]
                     for i, name, size, tag in zip(range(start, stop), table.names[start:stop].to_pylist(),
                                                   table.sizes[start:stop].tolist(), table.tags[start:stop].to_pylist(),
                                                   strict=True)]
            text = json.dumps(chunk, separators=(",", ":"), default=str)[1:-1]
        digest.update((("," if start else "") + text).encode())
    digest.update(b"]")
    digest.update(tail.encode())
    return digest.hexdigest()[:32]


_PLAIN_JSON = r"^[ !#-\[\]-~]*$"   # printable ASCII but '"' and '\\': what json.dumps writes as it is


def _json_files(table: FooterTable, start: int, stop: int) -> str | None:
    """``json.dumps`` of files ``start:stop`` as ``[name, size, tag, [unit rows...]]`` (compact, without the
    outer brackets), written by Arrow kernels, column at a time (~10x faster than json on 50,000 files); None
    where a name or tag has a character JSON escapes (non-ASCII, a quote, a control character)."""
    names, tags = (column[start:stop].cast(pa.string()) for column in (table.names, table.tags))  # a chunk: small
    for column in (names, tags):
        if not pc.all(pc.match_substring_regex(column, _PLAIN_JSON)).as_py():
            return None
    first, last = int(table.unit_offsets[start]), int(table.unit_offsets[stop])
    offsets = pa.array(table.unit_offsets[start:stop + 1] - first, pa.int32())
    rows = pa.ListArray.from_arrays(offsets, pa.array(table.unit_rows[first:last]).cast(pa.string()))
    files = pc.binary_join_element_wise('["', names, '",', pa.array(table.sizes[start:stop]).cast(pa.string()),
                                        ',"', tags, '",[', pc.binary_join(rows, ","), "]]", "")
    return str(pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(files)], pa.int32()), files), ",")[0].as_py())


def as_table(footers: Sequence[FileFooter] | FooterTable) -> FooterTable:
    """``footers`` as a table (a table as it is)."""
    return footers if isinstance(footers, FooterTable) else FooterTable.build(footers)
