"""What a storage failure means: transient (retry), permission, missing, expired credentials, or data.

Backends raise different things for the same HTTP answer: s3fs an ``OSError`` or
``PermissionError`` (the botocore error as its cause), gcsfs an ``OSError`` with the reason as
text or an ``HttpError`` with ``code``, adlfs Azure's ``HttpResponseError`` with ``status_code``.
These functions look for the HTTP status along the exception's cause chain, then for the
codes the stores write in their messages.
"""

from __future__ import annotations

import errno
import math
import socket
import time
from typing import Any

import pyarrow as pa

from ..errors import ArrowStreamError, CorruptFileError, FileReadError

TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TRANSIENT_ERRNOS = frozenset({errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED,
                               errno.ETIMEDOUT, errno.EAGAIN, errno.EPIPE, errno.EIO})
_TRANSIENT_MARKERS = ("slowdown", "throttl", "timeout", "timed out", "connection reset", "service unavailable",
                      "internal error", "internalerror", "serverbusy", "temporarily", "too many requests",
                      "short read", "payload", "server disconnected", "could not connect", "connection refused",
                      "endpointconnectionerror", "connect timeout", "connection aborted", "cannot connect",
                      "connect call failed", "incompleteread", "incomplete read", "contentlengtherror",
                      "not enough data", "flexiblechecksumerror", "did not match calculated checksum",
                      "transporterror")   # google-auth could not reach its token endpoint
# a body cut short or failing its checksum: the wire, not the data (retried before anything is called corrupt)
_INCOMPLETE_MARKERS = ("short read", "payload", "incompleteread", "incomplete read", "contentlengtherror",
                       "not enough data", "flexiblechecksumerror", "did not match calculated checksum")
_THROTTLE_MARKERS = ("slowdown", "throttl", "serverbusy", "too many requests", "reduce your request rate")
_TIMEOUT_MARKERS = ("timeout", "timed out")
_UNREACHABLE_MARKERS = ("connection refused", "could not connect", "cannot connect", "connect call failed",
                        "endpointconnectionerror")
_PERMISSION_MARKERS = ("forbidden", "access denied", "accessdenied", "authorizationfailure", "authenticationfailed",
                       "unauthorized", "invalidaccesskeyid", "signaturedoesnotmatch", "permission denied")
_EXPIRED_MARKERS = ("expiredtoken", "token has expired", "token is expired", "expired token", "invalid_grant",
                    "requestexpired")


# connection failures by class name, for clients arrowstream does not import (aiohttp, botocore, requests)
_CONNECTION_CLASSES = frozenset({"ClientConnectionError", "ClientConnectorError", "ServerTimeoutError",
                                 "EndpointConnectionError", "ConnectTimeoutError", "ConnectTimeout"})


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(out) < 6 and current not in out:
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def http_status(exc: BaseException) -> int | None:
    """The HTTP status behind a storage error, where the backend kept it."""
    for error in _chain(exc):
        if type(error).__module__ == "aiohttp.http_exceptions":   # a body the client could not parse: its
            continue                                              # "400" is no answer of the store
        for name in ("status_code", "code", "status"):
            value = getattr(error, name, None)
            if isinstance(value, int) and 100 <= value < 600:
                return value
        response = getattr(error, "response", None)
        if isinstance(response, dict):
            value = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(value, int):
                return value
    return None


def _text(exc: BaseException) -> str:
    return " ".join(f"{type(e).__name__} {e}" for e in _chain(exc)).lower()


def is_expired_credentials(exc: BaseException) -> bool:
    """The store says the credentials expired (a credential provider can refresh them)."""
    return any(marker in _text(exc) for marker in _EXPIRED_MARKERS)


def is_permission(exc: BaseException) -> bool:
    if isinstance(exc, PermissionError) or http_status(exc) in (401, 403):
        return True
    return any(marker in _text(exc) for marker in _PERMISSION_MARKERS)


def masked_connection_error(exc: BaseException) -> BaseException | None:
    """The connection failure behind a ``FileNotFoundError``, or None: fsspec's HTTP filesystem reports a
    host it cannot reach (refused, no DNS, no network) as a missing file, the real error as its cause
    (``raise ... from``: an error merely being handled when the file was found missing does not count)."""
    if not isinstance(exc, FileNotFoundError) or exc.__cause__ is None:
        return None
    for error in _chain(exc.__cause__):
        if isinstance(error, (ConnectionError, TimeoutError, socket.gaierror)) or any(
                k.__name__ in _CONNECTION_CLASSES for k in type(error).__mro__):
            return error
    return None


def shown(exc: BaseException) -> str:
    """``Type: message`` of the error a user should see: the connection failure a "not found" hides."""
    error = masked_connection_error(exc) or exc
    return f"{type(error).__name__}: {error}".splitlines()[0]


def is_missing(exc: BaseException) -> bool:
    if masked_connection_error(exc) is not None:
        return False   # the host could not be reached: whether the file exists is not known
    return isinstance(exc, FileNotFoundError) or http_status(exc) == 404


def is_transient(exc: BaseException) -> bool:
    """True for storage errors worth retrying: resets, timeouts, throttling, 5xx, short reads."""
    if masked_connection_error(exc) is not None:
        return True    # connection failures are retried, whatever the client called them
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, ArrowStreamError)):
        return False   # an arrowstream error (a file changed since planning) already says what happened
    if is_expired_credentials(exc):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    status = http_status(exc)
    if status == 401 and "invalid credentials" in _text(exc):
        return True   # GCS: an access token that expired in flight; the next attempt sends a refreshed one (as gcsfs)
    if status is not None:
        return status in TRANSIENT_STATUS
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    if isinstance(exc, pa.ArrowInvalid):  # the data, not the wire
        return False
    return any(marker in _text(exc) for marker in _TRANSIENT_MARKERS)


def failure_kind(exc: BaseException) -> str:
    """What a transient failure was, for the final message: ``throttled``, ``timeout``, ``unreachable``,
    ``incomplete`` (a short or checksum-failing body) or ``error``."""
    text = _text(exc)
    if http_status(exc) in (429, 503) or any(marker in text for marker in _THROTTLE_MARKERS):
        return "throttled"
    chain = _chain(exc)
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or any(m in text for m in _UNREACHABLE_MARKERS):
        return "unreachable"
    if any(isinstance(e, TimeoutError) for e in chain) or any(marker in text for marker in _TIMEOUT_MARKERS):
        return "timeout"
    if any(marker in text for marker in _INCOMPLETE_MARKERS):
        return "incomplete"
    return "error"


def throttle_label(exc: BaseException) -> str:
    """How a throttling answer reads: ``503 SlowDown``, ``429``, ``ServerBusy``."""
    text = _text(exc)
    code = next((name for name in ("SlowDown", "ServerBusy", "TooManyRequests", "Too Many Requests")
                 if name.lower() in text), "")
    return " ".join(str(part) for part in (http_status(exc), code) if part) or "throttled"


def _headers(error: BaseException) -> Any:
    """The response headers an error kept: botocore's dict, azure-core's and aiohttp's mappings."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        return response.get("ResponseMetadata", {}).get("HTTPHeaders")
    headers = getattr(response, "headers", None)
    return headers if headers is not None else getattr(error, "headers", None)


def retry_after(exc: BaseException) -> float | None:
    """Seconds the store asked to wait (``Retry-After``, seconds or an HTTP date), if it said so."""
    for error in _chain(exc):
        headers = _headers(error)
        if headers is None:
            continue
        try:
            value = next((v for k, v in headers.items() if str(k).lower() == "retry-after"), None)
        except AttributeError:
            continue
        seconds = parse_seconds(value)
        if seconds is not None:
            return seconds
    return None


def parse_seconds(value: Any) -> float | None:
    """A ``Retry-After`` value in seconds: a number, or an HTTP date (seconds from now); None if neither."""
    if value is None:
        return None
    text = str(value).strip()
    try:
        seconds = float(text)
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - time.time()
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def wrap_read_error(exc: BaseException, url: str, label: str = "Parquet") -> BaseException:
    """Turn a failed read into an arrowstream error that names the file and says what to do."""
    what = shown(exc)
    if is_expired_credentials(exc):
        return FileReadError(f"{url}: the storage credentials expired ({what}); pass credential_provider= to "
                             "refresh them during a run (see docs/storage.md)")
    if is_permission(exc):
        return FileReadError(f"{url}: permission denied ({what}); check the credentials or file mode")
    if is_missing(exc):
        return FileReadError(f"{url}: the file disappeared after planning ({what}); "
                             "the dataset changed while it was read: rebuild the dataset")
    if is_transient(exc):
        return FileReadError(f"{url}: storage kept failing after retries ({what})")
    if isinstance(exc, (pa.ArrowException, ValueError, EOFError)) or not http_status(exc):
        return CorruptFileError(f"{url}: not a readable {label} file ({what}); "
                                "remove or rewrite the file, or leave it out of `path`")
    return FileReadError(f"{url}: the storage refused the read ({what})")
