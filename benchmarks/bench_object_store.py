"""Object stores: planning thousands of files and reading splits on S3 (moto) behind a 20 ms latency proxy.

Run from the repository root:

    .venv/bin/python benchmarks/bench_object_store.py            # the real run, about 9 min on 2 cores
    .venv/bin/python benchmarks/bench_object_store.py --quick    # smoke run (about 2 min)
    .venv/bin/python benchmarks/bench_object_store.py --out benchmarks/results/2026-11-21-object-store.md

Servers: moto's S3 server on loopback (``tests/servers.py``) and, in front of it, ``tests/proxy.py``, which adds
a latency to every request and counts requests by kind (list / head / read). Data is written straight to moto;
every measured client reaches it through the proxy, once with ``--latencies`` 20 ms per request (like a real
object store) and once with no added latency. moto, the proxy and the client share the machine's cores, so the
report gives each one's CPU time as well.

1. **Planning at scale**: datasets of ``--plan-files`` (2,000 and 10,000) Parquet files of ``--small-rows`` rows,
   the smaller dataset nested inside the larger one. Timed: ``StructuredDataset(url, storage_options=...)``
   (lists once, reads the footers with up to 32 threads); the naive loop (``fs.find(url)``, then
   ``pq.read_metadata(fs.open(path))`` file after file, plain s3fs); and, once on the smallest dataset, a floor:
   s3fs ``cat_ranges`` of the same footer bytes in one asynchronous batch, what the machine allows any s3fs client.
   arrowstream runs ``--plan-repeats`` times on the smallest dataset, once on the others. The naive loop runs over
   the files in a random order; when, after ``--naive-sample`` files, its projected time exceeds ``--naive-limit``
   seconds it stops and the total is extrapolated linearly (the report says so).
2. **Read path**: ``--read-files`` files of ``--read-rows`` rows (row groups of ``--row-group-rows``; ``id``
   int64, 8 float32, ``label`` int8, ``name`` string; snappy), one epoch with ``batch_size=1024`` and torch
   output: the plain loop (``pq.ParquetFile(fs.open(path)).iter_batches``, s3fs defaults, the suite's
   conversion), arrowstream ``num_workers=0`` with ``read_ahead`` 0/1/2, ``num_workers=2`` with ``read_ahead=1``,
   ``read_ahead=1`` with ``split_bytes=64 MiB`` (a split per file: fewer, larger requests), and projected reads
   of two numeric columns. Every arrowstream epoch is checked to yield each
   ``id`` exactly once. Bytes are counted in the client (s3fs's read calls, this process only) and compared
   with what the file metadata says the columns need. At 20 ms a diagnostic instruments arrowstream's
   read-ahead (time the reader waited on fetches).
3. **Memory**: peak RSS growth over one epoch (``num_workers=0``, ``read_ahead`` 0/1/2), each in a fresh
   process: the peak RSS counter is reset after planning (``/proc/self/clear_refs``) and read after the epoch.

Rounds interleave the variants in a rotating order (``--repeats``, medians), as the other benchmarks do. The
markdown report goes to stdout (and to ``--out``); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import io
import json
import os
import random
import resource
import shlex
import statistics
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent / "tests"))
sys.path.insert(0, str(BENCH_DIR))

import servers  # first: it keeps gcsfs's gRPC probe off before anything imports gcsfs

# isort: split

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import s3fs
from bench_suite import arrowstream_commit, loadavg, main_versions
from proxy import ProxyProcess, start_proxy
from suite.baselines import convert
from suite.common import emit_report, log
from suite.report import fmt_ms, fmt_ratio, fmt_rps, machine

# _prefetch: the read-ahead diagnostics wrap a few of its methods during a run and restore them after
from arrowstream import StructuredDataset
from arrowstream._storage import pinned as _pinned
from arrowstream._storage import prefetch as _prefetch

warnings.filterwarnings("ignore", message=".*not writable.*")  # torch.from_numpy on Arrow buffers

BATCH = 1024
GOAL_FILES, GOAL_RATIO = 2000, 10.0
EXTRA_PACKAGES = ("fsspec", "s3fs", "aiobotocore", "aiohttp", "moto")
RSS_PREFIX = "RSS_RESULT "
SPLIT_BYTES = 64 << 20    # a split per file here: fewer, larger requests
PROJECTED = ["id", "f0"]   # two numeric columns; id is kept for the exactly-once check

Batch = dict[str, Any]
_STARTED = time.perf_counter()


def progress(message: str) -> None:
    log(f"{time.perf_counter() - _STARTED:6.0f} s  {message}")


# -- processes and counters --------------------------------------------------------------------


@dataclass(frozen=True)
class Cpu:
    """CPU seconds of moto, of the proxy and of this process (with its waited-for children: loader workers)."""

    moto: float
    proxy: float
    client: float

    def minus(self, other: Cpu) -> Cpu:
        return Cpu(self.moto - other.moto, self.proxy - other.proxy, self.client - other.client)


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_now(store: servers.ObjectStore, proxy: ProxyProcess) -> Cpu:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Cpu(proc_cpu_seconds(store.process.pid), proc_cpu_seconds(proxy.process.pid),
               time.process_time() + children.ru_utime + children.ru_stime)


@dataclass
class Run:
    """One measured call: wall seconds, the proxy's request counts, CPU, bytes received and what it returned."""

    seconds: float
    counts: dict[str, int]
    cpu: Cpu
    received: int
    value: Any


@dataclass
class Env:
    """The servers, as the measurements need them."""

    store: servers.ObjectStore
    proxy: ProxyProcess
    latency: float = 0.0

    @property
    def options(self) -> dict[str, Any]:
        return self.store.options_via(self.proxy.endpoint)

    def set_latency(self, latency: float) -> None:
        self.proxy.configure(latency=latency)
        self.latency = latency


@contextlib.contextmanager
def counting_bytes() -> Iterator[list[int]]:
    """Count the bytes s3fs hands to this process: ranged reads (``_cat_file``), file reads (``_fetch_range``)
    and arrowstream's pinned ranged reads (each answer passes ``Pin.check``)."""
    received = [0]
    cat_file, fetch_range = s3fs.S3FileSystem._cat_file, s3fs.core.S3File._fetch_range
    check = _pinned.Pin.check

    def counted_check(self: Any, data: bytes, *args: Any) -> bytes:
        received[0] += len(data)
        return check(self, data, *args)

    async def counted_cat_file(self: Any, *args: Any, **kwargs: Any) -> bytes:
        data: bytes = await cat_file(self, *args, **kwargs)
        received[0] += len(data)
        return data

    def counted_fetch_range(self: Any, start: int, end: int) -> bytes:
        data: bytes = fetch_range(self, start, end)
        received[0] += len(data)
        return data

    s3fs.S3FileSystem._cat_file = counted_cat_file
    s3fs.core.S3File._fetch_range = counted_fetch_range
    _pinned.Pin.check = counted_check  # type: ignore[method-assign]
    try:
        yield received
    finally:
        s3fs.S3FileSystem._cat_file, s3fs.core.S3File._fetch_range = cat_file, fetch_range
        _pinned.Pin.check = check  # type: ignore[method-assign]


def measure(env: Env, fn: Callable[[], Any]) -> Run:
    """Run ``fn`` cold (no cached s3fs instance, so no cached listing) and take its costs."""
    s3fs.S3FileSystem.clear_instance_cache()
    env.proxy.reset()
    before = cpu_now(env.store, env.proxy)
    with counting_bytes() as received:
        start = time.perf_counter()
        value = fn()
        seconds = time.perf_counter() - start
    cpu = cpu_now(env.store, env.proxy).minus(before)
    counts = {k: int(v) for k, v in env.proxy.stats()["counts"].items()}
    return Run(seconds, counts, cpu, received[0], value)


# -- planning ----------------------------------------------------------------------------------


def small_file(index: int, rows: int) -> bytes:
    """A tiny Parquet file: ``id`` (unique over the dataset) and one float column."""
    ids = np.arange(index * rows, (index + 1) * rows, dtype=np.int64)
    table = pa.table({"id": ids, "value": ids.astype(np.float64) / 7})
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="snappy")
    return sink.getvalue()


def nested_folders(store: servers.ObjectStore, sizes: list[int]) -> list[str]:
    """One URL per dataset size; each smaller dataset is a subfolder of the next one."""
    return [store.url("many", *["inner"] * (len(sizes) - 1 - k)) for k in range(len(sizes))]


def write_small_files(store: servers.ObjectStore, sizes: list[int], rows: int) -> list[str]:
    """Write the planning datasets straight to moto (not through the proxy); return their URLs."""
    urls = nested_folders(store, sizes)
    fs = store.filesystem()
    done = 0
    for url, size in zip(urls, sizes):
        objects = {f"{url}/part-{i:06d}.parquet": small_file(i, rows) for i in range(done, size)}
        progress(f"writing {len(objects):,} small files into {url}")
        fs.pipe(objects)
        done = size
    return urls


def plan_arrowstream(env: Env, url: str, files: int, rows: int) -> int:
    dataset = StructuredDataset(url, batch_size=BATCH, storage_options=env.options, plan_cache=False)
    if dataset.num_files != files or dataset.num_rows != files * rows:
        raise RuntimeError(f"planned {dataset.num_files} files / {dataset.num_rows} rows, expected {files} / "
                           f"{files * rows}")
    return files


def plan_floor(env: Env, url: str) -> int:
    """The same footer bytes (the last 64 KiB of each file) in one asynchronous s3fs batch, after one listing."""
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **env.options)
    infos = fs.find(url, detail=True)
    paths = sorted(infos)
    sizes = [int(infos[p]["size"]) for p in paths]
    fs.cat_ranges(paths, [max(0, s - _prefetch.SMALL_READ) for s in sizes], sizes, on_error="raise")
    return len(paths)


@dataclass
class Naive:
    """The naive loop: how many files it read, of how many, and the time it took or would take."""

    done: int
    total: int
    find_s: float
    files_s: float

    @property
    def sampled(self) -> bool:
        return self.done < self.total

    @property
    def projected_s(self) -> float:
        return self.find_s + self.files_s * self.total / self.done


def naive_loop(env: Env, url: str, sample: int, limit_s: float, seed: int) -> Naive:
    """``fs.find`` then ``pq.read_metadata(fs.open(path))`` per file, in a random order; stops after ``sample``
    files when the projected total exceeds ``limit_s``."""
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **env.options)
    start = time.perf_counter()
    paths = fs.find(url)
    find_s = time.perf_counter() - start
    random.Random(seed).shuffle(paths)
    start = time.perf_counter()
    for done, path in enumerate(paths, 1):
        with fs.open(path, "rb") as f:
            pq.read_metadata(f)
        if done == sample and Naive(done, len(paths), find_s, time.perf_counter() - start).projected_s > limit_s:
            return Naive(done, len(paths), find_s, time.perf_counter() - start)
    return Naive(len(paths), len(paths), find_s, time.perf_counter() - start)


@dataclass
class PlanRow:
    files: int
    latency: float
    method: str
    runs: list[Run] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        if self.method == "naive":
            return float(statistics.median(r.value.projected_s for r in self.runs))
        return float(statistics.median(r.seconds for r in self.runs))


def measure_planning(env: Env, args: argparse.Namespace, urls: list[str]) -> list[PlanRow]:
    rows: list[PlanRow] = []
    for size_index, (url, files) in enumerate(zip(urls, args.plan_files)):
        repeats = args.plan_repeats if size_index == 0 else 1
        for latency in args.latencies:
            env.set_latency(latency)
            ours, floor = PlanRow(files, latency, "arrowstream"), PlanRow(files, latency, "floor")
            for round_ in range(repeats):
                progress(f"planning {files:,} files, {latency * 1e3:.0f} ms: arrowstream ({round_ + 1}/{repeats})")
                ours.runs.append(measure(env, functools.partial(plan_arrowstream, env, url, files, args.small_rows)))
                if round_ == 0 and size_index == 0:   # the floor once, on the smallest dataset, between our runs
                    progress(f"planning {files:,} files, {latency * 1e3:.0f} ms: floor")
                    floor.runs.append(measure(env, functools.partial(plan_floor, env, url)))
            naive = PlanRow(files, latency, "naive")
            progress(f"planning {files:,} files, {latency * 1e3:.0f} ms: naive loop")
            naive.runs.append(measure(env, functools.partial(naive_loop, env, url, args.naive_sample, args.naive_limit,
                                                             args.seed)))
            rows += [ours, floor, naive] if floor.runs else [ours, naive]
    return rows


# -- read path: data ---------------------------------------------------------------------------


@dataclass
class ReadData:
    url: str
    paths: list[str]
    rows: int
    file_bytes: int
    metadata: list[pq.FileMetaData]

    def column_bytes(self, columns: list[str] | None) -> int:
        """Compressed bytes of the column chunks of ``columns`` (all when None), over all files."""
        total = 0
        for md in self.metadata:
            for g in range(md.num_row_groups):
                group = md.row_group(g)
                for c in range(group.num_columns):
                    chunk = group.column(c)
                    if columns is None or chunk.path_in_schema in columns:
                        total += chunk.total_compressed_size
        return total

    @property
    def row_groups(self) -> int:
        return sum(md.num_row_groups for md in self.metadata)


def read_table(index: int, rows: int, rng: np.random.Generator) -> pa.Table:
    columns: dict[str, Any] = {"id": np.arange(index * rows, (index + 1) * rows, dtype=np.int64)}
    for k in range(8):
        columns[f"f{k}"] = rng.random(rows, dtype=np.float32)
    columns["label"] = rng.integers(0, 10, rows, dtype=np.int8)
    words = np.array([f"name-{w:05d}"[: 4 + w % 9] + "x" * (w % 5) for w in range(5000)])
    columns["name"] = pa.array(words[rng.integers(0, len(words), rows)])
    return pa.table(columns)


def write_read_files(store: servers.ObjectStore, args: argparse.Namespace) -> ReadData:
    rng = np.random.default_rng(args.seed)
    url = store.url("wide")
    objects, metas = {}, []
    for i in range(args.read_files):
        sink = io.BytesIO()
        pq.write_table(read_table(i, args.read_rows, rng), sink, row_group_size=args.row_group_rows,
                       compression="snappy")
        data = sink.getvalue()
        objects[f"{url}/part-{i:03d}.parquet"] = data
        metas.append(pq.read_metadata(pa.BufferReader(data)))
    progress(f"writing {len(objects)} files of {args.read_rows:,} rows into {url}")
    store.filesystem().pipe(objects)
    return ReadData(url, sorted(objects), args.read_files * args.read_rows, sum(map(len, objects.values())), metas)


# -- read path: loaders ------------------------------------------------------------------------


def plain_loop(env: Env, url: str, columns: list[str] | None) -> Iterator[Batch]:
    """The plain loop: list, then ``pq.ParquetFile(fs.open(path)).iter_batches`` file after file (s3fs defaults)."""
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **env.options)
    for path in sorted(fs.find(url)):
        with fs.open(path, "rb") as f:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=BATCH, columns=columns):
                yield convert(batch)


def arrowstream_loop(env: Env, url: str, workers: int, read_ahead: int, columns: list[str] | None,
                     split_bytes: int | None) -> Iterator[Batch]:
    loader, dataset = StructuredDataset.create_dataloader(
        path=url, num_workers=workers, batch_size=BATCH, storage_options=env.options, read_ahead=read_ahead,
        columns=columns, split_bytes=split_bytes, output_format="torch", shuffle=False, plan_cache=False)
    dataset.set_epoch(0)
    return iter(loader)


@dataclass(frozen=True)
class Variant:
    """One read-path loader: ``workers`` None is the plain loop."""

    label: str
    workers: int | None = None
    read_ahead: int = 0
    columns: tuple[str, ...] | None = None
    split_bytes: int | None = None
    diagnose: bool = False

    def make(self, env: Env, url: str) -> Callable[[], Iterator[Batch]]:
        columns = list(self.columns) if self.columns else None
        if self.workers is None:
            return lambda: plain_loop(env, url, columns)
        workers, read_ahead, split_bytes = self.workers, self.read_ahead, self.split_bytes
        return lambda: arrowstream_loop(env, url, workers, read_ahead, columns, split_bytes)


def read_variants(latency: float) -> list[Variant]:
    out = [Variant("plain loop (pyarrow + s3fs)"),
           Variant("arrowstream w=0, read_ahead=0", 0, 0, diagnose=True),
           Variant("arrowstream w=0, read_ahead=1", 0, 1, diagnose=True),
           Variant("arrowstream w=0, read_ahead=2", 0, 2, diagnose=True),
           Variant("arrowstream w=2, read_ahead=1", 2, 1),
           Variant("arrowstream w=0, read_ahead=1, split_bytes=64 MiB", 0, 1, split_bytes=SPLIT_BYTES),
           Variant("plain loop, 2 columns", None, 0, tuple(PROJECTED)),
           Variant("arrowstream w=0, read_ahead=0, 2 columns", 0, 0, tuple(PROJECTED)),
           Variant("arrowstream w=0, read_ahead=1, 2 columns", 0, 1, tuple(PROJECTED))]
    return out


@dataclass
class Epoch:
    first_s: float
    rows: int
    ids: np.ndarray


def read_epoch(make: Callable[[], Iterator[Batch]]) -> Epoch:
    """One epoch, from building the loader to the last batch; the ``id`` of every row."""
    start = time.perf_counter()
    iterator = make()
    first_s = 0.0
    ids = []
    for batch in iterator:
        if not ids:
            first_s = time.perf_counter() - start
        ids.append(np.asarray(batch["id"]).copy())
    every = np.concatenate(ids)
    return Epoch(first_s, len(every), every)


def check_exactly_once(label: str, epoch: Epoch, rows: int) -> None:
    if epoch.rows != rows or not np.array_equal(np.sort(epoch.ids), np.arange(rows)):
        raise RuntimeError(f"{label}: read {epoch.rows} rows, not each of the {rows} ids exactly once")


@contextlib.contextmanager
def read_ahead_probe() -> Iterator[dict[str, float]]:
    """Time the reader's waits on read-ahead and the fetches."""
    probe = {"waited_s": 0.0, "fetch_s": 0.0, "fetches": 0, "direct_s": 0.0, "direct": 0}
    cls, parts = _prefetch.Prefetcher, _prefetch.PartsFile
    saved = (cls.read, _prefetch.read_ranges, parts._read_direct)
    read, ranges, direct = saved

    def timed(key: str, count: str | None, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                probe[key] += time.perf_counter() - start
                if count:
                    probe[count] += 1
        return wrapper

    timed_fetch = timed("fetch_s", "fetches", ranges)

    def fetch(*args: Any) -> Any:
        """The prefetcher's pool threads fetch; a direct read calls the same function in the reader's thread."""
        if threading.current_thread().name.startswith("arrowstream-read-ahead"):
            return timed_fetch(*args)
        return ranges(*args)

    cls.read, _prefetch.read_ranges = timed("waited_s", None, read), fetch
    parts._read_direct = timed("direct_s", "direct", direct)
    try:
        yield probe
    finally:
        cls.read, _prefetch.read_ranges, parts._read_direct = saved


@dataclass
class ReadRow:
    latency: float
    variant: Variant
    runs: list[Run] = field(default_factory=list)
    probes: list[dict[str, float]] = field(default_factory=list)

    def median(self, fn: Callable[[Run], float]) -> float:
        return float(statistics.median(fn(r) for r in self.runs))


def measure_variant(env: Env, data: ReadData, variant: Variant) -> tuple[Run, dict[str, float] | None]:
    make = variant.make(env, data.url)
    probe_cm = read_ahead_probe() if variant.diagnose else contextlib.nullcontext(None)
    with probe_cm as probe:
        run = measure(env, lambda: read_epoch(make))
    check_exactly_once(variant.label, run.value, data.rows)
    run.value.ids = np.empty(0, np.int64)   # checked: free the memory
    return run, probe


def measure_reads(env: Env, data: ReadData, args: argparse.Namespace) -> list[ReadRow]:
    out: list[ReadRow] = []
    for latency in args.latencies:
        env.set_latency(latency)
        rows = [ReadRow(latency, v) for v in read_variants(latency)]
        for round_ in range(args.repeats):
            shift = round_ * 3 % len(rows)
            for row in rows[shift:] + rows[:shift]:
                progress(f"read {latency * 1e3:.0f} ms, round {round_ + 1}/{args.repeats}: {row.variant.label}")
                run, probe = measure_variant(env, data, row.variant)
                row.runs.append(run)
                if probe is not None:
                    row.probes.append(probe)
        out += rows
    return out


# -- memory ------------------------------------------------------------------------------------


def status_kib(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field_name} in /proc/self/status")


def rss_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: plan, reset the peak RSS, read one epoch, report the growth of the peak."""
    loader, dataset = StructuredDataset.create_dataloader(
        path=spec["url"], num_workers=0, batch_size=BATCH, storage_options=spec["options"],
        read_ahead=spec["read_ahead"], output_format="torch", shuffle=False, plan_cache=False)
    dataset.set_epoch(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")   # resets VmHWM to the current RSS
    base = status_kib("VmRSS")
    ids = [np.asarray(batch["id"]).copy() for batch in loader]
    peak = status_kib("VmHWM")
    every = np.concatenate(ids)
    exact = bool(len(every) == spec["rows"] and np.array_equal(np.sort(every), np.arange(spec["rows"])))
    return {"read_ahead": spec["read_ahead"], "base_kib": base, "peak_kib": peak, "growth_kib": peak - base,
            "exact": exact}


def measure_memory(env: Env, data: ReadData, args: argparse.Namespace) -> list[dict[str, Any]]:
    env.set_latency(max(args.latencies))
    out = []
    for read_ahead in (0, 1, 2):
        progress(f"memory: read_ahead={read_ahead}, fresh process")
        spec = {"url": data.url, "options": env.options, "read_ahead": read_ahead, "rows": data.rows}
        done = subprocess.run([sys.executable, __file__, "--rss-child", json.dumps(spec)], capture_output=True,
                              text=True, check=False, timeout=300)
        lines = [line for line in done.stdout.splitlines() if line.startswith(RSS_PREFIX)]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"memory child failed ({done.returncode}):\n{done.stderr[-3000:]}")
        result = json.loads(lines[-1][len(RSS_PREFIX):])
        if not result["exact"]:
            raise RuntimeError(f"memory child read_ahead={read_ahead}: not every id exactly once")
        out.append(result)
    return out


# -- the report --------------------------------------------------------------------------------


def markdown_table(header: list[str], rows: list[list[str]], right_from: int) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    return ["| " + " | ".join(line) + " |" for line in [header, align, *rows]]


def fmt_latency(latency: float) -> str:
    return f"{latency * 1e3:.0f} ms"


def fmt_s(seconds: float) -> str:
    return f"{seconds:.1f}" if seconds >= 10 else f"{seconds:.2f}"


def fmt_mb(n: float) -> str:
    return f"{n / 2**20:.1f}"


def plan_counts(row: PlanRow) -> tuple[str, float]:
    """'list / head / read' of the median run (per file extrapolated for a sampled naive loop), and the scale."""
    run = sorted(row.runs, key=lambda r: r.seconds)[len(row.runs) // 2]
    scale = 1.0
    if row.method == "naive" and run.value.sampled:
        scale = run.value.total / run.value.done
    c = run.counts
    approx = "≈ " if scale != 1.0 else ""
    text = f"{approx}{c.get('list', 0)} / {round(c.get('head', 0) * scale):,} / {round(c.get('read', 0) * scale):,}"
    return text, scale


def cpu_per_file(row: PlanRow) -> str:
    files = [r.value.done if row.method == "naive" else r.value for r in row.runs]
    per = [(r.cpu.moto / n, r.cpu.proxy / n, r.cpu.client / n) for r, n in zip(row.runs, files)]
    med = [statistics.median(p[i] for p in per) * 1e3 for i in range(3)]
    return " / ".join(f"{m:.1f}" for m in med)


PLAN_LABELS = {"arrowstream": "arrowstream `StructuredDataset(url)`",
               "floor": "floor: s3fs `cat_ranges` of the footers, one async batch",
               "naive": "naive loop: `find`, then `read_metadata(fs.open(p))` per file"}


def plan_table(rows: list[PlanRow]) -> list[str]:
    header = ["files", "added latency", "method", "seconds (median)", "runs", "min – max",
              "requests list / head / read", "CPU ms per file: moto / proxy / client"]
    out = []
    for row in rows:
        secs = [r.seconds for r in row.runs]
        runs, spread = str(len(row.runs)), f"{fmt_s(min(secs))} – {fmt_s(max(secs))}"
        seconds = fmt_s(row.seconds)
        if row.method == "naive":
            naive = row.runs[0].value
            spread = "–"
            if naive.sampled:
                seconds = f"≈ {fmt_s(naive.projected_s)}"
                runs = f"1 ({naive.done:,} of {naive.total:,} files, extrapolated)"
        out.append([f"{row.files:,}", fmt_latency(row.latency), PLAN_LABELS[row.method], seconds, runs, spread,
                    plan_counts(row)[0], cpu_per_file(row)])
    return markdown_table(header, out, right_from=3)


def find_plan(rows: list[PlanRow], files: int, latency: float, method: str) -> PlanRow:
    return next(r for r in rows if r.files == files and r.latency == latency and r.method == method)


def ratio_table(rows: list[PlanRow], args: argparse.Namespace) -> list[str]:
    header = ["files", "added latency", "naive s", "arrowstream s", "naive / arrowstream", "floor s",
              "arrowstream / floor"]
    out = []
    for files in args.plan_files:
        for latency in args.latencies:
            naive, ours = find_plan(rows, files, latency, "naive"), find_plan(rows, files, latency, "arrowstream")
            floor = next((r for r in rows if r.files == files and r.latency == latency and r.method == "floor"), None)
            approx = "≈ " if naive.runs[0].value.sampled else ""
            out.append([f"{files:,}", fmt_latency(latency), approx + fmt_s(naive.seconds), fmt_s(ours.seconds),
                        approx + fmt_ratio(naive.seconds / ours.seconds), fmt_s(floor.seconds) if floor else "–",
                        fmt_ratio(ours.seconds / floor.seconds) if floor else "–"])
    return markdown_table(header, out, right_from=2)


def read_table_lines(rows: list[ReadRow], data: ReadData, latency: float) -> list[str]:
    header = ["loader", "rows/s (median)", "min – max", "vs plain loop", "first batch ms", "epoch s",
              "requests list / head / read", "MiB received", "MiB the columns need", "CPU s: moto / proxy / client"]
    mine = [r for r in rows if r.latency == latency]
    base = {cols: next(r for r in mine if r.variant.workers is None and r.variant.columns == cols)
            for cols in {r.variant.columns for r in mine}}
    out = []
    for row in mine:
        rps = [data.rows / r.seconds for r in row.runs]
        median_rps = statistics.median(rps)
        plain = base[row.variant.columns]
        plain_rps = statistics.median(data.rows / r.seconds for r in plain.runs)
        median_run = sorted(row.runs, key=lambda r: r.seconds)[len(row.runs) // 2]
        c = median_run.counts
        received = "– (in workers)" if row.variant.workers else fmt_mb(median_run.received)
        columns = list(row.variant.columns) if row.variant.columns else None
        cpu = " / ".join(f"{row.median(lambda r, k=k: getattr(r.cpu, k)):.2f}" for k in ("moto", "proxy", "client"))
        out.append([row.variant.label, fmt_rps(median_rps), f"{fmt_rps(min(rps))} – {fmt_rps(max(rps))}",
                    fmt_ratio(median_rps / plain_rps), fmt_ms(row.median(lambda r: r.value.first_s)),
                    fmt_s(row.median(lambda r: r.seconds)),
                    f"{c.get('list', 0)} / {c.get('head', 0)} / {c.get('read', 0)}", received,
                    fmt_mb(data.column_bytes(columns)), cpu])
    return markdown_table(header, out, right_from=1)


def probe_table(rows: list[ReadRow]) -> list[str]:
    header = ["added latency", "loader", "epoch s (median)", "reader waited on read-ahead, s", "fetches",
              "fetch time, s (sum)", "direct reads (n / s)"]
    out = []
    for row in rows:
        if not row.probes:
            continue
        med = {k: statistics.median(p[k] for p in row.probes) for k in row.probes[0]}
        out.append([fmt_latency(row.latency), row.variant.label, fmt_s(row.median(lambda r: r.seconds)),
                    f"{med['waited_s']:.2f}", f"{med['fetches']:.0f}", f"{med['fetch_s']:.2f}",
                    f"{med['direct']:.0f} / {med['direct_s']:.2f}"])
    return markdown_table(header, out, right_from=2)


def memory_table(results: list[dict[str, Any]], data: ReadData) -> list[str]:
    header = ["read_ahead", "RSS after planning, MiB", "peak during the epoch, MiB", "peak growth, MiB"]
    out = [[str(r["read_ahead"]), f"{r['base_kib'] / 1024:.0f}", f"{r['peak_kib'] / 1024:.0f}",
            f"{r['growth_kib'] / 1024:.1f}"] for r in results]
    return markdown_table(header, out, right_from=1)


def goal_line(rows: list[PlanRow], args: argparse.Namespace) -> str:
    files = GOAL_FILES if GOAL_FILES in args.plan_files else args.plan_files[0]
    latency = max(args.latencies)
    naive, ours = find_plan(rows, files, latency, "naive"), find_plan(rows, files, latency, "arrowstream")
    ratio = naive.seconds / ours.seconds
    verdict = "met" if ratio >= GOAL_RATIO else "**missed**"
    # moto serves one request at a time (a single Python process, its GIL): the CPU time it spent on
    # arrowstream's requests is a lower bound on any client's planning time against it.
    moto_s = statistics.median(r.cpu.moto for r in ours.runs)
    return (f"Goal (arrowstream at least {GOAL_RATIO:.0f}x faster than the naive loop on {files:,} files at "
            f"{fmt_latency(latency)}): {fmt_ratio(ratio)}, {verdict}. Ceiling on this machine: moto alone spent "
            f"{fmt_s(moto_s)} s of CPU serving the requests of arrowstream's plan (one process, one request at a "
            f"time), so no client planning through it can beat {fmt_ratio(naive.seconds / moto_s)}.")


def versions_line() -> str:
    versions = dict(main_versions())
    for name in EXTRA_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return ", ".join(f"{name} {version}" for name, version in versions.items())


def report(args: argparse.Namespace, plan_rows: list[PlanRow], read_rows: list[ReadRow], memory: list[dict[str, Any]],
           data: ReadData, seconds: float, load_before: str) -> str:
    now = dt.datetime.now(dt.UTC)
    lines = [
        f"# Object stores: planning and the read path on S3 (moto) behind a latency proxy ({now.date().isoformat()})",
        "",
        f"- Date: {now:%Y-%m-%d, %H:%M} UTC",
        f"- Machine: {machine()}; `nproc` = {os.cpu_count()}",
        f"- Python {sys.version.split()[0]}; {versions_line()}; arrowstream at {arrowstream_commit()}",
        f"- Command: `{shlex.join(['.venv/bin/python', 'benchmarks/bench_object_store.py', *sys.argv[1:]])}`",
        f"- Load average before / after: {load_before} / {loadavg()}; run time {seconds / 60:.1f} min",
        (f"- moto, the proxy and the client share these cores; added latency per request: "
         f"{', '.join(fmt_latency(x) for x in args.latencies)}."), "",
        "## 1. Planning at scale", "",
        (f"Datasets of {', '.join(f'{n:,}' for n in args.plan_files)} Parquet files of {args.small_rows} rows "
         f"(about {len(small_file(0, args.small_rows)):,} bytes each), written straight to moto. arrowstream: median "
         f"of {args.plan_repeats} runs on {args.plan_files[0]:,} files, 1 run on larger datasets; the floor: 1 run, "
         f"between the first two of arrowstream's, on {args.plan_files[0]:,} files; the "
         "naive loop: 1 run, over the files in a random order, stopped after "
         f"{args.naive_sample:,} files and extrapolated linearly when its projected time exceeded "
         f"{args.naive_limit:.0f} s. Every run starts cold (no cached s3fs instance or listing)."), "",
        *plan_table(plan_rows), "",
        ("CPU per file divides each process's CPU time by the files read; for an extrapolated naive loop that is "
         "the whole listing over the sampled files only, hence higher. Requests of an extrapolated loop are scaled "
         "to all files (≈)."), "",
        *ratio_table(plan_rows, args), "",
        goal_line(plan_rows, args), "",
        "## 2. Read path", "",
        (f"{len(data.paths)} files x {data.rows // len(data.paths):,} rows, {data.row_groups} row groups in all, "
         f"{fmt_mb(data.file_bytes)} MiB (snappy); `batch_size=1024`, torch output; rows/s over the whole epoch, "
         f"from before the loader is built (listing and planning included) to the last batch; median of "
         f"{args.repeats} rounds. Every epoch yielded each `id` exactly once. \"MiB received\": bytes s3fs returned "
         "to this process (planning footers included; not counted inside worker processes)."), "",
    ]
    for latency in args.latencies:
        lines += [f"### {fmt_latency(latency)} added per request", "", *read_table_lines(read_rows, data, latency), ""]
    lines += ["### Read-ahead, instrumented (`num_workers=0`)", "", *probe_table(read_rows), "",
              f"## 3. Memory: peak RSS growth over one epoch ({fmt_latency(max(args.latencies))}, `num_workers=0`)",
              "", *memory_table(memory, data), "",
              (f"Each in a fresh process; the peak RSS counter is reset after planning. Largest row group: "
               f"{fmt_mb(max(md.row_group(g).total_byte_size for md in data.metadata for g in range(md.num_row_groups)))}"
               " MiB uncompressed.")]
    return "\n".join(lines) + "\n"


# -- main --------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small datasets, 1 repeat")
    parser.add_argument("--plan-files", default=None, help="dataset sizes for planning (default 2000,10000)")
    parser.add_argument("--small-rows", type=int, default=100, help="rows per small file (default 100)")
    parser.add_argument("--plan-repeats", type=int, default=None, help="runs on the smallest dataset (default 3)")
    parser.add_argument("--naive-sample", type=int, default=None, help="files before the naive loop may stop (500)")
    parser.add_argument("--naive-limit", type=float, default=120.0,
                        help="projected naive seconds above which it stops and extrapolates (default 120)")
    parser.add_argument("--read-files", type=int, default=None, help="files of the read path (default 8)")
    parser.add_argument("--read-rows", type=int, default=None, help="rows per file (default 250,000)")
    parser.add_argument("--row-group-rows", type=int, default=32_768, help="rows per row group (default 32,768)")
    parser.add_argument("--repeats", type=int, default=None, help="read-path rounds (default 3)")
    parser.add_argument("--latencies", default="0.02,0", help="seconds added per request (default 0.02,0)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    parser.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    quick = args.quick
    args.plan_files = [int(n) for n in (args.plan_files or ("200,1000" if quick else "2000,10000")).split(",")]
    if args.plan_files != sorted(set(args.plan_files)):
        parser.error("--plan-files: increasing sizes, each dataset nests inside the next")
    args.plan_repeats = args.plan_repeats or (1 if quick else 3)
    args.naive_sample = args.naive_sample or (100 if quick else 500)
    args.read_files = args.read_files or (2 if quick else 8)
    args.read_rows = args.read_rows or (100_000 if quick else 250_000)
    args.repeats = args.repeats or (1 if quick else 3)
    args.latencies = [float(x) for x in args.latencies.split(",")]
    return args


def main() -> int:
    args = parse_args()
    if args.rss_child is not None:
        print(RSS_PREFIX + json.dumps(rss_child(json.loads(args.rss_child))), flush=True)
        return 0
    start, load_before = time.perf_counter(), loadavg()
    with servers.start_s3() as store, start_proxy(store.endpoint) as proxy:
        env = Env(store, proxy)
        urls = write_small_files(store, args.plan_files, args.small_rows)
        data = write_read_files(store, args)
        plan_rows = measure_planning(env, args, urls)
        read_rows = measure_reads(env, data, args)
        memory = measure_memory(env, data, args)
    text = report(args, plan_rows, read_rows, memory, data, time.perf_counter() - start, load_before)
    emit_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
