"""Files damaged the way storage damages them: a clear error naming the file, or exactly the rows
pyarrow reads; never fewer rows without an error.

Every format (Parquet, ORC, Arrow IPC, CSV, JSON Lines) is written small (4-5 units), then
truncated, has bytes flipped in its metadata (footer, file tail, message headers; a text file's
header line) and in its data (pages, stripes, bodies, rows), or has a unit's row count rewritten
in its metadata (Thrift, protobuf and flatbuffer integers found where the known value lies). The
damage points are drawn from a seeded generator; reads use 0 workers, one regression uses 2.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import pytest
from helpers import make_table
from pyarrow import ipc, orc

from arrowstream import StructuredDataset, errors
from arrowstream._formats.ipc import _root, _Table, batch_list
from arrowstream._formats.orc import proto_fields

ROWS, UNIT_ROWS = 620, 150
FORMATS = ["parquet", "orc", "arrow", "csv", "jsonl"]


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


# -- writing and reading -------------------------------------------------------------------------

def table() -> pa.Table:
    return make_table(0, ROWS).select(["id", "x", "label", "name"])


def write(folder: Path, fmt: str, data: pa.Table | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = table() if data is None else data
    path = folder / f"part-000.{fmt}"
    if fmt == "parquet":
        pq.write_table(data, path, row_group_size=UNIT_ROWS, compression="none")
    elif fmt == "orc":
        orc.write_table(data, path, stripe_size=1, batch_size=UNIT_ROWS)
    elif fmt == "arrow":
        with ipc.new_file(path, data.schema) as writer:
            writer.write_table(data, max_chunksize=UNIT_ROWS)
    elif fmt == "csv":
        pa_csv.write_csv(data, path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in data.to_pylist()))
    return path


def pyarrow_read(path: Path, fmt: str) -> pa.Table:
    if fmt == "parquet":
        return pq.read_table(path)
    if fmt == "orc":
        return orc.read_table(path)
    if fmt == "arrow":
        with pa.memory_map(str(path)) as source:
            return ipc.open_file(source).read_all()
    if fmt == "csv":
        return pa_csv.read_csv(path)
    return pa_json.read_json(path)


def arrowstream_read(path: Path, fmt: str, num_workers: int = 0) -> pa.Table:
    loader, dataset = StructuredDataset.create_dataloader(
        path=str(path), format=fmt, num_workers=num_workers, batch_size=97, output_format="arrow", split_bytes=4096)
    dataset.set_epoch(0)
    batches = []
    for batch in loader:   # not list(loader): it asks len(), from counts that may be absurd
        batches.append(batch)  # noqa: PERF402
    return pa.Table.from_batches(batches, schema=dataset._plan.schema)


def check_outcome(path: Path, fmt: str, damage: str) -> str:
    """A clear arrowstream error naming the file, or the rows pyarrow reads (the rows written, where
    pyarrow refuses the file). Returns which outcome it was."""
    try:
        got = arrowstream_read(path, fmt)
    except errors.ArrowStreamError as exc:
        assert path.name in str(exc), f"{damage}: the error does not name the file: {exc}"
        return "error"
    try:   # only now: pyarrow's reader allocates for every row a footer announces
        expected: pa.Table | None = pyarrow_read(path, fmt)
    except (pa.ArrowException, OSError, ValueError):
        expected = None
    reference = table() if expected is None else expected
    assert got.num_rows == reference.num_rows, f"{damage}: {got.num_rows} rows without an error, pyarrow reads " \
        f"{reference.num_rows}"
    assert canonical(got).equals(canonical(reference.select(got.column_names))), f"{damage}: other values"
    return "rows"


def canonical(data: pa.Table) -> pa.Table:
    """``data`` comparable bit for bit: floats as integers (a flipped bit can make a NaN), strings as bytes
    (pyarrow's Parquet reader keeps a flipped byte that is not UTF-8 in a string)."""
    views = {pa.float32(): pa.int32(), pa.float64(): pa.int64(), pa.string(): pa.binary()}
    columns = [column.combine_chunks() for column in data.columns]
    return pa.table([c.view(views.get(c.type, c.type)) for c in columns], names=data.column_names)


# -- damage --------------------------------------------------------------------------------------

def metadata_ranges(path: Path, fmt: str) -> list[tuple[int, int]]:
    """Where a file keeps its metadata: footer, file tail, message headers (text: the header line)."""
    data = path.read_bytes()
    if fmt == "parquet":
        footer_length = struct.unpack("<i", data[-8:-4])[0]
        return [(len(data) - 8 - footer_length, len(data))]
    if fmt == "orc":
        postscript_length = data[-1]
        postscript = dict(proto_fields(data[-1 - postscript_length:-1]))
        tail = 1 + postscript_length + int(postscript[1]) + int(postscript.get(5, 0))   # + footer + metadata
        return [(len(data) - tail, len(data))]
    if fmt == "arrow":
        with pa.OSFile(str(path)) as source:
            headers = [(start, end - body) for _, (start, end), body in batch_list(source)]
        footer_length = struct.unpack("<i", data[-10:-6])[0]
        return [*headers, (len(data) - 10 - footer_length, len(data))]
    return [(0, data.index(b"\n"))] if fmt == "csv" else [(0, 1)]


def in_ranges(rng: np.random.Generator, ranges: list[tuple[int, int]], count: int) -> list[int]:
    spans = np.array([end - start for start, end in ranges], dtype=np.float64)
    picks = rng.choice(len(ranges), size=count, p=spans / spans.sum())
    return [int(rng.integers(ranges[i][0], ranges[i][1])) for i in picks]


def flipped(data: bytes, positions: list[int], rng: np.random.Generator) -> list[tuple[str, bytes]]:
    out = []
    for pos in positions:
        damaged = bytearray(data)
        damaged[pos] ^= int(rng.integers(1, 256))
        out.append((f"byte {pos} flipped", bytes(damaged)))
    return out


def damages(path: Path, fmt: str, kind: str, seed: int) -> list[tuple[str, bytes]]:
    """(what was done, the damaged bytes) for one kind of damage."""
    data = path.read_bytes()
    rng = np.random.default_rng(seed)
    if kind == "truncated":
        ends = sorted({int(len(data) * f) for f in (0.02, 0.4, 0.75, 0.97)} | {len(data) - 1, len(data) - 9})
        return [(f"truncated to {end} of {len(data)} bytes", data[:end]) for end in ends]
    meta = metadata_ranges(path, fmt)
    if kind == "metadata flipped":
        return flipped(data, in_ranges(rng, meta, 6), rng)
    body = [(start, end) for start, end in zip([0] + [e for _, e in meta], [s for s, _ in meta] + [len(data)],
                                               strict=True) if end > start]
    return flipped(data, in_ranges(rng, body, 6), rng)


def rewrite_parquet_rows(data: bytes, counts: dict[int, int], total: int | None = None) -> bytes:
    """``data`` with the ``num_rows`` of row groups rewritten in its Thrift footer (compact protocol: a
    RowGroup's ``total_byte_size`` then ``num_rows`` are i64 fields 2 and 3, field header 0x16 each)."""
    metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
    footer_length = struct.unpack("<i", data[-8:-4])[0]
    footer = data[len(data) - 8 - footer_length:-8]
    pos = 0
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        size = b"\x16" + varint(zigzag(group.total_byte_size))
        pattern = size + b"\x16" + varint(zigzag(group.num_rows))
        pos = footer.index(pattern, pos)
        if index in counts:
            replacement = size + b"\x16" + varint(zigzag(counts[index]))
            footer = footer[:pos] + replacement + footer[pos + len(pattern):]
        pos += 1
    if total is not None:   # FileMetaData.num_rows: i64 field 3, then the row_groups list (field 4)
        pattern = b"\x16" + varint(zigzag(metadata.num_rows)) + b"\x19"
        assert footer.count(pattern) == 1
        footer = footer.replace(pattern, b"\x16" + varint(zigzag(total)) + b"\x19")
    return data[:len(data) - 8 - footer_length] + footer + struct.pack("<i", len(footer)) + b"PAR1"


def rewrite_orc_rows(data: bytes, stripe: int, rows: int, total: int | None = None) -> bytes:
    """``data`` with the ``numberOfRows`` of a stripe rewritten in the (uncompressed) protobuf footer:
    StripeInformation field 5 after ``footerLength`` (field 4); Footer field 6 for the total. The new
    values take as many varint bytes as the old ones, so no length changes."""
    postscript_length = data[-1]
    postscript = dict(proto_fields(data[-1 - postscript_length:-1]))
    assert postscript[2] == 0, "the footer must be uncompressed"
    footer_length = int(postscript[1])
    start = len(data) - 1 - postscript_length - footer_length
    footer = bytearray(data[start:start + footer_length])
    infos = [dict(proto_fields(v)) for n, v in proto_fields(bytes(footer)) if n == 3 and isinstance(v, bytes)]
    pos = -1
    for index in range(stripe + 1):
        pattern = b"\x20" + varint(infos[index][4]) + b"\x28" + varint(infos[index][5])
        pos = bytes(footer).index(pattern, pos + 1)
    replacement = b"\x20" + varint(infos[stripe][4]) + b"\x28" + varint(rows)
    assert len(replacement) == len(pattern)
    footer[pos:pos + len(pattern)] = replacement
    if total is not None:
        old_total = sum(info[5] for info in infos)
        pattern, replacement = b"\x30" + varint(old_total), b"\x30" + varint(total)
        assert bytes(footer).count(pattern) == 1 and len(pattern) == len(replacement)
        at = bytes(footer).index(pattern)
        footer[at:at + len(pattern)] = replacement
    return data[:start] + bytes(footer) + data[start + footer_length:]


def rewrite_ipc_rows(data: bytes, batch: int, rows: int) -> bytes:
    """``data`` with the ``length`` of a record batch rewritten in its message header (the flatbuffer
    RecordBatch table's first field, an int64)."""
    with pa.BufferReader(data) as source:
        _, (start, end), body = batch_list(source)[batch]
    message = _root(data[start + 8:end - body])
    header = message.ref(2)
    assert header is not None
    at = start + 8 + header + _Table(message.buf, header)._field(0)
    return data[:at] + struct.pack("<q", rows) + data[at + 8:]


def count_rewrites(data: bytes, fmt: str) -> list[tuple[str, bytes]]:
    """Row counts rewritten: one unit more and fewer (alone, and with the file's total following)."""
    if fmt == "parquet":
        return [("row group 1 of 151 rows", rewrite_parquet_rows(data, {1: 151})),
                ("row group 1 of 149 rows, total 619", rewrite_parquet_rows(data, {1: 149}, 619)),
                ("row group 4 of 21 rows, total 621", rewrite_parquet_rows(data, {4: 21}, 621)),
                ("row group 2 of 10**6 rows, total 10**6 + 470", rewrite_parquet_rows(data, {2: 10**6}, 470 + 10**6)),
                ("row group 0 of -2112 rows, total -1642", rewrite_parquet_rows(data, {0: -2112}, -1642))]
    if fmt == "orc":
        return [("stripe 1 of 151 rows", rewrite_orc_rows(data, 1, 151)),
                ("stripe 1 of 149 rows, total 619", rewrite_orc_rows(data, 1, 149, 619)),
                ("stripe 4 of 21 rows, total 621", rewrite_orc_rows(data, 4, 21, 621))]
    return [(f"record batch {b} of {r} rows", rewrite_ipc_rows(data, b, r))
            for b, r in ((1, 151), (1, 149), (4, 19), (2, -2112), (0, 1 << 40), (2, 0))]


# -- the damage matrix ---------------------------------------------------------------------------

KINDS = ["truncated", "metadata flipped", "data flipped"]
CASES = [(fmt, kind) for fmt in FORMATS for kind in KINDS] + [(fmt, "row counts") for fmt in ("parquet", "orc", "arrow")]


@pytest.mark.parametrize(("fmt", "kind"), CASES)
def test_damaged_file_is_a_named_error_or_the_rows_pyarrow_reads(tmp_path, fmt, kind):
    path = write(tmp_path / "data", fmt)
    original = path.read_bytes()
    seed = FORMATS.index(fmt) * 10 + KINDS.index(kind) if kind in KINDS else 99
    cases = count_rewrites(original, fmt) if kind == "row counts" else damages(path, fmt, kind, seed)
    outcomes = []
    for damage, damaged in cases:
        path.write_bytes(damaged)
        outcomes.append(check_outcome(path, fmt, damage))
    assert len(outcomes) == len(cases)


# -- the repros --------------------------------------------------------------------------

def two_row_groups(tmp_path: Path, counts: dict[int, int], total: int | None) -> Path:
    path = tmp_path / "liar.parquet"
    pq.write_table(pa.table({"id": [0, 1]}), path, row_group_size=1)
    path.write_bytes(rewrite_parquet_rows(path.read_bytes(), counts, total))
    return path


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("total", [None, 5], ids=["footer-total-2", "footer-total-5"])
def test_row_groups_announcing_3_and_2_rows_that_hold_1_each_are_refused(tmp_path, num_workers, total):
    """Issue #16: planned 5 rows, yielded 2, no error."""
    path = two_row_groups(tmp_path, {0: 3, 1: 2}, total)
    if total is None:   # the footer's total (2) disagrees with its row groups (5): refused at planning
        with pytest.raises(errors.CorruptFileError, match=r"liar\.parquet.*announces 2 rows but its row groups 5"):
            arrowstream_read(path, "parquet", num_workers)
        return
    with pytest.raises(errors.CorruptFileError, match=r"liar\.parquet: Parquet row groups? 0.* yielded [12] rows .* [35]"):
        arrowstream_read(path, "parquet", num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("total", [None, -2111], ids=["footer-total-2", "footer-total-negative"])
def test_a_negative_row_count_is_refused_at_planning(tmp_path, num_workers, total):
    """Issue #16: ``num_rows == -2112``, then a raw ValueError from len() (0 workers) or 0 batches (2)."""
    path = two_row_groups(tmp_path, {0: -2112}, total)
    with pytest.raises(errors.CorruptFileError, match=r"liar\.parquet.*-2112"):
        StructuredDataset.create_dataloader(path=str(path), num_workers=num_workers, batch_size=2)


def test_count_rewrites_land_where_the_count_is(tmp_path):
    """The rewriting helpers change the count pyarrow sees and nothing else (else the matrix tests noise)."""
    readers: dict[str, Callable[[bytes], list[int]]] = {
        "parquet": lambda d: [pq.ParquetFile(pa.BufferReader(d)).metadata.row_group(i).num_rows for i in range(5)],
        "arrow": lambda d: [r for r, _, _ in batch_list(pa.BufferReader(d))],
    }
    for fmt, read in readers.items():
        original = write(tmp_path / fmt, fmt).read_bytes()
        assert read(original) == [150, 150, 150, 150, 20]
        assert read(count_rewrites(original, fmt)[1][1]) == [150, 149, 150, 150, 20]
    data = write(tmp_path / "orc", "orc").read_bytes()
    reader = orc.ORCFile(pa.BufferReader(rewrite_orc_rows(data, 1, 149, 619)))
    assert (reader.nrows, [reader.read_stripe(i).num_rows for i in range(5)]) == (619, [150, 149, 150, 150, 20])


def test_ipc_offsets_past_the_data_are_a_named_error(tmp_path):
    """A flipped byte in a string column's offsets: pyarrow reads offsets past the data without a word."""
    data = pa.table({"name": [f"row-{i}" for i in range(100)]})
    path = write(tmp_path / "data", "arrow", data)
    raw = bytearray(path.read_bytes())
    with pa.OSFile(str(path)) as source:
        _, (_, end), body = batch_list(source)[0]
    offsets = end - body              # no nulls: the body starts with the offsets (int32 each)
    assert struct.unpack_from("<i", raw, offsets + 4 * 50)[0] == 50 * 5 + 40
    raw[offsets + 4 * 50 + 2] ^= 0x40  # offset 50 jumps by 4 MiB
    path.write_bytes(bytes(raw))
    with pa.memory_map(str(path)) as source:
        assert ipc.open_file(source).get_batch(0).num_rows == 100    # pyarrow reads it as if nothing were wrong
    with pytest.raises(errors.CorruptFileError, match=r"part-000\.arrow: Arrow IPC record batch 0 is malformed"):
        arrowstream_read(path, "arrow")


def test_a_column_name_that_is_not_utf8_is_a_named_error(tmp_path):
    """Issue #16: a raw ``UnicodeDecodeError`` naming no file."""
    path = tmp_path / "names.parquet"
    pq.write_table(pa.table({"id": [1, 2], "zzzz": [3, 4]}), path, store_schema=False)
    path.write_bytes(path.read_bytes().replace(b"zzzz", b"z\xffzz"))
    with pytest.raises(errors.CorruptFileError, match=r"names\.parquet: a column name .* is not valid UTF-8"):
        StructuredDataset(str(path))
