"""Bad input gets a clear arrowstream error that subclasses the matching builtin (guarantee 11)."""

from __future__ import annotations

import functools
import http.server
import io
import json
import os
import re
import socket
import threading
from collections import Counter

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv
import pyarrow.feather
import pyarrow.orc
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from helpers import make_loader, make_table, write_dataset

from arrowstream import RetryPolicy, StructuredDataset, errors
from arrowstream._loader.torchdata_state import worker_state
from arrowstream.testing import check_resume


def test_missing_path(tmp_path):
    with pytest.raises(errors.DatasetNotFoundError, match="does not exist") as info:
        StructuredDataset(tmp_path / "nope")
    assert isinstance(info.value, FileNotFoundError)
    assert "nope" in str(info.value)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_an_unreachable_url_is_not_called_missing(tmp_path, caplog):
    """fsspec's HTTP filesystem reports a host it cannot reach as a missing file: the cause is named, and retried."""
    pytest.importorskip("aiohttp")
    url = f"http://127.0.0.1:{_free_port()}/data/part-0.parquet"   # nothing listens there
    with pytest.raises(errors.FileReadError) as info:
        StructuredDataset(url, retry=RetryPolicy(attempts=2, base_delay=0))
    message = str(info.value)
    assert not isinstance(info.value, FileNotFoundError) and "does not exist" not in message
    assert message.startswith(f"{url}: storage could not be reached (on every attempt), 2 failed attempts"), message
    assert "(last error: ClientConnectorError: Cannot connect to host 127.0.0.1" in message
    assert "check the network connection" in message and "storage_options" in message
    assert "unreachable): ClientConnectorError; retrying" in caplog.text
    # a server that answers 404: missing it is
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietFiles, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(errors.DatasetNotFoundError, match="does not exist"):
            StructuredDataset(f"{base}/gone.parquet", retry=RetryPolicy(attempts=2, base_delay=0))
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_name_that_does_not_resolve_is_a_connection_failure_not_a_missing_file():
    from arrowstream._storage.failures import is_missing, is_transient, shown
    try:
        try:
            raise socket.gaierror(-2, "Name or service not known")
        except OSError as exc:
            raise FileNotFoundError("https://no-such-host.invalid/x.parquet") from exc   # as fsspec's HTTP does
    except FileNotFoundError as masked:
        assert not is_missing(masked) and is_transient(masked)
        assert shown(masked) == "gaierror: [Errno -2] Name or service not known"
    plain = FileNotFoundError("s3://bucket/x.parquet")
    assert is_missing(plain) and not is_transient(plain)
    try:
        try:
            raise TimeoutError("an earlier attempt")
        except TimeoutError:
            raise FileNotFoundError("s3://bucket/x.parquet")
    except FileNotFoundError as missing:
        assert is_missing(missing) and not is_transient(missing)


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


def test_a_count_a_filter_decides_is_an_unknown_length_that_list_goes_past(small_dataset):
    """len(loader), num_batches and the rows drop_last drops, with a filter: an arrowstream error that is a
    TypeError (as len() of an object without a length), naming the filter and what to do; list() reads on."""
    loader, dataset = StructuredDataset.create_dataloader(small_dataset, batch_size=7, drop_last=True,
                                                          filter=pc.field("id") < 500)
    for count in (lambda: len(loader), dataset.num_batches, dataset.rows_dropped_per_epoch):
        with pytest.raises(errors.UnknownLengthError, match=r"unknown before reading: the filter.*Iterate without it"):
            count()
    assert issubclass(errors.UnknownLengthError, TypeError)
    ids = [int(i) for batch in list(loader) for i in batch["id"]]
    assert ids and all(i < 500 for i in ids) and len(ids) % 7 == 0


def test_not_a_parquet_file(tmp_path):
    write_dataset(tmp_path, [(10, 10)])
    (tmp_path / "readme.txt").write_text("hello")
    with pytest.raises(errors.CorruptFileError, match=r"readme\.txt.*not a readable Parquet file") as info:
        StructuredDataset(tmp_path)
    assert isinstance(info.value, ValueError)


def _write_as(table: pa.Table, path, fmt: str) -> None:
    """``table`` written as a file of format ``fmt`` at ``path`` (whatever its name says)."""
    if fmt == "parquet":
        pq.write_table(table, path)
    elif fmt == "orc":
        pyarrow.orc.write_table(table, str(path))
    elif fmt == "arrow":
        pyarrow.feather.write_feather(table, str(path))
    elif fmt == "csv":
        pyarrow.csv.write_csv(table, str(path))
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))


@pytest.mark.parametrize(("asked", "actual", "looks"), [
    ("csv", "parquet", "a Parquet file"), ("csv", "orc", "an ORC file"), ("jsonl", "arrow", "an Arrow IPC"),
    ("jsonl", "parquet", "a Parquet file"),   # text formats on binary files: not "line 2 is not a valid row"
    ("parquet", "csv", "CSV"), ("parquet", "jsonl", "JSON Lines"), ("orc", "parquet", "a Parquet file"),
    ("arrow", "csv", "CSV"), ("parquet", "orc", "an ORC file"),   # and the reverse: not "rewrite the file"
])
def test_a_wrong_format_names_the_format_the_file_looks_like(tmp_path, asked, actual, looks):
    _write_as(pa.table({"id": list(range(50)), "text": [f"t{i}" for i in range(50)]}), tmp_path / "part-0.data",
              actual)
    label = {"csv": "CSV", "jsonl": "JSON Lines", "parquet": "Parquet", "orc": "ORC", "arrow": "Arrow IPC"}[asked]
    with pytest.raises(errors.CorruptFileError) as info:
        StructuredDataset(tmp_path, format=asked)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'part-0.data'}: not a readable {label} file (format={asked!r}): it "
                              f"looks like {looks}"), message
    assert f"pass format={actual!r}" in message and "not a valid" not in message and "bad_rows" not in message


def test_a_compressed_text_file_without_its_suffix_and_text_that_starts_like_magic(tmp_path):
    import gzip
    (tmp_path / "a.csv").write_bytes(gzip.compress(b"id,x\n1,2\n"))
    with pytest.raises(errors.CorruptFileError, match=r"a\.csv: not a readable CSV file \(format='csv'\): it looks "
                       r"like a gzip-compressed file: if it holds CSV or JSON Lines, name it with a \.gz suffix"):
        StructuredDataset(tmp_path, format="csv")
    (tmp_path / "a.csv").write_bytes(b"ORCID,PAR1\nORC1,2\n")   # text that starts with a magic is text
    assert StructuredDataset(tmp_path, format="csv").num_rows == 1
    (tmp_path / "a.csv").unlink()
    (tmp_path / "a.csv.gz").write_bytes(gzip.compress(b"id,x\n1,2\n"))
    assert StructuredDataset(tmp_path, format="csv").num_rows == 1


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


_STRICT_STRUCT = pa.struct([pa.field("c", pa.int64(), False), pa.field("d", pa.int64(), False)])
_LOOSE_STRUCT = pa.struct([pa.field("c", pa.int64()), pa.field("d", pa.int64(), False)])   # d: nullable nowhere
_STRICT = pa.schema([pa.field("x", pa.int64(), False), pa.field("y", pa.string(), False),
                     pa.field("s", _STRICT_STRUCT, False), pa.field("l", pa.list_(pa.field("e", pa.int64(), False)), False),
                     pa.field("m", pa.map_(pa.string(), pa.field("value", pa.int64(), False)), False),
                     pa.field("z", pa.int64(), False)])
_LOOSE = pa.schema([("x", pa.int64()), ("y", pa.string()), ("s", _LOOSE_STRUCT), ("l", pa.list_(pa.int64())),
                    ("m", pa.map_(pa.string(), pa.int64())), pa.field("z", pa.int64(), False)])


def _nullability_row(i: int, loose: bool) -> dict:
    """Row ``i`` of the files of :func:`_nullability_files`: nulls at the top and inside the struct, the list and
    the map of the file whose fields are nullable."""
    return {"x": i, "y": None if loose and i % 4 == 1 else f"y{i}", "s": {"c": None if loose and i % 7 == 3 else i, "d": i},
            "l": [i, None] if loose and i % 5 == 1 else [i], "m": [("k", None if loose and i % 3 == 0 else i)], "z": i}


def _nullability_files(folder, file_format: str = "parquet") -> pa.Schema:
    """Three files that differ only in nullability: a and c with no field nullable (at any depth), b (between
    them) with every field nullable but ``z`` and the struct's ``d``; the schema that joins theirs."""
    write = pq.write_table if file_format == "parquet" else pa.feather.write_feather
    for name, schema, ids in (("a", _STRICT, range(20)), ("b", _LOOSE, range(100, 120)), ("c", _STRICT, range(200, 220))):
        table = pa.Table.from_pylist([_nullability_row(i, schema is _LOOSE) for i in ids], schema=schema)
        path = folder / f"{name}.{file_format}"
        write(table, path, **({"row_group_size": 5} if file_format == "parquet" else {"chunksize": 5}))
        written = pq.read_schema(path) if file_format == "parquet" else pa.feather.read_table(path).schema
        assert written.field("s").type == schema.field("s").type and written.field("x").nullable == (schema is _LOOSE)
    return pa.schema([("x", pa.int64()), ("y", pa.string()), ("s", _LOOSE_STRUCT),
                      ("l", pa.list_(pa.int64())), ("m", pa.map_(pa.string(), pa.int64())),
                      pa.field("z", pa.int64(), False)])


def _plain(name: str, value) -> object:
    """A value of column ``name`` as a Python value that can be counted (from any output format)."""
    if name == "s":
        return value["c"], value["d"]
    if name in ("l", "m"):
        return tuple(tuple(v) if name == "m" else v for v in value)
    return value if name == "y" else int(value)


@pytest.mark.parametrize("output_format", ["torch", "numpy", "arrow", "dict"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_files_that_differ_in_nullability_are_read_as_nullable_with_their_values(tmp_path, output_format,
                                                                                  num_workers):
    joined = _nullability_files(tmp_path)
    assert not joined.field("z").nullable and not joined.field("s").type.field("d").nullable   # nullable nowhere
    ids = [*range(20), *range(100, 120), *range(200, 220)]
    # top-level fields only (planned before, and their batches failed to concatenate), then nested ones too
    for columns in (["x", "y", "z"], joined.names):
        schema = pa.schema([joined.field(c) for c in columns])
        for buffer in (0, 8):   # a window mixes rows of several files, interleave=2 files in one batch
            for interleave in (1, 2):
                # the reader's filtered path too: a filter that drops a row of each file
                filter = ~pc.field("z").isin([3, 113, 203]) if interleave == 2 else None
                loader, dataset = StructuredDataset.create_dataloader(
                    tmp_path, batch_size=6, output_format=output_format, shuffle=True, seed=3,
                    shuffle_buffer_size=buffer, interleave=interleave, columns=columns, filter=filter,
                    num_workers=num_workers, plan_cache=False)
                assert dataset.schema == schema
                got: Counter = Counter()
                for batch in loader:
                    if output_format == "arrow":
                        assert batch.schema == schema, (columns, buffer, interleave)
                        batch = batch.to_pydict()
                    got.update(zip(*[[_plain(c, v) for v in batch[c]] for c in columns], strict=True))
                kept = [_nullability_row(i, 100 <= i < 200) for i in ids if filter is None or i not in (3, 113, 203)]
                expected = Counter(tuple(_plain(c, row[c]) for c in columns) for row in kept)
                assert got == expected, (columns, buffer, interleave)


def test_nullability_is_joined_in_every_file_format_that_keeps_it_and_resumes_exactly(tmp_path):
    for file_format in ("parquet", "arrow"):
        folder = tmp_path / file_format
        folder.mkdir()
        joined = _nullability_files(folder, file_format)
        dataset = StructuredDataset(folder, format=file_format, batch_size=60, output_format="arrow",
                                    columns=["z", "s"], plan_cache=False)
        assert dataset.schema == pa.schema([joined.field("z"), joined.field("s")])   # of the columns read
        batch = next(iter(dataset))
        assert batch.schema == dataset.schema and batch.num_rows == 60
        check_resume(functools.partial(StructuredDataset.create_dataloader, str(folder), format=file_format, batch_size=7,
                                       shuffle=True, shuffle_buffer_size=8, interleave=2, output_format="arrow",
                                       plan_cache=False), points=3)
        # planned from the plan cache: the same schema
        for _ in range(2):
            cached = StructuredDataset(folder, format=file_format, plan_cache=str(tmp_path / "cache"))
            assert cached.schema == joined
    assert os.listdir(tmp_path / "cache")


def test_files_that_differ_beyond_nullability_are_refused_naming_both(tmp_path):
    strict = pa.schema([pa.field("s", _STRICT_STRUCT, False)])
    pq.write_table(pa.table({"s": [{"c": 1, "d": 2}]}, schema=strict), tmp_path / "a.parquet")
    for other, shown in ((pa.struct([("c", pa.int32()), ("d", pa.int64())]), "struct<c: int32, d: int64>"),
                         (pa.struct([("c", pa.int64()), ("e", pa.int64())]), "struct<c: int64, e: int64>"),
                         (pa.struct([("c", pa.int64())]), "struct<c: int64>")):
        pq.write_table(pa.table({"s": pa.array([{"c": 1, "d": 2, "e": 2}], pa.struct(list(other)))}),
                       tmp_path / "b.parquet")
        with pytest.raises(errors.SchemaMismatchError,
                           match=rf"'s' is {re.escape(shown)} in .*b\.parquet but "
                                 rf"{re.escape(str(_STRICT_STRUCT))} in .*a\.parquet"):
            StructuredDataset(tmp_path, plan_cache=False)


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
    with pytest.raises(errors.StateError, match="expected the dict returned by this loader.s state_dict"):
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
