"""Ray Data, run by ``benchmarks/.venvs/ray/bin/python``.

``ray.init(num_cpus=<cores>, include_dashboard=False)`` (a local cluster: GCS, raylet and worker
processes), then ``ray.data.read_parquet(files).iter_torch_batches(batch_size=1024)``. A job
starts its cluster once, not once per epoch, so ``ray.init`` runs before the clock starts; its
time is reported in the note. While the first batch is pending, Ray's read tasks decode ahead
in parallel, so its rate after the first batch partly counts work done before it.

Ray turns each batch into tensors itself. A table with a string or a variable-length list column
cannot be made into tensors that way, so for such a table a ``collate_fn`` (an
``ArrowBatchCollateFn``, the form Ray recommends since 2.47) does the suite's conversion
instead: numeric columns to tensors, the others to lists; the result says so. ``--variant default`` forces Ray's own conversion, to
record its error.

Ray Data has no mid-epoch checkpoint of an iterator: ``--mode resume`` reports "not supported".
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parents[2])  # benchmarks/ (for suite.common), not peers/
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no network

import pyarrow as pa
import pyarrow.parquet as pq
import ray
import torch
from ray.data.collate_fn import ArrowBatchCollateFn

from suite.common import adapter_args, run_main, time_epoch


def is_number(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t))


class ArrowCollate(ArrowBatchCollateFn):  # type: ignore[misc]
    """Numeric columns to tensors, the others to Python lists (the raw loop's conversion)."""

    def __call__(self, batch: pa.Table) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field, column in zip(batch.schema, batch.columns):
            out[field.name] = torch.from_numpy(column.to_numpy()) if is_number(field.type) else column.to_pylist()
        return out


def only_numeric(files: list[str]) -> bool:
    return all(is_number(f.type) for f in pq.read_schema(files[0]))


def start_cluster() -> float:
    """``ray.init`` a local cluster; returns the seconds it took."""
    started = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    return time.perf_counter() - started


def batches(files: list[str], batch_size: int, use_collate: bool) -> Any:
    dataset = ray.data.read_parquet(files)
    if use_collate:
        return iter(dataset.iter_torch_batches(batch_size=batch_size, collate_fn=ArrowCollate()))
    return iter(dataset.iter_torch_batches(batch_size=batch_size))


def main() -> dict[str, Any]:
    args = adapter_args(__doc__.split("\n")[0])
    files = [str(Path(f).resolve()) for f in args.files]
    if args.mode == "resume":
        return {"unsupported": "Ray Data iterators have no state_dict/mid-epoch resume", "version": ray.__version__}
    use_collate = args.variant != "default" and not only_numeric(files)
    try:
        init_s = start_cluster()
        result = time_epoch(lambda: batches(files, args.batch_size, use_collate), args.max_rows, args.max_seconds)
    finally:
        started = time.perf_counter()
        ray.shutdown()
        shutdown_s = time.perf_counter() - started
    note = f"ray.init {init_s:.1f} s before the clock (not counted)"
    if use_collate:
        note += "; collate_fn (ArrowBatchCollateFn): numeric columns to tensors, others to lists"
    return {**result, "version": ray.__version__, "note": note, "init_s": init_s, "shutdown_s": shutdown_s,
            "reads_ahead": True}  # read tasks decode in other processes while the first batch is pending


if __name__ == "__main__":
    run_main(main)
