"""Dynamic assignment's core in one process: several workers' streams leasing from one pool, batches
taken in a random order (a straggler's timing), a checkpoint anywhere, and the rest read by another
number of workers: every row once."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arrowstream import StructuredDataset
from arrowstream._dynamic import (
    Leases,
    LeasedShare,
    LocalPool,
    fresh_work,
    lease_bounds,
    leased_runs,
    remaining_work,
)
from arrowstream._order import SlotGrid
from arrowstream._reader import SplitReader
from arrowstream._stream import RunQueue


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("dyn")
    start = 0
    for f, rows in enumerate([700, 130, 1000, 45, 520, 300, 990, 64]):
        ids = np.arange(start, start + rows)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), root / f"part-{f}.parquet", row_group_size=100)
        start += rows
    return str(root), start


class Worker:
    """One worker's stream over leases, as a worker process reads it (without the process)."""

    def __init__(self, dataset, leases, pool, worker, num_workers, epoch, batch_size):
        options = dataset._options
        self.slot = SlotGrid(1, num_workers).slot(0, worker)
        readers = [SplitReader(dataset._plan, dataset._storage, 65536, use_threads=False)
                   for _ in range(options.interleave)]
        self.share = LeasedShare(leases, lambda: pool.take(worker))
        runs = leased_runs(readers, self.share, seed=options.seed, epoch=epoch, slot=self.slot,
                           batch_size=batch_size, interleave=options.interleave,
                           buffer_rows=options.shuffle_buffer_size)
        from arrowstream._dynamic import start_cursor
        self.queue = RunQueue(runs, start_cursor(options.interleave))
        self.batch_size = batch_size
        self.done = False
        self.delivered = self.queue.cursor

    def next_batch(self):
        self.queue.fill(self.batch_size)
        if self.queue.buffered == 0:
            self.done = True
            return None
        batch = self.queue.take(min(self.batch_size, self.queue.buffered))
        self.delivered = self.queue.cursor
        return batch


def run(dataset, work, num_workers, epoch, batch_size, stop_after=None, rng=None, slow=None):
    """Batches of ``work`` by ``num_workers`` workers, taken in a random order; stops after ``stop_after``
    batches (a checkpoint) and returns the ids handed out, the batch sizes and the rest of the work."""
    leases = Leases(work, batch_size, num_workers)
    pool = LocalPool(len(leases))
    workers = [Worker(dataset, leases, pool, w, num_workers, epoch, batch_size) for w in range(num_workers)]
    ids, sizes = [], []
    rng = rng or random.Random(0)
    while any(not w.done for w in workers):
        if stop_after is not None and len(sizes) >= stop_after:
            break
        live = [w for w in workers if not w.done]
        # the slow worker is picked rarely: a straggler
        weights = [0.1 if slow is not None and w is workers[slow] else 1.0 for w in live]
        worker = rng.choices(live, weights)[0]
        batch = worker.next_batch()
        if batch is not None:
            ids += batch.column("id").to_pylist()
            sizes.append(batch.num_rows)
    options = dataset._options
    cursors = [None if w.done else w.delivered for w in workers]
    rest = remaining_work(leases, pool.owners, cursors, [w.slot for w in workers], batch_size=batch_size,
                          interleave=options.interleave, buffer_rows=options.shuffle_buffer_size)
    return ids, sizes, rest, leases


@pytest.mark.parametrize("options", [{}, {"shuffle": True}, {"shuffle": True, "shuffle_buffer_size": 150},
                                     {"shuffle": True, "shuffle_buffer_size": 70, "interleave": 2},
                                     {"interleave": 3}])
def test_every_row_once_through_checkpoints_and_other_worker_counts(folder, options):
    path, total = folder
    batch_size = 32
    dataset = StructuredDataset(path, batch_size=batch_size, plan_cache=False, seed=3, **options)
    rng = random.Random(7)
    for trial in range(6):
        work = fresh_work(dataset._plan, 1, 0, trial, dataset._options, even_batches=False)
        seen, all_sizes = [], []
        workers = rng.choice([1, 2, 3, 4])
        while True:
            stop = rng.choice([None, 1, 3, 9, 20])
            ids, sizes, work, leases = run(dataset, work, workers, trial, batch_size, stop, rng, slow=0)
            seen += ids
            all_sizes += sizes
            if work.num_rows == 0:
                break
            workers = rng.choice([1, 2, 3, 4])   # elastic: the rest read by another number of workers
        assert len(seen) == total and sorted(seen) == list(range(total)), (trial, len(seen))
        # whole batches, except the last of the epoch
        assert all(s == batch_size for s in all_sizes[:-1]) or sorted(all_sizes).count(total % batch_size) <= 1
        assert sum(1 for s in all_sizes if s < batch_size) <= 1, all_sizes
        assert len(all_sizes) == -(-total // batch_size)


def test_leases_hold_whole_batches_and_the_tail_is_cut_small():
    rows = np.array([1000, 30, 5000, 700, 12, 64_000, 999, 3], dtype=np.int64)
    bounds = lease_bounds(rows, 64, 4)
    sizes = np.diff(bounds)
    assert bounds[0] == 0 and bounds[-1] == rows.sum()
    assert (sizes[:-1] % 64 == 0).all() and (sizes > 0).all()
    tail = rows.sum() // 8
    assert sizes[bounds[1:] > rows.sum() - tail].max() <= max(64, rows.sum() // (4 * 32))
