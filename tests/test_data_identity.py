"""Relocatable checkpoints: ``data_identity="strict"`` (the default) or ``"layout"``.

A checkpoint is taken on one copy of the data and loaded on another (touched, copied to another folder,
copied from an object store to local disk): strict refuses it naming the option, layout resumes exactly.
Other data (a size, a row count, the schema, a file added or removed) is refused in both modes, naming
what differs, saved vs current. Reads stay pinned to the files listed now.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import batch_key, ids_of, json_roundtrip, make_table, write_dataset
from servers import s3_server  # noqa: F401 (fixture)

import arrowstream
from arrowstream import IcebergDataset, Mixture, Source, StructuredDataset, errors

OPTIONS: dict[str, Any] = {"batch_size": 16, "shuffle": True, "seed": 5, "shuffle_buffer_size": 40, "interleave": 2}
LAYOUT = [(60, 20), (50, 25), (40, 40)]   # 3 files, 150 rows
STEPS = 3


def _loader(path: Any, **kwargs: Any) -> Any:
    return StructuredDataset.create_dataloader(path=path, num_workers=0, **{**OPTIONS, **kwargs})[0]


def checkpoint(path: Any, **kwargs: Any) -> tuple[Any, list[Any]]:
    """The state after ``STEPS`` batches of epoch 0 (through JSON) and the batches the run goes on with."""
    loader = _loader(path, **kwargs)
    batches = iter(loader)
    for _ in range(STEPS):
        next(batches)
    state = json_roundtrip(loader.state_dict())
    return state, [batch_key(b) for b in batches]


def resumed(path: Any, state: Any, **kwargs: Any) -> list[Any]:
    loader = _loader(path, **kwargs)
    loader.load_state_dict(state)
    return [batch_key(b) for b in loader]


def copy_of(folder: str, target: Path) -> str:
    """A plain ``cp -r``: the same bytes, new modification times."""
    shutil.copytree(folder, target, copy_function=shutil.copyfile)
    return str(target)


def touch(folder: str) -> None:
    """Move every file's modification time (what ``touch`` does), the bytes unchanged."""
    for name in os.listdir(folder):
        stat = os.stat(os.path.join(folder, name))
        os.utime(os.path.join(folder, name), ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


@pytest.fixture
def data(tmp_path):
    return write_dataset(tmp_path / "data", LAYOUT)


def test_touch_is_refused_in_strict_mode_naming_the_option_and_resumes_exactly_in_layout_mode(data):
    state, rest = checkpoint(data)
    touch(data)
    with pytest.raises(errors.StateMismatchError, match=r"modified or copied since.*data_identity='layout'"):
        _loader(data).load_state_dict(state)
    with pytest.raises(errors.StateMismatchError, match="data_identity='layout'"):
        _loader(data, data_identity="strict").load_state_dict(state)
    assert resumed(data, state, data_identity="layout") == rest
    assert len(rest) > 3   # the rest of the epoch, not an empty one


def test_a_copy_in_another_folder_resumes_exactly_in_layout_mode(data, tmp_path):
    state, rest = checkpoint(data)
    copy = copy_of(data, tmp_path / "elsewhere" / "nvme")
    shutil.rmtree(data)   # the copy is all there is
    with pytest.raises(errors.StateMismatchError, match="data_identity='layout'"):
        _loader(copy).load_state_dict(state)
    assert resumed(copy, state, data_identity="layout") == rest


def _upload(fs: Any, folder: str, url: str) -> None:
    for name in sorted(os.listdir(folder)):
        fs.pipe(f"{url}/{name}", Path(folder, name).read_bytes())


def test_a_copy_from_memory_to_local_disk_resumes_exactly(data, tmp_path):
    url = f"memory://identity-{uuid.uuid4().hex[:8]}/data"
    _upload(fsspec.filesystem("memory"), data, url)
    state, rest = checkpoint(url)
    assert resumed(data, state, data_identity="layout") == rest


def test_a_copy_from_s3_to_local_disk_resumes_exactly(data, s3_server):  # noqa: F811 (fixture)
    url = s3_server.url(f"identity-{uuid.uuid4().hex[:8]}", "data")
    _upload(s3_server.filesystem(), data, url)
    state, rest = checkpoint(url, storage_options=s3_server.storage_options)
    with pytest.raises(errors.StateMismatchError, match="data_identity='layout'"):
        _loader(data).load_state_dict(state)
    assert resumed(data, state, data_identity="layout") == rest


def _rewrite(folder: str, index: int, table: pa.Table, **kwargs: Any) -> None:
    pq.write_table(table, os.path.join(folder, f"part-{index:03d}.parquet"), **kwargs)


def _widen_labels(folder: str) -> None:
    """Every file rewritten as it was but for one column's type (int8 -> int16)."""
    start = 0
    for index, (rows, group) in enumerate(LAYOUT):
        table = make_table(start, rows)
        _rewrite(folder, index, table.set_column(2, "label", table.column("label").cast(pa.int16())),
                 row_group_size=group)
        start += rows


# each edit of the copy, and what the refusal must say of it, saved vs current
OTHER_DATA = {
    "other size": (lambda f: _rewrite(f, 0, make_table(0, 60), row_group_size=20, compression="none"),
                   r"file sizes: saved \d+ bytes in all, now \d+"),
    "other unit rows": (lambda f: _rewrite(f, 0, make_table(0, 60), row_group_size=30),
                        r"row counts of the files' row groups .*saved 150 rows, now 150 \(the same in total"),
    "fewer rows": (lambda f: _rewrite(f, 0, make_table(0, 50), row_group_size=25),
                   r"row counts .*saved 150 rows, now 140"),
    "other schema": (lambda f: _widen_labels(f), r"schema: saved 6 column\(s\) \(digest \w+\), now 6 \(digest \w+\)"),
    "file removed": (lambda f: os.remove(os.path.join(f, "part-002.parquet")),
                     r"file names: saved 3 file\(s\), now 2"),
    "file added": (lambda f: _rewrite(f, 3, make_table(150, 10)), r"file names: saved 3 file\(s\), now 4"),
    "file renamed": (lambda f: os.rename(os.path.join(f, "part-002.parquet"), os.path.join(f, "part-009.parquet")),
                     r"file names: saved 3 file\(s\), now 3 \(as many, other names"),
}


@pytest.mark.parametrize("edit", list(OTHER_DATA))
def test_other_data_is_refused_in_both_modes_naming_what_differs(data, tmp_path, edit):
    state, _ = checkpoint(data)
    copy = copy_of(data, tmp_path / "copy")
    change, match = OTHER_DATA[edit]
    change(copy)
    for mode in ("layout", "strict"):
        with pytest.raises(errors.StateMismatchError, match=match) as refused:
            _loader(copy, data_identity=mode).load_state_dict(state)
        assert "what differs: " in str(refused.value)
        assert ("other data even without modification tags" in str(refused.value)) == (mode == "layout")


def test_a_file_changed_during_an_epoch_after_a_layout_resume_still_raises(data, tmp_path):
    """Reads are pinned to the tags of the files listed now (the copy's), never the saved ones."""
    state, rest = checkpoint(data)
    copy = copy_of(data, tmp_path / "copy")
    loader = _loader(copy, data_identity="layout")
    loader.load_state_dict(state)
    batches = iter(loader)
    assert batch_key(next(batches)) == rest[0]   # the copy's own tags let the reads through
    touch(copy)
    with pytest.raises(errors.FileChangedError, match="changed since planning"):
        for _ in batches:
            pass


def test_the_state_holds_the_layout_and_no_path(data, tmp_path):
    state, _ = checkpoint(data)
    text = str(state)
    assert "'layout': {'names'" in text and str(tmp_path) not in text and "part-000" not in text


def test_a_state_without_a_layout_loads_on_the_same_data_and_is_refused_on_a_copy_with_the_reason(data, tmp_path):
    """A checkpoint of an earlier release holds the fingerprint only."""
    state, rest = checkpoint(data)

    def without_layout(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: without_layout(v) for k, v in value.items() if k != "layout"}
        return [without_layout(v) for v in value] if isinstance(value, list) else value

    old = without_layout(state)
    assert "layout" not in str(old)
    assert resumed(data, old, data_identity="layout") == rest
    copy = copy_of(data, tmp_path / "copy")
    with pytest.raises(errors.StateMismatchError, match="earlier arrowstream and records no layout"):
        _loader(copy, data_identity="layout").load_state_dict(old)


@pytest.mark.parametrize(("value", "error"), [("loose", errors.InvalidArgumentError), ("Layout", errors.InvalidArgumentError),
                                              (True, errors.ArgumentTypeError), (None, errors.ArgumentTypeError)])
def test_a_bad_data_identity_is_refused_naming_it(data, value, error):
    with pytest.raises(error, match="data_identity: expected 'strict'.*'layout'"):
        StructuredDataset(data, data_identity=value)
    with pytest.raises(error, match="data_identity"):
        _loader(data, data_identity=value)
    with pytest.raises(error, match=r"sources\['a'\].data_identity"):
        Mixture({"a": Source(data, data_identity=value)}, batch_size=8)


def test_a_tampered_layout_is_a_state_error(data):
    state, _ = checkpoint(data)
    text = str(state)
    assert "'layout'" in text

    def edit(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: ("not a digest map" if k == "layout" else edit(v)) for k, v in value.items()}
        return [edit(v) for v in value] if isinstance(value, list) else value

    with pytest.raises(errors.StateError, match=r"data.layout is 'not a digest map', expected a dict"):
        _loader(data).load_state_dict(edit(state))


def test_an_elastic_load_on_a_copy_honours_the_option(data, tmp_path):
    """Two ranks' states, merged, loaded into one rank on a copy: every row exactly once in the epoch."""
    options = {"batch_size": 10, "shuffle": True, "seed": 2}
    seen, states = [], []
    for rank in (0, 1):
        loader = _loader(data, rank=rank, world_size=2, plan_locally=True, **options)
        batches = iter(loader)
        for _ in range(2):
            seen += ids_of(next(batches))
        states.append(json_roundtrip(loader.state_dict()))
    merged = arrowstream.merge_state_dicts(states)
    copy = copy_of(data, tmp_path / "copy")
    with pytest.raises(errors.StateMismatchError, match="data_identity='layout'"):
        _loader(copy, **options).load_state_dict(merged)
    loader = _loader(copy, data_identity="layout", **options)
    loader.load_state_dict(merged)
    rest = [i for b in loader for i in ids_of(b)]
    assert sorted(seen + rest) == list(range(150))


def test_a_dynamic_load_on_a_copy_honours_the_option(data, tmp_path):
    options = {"batch_size": 10, "assignment": "dynamic", "shuffle_buffer_size": 0, "interleave": 1}
    loader = _loader(data, **options)
    batches = iter(loader)
    seen = [i for _ in range(4) for i in ids_of(next(batches))]
    state = json_roundtrip(loader.state_dict())
    copy = copy_of(data, tmp_path / "copy")
    with pytest.raises(errors.StateMismatchError, match="data_identity='layout'"):
        _loader(copy, **options).load_state_dict(state)
    loader = _loader(copy, data_identity="layout", **options)
    loader.load_state_dict(state)
    assert sorted(seen + [i for b in loader for i in ids_of(b)]) == list(range(150))


def test_a_mixture_source_copied_elsewhere_resumes_in_layout_mode(data, tmp_path):
    other = write_dataset(tmp_path / "other", [(40, 20)], seed=1)

    def mixture(path: str, mode: str) -> Any:
        sources = {"a": Source(path, data_identity=mode), "b": Source(other)}
        return Mixture.create_dataloader(sources, batch_size=10, shuffle=True, seed=1, num_workers=0)[0]

    loader = mixture(data, "strict")
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = json_roundtrip(loader.state_dict())
    rest = [batch_key(b) for b in batches]
    copy = copy_of(data, tmp_path / "copy")
    with pytest.raises(errors.StateMismatchError, match=r"source 'a'.*data_identity='layout'"):
        mixture(copy, "strict").load_state_dict(state)
    resumed_loader = mixture(copy, "layout")
    resumed_loader.load_state_dict(state)
    assert [batch_key(b) for b in resumed_loader] == rest
    _rewrite(copy, 0, make_table(0, 50))
    with pytest.raises(errors.StateMismatchError, match=r"source 'a'.*saved 150 rows, now 140"):
        mixture(copy, "layout").load_state_dict(state)


def test_iceberg_takes_the_option_and_resumes_in_either_mode(tmp_path):
    """An Iceberg state holds no modification tags (data files are immutable; the snapshot pins them): both
    modes check the same things, so "layout" is accepted and resumes as "strict" does."""
    from iceberg_tables import make_catalog

    catalog, config = make_catalog(str(tmp_path / "iceberg"))
    table = catalog.create_table("db.t", schema=make_table(0, 1).drop_columns(["vec"]).schema)
    table.append(make_table(0, 80).drop_columns(["vec"]))

    def loader(mode: str) -> Any:
        return IcebergDataset.create_dataloader(table="db.t", catalog_config=config, batch_size=16, shuffle=True,
                                                data_identity=mode)[0]

    first = loader("strict")
    batches = iter(first)
    next(batches)
    state = json_roundtrip(first.state_dict())
    rest = [batch_key(b) for b in batches]
    again = loader("layout")
    again.load_state_dict(state)
    assert [batch_key(b) for b in again] == rest
    with pytest.raises(errors.InvalidArgumentError, match="data_identity"):
        loader("anything")
