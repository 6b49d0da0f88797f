"""The plan cache (issue 19): a restart lists once and reads no footer; a stale or damaged entry is rebuilt.

Footer reads are counted where they happen (``FileFormat.inspect``, the call that reads a file's
metadata, or scans a text file) and, on S3, as requests through the counting proxy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from helpers import ids_of, json_roundtrip, make_loader, make_table, write_dataset
from pyarrow import feather, orc

import arrowstream._formats.footers as footers_module
import arrowstream._planning.cache as plan_cache
from arrowstream import StructuredDataset, errors
from arrowstream._formats import FILE_FORMATS
from arrowstream._formats import rowscan as _rowscan
from arrowstream._planning import cache_entry, discovery

LAYOUT = [(300, 100), (250, 100), (120, 60)]
ROWS = sum(rows for rows, _ in LAYOUT)


@pytest.fixture
def inspections(monkeypatch):
    """Counts of footer reads and text scans (``inspect`` calls, footers of ``read_local``), by format."""
    counts: Counter[str] = Counter()
    for name, file_format in FILE_FORMATS.items():
        original = type(file_format).inspect

        def counted(self, *args, _original=original, _name=name, **kwargs):
            counts[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(type(file_format), "inspect", counted)
        read_local = getattr(type(file_format), "read_local", None)
        if read_local is not None:   # the short way of local footers: one read per footer it returns

            def counted_local(self, paths, *args, _original=read_local, _name=name, **kwargs):
                footers = _original(self, paths, *args, **kwargs)
                counts[_name] += len(footers) if footers is not None else 0
                return footers

            monkeypatch.setattr(type(file_format), "read_local", counted_local)
    return counts


def cache_files(folder: str | Path) -> list[Path]:
    return sorted(p for p in Path(folder).iterdir() if p.name.endswith(".plan") and not p.name.startswith("."))


def the_entry() -> Path:
    (entry,) = cache_files(os.environ["ARROWSTREAM_CACHE_DIR"])
    return entry


def all_ids(path, **options) -> list[int]:
    dataset = StructuredDataset(path, batch_size=64, **options)
    return sorted(i for batch in dataset for i in ids_of(batch))


def plan_of(dataset):
    return [(f.entry, f.format, f.schema, tuple(f.unit_rows), tuple(f.unit_bytes), tuple(f.kept_units),
             f.handle if isinstance(f.handle, tuple) else None, f.extra) for f in dataset._plan.files]


def write_format(folder: Path, kind: str) -> str:
    folder.mkdir()
    start = 0
    for index, (rows, group) in enumerate(LAYOUT):
        table = make_table(start, rows).select(["id", "x", "name"])
        target = folder / f"part-{index}.{kind}"
        if kind == "parquet":
            pq.write_table(table, target, row_group_size=group)
        elif kind == "arrow":
            feather.write_feather(table, target, chunksize=group)
        elif kind == "orc":
            orc.write_table(table, target, stripe_size=4096)
        elif kind == "jsonl":
            target.write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))
        else:
            pa_csv.write_csv(table, target)
        start += rows
    return str(folder)


@pytest.mark.parametrize("kind", ["parquet", "arrow", "orc", "csv", "jsonl"])
def test_warm_restart_reads_no_footer_and_the_same_plan(tmp_path, inspections, kind):
    path = write_format(tmp_path / "data", kind)
    options = {"split_bytes": 2000} if kind in ("csv", "jsonl") else {}
    cold = StructuredDataset(path, format=kind, batch_size=64, **options)
    assert inspections[kind] == len(LAYOUT) and cold._origin.cache_outcome.action == "built"
    inspections.clear()
    warm = StructuredDataset(path, format=kind, batch_size=64, **options)
    assert inspections[kind] == 0, "a warm restart read footers"
    assert warm._origin.cache_outcome.action == "hit"
    assert plan_of(warm) == plan_of(cold)
    assert warm._plan.data_fingerprint == cold._plan.data_fingerprint
    assert [s for s in warm._plan.splits] == [s for s in cold._plan.splits]
    if kind in ("csv", "jsonl"):
        assert max(len(f.unit_rows) for f in warm._plan.files) > 1   # several units: layouts were cached
    assert sorted(i for batch in warm for i in ids_of(batch)) == list(range(ROWS))


def test_csv_warm_restart_scans_no_text(tmp_path, monkeypatch):
    path = write_format(tmp_path / "data", "csv")
    scans = Counter()
    original = _rowscan.scan_units

    def counted(*args, **kwargs):
        scans["scan"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr("arrowstream._formats.text.scan_units", counted)
    StructuredDataset(path, format="csv", batch_size=64, split_bytes=2000)
    assert scans["scan"] == len(LAYOUT)
    scans.clear()
    assert all_ids(path, format="csv", split_bytes=2000) == list(range(ROWS))
    assert scans["scan"] == 0
    # parse options shape units and types: other options are another entry, scanned again
    StructuredDataset(path, format="csv", batch_size=64, split_bytes=1000)
    assert scans["scan"] == len(LAYOUT)
    assert len(cache_files(os.environ["ARROWSTREAM_CACHE_DIR"])) == 2


def test_text_layouts_of_every_kind_come_back_whole(tmp_path, inspections):
    """Compressed (one unit, read as a stream), empty, blank and quoted-newline CSV files: their layouts
    from the cache equal those planning found."""
    import gzip

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.csv").write_text('id,name\n0,"two\nlines"\n1,b\n')
    (folder / "b.csv.gz").write_bytes(gzip.compress(b"id,name\n2,c\n3,d\n"))
    (folder / "c.csv").write_text("")
    (folder / "d.csv").write_text("\n\n")
    (folder / "e.csv").write_text("id,name\n4,e\n")
    (folder / "f.csv").write_bytes(b"id,name\n5,f\r6,g\n")   # a lone carriage return: a line break to pyarrow
    cold = StructuredDataset(str(folder), format="csv", batch_size=64)
    layouts = [f.extra for f in cold._plan.files]
    assert any(lay.quoted_newlines for lay in layouts) and any(lay.lone_cr for lay in layouts)
    assert any(lay.compression for lay in layouts) and any(not lay.names for lay in layouts)
    inspections.clear()
    warm = StructuredDataset(str(folder), format="csv", batch_size=64)
    assert inspections["csv"] == 0 and plan_of(warm) == plan_of(cold)
    assert sorted(i for batch in warm for i in ids_of(batch)) == [0, 1, 2, 3, 4, 5, 6]


def test_filter_and_columns(tmp_path, inspections):
    path = write_dataset(tmp_path / "data", LAYOUT)
    narrow = StructuredDataset(path, batch_size=64, filter=pc.field("id") < 100)
    assert len(narrow._plan.splits) == 1                  # statistics pruned every other row group
    inspections.clear()
    wide = StructuredDataset(path, batch_size=64, filter=pc.field("id") < 100.5)   # another filter: another entry
    assert inspections["parquet"] > 0 and len(wide._plan.splits) == 2
    inspections.clear()
    # columns do not change the footers: the same entry serves them, and still checks them
    assert StructuredDataset(path, batch_size=64, columns=["id"])._plan.schema.names == ["id"]
    assert StructuredDataset(path, batch_size=64, columns=["x", "id"])._plan.schema.names == ["x", "id"]
    assert inspections["parquet"] == len(LAYOUT)   # the first unfiltered dataset; the second was a hit
    with pytest.raises(errors.InvalidArgumentError, match="columns: \\['nope'\\] not found"):
        StructuredDataset(path, batch_size=64, columns=["nope"])
    with pytest.raises(errors.InvalidArgumentError, match="filter: "):
        StructuredDataset(path, batch_size=64, filter=pc.field("nope") > 1)


@pytest.mark.parametrize("change", ["rewritten", "added", "removed"])
def test_stale_entry_is_rebuilt(tmp_path, inspections, caplog, change):
    path = write_dataset(tmp_path / "data", LAYOUT)
    StructuredDataset(path, batch_size=64)
    folder = Path(path)
    if change == "rewritten":
        pq.write_table(make_table(300, 250), folder / "part-001.parquet", row_group_size=50)
        expected = list(range(ROWS))
    elif change == "added":
        pq.write_table(make_table(ROWS, 10), folder / "part-009.parquet")
        expected = list(range(ROWS + 10))
    else:
        (folder / "part-002.parquet").unlink()
        expected = list(range(550))
    inspections.clear()
    with caplog.at_level(logging.INFO, logger="arrowstream"):
        dataset = StructuredDataset(path, batch_size=64)
    assert dataset._origin.cache_outcome.action == "rebuilt"
    assert "listing changed" in caplog.text
    assert inspections["parquet"] == {"rewritten": 3, "added": 4, "removed": 2}[change]
    assert sorted(i for batch in dataset for i in ids_of(batch)) == expected
    inspections.clear()
    StructuredDataset(path, batch_size=64)   # the rebuilt entry serves the next start
    assert inspections["parquet"] == 0
    assert len(cache_files(os.environ["ARROWSTREAM_CACHE_DIR"])) == 1   # replaced, not beside the old one


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _flip(data: bytes) -> bytes:
    middle = len(data) * 2 // 3
    return data[:middle] + bytes([data[middle] ^ 0x10]) + data[middle + 1:]


def _entry_parts(data: bytes) -> tuple[bytes, bytes]:
    """The JSON header and the payload of an entry, as bytes."""
    (length,) = cache_entry.LENGTH.unpack_from(data, len(cache_entry.MAGIC))
    start = len(cache_entry.MAGIC) + cache_entry.LENGTH.size
    return data[start:start + length], data[start + length:-32]


def _entry_of(header: bytes, payload: bytes, digest: bytes | None = None) -> bytes:
    """An entry of these parts, with their SHA-256 (or ``digest``, that of other bytes)."""
    body = cache_entry.LENGTH.pack(len(header)) + header + payload
    return cache_entry.MAGIC + body + (digest if digest is not None else hashlib.sha256(body).digest())


def _other_version(data: bytes) -> bytes:
    # a well-formed entry of another format version (its checksum recomputed): refused by version
    header, payload = _entry_parts(data)
    version = f'"cache_version": {plan_cache.CACHE_VERSION}'.encode()
    changed = header.replace(version, b'"cache_version": 99', 1)
    assert changed != header
    return _entry_of(changed, payload)


def _flip_payload_keeping_checksum_valid(data: bytes) -> bytes:
    # bytes a bug wrote: the checksum matches, the stream does not decode, and pyarrow says so with a plain
    # OSError (not an ArrowException); the byte to flip is searched from the end
    header, payload = _entry_parts(data)
    for position in range(len(payload) - 1, 0, -1):
        flipped = payload[:position] + bytes([payload[position] ^ 0x10]) + payload[position + 1:]
        try:
            cache_entry.read_entry_table(flipped)
        except OSError as exc:
            if not isinstance(exc, pa.ArrowException):
                return _entry_of(header, flipped)
        except pa.ArrowException:
            pass
    raise AssertionError("no flipped byte makes the payload raise OSError")


@pytest.mark.parametrize("damage", [_truncate, _flip, _other_version, lambda data: b"", lambda data: b"garbage",
                                    _flip_payload_keeping_checksum_valid],
                         ids=["truncated", "flipped", "version", "empty", "garbage", "flipped, checksum valid"])
def test_damaged_entry_is_logged_and_rebuilt(tmp_path, inspections, caplog, damage):
    path = write_dataset(tmp_path / "data", LAYOUT)
    StructuredDataset(path, batch_size=64)
    entry = the_entry()
    entry.write_bytes(damage(entry.read_bytes()))
    inspections.clear()
    with caplog.at_level(logging.INFO, logger="arrowstream"):
        dataset = StructuredDataset(path, batch_size=64)
    assert dataset._origin.cache_outcome.action == "rebuilt"
    assert str(entry) in caplog.text and "rebuilding it" in caplog.text
    assert inspections["parquet"] == len(LAYOUT)
    assert sorted(i for batch in dataset for i in ids_of(batch)) == list(range(ROWS))
    inspections.clear()
    StructuredDataset(path, batch_size=64)
    assert inspections["parquet"] == 0   # rebuilt whole


def _same_footers(warm, cold) -> None:
    """The warm plan holds the cold plan's Parquet footers: row groups, column chunk offsets and sizes,
    statistics, and so the same read-ahead byte ranges."""
    parquet = FILE_FORMATS["parquet"]
    for warm_file, cold_file in zip(warm._plan.files, cold._plan.files, strict=True):
        assert isinstance(cold_file.handle, pq.FileMetaData) and isinstance(warm_file.handle, pq.FileMetaData)
        assert warm_file.handle.equals(cold_file.handle) and warm_file.handle.to_dict() == cold_file.handle.to_dict()
        units = list(range(len(cold_file.unit_rows)))
        ranges = parquet.byte_ranges(cold_file, units, ["id", "x"])
        assert ranges and parquet.byte_ranges(warm_file, units, ["id", "x"]) == ranges


def test_warm_plan_keeps_the_cold_plans_parquet_footers(tmp_path, inspections, monkeypatch):
    path = write_dataset(tmp_path / "data", LAYOUT)
    cold = StructuredDataset(path, batch_size=64)
    inspections.clear()
    warm = StructuredDataset(path, batch_size=64)
    assert warm._origin.cache_outcome.action == "hit" and inspections["parquet"] == 0
    _same_footers(warm, cold)
    opened_without = []   # files a worker opens without the planned footer (it reads the footer then)
    original = pq.ParquetFile.__init__

    def counted(self, source, *args, metadata=None, **kwargs):
        if metadata is None:
            opened_without.append(source)
        original(self, source, *args, metadata=metadata, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "__init__", counted)
    assert sorted(i for batch in warm for i in ids_of(batch)) == list(range(ROWS))
    assert opened_without == []


def _cached_parquet_footers(entry: Path) -> list[bytes | None]:
    _, payload = cache_entry.verified_entry(entry.read_bytes())
    return cache_entry.read_entry_table(payload).column("parquet_footer").to_pylist()


def test_warm_plan_follows_the_handle_budget(tmp_path, inspections, monkeypatch):
    """Over the budget the cold plan keeps no footer, and the entry none; another budget is another entry."""
    path = write_dataset(tmp_path / "data", LAYOUT)
    default = footers_module.LOCAL_HANDLE_BUDGET
    monkeypatch.setattr(footers_module, "LOCAL_HANDLE_BUDGET", 100)
    cold = StructuredDataset(path, batch_size=64)
    assert all(f.handle is None for f in cold._plan.files)
    assert _cached_parquet_footers(the_entry()) == [None] * len(LAYOUT)
    inspections.clear()
    warm = StructuredDataset(path, batch_size=64)
    assert warm._origin.cache_outcome.action == "hit" and inspections["parquet"] == 0
    assert all(f.handle is None for f in warm._plan.files)
    monkeypatch.setattr(footers_module, "LOCAL_HANDLE_BUDGET", default)
    larger = StructuredDataset(path, batch_size=64)   # a cold plan now keeps them: so does the entry
    assert (larger._origin.cache_outcome.action, larger._origin.cache_outcome.reason) == ("built", "no entry yet")
    assert all(isinstance(f.handle, pq.FileMetaData) for f in larger._plan.files)
    assert all(_cached_parquet_footers(Path(larger._origin.cache_outcome.path)))
    inspections.clear()
    _same_footers(StructuredDataset(path, batch_size=64), larger)
    assert inspections["parquet"] == 0


def _as_version(data: bytes, version: int) -> tuple[bytes, dict]:
    """An entry as an earlier release of the cache wrote it, and its key: version 1 (no Parquet footers, no budget
    in the key), version 2 (no inode numbers or change times in the listing: a rewrite that restored size and
    mtime looked like the file cached)."""
    header, payload = _entry_parts(data)
    fields = json.loads(header)
    fields["cache_version"] = fields["key"]["cache_version"] = version
    dropped = ["inode", "changed"]
    if version == 1:
        del fields["key"]["handle_budget"]
        dropped.append("parquet_footer")
    table = cache_entry.read_entry_table(payload).drop_columns(dropped)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return _entry_of(json.dumps(fields, sort_keys=True).encode(), bytes(sink.getvalue())), fields["key"]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("where", ["its own name", "in place"])
def test_an_entry_of_an_earlier_version_is_rebuilt_not_misread(tmp_path, inspections, caplog, where, version):
    path = write_dataset(tmp_path / "data", LAYOUT)
    cold = StructuredDataset(path, batch_size=64)
    entry = the_entry()
    old, old_key = _as_version(entry.read_bytes(), version)
    entry.unlink()
    if where == "in place":
        target = entry
    else:
        target = entry.with_name(hashlib.sha256(json.dumps(old_key, sort_keys=True).encode()).hexdigest()[:32] + ".plan")
        assert target != entry
    target.write_bytes(old)
    inspections.clear()
    with caplog.at_level(logging.INFO, logger="arrowstream"):
        dataset = StructuredDataset(path, batch_size=64)
    outcome = dataset._origin.cache_outcome
    if where == "in place":
        assert outcome.action == "rebuilt"
        assert outcome.reason == (f"it is of cache format version {version}, this release reads "
                                  f"{plan_cache.CACHE_VERSION}")
    else:
        assert (outcome.action, outcome.reason) == ("built", "no entry yet")
    assert inspections["parquet"] == len(LAYOUT)
    _same_footers(dataset, cold)
    assert sorted(i for batch in dataset for i in ids_of(batch)) == list(range(ROWS))


def _with_parquet_footer(data: bytes, change, keep_digest: bool = False) -> bytes:
    """The entry with the first file's Parquet footer changed by ``change(footers)``; its checksum recomputed,
    unless ``keep_digest`` (then it is the original bytes')."""
    header, payload = _entry_parts(data)
    table = cache_entry.read_entry_table(payload)
    footers = table.column("parquet_footer").to_pylist()
    footers[0] = change(footers)
    table = table.set_column(table.schema.get_field_index("parquet_footer"), "parquet_footer",
                             pa.array(footers, pa.binary()))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return _entry_of(header, bytes(sink.getvalue()), data[-32:] if keep_digest else None)


FOOTER_DAMAGE = {
    # bytes changed, checksum not: the checksum refuses the entry
    "checksum": (lambda f: f[0][:10] + bytes(20) + f[0][30:], True, "checksum does not match"),
    # checksum recomputed (as a bug that wrote bad bytes would): the footer itself does not parse
    "thrift": (lambda f: f[0][:10] + bytes(20) + f[0][30:], False, "Parquet footer that does not parse"),
    "cut": (lambda f: f[0][:4] + f[0][-8:], False, "Parquet footer that does not parse"),
    # parses, but is another file's: its row groups are not this file's units
    "other file's": (lambda f: f[1], False, "row groups that are not the file's"),
}


@pytest.mark.parametrize("damage", FOOTER_DAMAGE)
def test_damaged_parquet_footer_in_an_entry_is_logged_and_rebuilt(tmp_path, inspections, caplog, damage):
    change, keep_digest, reason = FOOTER_DAMAGE[damage]
    path = write_dataset(tmp_path / "data", LAYOUT)
    cold = StructuredDataset(path, batch_size=64)
    entry = the_entry()
    entry.write_bytes(_with_parquet_footer(entry.read_bytes(), change, keep_digest))
    inspections.clear()
    with caplog.at_level(logging.INFO, logger="arrowstream"):
        dataset = StructuredDataset(path, batch_size=64)
    assert dataset._origin.cache_outcome.action == "rebuilt"
    assert reason in dataset._origin.cache_outcome.reason
    assert str(entry) in caplog.text and "rebuilding it" in caplog.text
    assert inspections["parquet"] == len(LAYOUT)
    assert sorted(i for batch in dataset for i in ids_of(batch)) == list(range(ROWS))
    inspections.clear()
    _same_footers(StructuredDataset(path, batch_size=64), cold)   # rebuilt whole
    assert inspections["parquet"] == 0


def test_entry_of_other_options_in_the_same_file_is_refused(tmp_path, inspections, caplog):
    """The key inside is checked, not only the file name: an entry of another dataset put in its place."""
    one = write_dataset(tmp_path / "one", LAYOUT)
    two = write_dataset(tmp_path / "two", [(40, 20)])
    StructuredDataset(one, batch_size=64)
    first = the_entry()
    saved = first.read_bytes()
    first.unlink()
    StructuredDataset(two, batch_size=64)
    second = the_entry()
    second.write_bytes(saved)
    inspections.clear()
    with caplog.at_level(logging.INFO, logger="arrowstream"):
        assert all_ids(two) == list(range(40))
    assert "other options (path)" in caplog.text
    assert inspections["parquet"] == 1


def _write_padded(target: Path, table: pa.Table, groups: int, size: int | None = None) -> int:
    """``table`` in row groups of ``groups`` rows, with statistics; with ``size``, padded to exactly that many
    bytes (a key-value pair in the footer)."""

    def write(pad: int) -> int:
        with pq.ParquetWriter(target, table.schema, compression="none", use_dictionary=False,
                              store_schema=False) as writer:
            writer.write_table(table, row_group_size=groups)
            writer.add_key_value_metadata({"pad": "x" * pad})
        return target.stat().st_size

    written = write(0)
    if size is None:
        return written
    pad = 200 + size - write(200)
    for _ in range(4):
        written = write(pad)
        if written == size:
            return written
        pad += size - written
    raise AssertionError(f"could not pad {target} to {size} bytes")


def _rewrite_keeping_size_and_mtime(target: Path, write) -> None:
    """``write(target, size)`` rewrites the file to ``size`` bytes; its modification time is then restored
    (``os.utime``, as ``cp -p``, ``rsync -t`` or a restore from backup do): size and mtime as listed before."""
    before = target.stat()
    write(target, before.st_size)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = target.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def _ints(values) -> pa.Table:
    return pa.table({"id": pa.array(values, pa.int64())})


# item 4 of issue 36: a Parquet file rewritten with its size and modification time kept. Each case: the file as
# planned (table, row group size), the file as rewritten, the filter
REWRITES = {
    # the cached statistics prune the second row group (ids 100-199), which now holds ids 0-99 that match
    "pruned groups now match": (_ints(range(200)), 100, _ints([i % 100 for i in range(200)]), 100,
                                pc.field("id") < 100),
    # the cached footer's int64 decoded the doubles as garbage integers (4609434218613702656 for 1.5)
    "int64 rewritten as float64": (_ints(range(200)), 100, pa.table({"id": pa.array([1.5] * 200, pa.float64())}),
                                   100, None),
    # the same rows in other row groups: "not a readable Parquet file ... remove or rewrite the file"
    "other row groups": (_ints(range(200)), 50, _ints(range(200)), 100, None),
}


def _values(folder: Path, filter, **options) -> list:
    dataset = StructuredDataset(str(folder), batch_size=64, filter=filter, output_format="arrow", **options)
    return sorted(v for batch in dataset for v in batch.column("id").to_pylist())


def _expected(table: pa.Table, filter) -> list:
    return sorted((table.filter(filter) if filter is not None else table).column("id").to_pylist())


def _planned_then_rewritten(tmp_path: Path, case: str, **options) -> tuple[Path, Path]:
    """The folder of one file of ``REWRITES[case]``, planned (its entry written) and read, then rewritten keeping
    its size and modification time; the folder and the file."""
    first, first_groups, second, second_groups, filter = REWRITES[case]
    folder = tmp_path / "data"
    folder.mkdir()
    target = folder / "part-0.parquet"
    _write_padded(target, first, first_groups)
    assert _values(folder, filter, **options) == _expected(first, filter)
    _rewrite_keeping_size_and_mtime(target, lambda path, size: _write_padded(path, second, second_groups, size))
    return folder, target


@pytest.mark.parametrize("case", REWRITES)
def test_a_rewrite_keeping_size_and_mtime_is_a_stale_listing(tmp_path, caplog, inspections, case):
    """The listing keeps what ``os.utime`` cannot restore (the inode change time): the entry is rebuilt and the
    rows are the file's as it is now, pruned row groups included."""
    folder, _ = _planned_then_rewritten(tmp_path, case)
    _, _, second, _, filter = REWRITES[case]
    inspections.clear()
    with caplog.at_level(logging.INFO, logger="arrowstream"):
        dataset = StructuredDataset(str(folder), batch_size=64, filter=filter, output_format="arrow")
    outcome = dataset._origin.cache_outcome
    assert outcome.action == "rebuilt", outcome
    assert "inode change time" in outcome.reason and "part-0.parquet" in outcome.reason
    assert inspections["parquet"] >= 1
    assert sorted(v for batch in dataset for v in batch.column("id").to_pylist()) == _expected(second, filter)
    assert _values(folder, filter) == _expected(second, filter)   # the rebuilt entry serves the next start


def test_a_file_replaced_by_another_with_its_size_and_mtime_is_a_stale_listing(tmp_path):
    """``rsync -t`` writes a temporary file, sets its modification time and renames it over the old one: another
    inode (and change time), the same name, size and mtime."""
    folder = tmp_path / "data"
    folder.mkdir()
    target = folder / "part-0.parquet"
    _write_padded(target, _ints(range(200)), 100)
    assert _values(folder, None) == list(range(200))
    before = target.stat()
    temporary = folder / ".part-0.parquet.tmp"   # hidden: not listed
    _write_padded(temporary, _ints(range(1000, 1200)), 100, size=before.st_size)
    os.utime(temporary, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(temporary, target)
    dataset = StructuredDataset(str(folder), batch_size=64)
    assert dataset._origin.cache_outcome.action == "rebuilt"
    assert "inode number" in dataset._origin.cache_outcome.reason
    assert sorted(i for batch in dataset for i in ids_of(batch)) == list(range(1000, 1200))


def _restamped(entry: Path, folder: Path) -> None:
    """The entry rewritten (checksum and all) with the inode numbers and change times of the files as listed now:
    what a listing sees where a rewrite leaves them as they were (a rewrite within one tick of a coarse clock, a
    filesystem whose change time ``utime`` sets too): the entry is stale and its listing is the current one."""
    from arrowstream._planning.cache_entry import _stamps

    header, payload = _entry_parts(entry.read_bytes())
    table = cache_entry.read_entry_table(payload)
    _, entries = discovery.discover_files(str(folder), None)
    for name, column in _stamps(entries).items():
        table = table.set_column(table.schema.get_field_index(name), name, column)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    entry.write_bytes(_entry_of(header, bytes(sink.getvalue())))


@pytest.mark.parametrize("handles", [True, False], ids=["footer kept", "no footer kept"])
@pytest.mark.parametrize("case", REWRITES)
def test_a_stale_entry_the_listing_cannot_tell_is_named_when_the_file_is_opened(tmp_path, monkeypatch, case,
                                                                                handles):
    """A worker compares the file it opens with what the plan holds of it (the footer the plan kept, or the units,
    schema and pruning by statistics of the footer it reads): a stale entry that the listing cannot tell is an
    error naming the entry and the way out, never rows lost, garbage or a file called unreadable."""
    if not handles:
        monkeypatch.setattr(footers_module, "LOCAL_HANDLE_BUDGET", 0)
    folder, _ = _planned_then_rewritten(tmp_path, case)
    _, _, second, _, filter = REWRITES[case]
    entry = the_entry()
    _restamped(entry, folder)
    dataset = StructuredDataset(str(folder), batch_size=64, filter=filter, output_format="arrow")
    assert dataset._origin.cache_outcome.action == "hit"
    assert bool(dataset._plan.files.handles) is handles
    with pytest.raises(errors.StalePlanCacheError) as caught:
        list(dataset)
    message = str(caught.value)
    assert message.startswith(f"the plan cache entry {entry} is stale") and "part-0.parquet" in message
    assert "plan_cache=False" in message and f"rm {entry}" in message
    assert "not a readable" not in message and "rewrite the file" not in message
    assert isinstance(caught.value, errors.FileChangedError)
    entry.unlink()   # the way out the error names
    assert _values(folder, filter) == _expected(second, filter)


@pytest.mark.parametrize("case", REWRITES)
def test_a_file_rewritten_during_a_run_keeping_size_and_mtime_is_a_changed_file(tmp_path, case):
    """Without the cache: a file rewritten after planning with its size and modification time kept is named as
    changed when a worker opens it (the pinned size and mtime cannot tell), not read with the planned footer."""
    first, first_groups, second, second_groups, filter = REWRITES[case]
    folder = tmp_path / "data"
    folder.mkdir()
    target = folder / "part-0.parquet"
    _write_padded(target, first, first_groups)
    loader, _ = make_loader(str(folder), 1, batch_size=64, filter=filter, plan_cache=False,
                                  output_format="arrow")
    _rewrite_keeping_size_and_mtime(target, lambda path, size: _write_padded(path, second, second_groups, size))
    with pytest.raises(errors.FileChangedError, match="part-0.parquet: changed since planning") as caught:
        list(loader)
    assert not isinstance(caught.value, errors.StalePlanCacheError)


def _same_size_rewrites() -> dict[str, tuple[str, dict, object, object]]:
    """Other formats: (format, options, write the file as planned, write it again keeping its size)."""
    def ipc(values, type_):
        return lambda path: feather.write_feather(pa.table({"id": pa.array(values, type_)}), path, chunksize=100,
                                                  compression="uncompressed")

    def orc_file(type_):
        return lambda path: orc.write_table(pa.table({"id": pa.array(range(200), type_)}), path,
                                            compression="uncompressed")

    def text(body):
        return lambda path: path.write_text("id\n" + body)

    return {
        "arrow": ("arrow", {}, ipc(range(200), pa.int64()), ipc([1.5] * 200, pa.float64())),
        "orc": ("orc", {}, orc_file(pa.int64()), orc_file(pa.int32())),
        "csv": ("csv", {"split_bytes": 200}, text("1000\n" * 300), text("10\n" * 500)),
    }


@pytest.mark.parametrize("kind", ["arrow", "orc", "csv"])
def test_other_formats_rewritten_keeping_size_and_mtime(tmp_path, kind):
    """IPC record batches, ORC stripes, CSV byte ranges: the listing tells the rewrite (rebuilt); an entry it
    cannot tell is named when the file is opened (IPC, ORC: schema and units read at opening) or a unit is
    parsed (CSV: its rows counted against the scan the entry holds)."""
    file_format, options, write_first, write_second = _same_size_rewrites()[kind]
    folder = tmp_path / "data"
    folder.mkdir()
    target = folder / f"part-0.{kind}"
    write_first(target)
    first = sorted(i for batch in StructuredDataset(str(folder), format=file_format, batch_size=64,
                                                    output_format="arrow", **options)
                   for i in batch.column("id").to_pylist())
    entry = the_entry()
    stale = entry.read_bytes()

    def rewrite(path, size):
        write_second(path)
        assert path.stat().st_size == size

    _rewrite_keeping_size_and_mtime(target, rewrite)
    expected = {"arrow": [1.5] * 200, "orc": list(range(200)), "csv": [10] * 500}[kind]
    dataset = StructuredDataset(str(folder), format=file_format, batch_size=64, output_format="arrow", **options)
    assert dataset._origin.cache_outcome.action == "rebuilt"
    batches = list(dataset)
    assert sorted(v for batch in batches for v in batch.column("id").to_pylist()) == expected
    now_type = {"arrow": pa.float64(), "orc": pa.int32(), "csv": pa.int64()}[kind]
    assert dataset._plan.schema.field("id").type == now_type
    assert all(batch.schema.equals(dataset._plan.schema) for batch in batches)
    assert (expected, now_type) != (first, pa.int64())
    entry.write_bytes(stale)   # the entry of the file as planned, its listing made the current one
    _restamped(entry, folder)
    dataset = StructuredDataset(str(folder), format=file_format, batch_size=64, output_format="arrow", **options)
    assert dataset._origin.cache_outcome.action == "hit"
    if kind == "csv":   # rows counted against the entry's scan when a unit is parsed: changed, or a stray quote
        with pytest.raises(errors.MalformedRowError, match=f"part-0.csv: .*planned from the plan cache entry {entry}: "
                                                           "if the file was rewritten .* plan_cache=False"):
            list(dataset)
        return
    with pytest.raises(errors.StalePlanCacheError, match=f"the plan cache entry {entry} is stale: .*part-0.{kind}"):
        list(dataset)


def test_a_changed_inode_time_rebuilds_the_entry_and_keeps_checkpoints(tmp_path):
    """A ``chmod`` changes a file's inode change time, not its data: the entry is rebuilt (never trusted on
    what utime cannot restore), and a checkpoint's data fingerprint, which holds no inode time, still matches
    (data_identity="strict"); a copy elsewhere still resumes with data_identity="layout"."""
    path = write_dataset(tmp_path / "data", LAYOUT)
    loader, dataset = make_loader(path, 0, batch_size=64)
    dataset.set_epoch(0)
    iterator = iter(loader)
    before = [i for _ in range(3) for i in ids_of(next(iterator))]
    state = json_roundtrip(loader.state_dict())
    target = Path(path) / "part-001.parquet"
    target.chmod(0o600)
    loader, dataset = make_loader(path, 0, batch_size=64)
    assert dataset._origin.cache_outcome.action == "rebuilt"
    reason = dataset._origin.cache_outcome.reason
    assert "inode change time" in reason and "part-001.parquet" in reason
    loader.load_state_dict(state)   # strict: the same files
    assert Counter(before + [i for batch in loader for i in ids_of(batch)]) == Counter(range(ROWS))
    copy = tmp_path / "copy"
    shutil.copytree(path, copy, copy_function=shutil.copy)   # other inodes, change and modification times
    loader, dataset = make_loader(str(copy), 0, batch_size=64)
    with pytest.raises(errors.StateMismatchError, match="data_identity='layout'"):
        loader.load_state_dict(state)
    loader, dataset = make_loader(str(copy), 0, batch_size=64, data_identity="layout")
    loader.load_state_dict(state)
    assert Counter(before + [i for batch in loader for i in ids_of(batch)]) == Counter(range(ROWS))


def test_s3_a_rewrite_of_the_same_size_is_a_stale_listing(s3_server):
    """Remote files are listed with their version (S3: the ETag, a digest of the bytes), which every rewrite
    changes and nothing restores: the entry is rebuilt, and reads are pinned to the version listed."""
    url = s3_server.url(f"stale-{os.getpid()}")
    fs = s3_server.filesystem()
    for table in (_ints(range(200)), _ints(range(1000, 1200))):   # the same size, other bytes
        with fs.open(f"{url}/part-0.parquet", "wb") as f:
            pq.write_table(table, f, row_group_size=100, compression="none", use_dictionary=False)
        dataset = StructuredDataset(url, batch_size=64, storage_options=s3_server.storage_options)
        assert sorted(i for batch in dataset for i in ids_of(batch)) == table.column("id").to_pylist()
    assert dataset._origin.cache_outcome.action == "rebuilt"
    assert "listing changed" in dataset._origin.cache_outcome.reason


def test_plan_cache_false_writes_nothing_and_reads_every_footer(tmp_path, inspections):
    path = write_dataset(tmp_path / "data", LAYOUT)
    for _ in range(2):
        dataset = StructuredDataset(path, batch_size=64, plan_cache=False)
        assert dataset._origin.cache_outcome.action == "off"
    assert inspections["parquet"] == 2 * len(LAYOUT)
    assert cache_files(os.environ["ARROWSTREAM_CACHE_DIR"]) == []


def test_a_listing_without_modification_tags_is_not_cached(tmp_path, monkeypatch, inspections):
    """A filesystem whose listing gives no modification tag nor version: a rewrite of the same size could not
    be told apart, so nothing is cached."""
    path = write_dataset(tmp_path / "data", LAYOUT)
    local_entries = discovery._local_entries   # a local listing's entries are built in one loop (no tag lookup)
    monkeypatch.setattr(discovery, "_local_entries",
                        lambda statuses: [dataclasses.replace(e, tag="", version="") for e in local_entries(statuses)])
    for _ in range(2):
        dataset = StructuredDataset(path, batch_size=64)
        assert dataset._origin.cache_outcome.action == "off"
    assert inspections["parquet"] == 2 * len(LAYOUT)
    assert cache_files(os.environ["ARROWSTREAM_CACHE_DIR"]) == []


def test_an_entry_is_not_used_by_a_listing_without_modification_tags(tmp_path, monkeypatch, inspections):
    """An entry written from a tagged listing is not used once the listing gives no tags (a rewrite could
    not be told apart): the footers are read, the entry left as it is."""
    path = write_dataset(tmp_path / "data", LAYOUT)
    StructuredDataset(path, batch_size=64)
    written = the_entry().read_bytes()
    local_entries = discovery._local_entries
    monkeypatch.setattr(discovery, "_local_entries",
                        lambda statuses: [dataclasses.replace(e, tag="", version="") for e in local_entries(statuses)])
    inspections.clear()
    dataset = StructuredDataset(path, batch_size=64)
    assert dataset._origin.cache_outcome.action == "off" and inspections["parquet"] == len(LAYOUT)
    assert the_entry().read_bytes() == written


def test_where_the_cache_lives(tmp_path, monkeypatch):
    path = write_dataset(tmp_path / "data", LAYOUT)
    StructuredDataset(path, batch_size=64, plan_cache=tmp_path / "mine")   # a folder given (os.PathLike)
    assert len(cache_files(tmp_path / "mine")) == 1
    assert cache_files(os.environ["ARROWSTREAM_CACHE_DIR"]) == []
    monkeypatch.delenv("ARROWSTREAM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    StructuredDataset(path, batch_size=64)
    assert len(cache_files(tmp_path / "xdg" / "arrowstream")) == 1
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    StructuredDataset(path, batch_size=64)
    assert len(cache_files(tmp_path / "home" / ".cache" / "arrowstream")) == 1


@pytest.mark.parametrize(("value", "error"), [(True, errors.ArgumentTypeError), (3, errors.ArgumentTypeError),
                                              ("  ", errors.InvalidArgumentError)])
def test_bad_plan_cache_argument(small_dataset, value, error):
    with pytest.raises(error, match=r"plan_cache: expected None .* or False \(no cache\), got"):
        StructuredDataset(small_dataset, plan_cache=value)


def test_not_in_the_rank_fingerprint_nor_the_state(tmp_path):
    path = write_dataset(tmp_path / "data", LAYOUT)
    folder = str(tmp_path / "elsewhere-cache")
    default = StructuredDataset(path, batch_size=64)
    placed = StructuredDataset(path, batch_size=64, plan_cache=folder)
    assert placed._origin.arguments() == default._origin.arguments()
    loader, dataset = make_loader(path, 0, batch_size=64, plan_cache=folder)
    dataset.set_epoch(0)
    next(iter(loader))
    state = str(json_roundtrip(loader.state_dict()))
    assert "elsewhere-cache" not in state and "plan_cache" not in state


def test_unwritable_folder_warns_once_and_plans_without(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(plan_cache, "_warned_folders", set())
    path = write_dataset(tmp_path / "data", LAYOUT)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING, logger="arrowstream"):
        for _ in range(2):
            dataset = StructuredDataset(path, batch_size=64, plan_cache=blocker / "cache")
            assert dataset._origin.cache_outcome.action == "off"
            assert sorted(i for batch in dataset for i in ids_of(batch)) == list(range(ROWS))
    assert caplog.text.count("cannot write the plan cache") == 1


def test_full_disk_warns_and_plans_without(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(plan_cache, "_warned_folders", set())
    path = write_dataset(tmp_path / "data", LAYOUT)

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plan_cache.os, "replace", no_space)
    with caplog.at_level(logging.WARNING, logger="arrowstream"):
        assert all_ids(path) == list(range(ROWS))
    assert "No space left on device" in caplog.text
    assert os.listdir(os.environ["ARROWSTREAM_CACHE_DIR"]) == []   # the temporary file removed too


def test_a_write_cut_short_leaves_the_previous_entry_whole(tmp_path, monkeypatch):
    """Readers never see a partial entry: the bytes go to a temporary file, renamed over the entry only
    when whole (a process killed mid-write, or a full disk, leaves the old entry as it was)."""
    monkeypatch.setattr(plan_cache, "_warned_folders", set())
    path = write_dataset(tmp_path / "data", LAYOUT)
    StructuredDataset(path, batch_size=64)
    entry = the_entry()
    before = entry.read_bytes()
    pq.write_table(make_table(ROWS, 10), Path(path) / "part-009.parquet")   # the entry is now stale
    real_fdopen = os.fdopen

    def half_then_fail(descriptor, mode="r", *args, **kwargs):
        handle = real_fdopen(descriptor, mode, *args, **kwargs)
        real_write = handle.write

        def write(data):
            real_write(data[: len(data) // 2])
            handle.flush()
            raise OSError(28, "No space left on device")

        handle.write = write
        return handle

    monkeypatch.setattr(plan_cache.os, "fdopen", half_then_fail)
    assert all_ids(path) == list(range(ROWS + 10))
    assert entry.read_bytes() == before and cache_entry.read_header(str(entry))["num_files"] == len(LAYOUT)
    assert [p.name for p in Path(entry.parent).iterdir()] == [entry.name]   # no temporary file left


def test_least_recently_used_entries_are_removed(tmp_path, monkeypatch, inspections):
    paths = [write_dataset(tmp_path / f"data{i}", LAYOUT) for i in range(3)]
    StructuredDataset(paths[0], batch_size=64)
    one_entry = the_entry().stat().st_size
    monkeypatch.setenv("ARROWSTREAM_CACHE_MAX_BYTES", str(int(one_entry * 2.5)))
    StructuredDataset(paths[1], batch_size=64)
    folder = os.environ["ARROWSTREAM_CACHE_DIR"]
    first, second = sorted(cache_files(folder), key=lambda p: p.stat().st_mtime_ns)
    os.utime(first, (1000, 1000))      # the entry of paths[0], long unused ...
    os.utime(second, (2000, 2000))
    inspections.clear()
    StructuredDataset(paths[0], batch_size=64)   # ... until now: a hit touches it
    assert inspections["parquet"] == 0
    StructuredDataset(paths[2], batch_size=64)   # a third entry: the least recently used goes
    remaining = cache_files(folder)
    assert len(remaining) == 2 and second not in remaining and first in remaining
    inspections.clear()
    StructuredDataset(paths[1], batch_size=64)
    assert inspections["parquet"] == len(LAYOUT)
    monkeypatch.setenv("ARROWSTREAM_CACHE_MAX_BYTES", "0")   # room for nothing: every entry goes, reads go on
    dataset = StructuredDataset(write_dataset(tmp_path / "data3", LAYOUT), batch_size=64)
    assert dataset._origin.cache_outcome.action == "off" and cache_files(folder) == []
    assert sorted(i for batch in dataset for i in ids_of(batch)) == list(range(ROWS))
    monkeypatch.setenv("ARROWSTREAM_CACHE_MAX_BYTES", "lots")
    with pytest.raises(errors.InvalidArgumentError, match="ARROWSTREAM_CACHE_MAX_BYTES='lots' is not a number"):
        StructuredDataset(paths[2], batch_size=64)


_CHILD = """
import json, sys
from arrowstream import StructuredDataset
dataset = StructuredDataset(sys.argv[1], batch_size=64)
ids = sorted(int(i) for batch in dataset for i in batch["id"])
print(json.dumps({"action": dataset._origin.cache_outcome.action, "rows": len(ids), "unique": len(set(ids))}))
"""


def test_processes_that_start_together_each_write_a_whole_entry(tmp_path, inspections):
    path = write_dataset(tmp_path / "data", [(60, 20)] * 12)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    children = [subprocess.Popen([sys.executable, "-c", _CHILD, path], stdout=subprocess.PIPE, env=env, text=True)
                for _ in range(2)]
    results = [child.communicate(timeout=120)[0] for child in children]
    assert all(child.returncode == 0 for child in children)
    answers = [json.loads(r.strip().splitlines()[-1]) for r in results]
    assert all(a["rows"] == a["unique"] == 720 for a in answers)
    folder = os.environ["ARROWSTREAM_CACHE_DIR"]
    assert len(cache_files(folder)) == 1 and not [n for n in os.listdir(folder) if n.startswith(".")]
    inspections.clear()
    dataset = StructuredDataset(path, batch_size=64)
    assert dataset._origin.cache_outcome.action == "hit" and inspections["parquet"] == 0


def test_cli_plan_builds_and_prints_what_it_holds(tmp_path, capsys):
    from arrowstream.cli import main

    path = write_format(tmp_path / "data", "csv")
    folder = tmp_path / "ahead"
    assert main(["plan", path, "--format", "csv", "--split-bytes", "2000", "--cache-dir", str(folder)]) == 0
    built = capsys.readouterr().out
    assert "this run: built" in built and f"{len(LAYOUT)} files" in built and f"{ROWS} rows" in built
    assert str(folder) in built and "parse options" in built
    assert main(["plan", path, "--format", "csv", "--split-bytes", "2000", "--cache-dir", str(folder),
                 "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["action"] == "hit" and info["files"] == len(LAYOUT) and info["rows"] == ROWS
    assert info["folder_entries"] == 1
    # the job that follows finds the entry built ahead
    dataset = StructuredDataset(path, format="csv", batch_size=64, split_bytes=2000, plan_cache=folder)
    assert dataset._origin.cache_outcome.action == "hit"


def test_s3_warm_restart_lists_once_reads_no_footer_and_keeps_no_credentials(s3_server, inspections):
    from proxy import start_proxy

    url = s3_server.url(f"cache-{os.getpid()}-{id(inspections)}")
    fs = s3_server.filesystem()
    for index, (rows, group) in enumerate(LAYOUT):
        with fs.open(f"{url}/part-{index}.parquet", "wb") as f:
            pq.write_table(make_table(sum(r for r, _ in LAYOUT[:index]), rows), f, row_group_size=group)
    secrets = {"key": "AKIAPLANCACHEKEY0001", "secret": "plan-cache-secret-value-0001"}
    with start_proxy(s3_server.endpoint) as proxy:
        proxy.configure(flavor="s3")
        options = {**s3_server.options_via(proxy.endpoint), **secrets}
        cold = StructuredDataset(url, batch_size=64, storage_options=options)
        assert cold._origin.cache_outcome.action == "built"
        proxy.reset()
        inspections.clear()
        warm = StructuredDataset(url, batch_size=64, storage_options=options)
        planning = proxy.stats()["counts"]
        assert warm._origin.cache_outcome.action == "hit" and inspections["parquet"] == 0
        assert planning.get("list", 0) == 1 and planning.get("head", 0) == 0
        assert planning.get("read", 0) == 0, f"a warm restart read footers: {planning}"
        assert sorted(i for batch in warm for i in ids_of(batch)) == list(range(ROWS))
    data = the_entry().read_bytes()
    for value in secrets.values():
        assert value.encode() not in data
    assert b"storage_options" not in data and s3_server.endpoint.encode() not in data


def test_s3_warm_restart_reads_with_the_cold_requests_and_read_ahead(s3_server, inspections, monkeypatch):
    """A warm start reads the data as a cold one does: no footer request by the reader, every byte range
    fetched ahead (none read directly)."""
    from proxy import start_proxy

    from arrowstream._storage import prefetch as _prefetch

    url = s3_server.url(f"cache-footers-{os.getpid()}-{id(inspections)}")
    fs = s3_server.filesystem()
    for index, (rows, group) in enumerate(LAYOUT):
        with fs.open(f"{url}/part-{index}.parquet", "wb") as f:
            pq.write_table(make_table(sum(r for r, _ in LAYOUT[:index]), rows), f, row_group_size=group)
    prefetchers: list[_prefetch.Prefetcher] = []
    original = _prefetch.Prefetcher.__init__

    def recorded(self, *args, **kwargs):
        original(self, *args, **kwargs)
        prefetchers.append(self)

    monkeypatch.setattr(_prefetch.Prefetcher, "__init__", recorded)
    with start_proxy(s3_server.endpoint) as proxy:
        proxy.configure(flavor="s3")

        def read(action: str) -> tuple[dict[str, int], int]:
            dataset = StructuredDataset(url, batch_size=64, read_ahead=2,
                                        storage_options=s3_server.options_via(proxy.endpoint))
            assert dataset._origin.cache_outcome.action == action
            prefetchers.clear()
            proxy.reset()
            assert sorted(i for batch in dataset for i in ids_of(batch)) == list(range(ROWS))
            (prefetcher,) = prefetchers
            return proxy.stats()["counts"], prefetcher.direct_requests

        cold_counts, cold_direct = read("built")
        inspections.clear()
        warm_counts, warm_direct = read("hit")
    assert inspections["parquet"] == 0
    assert cold_direct == 0 and warm_direct == 0, "the reader read bytes that read-ahead did not fetch"
    assert cold_counts.get("read", 0) > 0
    assert warm_counts.get("read", 0) == cold_counts["read"], f"warm {warm_counts}, cold {cold_counts}"


_RESUME_CHILD = """
import json, sys
from helpers import ids_of, make_loader
loader, dataset = make_loader(sys.argv[1], 2, batch_size=50, shuffle=True, seed=3)
with open(sys.argv[2]) as f:
    loader.load_state_dict(json.load(f))
dataset.set_epoch(0)
ids = [i for batch in loader for i in ids_of(batch)]
print(json.dumps({"action": dataset._origin.cache_outcome.action, "ids": ids}))
"""


def test_exact_resume_across_a_cached_restart(tmp_path, inspections):
    """Checkpoint mid-epoch; a new process plans from the warm cache (no footer read), loads the state and
    reads the rest of the epoch: every row exactly once."""
    path = write_dataset(tmp_path / "data", [(300, 50), (250, 50), (170, 40)])
    loader, dataset = make_loader(path, 2, batch_size=50, shuffle=True, seed=3)
    dataset.set_epoch(0)
    before = []
    for step, batch in enumerate(loader):
        before.extend(ids_of(batch))
        if step == 4:
            state = json_roundtrip(loader.state_dict())
            break
    del loader
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(state))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _RESUME_CHILD, path, str(state_file)], env=env, timeout=120,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    after = json.loads(done.stdout.strip().splitlines()[-1])
    assert after["action"] == "hit"
    assert Counter(before + after["ids"]) == Counter(range(720))


def test_torchrun_ranks_plan_together_from_the_cache(tmp_path):
    """3 ranks (gloo, 127.0.0.1), one torchrun. First each rank plans on its own (plan_locally): three writers
    of one entry at once. Then rank 0 plans for all from the entry (a hit) and the ranks read every row once."""
    from test_distributed import check_epoch, torchrun

    layout = [(300, 50), (250, 50), (170, 40)]
    path = write_dataset(tmp_path / "data", layout)
    base = {"path": path, "num_workers": 1, "epochs": [0]}
    scenarios = [{**base, "name": "local", "options": {"batch_size": 32, "plan_locally": True}},
                 {**base, "name": "together", "options": {"batch_size": 32}}]
    per_rank = torchrun(3, {"scenarios": scenarios}, tmp_path)
    local = [r["local"]["plan_cache"] for r in per_rank]   # built, unless a rank started after another wrote
    assert set(local) <= {"built", "hit"} and "built" in local
    assert [r["together"]["plan_cache"] for r in per_rank] == ["hit", None, None]   # only rank 0 plans
    for name in ("local", "together"):
        check_epoch(per_rank, name, "0", sum(rows for rows, _ in layout))
    assert len(cache_files(os.environ["ARROWSTREAM_CACHE_DIR"])) == 1


def _plan_facts(dataset) -> tuple:
    files = dataset._plan.files
    return (dataset._plan.data_fingerprint, list(dataset._plan.splits), [f.entry for f in files],
            [(f.unit_rows, f.unit_bytes, f.kept_units, f.schema) for f in files])


def test_an_entry_without_handles_loads_as_columns_into_the_cold_plan(tmp_path, inspections, monkeypatch):
    """Past the handle budget (many files) an entry loads column by column, no FileFooter per file, into the
    plan a cold start makes; so does one whose files keep handles (ORC: byte ranges)."""
    monkeypatch.setattr(footers_module, "LOCAL_HANDLE_BUDGET", 100)
    path = write_dataset(tmp_path / "data", LAYOUT)
    cold = StructuredDataset(path, batch_size=64, plan_cache=False)
    StructuredDataset(path, batch_size=64)   # writes the entry
    built = []
    original = footers_module.FooterTable.build
    monkeypatch.setattr(footers_module.FooterTable, "build",
                        classmethod(lambda cls, *a, **k: built.append(1) or original(*a, **k)))
    inspections.clear()
    warm = StructuredDataset(path, batch_size=64)
    assert warm._origin.cache_outcome.action == "hit" and inspections["parquet"] == 0
    assert built == []   # the columns of the entry are the plan's: no table built of FileFooters
    assert _plan_facts(warm) == _plan_facts(cold)
    assert sorted(i for batch in warm for i in ids_of(batch)) == list(range(ROWS))
    orc_path = write_format(tmp_path / "orc", "orc")
    orc_cold = StructuredDataset(orc_path, format="orc", batch_size=64)
    built.clear()
    orc_warm = StructuredDataset(orc_path, format="orc", batch_size=64)
    assert orc_warm._origin.cache_outcome.action == "hit" and built == []   # byte ranges kept: columns too
    assert all(isinstance(f.handle, tuple) for f in orc_warm._plan.files)
    assert plan_of(orc_warm) == plan_of(orc_cold)


@pytest.mark.parametrize("change", ["negative rows", "kept unit out of range", "fewer sizes than counts"])
def test_impossible_counts_in_an_entry_are_caught_on_the_columnar_path(tmp_path, inspections, caplog, monkeypatch,
                                                                      change):
    """Counts that pass the checksum but cannot be (a bug's entry) are found as ``check_counts`` finds them
    in a footer: the entry is logged and rebuilt from the files, never planned on."""
    monkeypatch.setattr(footers_module, "LOCAL_HANDLE_BUDGET", 100)
    path = write_dataset(tmp_path / "data", LAYOUT)
    StructuredDataset(path, batch_size=64)
    entry = the_entry()
    header, payload = _entry_parts(entry.read_bytes())
    table = cache_entry.read_entry_table(payload)
    lists = {name: table.column(name).to_pylist() for name in ("unit_rows", "unit_bytes", "kept_units")}
    if change == "negative rows":
        lists["unit_rows"][1][0] = -lists["unit_rows"][1][0]
    elif change == "kept unit out of range":
        lists["kept_units"][2].append(len(lists["unit_rows"][2]))
    else:
        lists["unit_bytes"][0] = lists["unit_bytes"][0][:-1]
    for name, values in lists.items():
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values, pa.list_(pa.int64())))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    entry.write_bytes(_entry_of(header, bytes(sink.getvalue())))
    inspections.clear()
    with caplog.at_level(logging.INFO, logger="arrowstream"):
        dataset = StructuredDataset(path, batch_size=64)
    assert dataset._origin.cache_outcome.action == "rebuilt" and "damaged" in caplog.text
    assert inspections["parquet"] == len(LAYOUT)
    assert sorted(i for batch in dataset for i in ids_of(batch)) == list(range(ROWS))


# -- the entry as columns (no FileFooter per file), with the data fingerprint ---------------------------------
def _columns_of(table) -> dict:
    """Everything a FooterTable holds, comparable with ==."""
    handles = {i: h.to_dict() if isinstance(h, pq.FileMetaData) else h for i, h in table.handles.items()}
    return {"listing": [table.paths.to_pylist(), table.names.to_pylist(), table.tags.to_pylist(),
                        table.versions.to_pylist(), table.sizes.tolist()],
            "formats": [table.formats[i] for i in table.format_index], "schemas": [table.schema_of(i) for i in
                                                                                range(len(table))],
            "units": [table.unit_offsets.tolist(), table.unit_rows.tolist(), table.unit_bytes.tolist(),
                      table.kept_offsets.tolist(), table.kept_units.tolist()],
            "handles": handles, "extras": table.extras, "fingerprints": table.known_fingerprints}


def _text_folder(folder: Path) -> str:
    """CSV files of every layout: quoted newlines, compressed, empty, blank, a lone carriage return."""
    import gzip

    folder.mkdir()
    (folder / "a.csv").write_text('id,name\n0,"two\nlines"\n1,b\n')
    (folder / "b.csv.gz").write_bytes(gzip.compress(b"id,name\n2,c\n3,d\n"))
    (folder / "c.csv").write_text("")
    (folder / "d.csv").write_text("\n\n")
    (folder / "e.csv").write_text("id,name\n" + "".join(f"{i},e\n" for i in range(4, 300)))
    (folder / "f.csv").write_bytes(b"id,name\n300,f\r301,g\n")
    return str(folder)


@pytest.fixture
def computed_fingerprints(monkeypatch):
    """Data fingerprints computed from the files (not taken from a table that knows them)."""
    calls = []
    original = footers_module._computed_fingerprint
    monkeypatch.setattr(footers_module, "_computed_fingerprint",
                        lambda *args: calls.append(1) or original(*args))
    return calls


@pytest.mark.parametrize("kind", ["parquet", "arrow", "orc", "csv", "jsonl", "csv layouts"])
def test_a_default_cold_start_writes_the_entry_of_its_plan(tmp_path, inspections, computed_fingerprints, kind):
    """The entry a first start writes (the cache on, no entry yet) loads into the very table that start
    planned on: listing, formats, schemas, counts, handles (Parquet footers, byte ranges), text layouts and
    the data fingerprint; the warm start computes no fingerprint."""
    if kind == "csv layouts":
        path, options = _text_folder(tmp_path / "data"), {"format": "csv", "split_bytes": 1000}
    else:
        path = write_format(tmp_path / "data", kind)
        options = {"format": kind, **({"split_bytes": 2000} if kind in ("csv", "jsonl") else {})}
    cold = StructuredDataset(path, batch_size=64, **options)
    assert cold._origin.cache_outcome.action == "built" and computed_fingerprints == [1]
    assert cold._plan.files.known_fingerprints == {
        json.dumps({"schema": [[f.name, str(f.type)] for f in cold._plan.schema]}, separators=(",", ":")):
            cold._plan.data_fingerprint}
    if kind == "parquet":
        assert all(isinstance(f.handle, pq.FileMetaData) for f in cold._plan.files)
    if kind in ("arrow", "orc"):
        assert all(isinstance(f.handle, tuple) for f in cold._plan.files)
    if kind in ("csv", "jsonl", "csv layouts"):
        assert all(f.extra is not None for f in cold._plan.files)
    inspections.clear()
    computed_fingerprints.clear()
    warm = StructuredDataset(path, batch_size=64, **options)
    assert warm._origin.cache_outcome.action == "hit" and sum(inspections.values()) == 0
    assert computed_fingerprints == [], "a warm start computed the data fingerprint"
    assert warm._plan.data_fingerprint == cold._plan.data_fingerprint
    assert _columns_of(warm._plan.files) == _columns_of(cold._plan.files)
    assert list(warm._plan.splits) == list(cold._plan.splits)


def _many_footers(num_files: int, handles: dict[int, object] | None = None) -> tuple[list, object]:
    """A listing of ``num_files`` Parquet files and their footers as a FooterTable (nothing on disk: the
    cache's own columns are what is tested), handles at the given indices."""
    from arrowstream._core.plan_types import FileEntry
    from arrowstream._formats import FileFooter

    schema = pa.schema([("id", pa.int64())])
    entries = [FileEntry(f"/d/part-{i:05}.parquet", f"part-{i:05}.parquet", 1000 + i, f"mtime={i}", str(i))
               for i in range(num_files)]
    footers = [FileFooter(e, "parquet", schema, (10, i % 7), (500, 30 + i), (0, 1) if i % 3 else (1,),
                          (handles or {}).get(i)) for i, e in enumerate(entries)]
    return entries, footers_module.FooterTable.build(footers)


@pytest.mark.parametrize("with_handles", [False, True], ids=["no handles", "a few Parquet footers"])
def test_the_entry_is_written_and_read_as_columns(tmp_path, monkeypatch, with_handles):
    """Writing and reading the entry of 2,000 files makes no FileFooter per file (9 per file was 6.5 s at
    50,000 files): it goes file by file only for the few files that keep a handle."""
    handles = {}
    if with_handles:
        buffer = pa.BufferOutputStream()
        pq.write_table(pa.table({"id": list(range(10)) + list(range(5))}), buffer, row_group_size=10)
        metadata = pq.read_metadata(pa.BufferReader(buffer.getvalue()))
        groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
        handles = {3: metadata, 1999: metadata}
    entries, table = _many_footers(2000, handles)
    if with_handles:   # the footer must describe its file's units: those of files 3 and 1999 are made so
        rows, sizes = [g.num_rows for g in groups], [g.total_byte_size for g in groups]
        for index in handles:
            start = table.unit_offsets[index]
            table.unit_rows.flags.writeable = table.unit_bytes.flags.writeable = True
            table.unit_rows[start:start + 2], table.unit_bytes[start:start + 2] = rows, sizes
    table.known_fingerprints["{}"] = "f" * 32
    made = []
    original = footers_module.FooterTable._footer
    monkeypatch.setattr(footers_module.FooterTable, "_footer", lambda self, i: made.append(i) or original(self, i))
    cache = plan_cache.PlanCache(str(tmp_path / "cache"), {"k": 1}, FILE_FORMATS["parquet"])
    cache.store(entries, table)
    loaded = cache.load(entries)
    assert cache.outcome.action == "hit" and made == [], "the entry was written or read file by file"
    assert _columns_of(loaded) == _columns_of(table)
    assert set(loaded.handles) == set(handles) and loaded.known_fingerprints == {"{}": "f" * 32}


def test_the_data_fingerprint_is_kept_and_taken_from_the_entry(tmp_path, computed_fingerprints):
    """A warm start takes the fingerprint the cold one computed; an entry without one (a start that failed
    after reading the footers, or an earlier release) is a hit, computes it once and is written again with it."""
    path = write_dataset(tmp_path / "data", LAYOUT)
    pq.write_table(make_table(ROWS, 10).append_column("extra", pa.array([1] * 10)), Path(path) / "part-9.parquet")
    with pytest.raises(errors.SchemaMismatchError, match="extra \\['extra'\\]"):
        StructuredDataset(path, batch_size=64)
    header = json.loads(_entry_parts(the_entry().read_bytes())[0])
    assert header["fingerprints"] == {} and computed_fingerprints == []   # the footers kept, planning failed
    columns = ["id", "x", "name"]   # what the files share: planned from the entry
    first = StructuredDataset(path, batch_size=64, columns=columns)
    assert first._origin.cache_outcome.action == "hit" and computed_fingerprints == [1]
    assert json.loads(_entry_parts(the_entry().read_bytes())[0])["fingerprints"] == \
        first._plan.files.known_fingerprints != {}
    computed_fingerprints.clear()
    again = StructuredDataset(path, batch_size=64, columns=columns)
    assert again._origin.cache_outcome.action == "hit" and computed_fingerprints == []
    assert again._plan.data_fingerprint == first._plan.data_fingerprint == \
        StructuredDataset(path, batch_size=64, columns=columns, plan_cache=False)._plan.data_fingerprint


def _with_fingerprints(data: bytes, fingerprints) -> bytes:
    """The entry with other data fingerprints in its header, re-sealed (its SHA-256 valid)."""
    header, payload = _entry_parts(data)
    changed = json.loads(header)
    changed["fingerprints"] = fingerprints
    return _entry_of(json.dumps(changed, sort_keys=True).encode(), payload)


def test_the_entry_is_trusted_as_a_whole_fingerprint_included(tmp_path, caplog):
    """The trust boundary: an entry whose digest verifies and whose key and listing are this dataset's is
    taken as a whole (it holds no code); a fingerprint changed and re-sealed is taken as written, as counts
    would be (readers catch wrong counts; nothing can catch a fingerprint without computing it, which is
    what the entry saves). A header whose fingerprints are not text is damaged: logged and rebuilt."""
    path = write_dataset(tmp_path / "data", LAYOUT)
    cold = StructuredDataset(path, batch_size=64)
    entry = the_entry()
    original = entry.read_bytes()
    (identity,) = json.loads(_entry_parts(original)[0])["fingerprints"]
    entry.write_bytes(_with_fingerprints(original, {identity: "0" * 32}))
    forged = StructuredDataset(path, batch_size=64)
    assert forged._origin.cache_outcome.action == "hit" and forged._plan.data_fingerprint == "0" * 32
    entry.write_bytes(_with_fingerprints(original, {identity: 5}))
    with caplog.at_level(logging.INFO, logger="arrowstream"):
        rebuilt = StructuredDataset(path, batch_size=64)
    assert rebuilt._origin.cache_outcome.action == "rebuilt" and "damaged" in caplog.text
    assert rebuilt._plan.data_fingerprint == cold._plan.data_fingerprint
