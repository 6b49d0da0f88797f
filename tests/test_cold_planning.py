"""The short way of reading local footers (``_planning._read_local``): the same footers as the careful
way, and every check of the careful way still made, for a file anywhere in a large folder."""

from __future__ import annotations

import os
import posixpath
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowstream._planning.plan as planning
from arrowstream import errors
from arrowstream._core.plan_types import FileEntry
from arrowstream._formats import get_format
from arrowstream._planning.discovery import _relative, discover_files
from arrowstream._storage.filesystem import Storage
from arrowstream._storage.pinned import local_version, version_of

NUM_FILES = 150   # over two chunks of _FILES_PER_CHUNK: read in three chunks


def _write_folder(folder, num_files=NUM_FILES):
    folder.mkdir()
    for index in range(num_files):
        rows = 0 if index == 7 else 3 + index % 5
        table = pa.table({"id": pa.array(range(rows), pa.int64()), "name": pa.array([str(i) for i in range(rows)], pa.string())})
        pq.write_table(table, folder / f"part-{index:03d}.parquet", row_group_size=2)
    return folder


def _plan(folder):
    storage, entries = discover_files(str(folder), None)
    return planning.plan_files(storage, entries, get_format("parquet"), columns=None, filter=None, split_bytes=None)


def _careful(*args, **kwargs):
    return None


@pytest.mark.parametrize("threaded", [False, True])
def test_the_short_way_plans_what_the_careful_way_plans(tmp_path, monkeypatch, threaded):
    if threaded:   # threads whatever the cores of the machine running the test
        monkeypatch.setattr(planning, "MIN_CORES_FOR_LOCAL_THREADS", 0)
        monkeypatch.setattr(planning.os, "cpu_count", lambda: 2)
    folder = _write_folder(tmp_path / "d")
    short = _plan(folder)
    monkeypatch.setattr(planning, "_read_local", _careful)
    careful = _plan(folder)
    assert short.data_fingerprint == careful.data_fingerprint
    assert list(short.files) == list(careful.files)
    assert list(short.splits) == list(careful.splits)
    assert short.files.unit_bytes.tolist() == careful.files.unit_bytes.tolist()
    assert len(short.files.schemas) == len(careful.files.schemas) == 1 and short.schema.equals(careful.schema)


def test_a_corrupt_footer_among_many_equal_files_is_named(tmp_path):
    folder = _write_folder(tmp_path / "d")
    path = folder / "part-140.parquet"
    data = path.read_bytes()
    path.write_bytes(data[:-12] + b"\xff" * 4 + data[-8:])   # the footer's last bytes flipped, its length kept
    with pytest.raises(errors.CorruptFileError, match=r"part-140\.parquet"):
        _plan(folder)


def test_a_column_name_not_utf8_in_a_late_file_is_refused(tmp_path):
    """Names are checked once per distinct schema: a late file with a schema of its own is checked."""
    folder = _write_folder(tmp_path / "d")
    path = folder / "part-130.parquet"
    pq.write_table(pa.table({"id": [1, 2], "zzzz": ["a", "b"]}), path, store_schema=False)
    path.write_bytes(path.read_bytes().replace(b"zzzz", b"z\xffzz"))
    with pytest.raises(errors.CorruptFileError, match=r"part-130\.parquet: a column name .* is not valid UTF-8"):
        _plan(folder)


def test_a_file_rewritten_after_listing_is_named(tmp_path):
    folder = _write_folder(tmp_path / "d")
    storage, entries = discover_files(str(folder), None)
    pq.write_table(pa.table({"id": pa.array(range(50), pa.int64()), "name": ["x"] * 50}),
                   folder / "part-100.parquet")
    with pytest.raises(errors.FileChangedError, match=r"part-100\.parquet"):
        planning.plan_files(storage, entries, get_format("parquet"), columns=None, filter=None, split_bytes=None)


def test_a_schema_that_differs_late_is_named(tmp_path):
    folder = _write_folder(tmp_path / "d")
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"]}), folder / "part-120.parquet")
    with pytest.raises(errors.SchemaMismatchError, match=r"column 'id' is int32 in .*part-120\.parquet"):
        _plan(folder)


def test_local_version_is_what_listings_record():
    status = os.stat(__file__)
    assert local_version(status) == version_of("file", {"mtime": status.st_mtime})


@pytest.mark.parametrize("path, root", [
    ("/a/b/c.parquet", "/a/b"), ("/a/b/c/d", "/a"), ("/x", "/"), ("a/b", "a"), ("../x/a", "../x"),
    ("/a//b/c", "/a"), ("/a/./b", "/a"), ("/a/b/", "/a"), ("/a/b/../c", "/a"), ("/ab/c", "/a"),
    ("bucket/key", "bucket"), ("/a/b", "/a/b/"), ("/a/b", "")])
def test_relative_names_are_those_of_relpath(path, root):
    assert _relative(path, root) == (posixpath.relpath(path, root) if root else path)


def test_local_footers_are_read_in_one_thread_on_two_cores(tmp_path):
    storage, _ = discover_files(str(_write_folder(tmp_path / "d", 1)), None)
    assert [planning._planning_threads(storage, 10_000, cores) for cores in (1, 2, 3, 8)] == [1, 1, 3, 4]
    assert planning._planning_threads(storage, 100, 8) == 1   # fewer files than two chunks


def test_plain_local_files_take_the_short_way(tmp_path):
    """Not timed: the short way must not fall back to the careful one on files it is for."""
    _, entries = discover_files(str(_write_folder(tmp_path / "d")), None)
    footers = planning._read_local(get_format("parquet"), entries, False)
    assert footers is not None and [footer.entry for footer in footers] == entries
    assert all(footer.handle is None for footer in footers)


def test_remote_footers_are_read_one_file_per_task_on_many_threads():
    """A remote footer read waits on the network: 200 files get 32 threads, and 8 files 7 (the lead is read
    first); each file is its own task, so 8 reads run at once (chunks of 64 files ran them one after another:
    200 files on 3 threads, 3 s on S3 with 20 ms of latency where 32 threads take a fraction of it)."""
    remote = Storage("memory")
    assert not remote.is_local
    assert [planning._planning_threads(remote, n) for n in (1, 2, 8, 200)] == [1, 1, 7, 32]
    entries = [FileEntry(f"memory://f{i}", f"f{i}", 1, "") for i in range(9)]
    together = threading.Barrier(8, timeout=10)

    def read(entry):
        together.wait()   # returns only when 8 reads are in flight at once
        return entry.name

    first = entries[0].name
    assert list(planning._read_all(read, entries, 0, first, threads=8, per_task=1)) == [e.name for e in entries]
