"""A refused mixture checkpoint leaves the mixture as it was.

Loading a checkpoint into a mixture follows its Iceberg sources to the checkpoint's snapshots before the checks that
may refuse it (options, quotas, topology). A refusal must put the mixture back on the snapshots it read, with their
plans, quotas and layout, its epoch and history: catch the ``StateError``, iterate, and the current snapshots' rows
are read, each once (before, the checkpoint's snapshot stayed, its rows read and the appended ones never).
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from iceberg_tables import make_catalog
from test_mixing import write_source
from torchdata.stateful_dataloader import StatefulDataLoader

from arrowstream import IcebergSource, Mixture, Source, errors
from arrowstream._loader.torchdata_state import worker_states

FILES, TABLE, APPENDED = range(200), range(500_000, 500_300), range(600_000, 600_100)


@pytest.fixture
def table_and_files(tmp_path):
    """An Iceberg table of ids 500,000..500,299 and a folder of ids 0..199, as a mixture's sources."""
    catalog, config = make_catalog(str(tmp_path / "iceberg"))
    table = catalog.create_table("db.events", schema=_rows(TABLE).schema)
    table.append(_rows(TABLE))
    sources = {"files": Source(write_source(tmp_path / "files", FILES.start, len(FILES))),
               "table": IcebergSource("db.events", catalog_config=config)}
    return table, sources


def _rows(ids: range) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "x": pa.array([0.5] * len(ids), pa.float64())})


def _make(sources, num_workers, **kwargs):
    # weights and epoch_rows left out: an epoch reads every row of each source once
    options = {"batch_size": 20, "shuffle": True, "seed": 9, "plan_cache": False, **kwargs}
    return Mixture.create_dataloader(sources=sources, num_workers=num_workers, **options)


def _checkpoint(sources, num_workers, batches, epoch=1):
    loader, mixture = _make(sources, num_workers)
    mixture.set_epoch(epoch)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return json.loads(json.dumps(loader.state_dict()))


def _tamper_seed(state):
    for saved in worker_states(state["dataloader"]):
        saved["options"]["seed"] = 10
    return state


def _tamper_old_cursor(state):
    """An epoch re-planned already, whose old worker's place in a source says one row more than it took."""
    for saved in worker_states(state["dataloader"]):
        old = next(cursors for cursors in saved["elastic"]["cursors"] if cursors is not None)
        old[min(old)]["taken"] += 1
    return state


def _reading(mixture):
    """What a refused load must leave as it was: the sources' rows and files, quotas, history and epoch."""
    return mixture.source_rows(), mixture.files, mixture.quotas(), mixture.history, mixture.epoch


def _as_it_was(mixture, before):
    """The mixture reads the table's current snapshot, as it did before the refused load."""
    assert mixture.source_rows() == {"files": 200, "table": 400}
    assert _reading(mixture) == before


def _epoch_reads_current_rows_once(loader, mixture, epoch=0):
    mixture.set_epoch(epoch)
    ids = sorted(i for batch in loader for i in batch["id"].tolist())
    assert ids == [*FILES, *TABLE, *APPENDED]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("refusal", ["seed", "weights"])
def test_a_refused_checkpoint_leaves_the_mixture_on_its_own_snapshot(table_and_files, num_workers, refusal):
    table, sources = table_and_files
    state = _checkpoint(sources, num_workers, 3)
    table.append(_rows(APPENDED))   # the table moves on
    if refusal == "seed":
        state, kwargs, match = _tamper_seed(state), {}, "seed: saved 10, current 9"
    else:   # weights 1:2 over the checkpoint's 200 + 300 rows: not its quotas of 200 and 300
        kwargs, match = {"weights": {"files": 1, "table": 2}}, "Mid-epoch, the mixture cannot change"
    loader, mixture = _make(sources, num_workers, **kwargs)
    assert mixture.source_rows() == {"files": 200, "table": 400}
    before = _reading(mixture)
    with pytest.raises(errors.StateMismatchError, match=match):
        loader.load_state_dict(state)
    _as_it_was(mixture, before)
    if refusal == "weights":   # 1:2 of 600 rows is each row once too
        assert mixture.quotas() == {"files": 200, "table": 400}
    _epoch_reads_current_rows_once(loader, mixture)


def test_a_checkpoint_refused_for_its_topology_leaves_the_mixture_on_its_own_snapshot(table_and_files):
    """Another topology: the old workers' options are checked after the snapshot is followed; and so are the old
    cursors an epoch re-planned already keeps, which a re-plan of it again starts from."""
    table, sources = table_and_files
    tampered = _tamper_seed(_checkpoint(sources, 2, 3))
    loader, mixture = _make(sources, 1)   # re-plans the rest of the epoch for one worker
    loader.load_state_dict(_checkpoint(sources, 2, 3))
    mixture.set_epoch(1)
    it = iter(loader)
    next(it)
    twice = json.loads(json.dumps(loader.state_dict()))   # inside an epoch re-planned from 2 workers to 1
    del it
    table.append(_rows(APPENDED))
    for state, match in ((tampered, "seed: saved 10, current 9"),
                         (_tamper_old_cursor(twice), r"elastic\.cursors\[\d\]\.\w+")):
        fresh, fresh_mixture = _make(sources, 2)
        before = _reading(fresh_mixture)
        with pytest.raises(errors.StateError, match=match):
            fresh.load_state_dict(state)
        _as_it_was(fresh_mixture, before)
        _epoch_reads_current_rows_once(fresh, fresh_mixture)


def test_a_refused_worker_state_leaves_the_mixture_as_it_was_in_a_plain_loader(table_and_files):
    """``mixture.load_state_dict`` (a user's own ``StatefulDataLoader``) checks the state in the mixture: a
    refused one leaves it reading what it read."""
    table, sources = table_and_files
    plain = StatefulDataLoader(Mixture(sources=sources, batch_size=20, shuffle=True, seed=9, plan_cache=False),
                               batch_size=None, num_workers=0)
    it = iter(plain)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(plain.state_dict()))
    (saved,) = worker_states(_tamper_seed({"dataloader": state})["dataloader"])
    table.append(_rows(APPENDED))
    mixture = Mixture(sources=sources, batch_size=20, shuffle=True, seed=9, plan_cache=False)
    before = _reading(mixture)
    with pytest.raises(errors.StateMismatchError, match="seed: saved 10, current 9"):
        mixture.load_state_dict(saved)
    _as_it_was(mixture, before)
    loader = StatefulDataLoader(mixture, batch_size=None, num_workers=0)
    loader.load_state_dict(state)
    with pytest.raises(errors.StateMismatchError, match="seed: saved 10, current 9"):
        next(iter(loader))
    _as_it_was(mixture, before)
    _epoch_reads_current_rows_once(StatefulDataLoader(mixture, batch_size=None, num_workers=0), mixture)
