"""The bytes of a plan cache entry (``arrowstream._planning.cache``): magic, JSON header, Arrow IPC stream of one row
per file, SHA-256; the listing an entry was written from, and the checks that tell a stale or damaged entry.

Written and read column by column from and into a ``FooterTable`` (``_formats._footer_table``); an entry may carry
more columns beside the footers' (Iceberg: the deleted positions of every data file).
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import time
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._core.plan_types import FileEntry
from .._formats import FileFormat, check_counts, unit_format
from .._formats.footer_table import footer_columns, footer_table_of, footers_of
from .._formats.footers import FooterTable
from .._storage.filesystem import display_url

# 2: Parquet footers (FileMetaData handles) as bytes, the handle budget in the key.
# 3: the listing keeps each local file's inode number and inode change time (``inode``, ``changed``): a rewrite
#    that restores size and modification time is a stale listing. Entries of another version are named by
#    another key (so not read), and refused by version if one is found in place: rebuilt, never trusted.
CACHE_VERSION = 3
MAGIC = b"ARROWSTREAM PLAN CACHE\n"
LENGTH = struct.Struct("<Q")
_DIGEST_BYTES = 32


class DamagedEntryError(ValueError):
    """A cache entry that does not verify (internal: it is logged and rebuilt, never raised to users)."""


class OtherVersionError(DamagedEntryError):
    """A whole cache entry of another format version (stale, not damaged: rebuilt)."""


def listing_of(entries: Sequence[FileEntry]) -> dict[str, pa.Array]:
    """The current listing as the entry's listing columns, and the files' names (not in the entry)."""
    return {"path": pa.array(list(map(attrgetter("path"), entries)), pa.string()),
            "size": pa.array(list(map(attrgetter("size"), entries)), pa.int64()),
            "tag": pa.array(list(map(attrgetter("tag"), entries)), pa.string()),
            "version": pa.array(list(map(attrgetter("version"), entries)), pa.string()),
            **_stamps(entries),
            "name": pa.array(list(map(attrgetter("name"), entries)), pa.string())}


def _stamps(entries: Sequence[FileEntry] | None, num_files: int = 0) -> dict[str, pa.Array]:
    """The listing columns ``os.utime`` cannot restore: each local file's inode number and inode change time
    (0 where the listing gives none: remote files, whose version changes with every write, and the files of an
    Iceberg snapshot, never rewritten); zeros for ``num_files`` files without ``entries``."""
    if entries is None:
        zeros = pa.array(np.zeros(num_files, dtype=np.int64))
        return {"inode": zeros, "changed": zeros}
    return {"inode": pa.array(np.fromiter(map(attrgetter("inode"), entries), np.int64, len(entries))),
            "changed": pa.array(np.fromiter(map(attrgetter("changed_ns"), entries), np.int64, len(entries)))}


def is_tagged(entry: FileEntry) -> bool:
    """Whether the listing tells a rewrite of the file from the file it was (a modification tag or a
    version): a listing where some file has neither could only be checked by names and sizes, and is not kept."""
    return bool(entry.tag or entry.version)


def is_untagged(tags: pa.Array, versions: pa.Array) -> bool:
    """Whether some file has neither a modification tag nor a version (see :func:`is_tagged`), as columns."""
    return bool(pc.any(pc.and_(pc.equal(pc.binary_length(tags), 0), pc.equal(pc.binary_length(versions), 0))).as_py())


_LISTED = ("path", "size", "tag", "version", "inode", "changed")   # the listing columns of an entry
# how a stale listing names a column that differs (and what changes it)
_LISTED_NAMES = {"inode": "inode number (the file was replaced by another one, keeping its size and modification "
                          "time)",
                 "changed": "inode change time (the file was rewritten keeping its size and modification time, or "
                            "its permissions, owner or links changed)"}


def encode(material: dict[str, Any], footers: FooterTable, more: dict[str, pa.Array] | None = None,
           entries: Sequence[FileEntry] | None = None) -> bytes:
    """The bytes of an entry: magic, header length, JSON header, Arrow IPC stream, SHA-256 of header and stream.
    Column by column from the table (no ``FileFooter`` per file), the inode numbers and change times of the
    listing ``entries`` the footers were read after (zeros without), and the columns ``more`` (one row per
    file); the header keeps the table's known data fingerprints (identity JSON -> digest, see
    ``arrowstream._formats.footers.files_fingerprint``)."""
    serialized = [s.serialize().to_pybytes() for s in footers.schemas]
    schemas: dict[bytes, int] = {}
    renumbered = np.array([schemas.setdefault(s, len(schemas)) for s in serialized], dtype=np.int32)
    schema_index = renumbered[footers.schema_index] if len(footers) else np.zeros(0, dtype=np.int32)
    listing = {"path": footers.paths.cast(pa.string()), "size": pa.array(footers.sizes, pa.int64()),
               "tag": footers.tags.cast(pa.string()), "version": footers.versions.cast(pa.string()),
               **_stamps(entries, len(footers))}
    table = pa.table({**listing, **footer_columns(footers, schema_index), **(more or {})})
    sink = pa.BufferOutputStream()
    compression = "zstd" if pa.Codec.is_available("zstd") else None   # paths and tags compress several-fold
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write_table(table)
    payload = bytes(sink.getvalue())
    header = json.dumps({
        "cache_version": CACHE_VERSION, "key": material, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "num_files": len(footers), "num_units": footers.num_units, "num_rows": footers.num_rows,
        "schemas": [base64.b64encode(s).decode() for s in schemas],
        "fingerprints": dict(footers.known_fingerprints),
    }, sort_keys=True).encode()
    body = LENGTH.pack(len(header)) + header + payload
    return MAGIC + body + hashlib.sha256(body).digest()


def verified_entry(data: bytes) -> tuple[dict[str, Any], bytes]:
    """The header and payload of an entry whose magic, digest and version check."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + LENGTH.size + _DIGEST_BYTES:
        raise DamagedEntryError("not a plan cache entry, or cut short")
    body, digest = data[len(MAGIC):-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        raise DamagedEntryError("its checksum does not match its bytes")
    (length,) = LENGTH.unpack_from(body)
    header = json.loads(body[LENGTH.size:LENGTH.size + length])
    if header.get("cache_version") != CACHE_VERSION:
        raise OtherVersionError(f"it is of cache format version {header.get('cache_version')!r}, this release "
                                f"reads {CACHE_VERSION}")
    return header, body[LENGTH.size + length:]


def read_header(path: str) -> dict[str, Any]:
    """The header of the entry at ``path`` (what ``arrowstream plan`` prints); DamagedEntryError unless it verifies."""
    with open(path, "rb") as f:
        header, _ = verified_entry(f.read())
    return header


def stale_key(header: dict[str, Any], material: dict[str, Any]) -> str:
    """Why the entry is not that of this dataset's options ("" when it is)."""
    if header.get("key") != material:
        differing = sorted(k for k in set(material) | set(header.get("key", {}))
                           if header.get("key", {}).get(k) != material.get(k))
        return f"it was written for other options ({', '.join(differing)})"
    return ""


def stale_listing(cached: pa.Table | None, current: dict[str, pa.Array], entries: Sequence[FileEntry]) -> str:
    """Why the entry's listing is not the current one ("" when it is): column against column, Python
    objects only to name the first file that differs."""
    if cached is None:
        return ""
    if cached.num_rows != len(entries):
        return f"the listing changed: {cached.num_rows} files cached, {len(entries)} now"
    for name in _LISTED:
        column = cached.column(name).combine_chunks()
        if not column.equals(current[name]):
            changed = next(i for i, (a, b) in enumerate(zip(column.to_pylist(), current[name].to_pylist(),
                                                            strict=True)) if a != b)
            return f"the listing changed: the {_LISTED_NAMES.get(name, name)} of {entries[changed].name} differs"
    return ""


def read_entry_table(payload: bytes) -> pa.Table:
    table = pa.ipc.open_stream(pa.py_buffer(payload)).read_all()
    table.validate(full=True)
    return table


def entry_footers(header: dict[str, Any], table: pa.Table, listing: dict[str, pa.Array], entries: Sequence[FileEntry],
             file_format: FileFormat) -> FooterTable:
    """The footers an entry holds, on the current listing, their counts checked, with the data fingerprints
    it keeps: as columns, else (a count fails a check) file by file, which names the file."""
    schemas = [pa.ipc.read_schema(pa.py_buffer(base64.b64decode(s))) for s in header["schemas"]]
    footers = footer_table_of(table, schemas, listing, file_format)
    if footers is None:
        files = footers_of(table, schemas, entries, file_format)
        for footer in files:
            owner = unit_format(footer.format)
            check_counts(footer, display_url(header["key"]["protocol"], footer.entry.path), owner.label, owner.unit)
        footers = FooterTable.build(files)
    fingerprints = header.get("fingerprints", {})   # entries written before they were kept have none
    if not isinstance(fingerprints, dict) or not all(isinstance(v, str) for v in fingerprints.values()):
        raise ValueError("data fingerprints that are not a map of text to text")
    footers.known_fingerprints.update(fingerprints)
    return footers
