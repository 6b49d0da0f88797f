"""What a file looks like from its first bytes: the hint a file read with the wrong ``format=`` gets.

A CSV reader handed a Parquet file finds "rows" that do not parse, and a Parquet reader handed a CSV
file finds no footer; either error points at the file, not at the ``format=`` that was wrong. These
functions name what the first bytes look like (the magic numbers of the binary formats arrowstream
reads, of the compressions it reads from a suffix, or text) so the error can say which ``format=`` to
pass. A binary magic counts only when binary bytes follow it (a CSV header ``ORCID,name`` is text).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .._core.plan_types import FileEntry
    from .._storage.filesystem import Storage

HEAD_BYTES = 512   # bytes a sniff looks at

# magic, what it is, the format= that reads it (None: none does as is), what to do instead
_BINARY: tuple[tuple[bytes, str, str | None, str], ...] = (
    (b"PAR1", "a Parquet file", "parquet", ""),
    (b"ORC", "an ORC file", "orc", ""),
    (b"ARROW1", "an Arrow IPC (Feather v2) file", "arrow", ""),
    (b"FEA1", "a Feather v1 file", None,
     "rewrite it as Feather v2 (pyarrow.feather.write_feather(table, path)) and pass format='arrow'"),
    (b"\xff\xff\xff\xff", "an Arrow IPC stream", None,
     "rewrite it as an IPC file (pyarrow.ipc.new_file, or feather.write_feather) and pass format='arrow'"),
)
# magic, codec, the suffix that makes arrowstream decompress a CSV or JSON Lines file
_COMPRESSED = ((b"\x1f\x8b", "gzip", ".gz"), (b"\x28\xb5\x2f\xfd", "zstd", ".zst"), (b"BZh", "bzip2", ".bz2"))
_TEXT_FORMATS = ("csv", "jsonl")
_LABELS = {"parquet": "Parquet", "orc": "ORC", "arrow": "Arrow IPC", "csv": "CSV", "jsonl": "JSON Lines"}


def _is_text(head: bytes) -> bool:
    """No NUL byte and valid UTF-8 (a character cut at the end of the head allowed)."""
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 3 and exc.reason == "unexpected end of data"
    return True


class Head(NamedTuple):
    """What a file's first bytes look like."""

    what: str              # "a Parquet file", "a gzip-compressed file", "CSV (text)"
    format: str | None     # the format= that reads it as it is (None: none does)
    otherwise: str         # what to do when ``format`` is None
    text: bool             # whether the bytes are text (CSV, JSON Lines or other)


def describe_head(head: bytes) -> Head | None:
    """What a file whose first bytes are ``head`` looks like, or None when nothing can be told."""
    binary = not _is_text(head[:HEAD_BYTES])
    if not binary:
        text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
        if not text:
            return None
        if text.startswith(b"{"):
            return Head("JSON Lines (text)", "jsonl", "", True)
        if any(sep in text.split(b"\n", 1)[0] for sep in (b",", b"\t", b";", b"|")):
            return Head("CSV (text)", "csv", "", True)
        return Head("text", None, "if it holds CSV or JSON Lines pass format='csv' or format='jsonl'", True)
    for magic, what, fmt, otherwise in _BINARY:
        if head.startswith(magic):
            return Head(what, fmt, otherwise, False)
    for magic, codec, suffix in _COMPRESSED:
        if head.startswith(magic):
            return Head(f"a {codec}-compressed file", None,
                        f"if it holds CSV or JSON Lines, name it with a {suffix} suffix (compression is read from "
                        "the suffix) and pass format='csv' or format='jsonl'; else decompress it", False)
    return None


def wrong_format_hint(head: bytes, asked: str) -> str | None:
    """The advice for a file read as format ``asked`` whose first bytes are ``head``: None when the bytes
    fit ``asked`` or tell nothing (text read as CSV or JSON Lines: which one is the parser's to say)."""
    seen = describe_head(head)
    if seen is None or seen.format == asked or (seen.text and asked in _TEXT_FORMATS):
        return None
    if seen.format is not None:
        advice = f"pass format={seen.format!r} if the dataset's files are {_LABELS[seen.format]}"
    else:
        advice = seen.otherwise
    return (f"not a readable {_LABELS.get(asked, asked)} file (format={asked!r}): it looks like {seen.what}: "
            f"{advice}; if only this file is out of place, remove it or leave it out of `path`")


def sniff(storage: Storage, entry: FileEntry, asked: str) -> str | None:
    """:func:`wrong_format_hint` for a file in ``storage``, reading its first bytes; None when they cannot
    be read (the error being reported already says why)."""
    try:
        with storage.open_input(entry) as source:
            head = source.read(HEAD_BYTES)
    except Exception:  # noqa: BLE001 (a hint only: the caller's error stands without it)
        return None
    return wrong_format_hint(bytes(head), asked)
