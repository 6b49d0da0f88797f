"""ORC and Arrow IPC readers against the raw pyarrow loop of their own format: rows/s in one run.

Run from the repository root:

    .venv/bin/python benchmarks/bench_formats.py                  # 2,000,000 rows per table, ~1.5 min on 2 cores
    .venv/bin/python benchmarks/bench_formats.py --rows 200000    # smaller, for a quick look

Data: the suite's seeded tables (``suite/tables.py``: ``numeric``, and ``mixed`` with a string and a
``list<float32>`` column), in ``--files`` files, written once per format into ``benchmarks/data/``
(git-ignored) and reused by later runs with the same parameters:

* Parquet (the reference): snappy, row groups of ``--unit-rows`` rows (the suite's own folder);
* ORC: snappy, one stripe per ``--unit-rows`` rows (``orc.write_table(stripe_size=1, batch_size=N)``);
* Arrow IPC file: uncompressed, one record batch per ``--unit-rows`` rows (``write_table(max_chunksize=N)``).

Loaders, ``batch_size=1024``, one whole epoch each, all giving the same output: numeric columns as
``torch.from_numpy(col.to_numpy())``, the other columns as ``col.to_pylist()`` (``suite/baselines.py``):

* raw loop, Parquet: ``pq.ParquetFile(f).iter_batches(batch_size=1024)`` (the suite's raw loop);
* raw loop, ORC: ``orc.ORCFile(f).read_stripe(i)`` for each stripe, sliced into 1024-row batches;
* raw loop, IPC: ``ipc.open_file(pa.memory_map(f)).get_batch(i)`` for each batch, sliced likewise;
* each raw loop once more with Python's cyclic garbage collector off (``gc.disable()``), as arrowstream
  has it while it makes Python lists: without that the collector runs every few hundred lists, and the
  string and list columns of ``mixed`` cost the raw loops several times more (numeric columns: no change);
* arrowstream: ``StructuredDataset.create_dataloader(path=folder, format=..., num_workers=0 | 2,
  output_format="torch", shuffle=False)``, ``set_epoch(0)``, iterate.

Every loader runs once untimed first (the warm-up round, which also checks that each one yields
every ``id`` exactly once and the same column sums as the Parquet raw loop), then
``--repeats`` timed rounds; each round runs every loader of a table once, in a rotating order, so a
noisy neighbour slows them alike. The report takes medians. Rows/s over the whole epoch count from
before the loader is built (arrowstream's planning and worker start-up included) to the last batch.

The markdown report goes to stdout (and to ``--out`` when given); progress goes to stderr.
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import ipc, orc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_suite import arrowstream_commit, loadavg, main_versions
from suite import tables
from suite.baselines import convert, fingerprint, gc_off, raw_batches
from suite.common import emit_report, log, time_epoch
from suite.report import fmt_ms, fmt_ratio, fmt_rps, machine

from arrowstream import StructuredDataset

BATCH = 1024
FORMATS = ("parquet", "orc", "arrow")
FORMAT_LABELS = {"parquet": "Parquet", "orc": "ORC", "arrow": "Arrow IPC"}
LOADERS = ("raw", "raw, gc off", "workers=0", "workers=2")
MANIFEST = "_manifest.json"   # a leading "_": arrowstream skips it when it lists a folder

Batch = dict[str, Any]


@dataclass(frozen=True)
class Source:
    """One table written in one format: its folder (what arrowstream reads) and its files, in order."""

    kind: str
    format: str
    folder: Path
    files: list[str]
    rows: int
    units: int
    bytes: int


@dataclass(frozen=True)
class Key:
    """One measured loader."""

    kind: str
    format: str
    loader: str


# -- data ----------------------------------------------------------------------------------------


def write_orc(table: pa.Table, path: Path, unit_rows: int) -> None:
    # a stripe closes after each write batch once it passes stripe_size: one stripe per batch
    orc.write_table(table, path, stripe_size=1, batch_size=unit_rows, compression="snappy")


def write_ipc(table: pa.Table, path: Path, unit_rows: int) -> None:
    with ipc.new_file(path, table.schema) as writer:
        writer.write_table(table, max_chunksize=unit_rows)


def count_units(fmt: str, path: str) -> int:
    if fmt == "parquet":
        return int(pq.ParquetFile(path).metadata.num_row_groups)
    if fmt == "orc":
        return int(orc.ORCFile(path).nstripes)
    return int(ipc.open_file(pa.memory_map(path)).num_record_batches)


def describe(kind: str, fmt: str, folder: Path, files: list[Path], rows: int) -> Source:
    names = [str(f) for f in files]
    return Source(kind, fmt, folder, names, rows, sum(count_units(fmt, f) for f in names),
                  sum(f.stat().st_size for f in files))


def converted(parquet: tables.Table, fmt: str) -> Source:
    """The Parquet table rewritten as ``fmt`` (ORC or IPC), reused when written earlier alike."""
    spec = parquet.spec
    folder = tables.DATA_ROOT / f"formats-{spec.kind}-{spec.rows}-f{spec.files}-u{spec.row_group_rows}-s{spec.seed}"
    folder = folder / fmt
    manifest = {**asdict(spec), "format": fmt}
    files = [folder / f"{path.stem}.{fmt}" for path in parquet.files]
    done = folder / MANIFEST
    if not (done.exists() and json.loads(done.read_text()) == manifest and all(f.exists() for f in files)):
        log(f"writing {spec.kind} as {FORMAT_LABELS[fmt]} into {folder}")
        folder.mkdir(parents=True, exist_ok=True)
        for source, target in zip(parquet.files, files):
            table = pq.read_table(source)
            (write_orc if fmt == "orc" else write_ipc)(table, target, spec.row_group_rows)
        done.write_text(json.dumps(manifest))
    return describe(spec.kind, fmt, folder, files, spec.rows)


def sources_of(kind: str, args: argparse.Namespace) -> dict[str, Source]:
    spec = tables.TableSpec(kind, args.rows, args.files, args.unit_rows, args.seed)
    parquet = tables.ensure(spec)
    out = {"parquet": describe(kind, "parquet", parquet.folder, parquet.files, spec.rows)}
    for fmt in ("orc", "arrow"):
        out[fmt] = converted(parquet, fmt)
    return out


# -- loaders -------------------------------------------------------------------------------------


def sliced(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    for start in range(0, batch.num_rows, BATCH):
        yield batch.slice(start, BATCH)


def orc_raw(files: list[str]) -> Iterator[Batch]:
    """The raw ORC loop: every stripe of every file, sliced into batches of 1024 rows."""
    for path in files:
        reader = orc.ORCFile(path)
        for stripe in range(reader.nstripes):
            for batch in sliced(reader.read_stripe(stripe)):
                yield convert(batch)


def ipc_raw(files: list[str]) -> Iterator[Batch]:
    """The raw IPC loop: every record batch of every memory-mapped file, sliced into 1024 rows."""
    for path in files:
        reader = ipc.open_file(pa.memory_map(path))
        for index in range(reader.num_record_batches):
            for batch in sliced(reader.get_batch(index)):
                yield convert(batch)


def raw_loop(source: Source) -> Iterator[Batch]:
    if source.format == "parquet":
        return raw_batches(source.files, BATCH)
    if source.format == "orc":
        return orc_raw(source.files)
    return ipc_raw(source.files)


def arrowstream_loop(source: Source, num_workers: int) -> Iterator[Batch]:
    loader, dataset = StructuredDataset.create_dataloader(
        path=str(source.folder), format=source.format, batch_size=BATCH, num_workers=num_workers,
        output_format="torch", shuffle=False, plan_cache=False)
    dataset.set_epoch(0)
    return iter(loader)


def maker(key: Key, source: Source) -> Callable[[], Iterator[Batch]]:
    if key.loader == "raw":
        return lambda: raw_loop(source)
    if key.loader == "raw, gc off":
        return lambda: gc_off(raw_loop(source))
    workers = int(key.loader.split("=")[1])
    return lambda: arrowstream_loop(source, workers)


# -- the warm-up check ---------------------------------------------------------------------------


def check(key: Key, make: Callable[[], Iterator[Batch]], rows: int, reference: dict[str, float] | None
          ) -> dict[str, float]:
    """Run one untimed epoch; every id exactly once, the same sums as ``reference`` (Parquet, raw)."""
    ids, sums = fingerprint(make())
    if len(ids) != rows or not np.array_equal(np.sort(ids), np.arange(rows)):
        raise RuntimeError(f"{key}: read {len(ids)} rows, not each of the {rows} ids exactly once")
    if reference is not None:
        bad = [name for name in reference if not np.isclose(sums.get(name, np.nan), reference[name], rtol=1e-9)]
        if bad or set(sums) != set(reference):
            raise RuntimeError(f"{key}: columns {bad or sorted(set(sums) ^ set(reference))} differ from the Parquet raw loop")
    return sums


# -- measuring -----------------------------------------------------------------------------------


def measure_table(sources: dict[str, Source], repeats: int) -> dict[Key, list[dict[str, Any]]]:
    """Epoch results per loader of one table: a checked warm-up round, then ``repeats`` rounds."""
    kind = next(iter(sources.values())).kind
    keys = [Key(kind, fmt, loader) for fmt in FORMATS for loader in LOADERS]
    makers = {key: maker(key, sources[key.format]) for key in keys}
    rows = sources["parquet"].rows
    reference: dict[str, float] | None = None   # the Parquet raw loop's sums: every loader must agree
    for key in keys:
        log(f"warm-up and check: {kind} {key.format} {key.loader}")
        sums = check(key, makers[key], rows, reference)
        reference = reference or sums
    samples: dict[Key, list[dict[str, Any]]] = {key: [] for key in keys}
    for round_ in range(repeats):
        log(f"{kind}: round {round_ + 1} of {repeats}")
        shift = round_ * 5 % len(keys)   # rotate by more than a format, so neighbours change too
        for key in keys[shift:] + keys[:shift]:
            result = time_epoch(makers[key])
            if result["rows"] != rows:
                raise RuntimeError(f"{key}: {result['rows']} rows in a timed epoch, the table holds {rows}")
            samples[key].append(result)
    return samples


def median(results: list[dict[str, Any]], field: str) -> float:
    return float(statistics.median(r[field] for r in results))


# -- the report ----------------------------------------------------------------------------------


def markdown_table(header: list[str], rows: list[list[str]], right_from: int = 3) -> list[str]:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    return ["| " + " | ".join(line) + " |" for line in [header, align, *rows]]


def loader_label(key: Key) -> str:
    if key.loader.startswith("raw"):
        return key.loader.replace("raw", "raw pyarrow loop")
    return f"arrowstream num_workers={key.loader.split('=')[1]}"


def result_rows(samples: dict[Key, list[dict[str, Any]]]) -> list[list[str]]:
    out = []
    for key, results in samples.items():
        raw, quiet = samples[Key(key.kind, key.format, "raw")], samples[Key(key.kind, key.format, "raw, gc off")]
        epoch, steady = median(results, "epoch_rps"), median(results, "steady_rps")
        spread = f"{fmt_rps(min(r['epoch_rps'] for r in results))} – {fmt_rps(max(r['epoch_rps'] for r in results))}"
        out.append([key.kind, FORMAT_LABELS[key.format], loader_label(key), fmt_rps(epoch), spread,
                    fmt_ratio(epoch / median(raw, "epoch_rps")), fmt_ratio(epoch / median(quiet, "epoch_rps")),
                    fmt_rps(steady), fmt_ratio(steady / median(raw, "steady_rps")),
                    fmt_ms(median(results, "first_s"))])
    return out


def results_table(samples: dict[Key, list[dict[str, Any]]]) -> list[str]:
    header = ["table", "format", "loader", "rows/s, whole epoch (median)", "min – max", "vs raw",
              "vs raw, gc off", "rows/s, after 1st batch (median)", "vs raw", "first batch ms (median)"]
    return markdown_table(header, result_rows(samples))


def data_lines(all_sources: dict[str, dict[str, Source]]) -> list[str]:
    header = ["table", "format", "files", "units", "MiB", "rows"]
    rows = [[s.kind, FORMAT_LABELS[s.format], str(len(s.files)), str(s.units), f"{s.bytes / 2**20:.0f}",
             f"{s.rows:,}"] for sources in all_sources.values() for s in sources.values()]
    return markdown_table(header, rows, right_from=2)


def report(args: argparse.Namespace, all_sources: dict[str, dict[str, Source]],
           samples: dict[Key, list[dict[str, Any]]], seconds: float, load_before: str) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in main_versions().items())
    lines = [
        f"# ORC and Arrow IPC readers vs the raw pyarrow loop ({dt.date.today().isoformat()})", "",
        f"- Machine: {machine()}",
        f"- Python {sys.version.split()[0]}; {versions}; arrowstream at {arrowstream_commit()}",
        f"- Command: `{shlex.join(['.venv/bin/python', 'benchmarks/bench_formats.py', *sys.argv[1:]])}`",
        f"- Load average before / after: {load_before} / {loadavg()}; run time {seconds / 60:.1f} min",
        (f"- batch_size={BATCH}, shuffle=False; {args.repeats} timed rounds after a checked warm-up round, "
         "loaders interleaved in a rotating order; medians. Files in the page cache."), "",
        "## Data", "", *data_lines(all_sources), "",
        ("Units: Parquet row groups, ORC stripes, IPC record batches. Parquet and ORC are snappy, IPC is "
         "uncompressed and memory-mapped (the raw loop's batches point into the map: no copy)."), "",
        "## Rows/s", "", *results_table(samples), "",
        ("Ratios divide medians by the raw pyarrow loop's of the same format and table: \"vs raw\" by the loop "
         "as the suite defines it (`suite/baselines.py`), \"vs raw, gc off\" by the same loop run with Python's "
         "cyclic garbage collector off (arrowstream turns it off around `to_pylist`; this matters only for the "
         "string and list columns). The whole epoch counts from before the loader is built to the last batch; "
         "\"after 1st batch\" leaves out the first batch and its wait (worker start-up)."),
    ]
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows per table (default 2,000,000)")
    parser.add_argument("--files", type=int, default=4, help="files per table and format (default 4)")
    parser.add_argument("--unit-rows", type=int, default=65_536,
                        help="rows per row group / stripe / record batch (default 65,536)")
    parser.add_argument("--tables", default="numeric,mixed", help="tables to read (default numeric,mixed)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    args.tables = [kind for kind in args.tables.split(",") if kind]
    unknown = set(args.tables) - set(tables.KINDS)
    if unknown:
        parser.error(f"--tables: unknown {sorted(unknown)}; choose from {list(tables.KINDS)}")
    return args


def main() -> int:
    args = parse_args()
    start, load_before = time.perf_counter(), loadavg()
    all_sources = {kind: sources_of(kind, args) for kind in args.tables}
    samples: dict[Key, list[dict[str, Any]]] = {}
    for sources in all_sources.values():
        samples.update(measure_table(sources, args.repeats))
    text = report(args, all_sources, samples, time.perf_counter() - start, load_before)
    emit_report(text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
