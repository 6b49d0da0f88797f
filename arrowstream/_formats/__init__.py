"""File formats behind one reader contract (see :mod:`arrowstream._formats.base`)."""

from __future__ import annotations

from .base import FileFooter, FileFormat, UnitFile, UnitFormat, check_counts, name_units
from .ipc import IPC
from .orc import ORC
from .parquet import PARQUET
from .text import CSV, JSONL, TextFormat, TextSettings

FILE_FORMATS: dict[str, FileFormat] = {f.name: f for f in (PARQUET, ORC, IPC, CSV, JSONL)}
_UNIT_FORMATS: dict[str, UnitFormat] = dict(FILE_FORMATS)


def register_format(unit_format: UnitFormat) -> None:
    """Make a format known to readers by its name (Iceberg's data files, planned from the table's scan)."""
    _UNIT_FORMATS[unit_format.name] = unit_format


def get_format(name: str) -> FileFormat:
    """The format of that name that planning reads file by file."""
    return FILE_FORMATS[name]


def unit_format(name: str) -> UnitFormat:
    """The format of that name that reads a planned file's units (``FileFooter.format``)."""
    return _UNIT_FORMATS[name]


__all__ = ["FILE_FORMATS", "FileFooter", "FileFormat", "TextFormat", "TextSettings", "UnitFile", "UnitFormat",
           "check_counts", "get_format", "name_units", "register_format", "unit_format"]
