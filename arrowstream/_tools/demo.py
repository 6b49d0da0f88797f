"""``arrowstream demo``: train, crash mid-epoch, resume in a fresh process, prove exactly-once.

1. write a Parquet dataset (a linear regression problem) to a local folder; with ``--iceberg``,
   append it to an Iceberg table instead (pyiceberg's SQL catalog on SQLite, local warehouse);
2. train a tiny model through the loader (2 workers; split shuffle, two splits read at a time
   and a record-level shuffle buffer of four row groups) in a child process, save a
   checkpoint with ``torch.save`` after part of epoch 0, and stop there;
3. resume from the checkpoint in a second, fresh child process and train to the end;
4. check that each epoch saw every row exactly once, and that the resumed run's batches are
   exactly those an uninterrupted run yields after the checkpoint.

With ``--iceberg`` the table moves on while the job is down (more rows are appended): the resumed
run continues on the snapshot its checkpoint pinned, so the epoch still holds each row once.

With ``--mixture`` the files are three sources of a weighted mixture (web: 5 files, code: 2, wiki: 1,
weighted 0.5/0.3/0.2): each epoch must take each source's quota exactly, each source's passes must run
on across epochs with no row twice before all its rows once, and the resume must be exact.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .bench import progress_bar

NUM_FEATURES = 8
NUM_FILES = 8
ROW_GROUP_ROWS = 5_000
SHUFFLE: dict[str, Any] = {"shuffle": True, "seed": 0, "shuffle_buffer_size": 4 * ROW_GROUP_ROWS, "interleave": 2}


def _tables(rows: int, seed: int, flat: bool) -> list[pa.Table]:
    """The regression rows, one table per file; ``flat``: features as columns f0..f7 (Iceberg has no
    fixed-size lists)."""
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal(NUM_FEATURES).astype(np.float32)
    tables, start = [], 0
    for index in range(NUM_FILES):
        count = rows // NUM_FILES + (1 if index < rows % NUM_FILES else 0)
        features = rng.standard_normal((count, NUM_FEATURES)).astype(np.float32)
        target = features @ weights + 0.1 * rng.standard_normal(count).astype(np.float32)
        columns: dict[str, Any] = {"id": np.arange(start, start + count, dtype=np.int64)}
        if flat:
            columns.update({f"f{i}": features[:, i] for i in range(NUM_FEATURES)})
        else:
            columns["features"] = pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), NUM_FEATURES)
        columns["target"] = target.astype(np.float32)
        tables.append(pa.table(columns))
        start += count
    return tables


def write_dataset(folder: str, rows: int, seed: int = 0) -> None:
    os.makedirs(folder, exist_ok=True)
    for index, table in enumerate(_tables(rows, seed, flat=False)):
        pq.write_table(table, os.path.join(folder, f"part-{index:02d}.parquet"), row_group_size=ROW_GROUP_ROWS)


MIXTURE = {"web": (range(5), 0.5), "code": (range(5, 7), 0.3), "wiki": (range(7, 8), 0.2)}


def write_mixture(folder: str, rows: int, seed: int = 0) -> None:
    """The demo's files as three sources: a folder each (see ``MIXTURE``)."""
    tables = _tables(rows, seed, flat=False)
    for name, (files, _) in MIXTURE.items():
        os.makedirs(os.path.join(folder, name), exist_ok=True)
        for index in files:
            pq.write_table(tables[index], os.path.join(folder, name, f"part-{index:02d}.parquet"),
                           row_group_size=ROW_GROUP_ROWS)


def _source_rows(rows: int) -> dict[str, tuple[int, int]]:
    """Each source's ids: ``[first, first + count)``."""
    counts = [rows // NUM_FILES + (1 if index < rows % NUM_FILES else 0) for index in range(NUM_FILES)]
    return {name: (sum(counts[:files.start]), sum(counts[index] for index in files))
            for name, (files, _) in MIXTURE.items()}


def _check_mixture(rows: int, batches: list[list[Any]], quotas: dict[str, int], epochs: int) -> bool:
    """Each epoch took every quota exactly; over the epochs no row of a source came twice before all once."""
    owners = _source_rows(rows)
    owner = {name: range(first, first + count) for name, (first, count) in owners.items()}
    ok = True
    for epoch in range(epochs):
        taken = Counter(next(n for n, r in owner.items() if i in r) for e, ids in batches if e == epoch for i in ids)
        exact = taken == Counter(quotas)
        ok &= exact
        print(f"  epoch {epoch}: {dict(taken)} {'= the quotas' if exact else 'DIFFER FROM THE QUOTAS ' + str(quotas)}")
    for name, (first, count) in owners.items():
        counts = Counter(i for _, ids in batches for i in ids if first <= i < first + count)
        total = sum(counts.values())
        passes, extra = divmod(total, count)
        per_row = Counter(counts.get(i, 0) for i in range(first, first + count))
        whole = per_row == Counter({passes + 1: extra, passes: count - extra}) - Counter()
        ok &= whole
        print(f"  {name}: {total:,} rows over {epochs} epochs = {total / count:.2f} passes of its {count:,}; "
              f"{'no row twice before all once' if whole else 'A ROW CAME TWICE BEFORE ALL CAME ONCE'}")
    return ok


def _catalog(root: str) -> tuple[Any, dict[str, str]]:
    from pyiceberg.catalog import load_catalog

    from .._sources.iceberg_table import default_catalog_config, import_pyiceberg

    import_pyiceberg()
    config = default_catalog_config(root)
    return load_catalog("default", **config), config


def write_table(root: str, rows: int, seed: int = 0) -> None:
    """Append the rows to ``demo.regression``, one append (snapshot, data file) per file of the Parquet demo."""
    catalog, _ = _catalog(root)
    catalog.create_namespace_if_not_exists("demo")
    tables = _tables(rows, seed, flat=True)
    table = catalog.create_table("demo.regression", schema=tables[0].schema,
                                 properties={"write.parquet.row-group-limit": str(ROW_GROUP_ROWS)})
    for part in tables:
        table.append(part)


def append_more(root: str, rows: int, extra: int) -> tuple[int, int]:
    """Append ``extra`` rows (ids from ``rows`` on); returns the snapshot ids before and after."""
    catalog, _ = _catalog(root)
    table = catalog.load_table("demo.regression")
    before = table.current_snapshot().snapshot_id
    more = pa.concat_tables(_tables(extra, seed=1, flat=True))
    more = more.set_column(0, "id", pa.array(np.arange(rows, rows + more.num_rows, dtype=np.int64)))
    table.append(more)
    return before, table.refresh().current_snapshot().snapshot_id


def _loader(args: argparse.Namespace, data: str, snapshot_id: int | None = None) -> Any:
    from .. import IcebergDataset, StructuredDataset

    common = {"batch_size": args.batch_size, "num_workers": args.workers,
              "persistent_workers": args.workers > 0, **SHUFFLE}
    if getattr(args, "mixture", False):
        from .. import Mixture, Source

        return Mixture.create_dataloader(sources={name: Source(os.path.join(data, name)) for name in MIXTURE},
                                         weights={name: weight for name, (_, weight) in MIXTURE.items()},
                                         epoch_rows=args.rows, **common)
    if args.iceberg:
        _, config = _catalog(data)
        return IcebergDataset.create_dataloader(table="demo.regression", catalog_config=config,
                                                snapshot_id=snapshot_id, **common)
    return StructuredDataset.create_dataloader(path=data, **common)


def _features(batch: dict[str, Any]) -> Any:
    import torch

    if "features" in batch:
        return batch["features"]
    return torch.stack([batch[f"f{i}"] for i in range(NUM_FEATURES)], dim=1)


def run_phase(args: argparse.Namespace) -> int:
    """One training process: ``train`` stops after ``--stop-at`` of epoch 0, ``resume`` finishes."""
    import torch

    torch.manual_seed(0)
    data, checkpoint = os.path.join(args.dir, "data"), os.path.join(args.dir, "checkpoint.pt")
    loader, dataset = _loader(args, data)
    model = torch.nn.Linear(NUM_FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start_epoch, seen, stop_after = 0, [], None
    if args.phase == "resume":
        saved = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        start_epoch = saved["epoch"]
    else:
        stop_after = max(1, int(args.stop_at * len(loader)))
    began, rows = time.perf_counter(), 0
    for epoch in range(start_epoch, args.epochs):
        dataset.set_epoch(epoch)
        bar = progress_bar(len(loader), f"  [{args.phase}] epoch {epoch}")
        loss: torch.Tensor | None = None   # None: the checkpoint was taken after the epoch's last batch
        for step, batch in enumerate(loader):
            bar.update()
            prediction = model(_features(batch)).squeeze(1)
            loss = torch.nn.functional.mse_loss(prediction, batch["target"])
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            seen.append([epoch, batch["id"].tolist()])
            rows += len(batch["id"])
            if step % 50 == 0:
                bar.set_postfix_str(f"loss {loss.item():.4f}")
            if stop_after is not None and step + 1 == stop_after:
                bar.close()
                torch.save({"loader": loader.state_dict(), "model": model.state_dict(),
                            "optimizer": optimizer.state_dict(), "epoch": epoch,
                            "snapshot_id": getattr(dataset, "snapshot_id", None)}, checkpoint)
                print(f"  [{args.phase}] checkpoint saved after {step + 1} batches of epoch {epoch}; "
                      "stopping as if the job crashed", flush=True)
                return _report(args, seen, rows, began, loader.metrics())
        bar.close()
        last = f"last loss {loss.item():.4f}" if loss is not None else "no batch was left after the checkpoint"
        print(f"  [{args.phase}] epoch {epoch} done, {last}", flush=True)
    return _report(args, seen, rows, began, loader.metrics())


def _report(args: argparse.Namespace, seen: list[Any], rows: int, began: float, metrics: dict[str, Any]) -> int:
    elapsed = time.perf_counter() - began
    for w in metrics["workers"]:
        print(f"  [{args.phase}] worker {w['worker']}: {w['rows']:,} rows, {w['splits_done']} splits, "
              f"busy {w['utilization']:.0%} of its time (read {w['read_s']:.2f} s, convert {w['convert_s']:.2f} s, "
              f"waiting for the trainer {w['idle_s']:.2f} s)", flush=True)
    with open(os.path.join(args.dir, f"{args.phase}.json"), "w") as f:
        json.dump({"batches": seen, "rows": rows, "seconds": elapsed}, f)
    return 0


def _reference(args: argparse.Namespace, data: str, snapshot_id: int | None) -> list[list[Any]]:
    loader, dataset = _loader(args, data, snapshot_id)
    out = []
    for epoch in range(args.epochs):
        dataset.set_epoch(epoch)
        out += [[epoch, batch["id"].tolist()] for batch in loader]
    return out


def run_demo(args: argparse.Namespace) -> int:
    """The whole story; exit status 0 only if every check holds."""
    owned = args.dir is None
    args.dir = args.dir or tempfile.mkdtemp(prefix="arrowstream-demo-")
    data = os.path.join(args.dir, "data")
    mixture = getattr(args, "mixture", False)
    if mixture:
        print(f"arrowstream demo: {args.rows:,} rows in {NUM_FILES} Parquet files under {data}, three sources of a "
              "mixture: " + ", ".join(f"{name} ({len(files)} file(s), weight {weight})"
                                       for name, (files, weight) in MIXTURE.items()))
        write_mixture(data, args.rows)
    elif args.iceberg:
        print(f"arrowstream demo: {args.rows:,} rows in {NUM_FILES} appends to the Iceberg table demo.regression "
              f"(SQLite catalog and warehouse under {data})")
        write_table(data, args.rows)
    else:
        print(f"arrowstream demo: {args.rows:,} rows in {NUM_FILES} Parquet files under {data}")
        write_dataset(data, args.rows)
    common = ["--dir", args.dir, "--rows", str(args.rows), "--workers", str(args.workers),
              "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--stop-at", str(args.stop_at),
              *(["--iceberg"] if args.iceberg else []), *(["--mixture"] if mixture else [])]
    for phase in ("train", "resume"):
        knobs = ", ".join(f"{k}={v}" for k, v in SHUFFLE.items())
        print(f"- {phase}: fresh process, {args.workers} workers, {knobs}", flush=True)
        debug = ["--traceback"] if getattr(args, "traceback", False) else []
        status = subprocess.run([sys.executable, "-m", "arrowstream", "demo", "--phase", phase, *common, *debug],
                                check=False).returncode
        if status != 0:   # the phase printed its error: one line, or the traceback with --traceback
            return status
        if args.iceberg and phase == "train":
            before, after = append_more(data, args.rows, extra=args.rows // 4)
            print(f"- while the job is down the table moves on: {args.rows // 4:,} rows appended, "
                  f"snapshot {before} -> {after}; the checkpoint pinned {before}", flush=True)
    with open(os.path.join(args.dir, "train.json")) as f:
        first = json.load(f)
    with open(os.path.join(args.dir, "resume.json")) as f:
        second = json.load(f)
    print("- checking against an uninterrupted run ...", flush=True)
    import torch

    pinned = torch.load(os.path.join(args.dir, "checkpoint.pt"), weights_only=True)["snapshot_id"]
    reference = _reference(args, data, pinned)
    ok = True
    if mixture:
        _, reference_mixture = _loader(args, data)
        ok &= _check_mixture(args.rows, first["batches"] + second["batches"], reference_mixture.quotas(), args.epochs)
    for epoch in range(0 if mixture else args.epochs):
        counts = Counter(i for e, ids in first["batches"] + second["batches"] if e == epoch for i in ids)
        once = sorted(counts) == list(range(args.rows)) and max(counts.values()) == 1
        ok &= once
        print(f"  epoch {epoch}: {sum(counts.values()):,} rows seen, "
              f"{'every row exactly once' if once else 'ROWS MISSING OR REPEATED'}")
    exact = first["batches"] + second["batches"] == reference
    ok &= exact
    print(f"  resumed batches {'equal' if exact else 'DIFFER FROM'} the uninterrupted run "
          f"({len(second['batches'])} batches after the checkpoint)")
    for name, part in (("train", first), ("resume", second)):
        print(f"  {name}: {part['rows']:,} rows in {part['seconds']:.2f} s = {part['rows'] / part['seconds']:,.0f} rows/s "
              "(including the model step)")
    print("demo passed: exact resume, exactly once" if ok else "demo FAILED")
    if owned and ok:
        import shutil

        shutil.rmtree(args.dir, ignore_errors=True)
    return 0 if ok else 1
