"""One epoch-layout question for both fronts (#38, item 1): what a slot reads of an epoch (``SlotEpoch``).

A dataset's epochs (``_layout/layout.py``'s ``Epochs``: shares of whole splits by its assignment policy, or an epoch
re-planned from ``Leftovers``) and a mixture's (``_mixing/layout.py``'s ``MixEpochs`` with its history: parts of every
source from quotas and passes) answer the same question, ``EpochLayouts.slot_epoch(slot, epoch)``, and both fronts
open a slot's stream from that answer only (``_worker/open_slot.py``). These tests check that each answer holds the
rows its layout gives the slot, and that what a loader reads follows the answer (a caller that bypassed it, reading
the layout another way, would not).
"""

from __future__ import annotations

import dataclasses
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import write_dataset

from arrowstream import Mixture, Source, StructuredDataset
from arrowstream._core.order import SlotGrid
from arrowstream._layout.layout import Epochs, replanned_leftovers
from arrowstream._layout.share_parts import share_stream
from arrowstream._mixing.layout import MixLayout
from arrowstream._mixing.slot_epoch import EpochLayouts, SlotEpoch
from arrowstream._worker.reader import SplitReader

ROWS = 3130


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """3 files, 3,130 rows, row groups of 250 / 400 / 120 rows."""
    return write_dataset(tmp_path_factory.mktemp("slot_epoch"), [(1000, 250), (1530, 400), (600, 120)])


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("slot_epoch_mix")
    out = {}
    for name, base, rows in (("big", 0, 1000), ("small", 100_000, 10), ("mid", 200_000, 300)):
        os.makedirs(root / name)
        pq.write_table(pa.table({"id": pa.array(range(base, base + rows), pa.int64())}),
                       os.path.join(root / name, "part.parquet"), row_group_size=50)
        out[name] = Source(str(root / name))
    return out


def dataset_of(folder, **options):
    options = {"batch_size": 64, "shuffle": True, "seed": 7, "shuffle_buffer_size": 300, "interleave": 2,
               "rank": 0, "world_size": 1, "plan_locally": True, "output_format": "arrow", **options}
    dataset = StructuredDataset(folder, **options)
    dataset.set_epoch(0)
    return dataset


def mixture_of(sources, **options):
    options = {"weights": {"big": 0.6, "small": 0.1, "mid": 0.3}, "epoch_rows": 500, "batch_size": 32,
               "plan_cache": False, "output_format": "arrow", **options}
    mixture = Mixture(sources, **options)
    mixture.set_epoch(0)
    return mixture


def mixture_layout(mixture) -> MixLayout:
    options = mixture.options
    return mixture.epochs.with_history(mixture.history, even_batches=True, drop_last=options.drop_last,
                                       batch_order=None)


def test_both_fronts_epoch_layouts_answer_the_one_question(folder, sources):
    dataset, mixture = dataset_of(folder), mixture_of(sources)
    assert isinstance(dataset.epochs, EpochLayouts)
    assert isinstance(mixture_layout(mixture), EpochLayouts)
    slot = SlotGrid(1, 2).slot_at(1)
    for answer in (dataset.epochs.slot_epoch(slot, 0), mixture_layout(mixture).slot_epoch(slot, 0)):
        assert isinstance(answer, SlotEpoch)
        assert (answer.slot.epoch, answer.slot.rank, answer.slot.worker_id, answer.slot.num_workers) == (0, 0, 1, 2)


@pytest.mark.parametrize("world_size,num_workers", [(1, 0), (1, 3), (2, 2)])
def test_a_planned_dataset_slots_answer_is_its_share_as_one_source(folder, world_size, num_workers):
    dataset = dataset_of(folder)
    grid = SlotGrid(world_size, num_workers)
    layout = dataset.epochs.layout(0, grid)
    total = 0
    for index in range(grid.num_slots):
        slot = grid.slot_at(index)
        answer = dataset.epochs.slot_epoch(slot, 0)
        assert answer.names == ["dataset"]
        assert answer.sources[0].rows == layout.share(slot).num_rows
        assert sum(part.rows for part in answer.parts("dataset")) == layout.share(slot).num_rows
        assert answer.max_batches == layout.limit(slot)
        assert answer.rows_known and not answer.replanned and answer.batch_order is None
        total += answer.sources[0].rows
    assert total == ROWS


@pytest.mark.parametrize("old_workers,new_workers", [(0, 3), (2, 1), (3, 2)])
def test_a_replanned_dataset_slots_answer_is_its_share_of_the_rows_left(folder, old_workers, new_workers):
    """Old workers stop inside their shuffle windows; each new slot's answer holds its re-planned share's rows, and
    the answers together the rows the old workers left."""
    dataset = dataset_of(folder)
    options = dataset.options
    old_grid = SlotGrid(1, old_workers)
    old = dataset.epochs.layout(0, old_grid)
    reading = dataset.reading()
    saved, seen = [], 0
    for index in range(old_grid.num_slots):
        slot = old_grid.slot_at(index)
        readers = [SplitReader(reading.plan, reading.storage, 65536, use_threads=False)
                   for _ in range(options.interleave)]
        stream = share_stream(readers, old.share(slot), dataset.epochs.start(slot, 0), seed=options.seed,
                              batch_size=options.batch_size, interleave=options.interleave,
                              buffer_rows=options.shuffle_buffer_size, drop_last=False, max_batches=old.limit(slot),
                              rows_known=True)
        for _ in range(3 + 2 * index):
            seen += stream.next_record().num_rows
        saved.append((stream.state(), False))
    dataset.epochs.elastic = replanned_leftovers(old, saved, options.interleave, drops_rows=False)
    new_grid = SlotGrid(1, new_workers)
    layout = dataset.epochs.layout(0, new_grid)
    assert layout.replanned
    left = 0
    for index in range(new_grid.num_slots):
        slot = new_grid.slot_at(index)
        answer = dataset.epochs.slot_epoch(slot, 0)
        share = layout.share(slot)
        assert answer.replanned
        assert sum(part.rows for part in answer.parts("dataset")) == share.num_rows
        assert len(answer.parts("dataset")) == len(share.replays) + (1 if len(share.splits) else 0)
        left += answer.sources[0].rows
    assert left == ROWS - seen


@pytest.mark.parametrize("world_size,num_workers", [(1, 0), (1, 3), (2, 2)])
def test_a_mixture_slots_answer_holds_its_quotas(sources, world_size, num_workers):
    mixture = mixture_of(sources)
    grid = SlotGrid(world_size, num_workers)
    layout = mixture_layout(mixture)
    slot_rows = mixture.epochs.slot_rows(mixture.history, 0, world_size, num_workers)
    totals = dict.fromkeys(mixture.quotas(0), 0)
    for index in range(grid.num_slots):
        answer = layout.slot_epoch(grid.slot_at(index), 0)
        assert answer.names == ["big", "small", "mid"]
        assert {source.name: source.rows for source in answer.sources} == slot_rows[index]
        for source in answer.sources:
            assert sum(part.rows for part in source.parts) == source.rows
            totals[source.name] += source.rows
        assert not answer.replanned and answer.rows_known
    assert totals == mixture.quotas(0) and sum(totals.values()) == 500


def test_a_mixture_slots_answer_has_the_mixtures_limits(sources):
    """``even_batches`` over two ranks: each slot's ``max_batches`` is the mixture's batch limit (one loader check)."""
    mixture = mixture_of(sources, rank=0, world_size=2)
    layout = mixture_layout(mixture)
    grid = SlotGrid(2, 2)
    assert [layout.slot_epoch(grid.slot_at(i), 0).max_batches for i in range(4)] == mixture.batch_limits(2, 0)


def capped(original):
    """``slot_epoch`` of a layout, its answer cut to one batch."""
    def slot_epoch(self, slot, epoch, **kwargs):
        return dataclasses.replace(original(self, slot, epoch, **kwargs), max_batches=1)
    return slot_epoch


def test_a_dataset_reads_what_its_epochs_answer(folder, monkeypatch):
    """The dataset's slot reads the answer: cut to one batch, it yields one (a caller that read the layout another
    way would yield them all)."""
    assert len(list(dataset_of(folder))) == -(-ROWS // 64)
    monkeypatch.setattr(Epochs, "slot_epoch", capped(Epochs.slot_epoch))
    assert len(list(dataset_of(folder))) == 1


def test_a_mixture_reads_what_its_epochs_answer(sources, monkeypatch):
    assert len(list(mixture_of(sources))) == -(-500 // 32)
    monkeypatch.setattr(MixLayout, "slot_epoch", capped(MixLayout.slot_epoch))
    assert len(list(mixture_of(sources))) == 1
