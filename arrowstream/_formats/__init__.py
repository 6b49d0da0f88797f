"""File formats behind one reader contract (see :mod:`arrowstream._formats._base`)."""

from __future__ import annotations

from ._base import FileFooter, FileFormat, UnitFile, check_counts, name_units
from .ipc import IPC
from .orc import ORC
from .parquet import PARQUET
from .text import CSV, JSONL, TextFormat, TextSettings

FILE_FORMATS: dict[str, FileFormat] = {f.name: f for f in (PARQUET, ORC, IPC, CSV, JSONL)}


def register_format(file_format: FileFormat) -> None:
    """Make a format known to planning and readers by its name (Iceberg's wrapper uses it)."""
    FILE_FORMATS[file_format.name] = file_format


def get_format(name: str) -> FileFormat:
    return FILE_FORMATS[name]


__all__ = ["FILE_FORMATS", "FileFooter", "FileFormat", "TextFormat", "TextSettings", "UnitFile", "check_counts", "get_format",
           "name_units", "register_format"]
