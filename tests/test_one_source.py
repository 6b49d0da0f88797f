"""A dataset's slot, read as a mixture of one source, gives the same batches (#38, "a dataset is a mixture of one
source").

A dataset slot's share of an epoch (its splits, and in an epoch re-planned for another topology the rests of old
workers' shuffle windows first) is a mixture source's parts: a replay is a part that starts at the old worker's
cursor with the old worker's window seeds, the splits are one part with the slot's seeds. These tests read both
ways, the dataset's ``EpochStream`` and a ``MixStream`` of one ``SourceRows``, and compare every batch: the
equivalence that lets the two streams become one without changing a dataset's order (or its checkpoints).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers import write_dataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arrowstream import StructuredDataset
from arrowstream._core.order import Slot, SlotGrid
from arrowstream._layout.layout import replanned_leftovers
from arrowstream._layout.share_parts import share_parts
from arrowstream._mixing.stream import MixSlot, MixStream, SourceRows
from arrowstream._state.mixture import MixWorkerState, SourceCursor, SourceEpoch
from arrowstream._worker.reader import SplitReader

SEED = 7


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """3 files, 3,130 rows, row groups of 250 / 400 / 120 rows: splits of unequal sizes."""
    return write_dataset(tmp_path_factory.mktemp("one_source"), [(1000, 250), (1530, 400), (600, 120)])


def dataset_of(folder, batch_size, buffer, interleave, **options):
    options = {"rank": 0, "world_size": 1, **options}
    dataset = StructuredDataset(folder, batch_size=batch_size, shuffle=True, seed=SEED, shuffle_buffer_size=buffer,
                                interleave=interleave, plan_locally=True, output_format="arrow", **options)
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
    """The slot's epoch as a mixture of one source: its share's replays and splits as parts (rows known only by
    reading with a filter or bad rows skipped; the epoch complete when a batch past its last is asked for, as a
    dataset's stream says)."""
    layout = dataset.epochs.layout(dataset.epoch, slot.grid)
    parts = share_parts(layout.share(slot), seed=SEED, epoch=dataset.epoch, slot=slot)
    rows = parts.rows
    reading = dataset.reading()
    readers = [SplitReader(reading.plan, reading.storage, max(batch_size, 65536), use_threads=False)
               for _ in range(interleave)]
    options = dataset.options
    source = SourceRows("", readers, parts, batch_size=batch_size, interleave=interleave,
                        buffer_rows=buffer, start=SourceCursor(0, None, 0), url="dataset",
                        rows_known=not options.drops_rows)
    start = MixWorkerState(epoch=dataset.epoch, rank=slot.rank, world_size=slot.world_size, worker_id=slot.worker_id,
                           num_workers=slot.num_workers, rows=0, batches=0, rows_dropped=0, epoch_complete=False,
                           options={}, history=[], epochs={"": SourceEpoch(0, rows)},
                           cursors={"": SourceCursor(0, None, 0)}, data={})
    mix_slot = MixSlot(dataset.epoch, slot.rank, slot.world_size, slot.worker_id, slot.num_workers)
    return MixStream([source], [rows], cast=lambda name, batch: batch, batch_size=batch_size,
                     drop_last=options.drop_last, max_batches=layout.limit(slot), batch_order=None, seed=SEED,
                     slot=mix_slot, start=start, ends_when_asked=True)


def counters(state):
    """A worker state's counters, a dataset's or a mixture's."""
    return state.rows, state.batches, state.rows_dropped, state.epoch_complete


def read_in_step(epoch_stream, mix_stream, per_span):
    """Both streams, ``per_span`` batches at a time (0: one record at a time): the same batches, the same counters
    after each batch and at the end (asserted); the ids read."""
    out = []
    while True:
        if per_span:
            try:
                span, sizes, positions, _ = epoch_stream.next_span(per_span)
            except StopIteration:
                with pytest.raises(StopIteration):
                    mix_stream.next_span(per_span)
                break
            mix_span, mix_sizes, mix_positions, _ = mix_stream.next_span(per_span)
            assert mix_sizes == sizes and mix_span.column("id").equals(span.column("id"))
            for position, mix_position in zip(positions, mix_positions, strict=True):
                assert counters(epoch_stream.state(position)) == counters(mix_stream.state(mix_position))
        else:
            try:
                span = epoch_stream.next_record()
            except StopIteration:
                with pytest.raises(StopIteration):
                    mix_stream.next_record()
                break
            assert mix_stream.next_record().column("id").equals(span.column("id"))
        assert counters(epoch_stream.state()) == counters(mix_stream.state())
        out += span.column("id").to_pylist()
    assert counters(epoch_stream.state()) == counters(mix_stream.state())
    assert mix_stream.state().epoch_complete
    return out


def read_both_ways(dataset, grid: SlotGrid, batch_size: int, buffer: int, interleave: int) -> list[int]:
    """Every slot of ``grid`` read as the dataset's stream and as a mixture of one source: the same batches (asserted);
    the ids read, slot after slot."""
    ids = []
    for index in range(grid.num_slots):
        slot = grid.slot_at(index)
        expected = ids_of(dataset.open_epoch(slot, None).stream)
        assert ids_of(one_source_stream(dataset, slot, batch_size, buffer, interleave)) == expected
        ids += [i for batch in expected for i in batch]
        for per_span in (0, 2):
            assert read_in_step(dataset.open_epoch(slot, None).stream,
                                one_source_stream(dataset, slot, batch_size, buffer, interleave), per_span) == \
                [i for batch in expected for i in batch]
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


NONE = (pc.field("label") == 3) & (pc.field("label") == 4)   # no row, and no row group's statistics tell
FILTERS = {
    "sevenths": pc.field("label") != 3,   # label = id % 7
    "none": NONE,
    # row groups 250 rows (file 0), 400 (file 1), 120 (file 2): whole splits and whole files filtered out while
    # reading (NONE keeps statistics from pruning them at planning), and a split of which one row is left
    "holes": ((pc.field("id") >= 300) & (pc.field("id") < 1000)) | (pc.field("id") == 1400)
    | (pc.field("id") >= 2900) | NONE,
}


@settings_
@given(config=configs, num_workers=st.sampled_from([0, 2, 3]), kept=st.sampled_from(sorted(FILTERS)),
       drop_last=st.booleans())
def test_a_filtered_epoch_is_the_same_read_as_one_source(folder, config, num_workers, kept, drop_last):
    """With a filter a part's rows are known only by reading: parts of none, whole splits filtered out, a last
    batch short or dropped (and counted) give the same batches and counters."""
    batch_size, buffer, interleave = config
    dataset = dataset_of(folder, batch_size, buffer, interleave, filter=FILTERS[kept], drop_last=drop_last)
    every = read_both_ways(dataset, SlotGrid(1, num_workers), batch_size, buffer, interleave)
    ids = pa.array(range(3130), pa.int64())
    table = pa.table({"id": ids, "label": pc.cast(pc.remainder(ids, 7), pa.int8())})
    wanted = table.filter(FILTERS[kept]).column("id").to_pylist()
    assert set(every) <= set(wanted) and len(every) == len(set(every))
    if not drop_last:
        assert sorted(every) == wanted


@settings_
@given(config=configs, num_workers=st.sampled_from([0, 2]), drop_last=st.booleans())
def test_an_evened_epoch_is_the_same_read_as_one_source(folder, config, num_workers, drop_last):
    """With even_batches each slot stops at its limit without reading what it trims; drop_last counts its drops."""
    batch_size, buffer, interleave = config
    for rank in (0, 1):
        dataset = dataset_of(folder, batch_size, buffer, interleave, rank=rank, world_size=2, drop_last=drop_last,
                             even_batches=True)
        read_both_ways(dataset, SlotGrid(2, num_workers), batch_size, buffer, interleave)


def test_bad_rows_skipped_are_the_same_read_as_one_source(tmp_path):
    """bad_rows="skip" leaves rows out while reading: the same batches and counters."""
    lines = ["id,x"] + [f"{i},{i * 0.5}" if i % 97 != 5 else f"{i},a,b" for i in range(3000)]
    path = tmp_path / "rows.csv"
    path.write_text("\n".join(lines) + "\n")
    for interleave, buffer in ((1, 0), (2, 500)):
        dataset = StructuredDataset(str(path), format="csv", batch_size=64, split_bytes=4096, shuffle=True, seed=SEED,
                                    shuffle_buffer_size=buffer, interleave=interleave, rank=0, world_size=1,
                                    plan_locally=True, output_format="arrow",
                                    parse_options={"bad_rows": "skip", "column_types": {"id": "int64"}})
        dataset.set_epoch(0)
        every = read_both_ways(dataset, SlotGrid(1, 2), 64, buffer, interleave)
        assert sorted(every) == [i for i in range(3000) if i % 97 != 5]
