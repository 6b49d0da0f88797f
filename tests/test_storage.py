"""Retries of transient storage errors and cheap resume (guarantees 5 and 11).

The faults come from a filesystem that wraps in-memory files and fails reads on a fixed
schedule: a local disk or a loopback server cannot produce connection resets on demand.
"""

from __future__ import annotations

import gc
import io
import logging
import threading
from typing import ClassVar

import fsspec
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from helpers import make_loader, make_table, run_epochs

from arrowstream import RetryPolicy, StructuredDataset, errors


class _FlakyFile(io.BytesIO):
    reads = 0
    fail_every = 0  # 0: never fail; n: every n-th read raises a connection reset

    @classmethod
    def _maybe_fail(cls):
        cls.reads += 1
        if cls.fail_every and cls.reads % cls.fail_every == 0:
            raise ConnectionResetError(104, "Connection reset by peer")

    def read(self, *args):
        self._maybe_fail()
        return super().read(*args)

    def readinto(self, buffer):
        self._maybe_fail()
        return super().readinto(buffer)


class _FlakyFileSystem(MemoryFileSystem):
    protocol = "flaky"
    store: ClassVar[dict] = {}
    pseudo_dirs: ClassVar[list[str]] = [""]

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path.removeprefix("flaky://"))

    def _open(self, path, mode="rb", **kwargs):
        if "r" not in mode:
            return super()._open(path, mode, **kwargs)
        return _FlakyFile(super().cat_file(path))

    def cat_file(self, path, start=None, end=None, **kwargs):  # ranged reads of remote files fail too
        _FlakyFile._maybe_fail()
        return super().cat_file(path, start=start, end=end, **kwargs)


@pytest.fixture
def flaky_dataset():
    fsspec.register_implementation("flaky", _FlakyFileSystem, clobber=True)
    fs = _FlakyFileSystem()
    start = 0
    for i, rows in enumerate([900, 1300]):
        with fs.open(f"/flaky-ds/part-{i}.parquet", "wb") as f:
            pq.write_table(make_table(start, rows), f, row_group_size=200)
        start += rows
    _FlakyFile.fail_every = 0
    yield "flaky://flaky-ds"
    _FlakyFile.fail_every = 0
    fs.rm("/flaky-ds", recursive=True)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_transient_errors_are_retried_without_loss_or_repeat(flaky_dataset, num_workers, caplog):
    # planned from the files both times (no plan cache): the faults hit the footer reads too
    reference_loader, reference = make_loader(flaky_dataset, num_workers, batch_size=70, shuffle=True,
                                              plan_cache=False)
    expected = [ids for _, _, ids in run_epochs(reference_loader, reference, [0])]
    _FlakyFile.fail_every = 5
    caplog.set_level(logging.WARNING, logger="arrowstream")
    loader, dataset = make_loader(flaky_dataset, num_workers, batch_size=70, shuffle=True, plan_cache=False)
    got = [ids for _, _, ids in run_epochs(loader, dataset, [0])]
    assert got == expected
    assert sorted(i for ids in got for i in ids) == list(range(2200))
    if num_workers == 0:
        assert "transient error" in caplog.text


@pytest.mark.parametrize("file_format", ["orc", "arrow"])
def test_orc_and_ipc_through_fsspec_retry_without_loss_or_repeat(file_format):
    """Not local: files are read through fsspec file objects, and resets are retried in place."""
    from pyarrow import ipc, orc

    fsspec.register_implementation("flaky", _FlakyFileSystem, clobber=True)
    fs = _FlakyFileSystem()
    start = 0
    for i, rows in enumerate([900, 1300]):
        table = make_table(start, rows).drop_columns(["vec"])
        with fs.open(f"/flaky-{file_format}/part-{i}.{file_format}", "wb") as f:
            if file_format == "orc":
                orc.write_table(table, f, stripe_size=1, batch_size=200)
            else:
                with ipc.new_file(f, table.schema) as writer:
                    writer.write_table(table, max_chunksize=200)
        start += rows
    try:
        _FlakyFile.fail_every = 0
        reference_loader, reference = make_loader(f"flaky://flaky-{file_format}", 0, format=file_format,
                                                  batch_size=70, shuffle=True)
        assert len(reference._plan.splits) == 5 + 7
        expected = [ids for _, _, ids in run_epochs(reference_loader, reference, [0])]
        loader, dataset = make_loader(f"flaky://flaky-{file_format}", 0, format=file_format, batch_size=70,
                                      shuffle=True, retry=RetryPolicy(base_delay=0.001))
        _FlakyFile.reads, _FlakyFile.fail_every = 0, 4  # from the first read of a row on
        got = [ids for _, _, ids in run_epochs(loader, dataset, [0])]
        injected = _FlakyFile.reads // 4
    finally:
        _FlakyFile.fail_every = 0
        fs.rm(f"/flaky-{file_format}", recursive=True)
    assert injected >= 3
    assert got == expected
    assert sorted(i for ids in got for i in ids) == list(range(2200))


def test_errors_that_outlast_retries_name_the_file(flaky_dataset):
    dataset = StructuredDataset(flaky_dataset, batch_size=100, retry=RetryPolicy(base_delay=0.001))
    _FlakyFile.fail_every = 1
    with pytest.raises(errors.FileReadError, match=r"flaky://flaky-ds/part-0\.parquet.*kept failing") as info:
        list(dataset)
    assert isinstance(info.value, OSError)


@pytest.mark.parametrize(("buffer", "interleave"), [(0, 1), (0, 3), (3000, 1), (3000, 3)])
@pytest.mark.parametrize("fraction", [0.05, 0.9])
def test_resume_reads_at_most_one_buffer_and_a_row_group_per_open_split(tmp_path, monkeypatch, fraction, buffer,
                                                                         interleave):
    folder = tmp_path / "d"
    folder.mkdir()
    for index in range(4):
        pq.write_table(make_table(index * 5000, 5000), folder / f"{index}.parquet", row_group_size=1000)
    # one split per file: the worst case for skipping into a split
    options = {"batch_size": 128, "split_bytes": 10**9, "shuffle_buffer_size": buffer, "interleave": interleave}
    dataset = StructuredDataset(folder, **options)
    it = iter(dataset)
    for _ in range(int(fraction * 20_000 / 128)):
        next(it)
    state = dataset.state_dict()

    decoded = []
    original = pq.ParquetFile.iter_batches

    def counting(self, *args, **kwargs):
        for batch in original(self, *args, **kwargs):
            decoded.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counting)
    resumed = StructuredDataset(folder, **options)
    resumed.load_state_dict(state)
    yielded = sum(len(b["id"]) for b in resumed)
    assert yielded == 20_000 - state["counters"]["rows"]
    # at most one shuffle window, and less than one row group in each open split
    assert sum(decoded) - yielded < buffer + interleave * 1000


def test_worker_processes_open_their_own_filesystem(tmp_path):
    """The parent's fsspec instance is never used in a worker (fork safety)."""
    from helpers import write_dataset

    folder = write_dataset(tmp_path / "d", [(300, 100)])
    loader, dataset = make_loader(folder, 2, batch_size=50, output_format="dict",
                                  transform=_record_storage_pid)
    parent_fs = dataset._storage.fs
    pids = {b["pid"] for b in loader}
    assert len(pids) == 2 and parent_fs is dataset._storage.fs


def _record_storage_pid(batch):
    import os

    return {"pid": os.getpid()}


def test_failed_reads_leave_nothing_the_garbage_collector_cannot_free(flaky_dataset):
    """pyarrow keeps the error raised under its read, and the error's frames hold the reader: the retry loops
    clear those frames, or every failed attempt (retried or not) would keep its reader, file and read-ahead."""
    dataset = StructuredDataset(flaky_dataset, batch_size=100, retry=RetryPolicy(base_delay=0.001))
    _FlakyFile.fail_every = 3
    assert sum(len(batch["id"]) for batch in dataset) == 2200
    _FlakyFile.fail_every = 1
    with pytest.raises(errors.FileReadError, match=r"kept failing"):
        list(dataset)
    _FlakyFile.fail_every = 0
    del dataset
    gc.collect()
    assert [o for o in gc.get_objects() if type(o) is ConnectionResetError] == []
    assert not [t for t in threading.enumerate() if t.name.startswith("arrowstream-read-ahead")]
