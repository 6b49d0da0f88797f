"""A mixture in a user's own ``StatefulDataLoader`` follows its checkpoint's Iceberg snapshots.

DESIGN.md: a mixture handed to a plain ``StatefulDataLoader(mixture, batch_size=None, num_workers=N)`` keeps the
guarantees. An Iceberg source moved on since the checkpoint (rows appended) is read on the checkpoint's snapshot for
the rest of its epoch: the rows before and after the checkpoint are that snapshot's epoch, each once, in the
uninterrupted run's order. The next epoch does what a dataset's plain path does: the process that loaded the state
(the trainer with ``num_workers=0``, or persistent workers) reads the checkpoint's snapshot whole, as the
uninterrupted run does; workers started afresh for the next epoch are copies of the trainer's mixture, which
torchdata never hands the state, and read the table as it is now (each row once).
"""

from __future__ import annotations

import json

import pytest
from test_mix_refused import APPENDED, FILES, TABLE, _rows, _tamper_seed, table_and_files  # noqa: F401 (the fixture)
from torchdata.stateful_dataloader import StatefulDataLoader

from arrowstream import IcebergDataset, Mixture, errors
from arrowstream._loader.torchdata_state import worker_states

OPTIONS = {"batch_size": 20, "shuffle": True, "seed": 9, "plan_cache": False}
CHECKPOINT_AT = 5   # batches into epoch 0


def _plain(sources, num_workers, persistent=False):
    mixture = Mixture(sources=sources, **OPTIONS)
    return StatefulDataLoader(mixture, batch_size=None, num_workers=num_workers,
                              persistent_workers=persistent), mixture


def _ids(batches):
    return [batch["id"].tolist() for batch in batches]


def _uninterrupted(sources, num_workers, persistent):
    """Epochs 0 and 1 of the mixture as it stands, and the checkpoint taken ``CHECKPOINT_AT`` batches into epoch 0."""
    return _two_epochs(*_plain(sources, num_workers, persistent))


def _two_epochs(loader, mixture):
    """Epochs 0 and 1 of ``loader``'s mixture, and its checkpoint taken ``CHECKPOINT_AT`` batches into epoch 0."""
    epochs, state = [], None
    for epoch in (0, 1):
        mixture.set_epoch(epoch)
        batches = []
        for batch in loader:
            batches.append(batch["id"].tolist())
            if epoch == 0 and len(batches) == CHECKPOINT_AT:
                state = json.loads(json.dumps(loader.state_dict()))
        epochs.append(batches)
    assert state is not None
    return epochs, state


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
def test_a_plain_loader_resumes_the_mixture_on_its_checkpoint_snapshot(table_and_files,  # noqa: F811
                                                                        num_workers, persistent):
    table, sources = table_and_files
    (epoch0, epoch1), state = _uninterrupted(sources, num_workers, persistent)
    assert sorted(i for ids in epoch0 for i in ids) == [*FILES, *TABLE]
    saved = worker_states(state)
    pinned = {s["sources"]["table"]["data"]["snapshot_id"] for s in saved}
    assert len(pinned) == 1

    table.append(_rows(APPENDED))   # the table moves on
    loader, mixture = _plain(sources, num_workers, persistent)
    assert mixture.source_rows() == {"files": 200, "table": 400}
    loader.load_state_dict(state)
    mixture.set_epoch(0)
    rest = _ids(loader)
    # the rest of the checkpoint snapshot's epoch, in the uninterrupted run's order: before + after, each row once
    assert rest == epoch0[CHECKPOINT_AT:]

    mixture.set_epoch(1)
    following = _ids(loader)
    if num_workers == 0 or persistent:   # the process that loaded the state reads on: the checkpoint's snapshot
        assert following == epoch1
    else:   # fresh workers, copies of the trainer's mixture (torchdata hands it no state): the table as it is now
        assert sorted(i for ids in following for i in ids) == [*FILES, *TABLE, *APPENDED]
        assert mixture.source_rows() == {"files": 200, "table": 400}


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
def test_the_next_epoch_is_the_datasets_own(tmp_path, num_workers, persistent):
    """The reference the mixture follows: a dataset in a plain loader, resumed after its table moved on, reads the
    checkpoint's snapshot whole in the next epoch where the process that loaded the state reads it, and the table as
    it is now in fresh workers."""
    from iceberg_tables import make_catalog

    catalog, config = make_catalog(str(tmp_path / "iceberg"))
    table = catalog.create_table("db.events", schema=_rows(TABLE).schema)
    table.append(_rows(TABLE))

    def plain():
        dataset = IcebergDataset(table="db.events", catalog_config=config, **OPTIONS)
        return StatefulDataLoader(dataset, batch_size=None, num_workers=num_workers,
                                  persistent_workers=persistent), dataset

    loader, dataset = plain()
    it = iter(loader)
    before = [i for _ in range(CHECKPOINT_AT) for i in next(it)["id"].tolist()]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    table.append(_rows(APPENDED))
    loader, dataset = plain()
    loader.load_state_dict(state)
    dataset.set_epoch(0)
    assert sorted(before + [i for ids in _ids(loader) for i in ids]) == list(TABLE)
    dataset.set_epoch(1)
    following = sorted(i for ids in _ids(loader) for i in ids)
    assert following == (list(TABLE) if num_workers == 0 or persistent else [*TABLE, *APPENDED])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_mixture_loader_resumes_on_its_checkpoint_snapshot(table_and_files, num_workers):  # noqa: F811
    """The control: ``Mixture.create_dataloader``'s loader follows the snapshot in this epoch and the next."""
    table, sources = table_and_files
    epochs, state = _two_epochs(*Mixture.create_dataloader(sources=sources, num_workers=num_workers, **OPTIONS))
    table.append(_rows(APPENDED))
    loader, mixture = Mixture.create_dataloader(sources=sources, num_workers=num_workers, **OPTIONS)
    loader.load_state_dict(state)
    assert mixture.source_rows() == {"files": 200, "table": 300}
    mixture.set_epoch(0)
    assert _ids(loader) == epochs[0][CHECKPOINT_AT:]
    mixture.set_epoch(1)
    assert _ids(loader) == epochs[1]


def test_a_refused_plain_load_leaves_the_mixture_on_its_own_snapshot(table_and_files):  # noqa: F811
    """A worker state refused after the snapshot is followed (its seed tampered) puts the mixture back on the
    table's current snapshot, with its plans, quotas and layout: the current rows are read, each once."""
    table, sources = table_and_files
    loader, mixture = _plain(sources, 0)
    it = iter(loader)
    for _ in range(CHECKPOINT_AT):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    (saved,) = worker_states(_tamper_seed({"dataloader": state})["dataloader"])
    table.append(_rows(APPENDED))
    loader, mixture = _plain(sources, 0)
    before = (mixture.source_rows(), mixture.files, mixture.quotas(), mixture.history, mixture.epoch,
              mixture.epochs, mixture.schema)
    assert before[0] == {"files": 200, "table": 400}
    with pytest.raises(errors.StateMismatchError, match="seed: saved 10, current 9"):
        mixture.load_state_dict(saved)
    assert (mixture.source_rows(), mixture.files, mixture.quotas(), mixture.history, mixture.epoch,
            mixture.epochs, mixture.schema) == before
    mixture.set_epoch(0)
    assert sorted(i for ids in _ids(loader) for i in ids) == [*FILES, *TABLE, *APPENDED]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("front", ["IcebergDataset", "Mixture"])
def test_a_spawned_worker_that_cannot_follow_the_snapshot_says_so_and_what_to_do(table_and_files, front):  # noqa: F811
    """A plain StatefulDataLoader with spawned workers hands the state to copies that hold no catalog connection:
    they cannot go back to the checkpoint's snapshot, and the error names the class the user built, the snapshots
    and the ways out (arrowstream's loader, fork, a pinned snapshot_id)."""
    table, sources = table_and_files

    def plain():
        if front == "Mixture":
            dataset = Mixture(sources=sources, **OPTIONS)
        else:
            dataset = IcebergDataset(table=sources["table"].table, catalog_config=sources["table"].catalog_config,
                                     **OPTIONS)
        return StatefulDataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context="spawn")

    loader = plain()
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    pinned = worker_states(state)[0]
    pinned = (pinned["sources"]["table"]["data"] if front == "Mixture" else pinned["data"])["snapshot_id"]
    table.append(_rows(APPENDED))
    loader = plain()
    loader.load_state_dict(state)
    with pytest.raises(errors.StateMismatchError,
                       match=rf"snapshot {pinned} .*this {front} is a copy in a worker process started by spawn.*"
                             rf"{front}\.create_dataloader.*multiprocessing_context='fork'.*snapshot_id={pinned}"):
        next(iter(loader))
