"""A dataset's slot, read as a mixture of one source, gives the same batches (#38, "a dataset is a mixture of one
source").

A dataset slot's share of an epoch (its splits, and in an epoch re-planned for another topology the rests of old
workers' shuffle windows first) is a mixture source's parts: a replay is a part that starts at the old worker's
cursor with the old worker's window seeds, the splits are one part with the slot's seeds. These tests read both
ways, the dataset's ``EpochStream`` and a ``MixStream`` of one ``SourceRows``, and compare every batch: the
equivalence that lets the two streams become one without changing a dataset's order (or its checkpoints).
"""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pytest
from helpers import write_dataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arrowstream import StructuredDataset
from arrowstream._core.order import Slot, SlotGrid, window_seed
from arrowstream._layout.layout import replanned_leftovers
from arrowstream._mixing.parts import ListParts, Part
from arrowstream._mixing.stream import MixSlot, MixStream, SourceRows
from arrowstream._state.mixture import MixWorkerState, SourceCursor, SourceEpoch
from arrowstream._worker.reader import SplitReader

SEED = 7


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """3 files, 3,130 rows, row groups of 250 / 400 / 120 rows: splits of unequal sizes."""
    return write_dataset(tmp_path_factory.mktemp("one_source"), [(1000, 250), (1530, 400), (600, 120)])


def dataset_of(folder, batch_size, buffer, interleave):
    dataset = StructuredDataset(folder, batch_size=batch_size, shuffle=True, seed=SEED, shuffle_buffer_size=buffer,
                                interleave=interleave, rank=0, world_size=1, plan_locally=True,
                                output_format="arrow")
    dataset.set_epoch(0)
    return dataset


def ids_of(stream, per_span=3):
    """Every batch's ids, read ``per_span`` batches at a time."""
    out = []
    while True:
        try:
            span, sizes, _, _ = stream.next_span(per_span)
        except StopIteration:
            return out
        ids = span.column("id").to_pylist()
        for size in sizes:
            out.append(ids[:size])
            ids = ids[size:]


def one_source_stream(dataset, slot: Slot, batch_size: int, buffer: int, interleave: int):
    """The slot's epoch as a mixture of one source: its share's replays and splits as parts."""
    share = dataset.epochs.layout(dataset.epoch, slot.grid).share(slot)
    parts = [Part(replay.splits, replay.rows, functools.partial(window_seed, SEED, dataset.epoch, replay.slot),
                  replay.start) for replay in share.replays]
    split_rows = int(sum(split.num_rows for split in share.splits))
    if split_rows:
        parts.append(Part(tuple(share.splits), split_rows, functools.partial(window_seed, SEED, dataset.epoch, slot)))
    rows = sum(part.rows for part in parts)
    reading = dataset.reading()
    readers = [SplitReader(reading.plan, reading.storage, max(batch_size, 65536), use_threads=False)
               for _ in range(interleave)]
    source = SourceRows("", readers, ListParts(parts), batch_size=batch_size, interleave=interleave,
                        buffer_rows=buffer, start=SourceCursor(0, None, 0), url="dataset")
    start = MixWorkerState(epoch=dataset.epoch, rank=slot.rank, world_size=slot.world_size, worker_id=slot.worker_id,
                           num_workers=slot.num_workers, rows=0, batches=0, rows_dropped=0, epoch_complete=False,
                           options={}, history=[], epochs={"": SourceEpoch(0, rows)},
                           cursors={"": SourceCursor(0, None, 0)}, data={})
    mix_slot = MixSlot(dataset.epoch, slot.rank, slot.world_size, slot.worker_id, slot.num_workers)
    return MixStream([source], [rows], cast=lambda name, batch: batch, batch_size=batch_size, drop_last=False,
                     max_batches=None, batch_order=None, seed=SEED, slot=mix_slot, start=start)


def read_both_ways(dataset, grid: SlotGrid, batch_size: int, buffer: int, interleave: int) -> list[int]:
    """Every slot of ``grid`` read as the dataset's stream and as a mixture of one source: the same batches (asserted);
    the ids read, slot after slot."""
    ids = []
    for index in range(grid.num_slots):
        slot = grid.slot_at(index)
        expected = ids_of(dataset.open_epoch(slot, None).stream)
        assert ids_of(one_source_stream(dataset, slot, batch_size, buffer, interleave)) == expected
        ids += [i for batch in expected for i in batch]
    return ids


settings_ = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
configs = st.tuples(st.sampled_from([7, 64, 256]), st.sampled_from([0, 300, 1000]), st.sampled_from([1, 2, 3]))


@settings_
@given(config=configs, num_workers=st.sampled_from([0, 2, 3]))
def test_a_planned_epoch_is_the_same_read_as_one_source(folder, config, num_workers):
    batch_size, buffer, interleave = config
    dataset = dataset_of(folder, batch_size, buffer, interleave)
    grid = SlotGrid(1, num_workers)
    every = read_both_ways(dataset, grid, batch_size, buffer, interleave)
    assert sorted(every) == list(range(3130))


@settings_
@given(config=configs, old_workers=st.sampled_from([0, 2]), new_workers=st.sampled_from([1, 3]),
       stops=st.lists(st.integers(0, 40), min_size=2, max_size=2))
def test_a_replanned_epoch_is_the_same_read_as_one_source(folder, config, old_workers, new_workers, stops):
    """Old workers stop after some batches (inside shuffle windows, most of the time); the new workers' shares
    (replays of the old windows, then ranges) read as parts give the same batches."""
    batch_size, buffer, interleave = config
    dataset = dataset_of(folder, batch_size, buffer, interleave)
    old_grid = SlotGrid(1, old_workers)
    old = dataset.epochs.layout(0, old_grid)
    saved, seen = [], []
    for index in range(old_grid.num_slots):
        stream = dataset.open_epoch(old_grid.slot_at(index), None).stream
        for _ in range(stops[index % len(stops)]):
            try:
                seen += stream.next_record().column("id").to_pylist()
            except StopIteration:
                break
        saved.append((stream.state(), False))
    dataset.epochs.elastic = replanned_leftovers(old, saved, interleave, drops_rows=False)
    new_grid = SlotGrid(1, new_workers)
    rest = read_both_ways(dataset, new_grid, batch_size, buffer, interleave)
    assert sorted(seen + rest) == list(range(3130)), "the re-planned epoch reads every row left once"
    assert np.intersect1d(seen, rest).size == 0
    assert pa.array(rest).null_count == 0
