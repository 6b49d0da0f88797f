"""The retry policy without servers: validation, backoff bounds, Retry-After, deadlines, messages, and the
backend settings laid under ``storage_options`` (the contract suite runs the faults on real stores)."""

from __future__ import annotations

import email.utils
import pickle
import random
import time

import pytest
from aiohttp import ClientPayloadError
from aiohttp.http_exceptions import ContentLengthError
from botocore.exceptions import ClientError, ReadTimeoutError
from s3fs.errors import translate_boto_error

from arrowstream import RetryPolicy, StructuredDataset, errors
from arrowstream._storage.backends import backend_options
from arrowstream._storage.failures import failure_kind, is_transient, parse_seconds, retry_after
from arrowstream._storage.filesystem import open_filesystem
from arrowstream._storage.retry import Attempts


def slowdown(retry_after_value: str | None = None) -> OSError:
    """What s3fs raises for a 503 SlowDown: an OSError whose cause is botocore's ClientError."""
    headers = {} if retry_after_value is None else {"retry-after": retry_after_value}
    error = ClientError({"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
                         "ResponseMetadata": {"HTTPStatusCode": 503, "HTTPHeaders": headers}}, "GetObject")
    return translate_boto_error(error)


def test_fields_are_validated_by_name():
    for field, value, error in [("attempts", 0, errors.InvalidArgumentError), ("attempts", 2.5, errors.ArgumentTypeError),
                                ("timeout", 0, errors.InvalidArgumentError), ("deadline", -1, errors.InvalidArgumentError),
                                ("base_delay", float("nan"), errors.InvalidArgumentError),
                                ("split_deadline", "60", errors.ArgumentTypeError),
                                ("max_delay", True, errors.ArgumentTypeError)]:
        with pytest.raises(error, match=rf"^retry: {field} must be"):
            RetryPolicy(**{field: value})
    assert RetryPolicy(base_delay=0, max_delay=0).backoff(3) == 0.0


def test_a_policy_travels_to_workers_and_retry_must_be_one(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "a.parquet")
    policy = RetryPolicy(attempts=7, timeout=4.5)
    copy = pickle.loads(pickle.dumps(StructuredDataset(tmp_path, retry=policy)))   # what a spawned worker gets
    assert copy._storage.retry == policy
    with pytest.raises(errors.ArgumentTypeError, match=r"retry: expected an arrowstream.RetryPolicy, got dict"):
        StructuredDataset(tmp_path, retry={"attempts": 3})


def test_backoff_is_full_jitter_within_its_cap_and_harder_when_throttled():
    policy = RetryPolicy(base_delay=0.1, max_delay=1.0, throttle_delay=0.5)
    assert [policy.backoff(n, rng=lambda: 1.0) for n in (1, 2, 3, 4, 5)] == [0.1, 0.2, 0.4, 0.8, 1.0]
    assert [policy.backoff(n, slowdown(), rng=lambda: 1.0) for n in (1, 2, 3)] == [0.5, 1.0, 1.0]
    draws = random.Random(3)
    waits = [policy.backoff(3, rng=draws.random) for _ in range(2000)]
    assert 0 <= min(waits) < 0.01 and 0.39 < max(waits) <= 0.4
    assert policy.backoff(5000, rng=lambda: 1.0) == 1.0     # no overflow after many failures


def test_retry_after_in_seconds_or_as_a_date():
    assert parse_seconds("7") == 7.0 and parse_seconds(" 1.5 ") == 1.5 and parse_seconds("soon") is None
    in_a_minute = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert 55 < parse_seconds(in_a_minute) <= 60
    assert parse_seconds(email.utils.formatdate(time.time() - 60, usegmt=True)) == 0.0
    assert retry_after(slowdown("12")) == 12.0 and retry_after(slowdown()) is None
    assert failure_kind(slowdown()) == "throttled" and is_transient(slowdown())


def test_retry_after_is_honoured_up_to_the_deadline():
    policy = RetryPolicy(attempts=5, throttle_delay=0.0)
    attempts = Attempts(policy, "s3://b/k", deadline=10.0, per="request")
    assert attempts.failed(slowdown("2"), lost=0.1) == 2.0
    with pytest.raises(errors.FileReadError, match=r"s3://b/k: throttled by the store .*asked to wait 30 s "
                                                   r"\(Retry-After\), past the deadline of 10 s per request"):
        attempts.failed(slowdown("30"), lost=0.1)


def test_a_request_stops_at_its_attempts_or_its_deadline_and_says_why():
    calls = []

    def timing_out():
        calls.append(1)
        raise ReadTimeoutError(endpoint_url="http://store/b/k")

    quick = RetryPolicy(attempts=3, base_delay=0.001, timeout=2)
    with pytest.raises(errors.FileReadError, match=r"^s3://b/k: storage did not answer within 2 s \(on every attempt\)"
                                                   r", 3 failed attempts over .*RetryPolicy\(timeout=") as failure:
        quick.call(timing_out, "s3://b/k")
    assert len(calls) == 3 and isinstance(failure.value.__cause__, ReadTimeoutError)

    calls.clear()
    started = time.monotonic()
    short = RetryPolicy(attempts=1000, base_delay=0.05, max_delay=0.05, deadline=0.3)
    with pytest.raises(errors.FileReadError, match=r"the deadline of 0.3 s per request was reached"):
        short.call(timing_out, "s3://b/k")
    assert time.monotonic() - started < 1.0 and 3 <= len(calls) < 1000

    def denied():
        calls.append(1)
        raise PermissionError("Access Denied")

    calls.clear()
    with pytest.raises(PermissionError):
        quick.call(denied, "s3://b/k")
    assert len(calls) == 1


def test_a_split_counts_failures_in_a_row_and_the_time_it_lost():
    policy = RetryPolicy(attempts=3, base_delay=0.0)
    split = Attempts(policy, "gs://b/part-0.parquet", deadline=5.0, per="split")
    reset = ConnectionResetError(104, "Connection reset by peer")
    for _ in range(5):     # two failures, then a piece read: never three in a row
        split.failed(reset, lost=0.1)
        split.failed(reset, lost=0.1)
        split.progressed()
    with pytest.raises(errors.FileReadError, match=r"gs://b/part-0.parquet: storage kept failing \(on every attempt\), "
                                                   r"11 failed attempts over 5.0 s; the deadline of 5 s per split"):
        split.failed(reset, lost=4.0)


def test_short_and_checksum_failing_bodies_are_transient():
    from botocore.exceptions import FlexibleChecksumError

    checksum = FlexibleChecksumError(error_msg="Expected checksum xYC4aQ== did not match calculated checksum: OKzjSg==")
    short = ConnectionResetError("short read of b/k [0, 6489): got 3244 bytes")
    cut = ClientPayloadError("Response payload is not completed")   # aiohttp, a connection closed mid-body
    cut.__cause__ = ContentLengthError("Not enough data to satisfy content length header (received 9 of 18 bytes).")
    for error in (checksum, short, cut):
        assert is_transient(error) and failure_kind(error) == "incomplete"


def test_what_the_backends_retried_themselves_stays_transient():
    """Errors gcsfs's own loop retried, now that it makes one attempt: a token that expired in flight, a token
    endpoint out of reach."""
    from gcsfs.retry import HttpError
    from google.auth.exceptions import TransportError

    assert is_transient(HttpError({"code": 401, "message": "Invalid Credentials"}))
    assert is_transient(TransportError("Failed to retrieve http://metadata.google.internal/ from the metadata server"))
    assert not is_transient(HttpError({"code": 401, "message": "Anonymous caller does not have storage.objects.get"}))


def test_backend_defaults_lie_under_the_users_options():
    policy_timeout = 9.0
    s3 = backend_options("s3", {"config_kwargs": {"read_timeout": 120, "retries": {"max_attempts": 4}}}, policy_timeout)
    assert s3["config_kwargs"] == {"retries": {"max_attempts": 4}, "connect_timeout": 9.0, "read_timeout": 120}
    assert backend_options("s3a", {}, 9.0)["config_kwargs"]["retries"] == {"total_max_attempts": 1}
    gcs = backend_options("gs", {"token": "anon"}, policy_timeout)["requests_timeout"]
    assert (gcs.total, gcs.sock_connect, gcs.sock_read) == (None, 9.0, 9.0)
    assert backend_options("gcs", {"requests_timeout": 300}, 9.0)["requests_timeout"] == 300
    assert backend_options("az", {"read_timeout": 60}, 9.0) == {"connection_timeout": 9.0, "read_timeout": 60}
    assert backend_options("file", {"auto_mkdir": True}, 9.0) == {"auto_mkdir": True}


def test_opened_filesystems_make_one_attempt_per_call():
    """No request is sent: the settings are read off the opened filesystems."""
    policy = RetryPolicy(timeout=7.0)
    s3 = open_filesystem("s3", {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9"}, True, policy)
    assert s3.retries == 1 and s3.config_kwargs["read_timeout"] == 7.0
    gcs = open_filesystem("gs", {"token": "anon", "endpoint_url": "http://127.0.0.1:9"}, True, policy)
    assert gcs._request.__func__ is type(gcs)._request.__wrapped__
    azure = open_filesystem("az", {"connection_string": "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=a2V5;"
                                   "BlobEndpoint=http://127.0.0.1:9/a;"}, True, policy)
    config = azure.service_client._config
    assert config.retry_policy.total_retries == 0
    assert (config.transport.connection_config.timeout, config.transport.connection_config.read_timeout) == (7.0, 7.0)


class Failing:
    """A request that raises the given errors in turn, then returns "done"."""

    def __init__(self, *errors_in_turn: Exception) -> None:
        self.left, self.calls = list(errors_in_turn), 0

    def __call__(self) -> str:
        self.calls += 1
        if self.left:
            raise self.left.pop(0)
        return "done"


def test_one_decision_after_a_failure_for_requests_and_splits(caplog):
    """Attempts.after decides for a request (Storage.call) and a split (SplitReader) alike: wait and try
    again, ask the credential provider again, or give up with an error that says why."""
    from arrowstream._storage.filesystem import Storage
    from arrowstream._storage.retry import MAX_REFRESHES

    asked = []
    storage = Storage("memory", credential_provider=lambda: asked.append(1) or {})
    expired = PermissionError("ExpiredToken: The provided token has expired.")
    reset = ConnectionResetError(104, "Connection reset by peer")
    split = Attempts(RetryPolicy(attempts=2, base_delay=0.0), "memory://b/k", 10.0, per="split", credentials=storage)
    assert split.after(reset, lost=0.1) == 0.0
    assert [split.after(expired, lost=0.1, at=" at row 7") for _ in range(MAX_REFRESHES)] == [0.0] * MAX_REFRESHES
    assert len(asked) == MAX_REFRESHES and "reading memory://b/k at row 7; asked the credential provider" in caplog.text
    with pytest.raises(errors.FileReadError, match=r"^memory://b/k: credential_provider .* returned expired "
                                                   r"credentials 3 times in a row"):
        split.after(expired, lost=0.1)
    with pytest.raises(errors.FileReadError, match=r"2 failed attempts"):   # a refresh is no progress: in a row
        split.after(reset, lost=0.1)
    for error in (errors.CorruptFileError("memory://b/k: bad"), FileNotFoundError("b/k"), expired):
        assert Attempts(RetryPolicy(), "memory://b/k", 10.0, per="request").after(error, lost=0.0) is None

    # a request: the same decisions, in one budget of attempts with its refreshes (as a split's)
    quick = RetryPolicy(attempts=2, base_delay=0.0)
    assert quick.call(Failing(expired, reset, expired), "memory://b/k", credentials=storage) == "done"
    with pytest.raises(errors.FileReadError, match=r"^memory://b/k: storage kept failing .*2 failed attempts"):
        quick.call(Failing(reset, expired, reset), "memory://b/k", credentials=storage)
    with pytest.raises(PermissionError):   # no provider to ask: the store's answer, as it is
        quick.call(Failing(expired), "memory://b/k")
