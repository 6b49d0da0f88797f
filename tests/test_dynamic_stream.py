"""A dynamic worker's leases read by the one stream give the same batches and worker states as before (#38).

Under ``assignment="dynamic"`` a worker's leased share (replays of old workers' windows, then splits, leased while
it reads) is one source's parts that grow as it reads (``arrowstream._layout.leased_parts``), read by a ``MixStream``
of one ``SourceRows`` whose rows are known only by reading, the last rows stitched with other workers' as pieces.
These tests read the same work both ways, the frozen ``EpochStream`` over ``leased_runs``
(``tests/reference_stream.py``: how a dynamic worker read before) and ``leased_stream``, each with its own pool, the
workers taking turns in the same seeded order: every batch and piece is the same, with the same tag, and the worker
state after each (cursor with replay_index / replay_offset, counters, the end) is the same, so the ledger a
checkpoint saves is unchanged. A checkpoint taken anywhere leaves a rest (replays of windows with a shuffle buffer)
that is read again both ways by another number of workers; every row is handed out once.
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from reference_stream import EpochStream, leased_runs

from arrowstream import StructuredDataset
from arrowstream._assignment.dynamic_epoch import start_state
from arrowstream._core.cursor import Cursor
from arrowstream._core.order import SlotGrid
from arrowstream._layout.leased_parts import END, leased_stream
from arrowstream._layout.leases import Leases, LocalPool, last_pieces
from arrowstream._layout.ledger import LeasedShare, fresh_work, remaining_work
from arrowstream._worker.reader import SplitReader

FILTERS = {
    None: None,
    "every third": pc.field("label") != 0,   # label = id % 3
    "whole groups": (pc.field("id") < 300) | (pc.field("id") >= 800),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """6 files, 1,679 rows, row groups of 60 rows: splits and leases of unequal sizes."""
    root = tmp_path_factory.mktemp("dynstream")
    start = 0
    for index, rows in enumerate([400, 90, 530, 45, 300, 314]):
        ids = np.arange(start, start + rows)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5, "label": ids % 3}), root / f"part-{index}.parquet", row_group_size=60)
        start += rows
    return str(root), start


class Both:
    """One worker read both ways: the reference (``EpochStream`` over ``leased_runs``) and the one stream, each over
    its own pool of the same leases."""

    def __init__(self, dataset, leases, pools, worker, num_workers, epoch, stitch):
        options = dataset._options
        self.slot = slot = SlotGrid(1, num_workers).slot(0, worker)
        start = start_state(dataset.identity, dataset.state_options, epoch, slot, options.interleave)
        size = options.batch_size

        def readers():
            return [SplitReader(dataset._plan, dataset._storage, 65536, use_threads=False)
                    for _ in range(options.interleave)]

        def last(pool):
            if not stitch:
                return None
            return lambda: last_pieces(np.diff(leases.bounds), pool.owners(), worker, num_workers, size)

        old_pool, new_pool = pools
        self.old_share = LeasedShare(leases, lambda: old_pool.take(worker))
        runs = leased_runs(readers(), self.old_share, seed=options.seed, epoch=epoch, slot=slot, batch_size=size,
                           interleave=options.interleave, buffer_rows=options.shuffle_buffer_size)
        self.old = EpochStream(runs=runs, end=END, batch_size=size, drop_last=False, max_batches=None,
                               convert=lambda batch: batch, data=dataset.identity, options=dataset.state_options,
                               epoch=epoch, slot=slot, start=start, last_pieces=last(old_pool))
        self.new_share = LeasedShare(leases, lambda: new_pool.take(worker))
        self.new = leased_stream(readers(), self.new_share, start, seed=options.seed, batch_size=size,
                                 interleave=options.interleave, buffer_rows=options.shuffle_buffer_size,
                                 last_pieces=last(new_pool))
        assert self.old.state() == self.new.state()
        self.done = False
        self.delivered = self.old.state().cursor   # after its last batch that is not a piece
        self.stitching = False

    def step(self, by_span):
        """The next batch (or piece) both ways, compared with the state after it: (ids, tag), None at the end."""
        if by_span:
            item = self._span()
        else:
            item = self._record()
        assert self.old.state() == self.new.state()
        assert self.old.position() == self.new.position()
        assert self.old_share.taken == self.new_share.taken
        if item is None:
            self.done = True
            assert self.new.state().epoch_complete and self.new.state().cursor == END
        elif item[1] is None and not self.stitching:
            self.delivered = self.old.state().cursor
        else:
            self.stitching = True
        return item

    def look_ahead(self, rows):
        """Whether ``rows`` rows are left, both ways (reading ahead, leasing as it goes): the same, and the same state
        (reading ahead moves neither the cursor nor the counters)."""
        assert self.old.holds(rows) == self.new.holds(rows)
        assert self.old.state() == self.new.state()
        assert self.old_share.taken == self.new_share.taken

    def _record(self):
        try:
            old = self.old.next_record()
        except StopIteration:
            with pytest.raises(StopIteration):
                self.new.next_record()
            old_piece, new_piece = self.old.next_piece(), self.new.next_piece()
            if old_piece is None:
                assert new_piece is None
                return None
            assert new_piece is not None and new_piece[0] == old_piece[0]
            assert new_piece[1].column("id").equals(old_piece[1].column("id"))
            return old_piece[1].column("id").to_pylist(), old_piece[0]
        new = self.new.next_record()
        assert new.column("id").equals(old.column("id"))
        return old.column("id").to_pylist(), None

    def _span(self):
        """Up to 3 batches as a span both ways (the positions after each compared), then records."""
        try:
            span, sizes, positions, _ = self.old.next_span(3)
        except StopIteration:
            with pytest.raises(StopIteration):
                self.new.next_span(3)
            return self._record()
        new_span, new_sizes, new_positions, _ = self.new.next_span(3)
        assert new_sizes == sizes and new_span.column("id").equals(span.column("id"))
        for position, new_position in zip(positions, new_positions, strict=True):
            assert self.old.state(position) == self.new.state(new_position)
        return span.column("id").to_pylist(), None


def read_both_ways(dataset, work, num_workers, epoch, rng, stop, by_span):
    """``work`` read by ``num_workers`` workers both ways, in turns drawn by ``rng``, up to ``stop`` steps (None: to
    the end): the ids handed out outside pieces, and the rest of the work once they are delivered."""
    options = dataset._options
    leases = Leases(work, options.batch_size, num_workers)
    pools = LocalPool(len(leases)), LocalPool(len(leases))
    stitch = num_workers > 1 and not options.drops_rows   # as DynamicAssignment.stitches_last_rows
    workers = [Both(dataset, leases, pools, worker, num_workers, epoch, stitch) for worker in range(num_workers)]
    ids, pieces, steps = [], [], 0
    while any(not worker.done for worker in workers) and (stop is None or steps < stop):
        worker = rng.choice([worker for worker in workers if not worker.done])
        if rng.random() < 0.25:
            worker.look_ahead(rng.choice([1, options.batch_size, 3 * options.batch_size]))
        item = worker.step(by_span and rng.random() < 0.5)
        steps += 1
        if item is not None:
            (pieces if worker.stitching else ids).append(item[0])
    assert list(pools[0].owners()) == list(pools[1].owners())
    if stop is None:
        ids += pieces
    # every piece handed out at the end (None: each worker handed out everything it leased)
    delivered = [None if stop is None else worker.delivered for worker in workers]
    rest = remaining_work(leases, pools[0].owners(), delivered,
                          [worker.slot for worker in workers], batch_size=options.batch_size,
                          interleave=options.interleave, buffer_rows=options.shuffle_buffer_size)
    return [i for batch in ids for i in batch], rest


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch_size=st.sampled_from([1, 7, 32, 100, 257]), buffer=st.sampled_from([0, 45, 300]),
       interleave=st.integers(1, 3), workers=st.integers(1, 4), later=st.integers(1, 4),
       kept=st.sampled_from(sorted(FILTERS, key=str)), stop=st.one_of(st.none(), st.integers(0, 40)),
       shuffle=st.booleans(), by_span=st.booleans(), seed=st.integers(0, 2**16))
@example(batch_size=32, buffer=45, interleave=2, workers=3, later=2, kept=None, stop=7, shuffle=True, by_span=False,
         seed=1)   # a rest with replays of windows, read by two workers that stitch their last rows
@example(batch_size=7, buffer=0, interleave=3, workers=2, later=3, kept="whole groups", stop=5, shuffle=True,
         by_span=True, seed=2)   # a filter: rows known by reading, no stitching
def test_a_dynamic_worker_reads_its_leases_through_the_one_stream_as_before(
        folder, batch_size, buffer, interleave, workers, later, kept, stop, shuffle, by_span, seed):
    path, _ = folder
    if kept is not None:
        buffer = 0   # dynamic refuses a filter with a shuffle buffer
    dataset = StructuredDataset(path, batch_size=batch_size, plan_cache=False, seed=seed % 5, shuffle=shuffle,
                                shuffle_buffer_size=buffer, interleave=interleave, filter=FILTERS[kept],
                                assignment="dynamic")
    epoch = seed % 3
    rng = random.Random(seed)
    work = fresh_work(dataset._plan, 1, 0, epoch, dataset._options, even_batches=False)
    first, rest = read_both_ways(dataset, work, workers, epoch, rng, stop, by_span)
    then, left = read_both_ways(dataset, rest, later, epoch, rng, None, by_span)
    assert left.num_rows == 0
    wanted = pa.concat_tables(pq.read_table(f"{path}/part-{index}.parquet") for index in range(6))
    if kept is not None:
        wanted = wanted.filter(FILTERS[kept])
    assert sorted(first + then) == sorted(wanted.column("id").to_pylist())


def test_where_a_worker_stands_between_its_last_replay_and_its_splits_is_as_before(folder):
    """A batch that ends a replay exactly, then a look ahead into the splits (opened before, by reading ahead): the
    worker stands past the replays (``replay_index``), not yet at its splits' first cursor, as ``EpochStream`` stood."""
    path, _ = folder
    options = {"plan_cache": False, "seed": 3, "shuffle": True, "shuffle_buffer_size": 45, "interleave": 1,
               "assignment": "dynamic"}
    dataset = StructuredDataset(path, batch_size=32, **options)
    work = fresh_work(dataset._plan, 1, 0, 0, dataset._options, even_batches=False)
    _, rest = read_both_ways(dataset, work, 3, 0, random.Random(1), 7, False)
    assert rest.replays, "a checkpoint inside shuffle windows leaves replays"
    replays = len(rest.replays)
    first = sum(replay.rows for replay in rest.replays)
    ended = StructuredDataset(path, batch_size=first, **options)   # one batch: the replays, exactly
    leases = Leases(rest, first, 1)
    worker = Both(ended, leases, (LocalPool(len(leases)), LocalPool(len(leases))), 0, 1, 0, False)
    worker.look_ahead(first + 1)   # reads into the splits
    ids, _ = worker.step(False)
    assert len(ids) == first and worker.new.state().cursor.replay_index == replays
    worker.look_ahead(1)   # stands in the splits' part now, none of its rows handed out
    assert worker.new.state().cursor == Cursor((), 0, replay_index=replays)
    while worker.step(False) is not None:
        pass
