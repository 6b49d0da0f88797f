"""The figures of an epoch under ``assignment="dynamic"`` are asked of the policy and are what its loaders yield
(issue #38 item 3): ``dataset.rank_yields`` per rank (its work's rows, ``len(loader)``, the rows its batches hold),
``slot_rows``/``slot_yields``/``batch_limits`` per slot where a slot is its rank (0 or 1 worker), and a refusal that
says why where a figure per worker is asked of workers that lease at run time; after a re-plan of a checkpoint to
another world size, the re-planned work's. ``arrowstream inspect``'s rank lines are the same figures.

They were the static per-worker (LPT) shares, which no dynamic worker reads, and stayed the planned ones after a
dynamic re-plan (only the policy's own epochs recorded it).
"""

from __future__ import annotations

import json
import warnings

import pytest
from helpers import write_dataset

import arrowstream
from arrowstream import StructuredDataset, TrimWarning
from arrowstream._tools.inspect import describe
from arrowstream.errors import InvalidArgumentError

BATCH, TAKEN = 32, 6
SIZES = [(700, 100), (300, 300), (450, 150), (520, 260), (90, 90), (610, 61), (330, 110)]   # rows, row group
ROWS = sum(rows for rows, _ in SIZES)
OPTIONS = {"even": {}, "drop_last": {"drop_last": True}, "uneven": {"even_batches": False}}
pytestmark = [pytest.mark.timeout(300), pytest.mark.filterwarnings("ignore:This DataLoader will create")]


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("dynamic-figures"), SIZES)


def _loader(path, num_workers, rank, world_size, options):
    return StructuredDataset.create_dataloader(path=path, num_workers=num_workers, rank=rank, world_size=world_size,
                                               batch_size=BATCH, shuffle=True, seed=3, assignment="dynamic",
                                               plan_locally=True, **options)


def _yielded(loader):
    """(batches, rows) the loader yields in its epoch, and ``len(loader)`` before."""
    length = len(loader)
    sizes = [len(batch["id"]) for batch in loader]
    return length, len(sizes), sum(sizes)


def _check_rank(loader, dataset, rank, num_workers, figures, where):
    """The rank's figures (``figures``: every rank's, asked before reading) against what its loader yields."""
    rows, batches, kept = figures[rank]
    length, count, actual = _yielded(loader)
    assert (batches, kept) == (length, actual) == (count, actual), where
    assert rows - kept == dataset.rows_trimmed_per_epoch(num_workers) + dataset.rows_dropped_per_epoch(num_workers), \
        where


def _refused(dataset, num_workers):
    for figures in (dataset.slot_rows, dataset.slot_yields, dataset.batch_limits):
        with pytest.raises(InvalidArgumentError, match="decided at run time") as refusal:
            figures(num_workers)
        assert f"num_workers={num_workers}" in str(refusal.value) and "rank_yields" in str(refusal.value)


@pytest.mark.parametrize("world_size, num_workers", [(2, 3), (3, 2), (1, 2)])
@pytest.mark.parametrize("kind", OPTIONS)
def test_each_ranks_figures_are_what_its_loader_yields(uneven, world_size, num_workers, kind):
    options = OPTIONS[kind]
    every = None
    for rank in range(world_size):
        loader, dataset = _loader(uneven, num_workers, rank, world_size, options)
        figures = dataset.rank_yields(num_workers)
        assert every is None or figures == every, "every rank says the same of every rank"
        every = figures
        assert sum(rows for rows, _, _ in figures) == ROWS
        if dataset.even_batches:
            assert len({batches for _, batches, _ in figures}) == 1, "even_batches: the same batches on every rank"
        _refused(dataset, num_workers)
        # a slot of a rank without workers is the rank: its figures, as a rank with one worker
        assert dataset.slot_yields(0) == dataset.slot_yields(1) == figures
        assert dataset.slot_rows(0) == [rows for rows, _, _ in figures]
        limits = dataset.batch_limits(0)
        assert (limits is None) == (kind == "uneven" or world_size == 1)
        assert limits is None or limits == [batches for _, batches, _ in figures]
        report = describe(dataset, num_workers)
        assert report["slots"] == [] and "decided at run time" in report["workers"]
        assert [(r["rows"], r["batches"], r["rows_yielded"]) for r in report["ranks"]] == figures
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TrimWarning)
            _check_rank(loader, dataset, rank, num_workers, figures, f"rank {rank} of {world_size}, {kind}")


@pytest.mark.parametrize("kind", OPTIONS)
def test_one_worker_is_its_rank(uneven, kind):
    """With one worker per rank a slot is its rank: the per-slot figures answer, and are what the worker yields."""
    for rank in range(2):
        loader, dataset = _loader(uneven, 1, rank, 2, OPTIONS[kind])
        figures = dataset.slot_yields(1)
        assert figures == dataset.rank_yields(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TrimWarning)
            _check_rank(loader, dataset, rank, 1, figures, f"rank {rank}, {kind}")


def _checkpoint(path, world_size, num_workers, options):
    """Every rank of ``world_size`` after ``TAKEN`` batches of epoch 0, merged."""
    states = []
    for rank in range(world_size):
        loader, dataset = _loader(path, num_workers, rank, world_size, options)
        dataset.set_epoch(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TrimWarning)
            for step, _ in enumerate(loader):
                if step + 1 == TAKEN:
                    break
        states.append(loader.state_dict())
    return json.loads(json.dumps(arrowstream.merge_state_dicts(states)))


@pytest.mark.parametrize("num_workers", [2, 1, 0])
@pytest.mark.parametrize("kind", OPTIONS)
def test_a_replanned_epochs_figures_are_the_replanned_works(uneven, num_workers, kind):
    """A checkpoint of 2 ranks x 2 workers re-planned for 3 ranks: each rank's figures are its stretch of the rest,
    as its loader yields it (a re-plan trims at most one batch per rank: no TrimWarning), not the planned epoch's."""
    options = OPTIONS[kind]
    state = _checkpoint(uneven, 2, 2, options)
    every = None
    for rank in range(3):
        loader, dataset = _loader(uneven, num_workers, rank, 3, options)
        planned = dataset.rank_yields(num_workers)
        loader.load_state_dict(state)
        dataset.set_epoch(0)
        figures = dataset.rank_yields(num_workers)
        assert figures != planned and sum(rows for rows, _, _ in figures) < ROWS, "the rest of the epoch"
        assert every is None or figures == every, "every rank says the same of every rank"
        every = figures
        if num_workers <= 1:
            assert dataset.slot_yields(num_workers) == figures
            limits = dataset.batch_limits(num_workers)
            assert limits == (None if kind == "uneven" else [batches for _, batches, _ in figures])
        else:
            _refused(dataset, num_workers)
        report = describe(dataset, num_workers)
        assert [(r["rows"], r["batches"], r["rows_yielded"]) for r in report["ranks"]] == figures
        with warnings.catch_warnings():
            warnings.simplefilter("error", TrimWarning)
            _check_rank(loader, dataset, rank, num_workers, figures, f"rank {rank} of 3, {num_workers} workers, {kind}")


@pytest.mark.parametrize("kind", ["even", "drop_last"])
def test_describe_state_counts_each_ranks_work_with_the_dataset(uneven, kind):
    """A merged dynamic checkpoint of 2 ranks x 2 workers, described with the dataset: each rank's rows of the epoch
    are its work's (``rank_yields``), and what it consumed plus what its resumed loader yields is all of them
    (without the data, several ranks' rows are unknown)."""
    options = OPTIONS[kind]
    state = _checkpoint(uneven, 2, 2, options)
    _, fresh = _loader(uneven, 2, 0, 2, options)   # as the run was built, nothing loaded
    about = arrowstream.describe_state(state, dataset=fresh)
    assert arrowstream.describe_state(state)["epoch_rows"] is None
    figures = fresh.rank_yields(2)
    assert about["epoch_rows"] == sum(kept for _, _, kept in figures)
    for rank in range(2):
        mine = about["ranks"][rank]
        loader, _ = _loader(uneven, 2, rank, 2, options)
        loader.load_state_dict(state)
        _, _, rest = _yielded(loader)
        assert mine["epoch_rows"] == figures[rank][2] == mine["rows"] + rest, f"rank {rank}"
        assert mine["dynamic"]["rows_left"] == rest and not mine["dynamic"]["replanned"]
    assert about["share"] == pytest.approx(about["rows"] / about["epoch_rows"])
    replanned = json.loads(json.dumps(_replanned_checkpoint(uneven, options)))
    _, three = _loader(uneven, 2, 0, 3, options)
    about = arrowstream.describe_state(replanned, dataset=three)
    assert about["epoch_rows"] is None and "re-planned" in about["share_note"]


def _replanned_checkpoint(path, options):
    """A checkpoint of 3 ranks taken inside the epoch re-planned from 2 ranks' (each rank after 2 batches)."""
    state = _checkpoint(path, 2, 2, options)
    states = []
    for rank in range(3):
        loader, dataset = _loader(path, 2, rank, 3, options)
        loader.load_state_dict(state)
        dataset.set_epoch(0)
        for step, _ in enumerate(loader):
            if step + 1 == 2:
                break
        states.append(loader.state_dict())
    return arrowstream.merge_state_dicts(states)


def test_state_show_with_the_data_counts_each_ranks_work(uneven, tmp_path, capfd):
    """``arrowstream state show CKPT --path DATA`` builds the dataset with the checkpoint's options (its assignment
    among them) and counts a dynamic checkpoint's epoch rows as describe_state does with the dataset."""
    from arrowstream import cli

    state = _checkpoint(uneven, 2, 2, {})
    path = tmp_path / "ckpt.json"
    path.write_text(json.dumps(state))
    _, fresh = _loader(uneven, 2, 0, 2, {})
    known = arrowstream.describe_state(state, dataset=fresh)
    assert known["epoch_rows"] == sum(kept for _, _, kept in fresh.rank_yields(2))
    assert cli.main(["state", "show", str(path), "--path", uneven, "--json"]) == 0
    shown = json.loads(capfd.readouterr().out)
    assert (shown["epoch_rows"], shown["rows"], shown["share"]) == (known["epoch_rows"], known["rows"], known["share"])
