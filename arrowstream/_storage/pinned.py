"""Reads pinned to the version of each file that the dataset was planned on.

Discovery records each file's size and the version its listing reported
(:func:`version_of`: the S3 and Azure ETag, the GCS generation, the local modification time).
Every ranged read of a remote file (data and footers alike) asks for that version only, in the same
request, so no read costs an extra one:

- S3: ``IfMatch=<ETag>`` on GetObject (moto and S3 answer 412 to another version);
- GCS: ``ifGenerationMatch=<generation>`` on the media download (GCS answers 412), and the
  ``x-goog-generation`` header of the answer compared, where the server sends one
  (gcp-storage-emulator does neither: against it only the size check below holds);
- Azure: ``etag=<ETag>, match_condition=IfNotModified`` on ``download_blob`` (Azure and
  Azurite answer 412, also for a blob deleted since), and the answer's ETag compared.

On all three, the total size the answer reports (``Content-Range``) is compared with the planned
size too (the only check for a file listed without a version). A refused read costs one more
request, on that failure only: what the file is now, for the message (or that it is gone). The
requests go through the fsspec filesystem's own client (s3fs ``_call_s3``, gcsfs ``_call``,
adlfs's service client), so its configuration applies. Other filesystems (``memory://``,
``http://``, ...) keep fsspec's reads; a read that comes back short asks the file's size once, to
tell a file that shrank from a cut transfer. Local and ``memory://`` files (in this process: a stat
costs a microsecond) are checked with :func:`check_in_process` when opened, before each split is
read and after each batch.

A file that is not the planned version any more is a :class:`~arrowstream.errors.FileChangedError`,
which no retry layer retries and nobody reports as corrupt.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import FileChangedError
from .failures import http_status

_S3, _GCS, _AZURE = frozenset({"s3", "s3a"}), frozenset({"gs", "gcs"}), frozenset({"az", "abfs", "abfss"})
_LOCAL = frozenset({"file", "local"})
_VERSION_KEYS = (  # (protocols, key of the listing's info, name in messages)
    (_S3, "ETag", "ETag"), (_GCS, "generation", "generation"), (_AZURE, "etag", "ETag"),
    (_LOCAL, "mtime", "mtime"), (frozenset({"memory"}), "created", "created"))
_TOTAL = re.compile(r"/(\d+)\s*$")   # the total size at the end of a Content-Range


def _protocols(protocol: str | Sequence[str]) -> frozenset[str]:
    return frozenset({protocol} if isinstance(protocol, str) else protocol)


def version_of(protocol: str, info: dict[str, Any]) -> str:
    """The version of a file that reads are pinned to, from its listing ``info``; "" when it has none."""
    for protocols, key, _ in _VERSION_KEYS:
        if protocol in protocols:
            value = info.get(key)
            if value is not None and hasattr(value, "timestamp"):   # memory://: a datetime from info, its timestamp from a listing
                value = value.timestamp()
            return "" if value is None else str(value)
    return ""


def local_version(status: os.stat_result) -> str:
    """What :func:`version_of` makes of a local file's status (its modification time), without the lookup."""
    return str(status.st_mtime)


def _version_name(protocol: str) -> str:
    return next((name for protocols, _, name in _VERSION_KEYS if protocol in protocols), "version")


@dataclass(frozen=True)
class Pin:
    """What the reads of one file are pinned to: its path, its name for messages, planned size and version."""

    path: str
    url: str
    size: int
    version: str
    protocol: str

    def changed(self, version: str | None, size: int | None) -> FileChangedError:
        """The error for this file found at ``version`` and ``size`` (None: not known from the answer)."""
        name = _version_name(self.protocol)
        planned = f"{name} {self.version}, size {self.size}" if self.version else f"size {self.size}"
        now = ", ".join([*([f"{name} {version}"] if version else []), *([f"size {size}"] if size is not None else [])])
        return FileChangedError(
            f"{self.url}: changed since planning (planned {planned}; now "
            f"{now or f'another {name}: the store refused the planned one'}): the dataset changed while it was "
            "read; re-plan (build the dataset again) or resume from a checkpoint taken on the new data")

    def check(self, data: bytes, start: int, end: int, version: str | None, total: int | None) -> bytes:
        """``data``, the answer to a read of ``[start, end)``, if it is of the planned version and size."""
        if (self.version and version and version != self.version) or (total is not None and total != self.size):
            raise self.changed(version, total)
        if len(data) != end - start:
            raise ConnectionResetError(f"short read of {self.url} [{start}, {end}): got {len(data)} bytes")
        return data


def check_in_process(pin: Pin, fs: Any) -> None:
    """A local or ``memory://`` file: its size and modification time as planned (a stat), else the error."""
    if pin.protocol in _LOCAL:
        status = os.stat(pin.path)
        size, version = status.st_size, version_of(pin.protocol, {"mtime": status.st_mtime})
    else:
        info = fs.info(pin.path)
        size, version = int(info.get("size") or 0), version_of(pin.protocol, info)
    if size != pin.size or (pin.version and version != pin.version):
        raise pin.changed(version, size)


def _total(content_range: str | None) -> int | None:
    match = _TOTAL.search(content_range or "")
    return int(match.group(1)) if match else None


def _is_refusal(exc: BaseException) -> bool:
    """The store refused the planned version (412) or the planned range (416: the object is shorter now)."""
    return http_status(exc) in (412, 416) or "PreconditionFailed" in str(exc) or "ConditionNotMet" in str(exc)


async def _refused(fs: Any, pin: Pin) -> FileChangedError:
    """The error for a read the store refused, with what the file is now (asked once, on this failure only).

    A file that is gone raises ``FileNotFoundError``, which callers report as a file that disappeared.
    """
    fs.invalidate_cache(pin.path)
    # gcsfs's _info asks for the object and lists its folder at once (a race of 2 to 4 requests); its
    # _get_object is the one GET of the object's metadata. S3's and Azure's _info is one HEAD.
    lookup = getattr(fs, "_get_object", None) if _protocols(fs.protocol) & _GCS else None
    try:
        info = await (lookup or fs._info)(pin.path)
    except FileNotFoundError:
        raise
    except Exception:  # noqa: BLE001 - what it is now only adds to the message; the refusal is the error
        return pin.changed(None, None)
    return pin.changed(version_of(pin.protocol, info), int(info.get("size") or 0))


async def _s3(fs: Any, pin: Pin, start: int, end: int) -> bytes:
    bucket, key, version_id = fs.split_path(pin.path)
    conditions = {"IfMatch": pin.version} if pin.version else {}
    try:
        response = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}",
                                     **({"VersionId": version_id} if version_id else {}), **conditions)
    except OSError as exc:   # s3fs turns the botocore error into an OSError, the answer kept as its cause
        if not _is_refusal(exc):
            raise
        refused = exc
    else:
        try:
            data: bytes = await response["Body"].read()
        finally:
            response["Body"].close()
        return pin.check(data, start, end, response.get("ETag"), _total(response.get("ContentRange")))
    raise await _refused(fs, pin) from refused


async def _gcs(fs: Any, pin: Pin, start: int, end: int) -> bytes:
    conditions = {"ifGenerationMatch": pin.version} if pin.version else {}
    try:
        headers, data = await fs._call("GET", fs.url(pin.path), headers={"Range": f"bytes={start}-{end - 1}"},
                                       **conditions)
    except (FileExistsError, OSError) as exc:   # gcsfs raises FileExistsError for a 412
        if not (isinstance(exc, FileExistsError) or _is_refusal(exc)):
            raise
        refused = exc
    else:
        return pin.check(data, start, end, headers.get("x-goog-generation"), _total(headers.get("Content-Range")))
    raise await _refused(fs, pin) from refused


async def _azure(fs: Any, pin: Pin, start: int, end: int) -> bytes:
    from azure.core import MatchConditions
    from azure.core.exceptions import HttpResponseError

    container, blob, version_id = fs.split_path(pin.path)
    conditions = {"etag": pin.version, "match_condition": MatchConditions.IfNotModified} if pin.version else {}
    async with fs.service_client.get_blob_client(container=container, blob=blob) as client:
        try:
            stream = await client.download_blob(offset=start, length=end - start, version_id=version_id,
                                                max_concurrency=fs.max_concurrency,
                                                **getattr(fs, "_timeout_kwargs", {}), **conditions)
        except HttpResponseError as exc:   # ResourceModifiedError for a 412
            if not _is_refusal(exc):
                raise
            refused = exc
        else:
            data: bytes = await stream.readall()
            properties = stream.properties
            return pin.check(data, start, end, properties.etag, _total(getattr(properties, "content_range", None)))
    raise await _refused(fs, pin) from refused


_BACKENDS: tuple[tuple[frozenset[str], Callable[[Any, Pin, int, int], Awaitable[bytes]]], ...] = (
    (_S3, _s3), (_GCS, _gcs), (_AZURE, _azure))


def _backend(fs: Any) -> Callable[[Any, Pin, int, int], Awaitable[bytes]] | None:
    protocols = _protocols(fs.protocol)
    return next((read for names, read in _BACKENDS if protocols & names), None)


def read_ranges(fs: Any, pin: Pin, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes of each ``[start, end)`` of the pinned file, fetched concurrently (on the filesystem's loop).

    Raises :class:`~arrowstream.errors.FileChangedError` when the file is not the planned version any
    more; a short answer of the planned version is a ``ConnectionResetError`` (transient).
    """
    backend = _backend(fs)
    if backend is None:
        return _read_unpinned(fs, pin, ranges)
    from fsspec.asyn import sync

    async def fetch_all() -> list[bytes]:
        results = await asyncio.gather(*(backend(fs, pin, start, end) for start, end in ranges),
                                       return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:   # a changed file first: it is the reason, whatever else failed beside it
            raise next((f for f in failures if isinstance(f, FileChangedError)), failures[0])
        return [r for r in results if isinstance(r, bytes)]

    parts: list[bytes] = sync(fs.loop, fetch_all)
    return parts


def _read_unpinned(fs: Any, pin: Pin, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """fsspec's reads, with a size check: a short answer asks the file's size (one request, then only)."""
    if len(ranges) == 1:
        parts = [fs.cat_file(pin.path, start=ranges[0][0], end=ranges[0][1])]
    else:
        parts = fs.cat_ranges([pin.path] * len(ranges), [s for s, _ in ranges], [e for _, e in ranges],
                              on_error="raise")
    for (start, end), part in zip(ranges, parts, strict=True):
        if len(part) != end - start:
            size = int(fs.size(pin.path))
            if size != pin.size:
                raise pin.changed(None, size)
            raise ConnectionResetError(f"short read of {pin.url} [{start}, {end}): got {len(part)} bytes")
    return list(parts)
