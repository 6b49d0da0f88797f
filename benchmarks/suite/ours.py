"""arrowstream, one measurement per process (run by the main venv's python).

``--mode epoch``: ``StructuredDataset.create_dataloader(path=files, batch_size, num_workers,
shuffle=False, output_format="torch")``, ``set_epoch(0)``, one epoch. The clock starts before
``create_dataloader``, so the first batch includes planning (footers) and worker start-up.

``--mode resume``: iterate the epoch up to ``--resume-at`` (0.9) of its batches, take
``loader.state_dict()``, note the id of the batch that follows, stop that loader; then time a
fresh ``create_dataloader`` + ``load_state_dict(state)`` + ``iter()`` + ``next()``, and check
that the batch it yields is the one that followed the checkpoint.

    python -m suite.ours --mode epoch --num-workers 2 --files data/part-*.parquet
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import arrowstream
from arrowstream import StructuredDataset

from .common import adapter_args, run_main, time_epoch, time_resume


def source_hash() -> str:
    """A short hash of the arrowstream sources this process imported (the package may change
    between runs while the suite runs; the report flags that)."""
    digest = hashlib.sha1()
    package = Path(arrowstream.__file__).parent
    for path in sorted(package.glob("**/*.py")):  # the modules live in folders by layer (#38)
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:10]


def build(files: list[str], batch_size: int, num_workers: int) -> tuple[Any, StructuredDataset]:
    loader, dataset = StructuredDataset.create_dataloader(path=files, batch_size=batch_size, num_workers=num_workers,
                                                          shuffle=False, output_format="torch",
                                                          plan_cache=False)  # planning cold, as the peers' is
    return loader, dataset


def shutdown(iterator: Any) -> None:
    stop = getattr(iterator, "_shutdown_workers", None)
    if stop is not None:
        stop()


def epoch(files: list[str], batch_size: int, num_workers: int, max_rows: int | None,
          max_seconds: float | None) -> dict[str, Any]:
    holder: dict[str, Any] = {}

    def make() -> Any:
        loader, dataset = build(files, batch_size, num_workers)
        dataset.set_epoch(0)
        holder["dataset"] = dataset
        return iter(loader)

    result = time_epoch(make, max_rows, max_seconds)
    expected = holder["dataset"].num_rows
    if result["complete"] and result["rows"] != expected:
        raise RuntimeError(f"arrowstream yielded {result['rows']} rows, the dataset holds {expected}")
    return result


def resume(files: list[str], batch_size: int, num_workers: int, at: float) -> dict[str, Any]:
    def make() -> Any:
        loader, dataset = build(files, batch_size, num_workers)
        dataset.set_epoch(0)
        return loader

    return time_resume(make, at, stop=shutdown)


def main() -> dict[str, Any]:
    args = adapter_args(__doc__.split("\n")[0])
    files = [str(f) for f in args.files]
    if args.mode == "resume":
        result = resume(files, args.batch_size, args.num_workers, args.resume_at)
    else:
        result = epoch(files, args.batch_size, args.num_workers, args.max_rows, args.max_seconds)
    return {**result, "version": arrowstream.__version__, "source": source_hash()}


if __name__ == "__main__":
    run_main(main)
