"""Stragglers (issue #21): ``assignment="static"`` against ``assignment="dynamic"`` where splits cost unlike.

Run from the repository root:

    .venv/bin/python benchmarks/bench_stragglers.py            # the real run (about 7 min on 2 busy cores)
    .venv/bin/python benchmarks/bench_stragglers.py --quick    # smoke run (small data, 1 round), prints only

Options: ``--repeats``, ``--workers 2,4``, ``--scenarios uniform,decode,prefix,transform``, ``--prefetch-factor``, ``--persistent``
(one loader per policy and worker count with ``persistent_workers=True``, its epochs after an untimed first one),
``--out PATH``
(default ``benchmarks/results/<YYYY-MM-DD>-stragglers.md``; ``--quick`` writes only with ``--out``).

Each scenario is a dataset generated under a temporary folder of ``benchmarks/data/`` (git-ignored): Parquet
files of the same number of rows, one row group each, columns ``id`` (int64, unique, the global row number)
and ``f0..f7`` (float32). A quarter of the files cost more:

1. **decode**: the costly files are written with zstd and data pages of 32 rows (each page a header and a
   zstd frame of its own, as a streaming writer with a tiny page size leaves them), the others with snappy
   and pyarrow's default pages: the same rows and columns, decoding many times slower per row.
2. **prefix**: the files on S3 (moto's server on loopback) behind ``tests/proxy.py``, which adds
   ``--slow-latency`` (50 ms) to every request under the prefix ``slow/`` (a quarter of the files) and nothing
   to those under ``fast/``.
3. **transform**: a ``transform`` that sleeps in proportion to the rows of a batch, 10x as long for rows of the
   costly files (known from ``id``): a module-level function, picklable.
4. **uniform**: every file alike (snappy, default pages), no transform: what dynamic assignment costs where
   there is nothing to balance (goal: <= 3% of the rows/s of static).

Where the costly files land: with ``shuffle=False`` (decode, transform, uniform) the splits keep the files'
order and longest-processing-time assignment deals equal splits round robin, so the costly files (every 4th)
all go to worker 0 with 2 or 4 workers: the unlucky case, which static cannot see (it balances rows). A slow
*prefix* is a contiguous run of the sorted files, which round robin would spread evenly, so that scenario
shuffles (``shuffle=True, seed=0``) and round ``r`` reads epoch ``r``: static's share of slow files per worker
is then whatever the shuffle deals, as in training.

Sizes: 128 files per scenario and 3 rounds by default (``--files``, ``--s3-files``, ``--repeats``; until 2026-11-27
32 files and 5 rounds, which stay in the results of 2026-11-26). With 32 files an epoch lasted 0.7-1.3 s (decode,
prefix): the workers' start-up was 4-9% of it, and one costly file, which no cut makes cheaper (a piece that starts
inside a row group decodes the group again), about a fifth of a worker's share, so the tail and the ratio to the ideal
measured those two more than the scheduling. With 128 files the epochs last 2-16 s.

The CPU floor: every process's CPU time in the epoch (the workers, the trainer's process, on S3 moto and the proxy)
over the cores this process may use. No epoch of this code on this machine is shorter; where it is above 1.1x the
ideal, the ideal's goal is out of reach here whatever the scheduling, and the report says so.

Each epoch is a new loader (``create_dataloader(..., num_workers=W, assignment=A)``: static with its default
``in_order=True``, dynamic with its default ``in_order=False``; ``batch_size=1024``, ``output_format="torch"``,
``plan_cache=False``), timed from ``iter()`` to the last batch (worker start-up included; construction apart).
From ``loader.metrics()``: busy time per worker (``read_s + convert_s``; a transform runs inside convert),
the ideal epoch (total busy / workers), ``tail_s``, ``idle_s``, leases and rows per worker. Every epoch is checked to
yield every row once (count and sum of ``id``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import gc
import os
import resource
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent / "tests"))
sys.path.insert(0, str(BENCH_DIR))

import servers  # noqa: I001 (first: it keeps gcsfs's gRPC probe off before anything imports gcsfs)
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from bench_suite import loadavg, run_header
from proxy import start_proxy
from suite.common import emit_report, log

from arrowstream import StructuredDataset

BATCH = 1024
FLOATS = 8
COSTLY_EVERY = 4            # files 0, 4, 8, ... are the costly ones
COSTLY_PAGE_ROWS = 32       # decode: rows per data page of the costly files
TRANSFORM_FACTOR = 10       # transform: the costly files' rows cost this many times more
ASSIGNMENTS = ("static", "dynamic")
IDEAL_GOAL = 1.1            # dynamic epoch <= 1.1 x the ideal
TAIL_GOAL = 0.05            # dynamic tail <= 5% of the epoch
UNIFORM_GOAL = 0.97         # dynamic rows/s >= 97% of static on the uniform dataset
SLOW_PREFIX = "slow"
PREFETCH_FACTOR: int | None = None   # --prefetch-factor (None: torch's default, 2)
CORES = len(os.sched_getaffinity(0))   # the cores this process (and so the loaders and servers it starts) may use
_STARTED = time.perf_counter()

warnings.filterwarnings("ignore", message=".*not writable.*")
warnings.filterwarnings("ignore", message="This DataLoader will create")  # 4 workers on 2 cores: on purpose
warnings.filterwarnings("ignore", message=".*starts epoch .* again")   # persistent: unshuffled epochs repeat


def progress(message: str) -> None:
    log(f"{time.perf_counter() - _STARTED:6.0f} s  {message}")


def costly_transform(batch: dict[str, Any], rows_per_file: int, unit_s: float) -> dict[str, Any]:
    """Sleep ``unit_s`` per row, ``TRANSFORM_FACTOR`` times that for rows of the costly files: a transform
    whose cost depends on the data (tokenizing long texts, decoding images), without using a core."""
    files = batch["id"].numpy() // rows_per_file
    costly = int(np.count_nonzero(files % COSTLY_EVERY == 0))
    time.sleep(unit_s * (len(files) + (TRANSFORM_FACTOR - 1) * costly))
    return batch


# == data ======================================================================================


@dataclass
class Dataset:
    """A generated scenario: where its files are, how to read them, and what every epoch must yield."""

    name: str
    what: str
    path: str
    files: int
    rows: int
    bytes: int
    shuffle: bool = False
    storage_options: dict[str, Any] | None = None
    transform: Callable[[Any], Any] | None = None
    proxy: Any = None      # the S3 proxy, which counts the requests of an epoch
    servers: tuple[int, ...] = ()   # pids of the processes that serve the files (moto, the proxy): their CPU

    @property
    def id_sum(self) -> int:
        return self.rows * (self.rows - 1) // 2


def make_table(rng: np.random.Generator, start: int, rows: int) -> pa.Table:
    columns: dict[str, Any] = {"id": np.arange(start, start + rows, dtype=np.int64)}
    columns.update({f"f{i}": rng.standard_normal(rows, dtype=np.float32) for i in range(FLOATS)})
    return pa.table(columns)


def write_files(folder: Path, files: int, rows: int, costly_pages: bool, seed: int,
                name: Callable[[int], str] = lambda i: f"part-{i:03d}.parquet") -> int:
    """``files`` files of ``rows`` rows, one row group each; with ``costly_pages`` every ``COSTLY_EVERY``-th
    is written with zstd pages of ``COSTLY_PAGE_ROWS`` rows. Returns the bytes written."""
    rng = np.random.default_rng(seed)
    size = 0
    for index in range(files):
        path = folder / name(index)
        path.parent.mkdir(parents=True, exist_ok=True)
        costly = costly_pages and index % COSTLY_EVERY == 0
        options: dict[str, Any] = ({"compression": "zstd", "data_page_size": 1, "write_batch_size": COSTLY_PAGE_ROWS}
                                   if costly else {"compression": "snappy"})
        pq.write_table(make_table(rng, index * rows, rows), path, row_group_size=rows, **options)
        size += path.stat().st_size
    return size


def local_dataset(work: Path, name: str, what: str, files: int, rows: int, costly_pages: bool = False,
                  transform: Callable[[Any], Any] | None = None) -> Dataset:
    folder = work / name
    size = write_files(folder, files, rows, costly_pages, seed=len(name))
    return Dataset(name, what, str(folder), files, files * rows, size, transform=transform)


def prefix_name(files: int) -> Callable[[int], str]:
    """A quarter of the files under ``slow/`` (the first ones), the rest under ``fast/``."""
    slow = files // COSTLY_EVERY
    return lambda i: f"{SLOW_PREFIX}/part-{i:03d}.parquet" if i < slow else f"fast/part-{i:03d}.parquet"


def s3_dataset(work: Path, store: Any, proxy: Any, files: int, rows: int, latency: float) -> Dataset:
    """The files written locally, uploaded to moto, read through the proxy (``slow/`` answers late)."""
    folder = work / "prefix"
    size = write_files(folder, files, rows, costly_pages=False, seed=7, name=prefix_name(files))
    fs = store.filesystem()
    fs.put(str(folder) + "/", store.url("data") + "/", recursive=True)
    proxy.configure(slow_prefix=f"/{store.bucket}/data/{SLOW_PREFIX}/", slow_latency=latency)
    what = (f"S3 (moto on loopback) through a proxy adding {latency * 1000:.0f} ms to each request under "
            f"`data/{SLOW_PREFIX}/` ({files // COSTLY_EVERY} of {files} files), none under `data/fast/`")
    return Dataset("prefix", what, store.url("data") + "/", files, files * rows, size, shuffle=True,
                   storage_options=store.options_via(proxy.endpoint), proxy=proxy,
                   servers=(store.process.pid, proxy.process.pid))


# == one epoch =================================================================================


@dataclass(frozen=True)
class Epoch:
    seconds: float
    rows: int
    busy: list[float]      # read_s + convert_s per worker
    worker_rows: list[int]
    leases: list[int]
    tail_s: float
    span_s: float          # the first worker's first read to the last one's last batch (no start-up)
    reads: int | None      # GET requests of object data in the epoch (S3 only)
    workers_cpu_s: float   # CPU time of the workers (all of them, joined at the end of the epoch)
    main_cpu_s: float      # CPU time of this process (the trainer side) over the epoch
    idle: list[float] = field(default_factory=list)   # idle_s per worker: waiting for the trainer to ask
    servers_cpu_s: float = 0.0   # CPU time of the servers of the files over the epoch (S3: moto and the proxy)

    @property
    def ideal_s(self) -> float:
        return sum(self.busy) / len(self.busy)

    @property
    def floor_s(self) -> float:
        """The CPU time of every process of the epoch (workers, trainer, servers) over the cores: no epoch of this
        code on this machine is shorter, however the work is spread over the workers."""
        return (self.workers_cpu_s + self.main_cpu_s + self.servers_cpu_s) / CORES

    @property
    def rps(self) -> float:
        return self.rows / self.seconds


def make_loader(data: Dataset, assignment: str, workers: int, persistent: bool) -> tuple[Any, Any]:
    knobs = {} if PREFETCH_FACTOR is None or workers == 0 else {"prefetch_factor": PREFETCH_FACTOR}
    return StructuredDataset.create_dataloader(
        data.path, batch_size=BATCH, num_workers=workers, assignment=assignment, shuffle=data.shuffle, seed=0,
        output_format="torch", plan_cache=False, storage_options=data.storage_options, transform=data.transform,
        persistent_workers=persistent, **knobs)


def time_epoch(data: Dataset, assignment: str, workers: int, epoch: int, made: tuple[Any, Any] | None = None) -> Epoch:
    """One epoch of a new loader, or of ``made`` (a loader with persistent workers that read epochs before:
    its counters are differences, its span is the epoch: no workers start in it)."""
    loader, dataset = made or make_loader(data, assignment, workers, persistent=False)
    dataset.set_epoch(epoch)
    if data.proxy is not None:
        data.proxy.reset()
    before = loader.metrics()["workers"] if made is not None else None
    pids = worker_pids(loader)
    start, cpu, workers_cpu = time.perf_counter(), cpu_times(), processes_cpu_s(pids)
    servers_cpu = processes_cpu_s(list(data.servers))
    rows, id_sum = 0, 0
    for batch in loader:
        rows += len(batch["id"])
        id_sum += int(batch["id"].sum())
    seconds = time.perf_counter() - start
    servers_s = processes_cpu_s(list(data.servers)) - servers_cpu
    children_s, self_s = (after - before for after, before in zip(cpu_times(), cpu, strict=True))
    if (rows, id_sum) != (data.rows, data.id_sum):
        raise RuntimeError(f"{data.name}, {assignment}, {workers} workers, epoch {epoch}: {rows} rows (id sum "
                           f"{id_sum}), expected every row once: {data.rows} (id sum {data.id_sum})")
    metrics = loader.metrics()
    lines = metrics["workers"]
    reads = None if data.proxy is None else int(data.proxy.stats()["counts"].get("read", 0))
    if before is None:
        return Epoch(seconds, rows, [w["read_s"] + w["convert_s"] for w in lines], [w["rows"] for w in lines],
                     [w["leases"] for w in lines], metrics["tail_s"], metrics["elapsed_s"], reads,
                     children_s, self_s, [w["idle_s"] for w in lines], servers_s)
    # persistent workers: this epoch's part of counters that add up over the loader's life
    busy = [w["read_s"] + w["convert_s"] - b["read_s"] - b["convert_s"] for w, b in zip(lines, before, strict=True)]
    return Epoch(seconds, rows, busy, [w["rows"] - b["rows"] for w, b in zip(lines, before, strict=True)],
                 [w["leases"] - b["leases"] for w, b in zip(lines, before, strict=True)], metrics["tail_s"],
                 seconds, reads, processes_cpu_s(pids) - workers_cpu, self_s,
                 [w["idle_s"] - b["idle_s"] for w, b in zip(lines, before, strict=True)], servers_s)


def cpu_times() -> tuple[float, float]:
    """User + system CPU seconds of the children that ended (loader workers: the servers run on), and of
    this process. Busy time is wall time: with more busy workers than cores it counts waiting for a core."""
    children, own = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    return children.ru_utime + children.ru_stime, own.ru_utime + own.ru_stime


def worker_pids(loader: Any) -> list[int]:
    """The pids of a loader's running workers (persistent ones; none before a new loader's ``iter()``)."""
    iterator = getattr(loader, "_iterator", None)
    return [worker.pid for worker in getattr(iterator, "_workers", [])]


def processes_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of running processes so far (``/proc/PID/stat``: utime and stime)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / ticks


@dataclass
class Series:
    epochs: list[Epoch] = field(default_factory=list)

    def median(self, value: Callable[[Epoch], float]) -> float:
        return float(statistics.median(value(e) for e in self.epochs))

    def best(self, value: Callable[[Epoch], float]) -> float:
        return min(value(e) for e in self.epochs)

    def typical(self) -> Epoch:
        """The epoch of median time (its per-worker numbers stand for the series)."""
        return sorted(self.epochs, key=lambda e: e.seconds)[(len(self.epochs) - 1) // 2]


Key = tuple[int, str]   # (workers, assignment)


def run_scenario(data: Dataset, worker_counts: list[int], repeats: int, persistent: bool = False) -> dict[Key, Series]:
    keys = [(w, a) for w in worker_counts for a in ASSIGNMENTS]
    results: dict[Key, Series] = {key: Series() for key in keys}
    time_epoch(data, "static", 0, 0)   # warm-up: page cache, imports
    made: dict[Key, tuple[Any, Any]] = {}
    if persistent:   # one loader per policy and worker count, its workers started by an untimed epoch
        for workers, assignment in keys:
            made[(workers, assignment)] = make_loader(data, assignment, workers, persistent=True)
            time_epoch(data, assignment, workers, repeats, made[(workers, assignment)])
    for round_index in range(repeats):
        shift = round_index % len(keys)
        for workers, assignment in keys[shift:] + keys[:shift]:
            gc.collect()
            epoch = time_epoch(data, assignment, workers, round_index if data.shuffle else 0,
                               made.get((workers, assignment)))
            results[(workers, assignment)].epochs.append(epoch)
            progress(f"{data.name} round {round_index + 1}/{repeats}, {workers} workers, {assignment}: "
                     f"{epoch.seconds:.2f} s (ideal {epoch.ideal_s:.2f} s, tail {epoch.tail_s:.2f} s)")
    for loader, _ in made.values():   # persistent workers would compete with the next scenario's
        loader._iterator._shutdown_workers()
    return results


# == report ====================================================================================


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join([" --- "] + [" ---: "] * (len(header) - 1)) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def joined(values: list[Any], fmt: str) -> str:
    return " / ".join(format(v, fmt) for v in values)


def cpu_cell(series: Series) -> str:
    """CPU s of the workers / the trainer's process, and / the servers of the files where there are some."""
    cell = f"{series.median(lambda e: e.workers_cpu_s):.2f} / {series.median(lambda e: e.main_cpu_s):.2f}"
    if any(e.servers_cpu_s for e in series.epochs):
        cell += f" / {series.median(lambda e: e.servers_cpu_s):.2f}"
    return cell


def scenario_rows(results: dict[Key, Series]) -> list[list[str]]:
    rows = []
    for (workers, assignment), series in results.items():
        epoch_s, ideal_s = series.median(lambda e: e.seconds), series.median(lambda e: e.ideal_s)
        ratio = series.median(lambda e: e.seconds / e.ideal_s)
        span = series.median(lambda e: e.span_s / e.ideal_s)
        tail = series.median(lambda e: e.tail_s / e.seconds)
        floor = series.median(lambda e: e.floor_s / e.ideal_s)
        typical = series.typical()
        rows.append([str(workers), assignment, f"{epoch_s:.2f} ({series.best(lambda e: e.seconds):.2f})",
                     f"{ideal_s:.2f}", f"{ratio:.2f}x", f"{span:.2f}x", f"{floor:.2f}x", f"{tail:.1%}",
                     cpu_cell(series), f"{series.median(lambda e: e.rps) / 1e3:,.0f}k",
                     joined(typical.busy, ".2f"), joined(typical.idle, ".2f"),
                     joined([r / 1e3 for r in typical.worker_rows], ",.0f"),
                     joined(typical.leases, "d"), "–" if typical.reads is None else f"{typical.reads:,}"])
    return rows


def goals(name: str, results: dict[Key, Series], worker_counts: list[int]) -> list[str]:
    lines = []
    for workers in worker_counts:
        static, dynamic = results[(workers, "static")], results[(workers, "dynamic")]
        s_epoch, d_epoch = static.median(lambda e: e.seconds), dynamic.median(lambda e: e.seconds)
        s_ratio, d_ratio = (x.median(lambda e: e.seconds / e.ideal_s) for x in (static, dynamic))
        d_span = dynamic.median(lambda e: e.span_s / e.ideal_s)
        d_floor = dynamic.median(lambda e: e.floor_s / e.ideal_s)
        d_over_floor = dynamic.median(lambda e: e.seconds / e.floor_s)
        reachable = ("" if d_floor <= IDEAL_GOAL else
                     f"; out of reach on this machine: the CPU of every process over its {CORES} cores is "
                     f"{d_floor:.2f}x the ideal")
        tail = dynamic.median(lambda e: e.tail_s / e.seconds)
        s_busy, d_busy = (x.median(lambda e: sum(e.busy)) for x in (static, dynamic))
        s_cpu, d_cpu = (x.median(lambda e: e.workers_cpu_s) for x in (static, dynamic))
        busy = (f"total busy static {s_busy:.2f} s / dynamic {d_busy:.2f} s, workers' CPU static {s_cpu:.2f} s / "
                f"dynamic {d_cpu:.2f} s")
        if any(e.servers_cpu_s for e in dynamic.epochs):
            s_srv, d_srv = (x.median(lambda e: e.servers_cpu_s) for x in (static, dynamic))
            busy += f", the S3 servers' (moto, proxy) CPU static {s_srv:.2f} s / dynamic {d_srv:.2f} s"
        if name == "uniform":
            keep = dynamic.median(lambda e: e.rps) / static.median(lambda e: e.rps)
            best = static.best(lambda e: e.seconds) / dynamic.best(lambda e: e.seconds)
            lines.append(f"- uniform, {workers} workers: dynamic keeps {keep:.1%} of static's rows/s (medians; "
                         f"bests {best:.1%}); goal >= {UNIFORM_GOAL:.0%} {verdict(keep >= UNIFORM_GOAL)}; "
                         f"dynamic tail {tail:.1%} of the epoch; {busy}")
            continue
        lines.append(f"- {name}, {workers} workers: epoch static {s_epoch:.2f} s / dynamic {d_epoch:.2f} s "
                     f"(dynamic {s_epoch / d_epoch:.2f}x faster); epoch / ideal: static {s_ratio:.2f}x, dynamic "
                     f"{d_ratio:.2f}x (goal <= {IDEAL_GOAL}x {verdict(d_ratio <= IDEAL_GOAL)}{reachable}; without the "
                     f"workers' start-up {d_span:.2f}x; CPU floor / ideal {d_floor:.2f}x, epoch / CPU floor "
                     f"{d_over_floor:.2f}x); dynamic tail "
                     f"{tail:.1%} of the epoch (goal <= {TAIL_GOAL:.0%} {verdict(tail <= TAIL_GOAL)}); {busy}")
    return lines


def report(args: argparse.Namespace, datasets: list[Dataset], results: dict[str, dict[Key, Series]],
           seconds: float, load_before: str) -> str:
    lines = [*run_header("Stragglers: static against dynamic assignment", "bench_stragglers.py", load_before, seconds),
             (f"- Every loader: `batch_size={BATCH}`, `output_format=\"torch\"`, `plan_cache=False`"
              + ("" if args.prefetch_factor is None else f", `prefetch_factor={args.prefetch_factor}`")
              + "; static with "
              "`in_order=True` (its default), dynamic with `in_order=False` (its default with workers). Each "
              "timed epoch is " + ("an epoch of one loader per policy and worker count with `persistent_workers=True`, "
              "after an untimed first epoch of it (the workers started once; busy, rows and leases are the "
              "epoch's part of the loader's counters; *span* is the epoch, no workers start in it; CPU from `/proc` "
              "of the workers)"
              if args.persistent else "a new loader") + ", checked to yield every row once (count and sum of `id`)."),
             "",
             "## Goals on this run", ""]
    for data in datasets:
        lines += goals(data.name, results[data.name], args.workers)
    lines += ["", "## Scenarios", "",
              (f"Medians of {args.repeats} rounds (bests in brackets), after an untimed warm-up epoch; the rounds "
               "rotate the order of the loaders. *epoch s*: `iter()` to the last batch. *ideal s*: the workers' "
               "total busy time (`read_s + convert_s` from `loader.metrics()`) / workers. *span*: `elapsed_s` of the "
               "metrics, the first worker's first read to the last worker's last batch (the epoch without the "
               f"workers' start-up). *floor / ideal*: the CPU floor, all CPU time below over the {CORES} cores (no "
               "epoch of this code on this machine is shorter), over the ideal: above 1.1x the goal is out of reach "
               "here whatever the scheduling. *CPU s*: user + system time of the workers (joined at the end of the epoch), "
               "of the trainer's process and, on S3, of the servers (moto and the proxy, from `/proc`), medians: "
               "busy time is wall time, which with more busy processes than cores includes waiting for one; CPU "
               "time does not. *epoch / ideal*, *span / ideal* and *tail* (`tail_s`: the first worker's last batch to the last one's, over the epoch) are medians "
               "of the per-epoch ratios. Busy s, idle s (`idle_s`: waiting for the trainer to ask for more, and torch's hand-over), k rows "
               "and leases per worker, and the S3 "
               "data requests (GETs counted by the proxy), are those of the median epoch."), ""]
    header = ["workers", "assignment", "epoch s", "ideal s", "epoch / ideal", "span / ideal", "floor / ideal", "tail / epoch", "CPU s workers / main (/ S3 servers)", "rows/s",
              "busy s per worker", "idle s per worker", "k rows per worker", "leases per worker", "S3 reads"]
    for data in datasets:
        lines += [f"### {data.name}", "",
                  (f"{data.what}. {data.files} files x {data.rows // data.files:,} rows = {data.rows:,} rows, "
                   f"{data.bytes / 2**20:,.1f} MiB, one row group per file; "
                   f"shuffle={data.shuffle}{', seed=0, round r reads epoch r' if data.shuffle else ''}."), "",
                  *table(header, scenario_rows(results[data.name])), ""]
    return "\n".join(lines).rstrip() + "\n"


# == main ======================================================================================


SCENARIOS = ("uniform", "decode", "prefix", "transform")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small data, 1 round; prints only")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 3)")
    parser.add_argument("--workers", default="2,4", help="worker counts (default 2,4)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"default {','.join(SCENARIOS)}")
    parser.add_argument("--files", type=int, default=None, help="files per local scenario (default 128)")
    parser.add_argument("--uniform-rows", type=int, default=None, help="rows per uniform file (default 400,000)")
    parser.add_argument("--decode-rows", type=int, default=None, help="rows per decode file (default 50,000)")
    parser.add_argument("--transform-rows", type=int, default=None, help="rows per transform file (default 40,000)")
    parser.add_argument("--transform-us", type=float, default=1.0,
                        help="transform: microseconds of sleep per cheap row (default 1.0)")
    parser.add_argument("--s3-files", type=int, default=None, help="files of the prefix scenario (default 128)")
    parser.add_argument("--s3-rows", type=int, default=None, help="rows per S3 file (default 40,000)")
    parser.add_argument("--slow-latency", type=float, default=0.05, help="seconds added under slow/ (0.05)")
    parser.add_argument("--persistent", action="store_true",
                        help="persistent_workers=True: one loader per policy, epochs after a first untimed one")
    parser.add_argument("--prefetch-factor", type=int, default=None,
                        help="the loaders' prefetch_factor (default: torch's, 2)")
    parser.add_argument("--out", type=Path, default=None, help="report path (default results/<date>-stragglers.md)")
    args = parser.parse_args()
    quick = args.quick
    args.repeats = args.repeats or (1 if quick else 3)
    args.workers = [int(w) for w in args.workers.split(",")]
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    if set(args.scenarios) - set(SCENARIOS) or min(args.workers) < 1:
        parser.error(f"--scenarios: some of {','.join(SCENARIOS)}; --workers: counts >= 1")
    args.files = args.files or (16 if quick else 128)
    args.uniform_rows = args.uniform_rows or (50_000 if quick else 400_000)
    args.decode_rows = args.decode_rows or (5_000 if quick else 50_000)
    args.transform_rows = args.transform_rows or (5_000 if quick else 40_000)
    args.s3_files = args.s3_files or (16 if quick else 128)
    args.s3_rows = args.s3_rows or (5_000 if quick else 40_000)
    if args.out is None and not quick:
        args.out = BENCH_DIR / "results" / f"{dt.date.today().isoformat()}-stragglers.md"
    return args


@contextlib.contextmanager
def s3_behind_proxy(needed: bool) -> Iterator[tuple[Any, Any]]:
    if not needed:
        yield None, None
        return
    with servers.start_s3() as store, start_proxy(store.endpoint) as proxy:
        yield store, proxy


def build(name: str, args: argparse.Namespace, work: Path, store: Any, proxy: Any) -> Dataset:
    if name == "uniform":
        return local_dataset(work, name, "Every file alike: snappy, default pages, no transform", args.files,
                             args.uniform_rows)
    if name == "decode":
        return local_dataset(work, name, (f"Files 0, {COSTLY_EVERY}, {2 * COSTLY_EVERY}, ... written with zstd and "
                                          f"data pages of {COSTLY_PAGE_ROWS} rows, the others snappy with default "
                                          "pages"), args.files, args.decode_rows, costly_pages=True)
    if name == "transform":
        transform = functools.partial(costly_transform, rows_per_file=args.transform_rows,
                                      unit_s=args.transform_us * 1e-6)
        return local_dataset(work, name, (f"A transform sleeping {args.transform_us:g} us per row, "
                                          f"{TRANSFORM_FACTOR}x that for rows of files 0, {COSTLY_EVERY}, "
                                          f"{2 * COSTLY_EVERY}, ... (snappy files, all alike)"),
                             args.files, args.transform_rows, transform=transform)
    return s3_dataset(work, store, proxy, args.s3_files, args.s3_rows, args.slow_latency)


def main() -> int:
    global PREFETCH_FACTOR
    args = parse_args()
    PREFETCH_FACTOR = args.prefetch_factor
    start, load_before = time.perf_counter(), loadavg()
    data_root = BENCH_DIR / "data"
    data_root.mkdir(exist_ok=True)
    datasets, results = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-stragglers-", dir=data_root) as tmp, \
            s3_behind_proxy("prefix" in args.scenarios) as (store, proxy):
        for name in args.scenarios:
            progress(f"writing the {name} dataset")
            data = build(name, args, Path(tmp), store, proxy)
            datasets.append(data)
            results[name] = run_scenario(data, args.workers, args.repeats, args.persistent)
    emit_report(report(args, datasets, results, time.perf_counter() - start, load_before), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
