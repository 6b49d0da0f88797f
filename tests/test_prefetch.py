"""Read-ahead of remote splits (``arrowstream._storage.prefetch``) against a real fsspec ``memory://`` filesystem:
coalescing, the prefetcher's schedule/read/release and its depth bound, a refreshed filesystem, failed
fetches, and :class:`PartsFile` (reads, seeks, the small-read block). The object-store suite runs the same
code on S3, GCS and Azure (tests/test_object_stores.py); here each behaviour is checked on its own."""

from __future__ import annotations

import io
import uuid

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arrowstream import errors
from arrowstream._storage.pinned import Pin
from arrowstream._storage.prefetch import MAX_GAP, SMALL_READ, PartsFile, Prefetcher, coalesce

SIZE = 3 * SMALL_READ + 123
DATA = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tobytes()


@pytest.fixture
def memory():
    """A ``memory://`` filesystem holding one file of ``DATA`` (removed after the test), and its pin."""
    fs = fsspec.filesystem("memory")
    path = f"/prefetch-{uuid.uuid4().hex}/data.bin"
    fs.pipe_file(path, DATA)
    yield fs, Pin(path, f"memory://{path}", SIZE, "", "memory")
    fs.rm(path.rsplit("/", 1)[0], recursive=True)


@pytest.fixture
def prefetchers():
    """Prefetchers made by the test, closed after it (their threads end)."""
    made: list[Prefetcher] = []

    def make(fs, depth):
        made.append(Prefetcher(fs, depth))
        return made[-1]

    yield make
    for prefetcher in made:
        prefetcher.close()


def test_coalesce_merges_near_neighbours_up_to_the_largest_request():
    assert coalesce([(0, 10), (10 + MAX_GAP, 20 + MAX_GAP)]) == [(0, 20 + MAX_GAP)]   # a gap of MAX_GAP: one
    assert coalesce([(0, 10), (11 + MAX_GAP, 20 + MAX_GAP)]) == [(0, 10), (11 + MAX_GAP, 20 + MAX_GAP)]
    assert coalesce([(0, 10), (20, 30)], max_gap=9) == [(0, 10), (20, 30)]
    assert coalesce([(0, 10), (10, 20), (20, 30)], max_request=20) == [(0, 20), (20, 30)]
    assert coalesce([(50, 60), (0, 10), (5, 8), (30, 40)], max_gap=0) == [(0, 10), (30, 40), (50, 60)]
    assert coalesce([(0, 100), (10, 20), (90, 120)]) == [(0, 120)]                    # contained, overlapping
    assert coalesce([(5, 5), (9, 3)]) == [] and coalesce([]) == []                   # empty ranges: nothing


def test_scheduled_ranges_are_read_from_the_fetch(memory, prefetchers):
    fs, pin = memory
    prefetcher = prefetchers(fs, 2)
    far = 2 * MAX_GAP
    prefetcher.schedule("a", pin, [(far, far + 100), (0, 50), (60, 70)])
    assert prefetcher.scheduled("a") and prefetcher.requests == 2   # (0, 50) and (60, 70) merged
    assert prefetcher.read(pin.path, 10, 65) == DATA[10:65]
    assert prefetcher.read(pin.path, far + 1, far + 99) == DATA[far + 1:far + 99]
    assert prefetcher.read(pin.path, 65, 80) is None            # past the fetched bytes
    assert prefetcher.read("/another/file", 10, 20) is None
    prefetcher.schedule("a", pin, [(0, 10)])                      # already scheduled: nothing more fetched
    prefetcher.schedule("b", pin, [])                             # nothing to fetch
    assert prefetcher.requests == 2 and not prefetcher.scheduled("b")
    prefetcher.release("a")
    assert not prefetcher.scheduled("a") and prefetcher.read(pin.path, 10, 65) is None
    prefetcher.release("never scheduled")


def test_at_most_depth_splits_are_fetched_ahead(memory, prefetchers):
    fs, pin = memory
    prefetcher = prefetchers(fs, 2)
    for key in ("a", "b", "c"):
        prefetcher.schedule(key, pin, [(0, 10)])
    assert [prefetcher.scheduled(key) for key in ("a", "b", "c")] == [True, True, False]
    prefetcher.release("a")
    prefetcher.schedule("c", pin, [(0, 10)])
    assert prefetcher.scheduled("c") and prefetcher.requests == 3


def test_a_failed_fetch_falls_back_to_a_direct_read(memory, prefetchers):
    fs, pin = memory

    class Resetting(type(fs)):
        """The memory filesystem whose ranged reads fail as a reset connection would (injected)."""

        def cat_file(self, *args, **kwargs):
            raise ConnectionResetError(104, "Connection reset by peer")

    prefetcher = prefetchers(Resetting(skip_instance_cache=True), 1)
    prefetcher.schedule("a", pin, [(0, 100)])
    assert prefetcher.read(pin.path, 0, 10) is None               # the reader reads it itself, with its retries
    file = PartsFile(fs, pin, prefetcher)
    assert file.read(10) == DATA[:10] and prefetcher.direct_requests == 1

    missing = Pin(pin.path + ".gone", pin.url + ".gone", 10, "", "memory")
    prefetcher.release("a")
    prefetcher.schedule("b", missing, [(0, 10)])
    assert prefetcher.read(missing.path, 0, 10) is None


def test_a_file_changed_since_planning_is_not_read_directly(memory, prefetchers):
    fs, pin = memory
    planned = Pin(pin.path, pin.url, SIZE + 10, "", "memory")   # planned longer than it is now
    prefetcher = prefetchers(fs, 1)
    prefetcher.schedule("a", planned, [(SIZE - 10, SIZE + 10)])
    with pytest.raises(errors.FileChangedError, match=rf"memory://{pin.path}: changed since planning "
                                                      rf"\(planned size {SIZE + 10}; now size {SIZE}\)"):
        prefetcher.read(pin.path, SIZE - 5, SIZE + 5)


def test_a_refreshed_filesystem_drops_what_was_fetched_and_fetches_with_the_new_one(memory, prefetchers, tmp_path):
    fs, pin = memory
    prefetcher = prefetchers(fs, 2)
    prefetcher.schedule("a", pin, [(0, 100)])
    assert prefetcher.read(pin.path, 0, 10) == DATA[:10]
    local = tmp_path / "local.bin"
    local.write_bytes(DATA[:1000])
    local_pin = Pin(str(local), str(local), 1000, "", "file")
    prefetcher.replace_filesystem(fsspec.filesystem("file"))
    assert not prefetcher.scheduled("a") and prefetcher.read(pin.path, 0, 10) is None
    prefetcher.schedule("b", local_pin, [(100, 200)])
    assert prefetcher.read(str(local), 100, 200) == DATA[100:200]


def test_parts_file_reads_and_seeks_like_a_file(memory):
    fs, pin = memory
    file = PartsFile(fs, pin, None)
    assert file.readable() and file.seekable() and file.tell() == 0
    assert file.read(100) == DATA[:100] and file.tell() == 100
    assert file.seek(-5, io.SEEK_END) == SIZE - 5 and file.read(100) == DATA[-5:]
    assert file.read(10) == b"" and file.tell() == SIZE
    assert file.seek(-10, io.SEEK_CUR) == SIZE - 10 and file.read(3) == DATA[-10:-7]
    assert file.seek(-50) == 0 and file.read(4) == DATA[:4]          # before the start: at the start
    assert file.seek(SIZE + 7) == SIZE + 7 and file.read(4) == b""   # past the end: nothing
    file.seek(SMALL_READ)
    assert file.read(2 * SMALL_READ) == DATA[SMALL_READ:3 * SMALL_READ]


def test_small_reads_share_one_block_and_the_tail_is_one_block(memory, prefetchers):
    fs, pin = memory
    counter = prefetchers(fs, 1)   # nothing scheduled: counts the direct requests
    file = PartsFile(fs, pin, counter)
    assert file.read(10) == DATA[:10] and counter.direct_requests == 1
    file.seek(SMALL_READ - 20)
    assert file.read(20) == DATA[SMALL_READ - 20:SMALL_READ] and counter.direct_requests == 1   # in the block
    file.seek(SMALL_READ - 10)
    assert file.read(20) == DATA[SMALL_READ - 10:SMALL_READ + 10] and counter.direct_requests == 2  # across it
    file.seek(SIZE - 8)   # a footer: the block is the file's last SMALL_READ bytes
    assert file.read(8) == DATA[-8:] and counter.direct_requests == 3
    file.seek(SIZE - SMALL_READ)
    assert file.read(100) == DATA[SIZE - SMALL_READ:SIZE - SMALL_READ + 100] and counter.direct_requests == 3
    file.seek(0)
    assert file.read(SMALL_READ + 1) == DATA[:SMALL_READ + 1] and counter.direct_requests == 4  # large: exactly it
    file.seek(SIZE - 4)
    assert file.read(4) == DATA[-4:] and counter.direct_requests == 4   # the tail block was kept


def test_parts_file_serves_parquet_from_fetched_bytes(memory, prefetchers):
    fs, _ = memory
    table = pa.table({"x": np.arange(10_000), "y": np.arange(10_000) * 0.5})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=2500)
    data = sink.getvalue().to_pybytes()
    path = f"/prefetch-{uuid.uuid4().hex}/t.parquet"
    fs.pipe_file(path, data)
    try:
        pin = Pin(path, f"memory://{path}", len(data), "", "memory")
        prefetcher = prefetchers(fs, 1)
        metadata = pq.ParquetFile(pa.PythonFile(PartsFile(fs, pin, None), mode="r")).metadata
        ranges = []
        for group in range(metadata.num_row_groups):
            for column in range(metadata.num_columns):
                chunk = metadata.row_group(group).column(column)
                start = chunk.dictionary_page_offset or chunk.data_page_offset
                ranges.append((start, start + chunk.total_compressed_size))
        prefetcher.schedule("split", pin, ranges)
        file = PartsFile(fs, pin, prefetcher)
        parquet = pq.ParquetFile(pa.PythonFile(file, mode="r"), metadata=metadata)
        assert parquet.read().equals(table)
        assert prefetcher.requests == 1 and prefetcher.direct_requests == 0   # the column chunks, one request
    finally:
        fs.rm(path.rsplit("/", 1)[0], recursive=True)
