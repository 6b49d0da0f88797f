"""Test helpers: deterministic datasets, batch fingerprints, the resume harness."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from arrowstream import StructuredDataset

EPOCHS = [0, 1, 2]
POINTS = ["start", "first", "mid", "last", "after", "next"]


def make_table(start: int, rows: int, seed: int = 0) -> pa.Table:
    """Rows with a unique ``id``; numeric, string and fixed-size list columns."""
    rng = np.random.default_rng(seed + start)
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.table({
        "id": ids,
        "x": rng.standard_normal(rows).astype(np.float32),
        "label": (ids % 7).astype(np.int8),
        "flag": ids % 2 == 0,
        "name": [f"row-{i}" for i in ids],
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(rows * 3).astype(np.float32)), 3),
    })


def write_dataset(folder: Path | str, layout: list[tuple[int, int]], seed: int = 0) -> str:
    """Write one Parquet file per ``(rows, row_group_size)``; ids run on across files."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    start = 0
    for index, (rows, group) in enumerate(layout):
        pq.write_table(make_table(start, rows, seed), folder / f"part-{index:03d}.parquet", row_group_size=group)
        start += rows
    return str(folder)


def write_ids(folder: Path, sizes: Iterable[int] = (130, 100), row_group_size: int = 25) -> str:
    """Files ``part-<i>.parquet`` of consecutive ids (and ``x = id / 2``) of the given sizes."""
    start = 0
    for index, rows in enumerate(sizes):
        ids = list(range(start, start + rows))
        pq.write_table(pa.table({"id": ids, "x": [i * 0.5 for i in ids]}), Path(folder) / f"part-{index}.parquet",
                       row_group_size=row_group_size)
        start += rows
    return str(folder)


def batch_key(batch: Any) -> tuple[Any, ...]:
    """A byte-exact, comparable fingerprint of a batch of any output format."""
    if isinstance(batch, pa.RecordBatch):
        return ("arrow", batch.schema.to_string(), tuple(c.to_pylist().__repr__() for c in batch.columns))
    out = []
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            out.append((name, str(value.dtype), tuple(value.shape), value.numpy().tobytes()))
        elif isinstance(value, np.ndarray):
            out.append((name, str(value.dtype), value.shape, value.tobytes()))
        else:
            out.append((name, repr(value)))
    return tuple(out)


def ids_of(batch: Any) -> list[int]:
    value = batch["id"] if not isinstance(batch, pa.RecordBatch) else batch.column("id")
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, pa.Array):
        return value.to_pylist()
    return list(value)


def all_batches(loader: Any) -> list[Any]:
    """``list(loader)``, and the workers ended at once when a worker's error ends the loop: torchdata
    leaves them to the garbage collector, whose shutdown then waits 5 s for each, in a later test."""
    batches = iter(loader)
    try:
        return list(batches)
    finally:
        inner = getattr(batches, "_inner", batches)
        getattr(inner, "_shutdown_workers", lambda: None)()


def json_roundtrip(state: Any) -> Any:
    return json.loads(json.dumps(state))


def make_loader(path: str, num_workers: int, **kwargs: Any):
    return StructuredDataset.create_dataloader(path=path, num_workers=num_workers, **kwargs)


def run_epochs(loader, dataset, epochs: Iterable[int], checkpoints: dict[str, Any] | None = None,
               mid: int = 1) -> list[tuple[int, tuple[Any, ...], list[int]]]:
    """Iterate whole epochs; record (epoch, key, ids) per batch and states at named points.

    Each checkpoint is ``(state, batches before it, epoch to restart the canonical loop at)``.
    Points: ``start`` (before any batch), ``first`` (after batch 1), ``mid`` (after batch
    ``mid``), ``last`` (after the final batch, taken inside the loop), ``after`` (after the loop
    ended), all in the first epoch; ``next`` (after ``mid`` batches of the second epoch).
    """
    out: list[tuple[int, tuple[Any, ...], list[int]]] = []
    epochs = list(epochs)
    for e_index, epoch in enumerate(epochs):
        dataset.set_epoch(epoch)
        record = checkpoints is not None and e_index < 2
        if record and e_index == 0:
            checkpoints["start"] = (json_roundtrip(loader.state_dict()), len(out), epoch)
        for step, batch in enumerate(loader):
            out.append((epoch, batch_key(batch), ids_of(batch)))
            if not record:
                continue
            if e_index == 0:
                checkpoints["last"] = (json_roundtrip(loader.state_dict()), len(out), epoch)
                if step == 0:
                    checkpoints["first"] = checkpoints["last"]
                if step + 1 == mid:
                    checkpoints["mid"] = checkpoints["last"]
            elif step + 1 == mid:
                checkpoints["next"] = (json_roundtrip(loader.state_dict()), len(out), epoch)
        if record and e_index == 0:
            checkpoints["after"] = (json_roundtrip(loader.state_dict()), len(out), epoch)
    return out


def resume_epochs(loader, dataset, state: Any, start_epoch: int, last_epoch: int) -> list[tuple[int, tuple[Any, ...], list[int]]]:
    """The canonical loop of DESIGN.md from a checkpoint: load, then epochs start..last."""
    loader.load_state_dict(state)
    out = []
    for epoch in range(start_epoch, last_epoch + 1):
        dataset.set_epoch(epoch)
        for batch in loader:
            out.append((epoch, batch_key(batch), ids_of(batch)))
    return out


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def check_exactly_once(batches, num_rows):
    for epoch in {e for e, _, _ in batches}:
        counts = Counter(i for e, _, ids in batches if e == epoch for i in ids)
        assert sorted(counts) == list(range(num_rows)), f"epoch {epoch} misses or invents rows"
        assert max(counts.values()) == 1, f"epoch {epoch} repeats rows"


def check_resume(path, num_workers, options, rows_of_epoch, mid=17, factory=make_loader):
    """The reference run's states at every point resume to exactly its continuation.

    ``factory(path, num_workers, **options)`` builds ``(loader, dataset)``; by default a
    ``StructuredDataset`` loader of the files at ``path``.
    """
    loader, dataset = factory(path, num_workers, **options)
    checkpoints: dict = {}
    reference = run_epochs(loader, dataset, EPOCHS, checkpoints, mid=mid)
    rows_of_epoch(reference, dataset)
    first_epoch_batches = sum(1 for e, _, _ in reference if e == 0)
    skips_rows = (options.get("parse_options") or {}).get("bad_rows") == "skip"
    if options.get("filter") is None and options.get("row_filter") is None and not skips_rows:
        assert first_epoch_batches == len(loader)

    for point in POINTS:
        state, consumed, epoch = checkpoints[point]
        fresh_loader, fresh_dataset = factory(path, num_workers, **options)
        resumed = resume_epochs(fresh_loader, fresh_dataset, state, epoch, EPOCHS[-1])
        expected = reference[consumed:]
        assert [k for _, k, _ in resumed] == [k for _, k, _ in expected], f"resume at {point!r} diverged"
        assert [e for e, _, _ in resumed] == [e for e, _, _ in expected], f"resume at {point!r}: epochs differ"


def slow_collate(batch: Any) -> Any:
    """A ``collate_fn`` that takes 10 ms per batch (module level: workers may pickle it)."""
    time.sleep(0.01)
    return batch


def golden_worker_version(golden_file: str) -> int:
    """The version of a golden mixture file's worker states, which its folder names: ``mixture-v4`` (in a loader
    state of the retired mixture kinds), ``mixture-v4-state-v11`` (in a loader state of version 11) or, from
    version 12 on (one worker state kind), ``v12`` (``v12/mixture-<case>.json``: the state's own version)."""
    folder = os.path.basename(os.path.dirname(golden_file))
    match = re.fullmatch(r"mixture-v(\d+)(-state-v\d+)?|v(\d+)", folder)
    assert match is not None, golden_file
    return int(match.group(1) or match.group(3))


def as_retired_mixture_worker(state: dict[str, Any], version: int) -> dict[str, Any]:
    """A mixture worker state of this version written as the retired kind ``"arrowstream.mixture_worker"`` of
    ``version`` (1 to 4) wrote it: no ``reads``, the counters at the top, no ``elastic`` when null, and without the
    options that version had no field for (``batch_order`` before 3, ``pass_layout`` before 4). Changed in place."""
    assert state["kind"] == "arrowstream.worker" and state.pop("reads") == "mixture" and 1 <= version <= 4
    state.update(kind="arrowstream.mixture_worker", version=version, **state.pop("counters"))
    if state.get("elastic", 0) is None:
        del state["elastic"]
    for option, since in (("batch_order", 3), ("pass_layout", 4)):
        if version < since:
            state["options"].pop(option)
    return state


def replanned_by_an_older_cut(golden: dict[str, Any]) -> bool:
    """Whether a golden state of version 8 or older is loaded on another topology than it was taken on (a merged
    checkpoint of other ranks or workers): the rest of its epoch is then re-planned with this version's even cut
    (#36), not the longest-processing-time cut its recorded batches came from."""
    state = golden["state"]
    if state.get("kind") != "arrowstream.checkpoint" or state["version"] >= 9:
        return False
    return (len(state["ranks"]), state["num_workers"]) != (golden["options"].get("world_size", 1), golden["num_workers"])


def assert_replanned_continuation(golden: dict[str, Any], per_epoch: list[list[list[int]]]) -> None:
    """The batches resumed from such a state (``per_epoch``: each epoch's, from the saved one on) against the
    recorded ones: the rest of the saved epoch the same rows, each once, in new shares; the later epochs, whole
    and fresh on the new topology, exactly as recorded."""
    later = sum(len(batches) for batches in per_epoch[1:])
    recorded = golden["continuation_ids"]
    head, tail = recorded[:len(recorded) - later], recorded[len(recorded) - later:]
    assert sorted(i for b in per_epoch[0] for i in b) == sorted(i for b in head for i in b)
    assert [b for batches in per_epoch[1:] for b in batches] == tail


def replan_layouts() -> dict[str, Any]:
    """Strategies for the fields of a re-plan case that tests/test_elastic_plan.py and tests/test_replan.py share:
    files of row groups, split size, the old and new (world_size, num_workers), the order and the pipeline."""
    from hypothesis import strategies as st

    topologies = st.tuples(st.integers(1, 3), st.integers(0, 3))
    return {
        "files": st.lists(st.lists(st.integers(0, 60), min_size=1, max_size=4), min_size=1, max_size=4).filter(
            lambda files: any(map(sum, files))),
        "split_bytes": st.sampled_from([None, 1, 300, 2000]),
        "old": topologies,
        "new": topologies,
        "shuffle": st.booleans(),
        "seed": st.integers(0, 2**32),
        "epoch": st.integers(0, 3),
        "batch_size": st.integers(1, 40),
        "interleave": st.integers(1, 3),
        "buffer_rows": st.sampled_from([0, 1, 7, 50, 200]),
        "piece_rows": st.integers(1, 50),
    }


def share_runs(readers, share, *, seed: int, epoch: int, slot, batch_size: int, interleave: int, buffer_rows: int,
               start):
    """A worker's rows of its share of an epoch from ``start``, as a static dataset slot read them before its share
    became one source's parts (``arrowstream._layout.share_parts``): the replays (of an epoch re-planned for this
    topology), then its splits, as one stream of runs whose cursors count the replays. The reference the tests
    read ``EpochStream`` over, against the one stream."""
    import dataclasses
    import functools

    from arrowstream._core.cursor import Cursor
    from arrowstream._core.order import window_seed
    from arrowstream._core.stream import open_runs
    from arrowstream._layout.elastic import replay_runs, with_replay_index

    seeds = functools.partial(window_seed, seed, epoch, slot)
    if not share.replays:
        return open_runs(readers, share.splits, batch_size=batch_size, interleave=interleave, buffer_rows=buffer_rows,
                         window_seed=seeds, start=start)

    def replayed():
        first_split = Cursor.start(len(share.splits), interleave)
        for index in range(start.replay_index, len(share.replays)):
            skip = start.replay_offset if index == start.replay_index else 0
            yield from replay_runs(readers, share.replays[index], index, skip, first_split, seed=seed, epoch=epoch,
                                   batch_size=batch_size, interleave=interleave, buffer_rows=buffer_rows)
        replays = len(share.replays)
        base = start if start.replay_index >= replays else dataclasses.replace(first_split, replay_index=replays)
        for run in open_runs(readers, share.splits, batch_size=batch_size, interleave=interleave,
                             buffer_rows=buffer_rows, window_seed=seeds, start=base):
            yield with_replay_index(run, replays)

    return replayed()
