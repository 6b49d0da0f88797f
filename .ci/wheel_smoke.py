"""A smoke run of an installed arrowstream, as a user's own venv would have it (no dev extras).

Run by .ci/wheel_check.py with the clean venv's Python, from a folder outside the repository, so
that `import arrowstream` can only find the installed wheel. Also runnable by hand:
`VENV/bin/python .ci/wheel_smoke.py [WORKDIR]`. Exits non-zero, with the reason, at the first check
that fails.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

ROWS, FILES, BATCH = 20_000, 4, 500


def check(condition: bool, what: str) -> None:
    if not condition:
        sys.exit(f"wheel smoke: FAILED: {what}")
    print(f"wheel smoke: ok: {what}", flush=True)


def installed_package() -> None:
    import arrowstream

    inside = os.path.realpath(arrowstream.__file__).startswith(os.path.realpath(sys.prefix))
    check(inside, f"arrowstream imported from the venv ({arrowstream.__file__})")
    check(importlib.metadata.version("arrowstream") == arrowstream.__version__,
          f"the wheel's version is arrowstream.__version__ ({arrowstream.__version__})")
    for dev_only in ("pytest", "matplotlib", "s3fs", "pyiceberg"):
        check(importlib.util.find_spec(dev_only) is None, f"{dev_only} is not installed (no extras)")


def write_data(folder: str) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder)
    per_file = ROWS // FILES
    for part in range(FILES):
        ids = np.arange(part * per_file, (part + 1) * per_file)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), os.path.join(folder, f"part-{part}.parquet"),
                       row_group_size=1000)


def epochs_of(loader, dataset, start_epoch: int, epochs: int) -> list[list[int]]:
    out = []
    for epoch in range(start_epoch, epochs):
        dataset.set_epoch(epoch)
        out += [batch["id"].tolist() for batch in loader]
    return out


def exact_resume(folder: str) -> None:
    """Two workers, shuffled: a state taken after 7 batches, through JSON, resumes to the same batches."""
    from arrowstream import StructuredDataset

    def make():
        return StructuredDataset.create_dataloader(path=folder, batch_size=BATCH, num_workers=2, shuffle=True,
                                                   seed=0)

    loader, dataset = make()
    reference = epochs_of(loader, dataset, 0, 2)
    first_epoch = [i for ids in reference[:ROWS // BATCH] for i in ids]
    check(sorted(first_epoch) == list(range(ROWS)), f"2 workers: each of the {ROWS:,} rows once in epoch 0")
    check(first_epoch[:BATCH] != list(range(BATCH)), "shuffle=True: the first batch is not the first rows")

    loader, dataset = make()
    dataset.set_epoch(0)
    taken = []
    for batch in loader:
        taken.append(batch["id"].tolist())
        if len(taken) == 7:
            state = json.loads(json.dumps(loader.state_dict()))
            break
    del loader
    loader, dataset = make()
    loader.load_state_dict(state)
    rest = epochs_of(loader, dataset, 0, 2)
    check(taken + rest == reference, "checkpoint after 7 batches, JSON round trip, fresh loader: "
          f"the {len(rest)} batches that follow equal the uninterrupted run's")


def missing_extra_hint() -> None:
    from arrowstream import MissingDependencyError, StructuredDataset

    try:
        StructuredDataset.create_dataloader(path="s3://bucket/data/", batch_size=BATCH)
    except MissingDependencyError as exc:
        message = str(exc)
    else:
        message = ""
    check('"s3fs>=2024.3"' in message and ".[s3]" in message, f"an s3:// path says what to install: {message}")


def command_line(folder: str, work: str) -> None:
    command = os.path.join(os.path.dirname(sys.executable), "arrowstream")
    began = time.perf_counter()
    result = subprocess.run([command, "--help"], capture_output=True, text=True, timeout=120, check=False)
    check(result.returncode == 0 and "inspect" in result.stdout,
          f"arrowstream --help ({time.perf_counter() - began:.2f} s)")
    result = subprocess.run([command, "inspect", folder, "--num-workers", "2", "--json"], capture_output=True,
                            text=True, timeout=300, check=False)
    check(result.returncode == 0 and json.loads(result.stdout)["rows"] == ROWS, "arrowstream inspect")
    result = subprocess.run([command, "bench", folder, "--plot", os.path.join(work, "p.png")], capture_output=True,
                            text=True, timeout=300, check=False)
    check(result.returncode == 2 and "matplotlib" in result.stderr and result.stdout == "",
          f"bench --plot without matplotlib: one line, exit 2, before any benchmark: {result.stderr.strip()}")
    began = time.perf_counter()
    result = subprocess.run([command, "demo", "--rows", "4000", "--batch-size", "256", "--dir",
                             os.path.join(work, "demo")], capture_output=True, text=True, timeout=300, check=False)
    check(result.returncode == 0 and "demo passed" in result.stdout,
          f"arrowstream demo ({time.perf_counter() - began:.1f} s)" + ("" if result.returncode == 0 else
                                                                     result.stdout + result.stderr))


def main() -> None:
    work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="arrowstream-smoke-")
    folder = os.path.join(work, "data")
    installed_package()
    write_data(folder)
    exact_resume(folder)
    missing_extra_hint()
    command_line(folder, work)
    print("wheel smoke: passed")


if __name__ == "__main__":
    main()
