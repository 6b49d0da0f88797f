"""CSV and JSON Lines: arrowstream against pyarrow's own CSV and JSON readers, rows/s in one run.

Run from the repository root:

    .venv/bin/python benchmarks/bench_text.py                  # 1,000,000 rows, ~4 min on 2 cores
    .venv/bin/python benchmarks/bench_text.py --rows 200000    # smaller, for a quick look

Data: one seeded table (``id`` int64, ``x`` float64, ``label`` int64, ``name`` string, ``flag`` bool),
written once into ``benchmarks/data/`` (git-ignored) as one CSV file (``pyarrow.csv.write_csv``), the
same CSV gzip-compressed, and one JSON Lines file; later runs with the same ``--rows`` reuse them.

Loaders, ``batch_size=1024``, one whole epoch each, all giving the same output: numeric and bool
columns as ``torch.from_numpy(col.to_numpy())``, strings as ``col.to_pylist()``:

* pyarrow, streaming: ``pyarrow.csv.open_csv`` / ``pyarrow.json.open_json`` (its threads, its type
  inference), each batch sliced into 1024 rows (a short one at the end of each of pyarrow's blocks); once more with Python's cyclic garbage collector off,
  as arrowstream has it while it makes Python lists;
* pyarrow, whole file: ``pyarrow.csv.read_csv`` / ``pyarrow.json.read_json`` (multi-threaded over the
  whole file), then sliced;
* arrowstream: ``StructuredDataset.create_dataloader(path=file, format="csv" | "jsonl", num_workers=0 | 2,
  shuffle=False)`` with the default split size (units of 8 MiB; a compressed file is one split).

Rows/s over the whole epoch count from before the loader is built, so arrowstream's planning scan
(it reads every byte once to find where rows start) is inside its time; the planning time alone is
reported too. Every loader runs once untimed first (checks every ``id`` exactly once and equal column
sums), then ``--repeats`` rounds in a rotating order; the report takes medians.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_suite import arrowstream_commit, loadavg, main_versions
from suite.baselines import fingerprint, gc_off
from suite.common import emit_report, log, time_epoch
from suite.report import fmt_ms, fmt_ratio, fmt_rps, machine
from suite.tables import DATA_ROOT

from arrowstream import StructuredDataset

BATCH = 1024
FILES = {"CSV": ("data.csv", "csv"), "CSV, gzip": ("data.csv.gz", "csv"), "JSON Lines": ("data.jsonl", "jsonl")}
LOADERS = ("pyarrow streaming", "pyarrow streaming, gc off", "pyarrow whole file", "workers=0", "workers=2")

Batch = dict[str, Any]


def write_data(rows: int, seed: int) -> Path:
    folder = DATA_ROOT / f"text-{rows}-s{seed}"
    done = folder / "_done.json"
    if done.exists():
        return folder
    log(f"writing {rows:,} rows as CSV, CSV.gz and JSON Lines into {folder}")
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    ids = np.arange(rows, dtype=np.int64)
    table = pa.table({"id": ids, "x": rng.standard_normal(rows), "label": ids % 10,
                      "name": [f"name-{i}" for i in range(rows)], "flag": ids % 3 == 0})
    pa_csv.write_csv(table, folder / "data.csv")
    with pa.CompressedOutputStream(str(folder / "data.csv.gz"), "gzip") as out:
        out.write((folder / "data.csv").read_bytes())
    with open(folder / "data.jsonl", "w") as out:
        for start in range(0, rows, 100_000):
            out.writelines(json.dumps(row) + "\n" for row in table.slice(start, 100_000).to_pylist())
    done.write_text(json.dumps({"rows": rows, "seed": seed}))
    return folder


def convert(batch: pa.RecordBatch) -> Batch:
    """Numeric and bool columns to tensors, strings to lists (arrowstream's ``torch`` output)."""
    return {f.name: torch.from_numpy(c.to_numpy(zero_copy_only=False)) if not pa.types.is_string(f.type)
            else c.to_pylist() for f, c in zip(batch.schema, batch.columns, strict=True)}


def sliced(batches: Iterator[pa.RecordBatch]) -> Iterator[Batch]:
    """Each batch pyarrow gives sliced into ``BATCH`` rows (zero-copy; a short one at each block's end,
    as the raw loops of the other benchmarks do), and converted."""
    for batch in batches:
        for start in range(0, batch.num_rows, BATCH):
            yield convert(batch.slice(start, BATCH))


def streaming(path: Path, fmt: str) -> Iterator[Batch]:
    if fmt == "csv":
        return sliced(iter(pa_csv.open_csv(path)))
    return sliced(iter(pa_json.open_json(path)))


def whole_file(path: Path, fmt: str) -> Iterator[Batch]:
    table = pa_csv.read_csv(path) if fmt == "csv" else pa_json.read_json(path)
    return sliced(iter(table.to_batches()))


def arrowstream_loop(path: Path, fmt: str, num_workers: int) -> Iterator[Batch]:
    loader, dataset = StructuredDataset.create_dataloader(path=str(path), format=fmt, batch_size=BATCH,
                                                          num_workers=num_workers, shuffle=False, plan_cache=False)
    dataset.set_epoch(0)
    return iter(loader)


def maker(loader: str, path: Path, fmt: str) -> Callable[[], Iterator[Batch]]:
    if loader == "pyarrow streaming":
        return lambda: streaming(path, fmt)
    if loader == "pyarrow streaming, gc off":
        return lambda: gc_off(streaming(path, fmt))
    if loader == "pyarrow whole file":
        return lambda: whole_file(path, fmt)
    workers = int(loader.split("=")[1])
    return lambda: arrowstream_loop(path, fmt, workers)


def planning_seconds(path: Path, fmt: str) -> float:
    start = time.perf_counter()
    StructuredDataset(str(path), format=fmt, batch_size=BATCH, plan_cache=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown report here")
    args = parser.parse_args()
    load_before, began = loadavg(), time.perf_counter()
    folder = write_data(args.rows, args.seed)
    keys = [(label, loader) for label in FILES for loader in LOADERS]
    makers = {(label, loader): maker(loader, folder / FILES[label][0], FILES[label][1]) for label, loader in keys}
    reference: dict[str, float] | None = None
    for key in keys:
        log(f"warm-up and check: {key}")
        ids, sums = fingerprint(makers[key]())
        if len(ids) != args.rows or not np.array_equal(np.sort(ids), np.arange(args.rows)):
            raise RuntimeError(f"{key}: read {len(ids)} rows, not each of the {args.rows} ids exactly once")
        reference = reference or sums
        if set(sums) != set(reference) or not all(np.isclose(sums[n], reference[n], rtol=1e-9) for n in sums):
            raise RuntimeError(f"{key}: column sums {sums} differ from {reference}")
    samples: dict[tuple[str, str], list[dict[str, Any]]] = {key: [] for key in keys}
    planning: dict[str, list[float]] = {label: [] for label in FILES}
    for round_ in range(args.repeats):
        log(f"round {round_ + 1} of {args.repeats}")
        shift = round_ * 3 % len(keys)
        for key in keys[shift:] + keys[:shift]:
            samples[key].append(time_epoch(makers[key]))
        for label, (name, fmt) in FILES.items():
            planning[label].append(planning_seconds(folder / name, fmt))

    def med(key: tuple[str, str], field: str) -> float:
        return float(statistics.median(r[field] for r in samples[key]))

    rows_out = []
    for label, loader in keys:
        epoch = med((label, loader), "epoch_rps")
        rows_out.append([label, loader if loader.startswith("pyarrow") else f"arrowstream num_workers={loader[-1]}",
                         fmt_rps(epoch), fmt_ratio(epoch / med((label, "pyarrow streaming"), "epoch_rps")),
                         fmt_ratio(epoch / med((label, "pyarrow streaming, gc off"), "epoch_rps")),
                         fmt_ratio(epoch / med((label, "pyarrow whole file"), "epoch_rps")),
                         fmt_rps(med((label, loader), "steady_rps")),
                         fmt_ratio(med((label, loader), "steady_rps") / med((label, "pyarrow streaming"), "steady_rps")),
                         fmt_ms(med((label, loader), "first_s"))])
    sizes = {label: (folder / name).stat().st_size for label, (name, _) in FILES.items()}
    versions = ", ".join(f"{n} {v}" for n, v in main_versions().items())
    header = ["file", "loader", "rows/s, whole epoch (median)", "vs pyarrow streaming", "vs streaming, gc off",
              "vs pyarrow whole file", "rows/s after the 1st batch", "vs pyarrow streaming", "first batch ms"]
    table = ["| " + " | ".join(header) + " |", "| --- | --- |" + " ---: |" * (len(header) - 2),
             *["| " + " | ".join(r) + " |" for r in rows_out]]
    plan_lines = [f"| {label} | {sizes[label] / 2**20:.0f} | {statistics.median(planning[label]):.2f} | "
                  f"{sizes[label] / 2**20 / statistics.median(planning[label]):.0f} |" for label in FILES]
    text = "\n".join([
        f"# CSV and JSON Lines vs pyarrow's own readers ({dt.date.today().isoformat()})", "",
        f"- Machine: {machine()}",
        f"- Python {sys.version.split()[0]}; {versions}; arrowstream at {arrowstream_commit()}",
        f"- Command: `{shlex.join(['.venv/bin/python', 'benchmarks/bench_text.py', *sys.argv[1:]])}`",
        (f"- Load average before / after: {load_before} / {loadavg()}; "
         f"run time {(time.perf_counter() - began) / 60:.1f} min"),
        (f"- {args.rows:,} rows, batch_size={BATCH}, shuffle=False; {args.repeats} timed rounds after a checked "
         "warm-up round, loaders in a rotating order; medians. Files in the page cache."), "",
        "## Rows/s", "", *table, "",
        ("Whole-epoch rows/s include building the loader: arrowstream's planning scan and worker start-up. "
         "Rows/s after the first batch leave them out: the rate of a long run, which plans once."), "",
        "## Planning (the scan that finds where rows start; median)", "",
        "| file | MiB | planning s | MiB/s |", "| --- | ---: | ---: | ---: |", *plan_lines, "",
    ])
    emit_report(text, args.out)


if __name__ == "__main__":
    main()
