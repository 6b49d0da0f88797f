"""The state: JSON types only, small, no paths or credentials (guarantee 6), plain loaders too."""

from __future__ import annotations

import copy
import json

import pyarrow.parquet as pq
import pytest
from helpers import ids_of, make_loader, make_table, resume_epochs, run_epochs, write_dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from torchdata.stateful_dataloader import StatefulDataLoader

from arrowstream import StructuredDataset, errors, merge_state_dicts
from arrowstream._core.cursor import Cursor
from arrowstream._loader.torchdata_state import iterator_finished, steps_since_snapshot, worker_state
from arrowstream._state.versions import STATE_VERSION


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
    worker = worker_state(state["dataloader"], 0)
    assert worker["kind"] == "arrowstream.worker" and worker["version"] == STATE_VERSION
    assert set(worker) == {"kind", "version", "reads", "data", "options", "epoch", "slot", "cursor", "counters",
                           "epoch_complete", "elastic"} and worker["reads"] == "dataset"


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
    from arrowstream._state.versions import MIGRATIONS, WORKER_KIND, upgrade

    v4 = {"kind": WORKER_KIND, "version": 4, "data": {"fingerprint": "f" * 32, "num_files": 2, "num_rows": 10},
          "options": {}, "epoch": 0, "slot": {"rank": 0, "world_size": 1, "worker_id": 0, "num_workers": 0},
          "cursor": {}, "counters": {}, "epoch_complete": False, "elastic": None}
    v5 = MIGRATIONS[(WORKER_KIND, 4)](v4)
    assert v5["data"] == {**v4["data"], "snapshot_id": None, "schema_id": None}
    assert upgrade(v4, WORKER_KIND)["data"] == v5["data"]


def test_v5_worker_state_migrates_to_v6_on_planning_version_1():
    """Every state before v6 was taken on the splits planning version 1 cut (issue #19, point 3)."""
    from arrowstream._state.versions import MIGRATIONS, STATE_VERSION, WORKER_KIND, upgrade

    v5 = {"kind": WORKER_KIND, "version": 5, "data": {}, "options": {"batch_size": 4, "even_batches": True},
          "epoch": 0, "slot": {}, "cursor": {}, "counters": {}, "epoch_complete": False, "elastic": None}
    v6 = MIGRATIONS[(WORKER_KIND, 5)](v5)
    assert v6["options"] == {"batch_size": 4, "even_batches": True, "planning": 1}
    assert STATE_VERSION >= 6 and upgrade(v5, WORKER_KIND)["options"]["planning"] == 1


def test_the_package_docstrings_show_the_current_state_version():
    """_checkpoint's docstring showed a merged checkpoint of version 4 after v5 (issue #18, point 6)."""
    import pathlib
    import re

    import arrowstream

    package = pathlib.Path(arrowstream.__file__).parent
    shown = {(path.relative_to(package).as_posix(), int(version)) for path in package.rglob("*.py")
             for version in re.findall(r'"version": (\d+)', path.read_text())}
    assert ("_loader/checkpoint.py", STATE_VERSION) in shown
    assert {version for _, version in shown} == {STATE_VERSION}, shown


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


# -- validation: every field of a loaded state typed and checked against the plan (issue #16, point 3) --

VALIDATION_OPTIONS = {"batch_size": 16, "interleave": 2, "shuffle_buffer_size": 64}
WORKER0 = ("dataloader", "dataset_state")  # the worker state of a num_workers=0 loader state


@pytest.fixture(scope="module")
def validation_dataset(tmp_path_factory):
    """1,000 rows in 11 splits of 100 and 80 rows."""
    return write_dataset(tmp_path_factory.mktemp("validation"), [(600, 100), (400, 80)])


def _taken(path, num_workers, batches, **kwargs):
    """A loader's JSON state after ``batches`` batches of epoch 0, and the ids yielded before it."""
    loader, dataset = make_loader(path, num_workers, **{**VALIDATION_OPTIONS, **kwargs})
    dataset.set_epoch(0)
    it = iter(loader)
    ids = [i for _ in range(batches) for i in ids_of(next(it))]
    return json.loads(json.dumps(loader.state_dict())), ids


def _set(state, path, value):
    """A deep copy of ``state`` with the field at ``path`` set to ``value`` (``DELETE``: removed)."""
    state = copy.deepcopy(state)
    *parents, last = path
    target = state
    for key in parents:
        target = target[key]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return state


class _Delete:
    def __repr__(self) -> str:
        return "deleted"


DELETE = _Delete()

# each on main: rows lost or repeated without an error, or a raw builtin error (issue #16)
REFUSED_0_WORKERS = [
    ((*WORKER0, "cursor", "lanes", 0, 1), 10**9, r"lanes\[0\] is \[\d+, 1000000000\]"),
    ((*WORKER0, "cursor", "next_split_index"), -3, r"next_split_index is -3, expected an int >= 0"),
    ((*WORKER0, "cursor", "lanes"), [], r"0 lane\(s\) and next_split_index=\d+ of 11"),
    ((*WORKER0, "epoch_complete"), "no", r"epoch_complete is 'no', expected true or false"),
    ((*WORKER0, "cursor", "window_offset"), 10**6, r"window_offset=1000000, but a shuffle window holds 64 rows"),
    ((*WORKER0, "cursor", "turn_index"), 7, r"turn_index is 7, but there are 2 lane"),
    ((*WORKER0, "cursor", "block_offset"), 10**6, r"block_offset=1000000, but a block holds 8 rows"),
    (("version",), True, r"no valid format version \(got True\)"),
    (("batches_per_transfer",), "x", r"batches_per_transfer is 'x', expected an int >= 1"),
    (("batches_per_transfer",), 0, r"batches_per_transfer is 0, expected an int >= 1"),
    (("dataloader",), {}, r"dataloader has no '_iterator_finished' field"),
    (("dataloader",), DELETE, r"loader state has no 'dataloader' field"),
    (("world_size",), DELETE, r"loader state has no 'world_size' field"),
    ((*WORKER0, "cursor", "lanes", 0, 1), True, r"lanes\[0\]\[1\] \(row offset\) is True, expected an int"),
    ((*WORKER0, "counters", "rows"), 113, r"counters.rows is 113, but the cursor stands after 112 row"),
    ((*WORKER0, "cursor", "window_index"), 2, r"window_index=2, but its window starts after 64 rows"),
    ((*WORKER0, "epoch_complete"), True, r"888 row\(s\) of epoch 0 left to yield, but its epoch_complete is true"),
    (("dataloader", "_iterator_finished"), True, r"left to yield, but the checkpoint says its loop ended"),
    (("dataloader", "fetcher_state", "fetcher_ended"), True, r"left to yield, but the checkpoint says its loop ended"),
    ((*WORKER0, "slot", "worker_id"), 1, r"slot.worker_id is 1, expected an int from 0 to 0"),
    (("dataloader", "fetcher_state"), DELETE, r"dataloader has no 'fetcher_state' field"),
    (("dataloader", "fetcher_state", "dataset_iter_state"), DELETE, r"fetcher_state has no 'dataset_iter_state'"),
    ((*WORKER0, "options", "drop_last"), 0, r"drop_last: saved 0 vs current False"),
]


@pytest.mark.parametrize(("path", "value", "message"), REFUSED_0_WORKERS,
                         ids=[f"{'.'.join(map(str, p[2:] if p[:2] == WORKER0 else p))}={v!r:.12}"
                              for p, v, _ in REFUSED_0_WORKERS])
def test_a_malformed_state_is_refused_at_load_naming_the_field(validation_dataset, path, value, message):
    state, _ = _taken(validation_dataset, 0, 7)
    loader, _ = make_loader(validation_dataset, 0, **VALIDATION_OPTIONS)
    with pytest.raises(errors.StateError, match=message):
        loader.load_state_dict(_set(state, path, value))


def test_the_unchanged_state_still_resumes_exactly(validation_dataset):
    """The control of the test above: the state it mutates loads and yields the rest of the epoch."""
    state, before = _taken(validation_dataset, 0, 7)
    loader, dataset = make_loader(validation_dataset, 0, **VALIDATION_OPTIONS)
    loader.load_state_dict(state)
    after = [i for batch in loader for i in ids_of(batch)]
    assert sorted(before + after) == list(range(dataset.num_rows))


@pytest.mark.parametrize(("path", "value", "message"), [
    (("ranks",), [], r"checkpoint.ranks holds 0 loader state\(s\) for world_size=2"),
    (("ranks",), None, r"checkpoint.ranks is None, expected a list"),
    (("world_size",), DELETE, r"checkpoint has no 'world_size' field"),
    (("ranks", 1, "rank"), 0, r"checkpoint.ranks\[1\] has rank, world_size, num_workers, batches_per_transfer"),
    (("ranks", 0, "dataloader"), DELETE, r"checkpoint.ranks\[0\] has no 'dataloader' field"),
], ids=["ranks=[]", "ranks=None", "no-world_size", "rank-twice", "no-dataloader"])
def test_a_malformed_merged_checkpoint_is_refused(validation_dataset, path, value, message):
    states = [_taken(validation_dataset, 0, 2, rank=rank, world_size=2)[0] for rank in range(2)]
    merged = merge_state_dicts(states)
    for rank, num_workers in ((0, 0), (1, 0), (0, 1)):  # its own topology, and a re-plan for another
        loader, _ = make_loader(validation_dataset, num_workers, rank=rank, world_size=2, **VALIDATION_OPTIONS)
        with pytest.raises(errors.StateError, match=message):
            loader.load_state_dict(_set(merged, path, value))


def test_a_plain_stateful_dataloader_checks_the_dataset_state_too(validation_dataset):
    """torchdata hands the worker state to dataset.load_state_dict when the loader starts iterating."""
    state, _ = _taken(validation_dataset, 0, 7)
    inner = _set(state["dataloader"], ("dataset_state", "cursor", "lanes", 0, 1), 10**9)
    dataset = StructuredDataset(validation_dataset, **VALIDATION_OPTIONS)
    loader = StatefulDataLoader(dataset, batch_size=None)
    loader.load_state_dict(inner)
    with pytest.raises(errors.StateError, match=r"lanes\[0\] is \[\d+, 1000000000\]"):
        list(loader)


def test_merge_state_dicts_refuses_malformed_states(validation_dataset):
    """A raw KeyError/TypeError on main."""
    states = [_taken(validation_dataset, 0, 1, rank=rank, world_size=2)[0] for rank in range(2)]
    for path, value, message in [(("rank",), DELETE, r"state 1 has no 'rank' field"),
                                 (("rank",), "1", r"state 1.rank is '1', expected an int from 0 to 1"),
                                 (("dataloader", "dataset_state"), DELETE, r"dataloader has no 'dataset_state'")]:
        with pytest.raises(errors.StateError, match=message):
            merge_state_dicts([states[0], _set(states[1], path, value), states[1]])


@pytest.mark.timeout(120)
def test_torchdatas_own_fields_are_checked_with_workers(validation_dataset):
    """torchdata reads these on resume: a bare StopIteration, an AssertionError, or a silent skip on main."""
    state, before = _taken(validation_dataset, 2, 5)
    snapshot = ("dataloader", "_snapshot")
    loader, dataset = make_loader(validation_dataset, 2, **VALIDATION_OPTIONS)
    for path, value, message in [
        (("dataloader", "_steps_since_snapshot"), 10**6, r"_steps_since_snapshot is 1000000, expected an int from 0 to 0"),
        (("dataloader", "_steps_since_snapshot"), 1, r"_steps_since_snapshot is 1, expected an int from 0 to 0"),
        ((*snapshot, "_last_yielded_worker_id"), 2, r"_last_yielded_worker_id is 2, expected an int from 0 to 1"),
        ((*snapshot, "_main_snapshot", "_base_seed"), DELETE, r"_main_snapshot has no '_base_seed' field"),
        ((*snapshot, "_worker_snapshots", "worker_1"), DELETE, r"_worker_snapshots has entries \['worker_0'\]"),
        ((*snapshot, "_worker_snapshots", "worker_1", "worker_id"), 0, r"worker_1.worker_id is 0"),
        ((*snapshot, "_worker_snapshots", "worker_1", "dataset_state", "slot", "worker_id"), 0,
         r"rank 0 worker 1 state belongs to rank 0 worker 0"),
        ((*snapshot, "_worker_snapshots", "worker_0", "dataset_state", "epoch"), 1,
         r"worker 1 state stands after \d+ rows with \d+ row\(s\) of epoch 0 left to yield, but another worker"),
    ]:
        with pytest.raises(errors.StateError, match=message):
            loader.load_state_dict(_set(state, path, value))
    loader.load_state_dict(state)  # and the state itself resumes exactly
    after = [i for batch in loader for i in ids_of(batch)]
    assert sorted(before + after) == list(range(dataset.num_rows))


def test_long_values_are_shortened_in_errors(validation_dataset):
    """A 50 MB string in a state gave a 50 MB message (issue #16, point 9)."""
    state, _ = _taken(validation_dataset, 0, 1)
    loader, _ = make_loader(validation_dataset, 0, **VALIDATION_OPTIONS)
    huge = "x" * 50_000_000
    for path in [("kind",), ("version",), (*WORKER0, "cursor"), (*WORKER0, "cursor", "lanes", 0, 0),
                 (*WORKER0, "options", "seed"), (*WORKER0, "data", "fingerprint")]:
        with pytest.raises(errors.StateError) as info:
            loader.load_state_dict(_set(state, path, huge))
        assert len(str(info.value)) < 1000, path
    for path, value in [((*WORKER0, "cursor", "lanes"), [[0, 0]] * 10**5), (("version",), 10**10_000),
                        ((*WORKER0, "counters", "rows"), -(10**10_000))]:
        with pytest.raises(errors.StateError) as info:
            loader.load_state_dict(_set(state, path, value))
        assert len(str(info.value)) < 1000, path


@settings(max_examples=60, deadline=None)
@given(split_rows=st.lists(st.integers(0, 40), min_size=1, max_size=9), interleave=st.integers(2, 4),
       block_size=st.integers(1, 12), data=st.data())
def test_cursor_at_is_where_the_rotation_stands(split_rows, interleave, block_size, data):
    """The arithmetic the plan check uses is the rotation ``interleave_runs`` makes, after any row."""
    from arrowstream._core.interleave import interleave_runs
    from arrowstream._core.plan_types import Split
    from arrowstream._layout.replan import _CountReader
    from arrowstream._state.position import cursor_at

    splits = [Split(0, 0, 1, 0, rows, 0) for rows in split_rows]
    start = Cursor.start(len(splits), interleave)
    runs = list(interleave_runs([_CountReader() for _ in range(interleave)], splits, block_size, start))
    rows = data.draw(st.integers(1, max(sum(split_rows), 1)))
    taken = 0
    for run in runs:
        if taken + run.num_rows >= rows:
            assert cursor_at(split_rows, interleave, block_size, rows) == run.after(rows - taken)
            break
        taken += run.num_rows


def test_the_plan_check_reads_the_splits_each_slot_reads(uneven_dataset):
    """The epoch layout computes every slot's reading order at once (``_position`` and the workers read
    it); it is ``slot_split_ids``, one slot at a time."""
    from arrowstream._core.order import SlotGrid, slot_split_ids
    from arrowstream._state.position import _slot_rows

    dataset = StructuredDataset(uneven_dataset, batch_size=8, shuffle=True, seed=4, split_bytes=4096)
    for world_size, num_workers, epoch in [(1, 0, 0), (1, 3, 2), (2, 2, 5)]:
        grid = SlotGrid(world_size, num_workers)
        splits = dataset._plan.splits_for(grid.num_slots)
        for slot in (grid.slot_at(index) for index in range(grid.num_slots)):
            ids = slot_split_ids([s.num_rows for s in splits], slot, shuffle=True, seed=4, epoch=epoch)
            assert list(dataset._epochs.planned_splits(slot, epoch)) == [splits[i] for i in ids]
            assert _slot_rows(dataset.epochs, slot, epoch) == [splits[i].num_rows for i in ids]


@pytest.mark.timeout(120)
def test_a_loop_that_ended_after_the_snapshots_resumes_or_is_refused(validation_dataset):
    """With snapshot_every_n_steps=5 the workers' snapshots stand before the last batches of the epoch:
    a state taken after the loop is complete (nothing replayed, the next epoch whole), and a
    _steps_since_snapshot that does not match the batches the workers had left is refused."""
    options = {**VALIDATION_OPTIONS, "snapshot_every_n_steps": 5}
    loader, dataset = make_loader(validation_dataset, 2, **options)
    dataset.set_epoch(0)
    assert sorted(i for batch in loader for i in ids_of(batch)) == list(range(dataset.num_rows))
    state = json.loads(json.dumps(loader.state_dict()))
    steps = steps_since_snapshot(state["dataloader"])
    assert iterator_finished(state["dataloader"]) and steps > 0  # the case under test
    dataset.set_epoch(1)
    uninterrupted = [ids_of(batch) for batch in loader]
    for resume_epoch in (0, 1):  # the finished epoch again (empty), or the next one
        fresh, fresh_dataset = make_loader(validation_dataset, 2, **options)
        fresh.load_state_dict(state)
        fresh_dataset.set_epoch(resume_epoch)
        resumed = [ids_of(batch) for batch in fresh]
        assert resumed == ([] if resume_epoch == 0 else uninterrupted)
    tampered = _set(state, ("dataloader", "_steps_since_snapshot"), steps - 1)
    with pytest.raises(errors.StateError, match=rf"loop ended {steps - 1} batch\(es\) after the workers' snapshots, "
                                                rf"but the workers had {steps} left"):
        make_loader(validation_dataset, 2, **options)[0].load_state_dict(tampered)
