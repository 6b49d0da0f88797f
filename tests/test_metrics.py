"""Per-worker metrics: exact counts on a known dataset, live reads, idle time, all ranks together."""

from __future__ import annotations

import json
import multiprocessing
import time

import pytest
from helpers import ids_of, make_loader, slow_collate, write_dataset
from test_distributed import torchrun

import arrowstream
from arrowstream._worker.metrics import Board, Meter

LAYOUT = [(1000, 250), (600, 200), (400, 400)]   # 2,000 rows in 8 row groups
ROWS, BATCH = 2000, 100
COUNTS = ("rows", "batches", "bytes", "splits_done")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("metrics"), LAYOUT)


def split_totals(dataset, num_workers):
    splits = dataset._plan.splits_for(max(num_workers, 1) * dataset.world_size)
    return len(splits), sum(s.num_bytes for s in splits)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_counts_are_exact_and_times_positive(data, num_workers):
    loader, dataset = make_loader(data, num_workers, batch_size=BATCH, shuffle=True, seed=3)
    dataset.set_epoch(0)
    batches = [ids_of(b) for b in loader]
    m = loader.metrics()
    splits, stored = split_totals(dataset, num_workers)
    assert (m["rows"], m["batches"], m["splits_done"], m["bytes"]) == (ROWS, len(batches), splits, stored)
    assert len(m["workers"]) == max(num_workers, 1)
    for name in COUNTS:
        assert sum(w[name] for w in m["workers"]) == m[name]
    for line in m["workers"]:
        assert line["rank"] == 0 and line["rows"] > 0
        assert line["read_s"] > 0 and line["convert_s"] > 0 and line["elapsed_s"] > 0
        assert 0 < line["utilization"] <= 1
    assert m["rows_per_s"] == pytest.approx(m["rows"] / m["elapsed_s"])
    assert json.loads(json.dumps(m)) == m   # plain numbers, a logger takes them as they are


def test_workers_report_while_the_epoch_runs(data):
    loader, dataset = make_loader(data, 2, batch_size=BATCH, batches_per_transfer=1)
    dataset.set_epoch(0)
    seen, readings = 0, []
    for batch in loader:
        seen += len(ids_of(batch))
        if seen in (200, 1000):
            readings.append(loader.metrics()["rows"])
    assert 200 <= readings[0] <= readings[1] <= ROWS   # what the workers made: handed over, or on its way
    assert readings[0] < ROWS                           # read before the workers were done
    assert loader.metrics()["rows"] == ROWS


def test_idle_time_is_the_time_the_trainer_kept_the_worker_waiting(data):
    loader, dataset = make_loader(data, 0, batch_size=BATCH)
    dataset.set_epoch(0)
    for _ in loader:
        time.sleep(0.01)        # a training step the loader waits for
    m = loader.metrics()
    steps = ROWS // BATCH
    assert m["idle_s"] >= 0.01 * (steps - 1) * 0.95
    assert m["utilization"] < 0.5

    slow, slow_dataset = make_loader(data, 2, batch_size=BATCH, batches_per_transfer=1, prefetch_factor=1)
    slow_dataset.set_epoch(0)
    for _ in slow:
        time.sleep(0.01)
    workers = slow.metrics()["workers"]
    # each worker has its next batch ready long before the trainer asks: most of its time is waiting
    assert all(w["idle_s"] > w["read_s"] + w["convert_s"] for w in workers)


def test_a_collate_fn_and_packing_in_a_worker_count_as_converting_not_waiting(data):
    """A chunk's batches go through ``collate_fn`` and into shared memory after the worker's iterator
    hands the chunk over: that is the worker's work, not time it waited for the trainer."""
    loader, dataset = make_loader(data, 1, batch_size=BATCH, collate_fn=slow_collate)
    dataset.set_epoch(0)
    assert sum(len(ids_of(b)) for b in loader) == ROWS
    (worker,) = loader.metrics()["workers"]
    steps = ROWS // BATCH                       # 20 batches in two chunks of 16 and 4
    assert worker["convert_s"] >= 0.01 * steps
    assert worker["idle_s"] < 0.01 * 8          # the first chunk's 16 collates would be 0.16 s of it


@pytest.mark.parametrize("persistent", [False, True])
def test_counts_add_up_over_epochs_with_workers_restarted_or_kept(data, persistent):
    loader, dataset = make_loader(data, 2, batch_size=BATCH, persistent_workers=persistent,
                                  multiprocessing_context="spawn")
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        assert sum(len(ids_of(b)) for b in loader) == ROWS
        assert loader.metrics()["rows"] == ROWS * (epoch + 1)
    splits, stored = split_totals(dataset, 2)
    m = loader.metrics()
    assert (m["splits_done"], m["bytes"]) == (2 * splits, 2 * stored)


def test_a_resumed_loader_counts_what_it_read_itself(data):
    loader, dataset = make_loader(data, 0, batch_size=BATCH)
    dataset.set_epoch(0)
    for step, _ in enumerate(loader):
        if step == 4:
            state = loader.state_dict()
            break
    resumed, _ = make_loader(data, 0, batch_size=BATCH)
    resumed.load_state_dict(state)
    rest = sum(len(ids_of(b)) for b in resumed)
    assert rest == ROWS - 5 * BATCH
    assert resumed.metrics()["rows"] == rest


def test_flat_metrics_are_one_level_of_numbers(data):
    loader, dataset = make_loader(data, 2, batch_size=BATCH)
    dataset.set_epoch(0)
    list(loader)
    flat = loader.metrics(flat=True)
    assert all(isinstance(v, (int, float)) for v in flat.values())
    assert flat["rows"] == ROWS
    assert flat["rank0/worker0/rows"] + flat["rank0/worker1/rows"] == ROWS
    assert {"rank0/worker1/idle_s", "rank0/worker1/utilization", "utilization"} <= set(flat)


def test_gather_metrics_needs_the_nested_form(data):
    loader, _ = make_loader(data, 0, batch_size=BATCH)
    with pytest.raises(arrowstream.ArgumentTypeError, match="loader.metrics"):
        arrowstream.gather_metrics(loader.metrics(flat=True))


def test_gather_metrics_merges_every_rank(data, tmp_path):
    scenarios = [{"name": "m", "path": data, "num_workers": 2, "epochs": [0], "metrics": True,
                  "options": {"batch_size": BATCH, "shuffle": True, "seed": 1}}]
    per_rank = torchrun(2, {"scenarios": scenarios}, tmp_path)
    gathered = [r["m"]["metrics"] for r in per_rank]
    assert gathered[0] == gathered[1]                  # every rank gets the same merged dict
    merged = gathered[0]
    yielded = sum(len(batch) for r in per_rank for batch in r["m"]["epochs"]["0"])
    trimmed = sum(r["m"]["trimmed"]["0"] for r in per_rank)   # even_batches: equal batches per rank
    assert merged["rows"] == yielded == ROWS - trimmed
    assert sorted((w["rank"], w["worker"]) for w in merged["workers"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["rows"] for r in merged["ranks"]] == [sum(len(b) for b in r["m"]["epochs"]["0"]) for r in per_rank]
    assert merged["batches"] == sum(r["batches"] for r in merged["ranks"])
    flat = arrowstream._worker.metrics.flatten(merged)
    assert flat["rank1/rows"] == merged["ranks"][1]["rows"] and "rank1/worker1/rows" in flat


def _write_forever(board, stop):
    meter = Meter(board.row(0), sources=2)
    while not stop.is_set():
        meter.batch(10, 1, 0.0, 0.0, 0.0, time.perf_counter(), per_source=(7, 3))


def test_a_row_read_while_its_worker_writes_it_is_one_write_whole():
    """The trainer reads a worker's row while the worker writes it (another process): what it reads belongs
    together, the rows of each source add up to the rows (a flaky CI failure before the row had a write count:
    the rows per source were written apart from the rows)."""
    board = Board(1, sources=2)
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    writer = context.Process(target=_write_forever, args=(board, stop), daemon=True)
    writer.start()
    try:
        seen, deadline = set(), time.monotonic() + 30
        while len(seen) < 1000 and time.monotonic() < deadline:
            (line,) = board.read()
            assert line["rows"] == 10 * line["batches"] and line["per_source"] == [7 * line["batches"],
                                                                                    3 * line["batches"]]
            seen.add(line["batches"])
        assert len(seen) >= 1000   # it read while the worker wrote
    finally:
        stop.set()
        writer.join(timeout=10)
