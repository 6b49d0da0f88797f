"""Planning at scale (issue #19, point 4): plan time, restart, resume, memory and state size, against pyarrow.

Run from the repository root:

    .venv/bin/python benchmarks/bench_planning.py                          # the full run (long: 100,000 files, 1M units, 1 GB CSV)
    .venv/bin/python benchmarks/bench_planning.py --quick --no-cache-api   # smoke run on code without `plan_cache`
    .venv/bin/python benchmarks/bench_planning.py --sizes 10000 --skip s3,csv,synthetic

Every measurement runs in a fresh Python process (imports before the clock), so nothing is warm in Python; the
data was just written, so the page cache is warm. ``plan_cache=False`` is "cold", ``plan_cache=<a temporary
folder>`` is "restart" / "warm" (the folder filled once by an untimed run first). ``--no-cache-api`` leaves the
keyword out entirely, for code that predates the cache (restart then costs what cold costs).

1. **Local Parquet** (``--sizes``, default 10,000 / 50,000 / 100,000 files of ``--rows-per-file`` rows in
   ``--units-per-file`` row groups; the smaller datasets are folders nested inside the larger ones). Per size:
   pyarrow's discovery that reads every footer (``pyarrow.dataset.dataset(folder, format="parquet")``, then
   ``ensure_complete_metadata()`` and ``row_groups`` of every fragment, one thread); ``create_dataloader`` cold;
   restart (the same, cache warm); resume to the first batch (2 workers, a checkpoint taken at
   ``--checkpoint-at`` of the epoch, from before construction to the first batch, which is checked to be the one
   after the checkpoint); what the plan adds to the process (RSS after minus before, and the growth of the peak
   RSS); bytes of ``json.dumps(loader.state_dict())`` at the checkpoint; bytes read by the process (``rchar``).
2. **Synthetic plan** (``--synthetic-units``, default 100,000 and 1,000,000 units): a plan built without listing
   or reading files (one real template file, its footer reused under ``units / --units-per-file`` distinct
   names), through the dataset's source seam: time to build the plan and the dataset, memory, the pickled
   dataset (what spawn/forkserver workers receive), and the time for 2 workers to start and yield a batch.
3. **S3** (moto on loopback, ``tests/servers.py``, behind the latency proxy ``tests/proxy.py``, ``--s3-latency``
   per request): ``--s3-files`` small Parquet files; pyarrow's discovery through s3fs (footers with 32 threads,
   as arrowstream reads them) against arrowstream cold and warm, with the proxy's LIST / HEAD / GET counts.
4. **CSV** (``--csv-mb`` of generated CSV in one file): pyarrow's ``dataset(path, format="csv").count_rows()``
   against arrowstream cold and warm.

Rounds (``--repeats``) rotate the variants; the report gives medians and bests and ratios to pyarrow measured in
the same run. The markdown report goes to stdout and to ``benchmarks/results/<date>-planning.md`` (``--out``;
``--quick`` writes only with ``--out``). Generated data lives in a temporary folder, deleted at the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import itertools
import json
import math
import os
import pickle
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent / "tests"))
sys.path.insert(0, str(BENCH_DIR))

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from bench_suite import arrowstream_commit, loadavg, main_versions
from suite.common import emit_report, log
from suite.report import fmt_ratio, machine

RESULT_PREFIX = "PLAN_RESULT "
BATCH = 1024
S3_THREADS = 32   # arrowstream reads footers with up to 32 threads (_planning.MAX_PLANNING_THREADS)
_STARTED = time.perf_counter()


def progress(message: str) -> None:
    log(f"{time.perf_counter() - _STARTED:6.0f} s  {message}")


# == in the measured (child) process ===========================================================


def status_kib(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {name} in /proc/self/status")


def read_chars() -> int:
    """Bytes this process read through read() calls, page cache included (``rchar``)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


@dataclass
class Probe:
    """Wall time, RSS growth, peak RSS growth and bytes read over a block of code."""

    seconds: float = 0.0
    rss_kib: int = 0
    peak_kib: int = 0
    read_bytes: int = 0


class measured:
    """``with measured() as probe:`` fills ``probe`` when the block ends (the peak RSS is reset at its start)."""

    def __enter__(self) -> Probe:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")   # VmHWM := VmRSS, so the peak below is this block's
        except OSError:       # not resettable here: the peak is then the process's since its start
            pass
        self.probe = Probe()
        self._rss, self._read = status_kib("VmRSS"), read_chars()
        self._start = time.perf_counter()
        return self.probe

    def __exit__(self, *exc: object) -> None:
        self.probe.seconds = time.perf_counter() - self._start
        self.probe.rss_kib = status_kib("VmRSS") - self._rss
        self.probe.peak_kib = status_kib("VmHWM") - self._rss
        self.probe.read_bytes = read_chars() - self._read


def cache_keyword(spec: dict[str, Any]) -> dict[str, Any]:
    """``plan_cache=False`` for cold, a folder for warm; nothing at all with ``--no-cache-api``."""
    cache = spec.get("cache")
    if cache is None:
        return {}
    return {"plan_cache": False if cache == "off" else cache}


def build_loader(spec: dict[str, Any], num_workers: int) -> tuple[Any, Any]:
    from arrowstream import StructuredDataset

    return StructuredDataset.create_dataloader(
        path=spec["path"], format=spec.get("format", "parquet"), batch_size=BATCH, num_workers=num_workers,
        shuffle=False, storage_options=spec.get("options"), **cache_keyword(spec))


def child_pyarrow(spec: dict[str, Any]) -> dict[str, Any]:
    """pyarrow's discovery: the dataset, then every fragment's footer (Parquet) or every row (CSV)."""
    filesystem = None
    if spec.get("options") is not None:
        import s3fs

        filesystem = s3fs.S3FileSystem(skip_instance_cache=True, **spec["options"])
    path = spec["path"].removeprefix("s3://")
    with measured() as probe:
        dataset = ds.dataset(path, format=spec["format"], filesystem=filesystem)
        if spec["format"] == "csv":
            units = 1
            rows = dataset.count_rows()
        else:
            fragments = list(dataset.get_fragments())

            def footer(fragment: Any) -> int:
                fragment.ensure_complete_metadata()
                return len(fragment.row_groups)

            if spec.get("threads", 1) > 1:
                with ThreadPoolExecutor(spec["threads"]) as pool:
                    units = sum(pool.map(footer, fragments))
            else:
                units = sum(footer(f) for f in fragments)
            rows = -1   # footers only, as planning reads them
    return {"probe": vars(probe), "units": units, "rows": rows}


def child_plan(spec: dict[str, Any]) -> dict[str, Any]:
    """``create_dataloader`` once: its time, memory and bytes read."""
    import arrowstream  # noqa: F401 - imported before the clock

    with measured() as probe:
        loader, dataset = build_loader(spec, spec.get("workers", 0))
    return {"probe": vars(probe), "rows": dataset.num_rows, "files": dataset.num_files,
            "state_bytes": len(json.dumps(loader.state_dict()))}


def child_checkpoint(spec: dict[str, Any]) -> dict[str, Any]:
    """Iterate with 2 workers to ``spec['at']`` of the epoch; save the state; note the next batch's first id."""
    loader, _dataset = build_loader(spec, 2)
    stop = max(1, int(len(loader) * spec["at"]))
    iterator = iter(loader)
    for _ in range(stop):
        next(iterator)
    state = loader.state_dict()
    text = json.dumps(state)
    Path(spec["state_file"]).write_text(text)
    following = int(next(iterator)["id"][0])
    del iterator
    return {"batches": stop, "of": len(loader), "state_bytes": len(text), "next_id": following}


def child_resume(spec: dict[str, Any]) -> dict[str, Any]:
    """A fresh loader with 2 workers, the checkpoint loaded, timed to its first batch."""
    import arrowstream  # noqa: F401 - imported before the clock

    state = json.loads(Path(spec["state_file"]).read_text())
    with measured() as probe:
        start = time.perf_counter()
        loader, _dataset = build_loader(spec, 2)
        built = time.perf_counter()
        loader.load_state_dict(state)
        first = next(iter(loader))
    first_id = int(first["id"][0])
    if first_id != spec["next_id"]:
        raise RuntimeError(f"resume gave a batch starting at id {first_id}, the checkpoint was followed by "
                           f"{spec['next_id']}")
    return {"probe": vars(probe), "construct_s": built - start}


def synthetic_source(template: str, num_files: int) -> Any:
    """A file source whose plan reuses ``template``'s footer under ``num_files`` names: no listing, no footers
    read beyond the one (readers open the template, whatever the name)."""
    from arrowstream._formats import get_format
    from arrowstream._planning.plan import build_plan, read_footer
    from arrowstream._sources.files import FileOrigin
    from arrowstream._storage.filesystem import Storage

    class SyntheticSource(FileOrigin):
        def plan(self, options: Any, retry: Any) -> tuple[Storage, Any]:
            from arrowstream._planning.discovery import discover_files

            storage, entries = discover_files(template, None, None, retry)
            footer = read_footer(storage, get_format("parquet"), entries[0], None, [])
            started = time.perf_counter()
            footers = [replace(footer, entry=replace(footer.entry, name=f"synthetic/part-{i:07d}.parquet"))
                       for i in range(num_files)]
            plan = build_plan(storage.protocol, footers, footer.schema, list(footer.schema.names), None, None,
                              identity={"schema": [[f.name, str(f.type)] for f in footer.schema]})
            self.plan_seconds = time.perf_counter() - started
            return storage, plan

    return SyntheticSource(template, "parquet", None, None)


def child_synthetic(spec: dict[str, Any]) -> dict[str, Any]:
    """A plan of ``spec['units']`` units: build, pickle, start 2 workers to the first batch, state size."""
    from arrowstream import StructuredDataset

    source = synthetic_source(spec["template"], spec["units"] // spec["units_per_file"])
    with measured() as probe:
        loader, dataset = StructuredDataset.create_dataloader(path=source, batch_size=BATCH, num_workers=2,
                                                              shuffle=False)
    num_files = spec["units"] // spec["units_per_file"]
    if dataset.num_files != num_files:
        raise RuntimeError(f"the synthetic plan has {dataset.num_files} files, expected {num_files}")
    units = num_files * spec["units_per_file"]
    start = time.perf_counter()
    pickled = pickle.dumps(dataset)
    pickle_s = time.perf_counter() - start
    del pickled
    start = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    first_s = time.perf_counter() - start
    state_bytes = len(json.dumps(loader.state_dict()))
    del iterator
    return {"probe": vars(probe), "plan_s": source.plan_seconds, "units": units, "pickle_s": pickle_s,
            "pickle_bytes": len(pickle.dumps(dataset)), "first_batch_s": first_s, "state_bytes": state_bytes}


CHILDREN: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "pyarrow": child_pyarrow, "plan": child_plan, "checkpoint": child_checkpoint, "resume": child_resume,
    "synthetic": child_synthetic}


# == in the driving process ====================================================================


def run_child(kind: str, spec: dict[str, Any], timeout: float = 3600) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps({"kind": kind, **spec})],
                          capture_output=True, text=True, check=False, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{kind} child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads(lines[-1][len(RESULT_PREFIX):]))


@dataclass
class Series:
    """The runs of one variant on one dataset."""

    label: str
    runs: list[dict[str, Any]] = field(default_factory=list)

    def values(self, key: Callable[[dict[str, Any]], float]) -> list[float]:
        return [key(r) for r in self.runs]

    def median(self, key: Callable[[dict[str, Any]], float]) -> float:
        return float(statistics.median(self.values(key)))

    def best(self, key: Callable[[dict[str, Any]], float]) -> float:
        return min(self.values(key))

    @property
    def seconds(self) -> float:
        return self.median(lambda r: r["probe"]["seconds"])


def seconds_of(run: dict[str, Any]) -> float:
    return float(run["probe"]["seconds"])


def rounds(variants: dict[str, Callable[[], dict[str, Any]]], repeats: int, what: str) -> dict[str, Series]:
    """``repeats`` rounds over the variants, in an order that rotates by one each round."""
    series = {name: Series(name) for name in variants}
    names = list(variants)
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            progress(f"{what}, round {round_ + 1}/{repeats}: {name}")
            series[name].runs.append(variants[name]())
    return series


# -- data --------------------------------------------------------------------------------------


def small_table(index: int, rows: int) -> pa.Table:
    ids = np.arange(index * rows, (index + 1) * rows, dtype=np.int64)
    return pa.table({"id": ids, "value": ids.astype(np.float64) / 7})


def write_local(root: Path, sizes: list[int], rows: int, units: int) -> list[Path]:
    """One folder per size, each smaller dataset a subfolder of the next one; file ``i`` holds ids
    ``[i * rows, (i + 1) * rows)``."""
    folders = [root.joinpath("local", *["inner"] * (len(sizes) - 1 - k)) for k in range(len(sizes))]
    done = 0
    for folder, size in zip(folders, sizes):
        folder.mkdir(parents=True, exist_ok=True)
        progress(f"writing {size - done:,} files of {rows} rows in {units} row groups into {folder}")
        for i in range(done, size):
            pq.write_table(small_table(i, rows), folder / f"part-{i:07d}.parquet", row_group_size=-(-rows // units))
        done = size
    return folders


def write_csv(path: Path, megabytes: int, seed: int) -> int:
    """About ``megabytes`` MiB of CSV (``id``, two floats, a string); returns its rows."""
    rng = np.random.default_rng(seed)
    chunk, rows = 100_000, 0
    with open(path, "wb") as out:
        while out.tell() < megabytes << 20:
            ids = np.arange(rows, rows + chunk, dtype=np.int64)
            table = pa.table({"id": ids, "x": rng.standard_normal(chunk), "y": rng.random(chunk),
                              "name": pa.array(np.char.add("name-", (ids % 10_000).astype(str)))})
            sink = io.BytesIO()
            pa_csv.write_csv(table, sink, pa_csv.WriteOptions(include_header=rows == 0))
            out.write(sink.getvalue())
            rows += chunk
    return rows


# -- measurements ------------------------------------------------------------------------------


def cache_specs(args: argparse.Namespace, folder: Path) -> tuple[str | None, str | None]:
    """The ``cache`` entries of a cold and of a warm spec."""
    if args.no_cache_api:
        return None, None
    return "off", str(folder)


@dataclass
class LocalResult:
    files: int
    units: int
    series: dict[str, Series]
    checkpoint: dict[str, Any]
    writing: dict[str, Any]


def measure_local(args: argparse.Namespace, folder: Path, files: int, work: Path) -> LocalResult:
    cold_cache, warm_cache = cache_specs(args, work / f"cache-{files}")
    path = str(folder)
    progress(f"{files:,} files: filling the plan cache (untimed) and taking a checkpoint")
    writing = run_child("plan", {"path": path, "cache": warm_cache})
    if writing["files"] != files or writing["rows"] != files * args.rows_per_file:
        raise RuntimeError(f"planned {writing['files']} files / {writing['rows']} rows, expected {files} / "
                           f"{files * args.rows_per_file}")
    state_file = work / f"state-{files}.json"
    checkpoint = run_child("checkpoint", {"path": path, "cache": warm_cache, "at": args.checkpoint_at,
                                          "state_file": str(state_file)})
    fresh = itertools.count()
    variants = {
        "pyarrow": lambda: run_child("pyarrow", {"path": path, "format": "parquet"}),
        "cold": lambda: run_child("plan", {"path": path, "cache": cold_cache}),
        # the default on a first start: the cache on, its folder empty (the plan is read and the entry written)
        "first": lambda: run_child("plan", {"path": path, "cache": None if args.no_cache_api else
                                            str(work / f"first-{files}-{next(fresh)}")}),
        "restart": lambda: run_child("plan", {"path": path, "cache": warm_cache}),
        "resume": lambda: run_child("resume", {"path": path, "cache": warm_cache, "state_file": str(state_file),
                                               "next_id": checkpoint["next_id"]}),
    }
    series = rounds(variants, args.repeats, f"{files:,} local files")
    return LocalResult(files, series["pyarrow"].runs[0]["units"], series, checkpoint, writing)


def measure_synthetic(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    template = work / "template.parquet"
    rows = args.rows_per_file // args.units_per_file * args.units_per_file
    pq.write_table(small_table(0, rows), template, row_group_size=rows // args.units_per_file)
    out = []
    for units in args.synthetic_units:
        progress(f"synthetic plan of {units:,} units")
        result = run_child("synthetic", {"template": str(template), "units": units,
                                         "units_per_file": args.units_per_file})
        out.append({"requested": units, **result})
    return out


@dataclass
class RemoteResult:
    files: int
    series: dict[str, Series]


def measure_s3(args: argparse.Namespace) -> RemoteResult:
    import servers
    from proxy import start_proxy

    with servers.start_s3() as store, start_proxy(store.endpoint) as proxy:
        url = store.url("planning")
        objects = {}
        for i in range(args.s3_files):
            sink = io.BytesIO()
            pq.write_table(small_table(i, args.rows_per_file), sink,
                           row_group_size=-(-args.rows_per_file // args.units_per_file))
            objects[f"{url}/part-{i:06d}.parquet"] = sink.getvalue()
        progress(f"writing {len(objects):,} small files into {url} (straight to moto)")
        store.filesystem().pipe(objects)
        proxy.configure(latency=args.s3_latency)
        options = store.options_via(proxy.endpoint)
        with tempfile.TemporaryDirectory(prefix="bench-planning-s3-cache-") as cache:
            cold_cache, warm_cache = cache_specs(args, Path(cache))

            def counted(kind: str, spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
                def run() -> dict[str, Any]:
                    proxy.reset()
                    result = run_child(kind, {"path": url, "options": options, **spec})
                    result["counts"] = {k: int(v) for k, v in proxy.stats()["counts"].items()}
                    return result
                return run

            progress(f"S3 {args.s3_files:,} files: filling the plan cache (untimed)")
            counted("plan", {"cache": warm_cache})()
            variants = {"pyarrow": counted("pyarrow", {"format": "parquet", "threads": S3_THREADS}),
                        "cold": counted("plan", {"cache": cold_cache}),
                        "warm": counted("plan", {"cache": warm_cache})}
            series = rounds(variants, args.repeats, f"S3 {args.s3_files:,} files")
    return RemoteResult(args.s3_files, series)


def measure_csv(args: argparse.Namespace, work: Path) -> tuple[int, int, dict[str, Series]]:
    path = work / "data.csv"
    progress(f"writing about {args.csv_mb:,} MiB of CSV")
    rows = write_csv(path, args.csv_mb, args.seed)
    cold_cache, warm_cache = cache_specs(args, work / "cache-csv")
    spec = {"path": str(path), "format": "csv"}
    progress("CSV: filling the plan cache (untimed)")
    first = run_child("plan", {**spec, "cache": warm_cache})
    if first["rows"] != rows:
        raise RuntimeError(f"CSV: planned {first['rows']} rows, wrote {rows}")
    variants = {"pyarrow": lambda: run_child("pyarrow", spec),
                "cold": lambda: run_child("plan", {**spec, "cache": cold_cache}),
                "warm": lambda: run_child("plan", {**spec, "cache": warm_cache})}
    return rows, path.stat().st_size, rounds(variants, args.repeats, "CSV")


# -- the report --------------------------------------------------------------------------------


def table(header: list[str], rows: list[list[str]], right_from: int = 1) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    return ["| " + " | ".join(line) + " |" for line in [header, align, *rows]]


def fmt_s(seconds: float) -> str:
    return f"{seconds:.1f}" if seconds >= 10 else f"{seconds:.2f}" if seconds >= 0.1 else f"{seconds:.3f}"


def fmt_kib(kib: float) -> str:
    return f"{kib / 1024:.1f}"


def timing(series: Series, key: Callable[[dict[str, Any]], float] = seconds_of) -> str:
    if len(series.runs) == 1:
        return fmt_s(series.median(key))
    return f"{fmt_s(series.median(key))} ({fmt_s(series.best(key))})"


def local_section(results: list[LocalResult], args: argparse.Namespace) -> list[str]:
    header = ["files", "row groups", "pyarrow s", "cold s", "cold / pyarrow", "first start s", "first / pyarrow",
              "restart s", "restart / pyarrow", "resume to 1st batch s", "resume / pyarrow"]
    rows, memory, curve = [], [], []
    for r in results:
        s = r.series
        base = s["pyarrow"].seconds
        rows.append([f"{r.files:,}", f"{r.units:,}", timing(s["pyarrow"]), timing(s["cold"]),
                     fmt_ratio(s["cold"].seconds / base), timing(s["first"]), fmt_ratio(s["first"].seconds / base),
                     timing(s["restart"]),
                     fmt_ratio(s["restart"].seconds / base), timing(s["resume"]),
                     fmt_ratio(s["resume"].seconds / base)])
        rss = s["cold"].median(lambda run: run["probe"]["rss_kib"])
        peak = s["cold"].median(lambda run: run["probe"]["peak_kib"])
        memory.append([f"{r.files:,}", fmt_kib(rss), fmt_kib(peak), f"{rss * 1024 / r.units:,.0f}",
                       fmt_kib(s["restart"].median(lambda run: run["probe"]["rss_kib"])),
                       f"{s['cold'].median(lambda run: run['probe']['read_bytes']) / 2**20:.1f}",
                       f"{s['restart'].median(lambda run: run['probe']['read_bytes']) / 2**20:.1f}",
                       f"{r.checkpoint['state_bytes']:,}", f"{r.writing['state_bytes']:,}",
                       f"{s['resume'].median(lambda run: run['construct_s']):.2f}"])
        curve.append([f"{r.files:,}"] + [f"{s[k].seconds / r.files * 1e6:.0f}"
                                         for k in ("pyarrow", "cold", "first", "restart", "resume")])
    lines = [
        "## 1. Local Parquet files", "",
        (f"Files of {args.rows_per_file} rows in {args.units_per_file} row groups (`id` int64, `value` float64), "
         f"page cache warm. Seconds: median of {args.repeats} (best in brackets), each run a fresh process. "
         "pyarrow: `dataset(folder, format=\"parquet\")`, then `ensure_complete_metadata()` and `row_groups` of "
         "every fragment (one thread). Cold: `plan_cache=False`; first start: the default, the cache on with its "
         "folder empty (the plan read and its entry written). "
         f"Resume: 2 workers, a checkpoint at {args.checkpoint_at:.0%} of the epoch "
         "(JSON), from before construction to the first batch (checked to be the batch after the checkpoint)."),
        "", *table(header, rows), "",
        ("Memory and state (the cold plan; RSS in MiB, after minus before construction; the peak is the growth of "
        "the process's peak RSS during construction; \"read\": bytes through read() calls, page cache included):"),
        "",
        *table(["files", "RSS added MiB", "peak added MiB", "bytes per row group", "RSS added, restart MiB",
                "read MiB cold", "read MiB restart", "state bytes at checkpoint (2 workers)",
                "state bytes, fresh loader", "resume: construction s"], memory), "",
        "Cost per file, µs (median seconds / files): linear growth keeps each column flat.", "",
        *table(["files", "pyarrow", "cold", "first start", "restart", "resume"], curve), "",
    ]
    if len(results) > 1:
        first, last = results[0], results[-1]
        slopes = []
        for k in ("pyarrow", "cold", "first", "restart", "resume"):
            slope = (math.log(last.series[k].seconds / first.series[k].seconds) / math.log(last.files / first.files))
            slopes.append(f"{k} {slope:.2f}")
        lines += [f"Growth exponent from {first.files:,} to {last.files:,} files (log-log slope; 1.0 is linear): "
                  + ", ".join(slopes) + ".", "",
                  (f"Memory per row group at the margin (RSS added, {first.files:,} to {last.files:,} files, the "
                   f"file names included): {marginal_bytes(first, last):,.0f} bytes, "
                   f"{marginal_bytes(first, last) * 100_000 / 2**20:.1f} MiB per 100,000 row groups."), ""]
    return lines


def rss_added_kib(result: LocalResult, variant: str = "cold") -> float:
    return result.series[variant].median(lambda run: run["probe"]["rss_kib"])


def marginal_bytes(first: LocalResult, last: LocalResult) -> float:
    """RSS the plan adds per row group between two sizes: the fixed costs (lazy imports, threads) cancel."""
    return (rss_added_kib(last) - rss_added_kib(first)) * 1024 / (last.units - first.units)


def synthetic_section(results: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    rows = [[f"{r['units']:,}", f"{r['units'] // args.units_per_file:,}", fmt_s(r["plan_s"]),
             fmt_s(r["probe"]["seconds"]), fmt_kib(r["probe"]["rss_kib"]), fmt_kib(r["probe"]["peak_kib"]),
             f"{r['pickle_bytes'] / 2**20:.1f}", fmt_s(r["pickle_s"]), fmt_s(r["first_batch_s"]),
             f"{r['state_bytes']:,}"] for r in results]
    lines = [
        "## 2. A synthetic plan", "",
        (f"No listing and no footers: one template file of {args.units_per_file} row groups, its footer reused "
         f"under distinct names ({args.units_per_file} units per file), planned by `build_plan` behind the "
         "dataset's source seam. One run each, in a fresh process. The footers share the template's schema "
         "and Parquet metadata objects, so the memory is a lower bound for as many real files. The pickled "
         "dataset is what spawn or forkserver workers receive (fork, used here, pickles nothing)."), "",
        *table(["units", "files", "plan s", "dataset built s (plan included)", "RSS added MiB", "peak added MiB",
                "pickled dataset MiB", "pickle s", "2 workers to 1st batch s", "state bytes"], rows), "",
    ]
    if len(results) > 1:
        a, b = results[0], results[-1]
        slope = math.log(b["probe"]["seconds"] / a["probe"]["seconds"]) / math.log(b["units"] / a["units"])
        lines += [f"Growth exponent of the build from {a['units']:,} to {b['units']:,} units: {slope:.2f}.", ""]
    return lines


def counts_of(series: Series) -> str:
    run = sorted(series.runs, key=seconds_of)[len(series.runs) // 2]
    c = run["counts"]
    return f"{c.get('list', 0)} / {c.get('head', 0)} / {c.get('read', 0)}"


def s3_section(result: RemoteResult, args: argparse.Namespace) -> list[str]:
    s = result.series
    base = s["pyarrow"].seconds
    rows = [[label, timing(s[k]), fmt_ratio(s[k].seconds / base), counts_of(s[k])]
            for k, label in (("pyarrow", f"pyarrow `dataset` via s3fs, footers with {S3_THREADS} threads"),
                             ("cold", "arrowstream cold"), ("warm", "arrowstream warm (restart)"))]
    return ["## 3. S3 (moto) behind the latency proxy", "",
            (f"{result.files:,} files of {args.rows_per_file} rows, {args.s3_latency * 1e3:.0f} ms added per "
             "request; each run a fresh process; requests as the proxy counted them."), "",
            *table(["", "seconds", "vs pyarrow", "requests list / head / read"], rows), ""]


def csv_section(rows: int, size: int, s: dict[str, Series], args: argparse.Namespace) -> list[str]:
    base = s["pyarrow"].seconds
    out = [[label, timing(s[k]), fmt_ratio(s[k].seconds / base),
            f"{s[k].median(lambda run: run['probe']['read_bytes']) / 2**20:,.0f}"]
           for k, label in (("pyarrow", "pyarrow `dataset(path, format=\"csv\").count_rows()`"),
                            ("cold", "arrowstream cold"), ("warm", "arrowstream warm (restart)"))]
    return ["## 4. CSV", "",
            f"One file of {size / 2**20:,.0f} MiB, {rows:,} rows; page cache warm; each run a fresh process.", "",
            *table(["", "seconds", "vs pyarrow", "MiB read"], out), ""]


GOAL_FILES = 50_000


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def goal_lines(local: list[LocalResult], synthetic: list[dict[str, Any]], s3: RemoteResult | None,
               csv: tuple[int, int, dict[str, Series]] | None) -> list[str]:
    """The goals of issue #19, judged on this run's numbers (on the sizes this run measured)."""
    out = []
    if local:
        at = next((r for r in local if r.files == GOAL_FILES), local[-1])
        base = at.series["pyarrow"].seconds
        cold, first, restart, resume = (at.series[k].seconds / base for k in ("cold", "first", "restart", "resume"))
        out += [(f"- Cold plan of {at.files:,} files ≤ 1.0x pyarrow: {fmt_ratio(cold)} without the cache, "
                 f"{verdict(cold <= 1.0)}; {fmt_ratio(first)} on a first start with the cache on (the default: the "
                 f"entry written too), {verdict(first <= 1.0)}"),
                (f"- Restart ≤ 0.3x pyarrow: {fmt_ratio(restart)}, {verdict(restart <= 0.3)}; resume to the first "
                f"batch ≤ 0.3x: {fmt_ratio(resume)}, {verdict(resume <= 0.3)}")]
        if len(local) > 1:
            per_100k = marginal_bytes(local[0], local[-1]) * 100_000 / 2**20
            out.append(f"- Plan memory ≤ 30 MB per 100,000 units (file names included here): {per_100k:.1f} MiB, "
                       f"{verdict(per_100k <= 30 * 1e6 / 2**20)}")
    if synthetic:
        big = synthetic[-1]
        rss_mb = big["probe"]["rss_kib"] * 1024 / 1e6
        out += [(f"- A {big['units']:,}-unit plan held in ≤ 300 MB: {rss_mb:,.0f} MB, {verdict(rss_mb <= 300)}; "
                f"2 workers started (to the first batch) in ≤ 2 s: {fmt_s(big['first_batch_s'])} s, "
                f"{verdict(big['first_batch_s'] <= 2.0)}")]
        if len(synthetic) > 1:
            a = synthetic[0]
            slope = math.log(big["probe"]["seconds"] / a["probe"]["seconds"]) / math.log(big["units"] / a["units"])
            out.append(f"- Planned in linear time (growth exponent ≤ 1.15, one run each): {slope:.2f}, {verdict(slope <= 1.15)}")
    if s3 is not None:
        c = sorted(s3.series["warm"].runs, key=seconds_of)[len(s3.series["warm"].runs) // 2]["counts"]
        ok = c.get("list", 0) == 1 and c.get("head", 0) == 0 and c.get("read", 0) == 0
        out.append(f"- S3 {s3.files:,} files, warm: 1 LIST, 0 HEAD, 0 reads: {counts_of(s3.series['warm'])}, "
                   f"{verdict(ok)}")
    if csv is not None:
        read_mib = csv[2]["warm"].median(lambda run: run["probe"]["read_bytes"]) / 2**20
        out.append(f"- CSV warm restart reads no data (under 1 MiB read while the loader is built): {read_mib:,.1f} "
                   f"MiB, {verdict(read_mib < 1)}")
    return ["## Goals of issue #19 on this run", "", *out, ""] if out else []


def report(args: argparse.Namespace, sections: list[str], seconds: float, load_before: str) -> str:
    now = dt.datetime.now(dt.UTC)
    versions = ", ".join(f"{k} {v}" for k, v in main_versions().items())
    cache = ("left out (`--no-cache-api`: code without `plan_cache`; restart and warm re-plan)"
             if args.no_cache_api else "`plan_cache=False` cold, a temporary folder warm")
    return "\n".join([
        f"# Planning at scale ({now.date().isoformat()})", "",
        f"- Date: {now:%Y-%m-%d, %H:%M} UTC",
        f"- Machine: {machine()}; `nproc` = {os.cpu_count()}",
        f"- Python {sys.version.split()[0]}; {versions}; arrowstream at {arrowstream_commit()}",
        f"- Command: `{shlex.join(['.venv/bin/python', 'benchmarks/bench_planning.py', *sys.argv[1:]])}`",
        f"- Load average before / after: {load_before} / {loadavg()}; run time {seconds / 60:.1f} min",
        f"- The plan cache keyword: {cache}; `batch_size={BATCH}`, `shuffle=False`", "",
        *sections]) + "\n"


# -- main --------------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def has_cache_api() -> bool:
    import inspect

    from arrowstream import StructuredDataset

    return "plan_cache" in inspect.signature(StructuredDataset.__init__).parameters


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, 1 repeat, prints only")
    parser.add_argument("--no-cache-api", action="store_true", help="leave the plan_cache keyword out")
    parser.add_argument("--sizes", default=None, help="local dataset sizes in files (default 10000,50000,100000)")
    parser.add_argument("--rows-per-file", type=int, default=200)
    parser.add_argument("--units-per-file", type=int, default=2, help="row groups per file (default 2)")
    parser.add_argument("--synthetic-units", default=None, help="synthetic plan sizes (default 100000,1000000)")
    parser.add_argument("--s3-files", type=int, default=None, help="S3 files (default 2000)")
    parser.add_argument("--s3-latency", type=float, default=0.02, help="seconds added per request (default 0.02)")
    parser.add_argument("--csv-mb", type=int, default=None, help="MiB of CSV (default 1024)")
    parser.add_argument("--checkpoint-at", type=float, default=0.5, help="share of the epoch (default 0.5)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 3)")
    parser.add_argument("--skip", default="", help="parts to leave out: local,synthetic,s3,csv")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="the report file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    quick = args.quick
    args.sizes = int_list(args.sizes or ("2000,5000" if quick else "10000,50000,100000"))
    if args.sizes != sorted(set(args.sizes)):
        parser.error("--sizes: increasing sizes, each dataset nests inside the next")
    args.synthetic_units = int_list(args.synthetic_units or ("20000,100000" if quick else "100000,1000000"))
    args.s3_files = args.s3_files or (200 if quick else 2000)
    args.csv_mb = args.csv_mb or (50 if quick else 1024)
    args.repeats = args.repeats or (1 if quick else 3)
    args.skip = {s for s in args.skip.split(",") if s}
    if args.skip - {"local", "synthetic", "s3", "csv"}:
        parser.error(f"--skip: unknown parts {sorted(args.skip - {'local', 'synthetic', 's3', 'csv'})}")
    if not args.no_cache_api and args.child is None and not has_cache_api():
        parser.error("this arrowstream's StructuredDataset takes no `plan_cache` keyword; run with --no-cache-api "
                     "(restart then re-plans, as cold does)")
    if args.out is None and not quick:
        args.out = BENCH_DIR / "results" / f"{dt.date.today().isoformat()}-planning.md"
    return args


def main() -> int:
    args = parse_args()
    if args.child is not None:
        spec = json.loads(args.child)
        print(RESULT_PREFIX + json.dumps(CHILDREN[spec["kind"]](spec)), flush=True)
        return 0
    start, load_before = time.perf_counter(), loadavg()
    sections: list[str] = []
    local: list[LocalResult] = []
    synthetic: list[dict[str, Any]] = []
    s3: RemoteResult | None = None
    csv: tuple[int, int, dict[str, Series]] | None = None
    with tempfile.TemporaryDirectory(prefix="bench-planning-") as tmp:
        work = Path(tmp)
        if "local" not in args.skip:
            folders = write_local(work, args.sizes, args.rows_per_file, args.units_per_file)
            local = [measure_local(args, folder, files, work) for folder, files in zip(folders, args.sizes)]
            sections += local_section(local, args)
        if "synthetic" not in args.skip:
            synthetic = measure_synthetic(args, work)
            sections += synthetic_section(synthetic, args)
        if "s3" not in args.skip:
            s3 = measure_s3(args)
            sections += s3_section(s3, args)
        if "csv" not in args.skip:
            csv = measure_csv(args, work)
            sections += csv_section(*csv, args)
    sections = goal_lines(local, synthetic, s3, csv) + sections
    emit_report(report(args, sections, time.perf_counter() - start, load_before), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
