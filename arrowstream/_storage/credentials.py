"""``credential_provider``: called with checks, named in every failure, refused where it cannot travel.

A provider is user code: it may raise, return something other than a dict, return options the
storage backend rejects (an unknown key, a value of the wrong type), keep returning credentials
that have already expired, or be a lambda that workers started by spawn or forkserver cannot
receive. Each of these is an arrowstream error that names the provider (its qualified name) and
what it was called for. Messages name keys and value types, never values: those are secrets.
Every message is also scrubbed of the string values of ``storage_options`` and of the
provider's last answer, in case a backend error echoes one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from multiprocessing.reduction import ForkingPickler
from typing import Any

from ..errors import ArgumentTypeError, ArrowStreamError, FileReadError, InvalidArgumentError

FIX_PICKLE = ("pass a module-level function, a functools.partial of one, or an instance of a module-level class "
              "with __call__")
_MIN_SECRET = 4      # shorter strings are not scrubbed (they would blank out ordinary words)


def provider_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a function, class instance or ``functools.partial`` (no arguments shown)."""
    if isinstance(fn, functools.partial):
        return f"functools.partial({provider_name(fn.func)})"
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", type(fn).__name__)
    return f"{module}.{qualname}" if module else str(qualname)


def _pickle_error(fn: Callable[..., Any]) -> str | None:
    """Why ``fn`` cannot be sent to a spawned worker, or None when it can."""
    try:
        ForkingPickler.dumps(fn)
    except Exception as exc:  # noqa: BLE001 - pickle raises PicklingError, AttributeError, TypeError ...
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if len(value) >= _MIN_SECRET else []
    if isinstance(value, Mapping):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in _strings(item)]
    return []


def _keys(answer: Mapping[Any, Any], keys: list[Any] | None = None) -> str:
    """Keys and the types of their values: ``'key' (int), 'secret' (str)``; never the values."""
    return ", ".join(f"{k!r} ({type(answer[k]).__name__})" for k in (answer if keys is None else keys))


def _raised_in_backend(exc: BaseException) -> bool:
    """Whether ``exc`` was raised in the storage backend (s3fs, botocore, gcsfs ...), not in arrowstream or
    pyarrow (a footer that does not parse is the file's fault, never the provider's)."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    module = str(tb.tb_frame.f_globals.get("__name__", ""))
    return not module.startswith(("arrowstream", "pyarrow"))


def _names(text: str, key: Any) -> bool:
    return isinstance(key, str) and re.search(rf"(?<!\w){re.escape(key)}(?!\w)", text) is not None


def _config_error(exc: BaseException) -> BaseException | None:
    """The error along the chain that says the backend could not use its options (an unexpected keyword, a
    value of the wrong type, partial credentials), raised by the backend; not an answer of the store."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 6:
        seen.append(current)
        if (isinstance(current, (TypeError, AttributeError)) or "credential" in type(current).__name__.lower()) \
                and _raised_in_backend(current):
            return current
        current = current.__cause__ or current.__context__
    return None


class CredentialProvider:
    """A user's ``credential_provider``, wrapped once when the dataset is built.

    Calling it returns the options to open a filesystem with; its picklability is checked at
    build time (workers started by spawn or forkserver receive it by pickle), and pickling an
    unpicklable one raises an error naming it and the fix instead of pickle's own.
    """

    def __init__(self, fn: Callable[[], dict[str, Any]]) -> None:
        self.fn = fn
        self.name = provider_name(fn)
        self.pickle_error = _pickle_error(fn)
        self._answer: dict[str, Any] = {}       # this process's last answer (secrets: never pickled or shown)
        self._secrets: list[str] = []

    def __call__(self) -> dict[str, Any]:
        return self.fn()

    def scrub(self, text: str) -> str:
        """``text`` with every secret this process knows of replaced by ``<hidden>``."""
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "<hidden>")
        return text

    def options(self, storage_options: Mapping[str, Any], what: str) -> dict[str, Any]:
        """``storage_options`` with the provider's answer laid over them; ``what`` says what for."""
        self._secrets = _strings(storage_options)
        try:
            fresh = self.fn()
        except ArrowStreamError:
            raise
        except Exception as exc:
            raise FileReadError(
                f"credential_provider {self.name} raised {self.describe(exc)} {what}; fix the provider (it is called "
                "when each process opens its filesystem, and again whenever the store says the credentials "
                "expired)") from exc
        if not isinstance(fresh, dict):
            raise ArgumentTypeError(f"credential_provider {self.name}: must return a dict of storage options, got "
                                    f"{type(fresh).__name__} {what}")
        odd = [k for k in fresh if not isinstance(k, str)]
        if odd:
            raise ArgumentTypeError(
                f"credential_provider {self.name} returned a dict with keys that are not str ("
                f"{', '.join(type(k).__name__ for k in odd)}) {what}; return storage option names as str keys")
        self._answer = dict(fresh)
        self._secrets = _strings(storage_options) + _strings(fresh)
        return {**storage_options, **fresh}

    def describe(self, exc: BaseException) -> str:
        """``Type: message`` (first line), scrubbed of secrets."""
        return self.scrub(f"{type(exc).__name__}: {exc}".splitlines()[0])

    def fault(self, exc: BaseException, what: str, protocol: str,
              storage_options: Mapping[str, Any]) -> ArrowStreamError | None:
        """The provider's answer as the cause of ``exc``, when the backend failed on the options it was
        given (an unknown keyword, a value of the wrong type, partial credentials); else None."""
        cause = _config_error(exc)
        if cause is None or not self._answer:
            return None
        answer = self._answer
        text = str(cause)
        named = [k for k in answer if _names(text, k)]
        if not named and any(_names(text, k) for k in storage_options):
            return None   # the backend named a key of storage_options: the caller's, not the provider's
        if named and "unexpected keyword" in text:
            return InvalidArgumentError(
                f"credential_provider {self.name} returned key(s) the {protocol} backend does not take: "
                f"{_keys(answer, named)} ({self.describe(cause)}) {what}; return only that backend's storage "
                f"options (it returned {_keys(answer)})")
        suspects = named or [k for k, v in answer.items()
                             if v is None or (k in storage_options and type(v) is not type(storage_options[k]))
                             or (k.endswith("kwargs") and not isinstance(v, dict))
                             or (isinstance(v, (int, float)) and not isinstance(v, bool))]
        which = f"check {_keys(answer, suspects)}; " if suspects else ""
        return ArgumentTypeError(
            f"credential_provider {self.name} returned options the {protocol} backend cannot use "
            f"({self.describe(cause)}) {what}; {which}it returned {_keys(answer)}. Return that backend's storage "
            "options with values of their types (credentials as str)")

    def expired(self, exc: BaseException, what: str, refreshes: int) -> FileReadError:
        """The store kept calling the provider's credentials expired after ``refreshes`` new answers."""
        return FileReadError(
            f"{what}: credential_provider {self.name} returned expired credentials {refreshes} times in a row "
            f"(asked again after each expired-token answer; last: {self.describe(exc)}); make it return fresh "
            "credentials (a new token, not a cached or stale one), and check the clock of this machine")

    def __getstate__(self) -> dict[str, Any]:
        if self.pickle_error is not None:
            raise InvalidArgumentError(
                f"credential_provider {self.name} cannot be pickled ({self.pickle_error}), and it travels by pickle "
                "here: loader workers started by spawn or forkserver receive the dataset by pickle (and under "
                f"torch.distributed, rank 0 sends its plan to the other ranks so); {FIX_PICKLE}, or start the workers "
                "with multiprocessing_context='fork'")
        return {"fn": self.fn, "name": self.name, "pickle_error": None, "_answer": {}, "_secrets": []}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __copy__(self) -> CredentialProvider:
        return self   # a provider is shared, as a function is

    def __deepcopy__(self, memo: dict[int, Any]) -> CredentialProvider:
        return self

    def __repr__(self) -> str:
        return f"CredentialProvider({self.name})"


def as_provider(fn: Callable[[], dict[str, Any]] | CredentialProvider | None) -> CredentialProvider | None:
    return fn if fn is None or isinstance(fn, CredentialProvider) else CredentialProvider(fn)


def check_start_method(provider: Callable[..., Any] | CredentialProvider | None, num_workers: int,
                       method: str) -> None:
    """Refuse a provider that cannot be pickled when workers will be started by spawn or forkserver."""
    if provider is None or num_workers == 0 or method == "fork":
        return
    wrapped = as_provider(provider)
    assert wrapped is not None
    if wrapped.pickle_error is not None:
        raise InvalidArgumentError(
            f"credential_provider: {wrapped.name} cannot be pickled ({wrapped.pickle_error}), and the loader starts "
            f"its {num_workers} worker(s) by {method}, which sends them the dataset by pickle; {FIX_PICKLE}, or "
            "use multiprocessing_context='fork'")
