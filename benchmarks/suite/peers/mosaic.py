"""MosaicML Streaming (``mosaicml-streaming``), run by ``benchmarks/.venvs/mosaic/bin/python``.

``--mode convert``: the Parquet files become an MDS dataset in ``--work-dir`` through
``MDSWriter`` (no compression), one ``write()`` per row: numeric columns as ``float32``/``int64``/
``int8``, the string as ``str``, the list<float32> column as ``bytes`` (the float32 values; the
``ndarray`` encodings refuse the empty lists the column holds, and ``pkl`` needs
``allow_unsafe_types``). The collate turns those bytes back into float32 arrays. The conversion is timed on its own.

``--mode epoch``: ``StreamingDataset(local=work_dir, batch_size=1024, shuffle=False)`` and
``StreamingDataLoader(dataset, batch_size=1024, num_workers=2, collate_fn=collate)``; the
collate stacks numeric fields into tensors and keeps the string and list fields as lists.

``--mode resume``: iterate to 90% of the epoch, ``loader.state_dict()``, then a fresh dataset and
loader, ``load_state_dict(state)``, time to the first batch.

``import streaming`` imports ``torchvision`` (for its vision datasets), and the torchvision
wheel that pip finds is a CUDA build that cannot load next to the CPU torch
(``operator torchvision::nms does not exist``: its ``_C`` needs ``libc10_cuda.so``). The MDS
path measured here never uses torchvision, so when it fails to import, a stub stands in for
it and the result carries a note saying so.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path[0] = str(Path(__file__).resolve().parents[2])  # benchmarks/ (for suite.common), not peers/

import importlib.machinery
import types


def stub_torchvision() -> str | None:
    """Import torchvision, or stand a stub in for it; returns the import error, if any."""
    try:
        import torchvision  # noqa: F401
        return None
    except Exception as exc:  # noqa: BLE001 - a broken binary wheel raises RuntimeError/OSError
        error = f"{type(exc).__name__}: {exc}"
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    stubs = {name: types.ModuleType(name) for name in
             ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional")}
    stubs["torchvision.datasets"].VisionDataset = type("VisionDataset", (), {})  # type: ignore[attr-defined]
    stubs["torchvision.datasets"].CIFAR10 = type("CIFAR10", (), {})  # type: ignore[attr-defined]
    stubs["torchvision.transforms.functional"].to_tensor = None  # type: ignore[attr-defined]
    for name, module in stubs.items():
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # transformers calls find_spec
    sys.modules.update(stubs)
    return error


TORCHVISION_ERROR = stub_torchvision()

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import streaming
import torch
from streaming import MDSWriter, StreamingDataLoader, StreamingDataset
from streaming.base.util import clean_stale_shared_memory

from suite.common import adapter_args, run_main, time_epoch, time_resume


def mds_encoding(t: pa.DataType) -> str:
    if pa.types.is_floating(t) or pa.types.is_integer(t):
        return str(t.to_pandas_dtype().__name__)  # float32, int64, int8
    if pa.types.is_string(t):
        return "str"
    if pa.types.is_list(t):
        return "bytes"  # ndarray encodings raise "Attempting to encode a numpy array with 0 elements"
    raise TypeError(f"no MDS encoding chosen for {t}")


def convert(files: list[str], out: Path) -> dict[str, Any]:
    if out.exists():
        shutil.rmtree(out)
    schema = pq.read_schema(files[0])
    columns = {field.name: mds_encoding(field.type) for field in schema}
    ragged = [field.name for field in schema if pa.types.is_list(field.type)]
    start = time.perf_counter()
    rows = 0
    with MDSWriter(out=str(out), columns=columns, compression=None, size_limit=1 << 26) as writer:
        for path in files:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=65536):
                data = batch.to_pydict()
                for name in ragged:
                    data[name] = [np.asarray(v, dtype=np.float32).tobytes() for v in data[name]]
                names = list(data)
                for values in zip(*data.values()):
                    writer.write(dict(zip(names, values)))
                rows += batch.num_rows
    seconds = time.perf_counter() - start
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"convert_s": seconds, "rows": rows, "bytes": size}


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Numeric fields stacked into tensors; strings stay a list, list fields a list of arrays."""
    out: dict[str, Any] = {}
    for key, value in samples[0].items():
        values = [s[key] for s in samples]
        if isinstance(value, str):
            out[key] = values
        elif isinstance(value, bytes):
            out[key] = [np.frombuffer(v, dtype=np.float32) for v in values]
        else:
            out[key] = torch.from_numpy(np.asarray(values))
    return out


def build(local: Path, batch_size: int, num_workers: int) -> tuple[Any, Any]:
    dataset = StreamingDataset(local=str(local), batch_size=batch_size, shuffle=False)
    loader = StreamingDataLoader(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate)
    return loader, dataset


def resume(local: Path, batch_size: int, num_workers: int, at: float) -> dict[str, Any]:
    return time_resume(lambda: build(local, batch_size, num_workers)[0], at, stop=lambda it: it.close(),
                       before_fresh=clean_stale_shared_memory)


def main() -> dict[str, Any]:
    args = adapter_args(__doc__.split("\n")[0])
    files = [str(f) for f in args.files]
    local = args.work_dir / "mds"
    clean_stale_shared_memory()
    if args.mode == "convert":
        result = convert(files, local)
    elif args.mode == "resume":
        result = resume(local, args.batch_size, args.num_workers, args.resume_at)
    else:
        result = time_epoch(lambda: iter(build(local, args.batch_size, args.num_workers)[0]),
                            args.max_rows, args.max_seconds)
    note = (f"torchvision stubbed (the installed wheel does not import with the CPU torch: {TORCHVISION_ERROR})"
            if TORCHVISION_ERROR else None)
    return {**result, "version": streaming.__version__, "note": note}


if __name__ == "__main__":
    run_main(main)
