"""The backends' own retries turned down and the policy's timeout handed to them, when a filesystem opens.

arrowstream retries every storage request itself (:class:`~arrowstream._storage.retry.RetryPolicy`).
Left alone, s3fs retries 5 times around botocore's 5 attempts (and s3fs's read loop 5 times
around that), gcsfs 6 times, the Azure SDK 3 times with waits of 15 s and more: a failed read
cost up to 125 requests and minutes. Here each backend makes one attempt per call and cuts a
request that waits longer than the policy's ``timeout`` to connect or for a byte.

What can be said in ``storage_options`` is laid *under* them: a user's ``config_kwargs``
(its ``retries``, ``connect_timeout``, ``read_timeout``), gcsfs ``requests_timeout``, adlfs
``connection_timeout``/``read_timeout`` win. The loops that are not options (s3fs's
``retries``, gcsfs's retry decorator, the Azure SDK's retry policy) are set on the opened
filesystem to one attempt: more attempts are the policy's ``attempts``.
"""

from __future__ import annotations

import logging
import types
from typing import Any

logger = logging.getLogger("arrowstream")

_FAMILY = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure"}


def family(protocol: str) -> str | None:
    """``s3``, ``gcs`` or ``azure`` for the protocols of s3fs, gcsfs and adlfs; None for the rest."""
    return _FAMILY.get(protocol)


def backend_options(protocol: str, options: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``options`` with the backend's timeouts and one attempt per call laid under them."""
    kind = family(protocol)
    if kind == "s3":
        config = {"retries": {"total_max_attempts": 1}, "connect_timeout": timeout, "read_timeout": timeout}
        return {**options, "config_kwargs": {**config, **(options.get("config_kwargs") or {})}}
    if kind == "gcs" and "requests_timeout" not in options:
        import aiohttp

        # a number would be aiohttp's *total* time, which a large range on a slow link may need;
        # a stall is a socket that neither connects nor sends a byte for `timeout` seconds
        return {**options, "requests_timeout": aiohttp.ClientTimeout(total=None, sock_connect=timeout,
                                                                     sock_read=timeout)}
    if kind == "azure":
        return {"connection_timeout": timeout, "read_timeout": timeout, **options}
    return options


def single_attempt(fs: Any, protocol: str) -> Any:
    """Turn the retry loops of ``fs`` that no option reaches down to one attempt; returns ``fs``."""
    kind = family(protocol)
    if kind == "s3" and hasattr(fs, "retries"):
        fs.retries = 1                                 # s3fs's _error_wrapper and its read loop
    elif kind == "gcs":
        # gcsfs fixes its retry count (6) when the class is defined, in a decorator of _request;
        # this instance calls the undecorated method: one attempt, errors unchanged
        inner = getattr(type(fs)._request, "__wrapped__", None)
        if inner is not None:
            fs._request = types.MethodType(inner, fs)
        else:
            logger.debug("gcsfs has no undecorated _request; its own retries stay on")
    elif kind == "azure":
        config = getattr(getattr(fs, "service_client", None), "_config", None)
        policy = getattr(config, "retry_policy", None)
        if policy is not None and hasattr(policy, "total_retries"):
            policy.total_retries = 0                   # shared by the container and blob clients
        connection = getattr(getattr(config, "transport", None), "connection_config", None)
        timeouts = getattr(fs, "_timeout_kwargs", {})
        if connection is not None:                     # requests adlfs sends without its timeouts (HEAD)
            connection.timeout = timeouts.get("connection_timeout", connection.timeout)
            connection.read_timeout = timeouts.get("read_timeout", connection.read_timeout)
    return fs
