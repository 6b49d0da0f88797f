"""The state: JSON types only, small, no paths or credentials (guarantee 6), plain loaders too."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from helpers import make_loader, make_table, resume_epochs, run_epochs
from torchdata.stateful_dataloader import StatefulDataLoader

from arrowstream import StructuredDataset
from arrowstream._state import STATE_VERSION


def _only_json_types(value):
    if isinstance(value, dict):
        return all(isinstance(k, str) and _only_json_types(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_only_json_types(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _state_after(path, batches, num_workers=2, **kwargs):
    loader, dataset = make_loader(path, num_workers, batch_size=8, **kwargs)
    dataset.set_epoch(0)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return loader.state_dict()


def test_state_is_json_types_and_versioned(uneven_dataset):
    state = _state_after(uneven_dataset, 5)
    assert _only_json_types(state)
    assert state["kind"] == "arrowstream.loader" and state["version"] == STATE_VERSION
    assert state["batches_per_transfer"] == 16  # 16384 rows // batch_size 8, capped at 16
    worker = state["dataloader"]["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    assert worker["kind"] == "arrowstream.worker" and worker["version"] == STATE_VERSION
    assert set(worker) == {"kind", "version", "data", "options", "epoch", "slot", "cursor", "counters",
                           "epoch_complete", "elastic"}


def test_state_holds_no_paths_and_no_credentials(uneven_dataset):
    state = json.dumps(_state_after(uneven_dataset, 3, storage_options={"auto_mkdir": False}))
    assert uneven_dataset not in state and "/tmp" not in state and "part-000" not in state
    assert "auto_mkdir" not in state


def test_state_size_does_not_grow_with_rows_or_files(tmp_path):
    few = tmp_path / "few"
    many = tmp_path / "many"
    few.mkdir()
    many.mkdir()
    pq.write_table(make_table(0, 2000), few / "a.parquet", row_group_size=100)
    for i in range(1000):
        pq.write_table(make_table(i * 40, 40), many / f"p-{i:04d}.parquet")
    small = len(json.dumps(_state_after(str(few), 30)))
    large = len(json.dumps(_state_after(str(many), 30)))
    assert large <= small + 16  # only the digits of counters may differ
    assert large < 4096


def test_dataset_in_a_users_own_stateful_dataloader(uneven_dataset):
    """DESIGN: a plain StatefulDataLoader(dataset, batch_size=None, num_workers=N) resumes exactly."""
    def plain(persistent):
        dataset = StructuredDataset(uneven_dataset, batch_size=64, shuffle=True, seed=2)
        return StatefulDataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=persistent), dataset

    for persistent in (False, True):
        loader, dataset = plain(persistent)
        checkpoints: dict = {}
        reference = run_epochs(loader, dataset, [0, 1], checkpoints, mid=12)
        assert len({i for e, _, ids in reference if e == 0 for i in ids}) == dataset.num_rows
        for point in ("first", "mid", "last", "next"):
            state, consumed, epoch = checkpoints[point]
            fresh, fresh_dataset = plain(persistent)
            resumed = resume_epochs(fresh, fresh_dataset, state, epoch, 1)
            assert [k for _, k, _ in resumed] == [k for _, k, _ in reference[consumed:]], point
        # a plain loader's after-the-loop state replays nothing when stored with epoch + 1
        state, consumed, epoch = checkpoints["after"]
        fresh, fresh_dataset = plain(persistent)
        resumed = resume_epochs(fresh, fresh_dataset, state, epoch + 1, 1)
        assert [k for _, k, _ in resumed] == [k for _, k, _ in reference[consumed:]]


def test_v4_worker_state_migrates_to_v5_without_a_snapshot():
    from arrowstream._state import WORKER_KIND, upgrade

    v4 = {"kind": WORKER_KIND, "version": 4, "data": {"fingerprint": "f" * 32, "num_files": 2, "num_rows": 10},
          "options": {}, "epoch": 0, "slot": {"rank": 0, "world_size": 1, "worker_id": 0, "num_workers": 0},
          "cursor": {}, "counters": {}, "epoch_complete": False, "elastic": None}
    v5 = upgrade(v4, WORKER_KIND)
    assert v5["version"] == 5
    assert v5["data"] == {**v4["data"], "snapshot_id": None, "schema_id": None}


def test_a_file_state_is_refused_by_an_iceberg_dataset_and_the_reverse(uneven_dataset, tmp_path):
    import pyarrow as pa
    from iceberg_tables import make_catalog

    from arrowstream import IcebergDataset, errors

    catalog, config = make_catalog(str(tmp_path / "iceberg"))
    catalog.create_table("db.t", schema=pa.schema([("id", pa.int64())])).append(pa.table({"id": [1, 2, 3]}))
    table_state = json.loads(json.dumps(IcebergDataset("db.t", catalog_config=config).state_dict()))
    file_state = json.loads(json.dumps(StructuredDataset(uneven_dataset).state_dict()))
    with pytest.raises(errors.StateMismatchError, match="taken on an Iceberg table, this dataset reads files"):
        StructuredDataset(uneven_dataset).load_state_dict(table_state)
    with pytest.raises(errors.StateMismatchError, match="taken on files, this dataset reads an Iceberg table"):
        IcebergDataset("db.t", catalog_config=config).load_state_dict(file_state)
