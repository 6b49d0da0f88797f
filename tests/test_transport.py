"""Worker-to-trainer transport: same values as num_workers=0, and nothing left behind."""

from __future__ import annotations

import os
import pickle
import random
import re
import signal
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
import torch
from helpers import batch_key, ids_of, make_loader, resume_epochs, run_epochs, write_dataset
from leaks import Snapshot
from servers import server_process_groups

from arrowstream import WorkerError
from arrowstream._core.cursor import Cursor, Position
from arrowstream._worker.transport import Chunk


def _sorted_keys(loader):
    return sorted((batch_key(b) for b in loader), key=repr)


@pytest.mark.parametrize("output_format", ["torch", "numpy", "arrow", "dict"])
def test_workers_deliver_the_same_batches_as_the_main_process(uneven_dataset, output_format):
    options = {"batch_size": 100, "output_format": output_format}
    in_process, _ = make_loader(uneven_dataset, 0, **options)
    with_workers, _ = make_loader(uneven_dataset, 2, **options)
    assert with_workers.batches_per_transfer == 16  # 16384 // 100 rows, capped at 16
    # same split assignment per worker slot is not comparable across num_workers; compare as sets
    # of rows keyed by id, with every column's values and dtype
    assert _rows(in_process, output_format) == _rows(with_workers, output_format)


def _rows(loader, output_format):
    rows = {}
    for batch in loader:
        if isinstance(batch, pa.RecordBatch):
            batch = {name: batch.column(name).to_pylist() for name in batch.schema.names}
        for i, row_id in enumerate(list(batch["id"])):
            row = []
            for name, value in batch.items():
                item = value[i]
                if isinstance(item, torch.Tensor):
                    item = (str(item.dtype), tuple(item.shape), item.numpy().tobytes())
                elif isinstance(item, np.ndarray | np.generic):
                    item = (str(item.dtype), np.shape(item), np.asarray(item).tobytes())
                row.append((name, repr(item) if not isinstance(item, tuple) else item))
            rows[int(row_id)] = row
    return rows


def test_dtypes_and_shapes_survive_the_transport(small_dataset):
    loader, _ = make_loader(small_dataset, 2, batch_size=50)
    batch = next(iter(loader))
    assert batch["id"].dtype == torch.int64 and batch["id"].shape == (50,)
    assert batch["label"].dtype == torch.int8 and batch["flag"].dtype == torch.bool
    assert batch["vec"].dtype == torch.float32 and batch["vec"].shape == (50, 3)
    assert isinstance(batch["name"], list) and batch["name"][0].startswith("row-")


def test_transform_output_is_packed_generically(small_dataset):
    loader, _ = make_loader(small_dataset, 2, batch_size=40, transform=_featurize)
    batches = list(loader)
    assert all(b["features"].shape == (40, 4) and b["features"].dtype == torch.float64 for b in batches)
    assert all(isinstance(b["ids"], np.ndarray) for b in batches)
    assert sorted(i for b in batches for i in b["ids"].tolist()) == list(range(400))


def _featurize(batch):
    features = torch.cat([batch["vec"].double(), batch["x"].double().unsqueeze(1)], dim=1)
    return {"features": features, "ids": batch["id"].numpy().copy(), "names": batch["name"]}


def test_chunk_round_trip_is_exact_and_views_share_one_buffer():
    batches = [{"a": torch.arange(5, dtype=torch.int16), "b": np.linspace(0, 1, 5), "c": ["x"] * 5,
                "m": torch.ones(5, 3, dtype=torch.float32), "t": torch.tensor([True, False, True, True, False])}
               for _ in range(3)]
    positions = [Position(Cursor(((0, i),), 1), 5 * (i + 1), i + 1, 0) for i in range(3)]
    received = pickle.loads(pickle.dumps(Chunk(1, batches, positions)))
    assert received.worker_id == 1 and received.positions == positions
    out = received.batches()
    for sent, got in zip(batches, out):
        assert torch.equal(sent["a"], got["a"]) and got["a"].dtype == torch.int16
        assert np.array_equal(sent["b"], got["b"]) and isinstance(got["b"], np.ndarray)
        assert got["c"] == sent["c"] and torch.equal(sent["m"], got["m"]) and torch.equal(sent["t"], got["t"])
    pointers = sorted(got["a"].data_ptr() for got in out)
    assert pointers == [pointers[0], pointers[0] + 10, pointers[0] + 20]  # side by side in one buffer


def test_checkpoints_inside_a_chunk_resume_exactly(uneven_dataset):
    options = {"batch_size": 32, "shuffle": True, "batches_per_transfer": 5}
    loader, dataset = make_loader(uneven_dataset, 3, **options)
    checkpoints: dict = {}
    reference = run_epochs(loader, dataset, [0, 1], checkpoints, mid=7)  # 7 = 5 + 2: inside a chunk
    for point in ("first", "mid", "next"):
        state, consumed, epoch = checkpoints[point]
        fresh, fresh_dataset = make_loader(uneven_dataset, 3, **options)
        resumed = resume_epochs(fresh, fresh_dataset, state, epoch, 1)
        assert [k for _, k, _ in resumed] == [k for _, k, _ in reference[consumed:]], point


def test_a_resumed_loader_adopts_the_checkpoints_transfer_size(uneven_dataset):
    loader, dataset = make_loader(uneven_dataset, 2, batch_size=32, batches_per_transfer=3)
    checkpoints: dict = {}
    reference = run_epochs(loader, dataset, [0], checkpoints, mid=4)
    state, consumed, epoch = checkpoints["mid"]
    fresh, fresh_dataset = make_loader(uneven_dataset, 2, batch_size=32)  # default 16
    resumed = resume_epochs(fresh, fresh_dataset, state, epoch, 0)
    assert fresh.batches_per_transfer == 3
    assert [k for _, k, _ in resumed] == [k for _, k, _ in reference[consumed:]]


def _open_fds():
    return len(os.listdir(f"/proc/{os.getpid()}/fd"))


def test_nothing_left_behind_after_a_normal_end_and_a_break(uneven_dataset):
    before, before_fds = Snapshot.take(), _open_fds()
    for _ in range(3):
        loader, _ = make_loader(uneven_dataset, 2, batch_size=64)
        assert sum(len(b["id"]) for b in loader) == 3130
        loader, _ = make_loader(uneven_dataset, 2, batch_size=64)
        for step, _ in enumerate(loader):
            if step == 5:
                break
        del loader
    time.sleep(0.5)   # the queues' feeder threads close their pipes
    # /dev/shm is the machine's: what another process (the other pytest-xdist worker) makes is not ours
    assert before.leaks(server_process_groups()) == []
    assert _open_fds() <= before_fds + 4


def test_a_killed_worker_raises_and_the_next_run_works(uneven_dataset):
    before = Snapshot.take()
    loader, _ = make_loader(uneven_dataset, 2, batch_size=16)
    it = iter(loader)
    next(it)
    os.kill(loader._iterator._workers[0].pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="(?i)worker"):
        for _ in it:
            pass
    del it, loader
    fresh, _ = make_loader(uneven_dataset, 2, batch_size=16)
    assert sum(len(b["id"]) for b in fresh) == 3130
    del fresh
    assert before.leaks(server_process_groups()) == []


@pytest.mark.parametrize("assignment", ["static", "dynamic"])
def test_a_persistent_worker_killed_between_epochs_is_named_and_the_epoch_starts_again_whole(uneven_dataset,
                                                                                              assignment):
    """torch finds the dead worker when the next iteration starts and raised its RuntimeError naming a pid:
    now a WorkerError naming the worker, and the loader's next iteration starts new workers at the
    epoch's first batch (none of it was handed out), the batches of an uninterrupted run."""
    options = {"batch_size": 64, "persistent_workers": True, "shuffle": True, "seed": 3, "assignment": assignment}
    loader, dataset = make_loader(uneven_dataset, 2, **options)
    dataset.set_epoch(0)
    assert sum(len(b["id"]) for b in loader) == 3130
    victim = loader._iterator._workers[1]
    os.kill(victim.pid, signal.SIGKILL)
    time.sleep(0.5)
    dataset.set_epoch(1)
    with pytest.raises(WorkerError, match=rf"worker 1 \(pid {victim.pid}\) died \(killed by SIGKILL\).*epoch 1"):
        iter(loader)
    loader.state_dict()   # starts the new workers, which lease ...
    time.sleep(0.5)
    state = loader.state_dict()   # ... before this state: which must not read the dead iteration's batches
    again = [ids_of(b) for b in loader]
    assert sorted(i for ids in again for i in ids) == list(range(3130))
    assert loader._iterator._workers[1].pid != victim.pid
    if assignment == "static":   # the epoch an uninterrupted loader reads, batch for batch
        fresh, fresh_dataset = make_loader(uneven_dataset, 2, **options)
        fresh_dataset.set_epoch(1)
        assert again == [ids_of(b) for b in fresh]
    resumed, _ = make_loader(uneven_dataset, 3, **{**options, "persistent_workers": False})
    resumed.load_state_dict(state)   # taken after the error: the whole epoch is left
    assert sorted(i for b in resumed for i in ids_of(b)) == list(range(3130))


def test_ring_and_by_value_transports_agree(uneven_dataset, monkeypatch):
    monkeypatch.setenv("ARROWSTREAM_SHM_RING", "0")
    by_value, _ = make_loader(uneven_dataset, 2, batch_size=100, shuffle=True)
    expected = [batch_key(b) for b in by_value]
    monkeypatch.setenv("ARROWSTREAM_SHM_RING", "1")
    through_ring, _ = make_loader(uneven_dataset, 2, batch_size=100, shuffle=True)
    assert [batch_key(b) for b in through_ring] == expected


def test_ring_slots_are_claimed_freed_and_never_waited_for():
    from arrowstream._worker import ring as _ring

    ring = _ring.Ring(slot_bytes=4096, num_slots=2)
    _ring.register(ring.id, os.getpid(), ring.tensor)
    assert ring.claim(5000) is None  # too big for a slot: the chunk goes by value
    first, second = ring.claim(100), ring.claim(100)
    assert {first, second} == {0, 1}
    assert ring.claim(100) is None  # all busy: by value, no waiting
    ring.view(first, 3)[:] = [7, 8, 9]
    assert _ring.take(ring.id, first, ring.slot_bytes, 3).tolist() == [7, 8, 9]
    assert ring.claim(100) == first  # freed by the trainer side


def test_chunks_that_do_not_fit_a_slot_go_by_value(uneven_dataset):
    """Every fifth batch grows 40 times: those chunks overflow the ring's slots and go by value."""
    loader, _ = make_loader(uneven_dataset, 2, batch_size=50, batches_per_transfer=2, transform=_sometimes_big)
    got = {}
    for batch in loader:
        for row_id, extra in zip(batch["id"].tolist(), batch["extra"].reshape(len(batch["id"]), -1)):
            got[row_id] = extra
    assert sorted(got) == list(range(3130))
    assert all(np.array_equal(extra, np.full(extra.shape, row_id)) for row_id, extra in got.items())
    assert {extra.shape[0] for extra in got.values()} == {1, 40}


def _sometimes_big(batch):
    width = 40 if int(batch["id"][0]) // 50 % 5 == 0 else 1
    batch["extra"] = np.repeat(batch["id"].numpy(), width * 100).reshape(-1, width * 100)[:, ::100].copy()
    return batch


def test_a_users_collate_fn_sees_batches_not_chunks(small_dataset):
    loader, _ = make_loader(small_dataset, 2, batch_size=25, collate_fn=_count_rows)
    counts = list(loader)
    assert counts == [{"rows": 25}] * 16


def _count_rows(batch):
    return {"rows": len(batch["id"])}


def test_chunked_checkpoint_needs_snapshots_every_step(uneven_dataset):
    from arrowstream import StateMismatchError

    state = _checkpoint_after(uneven_dataset, 3)
    loader, _ = make_loader(uneven_dataset, 2, batch_size=32, snapshot_every_n_steps=4)
    with pytest.raises(StateMismatchError, match="batches_per_transfer=16.*snapshot_every_n_steps=1"):
        loader.load_state_dict(state)


def _checkpoint_after(path, batches):
    loader, _dataset = make_loader(path, 2, batch_size=32)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return loader.state_dict()


@pytest.mark.parametrize("prefetch_factor", [1, 6])
def test_prefetch_factor_with_chunks(uneven_dataset, prefetch_factor):
    """More chunks in flight than ring slots: the overflow goes by value, nothing is lost."""
    options = {"batch_size": 16, "prefetch_factor": prefetch_factor, "batches_per_transfer": 2, "shuffle": True}
    loader, dataset = make_loader(uneven_dataset, 2, **options)
    checkpoints: dict = {}
    reference = run_epochs(loader, dataset, [0, 1], checkpoints, mid=33)
    assert sorted(i for e, _, ids in reference if e == 0 for i in ids) == list(range(3130))
    state, consumed, epoch = checkpoints["mid"]
    fresh, fresh_dataset = make_loader(uneven_dataset, 2, **options)
    resumed = resume_epochs(fresh, fresh_dataset, state, epoch, 1)
    assert [k for _, k, _ in resumed] == [k for _, k, _ in reference[consumed:]]


def _month_interval_batch(start, rows):
    """A batch with a ``month_interval`` column: pyarrow reads and writes the type, but has no
    Python class for it, so such a batch cannot be pickled (built through the C data interface)."""
    from pyarrow.cffi import ffi

    plain = pa.record_batch({"id": pa.array(range(start, start + rows), pa.int64()),
                             "months": pa.array(range(rows), pa.int32())})
    schema, array = ffi.new("struct ArrowSchema*"), ffi.new("struct ArrowArray*")
    plain._export_to_c(int(ffi.cast("uintptr_t", array)), int(ffi.cast("uintptr_t", schema)))
    month_format = ffi.new("char[]", b"tiM")
    schema.children[1].format = month_format
    return pa.RecordBatch._import_from_c(int(ffi.cast("uintptr_t", array)), int(ffi.cast("uintptr_t", schema)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("batches_per_transfer", [None, 1])
def test_a_column_pickle_cannot_carry_arrives_whole(tmp_path, batches_per_transfer):
    """Issue #16: an IPC file with a month_interval column, 2 workers, arrow output: 17 rows
    planned, 0 yielded and no error (pickling the batch failed in the queue's feeder thread)."""
    written = [_month_interval_batch(start, min(6, 17 - start)) for start in range(0, 17, 6)]
    path = tmp_path / "months.arrow"
    with pa.ipc.new_file(path, written[0].schema) as writer:
        for batch in written:
            writer.write_batch(batch)
    loader, dataset = make_loader(str(path), 2, format="arrow", batch_size=6, output_format="arrow",
                                  batches_per_transfer=batches_per_transfer)
    got = sorted(loader, key=lambda b: ids_of(b)[0])
    assert dataset.num_rows == 17 and len(loader) == len(got) == 3
    assert pa.Table.from_batches(got).equals(pa.Table.from_batches(written))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("batches_per_transfer", [None, 1])
def test_a_batch_a_worker_cannot_send_is_a_worker_error(small_dataset, batches_per_transfer):
    """A value that cannot be pickled is an error naming the worker, the column and the file
    (it was dropped by the queue's feeder thread, and the epoch ended short)."""
    loader, _ = make_loader(small_dataset, 2, batch_size=50, transform=_with_a_lock,
                            batches_per_transfer=batches_per_transfer)
    with pytest.raises(WorkerError, match=r"worker [01] could not pack column 'lock' \(_thread.lock\).*"
                                          r"part-00[01]\.parquet"):
        list(loader)


def _with_a_lock(batch):
    return {**batch, "lock": threading.Lock()}


@pytest.mark.timeout(60)
def test_a_ring_that_cannot_be_made_falls_back_to_by_value(uneven_dataset):
    """/dev/shm full: the ring's allocation fails in the worker (injected), every chunk goes by
    value and nothing is lost (the failure used to drop the chunk, and the trainer waited forever)."""
    loader, _ = make_loader(uneven_dataset, 2, batch_size=100, worker_init_fn=_shared_memory_is_full)
    ids = [i for batch in loader for i in ids_of(batch)]
    assert sorted(ids) == list(range(3130))


def _shared_memory_is_full(worker_id):
    def share_memory_(tensor):
        raise RuntimeError("unable to write to file </torch_1_2>: No space left on device (28)")

    torch.Tensor.share_memory_ = share_memory_


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("ring", "method", "attempts"), [("1", "fork", 12), ("0", "fork", 12), ("0", "forkserver", 3)])
def test_a_killed_worker_is_a_worker_error_within_seconds(tmp_path, monkeypatch, ring, method, attempts):
    """Issue #16: of 14 SIGKILLed workers, 2 gave a bare ConnectionResetError; with the ring off
    1 in 13 hung (a worker killed while writing leaves the trainer waiting for the rest of its
    message; no SIGCHLD reaches the trainer from forkserver workers). Killed at seeded random
    moments, each must be a WorkerError naming it, within seconds."""
    monkeypatch.setenv("ARROWSTREAM_SHM_RING", ring)
    # enough batches that a worker is rarely done sending (2 x 16-batch chunks in flight per worker) when killed
    path = write_dataset(tmp_path / "big", [(200000, 20000)])
    rng = random.Random(16)
    errors_seen = 0
    for attempt in range(attempts):
        loader, _ = make_loader(path, 2, batch_size=1024, multiprocessing_context=method)
        it = iter(loader)
        ids = ids_of(next(it))
        victim = attempt % 2
        pid = loader._iterator._workers[victim].pid
        threading.Timer(rng.random() * 0.04, os.kill, (pid, signal.SIGKILL)).start()
        started = time.monotonic()
        try:
            for batch in it:
                ids += ids_of(batch)
                time.sleep(0.002)  # a trainer that computes: the workers stay busy sending
        except WorkerError as exc:
            assert re.search(rf"worker {victim} \(pid {pid}\) died \(killed by SIGKILL\)", str(exc)), str(exc)
            errors_seen += 1
        else:  # killed after it had sent all its batches: then nothing may be missing
            assert sorted(ids) == list(range(200000)), f"attempt {attempt}: rows lost without an error"
        assert time.monotonic() - started < 15, f"attempt {attempt}: the error took too long"
        # shut down now, not in a __del__ during the next attempt: torch's SIGCHLD handler (which the
        # error may come from, wherever the trainer stands) could raise into it
        loader._iterator._shutdown_workers()
        del it, loader
    assert errors_seen >= attempts // 2, f"only {errors_seen} of {attempts} kills came while the worker had batches left"
