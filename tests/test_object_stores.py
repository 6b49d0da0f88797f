"""The storage contract: local disk, ``memory://``, S3, GCS and Azure pass one suite.

S3, GCS and Azure are real servers on loopback (moto, gcp-storage-emulator, Azurite; see
``servers.py``), started once per session. Tests that count requests or inject faults put the
proxy of ``proxy.py`` between the loader and the server: it adds latency, answers errors,
resets connections and cuts responses short, on a seeded schedule.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import check_exactly_once, check_resume, ids_of, make_loader, make_table
from proxy import start_proxy

import arrowstream._sources.files
from arrowstream import RetryPolicy, StructuredDataset, errors

LAYOUT = [(700, 150), (1300, 200), (450, 150)]   # (rows, row group rows) per file
ROWS = sum(rows for rows, _ in LAYOUT)
SMALL = [(120, 60), (80, 80)]                    # objects under 64 KiB: read whole, in one request
SMALL_ROWS = sum(rows for rows, _ in SMALL)


@dataclass
class Where:
    """A fresh folder on one storage: its URL and the options that reach it."""

    url: str
    storage_options: dict[str, Any]
    protocol: str

    def filesystem(self) -> fsspec.AbstractFileSystem:
        return fsspec.filesystem(self.protocol, skip_instance_cache=True, **self.storage_options)


def write_files(where: Where, layout=LAYOUT) -> str:
    fs = where.filesystem()
    fs.makedirs(where.url, exist_ok=True)
    start = 0
    for index, (rows, group) in enumerate(layout):
        with fs.open(f"{where.url}/part-{index}.parquet", "wb") as f:
            pq.write_table(make_table(start, rows), f, row_group_size=group)
        start += rows
    return where.url


def read_ids(loader, dataset, epoch=0) -> list[list[int]]:
    dataset.set_epoch(epoch)
    return [ids_of(batch) for batch in loader]


PINNED_ROWS = 300   # rows of each of the three files of the rewrite tests, in row groups of 100
REWRITES = {        # how a file is rewritten: (first id, rows); "same size" holds other ids only
    "same size": (10**6, PINNED_ROWS), "smaller": (10**6, PINNED_ROWS // 2), "larger": (10**6, PINNED_ROWS * 2)}


def write_ids(fs: fsspec.AbstractFileSystem, url: str, index: int, start: int, rows: int) -> None:
    """File ``index`` holding ids ``start, start + 1, ...``: one int64 column, plain and uncompressed, without
    statistics, so that other ids in as many rows make a file of exactly the same size."""
    table = pa.table({"id": pa.array(range(start, start + rows), pa.int64())})
    with fs.open(f"{url}/part-{index}.parquet", "wb") as f:
        pq.write_table(table, f, row_group_size=100, compression="none", use_dictionary=False,
                       write_statistics=False)


def write_pinned(where: Where) -> fsspec.AbstractFileSystem:
    """The three files of the rewrite tests, ids 0 to 899; returns the filesystem that wrote them."""
    fs = where.filesystem()
    fs.makedirs(where.url, exist_ok=True)
    for index in range(3):
        write_ids(fs, where.url, index, index * PINNED_ROWS, PINNED_ROWS)
    return fs


def rewrite(fs: fsspec.AbstractFileSystem, url: str, index: int, how: str) -> None:
    """Rewrite file ``index`` of the rewrite tests, ``how`` as in ``REWRITES``."""
    name = f"{url}/part-{index}.parquet"
    size = fs.size(name)
    write_ids(fs, url, index, *REWRITES[how])
    assert (fs.size(name) == size) == (how == "same size")


def read_until_changed(loader, dataset, index: int, during=None) -> list[int]:
    """The ids read before the FileChangedError that names file ``index``; ``during(step)`` after each batch."""
    got: list[int] = []
    dataset.set_epoch(0)
    with pytest.raises(errors.FileChangedError, match=rf"part-{index}\.parquet: changed since planning \(planned "):
        for step, batch in enumerate(loader):
            got += ids_of(batch)
            if during is not None:
                during(step)
    prefetcher = dataset._storage._prefetcher
    if prefetcher is not None:   # fetches still in flight end before the test's servers and proxy stop
        prefetcher.close(wait=True)
    return got


class StorageContract:
    """What every storage passes; subclasses provide the ``where`` fixture. (``memory://`` lives in one
    process: forked workers see it, spawned ones an empty store, so start methods are tested apart.)"""

    def factory(self, where: Where):
        def build(path, num_workers, **options):
            return make_loader(path, num_workers, storage_options=where.storage_options, **options)
        return build

    def test_exactly_once_and_exact_resume(self, where):
        path = write_files(where)
        options = {"batch_size": 64, "shuffle": True, "seed": 4, "shuffle_buffer_size": 300, "interleave": 2}

        def rows_of_epoch(batches, dataset):
            check_exactly_once(batches, ROWS)

        check_resume(path, 2, options, rows_of_epoch, mid=6, factory=self.factory(where))

    def test_orc_and_ipc_files(self, where):
        from pyarrow import ipc, orc

        fs = where.filesystem()
        for folder in ("orc", "arrow"):
            fs.makedirs(f"{where.url}/{folder}", exist_ok=True)
        table = make_table(0, 900).drop_columns(["vec"])
        with fs.open(f"{where.url}/orc/a.orc", "wb") as f:
            orc.write_table(table, f, stripe_size=1, batch_size=200)
        with fs.open(f"{where.url}/arrow/a.arrow", "wb") as f, ipc.new_file(f, table.schema) as writer:
            writer.write_table(table, max_chunksize=200)
        for file_format in ("orc", "arrow"):
            loader, dataset = make_loader(f"{where.url}/{file_format}", 2, format=file_format, batch_size=64,
                                          storage_options=where.storage_options, shuffle=True)
            assert len(dataset._plan.splits) == 5
            assert sorted(i for batch in read_ids(loader, dataset) for i in batch) == list(range(900))

    def test_a_missing_path_is_named(self, where):
        with pytest.raises(errors.DatasetNotFoundError, match="nothing-here"):
            StructuredDataset(f"{where.url}/nothing-here/", storage_options=where.storage_options)

    @pytest.fixture
    def via(self, where):
        """Where the rewrite tests read from: the storage itself, unless a subclass puts a proxy in between."""
        return where

    @pytest.mark.parametrize("read_ahead", [0, 1])
    @pytest.mark.parametrize("how", list(REWRITES))
    def test_a_file_rewritten_after_planning_is_named_and_never_mixed(self, where, via, how, read_ahead):
        fs = write_pinned(where)
        loader, dataset = make_loader(via.url, 0, batch_size=50, read_ahead=read_ahead,
                                      storage_options=via.storage_options)
        rewrite(fs, where.url, 1, how)
        assert read_until_changed(loader, dataset, 1) == list(range(PINNED_ROWS))   # no row of either part-1

    @pytest.mark.parametrize("read_ahead", [0, 1])
    def test_a_file_rewritten_mid_epoch_is_named_and_never_mixed(self, where, via, read_ahead):
        fs = write_pinned(where)
        loader, dataset = make_loader(via.url, 0, batch_size=50, read_ahead=read_ahead,
                                      storage_options=via.storage_options)

        def rewrite_the_last_file(step: int) -> None:
            if step == 1:
                rewrite(fs, where.url, 2, "same size")
        got = read_until_changed(loader, dataset, 2, during=rewrite_the_last_file)
        assert got == list(range(2 * PINNED_ROWS))

    def test_a_file_rewritten_between_listing_and_footer_is_named(self, where, via, monkeypatch):
        fs = write_pinned(where)
        listing = arrowstream._sources.files.discover_files

        def listed_then_rewritten(*args, **kwargs):
            listed = listing(*args, **kwargs)
            rewrite(fs, where.url, 1, "same size")
            return listed
        monkeypatch.setattr(arrowstream._sources.files, "discover_files", listed_then_rewritten)
        with pytest.raises(errors.FileChangedError, match=r"part-1\.parquet: changed since planning"):
            StructuredDataset(via.url, batch_size=50, storage_options=via.storage_options)

    def test_a_file_removed_after_planning_is_named(self, where):
        path = write_files(where)
        dataset = StructuredDataset(path, batch_size=100, storage_options=where.storage_options)
        where.filesystem().rm(f"{path}/part-1.parquet")
        with pytest.raises(errors.FileReadError, match=r"part-1\.parquet.*(disappeared|not found|does not exist)"):
            for _ in dataset:
                pass


class ProcessesContract(StorageContract):
    """Storages that worker processes of any start method reach (all but ``memory://``)."""

    @pytest.mark.parametrize("context", ["spawn", "forkserver"])
    def test_workers_of_every_start_method_read_after_planning_in_the_parent(self, where, context):
        path = write_files(where)
        loader, dataset = make_loader(path, 2, storage_options=where.storage_options, batch_size=100,
                                      multiprocessing_context=context)
        ids = [i for batch in read_ids(loader, dataset) for i in batch]
        assert sorted(ids) == list(range(ROWS))


class TestLocal(ProcessesContract):
    @pytest.fixture
    def where(self, tmp_path):
        return Where(str(tmp_path / "data"), {}, "file")


class TestMemory(StorageContract):
    @pytest.fixture
    def where(self):
        url = f"memory://arrowstream-{uuid.uuid4().hex[:8]}"
        yield Where(url, {}, "memory")
        fs = fsspec.filesystem("memory")
        if fs.exists(url):
            fs.rm(url, recursive=True)


class RemoteContract(ProcessesContract):
    """Object stores: also request counts and faults through the proxy."""

    server_fixture: ClassVar[str]

    @pytest.fixture
    def server(self, request):
        return request.getfixturevalue(self.server_fixture)

    @pytest.fixture
    def where(self, server):
        return Where(server.url(f"t-{uuid.uuid4().hex[:8]}"), server.storage_options, server.protocol)

    @pytest.fixture
    def proxied(self, server, where):
        """(where through the proxy, the proxy)."""
        with start_proxy(server.endpoint) as proxy:
            proxy.configure(flavor=server.protocol)
            yield Where(where.url, server.options_via(proxy.endpoint), where.protocol), proxy

    def test_planning_lists_once_and_workers_list_nothing(self, where, proxied):
        write_files(where)
        via, proxy = proxied
        proxy.reset()
        loader, dataset = make_loader(via.url, 2, storage_options=via.storage_options, batch_size=100)
        planning = proxy.stats()["counts"]
        assert planning.get("list", 0) == 1          # the folder listed once, nothing asked of the path first
        # sizes come from the listing; adlfs's find first asks whether the path is a blob (one HEAD)
        assert planning.get("head", 0) == (1 if where.protocol == "az" else 0)
        assert planning.get("read", 0) <= len(LAYOUT) * 2   # a footer read per file, at most one retry
        proxy.reset()
        ids = [i for batch in read_ids(loader, dataset) for i in batch]
        reading = proxy.stats()["counts"]
        assert sorted(ids) == list(range(ROWS))
        assert reading.get("list", 0) == 0
        groups = sum(-(-rows // group) for rows, group in LAYOUT)
        assert reading.get("read", 0) <= groups + len(LAYOUT)   # one coalesced request per row group

    def test_transient_faults_are_retried_without_loss_or_repeat(self, where, proxied):
        path = write_files(where)
        via, proxy = proxied
        reference = read_ids(*make_loader(path, 2, storage_options=where.storage_options, batch_size=64,
                                          shuffle=True, seed=2))
        proxy.configure(flavor=where.protocol, error_rate=0.15, error_status=503, reset_rate=0.05,
                        short_rate=0.05, seed=7)
        got = read_ids(*make_loader(via.url, 2, storage_options=via.storage_options, batch_size=64,
                                    shuffle=True, seed=2, retry=self.PATIENT))
        assert got == reference
        assert sum(proxy.stats()["injected"].values()) >= 3

    def test_permission_denied_fails_fast_and_names_the_object(self, where, proxied):
        write_files(where)
        via, proxy = proxied
        dataset = None
        proxy.configure(flavor=where.protocol, error_rate=1.0, error_status=403)
        with pytest.raises(errors.FileReadError, match=r"part-0\.parquet.*(permission|denied|credentials)"):
            dataset = StructuredDataset(via.url, batch_size=100, storage_options=via.storage_options)
        assert dataset is None
        assert proxy.stats()["injected"].get("error", 0) <= 4   # not retried as if transient

    def test_a_changed_file_is_asked_for_once_not_retried(self, where, proxied):
        fs = write_pinned(where)
        via, proxy = proxied
        proxy.configure(flavor=where.protocol, gcs_generations=True)
        loader, dataset = make_loader(via.url, 0, batch_size=50, read_ahead=0, storage_options=via.storage_options)
        rewrite(fs, where.url, 0, "same size")
        proxy.reset()
        assert read_until_changed(loader, dataset, 0) == []
        counts = proxy.stats()["counts"]
        # the refused read, then what the file is now (for the message): GCS's metadata is a GET, S3's and Azure's a HEAD
        assert (counts.get("read", 0), counts.get("head", 0)) == ((2, 0) if where.protocol == "gs" else (1, 1))
    # -- one retry layer, deadlines (#17): a test policy of 1 s timeouts and millisecond waits --------

    QUICK = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05, throttle_delay=0.02, timeout=1.0,
                        deadline=20.0, split_deadline=20.0)
    PATIENT = dataclasses.replace(QUICK, attempts=8)   # for reads that must get through occasional faults

    def read_through(self, via, proxy, retry, layout=SMALL, **faults):
        """Plan through the proxy (faults as configured), read one epoch with ``faults``: (ids, stats, seconds)."""
        loader, dataset = make_loader(via.url, 0, storage_options=via.storage_options, batch_size=64,
                                      read_ahead=0, retry=retry)
        proxy.configure(flavor=via.protocol, **faults)
        proxy.reset()
        started = time.monotonic()
        ids = sorted(i for batch in read_ids(loader, dataset) for i in batch)
        return ids, proxy.stats(), time.monotonic() - started

    def failing_read(self, via, proxy, retry, **faults):
        """The error of an epoch whose every data read meets ``faults``: (error, reads made, seconds)."""
        loader, dataset = make_loader(via.url, 0, storage_options=via.storage_options, batch_size=64,
                                      read_ahead=0, retry=retry)
        proxy.configure(flavor=via.protocol, **faults)
        proxy.reset()
        started = time.monotonic()
        with pytest.raises(errors.FileReadError) as failure:
            read_ids(loader, dataset)
        return failure.value, proxy.stats()["counts"].get("read", 0), time.monotonic() - started

    @pytest.mark.timeout(120)
    def test_a_stalled_connection_is_cut_retried_and_bounded(self, where, proxied):
        """Accepted, no first byte: cut after the policy's timeout and retried (exactly once); a store that
        never answers is an error naming the object within the deadline, one request per attempt."""
        write_files(where, SMALL)
        via, proxy = proxied
        ids, stats, seconds = self.read_through(via, proxy, self.PATIENT, stall_rate=0.3, seed=1)
        assert ids == list(range(SMALL_ROWS))
        assert stats["injected"].get("stall", 0) >= 1 and seconds < 45
        error, reads, seconds = self.failing_read(via, proxy, self.QUICK, stall_rate=1.0)
        assert re.search(r"part-\d\.parquet: storage did not answer within 1 s \(on every attempt\), 3 failed "
                         r"attempts over .*RetryPolicy\(timeout=", str(error)), str(error)
        assert reads == self.QUICK.attempts      # not attempts x s3fs x botocore
        assert seconds < 30

    @pytest.mark.parametrize("retry_after", [None, "100"])
    def test_persistent_slowdown_costs_one_request_per_attempt(self, where, proxied, retry_after):
        """503 SlowDown on every read: the policy's attempts and no more (S3 made 125, GCS 30), quickly, and a
        message that says throttled. A Retry-After past the deadline stops at once (gcsfs drops the
        response headers: GCS backs off as for a SlowDown without one)."""
        write_files(where, SMALL)
        via, proxy = proxied
        error, reads, seconds = self.failing_read(via, proxy, self.QUICK, error_rate=1.0, error_status=503,
                                                  retry_after=retry_after)
        assert re.search(r"part-\d\.parquet: throttled by the store .* over .*RetryPolicy\(deadline=", str(error))
        if retry_after is not None and where.protocol != "gs":
            assert "asked to wait 100 s (Retry-After)" in str(error)
            assert reads == 1
        else:
            assert "on every attempt" in str(error)
            assert reads == self.QUICK.attempts
        assert seconds < 20

    def test_truncated_bodies_are_retried_and_never_called_corrupt(self, where, proxied):
        """A body cut short whose Content-Length says the cut length (objects under 64 KiB are read whole, S3
        then fails its checksum): retried while planning and reading; every row once, or a FileReadError
        after the attempts, never a CorruptFileError."""
        write_files(where, SMALL)
        via, proxy = proxied
        proxy.configure(flavor=where.protocol, truncate_rate=0.4, seed=1)
        loader, dataset = make_loader(via.url, 0, storage_options=via.storage_options, batch_size=64, read_ahead=0,
                                      retry=self.PATIENT)
        assert proxy.stats()["injected"].get("truncate", 0) >= 1      # footers, while planning
        proxy.reset()
        assert sorted(i for batch in read_ids(loader, dataset) for i in batch) == list(range(SMALL_ROWS))
        assert proxy.stats()["injected"].get("truncate", 0) >= 1      # data, while reading
        error, reads, _ = self.failing_read(via, proxy, self.QUICK, truncate_rate=1.0)
        assert not isinstance(error, errors.CorruptFileError)
        assert re.search(r"part-\d\.parquet: .*3 failed attempts", str(error)), str(error)
        assert reads <= self.QUICK.attempts * 3      # Azure's SDK re-reads a short body itself (3 times, fixed)

    def test_connection_refused_then_recovery(self, where, proxied, caplog):
        """The store refuses connections for a second, then answers: retried (not an error), every row once."""
        write_files(where, SMALL)
        via, proxy = proxied
        # the window is long enough that a loaded machine still sends the first request inside it (a 1 s
        # window flaked under load); the attempts are many and the deadline bounds them, so they outlast it
        patient = RetryPolicy(attempts=200, base_delay=0.2, max_delay=0.5, timeout=2.0, deadline=20.0)
        caplog.set_level(logging.WARNING, logger="arrowstream")
        proxy.refuse(2.5)
        started = time.monotonic()
        loader, dataset = make_loader(via.url, 0, storage_options=via.storage_options, batch_size=64, retry=patient,
                                      read_ahead=0)
        ids = sorted(i for batch in read_ids(loader, dataset) for i in batch)
        assert ids == list(range(SMALL_ROWS))
        assert "unreachable" in caplog.text      # refused, retried
        assert time.monotonic() - started < 30

    def secret_options(self, server) -> dict[str, Any]:
        """Working storage_options whose credentials are long, unique strings."""
        return server.storage_options

    def test_read_ahead_threads_end_with_the_epochs_reading(self, where):
        """A loader without workers read to the end leaves no read-ahead thread in the trainer's process (they
        would stay until the dataset is collected); the next epoch starts them again."""
        loader, dataset = make_loader(write_files(where), 0, batch_size=100, read_ahead=2,
                                      storage_options=where.storage_options)
        for epoch in (0, 1):
            assert sorted(i for ids in read_ids(loader, dataset, epoch) for i in ids) == list(range(ROWS))
            deadline = time.monotonic() + 2.0   # far below the leak check's 5 s; a fetch in flight may end it
            while time.monotonic() < deadline and _read_ahead_threads():
                time.sleep(0.02)
            assert _read_ahead_threads() == []

    def test_credentials_appear_nowhere(self, where, server, proxied, caplog):
        options = self.secret_options(server)
        secrets = [v for k, v in options.items() if k in ("key", "secret", "token", "connection_string")
                   and isinstance(v, str) and len(v) > 8]
        path = write_files(where)
        caplog.set_level(logging.DEBUG, logger="arrowstream")
        loader, dataset = make_loader(path, 2, batch_size=100, storage_options=options)
        texts = [repr(dataset), repr(loader), repr(dataset._storage)]
        dataset.set_epoch(0)
        next(iter(loader))
        texts.append(json.dumps(loader.state_dict()))
        # its workers end now: kept to the end, the loader is freed with the frame that the errors' tracebacks
        # below hold, by the cyclic collector, and torch then waits 5 s for each worker (its own shutdown)
        del loader, dataset
        with pytest.raises(errors.ArrowStreamError) as missing:
            StructuredDataset(f"{where.url}/nothing-here/", storage_options=options)
        via, proxy = proxied
        proxy.configure(flavor=where.protocol, error_rate=0.3, reset_rate=0.1, seed=3)  # retried and logged
        read_ids(*make_loader(via.url, 0, batch_size=100, retry=self.PATIENT, storage_options={**via.storage_options, **{
            k: v for k, v in options.items() if k in ("key", "secret")}}))
        proxy.configure(flavor=where.protocol, error_rate=1.0, error_status=403)
        with pytest.raises(errors.ArrowStreamError) as failing:   # planning reads footers: not from the cache
            StructuredDataset(via.url, storage_options={**via.storage_options, **{
                k: v for k, v in options.items() if k in ("key", "secret")}}, batch_size=100, plan_cache=False)
        texts += [str(missing.value), str(failing.value), caplog.text]
        for secret in secrets:
            assert not any(secret in text for text in texts)


class TestS3(RemoteContract):
    server_fixture = "s3_server"

    def secret_options(self, server) -> dict[str, Any]:  # moto takes any key
        return {**server.storage_options, "key": f"AKIA{uuid.uuid4().hex[:16].upper()}",
                "secret": f"s3cr3t/{uuid.uuid4().hex}"}


class TestGcs(RemoteContract):
    server_fixture = "gcs_server"

    @pytest.fixture
    def via(self, proxied):
        """gcp-storage-emulator ignores ifGenerationMatch and sends no x-goog-generation: the proxy answers
        reads as GCS does (see ``proxy.Faults.gcs_generations``)."""
        where, proxy = proxied
        proxy.configure(flavor="gs", gcs_generations=True)
        return where


class TestAzure(RemoteContract):
    server_fixture = "azure_server"

    # the Azure SDK's own retries (15 s and more between them) are turned down when arrowstream opens the
    # filesystem (arrowstream/_storage/backends.py), so fault tests need no shorter SDK backoff


class RotatingKeys:
    """A credential provider: the keys of ``keys`` in turn, one more each time a process asks again.

    Its first answer in every process is a key the store already considers expired, so every
    worker meets an expired-token error and must ask again. Picklable, as a provider must be.
    """

    def __init__(self, keys: list[str], calls_file: str) -> None:
        self.keys, self.calls_file = keys, calls_file
        self._calls: dict[int, int] = {}

    def __call__(self) -> dict[str, Any]:
        import os

        count = self._calls.get(os.getpid(), 0)
        self._calls[os.getpid()] = count + 1
        with open(self.calls_file, "a") as f:
            f.write(f"{os.getpid()}\n")
        key = self.keys[min(count, len(self.keys) - 1)]
        return {"key": key, "secret": f"secret-of-{key}"}


class KeyFile:
    """A credential provider that reads the current key from a file, as a token refresher would."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self) -> dict[str, Any]:
        with open(self.path) as f:
            key = f.read().strip()
        return {"key": key, "secret": f"secret-of-{key}"}


# split order only: splits are read as the batches go, so a key expires mid-read (a shuffle buffer holding this
# small epoch whole would read all of it before the first batch)
EXPIRY_ORDER = {"shuffle": True, "seed": 5, "shuffle_buffer_size": 0}


def _expiry_setup(s3_server, num_workers):
    where = Where(s3_server.url(f"creds-{uuid.uuid4().hex[:8]}"), s3_server.storage_options, "s3")
    path = write_files(where)
    reference = read_ids(*make_loader(path, num_workers, storage_options=where.storage_options, batch_size=64,
                                      **EXPIRY_ORDER))
    return path, reference


def test_credentials_expiring_mid_run_are_refreshed_and_the_read_goes_on(s3_server, tmp_path, caplog):
    path, reference = _expiry_setup(s3_server, 0)
    key_file = tmp_path / "key"
    key_file.write_text("AKIAOLDOLDOLDOLD")
    with start_proxy(s3_server.endpoint) as proxy:
        options = {k: v for k, v in s3_server.options_via(proxy.endpoint).items() if k not in ("key", "secret")}
        caplog.set_level(logging.WARNING, logger="arrowstream")
        loader, dataset = make_loader(path, 0, batch_size=64, **EXPIRY_ORDER, storage_options=options,
                                      credential_provider=KeyFile(str(key_file)), read_ahead=0)
        dataset.set_epoch(0)
        got = []
        for step, batch in enumerate(loader):
            got.append(ids_of(batch))
            if step == 3:   # the key is rotated and the old one expires, mid-epoch
                key_file.write_text("AKIANEWNEWNEWNEW")
                proxy.configure(expired_keys=["AKIAOLDOLDOLDOLD"])
        injected = proxy.stats()["injected"]
    assert got == reference
    assert injected.get("expired", 0) >= 1
    assert "credentials expired" in caplog.text
    assert "secret-of" not in caplog.text and "NEWNEW" not in caplog.text


def test_listing_and_footers_refresh_expired_credentials(s3_server, tmp_path):
    """Planning meets an expired key at its first request (the listing): it asks the provider again and
    lists and reads the footers with the new key."""
    path, reference = _expiry_setup(s3_server, 0)
    calls = tmp_path / "calls.txt"
    with start_proxy(s3_server.endpoint) as proxy:
        options = {k: v for k, v in s3_server.options_via(proxy.endpoint).items() if k not in ("key", "secret")}
        proxy.configure(expired_keys=["AKIAOLDOLDOLDOLD"])
        provider = RotatingKeys(["AKIAOLDOLDOLDOLD", "AKIANEWNEWNEWNEW"], str(calls))
        loader, dataset = make_loader(path, 0, batch_size=64, **EXPIRY_ORDER, storage_options=options,
                                      credential_provider=provider)
        stats = proxy.stats()
        got = read_ids(loader, dataset)
    assert stats["injected"].get("expired", 0) == 1      # the first listing request; then all with the new key
    assert stats["counts"].get("list", 0) == 2
    assert len(calls.read_text().split()) == 2
    assert got == reference


def test_every_worker_refreshes_expired_credentials(s3_server, tmp_path):
    path, reference = _expiry_setup(s3_server, 2)
    calls = tmp_path / "calls.txt"
    with start_proxy(s3_server.endpoint) as proxy:
        options = {k: v for k, v in s3_server.options_via(proxy.endpoint).items() if k not in ("key", "secret")}
        provider = RotatingKeys(["AKIAOLDOLDOLDOLD", "AKIANEWNEWNEWNEW"], str(calls))
        loader, dataset = make_loader(path, 2, batch_size=64, **EXPIRY_ORDER, storage_options=options,
                                      credential_provider=provider)
        proxy.configure(expired_keys=["AKIAOLDOLDOLDOLD"])   # what each worker is given first has expired
        got = read_ids(loader, dataset)
        injected = proxy.stats()["injected"]
    assert got == reference
    assert injected.get("expired", 0) >= 2
    worker_calls = Counter(calls.read_text().split())
    assert sum(1 for count in worker_calls.values() if count >= 2) >= 2   # each worker asked again


def test_only_rank_zero_lists_and_reads_footers_under_torchrun(s3_server, tmp_path):
    """Under torch.distributed, rank 0 plans and hands the plan to the other ranks: one listing and one
    footer read per file for the whole job, however many ranks."""
    from test_distributed import check_epoch, torchrun

    where = Where(s3_server.url(f"ranks-{uuid.uuid4().hex[:8]}"), s3_server.storage_options, "s3")
    path = write_files(where)
    with start_proxy(s3_server.endpoint) as proxy:
        options = {"batch_size": 50, "shuffle": True, "seed": 1, "storage_options": s3_server.options_via(proxy.endpoint)}
        scenarios = [{"name": "s3", "path": path, "num_workers": 1, "epochs": [0], "options": options}]
        proxy.reset()
        per_rank = torchrun(3, {"scenarios": scenarios}, tmp_path)
        counts = proxy.stats()["counts"]
    check_epoch(per_rank, "s3", "0", ROWS)
    assert counts.get("list", 0) <= 2                        # rank 0's listing, not one per rank
    groups = sum(-(-rows // group) for rows, group in LAYOUT)
    assert counts.get("read", 0) <= len(LAYOUT) + groups      # footers once, then one request per row group


def _read_ahead_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("arrowstream-read-ahead")]
