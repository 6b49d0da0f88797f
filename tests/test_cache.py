"""The local cache of remote data (issue #40): entries keyed by object version and range, checked on every read,
written atomically, under a limit every process sharing the folder holds, evicted so that a cache smaller than an
epoch still saves reads. Object stores (moto behind the counting proxy) in the second half."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
import warnings

import pytest
from helpers import ids_of
from proxy import start_proxy
from servers import s3_server  # noqa: F401 (the fixture)
from test_object_stores import LAYOUT, ROWS, Where, write_files

import arrowstream
from arrowstream import InvalidArgumentError, StructuredDataset
from arrowstream._storage.cache import LAYOUT as CACHE_LAYOUT
from arrowstream._storage.cache import CacheWarning, DataCache, cache_summary, parse_size

KiB = 1024


def fetcher(store, calls):
    """A store of ``store[(start, end)]`` bytes whose every fetch is counted in ``calls``."""
    def fetch(ranges):
        calls.append(list(ranges))
        return [store[r] for r in ranges]
    return fetch


def ranges_of(count, size=4 * KiB):
    return [(i * size, (i + 1) * size) for i in range(count)]


def blobs(ranges, seed=0):
    rng = random.Random(seed)
    return {r: rng.randbytes(r[1] - r[0]) for r in ranges}


def entry_paths(folder):
    root = os.path.join(folder, CACHE_LAYOUT, "data")
    return sorted(os.path.join(d, name) for d, _, names in os.walk(root) for name in names if not name.startswith("."))


def test_sizes_and_arguments():
    assert (parse_size("200GB"), parse_size("1 KiB"), parse_size(7)) == (200 * 10**9, 1024, 7)
    for bad in ("lots", "-1GB", 0, True, "5 parsecs"):
        with pytest.raises(InvalidArgumentError, match="cache_limit"):
            parse_size(bad)
    assert DataCache.of(None, None) is None
    with pytest.raises(InvalidArgumentError, match="cache_limit: needed with cache"):
        DataCache.of("/tmp/x", None)
    with pytest.raises(InvalidArgumentError, match="cache_limit: set without cache"):
        DataCache.of(None, "1GB")
    with pytest.raises(InvalidArgumentError, match="expected a folder on local disk"):
        DataCache.of("s3://bucket/cache", "1GB")


def test_a_second_read_comes_from_the_cache_and_another_version_never_does(tmp_path):
    ranges = ranges_of(8)
    store, calls = blobs(ranges), []
    cache = DataCache(str(tmp_path), 10 * 2**20)
    first = cache.read("s3", "bucket/a.parquet", '"etag-1"', ranges, fetcher(store, calls))
    assert first == [store[r] for r in ranges] and calls == [ranges]
    again = cache.read("s3", "bucket/a.parquet", '"etag-1"', ranges, fetcher(store, calls))
    assert again == first and len(calls) == 1   # nothing fetched
    assert (cache.counts.hits, cache.counts.misses) == (8, 8)
    newer = blobs(ranges, seed=1)   # the object rewritten: another version, other bytes
    assert cache.read("s3", "bucket/a.parquet", '"etag-2"', ranges, fetcher(newer, calls)) == [newer[r] for r in ranges]
    assert len(calls) == 2
    other_store = cache.read("gs", "bucket/a.parquet", '"etag-1"', ranges[:1], fetcher(store, calls))
    assert other_store == [store[ranges[0]]] and len(calls) == 3   # another store: another key
    unversioned = cache.read("s3", "bucket/b.parquet", "", ranges[:2], fetcher(store, calls))
    assert unversioned == [store[r] for r in ranges[:2]] and len(calls) == 4
    cache.read("s3", "bucket/b.parquet", "", ranges[:2], fetcher(store, calls))
    assert len(calls) == 5   # a file listed without a version is never cached: its bytes cannot be told apart


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign", "empty"])
def test_a_damaged_entry_is_dropped_and_fetched_again_with_one_warning(tmp_path, damage):
    ranges = ranges_of(4)
    store, calls = blobs(ranges), []
    cache = DataCache(str(tmp_path), 10 * 2**20)
    cache.read("s3", "b/a", "v1", ranges, fetcher(store, calls))
    paths = entry_paths(str(tmp_path))
    assert len(paths) == 4
    for path in paths[:2]:
        with open(path, "rb") as f:
            raw = bytearray(f.read())
        if damage == "flip":
            raw[-7] ^= 0x40
        elif damage == "truncate":
            raw = raw[:len(raw) // 2]
        elif damage == "foreign":
            raw = bytearray(os.urandom(len(raw)))
        else:
            raw = bytearray()
        with open(path, "wb") as f:
            f.write(raw)
    fresh = DataCache(str(tmp_path), 10 * 2**20)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fresh.read("s3", "b/a", "v1", ranges, fetcher(store, calls))
    assert got == [store[r] for r in ranges]   # never the damaged bytes
    assert len(calls) == 2 and len(calls[1]) == 2   # the two damaged ranges fetched again, the others served
    assert [w.category for w in caught] == [CacheWarning] and "damaged entry" in str(caught[0].message)
    assert fresh.counts.dropped == 2 and len(entry_paths(str(tmp_path))) == 4   # dropped, then kept anew
    assert fresh.read("s3", "b/a", "v1", ranges, fetcher(store, calls)) == got and len(calls) == 2


def test_a_write_that_died_leaves_nothing_that_is_served(tmp_path):
    """A worker killed while it wrote: its temporary file is never an entry, and an eviction deletes it later."""
    ranges = ranges_of(2)
    store, calls = blobs(ranges), []
    cache = DataCache(str(tmp_path), 64 * KiB)
    digest = cache.key("s3", "b/a", "v1", *ranges[0])
    bucket = os.path.dirname(cache._path(digest))
    os.makedirs(bucket)
    half = os.path.join(bucket, f".{digest[:16]}.999999.tmp")
    with open(half, "wb") as f:
        f.write(b"ASC1" + b"\0" * 10)   # cut short
    os.utime(half, (time.time() - 7200, time.time() - 7200))
    assert cache.read("s3", "b/a", "v1", ranges, fetcher(store, calls)) == [store[r] for r in ranges]
    assert calls == [ranges]   # the half-written file was not an entry
    fresh = os.path.join(bucket, f".{digest[:16]}.999998.tmp")   # a write under way in another process now
    with open(fresh, "wb") as f:
        f.write(b"ASC1")
    for i in range(4):   # 4 x 15 KiB more than 64 KiB holds: an eviction scans the folder
        cache.put(cache.key("s3", "b/a", "v1", 0, i + 1), b"x" * (15 * KiB))
    assert cache.counts.evictions > 0
    assert not os.path.exists(half) and os.path.exists(fresh)   # the write that died is deleted, not the live one


def folder_bytes(folder):
    """The bytes of every file under the cache's folder now (entries and writes under way)."""
    total = 0
    for where, _, names in os.walk(os.path.join(folder, CACHE_LAYOUT, "data")):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(where, name))
            except FileNotFoundError:   # evicted or renamed as it was listed
                pass
    return total


def _fill(folder, limit, seed, count, size, stop):
    cache = DataCache(folder, limit)
    rng = random.Random(seed)
    for i in range(count):
        if stop.is_set():
            return
        cache.put(cache.key("s3", f"b/{seed}", "v1", i, i + size), rng.randbytes(size))


def test_the_limit_holds_across_processes_sharing_the_folder(tmp_path):
    """Four processes (two workers of two ranks) write entries into one folder at once: sampled while they write,
    the folder never holds more than the limit plus one entry being written per process."""
    limit, size, writers = 256 * KiB, 8 * KiB, 4
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    procs = [context.Process(target=_fill, args=(str(tmp_path), limit, seed, 200, size, stop)) for seed in range(writers)]
    for proc in procs:
        proc.start()
    samples = []
    try:
        while any(proc.is_alive() for proc in procs):
            samples.append(folder_bytes(str(tmp_path)))
    finally:
        stop.set()
        for proc in procs:
            proc.join(timeout=60)
    assert len(samples) > 10 and max(samples) <= limit + writers * (size + 64)
    summary = cache_summary(str(tmp_path))
    assert 0 < summary["bytes"] <= limit and summary["entries"] == summary["bytes"] // (size + 32)


def test_a_cache_of_half_an_epoch_still_saves_half_its_reads(tmp_path):
    """Least recently used eviction would save nothing here (every entry evicted just before the next epoch reads
    it); entries never hit go first, the newest first, so the first ranges of an epoch, about the limit's share of
    it, stay for the next one."""
    ranges = ranges_of(200, size=2 * KiB)
    store = blobs(ranges)
    entry = 2 * KiB + 32
    cache = DataCache(str(tmp_path), 100 * entry)   # half the epoch
    per_epoch = []
    for _ in range(3):
        fetched = []
        for start in range(0, len(ranges), 4):   # an epoch, read 4 ranges at a time
            got = cache.read("s3", "b/a", "v1", ranges[start:start + 4], fetcher(store, fetched))
            assert got == [store[r] for r in ranges[start:start + 4]]
        per_epoch.append(sum(len(call) for call in fetched))
    assert per_epoch[0] == 200
    assert per_epoch[1] <= 0.6 * 200 and per_epoch[2] <= 0.6 * 200, per_epoch   # no cache: 200 each


def test_a_folder_that_cannot_be_written_turns_the_cache_off_with_one_warning(tmp_path, monkeypatch):
    """A full disk (ENOSPC from the write) or a read-only folder: one warning, every read from the store."""
    ranges = ranges_of(3)
    store, calls = blobs(ranges), []
    cache = DataCache(str(tmp_path), 10 * 2**20)
    real_open = open

    def full(path, mode="r", *args, **kwargs):
        if "w" in mode and str(path).endswith(".tmp"):
            raise OSError(28, "No space left on device")
        return real_open(path, mode, *args, **kwargs)
    monkeypatch.setattr("builtins.open", full)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert cache.read("s3", "b/a", "v1", ranges, fetcher(store, calls)) == [store[r] for r in ranges]
    assert len(calls) == 3 and [w.category for w in caught] == [CacheWarning]
    assert "No space left" in str(caught[0].message) and entry_paths(str(tmp_path)) == []


# -- object stores --------------------------------------------------------------------------------------------


@pytest.fixture
def proxied_s3(s3_server, tmp_path):  # noqa: F811
    where = Where(s3_server.url(f"c-{os.urandom(4).hex()}"), s3_server.storage_options, s3_server.protocol)
    path = write_files(where)
    with start_proxy(s3_server.endpoint) as proxy:
        proxy.configure(flavor="s3")
        yield path, s3_server.options_via(proxy.endpoint), proxy


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_second_epoch_reads_no_data_from_the_store(proxied_s3, tmp_path, num_workers):
    path, options, proxy = proxied_s3
    secret = f"s3cr3t/{os.urandom(8).hex()}"
    options = {**options, "key": f"AKIA{os.urandom(8).hex().upper()}", "secret": secret}   # moto takes any key
    folder = str(tmp_path / "cache")
    loader, dataset = StructuredDataset.create_dataloader(path=path, storage_options=options, batch_size=100,
                                                          num_workers=num_workers, cache=folder, cache_limit="1GB",
                                                          plan_cache=False)
    epochs, metrics = [], []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        proxy.reset()
        epochs.append(sorted(i for batch in loader for i in ids_of(batch)))
        metrics.append(loader.metrics())
        reads = proxy.stats()["counts"].get("read", 0)
        if epoch == 0:
            assert reads > 0
        else:
            assert reads == 0   # every byte from the local cache
    assert epochs == [list(range(ROWS))] * 2
    first, second = metrics   # the metrics count it, per worker and in all (restarted workers go on)
    assert first["store_bytes"] > 0 and first["cache_misses"] > 0
    assert second["store_bytes"] == first["store_bytes"] and second["cache_misses"] == first["cache_misses"]
    assert second["cache_bytes"] - first["cache_bytes"] == first["store_bytes"]   # the same bytes, from disk
    assert second["cache_hits"] > first["cache_hits"] and second["cache_evictions"] == 0
    assert sum(line["cache_hits"] for line in second["workers"]) == second["cache_hits"]
    assert cache_summary(folder)["entries"] >= len(LAYOUT)   # a footer and row groups of each file
    bucket = path.split("://")[1].split("/")[0]
    for folder_path, _, names in os.walk(folder):   # names are hashes; no option, key or secret in any file
        for name in names:
            assert bucket not in name and "parquet" not in name
            with open(os.path.join(folder_path, name), "rb") as f:
                raw = f.read()
            assert secret.encode() not in raw and options["key"].encode() not in raw and bucket.encode() not in raw


def iceberg_on_s3(s3_server, proxy, root):  # noqa: F811
    """A table of 1,000 ids in two data files, its warehouse in the S3 server's bucket, its FileIO through the proxy."""
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    config = {"type": "sql", "uri": f"sqlite:///{root}/catalog.db",
              "warehouse": s3_server.url(f"wh-{os.urandom(4).hex()}"), "s3.endpoint": proxy.endpoint,
              "s3.access-key-id": "testing", "s3.secret-access-key": "testing", "s3.region": "us-east-1"}
    catalog = load_catalog("default", **config)
    catalog.create_namespace("db")
    table = catalog.create_table("db.events", schema=pa.schema([("id", pa.int64())]))
    for start in (0, 500):
        table.append(pa.table({"id": pa.array(range(start, start + 500), pa.int64())}))
    return config


def test_an_iceberg_tables_second_epoch_reads_no_data_file_from_the_store(s3_server, tmp_path):  # noqa: F811
    """Data files come through the table's FileIO (pyiceberg), through the cache: never rewritten in place, an
    Iceberg data file's path and size are its version."""
    with start_proxy(s3_server.endpoint) as proxy:
        proxy.configure(flavor="s3")
        config = iceberg_on_s3(s3_server, proxy, str(tmp_path))
        folder = str(tmp_path / "cache")
        loader, dataset = arrowstream.IcebergDataset.create_dataloader(
            table="db.events", catalog_config=config, batch_size=100, num_workers=2, cache=folder, cache_limit="1GB",
            plan_cache=False)
        for epoch in range(2):
            dataset.set_epoch(epoch)
            proxy.reset()
            assert sorted(i for batch in loader for i in ids_of(batch)) == list(range(1000))
            reads = proxy.stats()["counts"].get("read", 0)
            assert (reads > 0) if epoch == 0 else reads == 0, (epoch, reads)
        assert cache_summary(folder)["entries"] >= 2


def test_a_mixtures_sources_each_take_a_cache(proxied_s3, tmp_path):
    path, options, proxy = proxied_s3
    folder = str(tmp_path / "cache")
    sources = {"a": arrowstream.Source(path, storage_options=options, cache=folder, cache_limit="1GB"),
               "b": arrowstream.Source(path, storage_options=options)}   # no cache: every epoch from the store
    loader, mixture = arrowstream.Mixture.create_dataloader(sources=sources, weights={"a": 1, "b": 1},
                                                            epoch_rows=ROWS, batch_size=100, plan_cache=False)
    reads = []
    for epoch in range(2):
        mixture.set_epoch(epoch)
        proxy.reset()
        assert sum(len(ids_of(batch)) for batch in loader) == ROWS
        reads.append(proxy.stats()["counts"].get("read", 0))
    assert reads[1] < reads[0] and reads[1] > 0   # a's from the cache, b's from the store
    with pytest.raises(InvalidArgumentError, match=r"sources\['a'\]\.cache_limit: needed with cache"):
        arrowstream.Mixture({"a": arrowstream.Source(path, storage_options=options, cache=folder)})


def test_cache_show_and_clear(tmp_path, capsys):
    """``arrowstream cache show|clear DIR``: what the folder holds; cleared, the next read comes from the store."""
    from arrowstream import cli

    ranges = ranges_of(6)
    store, calls = blobs(ranges), []
    cache = DataCache(str(tmp_path), 10 * 2**20)
    cache.read("s3", "b/a", "v1", ranges, fetcher(store, calls))
    cache.read("s3", "b/a", "v1", ranges[:2], fetcher(store, calls))   # two of them hit
    assert cli.main(["cache", "show", str(tmp_path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["entries"], shown["bytes"]) == (6, 6 * (4 * KiB + 32))
    assert 2 <= shown["hot"] <= 6   # the two hit (and any of the others written as hit, one in 32)
    assert cli.main(["cache", "clear", str(tmp_path)]) == 0
    assert "deleted 6 entries" in capsys.readouterr().out
    assert entry_paths(str(tmp_path)) == []
    cache.read("s3", "b/a", "v1", ranges[:1], fetcher(store, calls))
    assert len(calls) == 2   # from the store again
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["cache", "show", str(tmp_path / "nothing")])
    assert exit_info.value.code == 2 and "holds no arrowstream data cache" in capsys.readouterr().err
