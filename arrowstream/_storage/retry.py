"""The one retry layer of storage requests: :class:`RetryPolicy` and the attempts of one request or split.

arrowstream owns retries: the backends' own loops (s3fs, botocore, gcsfs, the Azure SDK) are
turned down to one attempt when a filesystem is opened (``_storage/backends.py``), so a failed read costs
``attempts`` requests, not attempts to the power of three. Each request is cut after ``timeout``
seconds without a byte (connect or read); the attempts of one request stop at ``deadline``, those
of one split when the split has lost ``split_deadline`` seconds to failures and waits.

:class:`Attempts` is the one place that decides, after a failure, between waiting and trying again,
asking the credential provider again (expired credentials, at most :data:`MAX_REFRESHES` times) and
giving up with an error that says why: :func:`retrying` runs a request through it, and the split
reader (``_worker/reader.py``) a split, resuming from the row it stopped at.
"""

from __future__ import annotations

import logging
import math
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..errors import ArgumentTypeError, ArrowStreamError, FileReadError, InvalidArgumentError
from .failures import failure_kind, is_expired_credentials, is_transient, retry_after, shown, throttle_label

logger = logging.getLogger("arrowstream")

T = TypeVar("T")

MAX_REFRESHES = 3  # credential refreshes of one request or split before an expired-credentials error is raised


class Credentials(Protocol):
    """What a retry asks of the storage about credentials (``Storage`` in ``_storage/filesystem.py``)."""

    def refresh_credentials(self, what: str = "") -> bool:
        """Ask the credential provider again and reopen the filesystem; False without a provider."""

    def credential_failure(self, exc: BaseException, what: str, refreshes: int) -> Exception | None:
        """The provider's part in a failure that outlasted retries and refreshes, as an error; None if none."""


@dataclass(frozen=True)
class RetryPolicy:
    """How storage requests are retried: attempts, backoff with full jitter, timeouts and deadlines.

    A transient failure (a timeout, a reset or refused connection, HTTP 408/429/5xx, a short or
    checksum-failing body) is retried after a random wait in ``[0, min(max_delay, base * 2**n))``
    (full jitter), where ``base`` is ``base_delay``, or ``throttle_delay`` when the store throttles
    (429, 503, ``SlowDown``, ``ServerBusy``) without saying how long to wait. A ``Retry-After`` the
    store sends is honoured instead (never past the deadline). Permission errors, missing objects
    and bytes that arrive whole but do not parse are never retried.

    The defaults suit a training job on a cloud store: a stalled connection is cut after 30 s
    without a byte (a healthy S3/GCS/Azure request answers in well under a second, and a 64 MiB
    range never pauses that long between reads); 5 attempts with waits up to 20 s ride out a
    throttling episode or a restarting front end, whose ``SlowDown`` usually clears in seconds;
    one request gives up after 2 minutes, and one split after it has lost 10 minutes to failures,
    so that a dead store becomes an error a person sees within minutes instead of a hang. The
    backends' own retries are turned down (see docs/storage.md), so these are all the attempts made.

    Attributes:
        attempts: Attempts per request (and per piece of a split read), at least 1.
        base_delay: Seconds; the backoff base for transient errors.
        max_delay: Seconds; no backoff wait is longer (a ``Retry-After`` is capped by the deadline only).
        throttle_delay: Seconds; the backoff base when the store throttles without ``Retry-After``.
        timeout: Seconds a request may wait to connect and for each read from the socket (the first
            byte included); passed to the backend (botocore ``connect_timeout``/``read_timeout``,
            gcsfs ``requests_timeout``, adlfs ``connection_timeout``/``read_timeout``).
        deadline: Seconds one request (a listing, a footer read) may take with its retries; no attempt
            starts after it.
        split_deadline: Seconds the read of one split may lose to failed attempts and waits (reading rows
            does not count) before it fails.

    Example:
        >>> import arrowstream
        >>> patient = arrowstream.RetryPolicy(attempts=8, timeout=60, deadline=600, split_deadline=1800)
        >>> patient.attempts
        8
        >>> arrowstream.RetryPolicy(attempts=0)
        Traceback (most recent call last):
        ...
        arrowstream.errors.InvalidArgumentError: retry: attempts must be an int >= 1, got 0
    """

    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 20.0
    throttle_delay: float = 2.0
    timeout: float = 30.0
    deadline: float = 120.0
    split_deadline: float = 600.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ArgumentTypeError(f"retry: attempts must be an int >= 1, got {type(self.attempts).__name__}")
        if self.attempts < 1:
            raise InvalidArgumentError(f"retry: attempts must be an int >= 1, got {self.attempts}")
        for name in ("base_delay", "max_delay", "throttle_delay", "timeout", "deadline", "split_deadline"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ArgumentTypeError(f"retry: {name} must be a number of seconds, got {type(value).__name__}")
            positive = name in ("timeout", "deadline", "split_deadline")
            if not math.isfinite(value) or value < 0 or (positive and value == 0):
                raise InvalidArgumentError(
                    f"retry: {name} must be a finite number of seconds {'> 0' if positive else '>= 0'}, got {value!r}")

    def backoff(self, failures: int, exc: BaseException | None = None,
                rng: Callable[[], float] = random.random) -> float:
        """The wait after the ``failures``-th failed attempt in a row (1 for the first): full jitter."""
        base = self.throttle_delay if exc is not None and failure_kind(exc) == "throttled" else self.base_delay
        return float(rng() * min(self.max_delay, base * 2 ** min(failures - 1, 64)))

    def call(self, fn: Callable[[], T], what: str, credentials: Credentials | None = None) -> T:
        """Run ``fn``; retry transient errors within the attempts and the deadline, and refresh expired
        credentials through ``credentials`` (at most :data:`MAX_REFRESHES` times).

        Raises:
            FileReadError: transient errors outlasted the attempts or the deadline; it names ``what``
                and says how often and how long it was tried.
        """
        return retrying(fn, Attempts(self, what, self.deadline, per="request", credentials=credentials))


def check_retry(retry: object) -> RetryPolicy:
    """The ``retry`` argument of a dataset: a :class:`RetryPolicy`, or the defaults for ``None``."""
    if retry is None:
        return RetryPolicy()
    if not isinstance(retry, RetryPolicy):
        raise ArgumentTypeError(f"retry: expected an arrowstream.RetryPolicy, got {type(retry).__name__}; "
                                "pass retry=arrowstream.RetryPolicy(attempts=..., timeout=...)")
    return retry


def retrying(fn: Callable[[], T], attempts: Attempts) -> T:
    """Run ``fn`` until it returns or ``attempts`` gives up (see :meth:`Attempts.after`)."""
    while True:
        started = time.monotonic()
        try:
            return fn()
        except Exception as exc:
            forget_locals(exc)
            wait = attempts.after(exc, time.monotonic() - started)
            if wait is None:
                raise
            time.sleep(wait)


def forget_locals(exc: BaseException) -> None:
    """Clear the local variables of the finished frames of ``exc``'s traceback (its lines stay).

    pyarrow keeps the Python error raised under one of its reads (a file read through fsspec) in the
    reader's C++ status, and the frames of that error hold the reader: a cycle through C++ that the garbage
    collector cannot see, which would keep every failed attempt's reader, file, buffers and read-ahead
    threads alive for as long as the process runs.
    """
    traceback.clear_frames(exc.__traceback__)


class Attempts:
    """The failed attempts of one request (or one split read) under a policy: what to do after each
    failure (:meth:`after`); raises when they run out."""

    def __init__(self, policy: RetryPolicy, what: str, deadline: float, per: str,
                 credentials: Credentials | None = None) -> None:
        self.policy, self.what, self.deadline, self.per = policy, what, deadline, per
        self.credentials = credentials
        self.in_a_row = 0          # failures since the last progress (a piece read)
        self.total = 0             # all failures
        self.spent = 0.0           # seconds lost to failed attempts and waits
        self.refreshes = 0         # credential refreshes
        self.kinds: list[str] = []

    def after(self, exc: Exception, lost: float, at: str = "") -> float | None:
        """What to do after ``exc`` ended an attempt that cost ``lost`` seconds (``at``: where, for the log).

        Returns:
            The seconds to wait before the next attempt (0 right after the credentials were refreshed),
            or None when ``exc`` is not retried: the caller raises it (wrapped as it sees fit). An
            arrowstream error already says what happened and is never retried.

        Raises:
            FileReadError: transient errors outlasted the attempts or the deadline.
            ArrowStreamError: the credential provider's part in the failure (still expired after
                refreshes, or options the backend could not use), naming it.
        """
        if isinstance(exc, ArrowStreamError):
            return None
        credentials = self.credentials
        if (credentials is not None and self.refreshes < MAX_REFRESHES and is_expired_credentials(exc)
                and credentials.refresh_credentials(self.what)):
            self.refreshes += 1
            logger.warning("credentials expired reading %s%s; asked the credential provider again", self.what, at)
            return 0.0
        if is_transient(exc):
            return self.failed(exc, lost)
        failure = None if credentials is None else credentials.credential_failure(exc, self.what, self.refreshes)
        if failure is not None:
            raise failure from exc
        return None

    def progressed(self) -> None:
        """A piece was read: the next failure starts a new row of attempts."""
        self.in_a_row = 0

    def failed(self, exc: BaseException, lost: float) -> float:
        """Count a transient failure that cost ``lost`` seconds; the wait before the next attempt.

        Raises:
            FileReadError: the attempts or the deadline are used up (``from`` the last error).
        """
        self.in_a_row += 1
        self.total += 1
        self.spent += lost
        self.kinds.append(failure_kind(exc))
        if self.in_a_row >= self.policy.attempts:
            raise FileReadError(self.message(exc, "")) from exc
        remaining = self.deadline - self.spent
        asked = retry_after(exc)
        if asked is not None:
            if asked >= remaining:
                raise FileReadError(self.message(exc, f"; the store asked to wait {asked:g} s (Retry-After), "
                                                      f"past the deadline of {self.deadline:g} s per {self.per}")) from exc
            wait = asked
        else:
            wait = self.policy.backoff(self.in_a_row, exc)
        if wait >= remaining:
            raise FileReadError(self.message(exc, f"; the deadline of {self.deadline:g} s per {self.per} "
                                                  "was reached")) from exc
        logger.warning("transient error on %s (attempt %d of %d, %s): %s; retrying in %.2f s", self.what,
                       self.in_a_row, self.policy.attempts, self.kinds[-1], shown(exc).partition(":")[0], wait)
        self.spent += wait
        return wait

    def message(self, exc: BaseException, why: str) -> str:
        """What happened, in terms a user acts on: the kind of failure, how often, how long, the knob."""
        last = shown(exc)[:300]
        kind = self.kinds[-1]
        every = "on every attempt" if all(k == kind for k in self.kinds) else "on the last attempt"
        tried = f"{self.total} failed attempt{'s' if self.total > 1 else ''} over {self.spent:.1f} s"
        remedy = ("check that the store is reachable and healthy, or allow more with "
                  "retry=arrowstream.RetryPolicy(attempts=..., deadline=...)")
        if kind == "timeout":
            what = f"storage did not answer within {self.policy.timeout:g} s ({every}), {tried}"
            remedy = ("if the store is only slow, allow more with "
                      "retry=arrowstream.RetryPolicy(timeout=..., attempts=...)")
        elif kind == "throttled":
            what = f"throttled by the store ({throttle_label(exc)}) {every}, {tried}"
            remedy = ("the store asks for fewer requests: read with fewer workers or ranks at once, or wait longer "
                      "with retry=arrowstream.RetryPolicy(deadline=..., throttle_delay=...)")
        elif kind == "unreachable":
            what = f"storage could not be reached ({every}), {tried}"
            remedy = ("check the network connection (and any proxy), the host and port in the URL, or the endpoint "
                      "in storage_options; if the store is only restarting, allow more with "
                      "retry=arrowstream.RetryPolicy(attempts=..., deadline=...)")
        elif kind == "incomplete":
            what = f"the store sent bodies cut short or failing their checksum ({every}), {tried}"
        else:
            what = f"storage kept failing ({every}), {tried}"
        return f"{self.what}: {what}{why} (last error: {last}); {remedy} (see docs/storage.md)"
