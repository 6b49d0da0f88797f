"""The reader contract: one suite that every format passes (Parquet, ORC, Arrow IPC, CSV and JSON
Lines here; Iceberg in tests/test_iceberg.py subclasses it).

A format subclass says how to write a table into files of many units (row groups, stripes,
record batches), how its own reader reads a file back, and how to build a loader on what it
wrote. The contract: units come from metadata and cover every row; every row is yielded exactly
once per epoch, with workers, shuffles and interleave; a state taken mid-unit resumes exactly;
projection and filters give what the format's own reader gives; an empty file is no split, an
empty dataset and a corrupt file are clear errors that name the file; a unit that yields other than
its metadata announced is a ``CorruptFileError`` naming the file and the unit, also when a resume
starts inside it, when it is cut into row ranges and under a filter.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import pytest
from helpers import check_exactly_once, check_resume, json_roundtrip, make_loader, make_table
from pyarrow import ipc, orc

from arrowstream import StructuredDataset, errors
from arrowstream._formats import FILE_FORMATS, FileFormat, UnitFormat, get_format, unit_format
from arrowstream._planning import plan as _planning
from arrowstream._tools.bench import raw_batches

ROWS_PER_FILE = [700, 1, 1300, 450]   # uneven files, one of a single row
UNIT_ROWS = 150                       # rows per row group / stripe / record batch


def table_of(start: int, rows: int) -> pa.Table:
    """The contract's table: every column type the formats share (ORC has no fixed-size lists)."""
    schema = make_table(0, 1).drop_columns(["vec"]).schema
    return make_table(start, rows).drop_columns(["vec"]).cast(schema)


def arrow_batches(loader: Any, dataset: Any, epoch: int = 0) -> pa.Table:
    dataset.set_epoch(epoch)
    return pa.Table.from_batches(list(loader))


class ReaderContract:
    """What every format passes. Subclasses set ``format`` and the hooks below."""

    format: ClassVar[str]
    unit_named: ClassVar[str]   # how the row-count error names a unit (a regex)
    resumed_unit: ClassVar[int] = 0   # the unit a state 64 rows in resumes inside (when it miscounts)

    # -- hooks ---------------------------------------------------------------------------------

    def write_file(self, path: Path, table: pa.Table, unit_rows: int) -> None:
        raise NotImplementedError

    def read_file(self, path: Path) -> pa.Table:
        """The file as the format's own pyarrow reader returns it."""
        raise NotImplementedError

    def source(self, tmp_path: Path, tables: list[pa.Table], unit_rows: int = UNIT_ROWS) -> Any:
        """Write ``tables`` (one file each) and return what the factory reads."""
        folder = tmp_path / "data"
        folder.mkdir()
        for index, table in enumerate(tables):
            self.write_file(folder / f"part-{index:03d}.{self.format}", table, unit_rows)
        return str(folder)

    def factory(self, source: Any, num_workers: int, **options: Any) -> tuple[Any, Any]:
        return make_loader(source, num_workers, format=self.format, **options)

    def expected(self, source: Any) -> pa.Table:
        """Every row of the source, as its own reader returns them."""
        files = sorted(Path(source).iterdir())
        return pa.concat_tables([self.read_file(f) for f in files])

    def filter_options(self, columns: list[str]) -> dict[str, Any]:
        """Options that select ``columns`` of the rows where ``label == 3 or x > 1.0``."""
        return {"columns": columns, "filter": (pc.field("label") == 3) | (pc.field("x") > 1.0)}

    def announce(self, monkeypatch: pytest.MonkeyPatch, file_rows: int, unit: int, delta: int) -> list[str]:
        """Make planning believe that ``unit`` of the file of ``file_rows`` rows holds ``delta`` rows more than
        it does, as a corrupt footer would (the fault injected in the metadata read; the reader then reads the
        real file). Returns a list that will hold the file's name."""
        read_footer, lied = _planning.read_footer, []

        def lying(storage, file_format, entry, *args):
            footer = read_footer(storage, file_format, entry, *args)
            if sum(footer.unit_rows) != file_rows:
                return footer
            lied.append(Path(entry.path).name)
            rows = list(footer.unit_rows)
            rows[unit] += delta
            return dataclasses.replace(footer, unit_rows=tuple(rows))

        monkeypatch.setattr(_planning, "read_footer", lying)
        monkeypatch.setattr(_planning, "_read_local", lambda *args: None)   # local files too: the careful read
        if "arrowstream._sources.iceberg_files" in sys.modules:   # Iceberg reads its data files' metadata through it
            monkeypatch.setattr(sys.modules["arrowstream._sources.iceberg_files"], "read_footer", lying)
        return lied

    def corrupt(self, source: Any) -> str:
        """Break one data file of ``source``; return the name an error must mention."""
        victim = min(Path(source).iterdir())
        victim.write_bytes(b"this is not a data file at all, " * 8)
        return victim.name

    # -- the contract --------------------------------------------------------------------------

    @pytest.fixture
    def data(self, tmp_path):
        tables, start = [], 0
        for rows in ROWS_PER_FILE:
            tables.append(table_of(start, rows))
            start += rows
        return self.source(tmp_path, tables)

    def test_units_come_from_metadata_and_cover_every_row(self, data):
        _, dataset = self.factory(data, 0, batch_size=100)
        plan = dataset._plan
        assert plan.num_rows == sum(ROWS_PER_FILE)
        assert sorted(sum(f.unit_rows) for f in plan.files) == sorted(ROWS_PER_FILE)
        assert max(max(f.unit_rows) for f in plan.files) <= UNIT_ROWS
        assert len(plan.splits) == sum(-(-rows // UNIT_ROWS) for rows in ROWS_PER_FILE)
        assert dataset.num_batches() == -(-sum(ROWS_PER_FILE) // 100)

    def test_values_equal_the_formats_own_reader(self, data):
        loader, dataset = self.factory(data, 0, batch_size=128, output_format="arrow")
        got = arrow_batches(loader, dataset)
        expected = self.expected(data)
        assert got.num_rows == expected.num_rows
        assert got.sort_by("id").equals(expected.sort_by("id"))

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_exactly_once_and_exact_resume_mid_unit(self, data, num_workers):
        # batches of 64 rows end inside units of 150; a shuffle buffer and interleave mix units
        options = {"batch_size": 64, "shuffle": True, "seed": 5, "shuffle_buffer_size": 200, "interleave": 2}

        def rows_of_epoch(batches, dataset):
            check_exactly_once(batches, sum(ROWS_PER_FILE))

        check_resume(data, num_workers, options, rows_of_epoch, mid=5, factory=self.factory)

    def test_splits_spread_over_workers(self, data):
        _, dataset = self.factory(data, 2, batch_size=64)
        rows = dataset.slot_rows(2)
        assert sum(rows) == sum(ROWS_PER_FILE) and min(rows) > 0

    def test_one_unit_is_cut_into_row_ranges_for_three_workers(self, tmp_path):
        source = self.source(tmp_path, [table_of(0, 100)], unit_rows=100)
        loader, dataset = self.factory(source, 3, batch_size=16)
        rows = dataset.slot_rows(3)
        assert sum(rows) == 100 and min(rows) > 0     # every worker reads part of the one unit
        dataset.set_epoch(0)
        ids = [i for batch in loader for i in batch["id"].tolist()]
        assert sorted(ids) == list(range(100))

    def test_projection(self, data):
        loader, dataset = self.factory(data, 0, batch_size=100, columns=["name", "id"], output_format="arrow")
        got = arrow_batches(loader, dataset)
        assert got.column_names == ["name", "id"]
        assert got.sort_by("id").equals(self.expected(data).select(["name", "id"]).sort_by("id"))

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_filter_with_resume(self, data, num_workers):
        filter = (pc.field("label") == 3) | (pc.field("x") > 1.0)
        expected = self.expected(data).filter(filter).select(["id", "x"])
        options = {"batch_size": 32, "shuffle": True, "seed": 1, **self.filter_options(["id", "x"])}
        loader, dataset = self.factory(data, num_workers, output_format="arrow", **options)
        got = arrow_batches(loader, dataset)
        assert got.column_names == ["id", "x"]
        assert got.sort_by("id").equals(expected.sort_by("id"))

        def rows_of_epoch(batches, dataset):
            for epoch in {e for e, _, _ in batches}:
                ids = sorted(i for e, _, batch_ids in batches if e == epoch for i in batch_ids)
                assert ids == sorted(expected.column("id").to_pylist())

        check_resume(data, num_workers, options, rows_of_epoch, mid=3, factory=self.factory)

    def test_empty_file_is_no_split(self, tmp_path):
        source = self.source(tmp_path, [table_of(0, 300), table_of(300, 0), table_of(300, 200)])
        loader, dataset = self.factory(source, 0, batch_size=100)
        assert dataset.num_rows == 500
        assert sorted(i for batch in loader for i in batch["id"].tolist()) == list(range(500))

    def test_only_empty_files_is_a_clear_error(self, tmp_path):
        source = self.source(tmp_path, [table_of(0, 0)])
        with pytest.raises(errors.EmptyDatasetError, match="no rows"):
            self.factory(source, 0)

    def test_corrupt_file_is_named(self, data):
        name = self.corrupt(data)
        with pytest.raises(errors.CorruptFileError, match=name) as info:
            self.factory(data, 0)
        assert isinstance(info.value, ValueError)

    @pytest.mark.parametrize("delta", [1, -1])   # the unit holds one row less / more than announced
    def test_a_unit_that_yields_other_than_announced_is_named(self, data, monkeypatch, delta):
        lied = self.announce(monkeypatch, 1300, -1, delta)
        loader, dataset = self.factory(data, 0, batch_size=64)
        assert dataset.num_rows == sum(ROWS_PER_FILE) + delta
        with pytest.raises(errors.CorruptFileError, match=rf"{lied[0]}: .*{self.unit_named}"):
            list(loader)

    def test_row_count_check_holds_after_a_resume_inside_the_unit(self, data, monkeypatch):
        lied = self.announce(monkeypatch, 700, self.resumed_unit, 1)
        loader, dataset = self.factory(data, 0, batch_size=64)
        dataset.set_epoch(0)
        next(iter(loader))
        state = json_roundtrip(loader.state_dict())     # 64 rows into the first unit of 150
        loader, dataset = self.factory(data, 0, batch_size=64)
        loader.load_state_dict(state)
        dataset.set_epoch(0)
        with pytest.raises(errors.CorruptFileError, match=rf"{lied[0]}: .*{self.unit_named}"):
            list(loader)

    @pytest.mark.parametrize(("delta", "filtered"), [(1, False), (-1, True)])
    def test_row_count_check_holds_for_row_ranges_and_filters(self, tmp_path, monkeypatch, delta, filtered):
        source = self.source(tmp_path, [table_of(0, 100)], unit_rows=100)
        lied = self.announce(monkeypatch, 100, 0, delta)
        options = self.filter_options(["id", "x"]) if filtered else {}
        failures = []
        for rank in range(3):   # the one unit is cut into row ranges, read by 3 ranks
            loader, dataset = self.factory(source, 0, batch_size=16, rank=rank, world_size=3, even_batches=False,
                                           **options)
            assert all(split.num_rows < 50 for split in dataset._plan.splits_for(3))
            dataset.set_epoch(0)
            try:
                list(loader)
            except errors.CorruptFileError as exc:
                failures.append(str(exc))
        # at least the last range's reader fails (text formats parse a unit whole: every range's reader)
        assert failures and all(re.search(rf"{lied[0]}: .*{self.unit_named}", f) for f in failures), failures


class FileFormatContract(ReaderContract):
    """File formats also check that files agree on their schema."""

    def test_the_bench_raw_loop_reads_every_row_through_the_formats_own_reader(self, data):
        # `arrowstream bench` asks the format for its baseline_batches, never dispatches on its name
        _, dataset = self.factory(data, 0, batch_size=100)
        batches = list(raw_batches(dataset, 64))
        assert max(batch.num_rows for batch in batches) == 64
        ids = pa.Table.from_batches(batches).column("id").to_pylist()
        assert sorted(ids) == list(range(sum(ROWS_PER_FILE)))

    def test_schemas_that_disagree_are_refused(self, tmp_path):
        other = table_of(100, 100).cast(table_of(0, 1).schema.set(0, pa.field("id", pa.float64())))
        source = self.source(tmp_path, [table_of(0, 100), other])
        with pytest.raises(errors.SchemaMismatchError, match="part-001"):
            self.factory(source, 0, columns=["id"])


class TestParquet(FileFormatContract):
    format = "parquet"
    unit_named = r"row groups? \d"

    def write_file(self, path, table, unit_rows):
        pq.write_table(table, path, row_group_size=unit_rows)

    def read_file(self, path):
        return pq.read_table(path)


class TestOrc(FileFormatContract):
    format = "orc"
    unit_named = r"stripes? \d"

    def write_file(self, path, table, unit_rows):
        # a stripe closes after each write batch once it passes stripe_size: one stripe per batch
        orc.write_table(table, path, stripe_size=1, batch_size=unit_rows)

    def read_file(self, path):
        return orc.read_table(path)


class TestArrowIpc(FileFormatContract):
    format = "arrow"
    unit_named = r"record batch(es)? \d"

    def write_file(self, path, table, unit_rows):
        with ipc.new_file(path, table.schema) as writer:
            writer.write_table(table, max_chunksize=unit_rows)

    def read_file(self, path):
        with pa.memory_map(str(path)) as source:
            return ipc.open_file(source).read_all()


class TextContract(FileFormatContract):
    """CSV and JSON Lines: units are stretches of bytes found by the planning scan, not metadata, so
    a unit holds the rows that start in ``split_bytes`` of text (``unit_rows`` sets it from the rows'
    average size). A broken file fails when its rows are read, naming the line."""

    unit_named = r"bytes \[\d+, \d+\)"
    resumed_unit = 1   # a unit is parsed whole before a row is handed out: a miscounted first unit fails at once

    def factory(self, source: Any, num_workers: int, **options: Any) -> tuple[Any, Any]:
        options.setdefault("split_bytes", self._unit_bytes)
        return make_loader(source, num_workers, format=self.format, **options)

    def source(self, tmp_path: Path, tables: list[pa.Table], unit_rows: int = UNIT_ROWS) -> Any:
        folder = super().source(tmp_path, tables, unit_rows)
        written = [(f.stat().st_size, self.read_file(f).num_rows) for f in Path(folder).iterdir() if f.stat().st_size]
        size, rows = max(written, key=lambda w: w[1], default=(1, 1))
        self._unit_bytes = max(size * unit_rows // max(rows, 1), 1)
        return folder

    def test_units_come_from_metadata_and_cover_every_row(self, data):
        _, dataset = self.factory(data, 0, batch_size=100)
        plan = dataset._plan
        assert plan.num_rows == sum(ROWS_PER_FILE)
        assert sorted(sum(f.unit_rows) for f in plan.files) == sorted(ROWS_PER_FILE)
        for footer in plan.files:   # byte ranges tile the data and each holds about unit_bytes
            ranges = footer.extra.ranges
            assert all(end == start for (_, end), (start, _) in itertools.pairwise(ranges))
            assert all(abs(size - self._unit_bytes) < 200 for size in footer.unit_bytes[:-1])
        assert len(plan.splits) == sum(len(f.unit_rows) for f in plan.files)
        assert dataset.num_batches() == -(-sum(ROWS_PER_FILE) // 100)

    def corrupt(self, source: Any, row: int = -3) -> str:
        victim = max(Path(source).iterdir(), key=lambda f: f.stat().st_size)
        lines = victim.read_bytes().splitlines(keepends=True)
        lines[row] = self.bad_row
        victim.write_bytes(b"".join(lines))
        return rf"{victim.name}: line {row % len(lines) + 1} \(byte {sum(map(len, lines[:row]))}\)"

    @pytest.mark.parametrize("row", [-3, 2])   # met when read, or by the type inference at planning
    def test_corrupt_file_is_named(self, data, row):
        where = self.corrupt(data, row)
        with pytest.raises(errors.MalformedRowError, match=where) as info:
            loader, _ = self.factory(data, 0)
            list(loader)
        assert isinstance(info.value, errors.CorruptFileError) and isinstance(info.value, ValueError)
        assert "bad_rows" in str(info.value)

    def test_schemas_that_disagree_are_refused(self, tmp_path):
        other = table_of(100, 100).set_column(0, "id", pa.array([f"id-{i}" for i in range(100)]))
        source = self.source(tmp_path, [table_of(0, 100), other])
        with pytest.raises(errors.SchemaMismatchError, match="part-001.*column_types"):
            self.factory(source, 0, columns=["id"])


class TestCsv(TextContract):
    format = "csv"
    bad_row = b"1,2,3\n"

    def write_file(self, path, table, unit_rows):
        pa_csv.write_csv(table, path)

    def read_file(self, path):
        return pa_csv.read_csv(path)


class TestJsonLines(TextContract):
    format = "jsonl"
    bad_row = b'{"id": 5, "x": \n'

    def write_file(self, path, table, unit_rows):
        with open(path, "w") as out:
            out.writelines(json.dumps(row) + "\n" for row in table.to_pylist())

    def read_file(self, path):
        return pa_json.read_json(path)


# -- the protocol ------------------------------------------------------------------------------


def _members(protocol: type) -> set[str]:
    """The attributes and methods a protocol asks for, its bases' included."""
    members: set[str] = set()
    for cls in protocol.__mro__:
        if cls is not object and cls.__name__ not in ("Protocol", "Generic"):
            members.update(inspect.get_annotations(cls))
            members.update(name for name, value in vars(cls).items() if callable(value) and not name.startswith("_"))
    return members


def test_every_format_answers_the_whole_protocol_it_is_registered_for():
    import arrowstream._sources.iceberg_files  # noqa: F401 (registers the format of Iceberg data files)

    assert {"units", "row_ok_column", "open", "byte_ranges"} <= _members(UnitFormat)
    assert {"configured", "inspect", "reconcile", "baseline_batches"} <= _members(FileFormat) - _members(UnitFormat)
    for name, file_format in FILE_FORMATS.items():   # planned file by file: everything planning and bench ask
        missing = [m for m in _members(FileFormat) if not hasattr(file_format, m)]
        assert not missing, f"{name} lacks {missing}"
    assert get_format("csv").row_ok_column is not None and get_format("parquet").row_ok_column is None
    iceberg = unit_format("iceberg")   # read like any format, planned from the table's scan: no inspect to refuse
    assert all(hasattr(iceberg, m) for m in _members(UnitFormat)) and not hasattr(iceberg, "inspect")
    with pytest.raises(KeyError):
        get_format("iceberg")


# -- format specifics --------------------------------------------------------------------------

def test_orc_file_of_many_stripes_over_two_workers_resumes_mid_stripe(tmp_path):
    """One ORC file, 40 stripes of 250 rows, read by 2 workers; states inside stripes resume exactly."""
    path = tmp_path / "one.orc"
    orc.write_table(table_of(0, 10_000), path, stripe_size=1, batch_size=250)
    _, dataset = make_loader(str(path), 2, format="orc", batch_size=100)
    assert len(dataset._plan.splits) == 40
    assert dataset.slot_rows(2) == [5_000, 5_000]
    options = {"format": "orc", "batch_size": 96, "shuffle": True, "seed": 2}   # 96 does not divide 250

    def rows_of_epoch(batches, dataset):
        check_exactly_once(batches, 10_000)

    check_resume(str(path), 2, options, rows_of_epoch, mid=7)


def test_orc_stripe_list_matches_pyarrow_for_every_compression(tmp_path):
    from arrowstream._formats.orc import stripe_sizes

    for compression in ("uncompressed", "zlib", "snappy", "zstd", "lz4"):
        path = tmp_path / f"{compression}.orc"
        orc.write_table(table_of(0, 5_000), path, stripe_size=1, batch_size=700, compression=compression)
        reader = orc.ORCFile(path)
        stripes = stripe_sizes(reader.reader.serialized_file_tail())
        assert [rows for rows, _ in stripes] == [reader.read_stripe(i).num_rows for i in range(reader.nstripes)]
        assert sum(size for _, size in stripes) <= os.path.getsize(path)


def test_ipc_batches_are_planned_without_reading_column_data(tmp_path):
    """Planning reads the footer and the message headers: a small fraction of the file."""
    from arrowstream._formats.ipc import batch_sizes

    path = tmp_path / "big.arrow"
    table = table_of(0, 200_000)
    with ipc.new_file(path, table.schema) as writer:
        writer.write_table(table, max_chunksize=7_000)

    with open(path, "rb") as raw:
        read = 0
        original = raw.read

        def counted(size=-1):
            nonlocal read
            data = original(size)
            read += len(data)
            return data

        raw.read = counted  # type: ignore[method-assign]
        sizes = batch_sizes(pa.PythonFile(raw, mode="r"))
    assert [rows for rows, _ in sizes] == [b.num_rows for b in table.to_batches(max_chunksize=7_000)]
    assert read < os.path.getsize(path) / 100


def test_ipc_stream_format_is_refused_clearly(tmp_path):
    path = tmp_path / "stream.arrow"
    table = table_of(0, 10)
    with ipc.new_stream(path, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(errors.CorruptFileError, match=r"stream\.arrow.*IPC \*stream\*.*ipc\.new_file"):
        StructuredDataset(str(path), format="arrow")


def test_ipc_stream_without_continuation_markers_gets_the_stream_message(tmp_path):
    """Pre-1.0 writers wrote streams without the 0xFFFFFFFF marker: told apart from a corrupt file."""
    path = tmp_path / "legacy.arrow"
    table = table_of(0, 10)
    with ipc.new_stream(path, table.schema, options=ipc.IpcWriteOptions(use_legacy_format=True)) as writer:
        writer.write_table(table)
    assert path.read_bytes()[:4] != b"\xff\xff\xff\xff"
    with pytest.raises(errors.CorruptFileError, match=r"legacy\.arrow: is an Arrow IPC \*stream\*.*ipc\.new_file"):
        StructuredDataset(str(path), format="arrow")


@pytest.mark.parametrize("plaintext_footer", [False, True])
def test_encrypted_parquet_says_it_is_encrypted(tmp_path, plaintext_footer):
    """Parquet modular encryption: an encrypted footer fails at planning; with a plaintext footer, the
    plaintext columns read and an encrypted one fails when read."""
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
    path = tmp_path / "secret.parquet"
    table = table_of(0, 10)
    with pq.ParquetWriter(path, table.schema, encryption_properties=properties) as writer:
        writer.write_table(table)
    assert path.read_bytes()[-4:] == (b"PAR1" if plaintext_footer else b"PARE")
    encrypted = r"secret\.parquet: is an encrypted Parquet file .* does not support.*decrypt"
    if plaintext_footer:
        assert [int(i) for b in StructuredDataset(str(path), columns=["id"]) for i in b["id"]] == list(range(10))
        # its footer is signed: planning keeps no handle of it (pyarrow aborts the process when an encrypted
        # column's metadata is touched, as when the plan cache serializes the footer), on the short way of
        # local files and on the careful one (a filter)
        for options in ({}, {"filter": pc.field("id") >= 0}):
            for cache in (False, None):   # planned, then stored in and loaded from the cache
                dataset = StructuredDataset(str(path), columns=["id"], plan_cache=cache, **options)
                assert dataset._plan.files[0].handle is None
                assert [int(i) for b in dataset for i in b["id"]] == list(range(10))
    with pytest.raises(errors.CorruptFileError, match=encrypted):
        list(StructuredDataset(str(path), columns=["id", "x"]))


def test_ipc_batches_of_a_local_file_point_into_the_memory_map(tmp_path):
    """Reading a projected local IPC file allocates no copy of the column data."""
    path = tmp_path / "mapped.arrow"
    table = table_of(0, 100_000).select(["id", "x", "label"])
    with ipc.new_file(path, table.schema) as writer:
        writer.write_table(table, max_chunksize=25_000)
    dataset = StructuredDataset(str(path), format="arrow", batch_size=25_000, columns=["x", "id"],
                                output_format="arrow")
    before = pa.total_allocated_bytes()
    batches = list(dataset)
    assert sum(b.num_rows for b in batches) == 100_000 and batches[0].column_names == ["x", "id"]
    assert pa.total_allocated_bytes() - before < 100_000    # the rows themselves are 1.2 MB
