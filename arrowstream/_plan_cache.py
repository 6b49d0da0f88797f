"""The plan cache: the footers of a listing kept on disk, so that a restart or a resume reads none.

Planning lists the files (cheap: one request per folder) and reads every file's metadata (one or
more requests per file; CSV and JSON Lines: a scan of every byte). The footers, once reconciled,
depend only on the files and on the options that shape units, so they are kept in one entry per
dataset (protocol, path as given, format, parse options, text unit size, filter), with the listing
they were read from (path, size, modification tag and version of every file) inside. A start with
the same listing takes them from the entry and runs only the cheap rest of planning (column and
schema checks, splits).

The footers come back as planning kept them, handles included: a Parquet ``FileMetaData`` that the
cold plan kept (within the handle budget of its storage, ``_footers.handle_budget``, which is part
of the key) is kept as its Thrift bytes and read back, so that workers read no footer and remote
splits get their read-ahead (byte ranges of column chunks) after a warm restart too. They are as
safe as the rest of the entry: remote reads are pinned to the listed version, local files are
checked by size and modification tag, and readers count every unit's rows.

An entry is one file: a magic line, a JSON header (format version, the key material, the schemas,
the data fingerprints planning computed of the files), an Arrow IPC stream of one row per file (units,
byte ranges, text layouts), and a SHA-256 of header and payload. It is written and read column by
column from and into the plan's ``FooterTable``, file by file only where a file keeps a handle or a
text layout. It holds no pickle (a cache folder may be shared, and unpickling runs code) and no
credentials (storage options are not part of it). Writes go to a temporary
file in the folder, then ``os.replace``: readers see a whole entry or none, and processes that start
together each write a whole one. An entry that does not verify (damaged, cut short, of another
version, of another listing) is logged and rebuilt, never trusted; a folder that cannot be written
is logged once and planning goes on without the cache. The folder is bounded in bytes: an entry
read is touched, the oldest are removed after a write.

The trust boundary: the SHA-256 catches damage, not intent. An entry that verifies and whose key and
listing are the dataset's is taken as a whole, its data fingerprint included: wrong counts are caught
when readers count rows, a changed fingerprint is not (checking it means computing it, which is what
keeping it saves). A cache folder is as trusted as the checkpoints it plans resumes for.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import re
import struct
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ._discovery import FileEntry
from ._footers import FooterTable, handle_budget
from ._formats import FileFormat, check_counts, unit_format
from ._formats._footer_table import footer_columns, footer_table_of, footers_of, shaping_options, tabled
from ._storage import display_url, is_local_protocol
from .errors import ArgumentTypeError, InvalidArgumentError

logger = logging.getLogger("arrowstream")

# 2: Parquet footers (FileMetaData handles) as bytes, the handle budget in the key. Entries of another
# version are named by another key (so not read), and refused by version if one is found in place.
CACHE_VERSION = 2
CACHE_DIR_ENV = "ARROWSTREAM_CACHE_DIR"
MAX_BYTES_ENV = "ARROWSTREAM_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 1 << 30          # 1 GiB of entries per cache folder
_MAGIC = b"ARROWSTREAM PLAN CACHE\n"
_LENGTH = struct.Struct("<Q")
_DIGEST_BYTES = 32
_SUFFIX = ".plan"
_TEMP_PREFIX = ".tmp-"
_ABANDONED_TEMP_S = 3600             # a temporary file this old was left by a process that died mid-write
_warned_folders: set[str] = set()

PlanCacheSetting = str | Literal[False] | None


def check_plan_cache(value: Any) -> PlanCacheSetting:
    """``plan_cache`` as given: None (the default folder), a folder, or False (no cache)."""
    if value is None or value is False:
        return value
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bool):
        folder = os.fspath(value)
        if isinstance(folder, str) and folder.strip():
            return folder
    raise (ArgumentTypeError if not isinstance(value, (str, os.PathLike)) else InvalidArgumentError)(
        f"plan_cache: expected None (the default folder: ${CACHE_DIR_ENV}, else the user cache folder), a folder "
        f"path, or False (no cache), got {value!r}; see docs/large-datasets.md")


def default_folder() -> str:
    """``$ARROWSTREAM_CACHE_DIR``, else ``$XDG_CACHE_HOME/arrowstream``, else ``~/.cache/arrowstream``."""
    chosen = os.environ.get(CACHE_DIR_ENV, "").strip()
    if chosen:
        return chosen
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "arrowstream")


def cache_folder(setting: PlanCacheSetting) -> str | None:
    """The folder a ``plan_cache`` setting names; None for no cache."""
    if setting is False:
        return None
    return os.path.abspath(os.path.expanduser(setting if setting is not None else default_folder()))


def max_bytes() -> int:
    """The bound on a cache folder's entries: ``$ARROWSTREAM_CACHE_MAX_BYTES``, else 1 GiB."""
    text = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        return max(int(text), 0)
    except ValueError:
        raise InvalidArgumentError(f"{MAX_BYTES_ENV}={text!r} is not a number of bytes; set it to an integer such as "
                                   f"{DEFAULT_MAX_BYTES} or unset it") from None


def _without_userinfo(path: Any) -> Any:
    """The path(s) as given, without ``user:password@`` in URLs (the cache never holds credentials)."""
    if isinstance(path, (list, tuple)):
        return [_without_userinfo(p) for p in path]
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)
    text = text if isinstance(text, str) else repr(text)
    if "://" in text:
        return re.sub(r"^([A-Za-z][\w+.-]*://)[^/@]*@", r"\1", text).rstrip("/") or text
    return os.path.abspath(text)


def _filter_key(filter: pc.Expression | None) -> dict[str, str] | None:
    """The filter as text and as a digest of its serialized form (``x > 5`` and ``x > 5.0`` print alike)."""
    if filter is None:
        return None
    serialized = filter.__reduce__()[1][0]   # pyarrow's own IPC form of the expression
    return {"text": str(filter), "sha256": hashlib.sha256(bytes(serialized)).hexdigest()}


def key_material(protocol: str, path: Any, file_format: FileFormat, filter: pc.Expression | None) -> dict[str, Any]:
    """What decides an entry, but the listing: it names the entry file and is checked when read."""
    return {
        "cache_version": CACHE_VERSION,
        "pyarrow": int(pa.__version__.split(".")[0]),
        "protocol": protocol,
        "path": _without_userinfo(path),
        "format": file_format.name,
        **shaping_options(file_format),                              # text: parse options, unit size
        "filter": _filter_key(filter),                              # prunes units by statistics
        "handle_budget": handle_budget(is_local_protocol(protocol)),  # which footers keep handles
    }


class DamagedEntryError(ValueError):
    """A cache entry that does not verify (internal: it is logged and rebuilt, never raised to users)."""


class OtherVersionError(DamagedEntryError):
    """A whole cache entry of another format version (stale, not damaged: rebuilt)."""


@dataclass
class CacheOutcome:
    """What a planning did with the cache: ``hit``, ``built``, ``rebuilt`` (with why), or ``off``."""

    path: str | None
    action: str
    reason: str = ""


class PlanCache:
    """One dataset's entry in a cache folder; see the module docstring."""

    def __init__(self, folder: str, material: dict[str, Any], file_format: FileFormat) -> None:
        self.folder, self.material, self.file_format = folder, material, file_format
        digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]
        self.path = os.path.join(folder, f"{digest}{_SUFFIX}")
        self.outcome = CacheOutcome(self.path, "built")

    # -- reading ---------------------------------------------------------------------------------
    def load(self, entries: Sequence[FileEntry]) -> FooterTable | None:
        """The cached footers of ``entries``; None (logged, to be rebuilt) when there are none to trust."""
        untagged = CacheOutcome(None, "off", "the listing gives no modification tag of some files")
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError as exc:
            if not all(map(_tagged, entries)):
                self.outcome = untagged
            elif isinstance(exc, FileNotFoundError):
                self.outcome = CacheOutcome(self.path, "built", "no entry yet")
            else:
                self._miss(f"it cannot be read ({exc})")
            return None
        listing = _listing(entries)
        if _untagged(listing["tag"], listing["version"]):   # as columns: the listing is built to be checked
            self.outcome = untagged
            return None
        try:
            header, payload = _verified(data)
            stale = _stale_key(header, self.material)
            table = _read_table(payload) if not stale else None
            stale = stale or _stale_listing(table, listing, entries)
            if stale:
                self._miss(stale)
                return None
            assert table is not None
            footers = _footers(header, table, listing, entries, self.file_format)
        except OtherVersionError as exc:   # written by another release: stale, not damaged
            self._miss(str(exc))
            return None
        except (ValueError, KeyError, TypeError, IndexError, struct.error, pa.ArrowException, OSError) as exc:
            self._miss(f"it is damaged ({exc})", damaged=True)
            return None
        with contextlib.suppress(OSError):
            os.utime(self.path)   # most recently used
        self.outcome = CacheOutcome(self.path, "hit")
        return footers

    def _miss(self, reason: str, damaged: bool = False) -> None:
        self.outcome = CacheOutcome(self.path, "rebuilt", reason)
        (logger.warning if damaged else logger.info)(
            "arrowstream: the plan cache entry %s is not used: %s; reading the footers again and rebuilding it",
            self.path, reason)

    # -- writing ---------------------------------------------------------------------------------
    def store(self, entries: Sequence[FileEntry], footers: FooterTable) -> None:
        """Write the entry of ``footers``, the footers of ``entries``, with the data fingerprints planning
        computed of them (``footers.known_fingerprints``), atomically; a folder that cannot take it is logged once."""
        if not tabled(footers) or _untagged(footers.tags, footers.versions):
            return   # footers the cache cannot write (none of the file formats'), or files it could not tell apart
        try:
            data = encode(self.material, footers)
            os.makedirs(self.folder, exist_ok=True)
            descriptor, temporary = tempfile.mkstemp(dir=self.folder, prefix=_TEMP_PREFIX, suffix=_SUFFIX)
            try:
                with os.fdopen(descriptor, "wb") as f:
                    f.write(data)
                os.replace(temporary, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
            limit = max_bytes()
            evict(self.folder, limit, keep=self.path)
            if not os.path.exists(self.path):
                self.outcome = CacheOutcome(None, "off", f"the entry alone is over {MAX_BYTES_ENV}={limit}")
        except OSError as exc:
            if self.folder not in _warned_folders:
                _warned_folders.add(self.folder)
                logger.warning("arrowstream: cannot write the plan cache in %s (%s); planning goes on without it "
                               "(set plan_cache= or $%s to a writable folder, or plan_cache=False)",
                               self.folder, exc, CACHE_DIR_ENV)
            self.outcome = CacheOutcome(None, "off", f"cannot write: {exc}")


def evict(folder: str, limit: int, keep: str | None = None) -> None:
    """Remove the least recently used entries until the folder's entries hold at most ``limit`` bytes,
    and temporary files that a process left when it died mid-write."""
    entries = []
    now = time.time()
    with os.scandir(folder) as scan:
        for item in scan:
            if not item.name.endswith(_SUFFIX):
                continue
            with contextlib.suppress(OSError):
                status = item.stat()
                if item.name.startswith(_TEMP_PREFIX):
                    if now - status.st_mtime > _ABANDONED_TEMP_S:
                        os.unlink(item.path)
                    continue
                entries.append((status.st_mtime, item.path, status.st_size))
    total = sum(size for _, _, size in entries)
    oldest_first = sorted(entries)
    # the entry just written goes last, and only when it alone is over the bound
    for _, path, size in [e for e in oldest_first if e[1] != keep] + [e for e in oldest_first if e[1] == keep]:
        if total <= limit:
            break
        with contextlib.suppress(OSError):
            os.unlink(path)
            total -= size
            logger.info("arrowstream: removed the plan cache entry %s (least recently used; the folder holds "
                        "more than %d bytes)", path, limit)


# -- the entry's bytes -------------------------------------------------------------------------------
def _listing(entries: Sequence[FileEntry]) -> dict[str, pa.Array]:
    """The current listing as the entry's listing columns, and the files' names (not in the entry)."""
    return {"path": pa.array(list(map(attrgetter("path"), entries)), pa.string()),
            "size": pa.array(list(map(attrgetter("size"), entries)), pa.int64()),
            "tag": pa.array(list(map(attrgetter("tag"), entries)), pa.string()),
            "version": pa.array(list(map(attrgetter("version"), entries)), pa.string()),
            "name": pa.array(list(map(attrgetter("name"), entries)), pa.string())}


def _tagged(entry: FileEntry) -> bool:
    """Whether the listing tells a rewrite of the file from the file it was (a modification tag or a
    version): a listing where some file has neither could only be checked by names and sizes, and is not kept."""
    return bool(entry.tag or entry.version)


def _untagged(tags: pa.Array, versions: pa.Array) -> bool:
    """Whether some file has neither a modification tag nor a version (see :func:`_tagged`), as columns."""
    return bool(pc.any(pc.and_(pc.equal(pc.binary_length(tags), 0), pc.equal(pc.binary_length(versions), 0))).as_py())


_LISTED = ("path", "size", "tag", "version")   # the listing columns of an entry


def encode(material: dict[str, Any], footers: FooterTable) -> bytes:
    """The bytes of an entry: magic, header length, JSON header, Arrow IPC stream, SHA-256 of header and stream.
    Column by column from the table (no ``FileFooter`` per file); the header keeps the table's known data
    fingerprints (identity JSON -> digest, see ``_footers.files_fingerprint``)."""
    serialized = [s.serialize().to_pybytes() for s in footers.schemas]
    schemas: dict[bytes, int] = {}
    renumbered = np.array([schemas.setdefault(s, len(schemas)) for s in serialized], dtype=np.int32)
    schema_index = renumbered[footers.schema_index] if len(footers) else np.zeros(0, dtype=np.int32)
    listing = {"path": footers.paths.cast(pa.string()), "size": pa.array(footers.sizes, pa.int64()),
               "tag": footers.tags.cast(pa.string()), "version": footers.versions.cast(pa.string())}
    table = pa.table({**listing, **footer_columns(footers, schema_index)})
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
    body = _LENGTH.pack(len(header)) + header + payload
    return _MAGIC + body + hashlib.sha256(body).digest()


def _verified(data: bytes) -> tuple[dict[str, Any], bytes]:
    """The header and payload of an entry whose magic, digest and version check."""
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + _LENGTH.size + _DIGEST_BYTES:
        raise DamagedEntryError("not a plan cache entry, or cut short")
    body, digest = data[len(_MAGIC):-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        raise DamagedEntryError("its checksum does not match its bytes")
    (length,) = _LENGTH.unpack_from(body)
    header = json.loads(body[_LENGTH.size:_LENGTH.size + length])
    if header.get("cache_version") != CACHE_VERSION:
        raise OtherVersionError(f"it is of cache format version {header.get('cache_version')!r}, this release "
                                f"reads {CACHE_VERSION}")
    return header, body[_LENGTH.size + length:]


def read_header(path: str) -> dict[str, Any]:
    """The header of the entry at ``path`` (what ``arrowstream plan`` prints); DamagedEntryError unless it verifies."""
    with open(path, "rb") as f:
        header, _ = _verified(f.read())
    return header


def _stale_key(header: dict[str, Any], material: dict[str, Any]) -> str:
    """Why the entry is not that of this dataset's options ("" when it is)."""
    if header.get("key") != material:
        differing = sorted(k for k in set(material) | set(header.get("key", {}))
                           if header.get("key", {}).get(k) != material.get(k))
        return f"it was written for other options ({', '.join(differing)})"
    return ""


def _stale_listing(cached: pa.Table | None, current: dict[str, pa.Array], entries: Sequence[FileEntry]) -> str:
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
            return f"the listing changed: the {name} of {entries[changed].name} differs"
    return ""


def _read_table(payload: bytes) -> pa.Table:
    table = pa.ipc.open_stream(pa.py_buffer(payload)).read_all()
    table.validate(full=True)
    return table


def _footers(header: dict[str, Any], table: pa.Table, listing: dict[str, pa.Array], entries: Sequence[FileEntry],
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


def plan_cache_for(setting: PlanCacheSetting, protocol: str, path: Any, file_format: FileFormat,
                   filter: pc.Expression | None) -> PlanCache | None:
    """The entry of a dataset in the folder ``setting`` names; None when the cache is off."""
    folder = cache_folder(setting)
    if folder is None:
        return None
    return PlanCache(folder, key_material(protocol, path, file_format, filter), file_format)
