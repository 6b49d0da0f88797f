"""Real object stores on loopback for tests: S3 (moto), GCS (gcp-storage-emulator), Azure Blob (Azurite).

Each server runs as a subprocess in its own process group (its own session), bound to 127.0.0.1 on a
free port, with its output kept out of the test output (it is shown only if the server fails to
start). ``start_s3()``, ``start_gcs()`` and ``start_azure()`` are context managers yielding an
:class:`ObjectStore` with an empty bucket (container); the session fixtures ``s3_server``,
``gcs_server`` and ``azure_server`` wrap them. A test module uses a fixture by importing it into its
namespace, where pytest finds it::

    from servers import s3_server  # noqa: F401

Azurite comes from npm: it is installed on first use into ``~/.cache/arrowstream-tests/`` (or
``$ARROWSTREAM_TEST_CACHE``), outside the repository.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import fsspec
import pytest

# gcsfs >= 2026.3.0 (fsspec/gcsfs#773; checked with gcsfs 2026.10.1) makes ``gcsfs.GCSFileSystem`` the
# ExtendedGcsFileSystem, which asks each bucket for its storage layout (hierarchical namespace, zonal)
# over gRPC, at the endpoint_url. The emulator speaks HTTP only, so every open stalls ~60 s in
# retries, and is tried again on the next one (an unknown layout is not cached). gcsfs reads this
# variable once, when it is imported (gcsfs/__init__.py: anything but "true"/"1" keeps the plain
# HTTP GCSFileSystem); there is no per-filesystem option. Set here, before gcsfs is imported, and
# inherited by every subprocess (spawned DataLoader workers included).
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

AZURITE_VERSION = "3.35.0"  # the newest for node 20: azurite 3.36 needs node >= 21, 3.37 node >= 22
AZURE_ACCOUNT = "devstoreaccount1"
# Azurite's fixed, publicly documented development key (not a secret)
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
START_TIMEOUT_S = 60.0

# clients reach the loopback servers directly, even where the environment sets a proxy
for _var in ("NO_PROXY", "no_proxy"):
    os.environ[_var] = ",".join(filter(None, (os.environ.get(_var), "127.0.0.1")))
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_running: dict[int, subprocess.Popen[bytes]] = {}  # process-group id -> server, for server_process_groups()


@dataclass
class ObjectStore:
    """A running object-store server with one empty bucket (container)."""

    protocol: str  # the fsspec protocol: "s3", "gs", "az"
    bucket: str
    endpoint: str  # http://127.0.0.1:<port>
    storage_options: dict[str, Any]
    process: subprocess.Popen[bytes] = field(repr=False)
    log: IO[bytes] = field(repr=False)
    options_at: Callable[[str], dict[str, Any]] = field(repr=False)  # storage_options for another endpoint

    def options_via(self, endpoint: str) -> dict[str, Any]:
        """``storage_options`` that reach this server through ``endpoint`` (a proxy in front of it)."""
        return self.options_at(endpoint)

    @property
    def url_prefix(self) -> str:
        """``s3://bucket``, ``gs://bucket`` or ``az://container``."""
        return f"{self.protocol}://{self.bucket}"

    def url(self, *parts: str) -> str:
        """A URL inside the bucket: ``url("data", "a.parquet")`` -> ``s3://bucket/data/a.parquet``."""
        return "/".join((self.url_prefix, *parts))

    def filesystem(self) -> fsspec.AbstractFileSystem:
        """A new fsspec filesystem on this server (not shared through fsspec's instance cache)."""
        return fsspec.filesystem(self.protocol, skip_instance_cache=True, **self.storage_options)

    def stop(self) -> None:
        """Stop the server's whole process group: SIGTERM, then SIGKILL after 10 s. Idempotent."""
        _kill_group(self.process)
        self.log.close()


def server_process_groups() -> set[int]:
    """Process-group ids of the servers running now (a leftover-process check should skip these)."""
    return {pgid for pgid, proc in _running.items() if proc.poll() is None}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Linux: servers are started through this, so that they get SIGTERM if pytest is killed (no orphans even
# then): it sets PR_SET_PDEATHSIG (kept across exec) and execs the server. (Not preexec_fn: thread-unsafe.)
_DIE_WITH_PARENT = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
                    "os.getppid() == int(sys.argv[1]) or sys.exit(1); os.execv(sys.argv[2], sys.argv[2:])")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)  # the group's id is the server's pid (start_new_session)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait_s)
            break
    _running.pop(proc.pid, None)


@atexit.register
def _kill_all() -> None:
    for proc in list(_running.values()):
        _kill_group(proc)


def _start(command: list[str], port: int) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    """Run ``command`` in its own session, output to a temporary file; return once ``port`` answers HTTP."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 (open while the server runs)
    launcher = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid())] if sys.platform.startswith("linux") else []
    proc = subprocess.Popen([*launcher, *command], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    _running[proc.pid] = proc
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            _NO_PROXY.open(f"http://127.0.0.1:{port}/", timeout=2).close()
            return proc, log
        except urllib.error.HTTPError:  # an HTTP error status is an answer: the server is up
            return proc, log
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            _kill_group(proc)
            log.seek(0)
            output = log.read()[-4000:].decode(errors="replace")
            log.close()
            raise RuntimeError(f"{command[:4]} did not start on port {port} (exit code {proc.returncode}):\n{output}")
        time.sleep(0.05)


@contextlib.contextmanager
def _serving(protocol: str, command: Callable[[int], list[str]], options: Callable[[str], dict[str, Any]],
             bucket: str, make_bucket: Callable[[fsspec.AbstractFileSystem, str], None] | None = None,
             ) -> Iterator[ObjectStore]:
    for attempt in range(3):  # another process may take the free port before the server binds it: retry
        port = _free_port()
        try:
            proc, log = _start(command(port), port)
            break
        except RuntimeError:
            if attempt == 2:
                raise
    endpoint = f"http://127.0.0.1:{port}"
    store = ObjectStore(protocol, bucket, endpoint, options(endpoint), proc, log, options)
    try:
        if make_bucket:
            make_bucket(store.filesystem(), bucket)
        yield store
    finally:
        store.stop()


def _bucket_name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def start_s3() -> contextlib.AbstractContextManager[ObjectStore]:
    """moto's S3 server; s3fs with ``endpoint_url`` and moto's accept-anything credentials."""

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]

    def options(endpoint: str) -> dict[str, Any]:
        return {"key": "testing", "secret": "testing", "endpoint_url": endpoint,
                "client_kwargs": {"region_name": "us-east-1"}}

    def make_bucket(fs: fsspec.AbstractFileSystem, bucket: str) -> None:
        fs.call_s3("create_bucket", Bucket=bucket)  # fs.mkdir would send LocationConstraint=us-east-1: refused
    return _serving("s3", command, options, _bucket_name(), make_bucket)


def start_gcs() -> contextlib.AbstractContextManager[ObjectStore]:
    """gcp-storage-emulator, in memory; gcsfs with ``endpoint_url`` and anonymous access."""
    import gcsfs

    if gcsfs.GCSFileSystem is not gcsfs.core.GCSFileSystem:
        raise RuntimeError("gcsfs was imported before tests/servers.py: its gRPC bucket-type probe would stall "
                           "every call on the emulator; import servers earlier or set "
                           "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false")
    bucket = _bucket_name()

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "gcp_storage_emulator", "start", "-H", "127.0.0.1", "--port", str(port),
                "--default-bucket", bucket, "--in-memory", "--quiet"]

    def options(endpoint: str) -> dict[str, Any]:
        return {"endpoint_url": endpoint, "token": "anon", "project": "test-project"}
    return _serving("gs", command, options, bucket)  # --default-bucket made it


def azurite_main() -> Path:
    """Azurite's blob service script, installed from npm on first use (under a lock: xdist-safe)."""
    cache = Path(os.environ.get("ARROWSTREAM_TEST_CACHE", Path.home() / ".cache" / "arrowstream-tests"))
    prefix = cache / f"azurite-{AZURITE_VERSION}"
    main = prefix / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
    done = prefix / ".installed"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "azurite.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            npm = shutil.which("npm")
            if npm is None:
                raise RuntimeError("npm is not on PATH: Azurite cannot be installed")
            result = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                                     "--loglevel=error", f"azurite@{AZURITE_VERSION}"],
                                    stdin=subprocess.DEVNULL, capture_output=True, timeout=600, check=False)
            if result.returncode != 0 or not main.exists():
                raise RuntimeError(f"npm install azurite failed:\n{result.stdout.decode()}{result.stderr.decode()}")
            done.touch()
    return main


def start_azure() -> contextlib.AbstractContextManager[ObjectStore]:
    """Azurite's blob service, in memory; adlfs with the well-known devstoreaccount1 connection string."""
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node is not on PATH: Azurite cannot run")
    main = azurite_main()

    def command(port: int) -> list[str]:
        # --inMemoryPersistence: nothing on disk (then --location is refused); --skipApiVersionCheck: the
        # azure-storage-blob SDK may be newer than this Azurite; --loose: ignore headers Azurite lacks;
        # --disableTelemetry: Azurite collects telemetry by default
        return [node, str(main), "--blobHost", "127.0.0.1", "--blobPort", str(port),
                "--inMemoryPersistence", "--silent", "--skipApiVersionCheck", "--loose", "--disableTelemetry"]

    def options(endpoint: str) -> dict[str, Any]:
        return {"connection_string": f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};"
                                     f"AccountKey={AZURE_KEY};BlobEndpoint={endpoint}/{AZURE_ACCOUNT};"}
    return _serving("az", command, options, _bucket_name(), lambda fs, name: fs.mkdir(name))


@pytest.fixture(scope="session")
def s3_server() -> Iterator[ObjectStore]:
    """An S3 server (moto) for the whole session (moto[server] and s3fs are dev dependencies)."""
    with start_s3() as store:
        yield store


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[ObjectStore]:
    """A GCS server (gcp-storage-emulator) for the whole session (it and gcsfs are dev dependencies)."""
    with start_gcs() as store:
        yield store


@pytest.fixture(scope="session")
def azure_server() -> Iterator[ObjectStore]:
    """An Azure Blob server (Azurite, installed with npm on first use) for the whole session."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("the Azure tests run Azurite, which needs node and npm on PATH (apt install nodejs npm)")
    with start_azure() as store:
        yield store
