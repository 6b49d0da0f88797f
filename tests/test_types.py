"""The type matrix: every Arrow type pyarrow writes to Parquet, ORC and Arrow IPC, in every output
format, with 0 and 2 workers: the values pyarrow's own conversion gives, or the documented error
(docs/formats.md, "Every Arrow type in every output format", which this file mirrors)."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from helpers import all_batches
from pyarrow import ipc, orc
from pyarrow.cffi import ffi

from arrowstream import ConversionError, InvalidArgumentError, StructuredDataset
from arrowstream._core.take import take

DOCS = Path(__file__).resolve().parent.parent / "docs" / "formats.md"
ROWS = 6
FORMATS = {"parquet": "parquet", "orc": "orc", "ipc": "arrow"}
OUTPUTS = ["torch", "numpy", "arrow", "dict"]


def with_c_formats(batch: pa.RecordBatch, formats: dict[str, bytes]) -> pa.RecordBatch:
    """``batch`` with the C data interface format of some columns replaced: pyarrow reads and
    writes month and day-time intervals but cannot build them in Python."""
    c_schema, c_array = ffi.new("struct ArrowSchema*"), ffi.new("struct ArrowArray*")
    batch._export_to_c(int(ffi.cast("uintptr_t", c_array)), int(ffi.cast("uintptr_t", c_schema)))
    kept = []
    for i in range(c_schema.n_children):
        name = ffi.string(c_schema.children[i].name).decode()
        if name in formats:
            kept.append(ffi.new("char[]", formats[name]))
            c_schema.children[i].format = kept[-1]
    return pa.RecordBatch._import_from_c(int(ffi.cast("uintptr_t", c_array)), int(ffi.cast("uintptr_t", c_schema)))


def _ns(values: list[int]) -> list[int]:
    return [v * 1_000 for v in values]


SECOND = 1_700_000_000                       # 2023-11-14
FAR_SECONDS = 260_000_000_000                # year 10209: beyond Python's datetime
STRUCT = pa.struct([("a", pa.int32()), ("b", pa.struct([("c", pa.string())]))])

# name -> (the table's doc row in docs/formats.md, the column); values repeat per row
COLUMNS: dict[str, tuple[str, pa.Array]] = {
    "int8": ("int8 … uint64", pa.array([1, -2, 3, -4, 5, -6], pa.int8())),
    "int16": ("int8 … uint64", pa.array(range(6), pa.int16())),
    "int32": ("int8 … uint64", pa.array(range(6), pa.int32())),
    "int64": ("int8 … uint64", pa.array(range(6), pa.int64())),
    "uint8": ("int8 … uint64", pa.array(range(6), pa.uint8())),
    "uint16": ("int8 … uint64", pa.array(range(6), pa.uint16())),
    "uint32": ("int8 … uint64", pa.array(range(6), pa.uint32())),
    "uint64": ("int8 … uint64", pa.array([2**64 - 1, 0, 1, 2, 3, 4], pa.uint64())),
    "float16": ("float16", pa.array(np.arange(6, dtype=np.float16) / 4)),
    "float32": ("float32, float64", pa.array(np.arange(6, dtype=np.float32) / 3)),
    "float64": ("float32, float64", pa.array(np.arange(6, dtype=np.float64) / 7)),
    "bool": ("bool", pa.array([True, False] * 3)),
    "dict_int": ("dictionary", pa.array([5, 7, 5, 7, 5, 9], pa.int64()).dictionary_encode()),
    "dict_str": ("dictionary", pa.array(["a", "b", None, "a", "b", "a"]).dictionary_encode()),
    "ts_s": ("timestamp", pa.array([SECOND + i for i in range(6)], pa.timestamp("s"))),
    "ts_ms": ("timestamp", pa.array([SECOND * 1000 + i for i in range(6)], pa.timestamp("ms"))),
    "ts_us": ("timestamp", pa.array([SECOND * 10**6 + i for i in range(6)], pa.timestamp("us"))),
    "ts_ns": ("timestamp", pa.array(_ns([SECOND * 10**6 + i for i in range(6)]), pa.timestamp("ns"))),
    "ts_ns_tz": ("timestamp", pa.array(_ns([SECOND * 10**6 + i for i in range(6)]), pa.timestamp("ns", "UTC"))),
    "ts_us_tz": ("timestamp", pa.array([SECOND * 10**6 + i for i in range(6)], pa.timestamp("us", "Europe/Paris"))),
    "ts_ns_sub": ("timestamp", pa.array([SECOND * 10**9 + i for i in range(6)], pa.timestamp("ns"))),
    "ts_s_far": ("timestamp", pa.array([FAR_SECONDS + i for i in range(6)], pa.timestamp("s"))),
    "date32": ("date32, date64", pa.array([dt.date(2024, 1, 1 + i) for i in range(6)], pa.date32())),
    "date32_far": ("date32, date64", pa.array([3_000_000 + i for i in range(6)], pa.int32()).cast(pa.date32())),
    "date64": ("date32, date64", pa.array([dt.date(1969, 12, 25 + i) for i in range(6)], pa.date64())),
    "time32_s": ("time32, time64", pa.array([3600 + i for i in range(6)], pa.time32("s"))),
    "time32_ms": ("time32, time64", pa.array([3600_000 + i for i in range(6)], pa.time32("ms"))),
    "time64_us": ("time32, time64", pa.array([3600_000_000 + i for i in range(6)], pa.time64("us"))),
    "time64_ns": ("time32, time64", pa.array([3600_000_000_001 + i for i in range(6)], pa.time64("ns"))),
    "dur_s": ("duration", pa.array([-1, 0, 1, 2, 3, 86400], pa.duration("s"))),
    "dur_ms": ("duration", pa.array(range(6), pa.duration("ms"))),
    "dur_us": ("duration", pa.array(range(6), pa.duration("us"))),
    "dur_ns": ("duration", pa.array(_ns(list(range(6))), pa.duration("ns"))),
    "dur_ns_sub": ("duration", pa.array(range(6), pa.duration("ns"))),
    "dur_s_huge": ("duration", pa.array([10**15 + i for i in range(6)], pa.duration("s"))),
    "month_day_nano": ("month_day_nano_interval",
                       pa.array([pa.MonthDayNano([i, -i, 10**12 + i]) for i in range(6)], pa.month_day_nano_interval())),
    "month": ("month_interval, day_time_interval", pa.array(range(6), pa.int32())),
    "day_time": ("month_interval, day_time_interval", pa.array(range(6), pa.int64())),
    "decimal128": ("decimal128, decimal256", pa.array([decimal.Decimal(f"{i}.25") for i in range(6)], pa.decimal128(10, 2))),
    "decimal256": ("decimal128, decimal256",
                   pa.array([decimal.Decimal(f"1{'0' * 45}.{i}") for i in range(6)], pa.decimal256(60, 1))),
    "string": ("string, large_string, string_view", pa.array(["a", "", None, "é", "xyz", "b"])),
    "large_string": ("string, large_string, string_view", pa.array(["a", "b", None, "c", "d", "e"], pa.large_string())),
    "string_view": ("string, large_string, string_view", pa.array(["a", "b", None, "c", "d", "e"], pa.string_view())),
    "binary": ("binary, large_binary, binary_view, fixed_size_binary",
               pa.array([b"\x00", b"a", None, b"", b"\xff", b"z"])),
    "large_binary": ("binary, large_binary, binary_view, fixed_size_binary",
                     pa.array([b"a", b"b", None, b"c", b"d", b"e"], pa.large_binary())),
    "binary_view": ("binary, large_binary, binary_view, fixed_size_binary",
                    pa.array([b"a", b"b", None, b"c", b"d", b"e"], pa.binary_view())),
    "fixed_binary": ("binary, large_binary, binary_view, fixed_size_binary",
                     pa.array([bytes([i] * 3) for i in range(6)], pa.binary(3))),
    "list": ("list, large_list, list_view", pa.array([[1, 2], [], None, [3], [4, None], [5]], pa.list_(pa.int32()))),
    "large_list": ("list, large_list, list_view", pa.array([[1], [2, 3], [], None, [4], [5]], pa.large_list(pa.int64()))),
    "list_view": ("list, large_list, list_view", pa.array([[1], [2, 3], [], None, [4], [5]], pa.list_view(pa.int16()))),
    "vector": ("fixed_size_list of numbers", pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.float32)), 2)),
    "fixed_strings": ("fixed_size_list of other types",
                      pa.array([["a", "b"]] * 6, pa.list_(pa.string(), 2))),
    "struct": ("struct, map", pa.array([{"a": i, "b": {"c": str(i)}} if i != 2 else None for i in range(6)], STRUCT)),
    "list_struct": ("struct, map", pa.array([[{"a": i, "b": None}] for i in range(6)], pa.list_(STRUCT))),
    "map": ("struct, map", pa.array([[("k", 1)], [], None, [("a", 1), ("b", 2)], [("z", 0)], []],
                                     pa.map_(pa.string(), pa.int32()))),
    "list_ts_ns": ("nested temporal", pa.array([[v] for v in _ns([SECOND * 10**6 + i for i in range(6)])],
                                                pa.list_(pa.timestamp("ns")))),
    "list_ts_ns_sub": ("nested temporal", pa.array([[SECOND * 10**9 + i] for i in range(6)], pa.list_(pa.timestamp("ns")))),
    "list_view_ts_ns_sub": ("nested temporal", pa.array([[SECOND * 10**9 + i] for i in range(6)],
                                                      pa.list_view(pa.timestamp("ns")))),
    "dict_ts_ns_sub": ("dictionary", pa.array([SECOND * 10**9 + i % 2 for i in range(6)],
                                              pa.timestamp("ns")).dictionary_encode()),
    "struct_date_far": ("nested temporal", pa.array([{"d": 3_000_000 + i} for i in range(6)],
                                                     pa.struct([("d", pa.int32())])).cast(pa.struct([("d", pa.date32())]))),
    "sparse_union": ("sparse_union, dense_union", pa.UnionArray.from_sparse(
        pa.array([0, 1, 0, 1, 0, 1], pa.int8()), [pa.array(range(6)), pa.array([str(i) for i in range(6)])])),
    "dense_union": ("sparse_union, dense_union", pa.UnionArray.from_dense(
        pa.array([0, 1, 0, 1, 0, 1], pa.int8()), pa.array([0, 0, 1, 1, 2, 2], pa.int32()),
        [pa.array([1.5, 2.5, 3.5]), pa.array(["x", "y", "z"])])),
    "null": ("null", pa.nulls(6)),
    "uuid": ("extension types (uuid)", pa.ExtensionArray.from_storage(pa.uuid(), pa.array([bytes([i]) * 16 for i in range(6)],
                                                                                            pa.binary(16)))),
}
C_FORMATS = {"month": b"tiM", "day_time": b"tiD"}


def _write(fmt: str, table: pa.Table, where: Any) -> None:
    if fmt == "parquet":
        pq.write_table(table, where)
    elif fmt == "orc":
        orc.write_table(table, where)
    else:
        with ipc.new_file(where, table.schema) as writer:
            writer.write_table(table)


def _read(fmt: str, where: Any) -> pa.Table:
    if fmt == "parquet":
        return pq.ParquetFile(where).read()   # read_table refuses repeated names
    if fmt == "orc":
        return orc.read_table(where)
    return ipc.open_file(where).read_all()


def _writable(fmt: str, name: str, column: pa.Array) -> bool:
    """Whether pyarrow writes the column to ``fmt`` and reads it back."""
    batch = pa.record_batch({name: column})
    if name in C_FORMATS:
        batch = with_c_formats(batch, {name: C_FORMATS[name]})
    buffer = io.BytesIO()
    try:
        _write(fmt, pa.Table.from_batches([batch]), buffer)
        buffer.seek(0)
        _read(fmt, buffer)
    except (pa.ArrowException, ValueError, TypeError):
        return False
    return True


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, tuple[str, pa.Table]]:
    """Per format: a folder holding one file of every column pyarrow writes, and pyarrow's read of it."""
    root = tmp_path_factory.mktemp("types")
    out = {}
    for fmt in FORMATS:
        names = [name for name, (_, column) in COLUMNS.items() if _writable(fmt, name, column)]
        batch = pa.record_batch({name: COLUMNS[name][1] for name in names})
        batch = with_c_formats(batch, {n: f for n, f in C_FORMATS.items() if n in names})
        folder = root / fmt
        folder.mkdir()
        _write(fmt, pa.Table.from_batches([batch]), str(folder / f"types.{fmt}"))
        out[fmt] = (str(folder), _read(fmt, str(folder / f"types.{fmt}")))
    return out


# -- pyarrow's own conversions: what every output format must equal ------------------------------

def _no_python_class(t: pa.DataType) -> bool:
    if t.id in (pa.lib.Type_INTERVAL_MONTHS, pa.lib.Type_INTERVAL_DAY_TIME):
        return True
    nested = [t.value_type] if pa.types.is_dictionary(t) else [t.field(i).type for i in range(t.num_fields)]
    return any(_no_python_class(c) for c in nested)


def _micros(t: pa.DataType) -> pa.DataType:
    """Nanosecond units as microseconds (top level and in lists and structs)."""
    if pa.types.is_timestamp(t) and t.unit == "ns":
        return pa.timestamp("us", t.tz)
    if pa.types.is_time64(t) and t.unit == "ns":
        return pa.time64("us")
    if pa.types.is_duration(t) and t.unit == "ns":
        return pa.duration("us")
    if pa.types.is_list(t):
        return pa.list_(_micros(t.value_type))
    return t


def python_values(column: pa.Array) -> list[Any] | type[Exception]:
    """pyarrow's ``to_pylist`` at microsecond resolution, or ConversionError where it fails."""
    if _no_python_class(column.type):
        return ConversionError
    try:
        return column.cast(_micros(column.type), safe=True).to_pylist()
    except (pa.ArrowInvalid, ValueError, OverflowError):
        return ConversionError


def kind(t: pa.DataType) -> str:
    """The row of the docs table a type falls in, as the test checks it."""
    t = t.value_type if pa.types.is_dictionary(t) else t
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return "number"
    if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_duration(t):
        return "temporal"
    if t == pa.month_day_nano_interval():
        return "month_day_nano"
    if pa.types.is_fixed_size_list(t) and (pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type)):
        return "matrix"
    return "none" if _no_python_class(t) else "objects"


def _unit_ints(column: pa.Array) -> np.ndarray:
    width = pa.int32() if pa.types.is_date32(column.type) or pa.types.is_time32(column.type) else pa.int64()
    return pc.cast(column.view(width), pa.int64()).to_numpy()


def expected(column: pa.Array, output: str) -> Any:
    """The value of ``column`` in a ``torch``/``numpy``/``dict`` batch, from pyarrow's own conversions."""
    if output == "dict":
        return python_values(column)
    k = kind(column.type)
    if k in ("objects", "none"):
        return python_values(column)
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if k == "number":
        values = column.to_numpy(zero_copy_only=False)
    elif k == "matrix":
        values = column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), column.type.list_size)
    elif k == "month_day_nano":
        values = np.array(column.to_pylist(), dtype=np.int64)       # MonthDayNano tuples
        if output == "numpy":
            return values
    elif output == "torch" or pa.types.is_time(column.type):
        values = _unit_ints(column)
        if output == "numpy":   # no NumPy time-of-day type: since midnight
            return values.astype(f"timedelta64[{column.type.unit}]")
    else:
        values = column.to_numpy(zero_copy_only=False)   # pyarrow: datetime64 / timedelta64 of the column's unit
    return torch.from_numpy(values.copy()) if output == "torch" else values


def same(value: Any, want: Any, output: str) -> bool:
    if isinstance(want, torch.Tensor):
        return isinstance(value, torch.Tensor) and value.dtype == want.dtype and torch.equal(value, want)
    if isinstance(want, np.ndarray):
        if value.dtype.names:   # month_day_nano: a structured array of (months, days, nanoseconds)
            value = np.stack([value[n].astype(np.int64) for n in value.dtype.names], axis=1)
        return value.dtype == want.dtype and value.shape == want.shape and np.array_equal(value, want, equal_nan=True)
    return bool(value == want)


def _error_pattern(name: str, folder: str) -> str:
    return rf"{re.escape(folder)}/types\.\w+: column '{name}' .*(output_format=|columns=)"


def _batches(folder: str, fmt: str, output: str, workers: int, columns: list[str]) -> list[Any]:
    if workers == 0:
        return list(StructuredDataset(folder, format=FORMATS[fmt], batch_size=4, columns=columns, output_format=output))
    loader, _ = StructuredDataset.create_dataloader(path=folder, format=FORMATS[fmt], batch_size=4, columns=columns,
                                                    output_format=output, num_workers=workers)
    return all_batches(loader)


def _joined(batches: list[Any], name: str, output: str) -> Any:
    parts = [b.column(name) if output == "arrow" else b[name] for b in batches]
    if output == "arrow":
        return pa.chunked_array(parts).combine_chunks()
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    return [v for part in parts for v in part]


def outcomes(table: pa.Table, output: str) -> dict[str, Any]:
    """Per column: its expected value in ``output`` batches, or ConversionError."""
    out: dict[str, Any] = {}
    for fld in table.schema:
        if _no_python_class(fld.type):   # pyarrow cannot even hand the column to Python
            out[fld.name] = None if output == "arrow" else ConversionError
        elif output == "arrow":
            out[fld.name] = table.column(fld.name).combine_chunks()
        else:
            out[fld.name] = expected(table.column(fld.name).combine_chunks(), output)
    return out


def check_format(files, fmt: str, output: str, workers: int, columns: list[str] | None = None) -> None:
    folder, table = files[fmt]
    wanted = outcomes(table, output)
    fine = [n for n, want in wanted.items() if want is not ConversionError and (n in columns if columns else True)]
    batches = _batches(folder, fmt, output, workers, fine)
    if output == "arrow":
        assert pa.Table.from_batches(batches).equals(table.select(fine)), f"{fmt}: differs from pyarrow's read"
    else:
        assert sum(len(_joined([b], fine[0], output)) for b in batches) == ROWS
        for name in fine:
            value = _joined(batches, name, output)
            assert same(value, wanted[name], output), f"{fmt} {output}: {name} = {value!r}"
    refused = [n for n, want in wanted.items() if want is ConversionError]
    for name in refused:
        with pytest.raises(ConversionError, match=_error_pattern(name, folder)):
            _batches(folder, fmt, output, workers, [name])


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_type_in_process(files, fmt, output):
    check_format(files, fmt, output, workers=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_type_with_workers(files, fmt, output):
    check_format(files, fmt, output, workers=2)


@pytest.mark.timeout(60)
def test_intervals_in_arrow_batches_cross_workers(files):
    """Month and day-time intervals (no Python class in pyarrow) in arrow batches sent by workers."""
    check_format(files, "ipc", "arrow", workers=2, columns=["int64", "month", "day_time"])


def test_the_matrix_covers_every_format(files):
    """What pyarrow writes (the matrix is built from it), and the errors it must show."""
    held = {fmt: set(table.column_names) for fmt, (_, table) in files.items()}
    assert held["ipc"] == set(COLUMNS)
    assert set(COLUMNS) - held["parquet"] <= {"month_day_nano", "month", "day_time", "sparse_union", "dense_union"}
    assert {"int64", "float64", "bool", "string", "binary", "decimal128", "ts_ns", "ts_ns_sub", "date32", "list",
            "struct", "map", "sparse_union", "dense_union", "list_ts_ns_sub"} <= held["orc"]
    for fmt, (_, table) in files.items():
        refused = {out: {n for n, w in outcomes(table, out).items() if w is ConversionError} for out in OUTPUTS}
        assert {"ts_ns_sub", "date32_far", "list_ts_ns_sub", "struct_date_far"} <= refused["dict"], fmt
        assert "dict_ts_ns_sub" not in table.column_names or "dict_ts_ns_sub" in refused["dict"], fmt
        assert {"list_ts_ns_sub", "struct_date_far"} <= refused["numpy"] == refused["torch"], fmt
        assert not refused["arrow"]
    assert {"ts_s_far", "time64_ns", "dur_ns_sub", "dur_s_huge", "month", "day_time", "list_view_ts_ns_sub"} <= {
        n for n, w in outcomes(files["ipc"][1], "dict").items() if w is ConversionError}


def test_the_docs_table_lists_every_type():
    """docs/formats.md has a row for every row of the matrix."""
    text = DOCS.read_text()
    table = text[text.index("## Every Arrow type in every output format"):]
    rows = {line.split("|")[1].replace("`", "").strip() for line in table.splitlines() if line.startswith("| ")}
    missing = sorted({row for row, _ in COLUMNS.values()} - rows)
    assert not missing, f"docs/formats.md type table has no row for {missing}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_repeated_column_names(tmp_path, fmt):
    """Legal in every format pyarrow writes: arrow batches hold them all; a batch dict cannot."""
    table = pa.Table.from_arrays([pa.array(range(6)), pa.array(range(10, 16)), pa.array(list("abcdef"))],
                                 names=["a", "a", "s"])
    _write(fmt, table, str(tmp_path / f"dup.{fmt}"))
    for workers in (0, 2):
        batches = _batches(str(tmp_path), fmt, "arrow", workers, None)
        assert pa.Table.from_batches(batches).equals(_read(fmt, str(tmp_path / f"dup.{fmt}")))
    for output in ("torch", "numpy", "dict"):
        with pytest.raises(InvalidArgumentError, match=r"columns \['a'\] appear more than once.*columns=\['s'\]"):
            StructuredDataset(str(tmp_path), format=FORMATS[fmt], output_format=output)
    with pytest.raises(InvalidArgumentError, match=r"columns: \['a'\] each name several columns of .*dup"):
        StructuredDataset(str(tmp_path), format=FORMATS[fmt], columns=["a", "s"])
    assert _batches(str(tmp_path), fmt, "dict", 0, ["s"])[0] == {"s": ["a", "b", "c", "d"]}


def test_spark_int96_timestamps(tmp_path):
    """Spark's int96 timestamps read as nanoseconds: exact in numpy and torch, refused in dict batches."""
    nanos = [SECOND * 10**9 + 1, SECOND * 10**9 + 2_000]
    pq.write_table(pa.table({"t": pa.array(nanos, pa.timestamp("ns"))}), tmp_path / "spark.parquet",
                   use_deprecated_int96_timestamps=True)
    assert next(iter(StructuredDataset(tmp_path, batch_size=2, output_format="numpy")))["t"].view(np.int64).tolist() == nanos
    assert next(iter(StructuredDataset(tmp_path, batch_size=2)))["t"].tolist() == nanos
    with pytest.raises(ConversionError, match=r"spark\.parquet: column 't' \(timestamp\[ns\]\).*finer than microseconds"):
        next(iter(StructuredDataset(tmp_path, batch_size=2, output_format="dict")))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_type_through_a_mixtures_batches(files, tmp_path, fmt, workers):
    """A mixture with a shuffle buffer gathers each span of batches from its sources' pieces into each batch's
    order (one take over pieces of both sources): every type arrives, each row once, as pyarrow reads it."""
    import os
    import shutil

    from arrowstream import Mixture, Source

    folder, table = files[fmt]
    shutil.copytree(folder, tmp_path / "copy")
    loader, mixture = Mixture.create_dataloader(
        sources={"x": Source(folder, format=FORMATS[fmt]), "y": Source(str(tmp_path / "copy"), format=FORMATS[fmt])},
        batch_size=4, shuffle=True, shuffle_buffer_size=4, output_format="arrow", with_row_ids=True,
        source_column="src", num_workers=workers, plan_cache=False)
    mixture.set_epoch(0)
    got = pa.Table.from_batches(all_batches(loader))
    assert got.num_rows == 2 * ROWS and set(got.column("_file").to_pylist()) == {0, 1}
    shares = [batch.column("_file").to_pylist() for batch in all_batches(loader)]
    assert all(abs(part.count(0) - part.count(1)) <= 1 for part in shares)   # both sources in every batch
    ordered = take(got, pc.sort_indices(got, [("_file", "ascending"), ("_row", "ascending")]))   # views too
    assert ordered.column("src").to_pylist() == ["x"] * ROWS + ["y"] * ROWS
    assert ordered.drop_columns(["_file", "_row", "src"]).equals(pa.concat_tables([table, table]))
    assert os.listdir(tmp_path / "copy")


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_type_through_the_shuffle_buffer_with_row_ids(files, fmt, workers):
    """The shuffle buffer gathers rows with a take, which pyarrow has no kernel for with view types; row ids are
    appended to columns Python cannot hold (intervals): every type arrives, each row once, as pyarrow reads it."""
    folder, table = files[fmt]
    loader, dataset = StructuredDataset.create_dataloader(path=folder, format=FORMATS[fmt], batch_size=4, shuffle=True,
                                                          shuffle_buffer_size=4, output_format="arrow",
                                                          with_row_ids=True, num_workers=workers, plan_cache=False)
    dataset.set_epoch(0)
    got = pa.Table.from_batches(all_batches(loader))
    ordered = take(got, pc.sort_indices(got, [("_row", "ascending")]))   # pyarrow's take: no view types
    assert got.column("_row").to_pylist() != list(range(ROWS))   # shuffled
    assert ordered.drop_columns(["_file", "_row"]).equals(table)


def test_take_remembers_schemas_by_equality_not_by_object():
    """``take`` looks up a schema's view-free twin among the last few it saw, by ``equals``: a table whose schema is
    another object with the same fields gets the same answer; more schemas than it keeps, metadata that differs,
    and tables with and without views in turn each get their own, never another's."""
    views = pa.table({"s": pa.array(["a", "bb", "ccc"], pa.string_view()), "x": [1, 2, 3]})
    plain = pa.table({"s": ["a", "bb", "ccc"], "x": [1, 2, 3]})
    tagged = views.replace_schema_metadata({"k": "v"})
    others = [pa.table({f"c{i}": [1, 2, 3]}) for i in range(12)]   # more than it keeps
    for _ in range(3):
        for table in [views, plain, tagged, *others,
                      pa.table({"s": pa.array(["a", "bb", "ccc"], pa.string_view()), "x": [1, 2, 3]})]:
            taken = take(table, [2, 0])
            assert taken.schema.equals(table.schema, check_metadata=True)
            assert taken.to_pylist() == [table.slice(2, 1).to_pylist()[0], table.slice(0, 1).to_pylist()[0]]
