"""The compact plan (issue #19 point 1): splits and files as columns, the same splits, fingerprints and
errors as the per-object plan they replace, bounded memory and pickles, a million units in seconds."""

from __future__ import annotations

import gc
import pickle
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_table
from hypothesis import given, settings
from hypothesis import strategies as st
from pyarrow import feather, orc

from arrowstream import StructuredDataset
from arrowstream._core.hashing import fingerprint
from arrowstream._core.plan_types import FileEntry, Split, SplitTable
from arrowstream._formats import FileFooter, get_format
from arrowstream._formats.footers import FooterTable, files_fingerprint
from arrowstream._planning.cutting import base_splits
from arrowstream._planning.discovery import discover_files
from arrowstream._planning.plan import build_plan, read_footer
from arrowstream.errors import SchemaMismatchError

SCHEMA = pa.schema([("id", pa.int64())])

split_values = st.builds(Split, st.integers(0, 10**6), st.integers(0, 50), st.integers(0, 50),
                         st.integers(0, 10**6), st.integers(0, 10**9), st.integers(0, 2**40))


@settings(max_examples=60)
@given(st.lists(split_values, max_size=30), st.data())
def test_split_table_reads_as_the_list_it_replaces(splits, data):
    table = SplitTable.from_splits(splits)
    assert len(table) == len(splits) and list(table) == splits and table == splits and splits == table
    if splits:
        index = data.draw(st.integers(-len(splits), len(splits) - 1))
        assert table[index] == splits[index]
        assert isinstance(table[index].num_rows, int)   # plain ints: JSON states and arithmetic as before
    start, stop, step = (data.draw(st.integers(-35, 35) | st.none()) for _ in range(3))
    step = step or 1
    assert list(table[start:stop:step]) == splits[start:stop:step]
    picks = data.draw(st.lists(st.integers(0, max(len(splits) - 1, 0)), max_size=10)) if splits else []
    assert list(table.take(picks)) == [splits[i] for i in picks]
    assert pickle.loads(pickle.dumps(table)) == table
    with pytest.raises(IndexError):
        table[len(splits)]


def _old_base_splits(footers, split_bytes):
    """The per-object planning of earlier releases (``_runs`` and ``base_splits``), the reference."""
    splits = []
    for file_index, footer in enumerate(footers):
        runs, run_bytes = [], 0
        for rg in footer.kept_units:
            if footer.unit_rows[rg] == 0:
                continue
            size = footer.unit_bytes[rg]
            if split_bytes is not None and runs and runs[-1][-1] == rg - 1 and run_bytes + size <= split_bytes:
                runs[-1].append(rg)
                run_bytes += size
            else:
                runs.append([rg])
                run_bytes = size
        for run in runs:
            splits.append(Split(file_index, run[0], run[-1] + 1, 0, sum(footer.unit_rows[i] for i in run),
                                sum(footer.unit_bytes[i] for i in run)))
    return splits


@st.composite
def footers_of(draw):
    footers = []
    for index in range(draw(st.integers(1, 5))):
        rows = draw(st.lists(st.integers(0, 30), max_size=6))
        sizes = [draw(st.integers(0, 400)) for _ in rows]
        kept = sorted(draw(st.sets(st.integers(0, max(len(rows) - 1, 0)), max_size=len(rows)))) if rows else []
        # names and tags as JSON writes them plainly, or with escapes (quotes, backslashes, control, non-ASCII)
        name = draw(st.sampled_from([f"f{index}", f"a/b-{index}.parquet"]) | st.text(max_size=6))
        tag = draw(st.sampled_from([f"mtime={index}.25", 'ETag="0x8D"', ""]) | st.text(max_size=4))
        footers.append(FileFooter(FileEntry(f"/d/f{index}", name, draw(st.integers(0, 2**62)), tag), "parquet",
                                  SCHEMA, tuple(rows), tuple(sizes), tuple(kept)))
    return footers


@settings(max_examples=150)
@given(footers_of(), st.none() | st.integers(0, 1000))
def test_base_splits_are_those_of_the_per_object_planning(footers, split_bytes):
    assert list(base_splits(footers, split_bytes)) == _old_base_splits(footers, split_bytes)


IDENTITIES = [{}, {"schema": [["id", "int64"], ["name", "string"]]},
              {"table": "5f0c\u00e9", "snapshot_id": 7, "schema_id": 0, "schema": [["a\"b", "int32"]]},
              {"zzz": None, "aaa": {"nested": [1, 2.5, True]}}]


@settings(max_examples=60)
@given(footers_of(), st.sampled_from(IDENTITIES), st.sampled_from([1, 2, 4096]))
def test_files_fingerprint_is_the_digest_of_the_whole_json(footers, identity, chunk):
    from arrowstream._formats import footers as footers_module

    footers_module._FINGERPRINT_CHUNK, default = chunk, footers_module._FINGERPRINT_CHUNK   # chunk borders inside the files
    try:
        new = files_fingerprint(FooterTable.build(footers), identity)
    finally:
        footers_module._FINGERPRINT_CHUNK = default
    old = fingerprint({"files": [[f.entry.name, f.entry.size, f.entry.tag, list(f.unit_rows)] for f in footers],
                       **identity})
    assert new == old


def _write(folder, fmt, index, table):
    path = folder / f"part-{index}.{fmt}"
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=7)
    elif fmt == "arrow":
        feather.write_feather(table, path, chunksize=7)
    elif fmt == "orc":
        orc.write_table(table, path, stripe_size=64)
    elif fmt == "csv":
        path.write_text("id,x\n" + "".join(f"{i},{i * 0.5}\n" for i in table["id"].to_pylist()))
    else:
        path.write_text("".join(f'{{"id": {i}, "x": "{i}"}}\n' for i in table["id"].to_pylist()))


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "orc", "csv", "jsonl"])
def test_fingerprint_is_the_one_earlier_releases_computed(tmp_path, fmt):
    """The digest of checkpoints taken before the compact plan: footers read one by one, JSON of every unit."""
    folder = tmp_path / fmt
    folder.mkdir()
    for index, rows in enumerate([20, 0, 33, 5]):
        _write(folder, fmt, index, make_table(index * 100, rows).select(["id"]))
    dataset = StructuredDataset(str(folder), format=fmt, batch_size=4)
    storage, entries = discover_files(str(folder), None)
    file_format = get_format(fmt)
    footers = file_format.reconcile([read_footer(storage, file_format, e, None, []) for e in entries], "file")
    reference = next(f for f in footers if any(f.unit_rows)).schema
    old = fingerprint({"files": [[f.entry.name, f.entry.size, f.entry.tag, list(f.unit_rows)] for f in footers],
                       "schema": [[fld.name, str(fld.type)] for fld in reference]})
    assert dataset._plan.data_fingerprint == old
    assert [list(f.unit_rows) for f in dataset._plan.files] == [list(f.unit_rows) for f in footers]


def test_schema_mismatch_names_the_first_file_that_differs(tmp_path):
    """Schemas are compared once per distinct schema: the error still names the first file in order."""
    folder = tmp_path / "d"
    folder.mkdir()
    types = [pa.int64(), pa.int64(), pa.int64(), pa.int32(), pa.int64(), pa.float64(), pa.int32()]
    for index, kind in enumerate(types):
        pq.write_table(pa.table({"id": pa.array(range(5), kind)}), folder / f"part-{index}.parquet")
    with pytest.raises(SchemaMismatchError, match=r"column 'id' is int32 in .*part-3.parquet but int64 in "
                                                  r".*part-0.parquet"):
        StructuredDataset(str(folder))


def test_equal_schemas_are_one_object(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    for index in range(5):
        pq.write_table(make_table(index * 10, 10), folder / f"part-{index}.parquet")
    files = StructuredDataset(str(folder))._plan.files
    assert len(files.schemas) == 1 and files[0].schema is files[4].schema


def _synthetic_footers(num_files, units_per_file):
    rows = tuple(range(100, 100 + units_per_file))
    sizes = tuple(range(10_000, 10_000 + units_per_file))
    kept = tuple(range(units_per_file))
    for index in range(num_files):
        yield FileFooter(FileEntry(f"/data/part-{index:07d}.parquet", f"part-{index:07d}.parquet", 123_456 + index,
                                   f"mtime=1764000000.{index}", f"1764000000.{index}"), "parquet", SCHEMA,
                         rows, sizes, kept)


def _held_bytes(build):
    """Bytes ``build()``'s result holds: Python objects (tracemalloc) and Arrow buffers (its memory pool)."""
    gc.collect()
    arrow_before = pa.total_allocated_bytes()
    tracemalloc.start()
    try:
        result = build()
        gc.collect()
        python_bytes = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return result, python_bytes + pa.total_allocated_bytes() - arrow_before


def test_plan_memory_per_unit_is_bounded():
    """50,000 units, 2 a file (the issue's shape): at most 300 bytes a unit beyond the file names (issue #19:
    30 MB per 100,000 units; ~125 measured); the per-object plan held ~1.9 KB a row group."""
    num_files, units = 25_000, 2
    footers = list(_synthetic_footers(num_files, units))   # made before tracing: only the plan is measured
    plan, held = _held_bytes(lambda: build_plan("file", footers, SCHEMA, ["id"], None, None, identity={}))
    names = sum(len(f"/data/part-{i:07d}.parquet") + len(f"part-{i:07d}.parquet") for i in range(num_files))
    assert len(plan.splits) == num_files * units
    assert (held - names) / (num_files * units) < 300


def test_plan_pickles_as_a_few_buffers():
    """What workers receive: a few out-of-band buffers (protocol 5), a small in-band part, no object per split."""
    plan = build_plan("file", _synthetic_footers(20_000, 5), SCHEMA, ["id"], None, None, identity={})
    buffers = []
    data = pickle.dumps(plan, protocol=5, buffer_callback=buffers.append)
    assert len(data) < 20_000 and len(buffers) < 40
    assert (len(data) + sum(len(b.raw()) for b in buffers)) / len(plan.splits) < 150
    copy = pickle.loads(pickle.dumps(plan))
    assert copy.splits == plan.splits and copy.files[19_999] == plan.files[19_999]
    assert copy.data_fingerprint == plan.data_fingerprint


def test_a_million_units_plan_is_columns_that_pickle_as_buffers():
    """Its speed is measured by benchmarks/bench_planning.py (a timed test fails on a busy machine); here,
    that a plan of a million units is columns and pickles as a few buffers, not an object per unit."""
    plan = build_plan("file", _synthetic_footers(50_000, 20), SCHEMA, ["id"], None, None, identity={})
    assert len(plan.splits) == 1_000_000 and plan.num_rows == 50_000 * sum(range(100, 120))
    assert plan.splits[-1] == Split(49_999, 19, 20, 0, 119, 10_019)
    assert isinstance(plan.splits, SplitTable) and all(isinstance(getattr(plan.splits, c), np.ndarray)
                                                       for c in ("file_index", "row_start", "num_rows"))
    payload = pickle.dumps(plan)
    assert len(payload) < 1_000_000 * 100   # the split and unit columns as int64 buffers, the names once
    copy = pickle.loads(payload)
    assert np.array_equal(copy.splits.num_rows, plan.splits.num_rows) and copy.splits[-1] == plan.splits[-1]


def test_handles_are_kept_within_the_budget(tmp_path, monkeypatch):
    """Parquet FileMetaData handles stay with a small dataset, are dropped past the budget; either way the
    rows read are the same."""
    from arrowstream._formats import footers as footers_module

    folder = tmp_path / "d"
    folder.mkdir()
    for index in range(4):
        pq.write_table(make_table(index * 10, 10), folder / f"part-{index}.parquet", row_group_size=5)
    kept = StructuredDataset(str(folder), batch_size=7, output_format="arrow")
    assert len(kept._plan.files.handles) == 4 and kept._plan.files[2].handle is not None
    monkeypatch.setattr(footers_module, "LOCAL_HANDLE_BUDGET", 100)
    dropped = StructuredDataset(str(folder), batch_size=7, output_format="arrow")
    assert not dropped._plan.files.handles and dropped._plan.files[2].handle is None
    rows = [pa.Table.from_batches(list(d)).column("id").to_pylist() for d in (kept, dropped)]
    assert rows[0] == rows[1] == list(range(40))
    assert np.array_equal(kept._plan.files.unit_rows, dropped._plan.files.unit_rows)
