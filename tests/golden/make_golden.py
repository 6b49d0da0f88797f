"""Write the golden state files of the current state format version.

Run once per released state version, commit the output, and never edit it afterwards:
``python tests/golden/make_golden.py``. The data fixture (``data/``, two tiny Parquet files)
is committed too, because a state is only valid on the exact files it was taken on; the test
restores the files' modification times from ``data/mtimes.json``. ``data-cut/`` (one file of two row
groups) holds the data of the cases whose plan cuts row groups into ranges (``CUT_CASES``); a case names
its data folder in its ``data`` key.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
# one file of two row groups, fewer units than slots: the plan cuts row groups into row ranges (refine_splits)
CUT_DATA = os.path.join(HERE, "data-cut")
MTIME = 1_790_000_000  # whole seconds: every filesystem keeps them exactly

CASES = [
    {"name": "workers2-shuffle-mid", "num_workers": 2, "options": {"batch_size": 16, "shuffle": True, "seed": 1},
     "epochs": [0, 1], "point": ("mid", 0, 5)},
    {"name": "workers0-ordered-mid", "num_workers": 0, "options": {"batch_size": 16}, "epochs": [0, 1],
     "point": ("mid", 0, 3)},
    {"name": "workers2-shuffle-after-loop", "num_workers": 2, "options": {"batch_size": 16, "shuffle": True, "seed": 1},
     "epochs": [0, 1], "point": ("after", 0, 0)},
    {"name": "workers1-shuffle-next-epoch", "num_workers": 1, "options": {"batch_size": 16, "shuffle": True, "seed": 3},
     "epochs": [0, 1, 2], "point": ("mid", 1, 2)},
    # from v3 on: record-level shuffle buffer and interleave
    {"name": "workers2-buffer-interleave-mid", "num_workers": 2,
     "options": {"batch_size": 16, "shuffle": True, "seed": 1, "shuffle_buffer_size": 30, "interleave": 2},
     "epochs": [0, 1], "point": ("mid", 0, 3)},
    {"name": "workers0-buffer-interleave-mid", "num_workers": 0,
     "options": {"batch_size": 16, "shuffle_buffer_size": 25, "interleave": 3}, "epochs": [0, 1],
     "point": ("mid", 0, 4)},
    # from v4 on: ranks (even_batches trims rank 0 to rank 1's batch count) and merged checkpoints
    {"name": "rank1of2-workers2-shuffle-mid", "num_workers": 2,
     "options": {"batch_size": 16, "shuffle": True, "seed": 2, "rank": 1, "world_size": 2},
     "epochs": [0, 1], "point": ("mid", 0, 2)},
    {"name": "merged-rank1of2-workers1-mid", "num_workers": 1, "merge_ranks": 2,
     "options": {"batch_size": 8, "shuffle": True, "seed": 4, "rank": 1, "world_size": 2,
                 "shuffle_buffer_size": 20},
     "epochs": [0, 1], "point": ("mid", 0, 3)},
    # a state inside an epoch re-planned from 2 workers to 3 (elastic resume)
    {"name": "elastic-workers3-from-workers2-mid", "num_workers": 3, "elastic_from": (2, 2),
     "options": {"batch_size": 8, "shuffle": True, "seed": 6, "shuffle_buffer_size": 12, "interleave": 2},
     "epochs": [0, 1], "point": ("mid", 0, 2)},
    # (v12, added with re-planning a re-planned epoch again) a state inside an epoch re-planned from 2 workers to
    # 3 and, from a checkpoint inside that, again to 1: its elastic's "before" is the first re-plan
    {"name": "elastic-twice-workers1-from-workers3-from-workers2-mid", "num_workers": 1,
     "elastic_chain": [(2, 2), (3, 2)],
     "options": {"batch_size": 8, "shuffle": True, "seed": 6, "shuffle_buffer_size": 12, "interleave": 2},
     "epochs": [0, 1], "point": ("mid", 0, 2)},
    # from v7 on: dynamic assignment (the ledger of leases); resumed by one process, whose order is fixed
    {"name": "dynamic-workers0-buffer-interleave-mid", "num_workers": 0,
     "options": {"batch_size": 16, "shuffle": True, "seed": 1, "shuffle_buffer_size": 30, "interleave": 2,
                 "assignment": "dynamic"},
     "epochs": [0, 1], "point": ("mid", 0, 3)},
    # the ledger of 2 worker processes (replays of their windows, splits they held) loaded by one process,
    # and a state inside that resumed epoch
    {"name": "dynamic-workers0-from-workers2-mid", "num_workers": 0, "elastic_from": (2, 3),
     "options": {"batch_size": 8, "shuffle": True, "seed": 6, "shuffle_buffer_size": 12, "interleave": 2,
                 "assignment": "dynamic"},
     "epochs": [0, 1], "point": ("mid", 0, 2)},
    # (from v9 on the two dynamic cases' ledgers count the rows yielded: "yielded", checked on load)
    # from v10 on: a dynamic checkpoint of 2 ranks re-planned for 3 (every old rank's ledger, cut into equal
    # stretches), and rank 1's state inside that re-planned epoch (its ledger's "replanned")
    {"name": "dynamic-rank1of3-replanned-from-2-ranks-mid", "num_workers": 0, "replanned_from": (2, 2, 3),
     "options": {"batch_size": 8, "shuffle": True, "seed": 6, "shuffle_buffer_size": 12, "interleave": 2,
                 "assignment": "dynamic", "rank": 1, "world_size": 3},
     "epochs": [0, 1], "point": ("mid", 0, 2)},
    # from v8 on: loader.skip() (a skip done before the point is recorded in "skips", one asked for at the point
    # is the state's "pending_skip"), the default record-level buffer of shuffle=True, and data_identity="layout"
    # (the state holds the data's layout; the test touches the files before loading it)
    {"name": "workers2-skips-mid", "num_workers": 2, "options": {"batch_size": 8, "shuffle": True, "seed": 7},
     "skips": {1: 2, 4: 1}, "epochs": [0, 1], "point": ("mid", 0, 4)},
    {"name": "workers0-layout-mid", "num_workers": 0,
     "options": {"batch_size": 16, "shuffle": True, "seed": 2, "data_identity": "layout"},
     "epochs": [0, 1], "point": ("mid", 0, 3)},
    # from v13 on: order="canonical" (the epoch laid out over 4 canonical slots, each worker state holding the states
    # of the canonical slots it reads): 2 workers of one rank (2 canonical slots each, parts joined in the trainer),
    # a merged checkpoint of 2 ranks of 1 worker (resumed on rank 1 of 2), 0 workers after the loop of epoch 0
    {"name": "canonical4-workers2-buffer-interleave-mid", "num_workers": 2,
     "options": {"batch_size": 16, "shuffle": True, "seed": 8, "shuffle_buffer_size": 12, "interleave": 2,
                 "order": "canonical", "canonical_slots": 4},
     "epochs": [0, 1], "point": ("mid", 0, 3)},
    {"name": "canonical4-merged-rank1of2-workers1-mid", "num_workers": 1, "merge_ranks": 2,
     "options": {"batch_size": 8, "shuffle": True, "seed": 9, "rank": 1, "world_size": 2,
                 "order": "canonical", "canonical_slots": 4},
     "epochs": [0, 1], "point": ("mid", 0, 3)},
    {"name": "canonical4-workers0-after-loop", "num_workers": 0,
     "options": {"batch_size": 16, "shuffle": True, "seed": 10, "order": "canonical", "canonical_slots": 4},
     "epochs": [0, 1, 2], "point": ("after", 0, 0)},
]


# states of a plan whose row groups are cut for idle slots: 3 ranks x 2 workers over 2 row groups. Written at
# state version 5 with refine version 1 (planning version 1), the last one before planning was versioned:
# ``python tests/golden/make_golden.py --cut`` with the arrowstream of that version on PYTHONPATH
CUT_CASES = [
    {"name": "cut-rank0of3-workers2-shuffle-mid", "num_workers": 2, "data": "data-cut",
     "options": {"batch_size": 4, "shuffle": True, "seed": 5, "rank": 0, "world_size": 3},
     "epochs": [0, 1], "point": ("mid", 0, 3)},
    # a merged checkpoint of the 3 ranks x 2 workers, resumed on 1 rank of 2 workers (elastic resume)
    {"name": "cut-elastic-rank0of1-workers2-from-3x2-mid", "num_workers": 2, "data": "data-cut",
     "elastic_ranks": (3, 2, 2),
     "options": {"batch_size": 4, "shuffle": True, "seed": 5, "rank": 0, "world_size": 1},
     "epochs": [0, 1], "point": ("elastic", 0, 0)},
]


def write_cut_data() -> None:
    """``data-cut/part-0.parquet``: ids 0..79, two row groups of 40 rows."""
    if os.path.isdir(CUT_DATA):
        return
    os.makedirs(CUT_DATA)
    ids = np.arange(80, dtype=np.int64)
    table = pa.table({"id": ids, "x": (ids * 0.5).astype(np.float32)})
    pq.write_table(table, os.path.join(CUT_DATA, "part-0.parquet"), row_group_size=40)
    with open(os.path.join(CUT_DATA, "mtimes.json"), "w") as f:
        json.dump({"part-0.parquet": MTIME}, f)


def write_data() -> None:
    if os.path.isdir(DATA):
        return
    os.makedirs(DATA)
    start = 0
    for index, rows in enumerate([70, 50]):
        ids = np.arange(start, start + rows, dtype=np.int64)
        table = pa.table({"id": ids, "x": (ids * 0.5).astype(np.float32)})
        pq.write_table(table, os.path.join(DATA, f"part-{index}.parquet"), row_group_size=20)
        start += rows
    with open(os.path.join(DATA, "mtimes.json"), "w") as f:
        json.dump({name: MTIME for name in sorted(os.listdir(DATA)) if name.endswith(".parquet")}, f)


def prepare_copy(target: str, data: str = "data") -> str:
    """Copy the fixture data (folder ``data`` here) to ``target`` with its recorded modification times."""
    source = os.path.join(HERE, data)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.json"))
    with open(os.path.join(source, "mtimes.json")) as f:
        for name, mtime in json.load(f).items():
            os.utime(os.path.join(target, name), (mtime, mtime))
    return target


def merged_state_of(case: dict, key: str, path: str) -> dict:
    """The merged checkpoint of every rank of the topology ``case[key]`` = (world size, workers, steps), each after
    ``steps`` batches of epoch 0, through JSON."""
    from arrowstream import StructuredDataset, merge_state_dicts

    old_world, old_workers, steps = case[key]
    states = []
    for rank in range(old_world):
        options = {**case["options"], "rank": rank, "world_size": old_world}
        old, old_dataset = StructuredDataset.create_dataloader(path=path, num_workers=old_workers, **options)
        old_dataset.set_epoch(0)
        for step, _ in enumerate(old):
            if step + 1 == steps:
                break
        states.append(old.state_dict())
    return json.loads(json.dumps(merge_state_dicts(states)))


def capture(case: dict, path: str) -> dict:
    from arrowstream import StructuredDataset, merge_state_dicts

    loader, dataset = StructuredDataset.create_dataloader(path=path, num_workers=case["num_workers"],
                                                          **case["options"])
    if case.get("elastic_from"):  # start from a state of another number of workers, after some batches
        old_workers, steps = case["elastic_from"]
        old, old_dataset = StructuredDataset.create_dataloader(path=path, num_workers=old_workers, **case["options"])
        old_dataset.set_epoch(0)
        for step, _ in enumerate(old):
            if step + 1 == steps:
                break
        loader.load_state_dict(json.loads(json.dumps(old.state_dict())))
    if case.get("elastic_chain"):  # from a state of one topology to the next, some batches each, loaded here
        state = None
        for workers, steps in case["elastic_chain"]:
            old, old_dataset = StructuredDataset.create_dataloader(path=path, num_workers=workers, **case["options"])
            if state is not None:
                old.load_state_dict(state)
            old_dataset.set_epoch(0)
            for step, _ in enumerate(old):
                if step + 1 == steps:
                    break
            state = json.loads(json.dumps(old.state_dict()))
        loader.load_state_dict(state)
    if case.get("replanned_from"):
        # every rank of another world size after some batches, merged, loaded here: the rest re-planned
        loader.load_state_dict(merged_state_of(case, "replanned_from", path))
    if case.get("elastic_ranks"):
        # every rank of another topology after some batches, merged, loaded here: the rest of the epoch re-planned
        state = merged_state_of(case, "elastic_ranks", path)
        loader.load_state_dict(state)
        all_ids = []
        for epoch in case["epochs"]:
            dataset.set_epoch(epoch)
            all_ids += [batch["id"].tolist() for batch in loader]
        return {"state": state, "consumed": 0, "epoch": case["point"][1], "continuation_ids": all_ids}
    if case.get("merge_ranks"):
        # every rank's state at the same step, merged; the recorded continuation is the case's rank's
        record = capture({**case, "merge_ranks": 0}, path)
        states = []
        for rank in range(case["merge_ranks"]):
            options = {**case["options"], "rank": rank}
            states.append(capture({**case, "options": options, "merge_ranks": 0}, path)["state"])
        record["state"] = json.loads(json.dumps(merge_state_dicts(states)))
        return record
    kind, at_epoch, at_step = case["point"]
    consumed, state, all_ids = 0, None, []
    for epoch in case["epochs"]:
        dataset.set_epoch(epoch)
        for step, batch in enumerate(loader):
            all_ids.append(batch["id"].tolist())
            consumed += 1
            if epoch == at_epoch and step + 1 in case.get("skips", {}):
                loader.skip(batches=case["skips"][step + 1])   # the skipped batches never reach all_ids
            if kind == "mid" and epoch == at_epoch and step + 1 == at_step:
                state, before = json.loads(json.dumps(loader.state_dict())), consumed
        if kind == "after" and epoch == at_epoch:
            state, before = json.loads(json.dumps(loader.state_dict())), consumed
    assert state is not None
    continuation = all_ids[before:]
    if case["options"].get("assignment") == "dynamic":
        # a resume lays out the rest anew: record what a fresh loader of one process reads from the state
        fresh, fresh_dataset = StructuredDataset.create_dataloader(path=path, num_workers=0, **case["options"])
        fresh.load_state_dict(state)
        continuation = []
        for epoch in range(at_epoch, case["epochs"][-1] + 1):
            fresh_dataset.set_epoch(epoch)
            continuation += [batch["id"].tolist() for batch in fresh]
    return {"state": state, "consumed": before, "epoch": at_epoch, "continuation_ids": continuation}


def main() -> None:
    from arrowstream._state.versions import STATE_VERSION

    write_data()
    write_cut_data()
    cut = "--cut" in sys.argv
    out_dir = os.path.join(HERE, f"v{STATE_VERSION}")
    new = "--new" in sys.argv   # only the cases of this version added since its files were written
    if os.path.isdir(out_dir) and "--force" not in sys.argv and not (cut or new):
        sys.exit(f"{out_dir} exists; golden files are never rewritten")
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for case in CUT_CASES if cut else CASES + CUT_CASES:
            out = os.path.join(out_dir, f"{case['name']}.json")
            if new and os.path.exists(out):
                continue
            if cut and os.path.exists(out):
                sys.exit(f"{out} exists; golden files are never rewritten")
            data = case.get("data", "data")
            path = os.path.join(tmp, data)
            if not os.path.isdir(path):
                prepare_copy(path, data)
            record = {key: case[key] for key in ("num_workers", "options", "epochs")}
            if "data" in case:
                record["data"] = data
            record.update(capture(case, path))
            with open(out, "w") as f:
                json.dump(record, f, indent=1, sort_keys=True)
                f.write("\n")


if __name__ == "__main__":
    main()
