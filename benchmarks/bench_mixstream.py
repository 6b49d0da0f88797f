"""A mixture stream's per-batch CPU time (``MixStream.next_span``) against a dataset's ``EpochStream``.

Run from the repository root:

    .venv/bin/python benchmarks/bench_mixstream.py                       # this tree, prints CPU s per case
    .venv/bin/python benchmarks/bench_mixstream.py --ab OLD_ROOT NEW_ROOT  # A/B of two trees, in alternation

One slot (``num_workers=0``, one rank), no loader, no conversion: what the stream itself costs per batch. Data:
8 Parquet files of 200,000 rows (row groups of 10,000; ``tests/helpers.py``'s table), 1.6M rows, written once to a
folder under ``benchmarks/data/`` (git-ignored). The dataset: ``shuffle=True, shuffle_buffer_size=20000,
interleave=2``. The cases, each a whole epoch read by ``next_span(per)`` until it ends:

- ``dataset``: the dataset slot's ``EpochStream``;
- ``N=1``: a ``MixStream`` of one ``SourceRows`` over exactly that slot's splits and window seeds (the same rows in
  the same order, checked), as ``tests/test_one_source.py`` builds it;
- ``N=3 even`` / ``N=3 plain``: a ``MixStream`` of three ``SourceRows``, the slot's splits dealt round-robin
  (about a third of the rows each), quotas their rows, batches mixed evenly (a mixture with a shuffle buffer) or
  the sources one after another (without one).

CPU time (``time.process_time``) of the epoch; best of ``--repeats`` in one process. ``--ab`` runs one process
per tree, alternating ``--rounds`` times, and reports each case's best over all rounds and the ratio new / old.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
DATA = BENCH_DIR / "data" / "mixstream"
B, BUF, IL, SEED = 1024, 20_000, 2, 0
CASES = [(kind, batch, per) for batch in (128, 1024) for per in (1, 16)
         for kind in ("dataset", "N=1", "N=3 even", "N=3 plain")]


def write_data() -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import write_dataset
    if not (DATA / "part-007.parquet").exists():
        write_dataset(DATA, [(200_000, 10_000)] * 8)
    return str(DATA)


def measure(repeats: int, only: list[str] | None) -> dict[str, float]:
    import numpy as np
    import pyarrow as pa

    from arrowstream import StructuredDataset
    from arrowstream._core.order import SlotGrid, window_seed
    from arrowstream._mixing.parts import ListParts, Part
    from arrowstream._mixing.source_rows import SourceRows
    from arrowstream._mixing.stream import MixSlot, MixStream
    from arrowstream._state.mixture import EVEN, MixWorkerState, SourceCursor, SourceEpoch
    from arrowstream._worker.reader import SplitReader

    path = write_data()
    slot = SlotGrid(1, 0).slot_at(0)

    def dataset_of(batch: int) -> StructuredDataset:
        dataset = StructuredDataset(path, batch_size=batch, shuffle=True, seed=SEED, shuffle_buffer_size=BUF,
                                    interleave=IL, rank=0, world_size=1, plan_locally=True, output_format="arrow",
                                    plan_cache=False)
        dataset.set_epoch(0)
        return dataset

    datasets = {batch: dataset_of(batch) for batch in (128, 1024)}

    def make(kind: str, batch: int):  # type: ignore[no-untyped-def]
        dataset = datasets[batch]
        if kind == "dataset":
            return dataset.open_epoch(slot, None).stream
        share = dataset.epochs.layout(0, slot.grid).share(slot)
        splits = tuple(share.splits)
        groups = [splits] if kind == "N=1" else [splits[k::3] for k in range(3)]
        reading = dataset.reading()
        sources, quotas = [], []
        for k, group in enumerate(groups):
            rows = int(sum(split.num_rows for split in group))
            seeds = functools.partial(window_seed, SEED + k, 0, slot)
            readers = [SplitReader(reading.plan, reading.storage, max(batch, 65536), use_threads=True)
                       for _ in range(IL)]
            sources.append(SourceRows(str(k), readers, ListParts([Part(group, rows, seeds)]), batch_size=batch,
                                      interleave=IL, buffer_rows=BUF, start=SourceCursor(0, None, 0), url=path))
            quotas.append(rows)
        names = [source.name for source in sources]
        start = MixWorkerState(epoch=0, rank=0, world_size=1, worker_id=0, num_workers=0, rows=0, batches=0,
                               rows_dropped=0, epoch_complete=False, options={}, history=[],
                               epochs={name: SourceEpoch(0, q) for name, q in zip(names, quotas, strict=True)},
                               cursors={name: SourceCursor(0, None, 0) for name in names}, data={})
        return MixStream(sources, quotas, cast=lambda name, piece: piece, batch_size=batch, drop_last=False,
                         max_batches=None, batch_order=EVEN if kind == "N=3 even" else None, seed=SEED,
                         slot=MixSlot(0, 0, 1, 0, 0), start=start)

    def run(kind: str, batch: int, per: int) -> tuple[float, object]:
        stream = make(kind, batch)
        ids = []
        began = time.process_time()
        while True:
            try:
                span = stream.next_span(per)[0]
            except StopIteration:
                break
            ids.append(span.column("id"))
        spent = time.process_time() - began
        return spent, pa.chunked_array(ids).to_numpy()

    expected = {batch: run("dataset", batch, 16)[1] for batch in datasets}
    best: dict[str, float] = {}
    for repeat in range(repeats):
        for kind, batch, per in CASES:
            key = f"{kind} B={batch} per={per}"
            if only and not any(word in key for word in only):
                continue
            spent, ids = run(kind, batch, per)
            if repeat == 0:
                if kind in ("dataset", "N=1"):   # the same rows in the same order
                    assert np.array_equal(ids, expected[batch]), key
                assert np.array_equal(np.sort(ids), np.arange(len(ids))), key
            best[key] = min(best.get(key, spent), spent)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="epochs per case in one process (default 3)")
    parser.add_argument("--ab", nargs=2, metavar=("OLD", "NEW"), help="two trees (repository roots) to compare")
    parser.add_argument("--rounds", type=int, default=3, help="--ab: processes per tree, alternating (default 3)")
    parser.add_argument("--only", nargs="*", help="only the cases whose name holds one of these words")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.ab:
        best = measure(args.repeats, args.only)
        if args.json:
            print(json.dumps(best))
        else:
            for key, spent in best.items():
                print(f"{key:28s} {spent:.3f} s")
        return
    write_data()
    results: dict[str, dict[str, float]] = {"old": {}, "new": {}}
    for _ in range(args.rounds):
        for label, root in zip(("old", "new"), args.ab, strict=True):
            out = subprocess.run([sys.executable, __file__, "--json", "--repeats", str(args.repeats),
                                  *(["--only", *args.only] if args.only else [])],
                                 env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"}, cwd=root, check=True,
                                 capture_output=True, text=True).stdout
            for key, spent in json.loads(out.splitlines()[-1]).items():
                results[label][key] = min(results[label].get(key, spent), spent)
    print("| case | old CPU s | new CPU s | new / old | old / dataset | new / dataset |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for key, old in results["old"].items():
        new = results["new"][key]
        base = key.split(" B=")[1]
        old_base, new_base = results["old"][f"dataset B={base}"], results["new"][f"dataset B={base}"]
        print(f"| {key} | {old:.3f} | {new:.3f} | {new / old:.3f} | {old / old_base:.3f} | {new / new_base:.3f} |")


if __name__ == "__main__":
    main()
