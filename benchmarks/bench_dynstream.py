"""A dynamic worker's stream, CPU per batch: the one stream (``leased_stream``) against the ``EpochStream`` over
``leased_runs`` it replaced (frozen in ``tests/reference_stream.py``), in one process, alternating.

Run from the repository root:

    PYTHONPATH=. .venv/bin/python benchmarks/bench_dynstream.py [--rounds 5] [--rows 800000]

One worker (``num_workers=1``: no stitching) or four taking turns (stitched last rows) reads a rank's whole epoch
of leases; no loader, no conversion. Data: Parquet files under a temporary folder, row groups of 20,000 rows, columns
``id`` and ``x``. Prints the CPU seconds of an epoch per case, best of the rounds, and new / old.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from reference_stream import EpochStream, leased_runs

from arrowstream import StructuredDataset
from arrowstream._assignment.dynamic_epoch import start_state
from arrowstream._core.order import SlotGrid
from arrowstream._layout.leased_parts import END, leased_stream
from arrowstream._layout.leases import Leases, LocalPool, last_pieces
from arrowstream._layout.ledger import LeasedShare, fresh_work
from arrowstream._worker.reader import SplitReader


def streams(dataset, kind: str, num_workers: int):
    reading = dataset.reading()
    options = reading.options
    work = fresh_work(reading.plan, 1, 0, 0, options, even_batches=False)
    leases = Leases(work, options.batch_size, num_workers)
    pool = LocalPool(len(leases))
    out = []
    for worker in range(num_workers):
        slot = SlotGrid(1, num_workers).slot(0, worker)
        start = start_state(dataset.identity, dataset.state_options, 0, slot, options.interleave)
        readers = [SplitReader(reading.plan, reading.storage, 65536, use_threads=False)
                   for _ in range(options.interleave)]
        share = LeasedShare(leases, lambda worker=worker: pool.take(worker))
        last = None
        if num_workers > 1:
            def last(worker=worker):
                return last_pieces(np.diff(leases.bounds), pool.owners(), worker, num_workers, options.batch_size)
        if kind == "old":
            runs = leased_runs(readers, share, seed=options.seed, epoch=0, slot=slot, batch_size=options.batch_size,
                               interleave=options.interleave, buffer_rows=options.shuffle_buffer_size)
            out.append(EpochStream(runs=runs, end=END, batch_size=options.batch_size, drop_last=False, max_batches=None,
                                   convert=lambda b: b, data=dataset.identity, options=dataset.state_options, epoch=0,
                                   slot=slot, start=start, last_pieces=last))
        else:
            out.append(leased_stream(readers, share, start, seed=options.seed, batch_size=options.batch_size,
                                     interleave=options.interleave, buffer_rows=options.shuffle_buffer_size,
                                     last_pieces=last))
    return out


def epoch_cpu(dataset, kind: str, num_workers: int) -> tuple[float, int]:
    """CPU seconds to read the epoch (workers in turn, as a worker does: a record, the position and state after it)."""
    live = streams(dataset, kind, num_workers)
    batches = 0
    began = time.process_time()
    while live:
        for stream in list(live):
            try:
                stream.next_record()
            except StopIteration:
                if stream.next_piece() is None:
                    live.remove(stream)
                    continue
            stream.position()
            stream.state()
            batches += 1
    return time.process_time() - began, batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=800_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        per_file = args.rows // 8
        for index in range(8):
            ids = np.arange(index * per_file, (index + 1) * per_file)
            pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), f"{folder}/part-{index}.parquet",
                           row_group_size=20_000)
        cases = [(batch_size, buffer, workers) for batch_size in (128, 1024) for buffer in (0, 20_000)
                 for workers in (1, 4)]
        best: dict[tuple[str, tuple[int, int, int]], float] = {}
        counts: dict[tuple[int, int, int], int] = {}
        for _ in range(args.rounds):
            for case in cases:
                batch_size, buffer, workers = case
                dataset = StructuredDataset(folder, batch_size=batch_size, shuffle=True, seed=0,
                                            shuffle_buffer_size=buffer, interleave=2, plan_cache=False,
                                            assignment="dynamic", output_format="arrow")
                for kind in ("old", "new") if _ % 2 == 0 else ("new", "old"):   # alternating
                    cpu, batches = epoch_cpu(dataset, kind, workers)
                    best[kind, case] = min(best.get((kind, case), cpu), cpu)
                    counts[case] = batches
        print("| batch_size | buffer | workers | batches | old CPU s | new CPU s | new / old | old us/batch | new us/batch |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for case in cases:
            old, new, batches = best["old", case], best["new", case], counts[case]
            print(f"| {case[0]} | {case[1]} | {case[2]} | {batches} | {old:.3f} | {new:.3f} | {new / old:.3f} | "
                  f"{old / batches * 1e6:.1f} | {new / batches * 1e6:.1f} |")


if __name__ == "__main__":
    main()
