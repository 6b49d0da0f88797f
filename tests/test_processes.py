"""Resume in a fresh process through torch.save, and every worker start method (guarantee 12)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest
import torch
from helpers import make_loader, resume_epochs, run_epochs

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize(("num_workers", "persistent", "point"), [
    (0, False, "mid"), (2, True, "mid"), (2, False, "last"), (3, False, "after"), (1, True, "next")])
def test_resume_in_a_fresh_process_through_torch_save(uneven_dataset, tmp_path, num_workers, persistent, point):
    options = {"batch_size": 48, "shuffle": True, "seed": 5}
    if persistent:
        options["persistent_workers"] = True
    loader, dataset = make_loader(uneven_dataset, num_workers, **options)
    checkpoints: dict = {}
    reference = run_epochs(loader, dataset, [0, 1], checkpoints, mid=20)
    state, consumed, epoch = checkpoints[point]
    checkpoint_file = tmp_path / "ckpt.pt"
    torch.save({"loader": state, "epoch": epoch, "last_epoch": 1}, checkpoint_file)
    out_file = tmp_path / "out.pkl"
    subprocess.run([sys.executable, os.path.join(HERE, "resume_child.py"), uneven_dataset, str(checkpoint_file),
                    json.dumps({**options, "num_workers": num_workers}), str(out_file)],
                   check=True, timeout=120, cwd=HERE)
    with open(out_file, "rb") as f:
        resumed = pickle.load(f)
    assert [k for _, k, _ in resumed] == [k for _, k, _ in reference[consumed:]]


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_worker_start_methods(uneven_dataset, method):
    options = {"batch_size": 64, "shuffle": True, "multiprocessing_context": method}
    loader, dataset = make_loader(uneven_dataset, 2, **options)
    checkpoints: dict = {}
    reference = run_epochs(loader, dataset, [0, 1], checkpoints, mid=10)
    assert sorted(i for e, _, ids in reference if e == 0 for i in ids) == list(range(dataset.num_rows))
    state, consumed, epoch = checkpoints["mid"]
    fresh, fresh_dataset = make_loader(uneven_dataset, 2, **options)
    resumed = resume_epochs(fresh, fresh_dataset, state, epoch, 1)
    assert [k for _, k, _ in resumed] == [k for _, k, _ in reference[consumed:]]


def test_set_epoch_reaches_persistent_spawned_workers(uneven_dataset):
    loader, dataset = make_loader(uneven_dataset, 2, batch_size=64, shuffle=True, persistent_workers=True,
                                  multiprocessing_context="spawn")
    orders = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        orders.append([i for b in loader for i in b["id"].tolist()])
    reference_loader, reference_dataset = make_loader(uneven_dataset, 0, batch_size=64, shuffle=True)
    reference_dataset.set_epoch(1)
    assert orders[0] != orders[1]
    assert sorted(orders[1]) == sorted(i for b in reference_loader for i in b["id"].tolist())
