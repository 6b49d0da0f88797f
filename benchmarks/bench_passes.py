"""A mixture's cost against the passes an epoch takes (issue #36, item 8).

Two measurements, each in a fresh process per round (best of ``--repeats``):

* **start**: sources of 37, 300 and 1,000 rows, ``shuffle=True``, ``epoch_rows`` from 10**6 to 10**12:
  the time to build the loader, ``len(loader)``, the first batch, and an elastic resume (a checkpoint after
  3 batches on one process, loaded on rank 0 of 2: load and first batch). None of them may grow with the
  passes an epoch takes (the goal: well under a second at every size).
* **steady**: 100,000 rows of a mixture of a tiny source (1 or 37 rows) with a 100,000-row source, weights
  0.5/0.5 (so the tiny source is read in 50,000 or ~1,350 passes), against the same mixture with a 1,000-row
  source in its place, and against the raw pyarrow loop over the 100,000-row source's file in the same run
  (``iter_batches``, no shuffle): rows/s and the ratios. The goal: a tiny source no slower per row than a
  large one beyond a small constant.

``python benchmarks/bench_passes.py`` prints a markdown report and writes it to
``benchmarks/results/<date>-passes.md`` (``--out`` to change; ``--quick`` prints only).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _write(root: Path, name: str, rows: int, base: int) -> str:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / f"{name}-{rows}"
    if not folder.exists():
        folder.mkdir(parents=True)
        ids = np.arange(base, base + rows, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids.astype(np.float32)}), folder / "part.parquet",
                       row_group_size=min(rows, 65_536))
    return str(folder)


def child_start(root: Path, epoch_rows: int) -> dict[str, float]:
    from arrowstream import Mixture, Source

    sources = {n: Source(_write(root, n, rows, base)) for n, rows, base in (("x", 37, 0), ("y", 300, 10**6),
                                                                            ("z", 1000, 2 * 10**6))}
    t0 = time.perf_counter()
    loader, _ = Mixture.create_dataloader(sources=sources, epoch_rows=epoch_rows, batch_size=1024, shuffle=True,
                                          plan_cache=False)
    t1 = time.perf_counter()
    len(loader)
    t2 = time.perf_counter()
    batches = iter(loader)
    next(batches)
    t3 = time.perf_counter()
    next(batches), next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    del batches
    other, mixture = Mixture.create_dataloader(sources=sources, epoch_rows=epoch_rows, batch_size=1024, shuffle=True,
                                               plan_cache=False, rank=0, world_size=2, plan_locally=True)
    t4 = time.perf_counter()
    other.load_state_dict(state)
    t5 = time.perf_counter()
    mixture.set_epoch(0)
    next(iter(other))
    t6 = time.perf_counter()
    return {"build": t1 - t0, "len": t2 - t1, "first": t3 - t2, "load": t5 - t4, "first_after_load": t6 - t5}


def child_steady(root: Path, tiny: int) -> dict[str, float]:
    import pyarrow.parquet as pq

    from arrowstream import Mixture, Source

    big = _write(root, "big", 100_000, 0)
    if tiny == 0:   # the raw pyarrow loop over the big source's file
        t0 = time.perf_counter()
        rows = sum(b.num_rows for b in pq.ParquetFile(os.path.join(big, "part.parquet")).iter_batches(batch_size=1024))
        return {"seconds": time.perf_counter() - t0, "rows": rows}
    sources = {"tiny": Source(_write(root, "tiny", tiny, 10**7)), "big": Source(big)}
    loader, _ = Mixture.create_dataloader(sources=sources, weights={"tiny": 0.5, "big": 0.5}, epoch_rows=100_000,
                                          batch_size=1024, shuffle=True, plan_cache=False)
    t0 = time.perf_counter()
    rows = sum(len(batch["id"]) for batch in loader)
    return {"seconds": time.perf_counter() - t0, "rows": rows}


def _run(args: argparse.Namespace, kind: str, value: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(value), "--root", str(args.root)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, fewer sizes; prints only")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of each measurement (default 3)")
    parser.add_argument("--out", type=Path, default=None, help="report path (default results/<date>-passes.md)")
    parser.add_argument("--root", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, value = args.child[0], int(args.child[1])
        result = child_start(args.root, value) if kind == "start" else child_steady(args.root, value)
        print(json.dumps(result))
        return 0
    repeats = 1 if args.quick else args.repeats
    with tempfile.TemporaryDirectory(prefix="bench-passes-") as tmp:
        args.root = Path(tmp)
        lines = [(f"# bench_passes: {datetime.date.today()} on {platform.node()} ({os.cpu_count()} cores, "
                  f"{platform.python_version()}), best of {repeats}"), "",
                 "## start (sources of 37 / 300 / 1,000 rows, shuffle=True, batch 1024)", "",
                 "| epoch_rows | build s | len() s | first batch s | elastic load s | first batch after s |",
                 "| ---: | ---: | ---: | ---: | ---: | ---: |"]
        sizes = [10**6, 10**9] if args.quick else [10**6, 10**8, 10**10, 10**12]
        for size in sizes:
            best: dict[str, float] = {}
            for _ in range(repeats):
                for key, value in _run(args, "start", size).items():
                    best[key] = min(best.get(key, value), value)
            lines.append(f"| {size:.0e} | {best['build']:.3f} | {best['len']:.4f} | {best['first']:.3f} | "
                         f"{best['load']:.3f} | {best['first_after_load']:.3f} |")
            print(lines[-1], file=sys.stderr)
        lines += ["", "## steady (100,000 rows; weights 0.5 / 0.5 with a 100,000-row source; batch 1024)", "",
                  "| mixture | passes of the small source | seconds | rows/s | vs 1,000-row source | vs raw pyarrow |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        steady = {}
        for tiny in (0, 1000, 37, 1):
            steady[tiny] = min(_run(args, "steady", tiny)["seconds"] for _ in range(repeats))
        for tiny, label in ((1000, "1,000-row source"), (37, "37-row source"), (1, "1-row source")):
            seconds = steady[tiny]
            lines.append(f"| {label} | {50_000 // tiny:,} | {seconds:.3f} | {100_000 / seconds:,.0f} | "
                         f"{seconds / steady[1000]:.2f}x | {seconds / steady[0]:.2f}x |")
        lines.append(f"| raw pyarrow loop (100,000-row file alone) | - | {steady[0]:.3f} | {100_000 / steady[0]:,.0f} "
                     "| - | 1.00x |")
    report = "\n".join(lines) + "\n"
    print(report)
    if not args.quick:
        out = args.out or HERE / "results" / f"{datetime.date.today()}-passes.md"
        out.write_text(report)
        print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
