"""Exact resume (DESIGN guarantee 4): the resume matrix of the foundation.

For each loader configuration (workers, split shuffle, persistent workers, shuffle buffer,
interleave) one uninterrupted run over three epochs records every batch
and the state at six points (before the first batch, after it, mid-epoch, after the last
batch inside the loop, after the loop ended, mid next epoch). A fresh loader with the same
arguments loads each state (through JSON) and runs the canonical loop: its batches must equal
the uninterrupted run's from that point on, byte for byte, and every epoch must hold every
row exactly once.
"""

from __future__ import annotations

import functools

import pyarrow.compute as pc
import pytest
from helpers import EPOCHS, POINTS, check_exactly_once, check_resume, make_loader, resume_epochs, run_epochs

import arrowstream.testing

# the uneven dataset's splits are row groups of 120 to 400 rows: a buffer of 100 rows is smaller
# than any of them, one of 700 spans several
ROWS = [(0, 1), (0, 3), (100, 1), (100, 3), (700, 1), (700, 3)]


def _config(nw, shuffle, persistent, buffer, interleave):
    name = (f"workers{nw}-{'shuffle' if shuffle else 'ordered'}{'-persistent' if persistent else ''}"
            f"{f'-buffer{buffer}' if buffer else ''}{f'-interleave{interleave}' if interleave > 1 else ''}")
    return pytest.param(nw, shuffle, persistent, buffer, interleave, id=name)


def _cells(buffer, interleave):
    """Every worker count, order and persistence for the plain pipeline; with a buffer or interleave (the same
    worker code, another stream), 0, 2 and 3 workers and persistent workers once: a lean matrix."""
    if (buffer, interleave) == (0, 1):
        return [(nw, shuffle, persistent) for nw in (0, 1, 2, 3) for shuffle in (False, True)
                for persistent in ((False, True) if nw else (False,))]
    return [(0, True, False), (2, True, False), (2, True, True), (3, True, False)]


CONFIGS = [
    _config(nw, shuffle, persistent, buffer, interleave)
    for buffer, interleave in ROWS
    for nw, shuffle, persistent in _cells(buffer, interleave)
]


@pytest.mark.parametrize(("num_workers", "shuffle", "persistent", "buffer", "interleave"), CONFIGS)
def test_resume_matrix(uneven_dataset, num_workers, shuffle, persistent, buffer, interleave):
    options = {"batch_size": 64, "shuffle": shuffle, "seed": 7, "shuffle_buffer_size": buffer,
               "interleave": interleave}
    if persistent:
        options["persistent_workers"] = True
    check_resume(uneven_dataset, num_workers, options, lambda batches, dataset: check_exactly_once(
        batches, dataset.num_rows))


@pytest.mark.parametrize(("num_workers", "rank"), [(0, 0), (0, 2), (2, 1), (2, 2)])
def test_resume_one_rank_of_three_with_even_batches(uneven_dataset, num_workers, rank):
    """A rank whose workers stop early (even_batches trims them) resumes exactly too; the
    ranks' rows are disjoint and each epoch reads every row of the rank once."""
    options = {"batch_size": 64, "shuffle": True, "seed": 7, "shuffle_buffer_size": 100, "interleave": 2,
               "rank": rank, "world_size": 3}

    def rows_of_epoch(batches, dataset):
        trimmed = dataset.rows_trimmed_per_epoch(num_workers)
        for epoch in EPOCHS:
            ids = [i for e, _, b in batches if e == epoch for i in b]
            assert len(ids) == len(set(ids)) == sum(dataset.slot_rows(num_workers)[
                rank * max(num_workers, 1):(rank + 1) * max(num_workers, 1)]) - trimmed

    check_resume(uneven_dataset, num_workers, options, rows_of_epoch, mid=7)
    trims = [make_loader(uneven_dataset, num_workers, **{**options, "rank": r})[1].rows_trimmed_per_epoch(num_workers)
             for r in range(3)]
    assert any(trims), "the layout makes some rank trim"


def test_epochs_differ_with_shuffle(uneven_dataset):
    loader, dataset = make_loader(uneven_dataset, 2, batch_size=64, shuffle=True, seed=3)
    batches = run_epochs(loader, dataset, [0, 1])
    order0 = [i for e, _, ids in batches if e == 0 for i in ids]
    order1 = [i for e, _, ids in batches if e == 1 for i in ids]
    assert sorted(order0) == sorted(order1)
    assert order0 != order1


def test_runs_are_deterministic(uneven_dataset):
    def run():
        loader, dataset = make_loader(uneven_dataset, 2, batch_size=50, shuffle=True, seed=11)
        return [k for _, k, _ in run_epochs(loader, dataset, [0, 1])]

    assert run() == run()


def test_saved_after_loop_with_next_epoch_number(uneven_dataset):
    """A checkpoint written after the loop, stored with epoch + 1, starts the next epoch whole."""
    make = functools.partial(make_loader, uneven_dataset, 2, batch_size=64, shuffle=True, persistent_workers=True)
    report = arrowstream.testing.check_resume(make, points=[], epochs=2, at_epoch_ends=True)
    assert report.points == report.epoch_ends == (len(make()[0]),)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_with_sparse_snapshots(uneven_dataset, num_workers):
    """snapshot_every_n_steps > 1: torchdata replays the batches since the last snapshot."""
    options = {"batch_size": 64, "shuffle": True, "seed": 1, "snapshot_every_n_steps": 5}
    loader, dataset = make_loader(uneven_dataset, num_workers, **options)
    checkpoints: dict = {}
    reference = run_epochs(loader, dataset, EPOCHS[:2], checkpoints, mid=13)
    for point in POINTS:
        state, consumed, epoch = checkpoints[point]
        fresh_loader, fresh_dataset = make_loader(uneven_dataset, num_workers, **options)
        resumed = resume_epochs(fresh_loader, fresh_dataset, state, epoch, 1)
        assert [k for _, k, _ in resumed] == [k for _, k, _ in reference[consumed:]], point


NEXT_EPOCH_CASES = {
    "plain": {},
    "buffer-interleave": {"shuffle_buffer_size": 100, "interleave": 3},
    "filter": {"filter": pc.field("label") != 6},
    "filter-buffer-interleave": {"filter": pc.field("label") != 6, "shuffle_buffer_size": 700, "interleave": 2},
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("case", list(NEXT_EPOCH_CASES))
@pytest.mark.parametrize("drop_last", [False, True])
def test_last_batch_state_stored_with_next_epoch_number(uneven_dataset, drop_last, case, num_workers):
    """Saved inside the loop after the final batch, stored as epoch + 1: the next epoch is whole,
    also when a filter drops the rows after the last one handed out (only reading tells)."""
    options = {"batch_size": 64, "shuffle": True, "drop_last": drop_last, **NEXT_EPOCH_CASES[case]}
    loader, dataset = make_loader(uneven_dataset, num_workers, **options)
    checkpoints: dict = {}
    reference = run_epochs(loader, dataset, [0, 1], checkpoints, mid=5)
    state, consumed, epoch = checkpoints["last"]
    fresh_loader, fresh_dataset = make_loader(uneven_dataset, num_workers, **options)
    resumed = resume_epochs(fresh_loader, fresh_dataset, state, epoch + 1, 1)
    assert [k for _, k, _ in resumed] == [k for _, k, _ in reference[consumed:]]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("num_workers", "snapshot_every", "drop_last"),
                         [(0, 1, True), (3, 1, False), (3, 2, True), (3, 3, False), (3, 1000, True)])
def test_end_of_epoch_state_stored_with_next_epoch_number(uneven_dataset, num_workers, snapshot_every, drop_last):
    """A state after the last batch (inside the loop or after it), stored as epoch + 1, resumes into
    exactly the uninterrupted next epoch, whatever snapshot_every_n_steps (issue 16: with 3 workers the
    round robin went on from the worker of the saved epoch's last batch; with snapshots every n > 1
    steps, the batches since the snapshot made the next epoch refuse the state)."""
    options = {"batch_size": 64, "shuffle": True, "seed": 5, "drop_last": drop_last}
    if num_workers:
        options["snapshot_every_n_steps"] = snapshot_every
    loader, dataset = make_loader(uneven_dataset, num_workers, **options)
    checkpoints: dict = {}
    reference = run_epochs(loader, dataset, [0, 1], checkpoints, mid=5)
    for point in ("last", "after"):
        state, consumed, epoch = checkpoints[point]
        fresh_loader, fresh_dataset = make_loader(uneven_dataset, num_workers, **options)
        resumed = resume_epochs(fresh_loader, fresh_dataset, state, epoch + 1, 1)
        assert [k for _, k, _ in resumed] == [k for _, k, _ in reference[consumed:]], point
