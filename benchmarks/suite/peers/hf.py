"""Hugging Face ``datasets`` streaming, run by ``benchmarks/.venvs/hf/bin/python``.

``load_dataset("parquet", data_files=files, streaming=True, split="train")`` gives an
``IterableDataset``. ``--variant``:

* ``iter`` (the fast path, and the one the suite reports): ``.with_format("torch")`` and
  ``.iter(batch_size=1024)``, in this process. It slices Arrow tables into batches and formats
  each batch at once (numeric columns become tensors, the string column a list, the
  list<float32> column a list of one tensor per row).
* ``dl2``: the PyTorch recipe of the docs with batches made by ``datasets``:
  ``torch.utils.data.DataLoader(ds.batch(1024).with_format("torch"), batch_size=None,
  num_workers=2)``. It shares one tensor per list cell between processes, which on this machine
  is far slower than ``iter`` (the suite measures it with a small cap, for reference).

``--mode resume`` (variant ``iter``): iterate to 90% of the epoch, ``ds.state_dict()``, then a
fresh ``load_dataset`` + ``ds.load_state_dict(state)`` + ``.iter(...)`` + ``next()``, timed.
This is ``IterableDataset``'s own resume, without a ``StatefulDataLoader`` (whose batches would go
through the slow ``dl2`` path).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only: never wait on the network
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
sys.path[0] = str(Path(__file__).resolve().parents[2])  # benchmarks/ (for suite.common), not peers/

import datasets
from datasets import load_dataset

from suite.common import adapter_args, batch_rows, first_id, run_main, time_epoch


def open_dataset(files: list[str]) -> Any:
    return load_dataset("parquet", data_files=files, streaming=True, split="train")


def iter_batches(files: list[str], batch_size: int) -> Any:
    return open_dataset(files).with_format("torch").iter(batch_size=batch_size)


def dataloader_batches(files: list[str], batch_size: int, num_workers: int) -> Any:
    from torch.utils.data import DataLoader

    dataset = open_dataset(files).batch(batch_size).with_format("torch")
    return iter(DataLoader(dataset, batch_size=None, num_workers=num_workers))


def resume(files: list[str], batch_size: int, at: float) -> dict[str, Any]:
    total_rows = sum(_file_rows(f) for f in files)
    total = -(-total_rows // batch_size)
    before = max(1, int(total * at))
    dataset = open_dataset(files).with_format("torch")
    iterator = dataset.iter(batch_size=batch_size)
    for _ in range(before):
        next(iterator)
    state = dataset.state_dict()
    expected = first_id(next(iterator))
    del iterator, dataset

    start = time.perf_counter()
    fresh = open_dataset(files).with_format("torch")
    fresh.load_state_dict(state)
    batch = next(fresh.iter(batch_size=batch_size))
    end = time.perf_counter()
    return {"resume_first_s": end - start, "batches_before": before, "batches_total": total,
            "exact": first_id(batch) == expected, "resume_rows": batch_rows(batch)}


def _file_rows(path: str) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def main() -> dict[str, Any]:
    args = adapter_args(__doc__.split("\n")[0])
    files = [str(f) for f in args.files]
    variant = args.variant or "iter"
    if args.mode == "resume":
        result = resume(files, args.batch_size, args.resume_at)
    elif variant == "iter":
        result = time_epoch(lambda: iter_batches(files, args.batch_size), args.max_rows, args.max_seconds)
    elif variant == "dl2":
        result = time_epoch(lambda: dataloader_batches(files, args.batch_size, args.num_workers),
                            args.max_rows, args.max_seconds)
    else:
        raise SystemExit("--variant must be iter or dl2")
    return {**result, "version": datasets.__version__}


if __name__ == "__main__":
    run_main(main)
