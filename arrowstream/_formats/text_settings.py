"""The parse options of a CSV or JSON Lines dataset, validated once in the main process, and the layout of a
text file's units: the values that travel with the plan (in ``FileFooter.extra``) to every worker."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from ..errors import ArgumentTypeError, InvalidArgumentError

_CSV_PARSE = ("delimiter", "quote_char", "double_quote", "escape_char", "newlines_in_values", "ignore_empty_lines")
_CSV_READ = ("column_names", "skip_rows", "skip_rows_after_names", "encoding")
_CSV_CONVERT = ("null_values", "true_values", "false_values", "strings_can_be_null", "quoted_strings_can_be_null",
                "timestamp_parsers", "decimal_point", "check_utf8")
_COMMON = ("column_types", "bad_rows")
CSV_KEYS = (*_CSV_PARSE, *_CSV_READ, *_CSV_CONVERT, "header", *_COMMON)
JSON_KEYS = ("newlines_in_values", "unexpected_field_behavior", *_COMMON)


def _data_type(name: str, value: Any) -> pa.DataType:
    if isinstance(value, pa.DataType):
        return value
    if isinstance(value, str):
        try:
            return pa.type_for_alias(value)
        except ValueError:
            pass
    raise InvalidArgumentError(f"parse_options: column_types[{name!r}] = {value!r} is not a pyarrow type; "
                               "pass a pyarrow.DataType or a name such as 'int64', 'float32', 'string'")


@dataclass(frozen=True)
class TextSettings:
    """The parse options of a CSV or JSON Lines dataset, validated (picklable, travels with the plan)."""

    kind: str                                   # "csv" or "jsonl"
    options: tuple[tuple[str, Any], ...]        # the user's keys, sorted, types resolved
    bad_rows: str = "error"

    @classmethod
    def from_user(cls, kind: str, options: Mapping[str, Any] | None) -> TextSettings:
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ArgumentTypeError(f"parse_options: expected a dict of option -> value, got {type(options).__name__}")
        allowed = CSV_KEYS if kind == "csv" else JSON_KEYS
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise InvalidArgumentError(f"parse_options: {unknown} are not {kind} options; known: {sorted(allowed)}")
        resolved = dict(options)
        bad_rows = resolved.pop("bad_rows", "error")
        if bad_rows not in ("error", "skip"):
            raise InvalidArgumentError(f"parse_options: bad_rows must be 'error' or 'skip', got {bad_rows!r}")
        if "column_types" in resolved:
            types = resolved["column_types"]
            if not isinstance(types, Mapping):
                raise ArgumentTypeError("parse_options: column_types must be a dict of column name -> type")
            resolved["column_types"] = tuple(sorted((str(k), _data_type(k, v)) for k, v in types.items()))
        encoding = str(resolved.get("encoding", "utf8")).lower().replace("-", "").replace("_", "")
        if encoding.startswith(("utf16", "utf32", "ucs")):
            raise InvalidArgumentError(f"parse_options: encoding {resolved['encoding']!r} is not byte-compatible with "
                                       "ASCII line breaks; convert the files to UTF-8")
        for key in ("column_names", "null_values", "true_values", "false_values", "timestamp_parsers"):
            if key in resolved:
                if isinstance(resolved[key], str) or not isinstance(resolved[key], Sequence):
                    raise ArgumentTypeError(f"parse_options: {key} must be a list of strings, got {resolved[key]!r}")
                resolved[key] = tuple(resolved[key])
        for key in ("skip_rows", "skip_rows_after_names"):
            value = resolved.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(f"parse_options: {key} must be an int >= 0, got {value!r}")
        settings = cls(kind, tuple(sorted(resolved.items())), bad_rows)
        if bad_rows == "skip" and not settings.scannable:
            raise InvalidArgumentError("parse_options: bad_rows='skip' needs rows the scan can find, which "
                                       f"{'escape_char' if kind == 'csv' else 'newlines_in_values'} prevents; "
                                       "leave one of the two out")
        if kind == "csv":   # let pyarrow check the values now, in the main process
            settings.csv_options(None, None, None, True)
        elif resolved.get("unexpected_field_behavior", "error") not in ("error", "ignore"):
            raise InvalidArgumentError(  # 'infer' would give units columns the others lack
                "parse_options: unexpected_field_behavior must be 'error' (a field the first file's rows lack is an "
                f"error) or 'ignore' (it is left out), got {resolved['unexpected_field_behavior']!r}; list late "
                "fields in column_types to read them")
        return settings

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)

    def state(self) -> dict[str, Any]:
        """JSON-able form for the options fingerprint."""
        return {"kind": self.kind, "bad_rows": self.bad_rows,
                **{k: [list(map(str, t)) for t in v] if k == "column_types" else v for k, v in self.options}}

    @property
    def scannable(self) -> bool:
        """Whether a scan of the bytes finds where rows start (else files are whole units)."""
        if self.kind == "csv":
            return self.get("escape_char", False) is False
        return not self.get("newlines_in_values", False)

    @property
    def quote(self) -> int | None:
        if self.kind != "csv":
            return None
        quote = self.get("quote_char", '"')
        return None if quote is False else ord(quote)

    @property
    def skip_empty(self) -> bool:
        return self.kind != "csv" or bool(self.get("ignore_empty_lines", True))

    @property
    def leading_rows(self) -> int:
        """Rows before the data: skipped rows, the header, rows skipped after the header."""
        if self.kind != "csv":
            return 0
        header = self.get("header", True) and self.get("column_names") is None
        return int(self.get("skip_rows", 0)) + int(bool(header)) + int(self.get("skip_rows_after_names", 0))

    def csv_options(self, names: list[str] | None, schema: pa.Schema | None, include: list[str] | None,
                    use_threads: bool, newlines: bool = False,
                    ) -> tuple[pa_csv.ReadOptions, pa_csv.ParseOptions, pa_csv.ConvertOptions]:
        """pyarrow's options: as the user gave them when ``names`` is None (the file with its header),
        else for headerless stretches of data rows with known names and types."""
        opts = dict(self.options)
        read = {k: opts[k] for k in _CSV_READ if k in opts}
        parse = {k: opts[k] for k in _CSV_PARSE if k in opts}
        convert = {k: opts[k] for k in _CSV_CONVERT if k in opts}
        if names is None:
            read.setdefault("autogenerate_column_names", not opts.get("header", True) and "column_names" not in opts)
            if "column_names" in read:
                read["column_names"] = list(read["column_names"])
            convert["column_types"] = dict(opts.get("column_types", ()))
        else:
            read = {"column_names": names, **({"encoding": read["encoding"]} if "encoding" in read else {})}
            assert schema is not None
            convert["column_types"] = {f.name: f.type for f in schema}
        if include is not None:
            convert["include_columns"] = include
        if newlines:
            parse["newlines_in_values"] = True
        for key in ("null_values", "true_values", "false_values", "timestamp_parsers"):
            if key in convert:
                convert[key] = list(convert[key])
        try:
            return (pa_csv.ReadOptions(use_threads=use_threads, **read), pa_csv.ParseOptions(**parse),
                    pa_csv.ConvertOptions(**convert))
        except (TypeError, ValueError, pa.ArrowInvalid) as exc:
            raise InvalidArgumentError(f"parse_options: pyarrow refuses them: {exc}") from None

    def json_options(self, schema: pa.Schema | None, use_threads: bool, block_size: int | None = None,
                     ) -> tuple[pa_json.ReadOptions, pa_json.ParseOptions]:
        opts = dict(self.options)
        parse: dict[str, Any] = {"newlines_in_values": bool(opts.get("newlines_in_values", False))}
        if schema is not None:
            parse["explicit_schema"] = schema
            parse["unexpected_field_behavior"] = opts.get("unexpected_field_behavior", "error")
        elif "column_types" in opts:
            parse["explicit_schema"] = pa.schema(list(opts["column_types"]))
        read = {"use_threads": use_threads, **({"block_size": block_size} if block_size else {})}
        return pa_json.ReadOptions(**read), pa_json.ParseOptions(**parse)


@dataclass(frozen=True)
class TextLayout:
    """Where a text file's units lie (travels in ``FileFooter.extra``)."""

    settings: TextSettings
    compression: str | None
    ranges: tuple[tuple[int, int], ...]     # byte range of each unit (whole file when compressed)
    lines: tuple[int, ...]                  # line breaks before each unit's first row
    names: tuple[str, ...]                  # the file's column names
    quoted_newlines: bool                   # a quoted field holds a line break: parse with newlines_in_values
    lone_cr: bool = False                   # a lone \r outside quotes: rows as pyarrow finds them, not the scan

    @property
    def scanned(self) -> bool:
        """Whether the planning scan found the rows (else pyarrow's own parse of the whole file counts them)."""
        return self.settings.scannable and not self.lone_cr
