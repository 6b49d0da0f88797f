"""Local Parquet footers read the short way (``ParquetFormat.read_local``: one pread, the footer parsed, the
Arrow schema made once per distinct Parquet schema and key-value metadata, the plan's columns filled with no
object per file) give the very table the careful way gives (a fragment per file, ``FileFooter`` per file):
every column, schema (metadata included), handle (its bytes) and the fingerprint; and a damaged file among
good ones ends as the careful way ends it: the same error, or the same table."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_corruption import flipped, rewrite_parquet_rows
from test_types import C_FORMATS, COLUMNS, _writable, with_c_formats

import arrowstream._planning.plan as planning
from arrowstream._formats import FileFooter, get_format, parquet
from arrowstream._formats.footers import FooterTable, files_fingerprint
from arrowstream._formats.parquet import serialized_metadata
from arrowstream._planning.discovery import discover_files

PARQUET = get_format("parquet")


def _read(folder: Path, careful: bool, monkeypatch: pytest.MonkeyPatch, handles: bool = True) -> FooterTable:
    """The short way: ``read_footers``. The careful way: ``read_footer`` of each file, the footers made one
    table by ``FooterTable.build`` (nothing of the short way's, nor of its joining of runs of files), the
    handles kept by the rule ``read_footers`` applies."""
    storage, entries = discover_files(str(folder), None)
    with monkeypatch.context() as patch:
        if not handles:
            patch.setattr(planning, "handle_budget", lambda is_local: 0)
        if not careful:
            return planning.read_footers(storage, entries, PARQUET, columns=None, filter=None)
    footers = [planning.read_footer(storage, PARQUET, entry, None, []) for entry in entries]
    if not handles or footers[0].handle_bytes * len(footers) > planning.handle_budget(True):
        footers = [footer.without_handle() for footer in footers]
    return FooterTable.build(footers)


def _columns(table: FooterTable) -> dict[str, object]:
    return {"paths": table.paths.to_pylist(), "names": table.names.to_pylist(), "tags": table.tags.to_pylist(),
            "versions": table.versions.to_pylist(), "sizes": table.sizes.tolist(), "formats": table.formats,
            "format_index": table.format_index.tolist(), "schema_index": table.schema_index.tolist(),
            "unit_offsets": table.unit_offsets.tolist(), "unit_rows": table.unit_rows.tolist(),
            "unit_bytes": table.unit_bytes.tolist(), "kept_offsets": table.kept_offsets.tolist(),
            "kept_units": table.kept_units.tolist(), "extras": table.extras,
            "handles": {i: serialized_metadata(h) for i, h in table.handles.items()},
            "fingerprint": files_fingerprint(table, {})}


def assert_same_tables(short: FooterTable, careful: FooterTable) -> None:
    assert _columns(short) == _columns(careful)
    assert len(short.schemas) == len(careful.schemas)
    for mine, theirs in zip(short.schemas, careful.schemas, strict=True):
        assert mine.equals(theirs, check_metadata=True), f"{mine}\n!=\n{theirs}"
        assert [f.metadata for f in mine] == [f.metadata for f in theirs]   # field metadata (field ids)


def assert_same_footers(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The short way reads every file but the lead (no fallback), and gives the careful way's table."""
    _, entries = discover_files(str(folder), None)
    assert planning._read_local(PARQUET, entries[1:], True) is not None, "the short way fell back"
    for handles in (True, False):
        short, careful = _read(folder, False, monkeypatch, handles), _read(folder, True, monkeypatch, handles)
        assert_same_tables(short, careful)
        assert bool(short.handles) == handles


def every_type() -> pa.Table:
    columns = {name: column for name, (_, column) in COLUMNS.items() if _writable("parquet", name, column)}
    assert len(columns) > 40
    batch = with_c_formats(pa.record_batch(columns), {n: f for n, f in C_FORMATS.items() if n in columns})
    return pa.Table.from_batches([batch])


def test_every_arrow_type_the_suite_writes(tmp_path, monkeypatch):
    folder = tmp_path / "d"
    folder.mkdir()
    table = every_type()
    for index in range(5):
        pq.write_table(table.slice(index % 3), folder / f"a-{index}.parquet", row_group_size=2)
    pq.write_table(table, folder / "b-no-arrow-schema.parquet", store_schema=False, row_group_size=4)
    pq.write_table(table, folder / "c-no-arrow-schema.parquet", store_schema=False)
    pq.write_table(table, folder / "d-dictionaries.parquet", use_dictionary=False)
    assert_same_footers(folder, monkeypatch)


def test_key_value_metadata_field_ids_and_distinct_schemas_mixed(tmp_path, monkeypatch):
    """Files alternate between schemas: equal schemas share one entry, each file points at its own."""
    folder = tmp_path / "d"
    folder.mkdir()
    base = pa.table({"id": pa.array(range(5), pa.int64()), "ts": pa.array(range(5), pa.timestamp("ms", "Asia/Tokyo")),
                     "tags": pa.array([["a"], [], None, ["b", "c"], ["d"]])})
    kinds = [base,
             base.replace_schema_metadata({"owner": "x"}),
             base.replace_schema_metadata({"owner": "y"}),
             base.cast(pa.schema([("id", pa.int32()), ("ts", pa.timestamp("ms", "Asia/Tokyo")),
                                  ("tags", pa.list_(pa.string()))])),
             pa.table({"other": pa.array([1.5, 2.5])}),
             base.cast(pa.schema([pa.field("id", pa.int64(), metadata={"PARQUET:field_id": "7"}), base.schema[1],
                                  base.schema[2]]))]
    for index in range(18):
        pq.write_table(kinds[index * 5 % len(kinds)], folder / f"part-{index:02d}.parquet", row_group_size=2)
    pq.write_table(kinds[1], folder / "part-99.parquet", store_schema=False)
    assert_same_footers(folder, monkeypatch)
    assert len(_read(folder, False, monkeypatch).schemas) == 7


def test_many_runs_of_files_on_threads_join_into_one_table(tmp_path, monkeypatch):
    """150 files in three runs read by two threads, schemas alternating: the runs' tables joined, each
    file's schema index pointing at its own schema."""
    monkeypatch.setattr(planning, "MIN_CORES_FOR_LOCAL_THREADS", 0)
    monkeypatch.setattr(planning.os, "cpu_count", lambda: 2)
    folder = tmp_path / "d"
    folder.mkdir()
    kinds = [pa.table({"id": pa.array([1, 2, 3], pa.int64())}), pa.table({"id": pa.array([1, 2], pa.int32())}),
             pa.table({"x": [1.5]})]
    for index in range(150):
        pq.write_table(kinds[(index // 7) % 3], folder / f"part-{index:03d}.parquet", row_group_size=2)
    assert_same_footers(folder, monkeypatch)


def test_empty_row_groups_a_file_of_no_rows_many_row_groups_and_a_large_file(tmp_path, monkeypatch):
    folder = tmp_path / "d"
    folder.mkdir()
    table = pa.table({"id": pa.array(range(40), pa.int64()), "s": [str(i) for i in range(40)]})
    pq.write_table(table, folder / "a.parquet", row_group_size=3)
    pq.write_table(table.slice(0, 0), folder / "b-no-rows.parquet")
    with pq.ParquetWriter(folder / "c-empty-groups.parquet", table.schema) as writer:
        writer.write_table(table.slice(0, 0))
        writer.write_table(table.slice(0, 5))
        writer.write_table(table.slice(0, 0))
    pq.write_table(table, folder / "d.parquet", row_group_size=1)
    big = pa.table({"id": pa.array(range(150_000), pa.int64())})
    pq.write_table(big, folder / "e-over-the-first-read.parquet", row_group_size=40_000, compression="none")
    assert (folder / "e-over-the-first-read.parquet").stat().st_size > 64 << 10   # the tail read is not the file
    assert pq.ParquetFile(folder / "c-empty-groups.parquet").metadata.num_row_groups >= 2
    assert_same_footers(folder, monkeypatch)


def test_a_footer_larger_than_the_first_read(tmp_path, monkeypatch):
    """Two preads: the tail first (64 KiB), then the whole footer."""
    folder = tmp_path / "d"
    folder.mkdir()
    table = pa.table({f"column_with_a_long_name_{i:05d}": pa.array([i], pa.int64()) for i in range(600)})
    for index in range(3):
        pq.write_table(table, folder / f"part-{index}.parquet")
    path = folder / "part-1.parquet"
    assert struct.unpack("<i", path.read_bytes()[-8:-4])[0] > 64 << 10
    assert_same_footers(folder, monkeypatch)


# -- damaged files among good ones ---------------------------------------------------------------

def _outcome(folder: Path, careful: bool, monkeypatch: pytest.MonkeyPatch) -> object:
    try:
        return _columns(_read(folder, careful, monkeypatch)), _read(folder, careful, monkeypatch).schemas
    except Exception as exc:  # noqa: BLE001 (the error is the outcome compared)
        return type(exc), str(exc)


def _good_folder(folder: Path) -> Path:
    folder.mkdir()
    table = pa.table({"id": pa.array(range(620), pa.int64()), "x": np.arange(620) / 7,
                      "name": [f"n{i}" for i in range(620)]})
    for index in range(6):
        pq.write_table(table, folder / f"part-{index}.parquet", row_group_size=150, compression="none")
    return folder


def _encrypted(path: Path, plaintext_footer: bool) -> bytes:
    """The file's rows written again with column ``x`` encrypted (its bytes; the file is left as it was)."""
    import base64

    import pyarrow.parquet.encryption as pe

    class KeysInTheClear(pe.KmsClient):
        def __init__(self, config):
            super().__init__()

        def wrap_key(self, key_bytes, master_key_identifier):
            return base64.b64encode(key_bytes)

        def unwrap_key(self, wrapped_key, master_key_identifier):
            return base64.b64decode(wrapped_key)

    kms = pe.KmsConnectionConfig(custom_kms_conf={"footer": "0123456789012345", "col": "1234567890123450"})
    config = pe.EncryptionConfiguration(footer_key="footer", column_keys={"col": ["x"]}, double_wrapping=False,
                                        plaintext_footer=plaintext_footer)
    properties = pe.CryptoFactory(KeysInTheClear).file_encryption_properties(kms, config)
    table = pq.read_table(path)
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema, encryption_properties=properties) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def _damages(path: Path) -> list[tuple[str, bytes]]:
    data = path.read_bytes()
    length = struct.unpack("<i", data[-8:-4])[0]
    rng = np.random.default_rng(19)
    footer = [int(p) for p in rng.integers(len(data) - 8 - length, len(data), 40)]
    return [
        *[(f"truncated to {end}", data[:end]) for end in (0, 5, 11, 12, len(data) // 2, len(data) - 1, len(data) - 9)],
        *flipped(data, footer, rng),
        ("bad magic", data[:-4] + b"PAR2"),
        ("footer length past the file", data[:-8] + struct.pack("<i", len(data)) + b"PAR1"),
        ("footer length negative", data[:-8] + struct.pack("<i", -5) + b"PAR1"),
        ("footer length 4 short", data[:-8] + struct.pack("<i", length - 4) + b"PAR1"),
        ("footer length 4 long", data[:-8] + struct.pack("<i", length + 4) + b"PAR1"),
        ("row group 1 of 151 rows", rewrite_parquet_rows(data, {1: 151})),
        ("row group 1 of 149 rows, total 619", rewrite_parquet_rows(data, {1: 149}, 619)),
        ("row group 0 of -2112 rows, total -1642", rewrite_parquet_rows(data, {0: -2112}, -1642)),
        ("a column name not UTF-8", data.replace(b"name", b"n\xffme")),
    ]


def test_damaged_files_end_as_the_careful_way_ends_them(tmp_path, monkeypatch):
    folder = _good_folder(tmp_path / "d")
    victim = folder / "part-3.parquet"
    original = victim.read_bytes()
    cases = _damages(victim)
    cases += [("encrypted footer", _encrypted(victim, False)), ("signed plaintext footer", _encrypted(victim, True))]
    assert cases[-2][1][-4:] == b"PARE" and cases[-1][1][-4:] == b"PAR1"
    errors = 0
    for what, data in cases:
        victim.write_bytes(data)
        short, careful = _outcome(folder, False, monkeypatch), _outcome(folder, True, monkeypatch)
        if isinstance(careful[0], type):
            errors += 1
            assert short == careful, what
            assert "part-3.parquet" in careful[1], what
        else:
            assert short[0] == careful[0], what
            assert all(a.equals(b, check_metadata=True) for a, b in zip(short[1], careful[1], strict=True)), what
        victim.write_bytes(original)
    assert errors > len(cases) // 2


def test_the_short_way_makes_no_footer_object_per_file_and_one_schema_per_kind(tmp_path, monkeypatch):
    """150 files of two schemas: a ``FileFooter`` for the lead file alone, a fragment (the Arrow schema read
    the careful way) for the first file of each schema in a run of files alone; the rest is columns."""
    folder = tmp_path / "d"
    folder.mkdir()
    kinds = [pa.table({"id": pa.array([1, 2, 3], pa.int64())}), pa.table({"id": pa.array([1, 2], pa.int32())})]
    for index in range(150):
        pq.write_table(kinds[index % 7 == 3], folder / f"part-{index:03d}.parquet")
    footers, fragments = [], []
    made = FileFooter.__init__
    monkeypatch.setattr(FileFooter, "__init__", lambda self, *a, **k: (footers.append(1), made(self, *a, **k))[1])
    original = parquet._FRAGMENTS

    class Counted:
        def make_fragment(self, *args, **kwargs):
            fragments.append(1)
            return original.make_fragment(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(original, name)

    monkeypatch.setattr(parquet, "_FRAGMENTS", Counted())
    table = _read(folder, False, monkeypatch)
    assert len(table) == 150 and len(table.schemas) == 2
    assert len(footers) == 1   # the lead's (read_footer); none for the others
    runs = -(-150 // planning._FILES_PER_CHUNK)   # each run of files (a task) knows its own schemas
    assert runs == 3 and len(fragments) == 1 + 2 * runs   # the lead's (inspect), then one per schema and run
