"""Resume in a fresh process through torch.save, and every worker start method (guarantee 12)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import make_loader, resume_epochs, run_epochs

from arrowstream.testing import check_resume

HERE = os.path.dirname(__file__)


@pytest.mark.parametrize(("num_workers", "persistent", "point"), [
    (0, False, "mid"), (2, True, "mid"), (2, False, "last"), (3, False, "after"), (1, True, "next")])
def test_resume_in_a_fresh_process_through_torch_save(uneven_dataset, num_workers, persistent, point):
    """check_resume with fresh_process=True: the state goes through json and torch.save, a spawned process
    loads it into a fresh loader and runs to the end of epoch 1, batch for batch the uninterrupted run's.
    Points: after batch 20, after the last batch (inside the loop), after the loop (resumed as the next
    epoch), after batch 20 of epoch 1."""
    options = {"batch_size": 48, "shuffle": True, "seed": 5}
    if persistent:
        options["persistent_workers"] = True
    make = functools.partial(make_loader, uneven_dataset, num_workers, **options)
    per_epoch = len(make()[0])
    points = {"mid": [20], "last": [per_epoch], "after": [], "next": [per_epoch + 20]}[point]
    report = check_resume(make, points=points, epochs=2, fresh_process=True, at_epoch_ends=point == "after")
    assert report.points == tuple(points or [per_epoch])
    assert report.batches_compared == 2 * per_epoch - report.points[0]


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


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_killed_trainer_leaves_no_process_and_no_shared_memory(uneven_dataset, tmp_path, method):
    """Guarantee 12: the workers, a fork server and the resource tracker all end within seconds
    of a SIGKILLed trainer, and the trainer's semaphores leave /dev/shm (under forkserver they
    all stayed: the workers watched their parent, the fork server, which waited for them)."""
    pid_file = tmp_path / "pids.json"
    trainer = subprocess.Popen([sys.executable, os.path.join(HERE, "trainer_child.py"), uneven_dataset,
                                str(pid_file), method], cwd=HERE)
    deadline = time.monotonic() + 90
    while not pid_file.exists():
        assert time.monotonic() < deadline and trainer.poll() is None, "the trainer did not start its workers"
        time.sleep(0.05)
    started = json.loads(pid_file.read_text())
    processes = started["workers"] + started["helpers"]
    assert len(started["workers"]) == 2
    assert method == "fork" or (started["helpers"] and started["semaphores"])
    trainer.send_signal(signal.SIGKILL)
    trainer.wait(timeout=30)
    try:
        deadline = time.monotonic() + 10
        while any(_running(pid) for pid in processes):
            assert time.monotonic() < deadline, f"processes outlived their killed trainer: " \
                f"{[_command(pid) for pid in processes if _running(pid)]}"
            time.sleep(0.1)
    finally:
        for pid in processes:  # never leave processes behind, even when the test fails
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
    left = [name for name in started["semaphores"] if os.path.exists("/dev/shm/sem." + name.lstrip("/"))]
    assert not left, f"semaphores of the killed trainer left in /dev/shm: {left}"


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _command(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()[:80]
    except FileNotFoundError:
        return "(gone)"


def _huge_pages_off() -> int:
    import ctypes

    return int(ctypes.CDLL(None).prctl(42, 0, 0, 0, 0))   # PR_GET_THP_DISABLE: 1 when the process has them off


def _mark_huge_pages(batch):
    import torch

    return {**batch, "thp_off": torch.full((len(batch["id"]),), _huge_pages_off())}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")
@pytest.mark.parametrize("kind,method", [("dataset", "fork"), ("dataset", "spawn"), ("mixture", "fork")])
def test_workers_read_without_transparent_huge_pages_and_the_trainer_keeps_them(uneven_dataset, kind, method):
    """pyarrow's allocator marks its arena for huge pages; a forked worker faulting fresh 2 MiB pages stalls where
    the kernel compacts memory (docs/performance.md): the workers turn them off for their process, and only there."""
    from arrowstream import Mixture, Source

    options = {"batch_size": 64, "shuffle": True, "transform": _mark_huge_pages, "multiprocessing_context": method}
    if kind == "dataset":
        loader, dataset = make_loader(uneven_dataset, 2, **options)
        dataset.set_epoch(0)
    else:
        loader, mixture = Mixture.create_dataloader(sources={"a": Source(uneven_dataset)}, num_workers=2,
                                                    plan_cache=False, **options)
        mixture.set_epoch(0)
    before = _huge_pages_off()
    flags = {int(flag) for batch in loader for flag in batch["thp_off"].tolist()}
    assert flags == {1}
    assert _huge_pages_off() == before   # the trainer's process as it was (on: 0, unless a test before turned it off)


def test_workers_start_where_stderr_has_no_file_descriptor(uneven_dataset, capsys):
    """Under pytest's ``capsys`` (as in a notebook), ``sys.stderr`` has no file descriptor; a worker that registers
    its stack dump (the suite's ``ARROWSTREAM_STACKS_ON_SIGUSR1``) writes it to the process's own stderr and reads
    every row (it crashed at start when it asked ``sys.stderr`` for one)."""
    assert os.environ.get("ARROWSTREAM_STACKS_ON_SIGUSR1") == "1"
    loader, dataset = make_loader(uneven_dataset, 2, batch_size=64, multiprocessing_context="fork")
    dataset.set_epoch(0)
    assert sorted(i for batch in loader for i in batch["id"].tolist()) == list(range(dataset.num_rows))
