"""LitData (``litdata``), run by ``benchmarks/.venvs/litdata/bin/python``.

``--mode convert``: ``litdata.optimize(fn, inputs=files, output_dir=work_dir/litdata,
chunk_bytes="64MB", num_workers=2)``, where ``fn(file)`` yields one dict per row: Python
numbers for the numeric columns, the string, and a float32 ``np.ndarray`` for the list column
(LitData needs the same structure in every sample, so a variable-length list must be one
array). Timed on its own.

``--mode epoch``: ``StreamingDataset(input_dir)`` and ``StreamingDataLoader(dataset,
batch_size=1024, num_workers=2, collate_fn=collate)``; the collate makes tensors of the numeric
fields and keeps the string and array fields as lists.

``--mode resume``: iterate to 90% of the epoch, ``loader.state_dict()``, then a fresh dataset and
loader, ``load_state_dict(state)``, time to the first batch.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parents[2])  # benchmarks/ (for suite.common), not peers/

import litdata
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from litdata import StreamingDataLoader, StreamingDataset

from suite.common import adapter_args, run_main, time_epoch, time_resume


def rows_of(path: str) -> Iterator[dict[str, Any]]:
    """One sample per row of a Parquet file (the ``fn`` handed to ``optimize``)."""
    file = pq.ParquetFile(path)
    ragged = [field.name for field in file.schema_arrow if pa.types.is_list(field.type)]
    for batch in file.iter_batches(batch_size=65536):
        data = batch.to_pydict()
        for name in ragged:
            data[name] = [np.asarray(v, dtype=np.float32) for v in data[name]]
        names = list(data)
        for values in zip(*data.values()):
            yield dict(zip(names, values))


def convert(files: list[str], out: Path, num_workers: int) -> dict[str, Any]:
    if out.exists():
        shutil.rmtree(out)
    start = time.perf_counter()
    litdata.optimize(fn=rows_of, inputs=files, output_dir=str(out), chunk_bytes="64MB",
                     num_workers=num_workers, verbose=False)
    seconds = time.perf_counter() - start
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    return {"convert_s": seconds, "rows": rows, "bytes": size}


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Numeric fields become tensors; strings and arrays stay lists."""
    out: dict[str, Any] = {}
    for key, value in samples[0].items():
        values = [s[key] for s in samples]
        if isinstance(value, str) or (isinstance(value, np.ndarray) and value.ndim > 0):
            out[key] = values
        else:
            out[key] = torch.as_tensor(values)
    return out


def build(folder: Path, batch_size: int, num_workers: int) -> Any:
    dataset = StreamingDataset(input_dir=str(folder), shuffle=False)
    return StreamingDataLoader(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate)


def resume(folder: Path, batch_size: int, num_workers: int, at: float) -> dict[str, Any]:
    return time_resume(lambda: build(folder, batch_size, num_workers), at)


def main() -> dict[str, Any]:
    args = adapter_args(__doc__.split("\n")[0])
    files = [str(f) for f in args.files]
    folder = (args.work_dir / "litdata").resolve()
    if args.mode == "convert":
        result = convert(files, folder, args.num_workers)
    elif args.mode == "resume":
        result = resume(folder, args.batch_size, args.num_workers, args.resume_at)
    else:
        result = time_epoch(lambda: iter(build(folder, args.batch_size, args.num_workers)),
                            args.max_rows, args.max_seconds)
    return {**result, "version": litdata.__version__}


if __name__ == "__main__":
    run_main(main)
