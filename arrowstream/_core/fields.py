"""Strict reading of state dicts: each field of the expected JSON type and range, or a ``StateError``.

A state comes from a file a user stored, so nothing in it is trusted: ``int(x)`` would take
``True``, ``"7"`` or ``7.9``, and a missing key would surface as a bare ``KeyError`` far from its
cause. :class:`Fields` reads a dict field by field and names the field, the value (shortened:
see :func:`shorten`) and what was expected.
"""

from __future__ import annotations

from typing import Any

from ..errors import StateError

REMEDY = "pass the dict returned by loader.state_dict() (or merge_state_dicts) unchanged"
MAX_ECHO = 80  # characters of a value a message repeats
MAX_INT = 2**63 - 1  # every count, index and seed of a state fits a signed 64-bit int


def shorten(value: Any, limit: int = MAX_ECHO) -> str:
    """``repr(value)``, cut to about ``limit`` characters (a state may hold a 50 MB string)."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        value = value[:limit]
        return f"{value!r}... ({type(value).__name__} cut at {limit} characters)"
    if isinstance(value, int) and value.bit_length() > 200:  # str() of a huge int raises, or runs long
        return f"<int of {value.bit_length()} bits>"
    if isinstance(value, (dict, list, tuple)) and len(value) > 8:
        return f"<{type(value).__name__} of {len(value)} items>"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def is_int(value: Any) -> bool:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(value: Any, where: str, low: int = 0, high: int | None = None) -> int:
    """``value`` if it is an int (not a bool) in ``[low, high]``, else a ``StateError`` naming ``where``."""
    if not is_int(value) or value < low or value > (MAX_INT if high is None else high):
        bound = f"from {low} to {high}" if high is not None else f">= {low} that fits in 64 bits"
        raise StateError(f"the state's {where} is {shorten(value)}, expected an int {bound}; {REMEDY}")
    return int(value)


class Fields:
    """A dict of a state, read field by field; ``where`` names it in errors (``"worker 1 cursor"``)."""

    __slots__ = ("value", "where")

    def __init__(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise StateError(f"the state's {where} is {shorten(value)}, expected a dict; {REMEDY}")
        self.value: dict[str, Any] = value
        self.where = where

    def name(self, key: str) -> str:
        return f"{self.where}.{key}"

    def get(self, key: str) -> Any:
        if key not in self.value:
            raise StateError(f"the state's {self.where} has no {key!r} field; {REMEDY}")
        return self.value[key]

    def integer(self, key: str, low: int = 0, high: int | None = None) -> int:
        return check_int(self.get(key), self.name(key), low, high)

    def optional_integer(self, key: str) -> int | None:
        value = self.get(key)
        return None if value is None else check_int(value, self.name(key), -(2**63))

    def boolean(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            raise StateError(f"the state's {self.name(key)} is {shorten(value)}, expected true or false; {REMEDY}")
        return value

    def string(self, key: str) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            raise StateError(f"the state's {self.name(key)} is {shorten(value)}, expected a string; {REMEDY}")
        return value

    def mapping(self, key: str) -> Fields:
        return Fields(self.get(key), self.name(key))

    def sequence(self, key: str) -> list[Any]:
        value = self.get(key)
        if not isinstance(value, (list, tuple)):
            raise StateError(f"the state's {self.name(key)} is {shorten(value)}, expected a list; {REMEDY}")
        return list(value)
