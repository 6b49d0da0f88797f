"""CSV and JSON Lines: byte-range splits of one large file, quoted line breaks, headers, compressed
files, parse options, bad rows. The shared reader contract runs in tests/test_formats.py."""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import json
import logging
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pytest
from helpers import check_exactly_once, check_resume, ids_of, json_roundtrip, make_loader

from arrowstream import StructuredDataset, errors
from arrowstream._formats.text import TextFile

ROWS = 3000
UNIT = 4096   # split_bytes: a few dozen rows a split, so 3 workers share one file


def rows_of(count: int, start: int = 0) -> list[dict]:
    """Rows with a unique id; every 7th name holds a quoted line break, a comma and a quote (CSV)."""
    out = []
    for i in range(start, start + count):
        name = f'line one of {i}\nline "two", of {i}' if i % 7 == 3 else f"name-{i}"
        out.append({"id": i, "x": i * 0.25, "name": name, "flag": i % 2 == 0})
    return out


def write_csv(path: Path, rows: list[dict], **fmt) -> Path:
    text = io.StringIO()
    writer = csv.DictWriter(text, ["id", "x", "name", "flag"], lineterminator=fmt.pop("lineterminator", "\n"), **fmt)
    writer.writeheader()
    writer.writerows(rows)
    path.write_bytes(text.getvalue().encode())
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_bytes("".join(json.dumps(r) + "\n" for r in rows).encode())
    return path


def ids(loader, dataset, epoch=0) -> list[int]:
    dataset.set_epoch(epoch)
    return [int(i) for batch in loader for i in batch["id"]]


@pytest.fixture
def big_csv(tmp_path):
    return write_csv(tmp_path / "big.csv", rows_of(ROWS))


@pytest.fixture
def big_jsonl(tmp_path):
    return write_jsonl(tmp_path / "big.jsonl", rows_of(ROWS))


def nominal_boundaries_inside_rows(dataset) -> int:
    """How many nominal split boundaries (multiples of the unit size) fall strictly inside a row."""
    footer = dataset._plan.files[0]
    starts = [start for start, _ in footer.extra.ranges]
    return sum(1 for start in starts[1:] if start % UNIT != 0)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_one_large_file_over_three_workers_exactly_once_and_exact_resume(big_csv, big_jsonl, fmt):
    path = str(big_csv if fmt == "csv" else big_jsonl)
    options = {"format": fmt, "batch_size": 64, "split_bytes": UNIT, "shuffle": True, "seed": 3,
               "shuffle_buffer_size": 150}
    loader, dataset = make_loader(path, 3, **options)
    assert len(dataset._plan.splits) > 20
    assert nominal_boundaries_inside_rows(dataset) > 10        # boundaries cut rows; rows go whole to one split
    assert min(dataset.slot_rows(3)) > 0                        # every worker reads part of the one file
    assert dataset.num_rows == ROWS   # exact, from the scan: so is len(loader), checked below
    assert len(loader) == sum(-(-rows // 64) for rows in dataset.slot_rows(3))

    def rows_of_epoch(batches, dataset):
        check_exactly_once(batches, ROWS)

    check_resume(path, 3, options, rows_of_epoch, mid=7)


def test_a_resume_reads_from_the_unit_of_the_next_row_only(big_csv, monkeypatch):
    options = {"format": "csv", "batch_size": 64, "split_bytes": UNIT}
    loader, _ = make_loader(str(big_csv), 0, **options)
    seen = []
    for step, batch in enumerate(loader):
        seen += ids_of(batch)
        if step == 20:
            break
    state = json_roundtrip(loader.state_dict())
    read: list[int] = []
    unit_data = TextFile._unit_data
    monkeypatch.setattr(TextFile, "_unit_data", lambda self, unit: read.append(unit) or unit_data(self, unit))
    fresh, fresh_dataset = make_loader(str(big_csv), 0, **options)
    fresh.load_state_dict(state)
    rest = [i for batch in fresh for i in ids_of(batch)]
    assert seen + rest == list(range(ROWS))
    footer = fresh_dataset._plan.files[0]
    first = next(u for u, total in enumerate(itertools.accumulate(footer.unit_rows)) if total > len(seen))
    assert read == list(range(first, len(footer.unit_rows)))   # no unit before the next row's, none twice


@pytest.mark.parametrize(("old", "new"), [(3, 2), (0, 3)])
def test_elastic_resume_over_other_workers(big_jsonl, old, new):
    options = {"format": "jsonl", "batch_size": 64, "split_bytes": UNIT, "shuffle": True, "seed": 4}
    loader, dataset = make_loader(str(big_jsonl), old, **options)
    dataset.set_epoch(0)
    before = []
    for step, batch in enumerate(loader):
        before += ids_of(batch)
        if step == 12:
            break
    state = json_roundtrip(loader.state_dict())
    fresh, _ = make_loader(str(big_jsonl), new, **options)
    fresh.load_state_dict(state)
    after = [i for batch in fresh for i in ids_of(batch)]
    assert sorted(before + after) == list(range(ROWS))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_values_match_pyarrows_own_reader_including_quoted_line_breaks(big_csv, big_jsonl, fmt):
    path = big_csv if fmt == "csv" else big_jsonl
    loader, dataset = make_loader(str(path), 2, format=fmt, batch_size=100, split_bytes=UNIT, output_format="arrow")
    dataset.set_epoch(0)
    got = pa.Table.from_batches(list(loader)).sort_by("id")
    expected = pa_csv.read_csv(path) if fmt == "csv" else pa_json.read_json(path)
    assert got.equals(expected)
    names = got.column("name").to_pylist()
    assert names[3] == 'line one of 3\nline "two", of 3'


def test_a_split_boundary_inside_a_quoted_line_break_keeps_the_row_whole(tmp_path):
    rows = rows_of(200)
    path = write_csv(tmp_path / "q.csv", rows)
    data = path.read_bytes()
    inside = data.index(b"line one of 10\n") + len(b"line one of 10")   # the quoted line break of row 10
    loader, dataset = make_loader(str(path), 0, format="csv", batch_size=1000, split_bytes=inside, output_format="dict")
    starts = [s for s, _ in dataset._plan.files[0].extra.ranges]
    assert inside + 1 not in starts                 # no split starts after the quoted line break
    (batch,) = list(loader)
    assert batch["name"][10] == 'line one of 10\nline "two", of 10' and batch["id"] == list(range(200))


@pytest.mark.parametrize(("suffix", "fmt"), [(".csv.gz", "csv"), (".jsonl.zst", "jsonl"), (".csv.bz2", "csv")])
def test_compressed_files_are_one_split_each_and_resume_exactly(tmp_path, suffix, fmt):
    folder = tmp_path / "data"
    folder.mkdir()
    compression = {"gz": "gzip", "zst": "zstd", "bz2": "bz2"}[suffix.rsplit(".", 1)[-1]]
    for index, (count, start) in enumerate([(1200, 0), (300, 1200), (500, 1500)]):
        plain = tmp_path / f"plain{index}"
        (write_csv if fmt == "csv" else write_jsonl)(plain, rows_of(count, start))
        with pa.CompressedOutputStream(str(folder / f"part-{index}{suffix}"), compression) as out:
            out.write(plain.read_bytes())
    options = {"format": fmt, "batch_size": 50, "split_bytes": 1024, "shuffle": True, "seed": 1}
    _, dataset = make_loader(str(folder), 3, **options)
    assert [len(f.unit_rows) for f in dataset._plan.files] == [1, 1, 1]     # one split per compressed file
    assert dataset.num_rows == 2000

    def rows_of_epoch(batches, dataset):
        check_exactly_once(batches, 2000)

    check_resume(str(folder), 3, options, rows_of_epoch, mid=9)


def test_a_compressed_file_resumes_at_its_row(tmp_path):
    plain = write_csv(tmp_path / "plain", rows_of(1000))
    path = tmp_path / "one.csv.gz"
    path.write_bytes(gzip.compress(plain.read_bytes()))
    options = {"format": "csv", "batch_size": 64}
    loader, _ = make_loader(str(path), 0, **options)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    fresh, _ = make_loader(str(path), 0, **options)
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert [int(i) for batch in fresh for i in batch["id"]] == list(range(320, 1000))


def test_a_bad_row_in_a_compressed_file_is_named_or_skipped(tmp_path):
    data = write_csv(tmp_path / "plain", rows_of(50_000)).read_bytes()
    offset = data.index(b"\n45000,") + 1    # beyond the first MiB (type inference), in the stream
    line = data[:offset].count(b"\n") + 1
    data = data[:offset] + b"45000,oops\n" + data[data.index(b"\n", offset) + 1:]
    path = tmp_path / "bad.csv.gz"
    path.write_bytes(gzip.compress(data))
    with pytest.raises(errors.MalformedRowError, match=rf"bad\.csv\.gz: line {line} \(byte {offset}\)"):
        list(make_loader(str(path), 0, format="csv", batch_size=1000)[0])
    loader, dataset = make_loader(str(path), 0, format="csv", batch_size=1000, parse_options={"bad_rows": "skip"})
    assert ids(loader, dataset) == [i for i in range(50_000) if i != 45_000]


def test_header_crlf_blank_lines_and_no_final_line_break(tmp_path):
    body = b"id,name\r\n\r\n1,a\r\n2,\"b\r\nc\"\r\n\r\n\r\n3,d\r\n4,e"
    (tmp_path / "w.csv").write_bytes(body)
    for split in (1, 3, 7, None):
        loader, dataset = make_loader(str(tmp_path / "w.csv"), 0, format="csv", batch_size=10, split_bytes=split,
                                      output_format="dict")
        assert dataset.num_rows == 4
        (batch,) = list(loader)
        assert batch == {"id": [1, 2, 3, 4], "name": ["a", "b\r\nc", "d", "e"]}


def test_parse_options_pass_through(tmp_path):
    text = "# exported by a tool\n1;NA;x\n2;2.5;y\n3;7;z\n"
    (tmp_path / "a.txt").write_text(text)
    options = {"delimiter": ";", "skip_rows": 1, "header": False, "column_names": ["id", "score", "tag"],
               "null_values": ["NA"], "column_types": {"score": "float32"}}
    loader, _ = make_loader(str(tmp_path / "a.txt"), 0, format="csv", batch_size=10, output_format="arrow",
                            parse_options=options, split_bytes=8)
    (batch,) = list(loader)
    assert batch.schema.field("score").type == pa.float32()
    assert batch.to_pydict() == {"id": [1, 2, 3], "score": [None, 2.5, 7.0], "tag": ["x", "y", "z"]}


def test_escape_char_falls_back_to_whole_file_splits(tmp_path):
    (tmp_path / "e.csv").write_text('id,text\n1,"a \\" quote"\n2,plain\n3,"x\ny"\n')
    _, dataset = make_loader(str(tmp_path / "e.csv"), 0, format="csv", split_bytes=4, output_format="dict",
                             parse_options={"escape_char": "\\", "newlines_in_values": True})
    assert dataset._plan.files[0].unit_rows == (3,)
    assert [b for b in dataset] == [{"id": [1, 2, 3], "text": ['a " quote', "plain", "x\ny"]}]


def test_lone_cr_line_ends_are_read_as_pyarrow_reads_them_never_lost(tmp_path):
    """Old Mac line ends (a lone \\r): pyarrow ends a row there, the byte scan does not; such a file is one
    unit whose rows pyarrow counts (its rows were silently left out of a folder with other files)."""
    (tmp_path / "a.csv").write_bytes(b"id,name\n0,a\n1,b\n")
    (tmp_path / "b.csv").write_bytes(b"id,name\r2,c\r3,d\r")
    (tmp_path / "c.csv").write_bytes(b"id,name\n4,e\r5,f\n")          # mixed line ends
    reference = sum(pa_csv.read_csv(tmp_path / name).num_rows for name in ("a.csv", "b.csv", "c.csv"))
    loader, dataset = make_loader(str(tmp_path), 0, format="csv", batch_size=4)
    assert dataset.num_rows == reference == 6
    assert sorted(i for batch in loader for i in ids_of(batch)) == list(range(6))
    assert [len(f.unit_rows) for f in dataset._plan.files] == [1, 1, 1]
    alone = StructuredDataset(str(tmp_path / "b.csv"), format="csv", batch_size=4)
    assert sorted(int(i) for batch in alone for i in batch["id"]) == [2, 3]


def test_schema_inferred_from_the_first_file_and_checked_against_the_others(tmp_path):
    write_csv(tmp_path / "a.csv", [{"id": 1, "x": 0.5, "name": "a", "flag": True}])
    write_csv(tmp_path / "b.csv", [{"id": 2, "x": 3, "name": "b", "flag": False}])   # x infers as int64 here
    loader, dataset = make_loader(str(tmp_path), 0, format="csv", output_format="arrow")
    assert dataset._plan.schema.field("x").type == pa.float64()
    assert pa.Table.from_batches(list(loader)).column("x").to_pylist() == [0.5, 3.0]
    write_csv(tmp_path / "c.csv", [{"id": 3, "x": "three", "name": "c", "flag": True}])
    with pytest.raises(errors.SchemaMismatchError, match=r"'x' reads as string in .*c\.csv but as double in .*a\.csv"
                       r".*column_types"):
        make_loader(str(tmp_path), 0, format="csv")
    (tmp_path / "c.csv").write_text("id,y\n3,4\n")
    with pytest.raises(errors.SchemaMismatchError, match=r"c\.csv.*missing \['flag', 'name', 'x'\], extra \['y'\]"):
        make_loader(str(tmp_path), 0, format="csv")


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize("bad_id", [300, 45_000])   # met by the type inference at planning; met when read
def test_malformed_row_names_file_line_byte_and_the_skip_option(tmp_path, fmt, bad_id):
    path = (write_csv if fmt == "csv" else write_jsonl)(tmp_path / f"m.{fmt}", rows_of(50_000))
    data = path.read_bytes()
    assert (data.index(f"name-{bad_id}".encode()) > (1 << 20)) == (bad_id > 1000)   # beyond the inferred MiB
    marker = f"name-{bad_id}".encode()
    offset = data.rindex(b"\n", 0, data.index(marker)) + 1
    line = data[:offset].count(b"\n") + 1
    bad = f"{bad_id},oops\n" if fmt == "csv" else f'{{"id": {bad_id}, "x": \n'
    end = data.index(b"\n", offset) + 1
    path.write_bytes(data[:offset] + bad.encode() + data[end:])
    with pytest.raises(errors.MalformedRowError) as info:
        loader, _ = make_loader(str(path), 2, format=fmt, batch_size=500, split_bytes=1 << 16)
        list(loader)
    message = str(info.value)
    assert f"m.{fmt}: line {line} (byte {offset})" in message
    assert "parse_options={'bad_rows': 'skip'}" in message
    assert isinstance(info.value, ValueError)


def test_bad_rows_skip_leaves_them_out_logs_them_and_resumes_exactly(tmp_path, caplog):
    rows = rows_of(1000)
    path = write_csv(tmp_path / "s.csv", rows)
    data = path.read_bytes()
    for i in (16, 501, 998):   # rows of two columns: wrong count; a value that is no int
        start = data.index(f"\n{i},".encode()) + 1
        end = data.index(b"\n", start) + 1
        data = data[:start] + (f"{i},only-two\n" if i != 501 else "not-an-int,1.0,n,true\n").encode() + data[end:]
    path.write_bytes(data)
    options = {"format": "csv", "batch_size": 64, "split_bytes": 2048, "shuffle": True, "seed": 2,
               "parse_options": {"bad_rows": "skip", "column_types": {"id": "int64"}}}
    caplog.set_level(logging.WARNING, logger="arrowstream")
    loader, dataset = make_loader(str(path), 0, **options)
    got = sorted(ids(loader, dataset))
    assert got == sorted(set(range(1000)) - {16, 501, 998})
    skipped = [r.getMessage() for r in caplog.records if "skipped a bad CSV row" in r.getMessage()]
    assert len(skipped) == 3 and all("s.csv at line" in m for m in skipped)
    assert loader.metrics()["rows_skipped"] == 3        # counted, as well as logged
    two, two_dataset = make_loader(str(path), 2, **options)
    assert sorted(ids(two, two_dataset)) == got and two.metrics()["rows_skipped"] == 3
    with pytest.raises(TypeError, match="bad_rows='skip'"):
        len(loader)
    expected = set(range(1000)) - {16, 501, 998}

    def rows_of_epoch(batches, dataset):
        for epoch in {e for e, _, _ in batches}:
            assert sorted(i for e, _, b in batches if e == epoch for i in b) == sorted(expected)

    check_resume(str(path), 0, options, rows_of_epoch, mid=4)


def test_bad_arguments_are_clear(tmp_path, big_csv):
    with pytest.raises(errors.InvalidArgumentError, match=r"parse_options: \['delimter'\] are not csv options"):
        StructuredDataset(str(big_csv), format="csv", parse_options={"delimter": ";"})
    with pytest.raises(errors.InvalidArgumentError, match="bad_rows must be 'error' or 'skip'"):
        StructuredDataset(str(big_csv), format="csv", parse_options={"bad_rows": "ignore"})
    with pytest.raises(errors.InvalidArgumentError, match="parse_options: apply to format='csv' or 'jsonl'"):
        StructuredDataset(str(big_csv), format="parquet", parse_options={"delimiter": ";"})
    with pytest.raises(errors.InvalidArgumentError, match="column_types.*not a pyarrow type"):
        StructuredDataset(str(big_csv), format="csv", parse_options={"column_types": {"id": "integer"}})
    with pytest.raises(errors.InvalidArgumentError, match="even_batches.*bad_rows='skip'"):
        StructuredDataset(str(big_csv), format="csv", parse_options={"bad_rows": "skip"}, rank=0, world_size=2)
    with pytest.raises(errors.InvalidArgumentError, match="encoding 'utf-16'"):
        StructuredDataset(str(big_csv), format="csv", parse_options={"encoding": "utf-16"})
    with pytest.raises(errors.ArgumentTypeError, match="null_values must be a list of strings, got 'NA'"):
        StructuredDataset(str(big_csv), format="csv", parse_options={"null_values": "NA"})
    with pytest.raises(errors.InvalidArgumentError, match="skip_rows must be an int >= 0"):
        StructuredDataset(str(big_csv), format="csv", parse_options={"skip_rows": -1})


def test_error_hints_name_the_likely_cause(tmp_path):
    (tmp_path / "a.csv").write_text('"abc')   # no row at all: the header itself does not parse
    with pytest.raises(errors.MalformedRowError, match="the first lines .* do not parse"):
        StructuredDataset(str(tmp_path), format="csv")
    (tmp_path / "a.csv").write_text('id,v\n1,a"b\n2,c\n')   # a quote inside an unquoted field
    with pytest.raises(errors.MalformedRowError, match=r"line 2 \(byte 5\).*'quote_char': False"):
        list(StructuredDataset(str(tmp_path), format="csv"))
    (tmp_path / "a.csv").write_text("id,v\n1,2\n2,2.5\n")   # a type too narrow for a later row
    with pytest.raises(errors.MalformedRowError, match=r"line 3 .*column_types"):
        list(StructuredDataset(str(tmp_path), format="csv", parse_options={"column_types": {"v": "int64"}}))


def test_an_empty_first_file_leaves_the_checks_to_the_next(tmp_path):
    (tmp_path / "a.csv").write_bytes(b"")
    write_csv(tmp_path / "b.csv", rows_of(10))
    loader, _ = make_loader(str(tmp_path), 0, format="csv", columns=["id"], filter=pc.field("id") > 4,
                            output_format="dict")
    assert [b["id"] for b in loader] == [[5, 6, 7, 8, 9]]


def test_a_json_field_the_inferred_rows_lack_is_an_error_or_ignored_never_silently_dropped(tmp_path):
    rows = [{"id": i} for i in range(100_000)] + [{"id": 100_000, "late": "x"}]   # beyond the inferred MiB
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    offset = path.read_bytes().rindex(b'{"id": 100000')
    with pytest.raises(errors.MalformedRowError, match=rf"a\.jsonl: line 100001 \(byte {offset}\).*unexpected field"):
        list(make_loader(str(path), 0, format="jsonl")[0])
    loader, _ = make_loader(str(path), 0, format="jsonl", output_format="arrow",
                            parse_options={"unexpected_field_behavior": "ignore"})
    assert pa.Table.from_batches(list(loader)).column_names == ["id"]
    loader, _ = make_loader(str(path), 0, format="jsonl", output_format="arrow",
                            parse_options={"column_types": {"late": "string"}})
    assert pa.Table.from_batches(list(loader)).column("late").drop_null().to_pylist() == ["x"]
    with pytest.raises(errors.InvalidArgumentError, match="unexpected_field_behavior must be"):
        make_loader(str(path), 0, format="jsonl", parse_options={"unexpected_field_behavior": "infer"})
    write_jsonl(tmp_path / "b.jsonl", [{"id": 1, "other": 2}])   # another file's first rows: checked at planning
    with pytest.raises(errors.SchemaMismatchError, match=r"b\.jsonl.*extra \['other'\]"):
        make_loader(str(tmp_path), 0, format="jsonl")


def test_state_records_parse_options(big_csv):
    loader, _ = make_loader(str(big_csv), 0, format="csv", batch_size=64)
    state = loader.state_dict()
    other, _ = make_loader(str(big_csv), 0, format="csv", batch_size=64, parse_options={"null_values": ["x"]})
    with pytest.raises(errors.StateMismatchError, match="parse_options"):
        other.load_state_dict(state)


def test_a_large_csv_on_s3_is_split_and_read_through_read_ahead(s3_server, big_csv):
    url = s3_server.url("text", "big.csv")
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3_server.storage_options)
    fs.pipe(url, big_csv.read_bytes())
    options = {"format": "csv", "batch_size": 64, "split_bytes": UNIT, "storage_options": s3_server.storage_options,
               "read_ahead": 2}
    loader, dataset = make_loader(url, 2, **options)
    assert len(dataset._plan.splits) > 20
    assert sorted(ids(loader, dataset)) == list(range(ROWS))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize("bad_id", [30, 900])   # in the first unit; in a later one (both in the inferred MiB)
def test_bytes_that_are_not_utf8_are_a_named_row_never_a_binary_column(tmp_path, fmt, bad_id):
    """pyarrow infers binary for a CSV column holding bytes that are not UTF-8 and keeps such bytes in a
    JSON string column: either way the row is named (or skipped), or the column read as bytes when asked."""
    path = (write_csv if fmt == "csv" else write_jsonl)(tmp_path / f"u.{fmt}", rows_of(1000))
    data = path.read_bytes()
    offset = data.index(f"name-{bad_id}".encode())
    path.write_bytes(data[:offset] + b"bad-\xff\xfe" + data[offset + len(f"name-{bad_id}"):])
    line = data[:offset].count(b"\n") + 1
    options = {"format": fmt, "batch_size": 100, "split_bytes": 4096, "output_format": "arrow"}
    with pytest.raises(errors.MalformedRowError, match=rf"u\.{fmt}: line {line} .*not UTF-8.*'binary'"):
        loader, dataset = make_loader(str(path), 0, **options)
        list(loader)
    loader, dataset = make_loader(str(path), 0, parse_options={"bad_rows": "skip"}, **options)
    dataset.set_epoch(0)
    table = pa.Table.from_batches(list(loader))
    assert table.schema.field("name").type == pa.string() and table.num_rows == 999
    loader, dataset = make_loader(str(path), 0, parse_options={"column_types": {"name": "binary"}}, **options)
    dataset.set_epoch(0)
    names = pa.Table.from_batches(list(loader)).column("name").to_pylist()
    assert len(names) == 1000 and names[bad_id] == b"bad-\xff\xfe"
