"""The baselines, one loader per process (run by the main venv's python).

``--variant``:

* ``raw``: ``pq.ParquetFile(f).iter_batches(batch_size)`` file after file, one process;
* ``scanner``: ``pyarrow.dataset.dataset(files).to_batches(batch_size, use_threads=True)``,
  pyarrow's threaded scanner (its own thread pool decodes ahead);
* ``torch-dl``: a plain ``torch.utils.data.DataLoader(num_workers=N, batch_size=None)`` over an
  ``IterableDataset`` whose workers each run the raw loop over every N-th file.

All three turn each record batch into the same output: ``torch.from_numpy(col.to_numpy())``
for numeric columns and ``col.to_pylist()`` for the others (the string and list columns).

    python -m suite.baselines --variant raw --files data/part-*.parquet
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .common import adapter_args, run_main, time_epoch

warnings.filterwarnings("ignore", message=".*not writable.*")  # torch.from_numpy on Arrow buffers
VARIANTS = ("raw", "scanner", "torch-dl")


def is_numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


def convert(batch: pa.RecordBatch) -> dict[str, Any]:
    """Numeric columns to tensors (zero-copy), every other column to a Python list."""
    out: dict[str, Any] = {}
    for field, column in zip(batch.schema, batch.columns):
        out[field.name] = torch.from_numpy(column.to_numpy()) if is_numeric(field.type) else column.to_pylist()
    return out


def gc_off(batches: Iterator[Any]) -> Iterator[Any]:
    """``batches`` with Python's cyclic garbage collector off, as arrowstream has it around ``to_pylist``."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield from batches
    finally:
        if enabled:
            gc.enable()


def fingerprint(batches: Iterator[dict[str, Any]]) -> tuple[np.ndarray, dict[str, float]]:
    """All ids of an epoch, and per column a sum (numbers) or a total length (lists, strings): what a
    benchmark's warm-up round compares between loaders."""
    ids, sums = [], {}
    for batch in batches:
        for name, column in batch.items():
            if name == "id":
                ids.append(column.numpy().copy())
            if hasattr(column, "numpy"):
                value = float(column.numpy().astype(np.float64).sum())
            else:
                value = float(sum(len(item) for item in column if item is not None))
            sums[name] = sums.get(name, 0.0) + value
    return np.concatenate(ids), sums


def raw_batches(files: list[str], batch_size: int) -> Iterator[dict[str, Any]]:
    """Loop 1: pyarrow's own batch iterator, file after file, in this process."""
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
            yield convert(batch)


def scanner_batches(files: list[str], batch_size: int) -> Iterator[dict[str, Any]]:
    """Loop 2: the threaded ``pyarrow.dataset`` scanner."""
    dataset = ds.dataset(files, format="parquet")
    for batch in dataset.to_batches(batch_size=batch_size, use_threads=True):
        if batch.num_rows:
            yield convert(batch)


class FileSplitDataset(IterableDataset):  # type: ignore[type-arg]
    """Loop 1 inside each DataLoader worker, over every ``num_workers``-th file."""

    def __init__(self, files: list[str], batch_size: int) -> None:
        super().__init__()
        self.files = files
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        files = self.files if info is None else self.files[info.id::info.num_workers]
        return raw_batches(files, self.batch_size)


def torch_dl_batches(files: list[str], batch_size: int, num_workers: int) -> Iterator[dict[str, Any]]:
    loader = DataLoader(FileSplitDataset(files, batch_size), batch_size=None, num_workers=num_workers)
    return iter(loader)


def main() -> dict[str, Any]:
    args = adapter_args(__doc__.split("\n")[0])
    files = [str(f) for f in args.files]
    if args.variant == "raw":
        make = lambda: raw_batches(files, args.batch_size)
    elif args.variant == "scanner":
        make = lambda: scanner_batches(files, args.batch_size)
    elif args.variant == "torch-dl":
        make = lambda: torch_dl_batches(files, args.batch_size, args.num_workers)
    else:
        raise SystemExit(f"--variant must be one of {VARIANTS}")
    result = time_epoch(make, args.max_rows, args.max_seconds)
    expected = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    if result["complete"] and result["rows"] != expected:
        raise RuntimeError(f"read {result['rows']} rows, the files hold {expected}")
    return result


if __name__ == "__main__":
    run_main(main)
