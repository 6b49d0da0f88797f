"""Bad input gets a clear arrowstream error that subclasses the matching builtin (guarantee 11)."""

from __future__ import annotations

import io
import json

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from helpers import make_loader, make_table, write_dataset

from arrowstream import StructuredDataset, errors
from arrowstream._torchdata_state import worker_state


def test_missing_path(tmp_path):
    with pytest.raises(errors.DatasetNotFoundError, match="does not exist") as info:
        StructuredDataset(tmp_path / "nope")
    assert isinstance(info.value, FileNotFoundError)
    assert "nope" in str(info.value)


def test_glob_matching_nothing(tmp_path):
    with pytest.raises(errors.DatasetNotFoundError, match=r"matches no file"):
        StructuredDataset(str(tmp_path / "*.parquet"))


def test_empty_directory_and_empty_list(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(errors.EmptyDatasetError, match="holds no data files"):
        StructuredDataset(tmp_path / "empty")
    with pytest.raises(ValueError, match="list of paths is empty"):
        StructuredDataset([])


def test_empty_path_is_refused_not_the_current_directory(small_dataset, monkeypatch):
    monkeypatch.chdir(small_dataset)  # a folder of data files: "" used to read it
    for path in ("", [small_dataset, ""], " "):
        with pytest.raises(errors.InvalidArgumentError, match=r"path: '\s*' names no file or folder"):
            StructuredDataset(path)
    assert StructuredDataset(".").num_rows == 400  # the current folder, asked for by name


def test_files_without_rows(tmp_path):
    pq.write_table(make_table(0, 0), tmp_path / "zero.parquet")
    with pytest.raises(errors.EmptyDatasetError, match="hold no rows"):
        StructuredDataset(tmp_path)


def test_filter_that_prunes_everything(small_dataset):
    with pytest.raises(errors.EmptyDatasetError, match="filter"):
        StructuredDataset(small_dataset, filter=pc.field("id") > 10**9)


def test_not_a_parquet_file(tmp_path):
    write_dataset(tmp_path, [(10, 10)])
    (tmp_path / "readme.txt").write_text("hello")
    with pytest.raises(errors.CorruptFileError, match=r"readme\.txt.*not a readable Parquet file") as info:
        StructuredDataset(tmp_path)
    assert isinstance(info.value, ValueError)


def test_truncated_file(tmp_path):
    write_dataset(tmp_path, [(100, 10)])
    path = tmp_path / "part-000.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(errors.CorruptFileError, match="part-000.parquet"):
        StructuredDataset(tmp_path)


def test_corrupt_data_page_is_named_at_read_time(tmp_path):
    write_dataset(tmp_path, [(2000, 2000)])
    path = tmp_path / "part-000.parquet"
    data = bytearray(path.read_bytes())
    metadata = pq.ParquetFile(path).metadata
    chunk = metadata.row_group(0).column(0)
    start = chunk.data_page_offset
    data[start:start + 64] = b"\xff" * 64  # smash the page header, keep the footer
    path.write_bytes(bytes(data))
    dataset = StructuredDataset(tmp_path, batch_size=100)  # planning only reads the footer
    with pytest.raises(errors.CorruptFileError, match="part-000.parquet"):
        list(dataset)


def test_schemas_that_disagree(tmp_path):
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "x": [1.0, 2.0]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": pa.array([3], pa.int32()), "x": [3.0]}), tmp_path / "b.parquet")
    with pytest.raises(errors.SchemaMismatchError, match=r"'id' is int32 in .*b\.parquet but int64"):
        StructuredDataset(tmp_path)
    pq.write_table(pa.table({"id": pa.array([3], pa.int64())}), tmp_path / "b.parquet")
    with pytest.raises(errors.SchemaMismatchError, match=r"b\.parquet.*missing \['x'\]"):
        StructuredDataset(tmp_path)
    assert StructuredDataset(tmp_path, columns=["id"]).num_rows == 3


@pytest.mark.parametrize(("kwargs", "error", "pattern"), [
    ({"format": "xml"}, errors.InvalidArgumentError, "format: unknown format 'xml'"),
    ({"parse_options": {"delimiter": ";"}}, errors.InvalidArgumentError, "parse_options: apply to format=.csv."),
    ({"output_format": "pandas"}, errors.InvalidArgumentError, "output_format: unknown output format"),
    ({"batch_size": 0}, errors.InvalidArgumentError, "batch_size: must be >= 1"),
    ({"batch_size": "64"}, errors.ArgumentTypeError, "batch_size: expected an int"),
    ({"seed": -1}, errors.InvalidArgumentError, "seed: must be >= 0"),
    ({"shuffle": "yes"}, errors.ArgumentTypeError, "shuffle: expected True or False"),
    ({"split_bytes": 0}, errors.InvalidArgumentError, "split_bytes: must be >= 1"),
    ({"columns": "id"}, errors.ArgumentTypeError, "columns: expected a list"),
    ({"columns": ["id", "nope"]}, errors.InvalidArgumentError, r"columns: \['nope'\] not found"),
    ({"columns": ["id", "id"]}, errors.InvalidArgumentError, "columns: names repeat"),
    ({"filter": "id > 3"}, errors.ArgumentTypeError, "filter: expected a pyarrow.compute.Expression"),
    ({"filter": pc.field("nope") > 1}, errors.InvalidArgumentError, "filter: .* cannot be evaluated"),
    ({"transform": 3}, errors.ArgumentTypeError, "transform: expected a callable"),
    ({"fill_nulls": "zero"}, errors.ArgumentTypeError, "fill_nulls"),
    ({"shuffle_buffer_size": -1}, errors.InvalidArgumentError, "shuffle_buffer_size: must be >= 0"),
    ({"shuffle_buffer_size": 10.0}, errors.ArgumentTypeError, "shuffle_buffer_size: expected an int"),
    ({"interleave": 0}, errors.InvalidArgumentError, "interleave: must be >= 1"),
    ({"interleave": 1025}, errors.InvalidArgumentError, "interleave: at most 1024 splits open per worker, got 1025"),
    ({"rank": 0, "world_size": 2**20 + 1}, errors.InvalidArgumentError,
     r"world_size=1048577 \(from explicit rank/world_size\) is above 1,048,576"),
    ({"storage_options": "key=1"}, errors.ArgumentTypeError, "storage_options: expected a dict"),
    ({"rank": 0}, errors.InvalidArgumentError, "rank/world_size: pass both"),
    ({"rank": 2, "world_size": 2}, errors.InvalidArgumentError, "need 0 <= rank < world_size"),
    ({"rank": 1.0, "world_size": 2}, errors.ArgumentTypeError, "rank: expected an int"),
    ({"rank": 1, "world_size": 4, "group_size": 3}, errors.InvalidArgumentError, "group_size: 3 does not divide"),
    ({"rank": 1, "world_size": 2, "even_batches": "yes"}, errors.ArgumentTypeError, "even_batches: expected"),
    ({"rank": 1, "world_size": 2, "filter": pc.field("id") > 3}, errors.InvalidArgumentError,
     "even_batches: with world_size=2 and a filter"),
    ({"accelerator": object()}, errors.ArgumentTypeError, "accelerator: expected an accelerate.Accelerator"),
])
def test_bad_arguments(small_dataset, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        StructuredDataset(small_dataset, **kwargs)


def test_bad_loader_arguments(small_dataset):
    with pytest.raises(errors.InvalidArgumentError, match="num_workers: must be >= 0"):
        make_loader(small_dataset, -1)
    with pytest.raises(errors.ArgumentTypeError, match=r"unknown keyword\(s\) \['prefetch'\]"):
        make_loader(small_dataset, 1, prefetch=2)
    with pytest.raises(errors.InvalidArgumentError, match="set_epoch: epoch must be an int"):
        StructuredDataset(small_dataset).set_epoch(-1)


def test_unknown_scheme_and_missing_backend():
    with pytest.raises(errors.InvalidArgumentError, match="unknown URL scheme 'nosuch'"):
        StructuredDataset("nosuch://bucket/data")
    with pytest.raises(errors.MissingDependencyError, match="dropbox"):
        StructuredDataset("dropbox://folder/data")


def test_mixed_filesystems(small_dataset):
    with pytest.raises(errors.InvalidArgumentError, match="one filesystem"):
        StructuredDataset([small_dataset, "memory://elsewhere"])


class _DenyingFileSystem(MemoryFileSystem):
    """Faults a local root cannot produce: permission denied on every read (open or ranged)."""

    protocol = "denying"

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path.removeprefix("denying://"))

    def _open(self, path, mode="rb", **kwargs):
        if "r" in mode:
            raise PermissionError(13, "Permission denied", path)
        return super()._open(path, mode, **kwargs)

    def cat_file(self, path, start=None, end=None, **kwargs):
        raise PermissionError(13, "Permission denied", path)


def test_permission_denied_names_the_file():
    fsspec.register_implementation("denying", _DenyingFileSystem, clobber=True)
    fs = _DenyingFileSystem()
    buffer = io.BytesIO()
    pq.write_table(make_table(0, 10), buffer)
    fs.pipe("/deny/a.parquet", buffer.getvalue())
    with pytest.raises(errors.FileReadError, match=r"denying://.*a\.parquet.*permission denied") as info:
        StructuredDataset("denying://deny")
    assert isinstance(info.value, OSError)


# -- states -------------------------------------------------------------------------------


def _mid_state(path, num_workers=2, **kwargs):
    loader, dataset = make_loader(path, num_workers, batch_size=32, **kwargs)
    dataset.set_epoch(0)
    it = iter(loader)
    for _ in range(3):
        next(it)
    return json.loads(json.dumps(loader.state_dict()))


def test_state_from_other_data(tmp_path):
    a = write_dataset(tmp_path / "a", [(300, 100)])
    b = write_dataset(tmp_path / "b", [(400, 100)])
    state = _mid_state(a)
    loader, _ = make_loader(b, 2, batch_size=32)
    with pytest.raises(errors.StateMismatchError, match=r"1 file\(s\) with 300 rows .* 1 file\(s\) with 400 rows"):
        loader.load_state_dict(state)


def test_state_with_other_options(small_dataset):
    state = _mid_state(small_dataset, shuffle=True)
    loader, _ = make_loader(small_dataset, 2, batch_size=32, shuffle=False)
    with pytest.raises(errors.StateMismatchError, match="shuffle: saved True vs current False"):
        loader.load_state_dict(state)
    loader, _ = make_loader(small_dataset, 2, batch_size=64, shuffle=True)
    with pytest.raises(errors.StateMismatchError, match="batch_size: saved 32 vs current 64"):
        loader.load_state_dict(state)


def test_state_with_another_shuffle_buffer_or_interleave(small_dataset):
    """Both decide the order of rows: a state resumes only with the sizes it was taken with."""
    state = _mid_state(small_dataset, shuffle_buffer_size=50, interleave=2)
    loader, _ = make_loader(small_dataset, 2, batch_size=32, shuffle_buffer_size=60, interleave=2)
    with pytest.raises(errors.StateMismatchError, match="shuffle_buffer_size: saved 50 vs current 60"):
        loader.load_state_dict(state)
    loader, _ = make_loader(small_dataset, 2, batch_size=32, shuffle_buffer_size=50)
    with pytest.raises(errors.StateMismatchError, match="interleave: saved 2 vs current 1"):
        loader.load_state_dict(state)


def test_one_rank_state_with_other_num_workers(small_dataset):
    """Another num_workers re-plans the epoch (tests/test_elastic.py), which needs every rank's
    state: one rank's state of two is refused, saying what to load instead."""
    state = _mid_state(small_dataset, num_workers=2, rank=0, world_size=2)
    loader, _ = make_loader(small_dataset, 3, batch_size=32, rank=0, world_size=2)
    with pytest.raises(errors.StateMismatchError, match="num_workers=2, this loader has num_workers=3.*gather_state_dict"):
        loader.load_state_dict(state)


def test_state_from_the_future_and_garbage(small_dataset):
    state = _mid_state(small_dataset)
    loader, _ = make_loader(small_dataset, 2, batch_size=32)
    with pytest.raises(errors.StateVersionError, match="version 99, newer"):
        loader.load_state_dict({**state, "version": 99})
    with pytest.raises(errors.StateError, match="expected the dict returned by loader.state_dict"):
        loader.load_state_dict({"hello": 1})
    worker = worker_state(state["dataloader"], 0)
    del worker["cursor"]
    with pytest.raises(errors.StateError, match="worker 0 state has no 'cursor' field"):
        loader.load_state_dict(state)


def test_mid_epoch_state_with_another_epoch(small_dataset):
    state = _mid_state(small_dataset)
    loader, dataset = make_loader(small_dataset, 2, batch_size=32)
    loader.load_state_dict(state)
    dataset.set_epoch(1)
    with pytest.raises(errors.StateMismatchError, match=r"epoch 0 \(mid-epoch\).*set_epoch\(0\)"):
        list(loader)


def test_errors_never_show_credentials(tmp_path):
    secret = "s3cr3t-k3y"
    with pytest.raises(errors.ArrowStreamError) as info:
        StructuredDataset("memory://no/such/place", storage_options={"token": secret})
    assert secret not in str(info.value)
    dataset = StructuredDataset(write_dataset(tmp_path, [(10, 10)]))
    dataset._storage._options["token"] = secret
    assert secret not in repr(dataset)
    assert secret not in json.dumps(dataset.state_dict())


@pytest.mark.parametrize(("fill", "pattern"), [
    ({"id": 1.5}, r"column 'id' is int64, got 1.5; give an int"),
    ({"id": float("nan")}, r"column 'id' is int64"),
    ({"flag": 0}, r"column 'flag' is bool, got 0; give a value of its type"),
    ({"name": 0}, r"column 'name' is string"),
    ({"nope": 0}, r"\['nope'\] are not output columns"),
    ({"label": 1000}, r"1000 does not fit column 'label' \(int8\)"),
])
def test_fill_values_the_column_cannot_hold(small_dataset, fill, pattern):
    with pytest.raises(errors.InvalidArgumentError, match=pattern):
        StructuredDataset(small_dataset, fill_nulls=fill)


def test_a_worker_error_stops_the_workers_at_once(small_dataset):
    """The traceback that reaches the user holds the loader's iterator: its workers are stopped when the
    error is raised, not when it is collected (each would wait for its queue's timeout, seconds)."""
    state = _mid_state(small_dataset)
    loader, dataset = make_loader(small_dataset, 2, batch_size=32)
    loader.load_state_dict(state)
    dataset.set_epoch(1)
    it = iter(loader)
    with pytest.raises(errors.StateMismatchError):
        next(it)
    workers = it._inner._workers
    assert len(workers) == 2 and not any(worker.is_alive() for worker in workers)
