"""Smoke test of the object-store fixtures: Parquet written to each server is read back by arrowstream."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from servers import ObjectStore, azure_server, gcs_server, s3_server  # noqa: F401 (fixtures, found by pytest)

import arrowstream

BACKENDS = ["s3_server", "gcs_server", "azure_server"]


def _write(store: ObjectStore, folder: str, tables: list[pa.Table]) -> None:
    fs = store.filesystem()
    for i, table in enumerate(tables):
        with fs.open(f"{store.bucket}/{folder}/part-{i}.parquet", "wb") as f:
            pq.write_table(table, f, row_group_size=100)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dataset_reads_what_was_written(backend: str, request: pytest.FixtureRequest) -> None:
    """Two files of 250 rows, listed and read back through the dataset, in the main process."""
    store: ObjectStore = request.getfixturevalue(backend)
    _write(store, "smoke", [pa.table({"x": range(start, start + 250)}) for start in (0, 250)])
    dataset = arrowstream.StructuredDataset(store.url("smoke"), batch_size=64, output_format="numpy",
                                            storage_options=store.storage_options)
    assert sorted(int(x) for batch in dataset for x in batch["x"]) == list(range(500))


@pytest.mark.parametrize("backend", BACKENDS)
def test_loader_workers_read_from_server(backend: str, request: pytest.FixtureRequest) -> None:
    """Two worker processes open their own filesystems on the server from the pickled storage_options."""
    store: ObjectStore = request.getfixturevalue(backend)
    _write(store, "workers", [pa.table({"x": range(start, start + 100)}) for start in range(0, 400, 100)])
    loader, _ = arrowstream.StructuredDataset.create_dataloader(
        store.url("workers"), batch_size=32, num_workers=2, output_format="numpy",
        storage_options=store.storage_options)
    assert sorted(int(x) for batch in loader for x in batch["x"]) == list(range(400))


@pytest.mark.parametrize(("backend", "tag"), [("s3_server", "ETag"), ("gcs_server", "generation"),
                                             ("azure_server", "etag")])
def test_listing_and_ranges(backend: str, tag: str, request: pytest.FixtureRequest) -> None:
    """``find(detail=True)`` gives sizes and a change tag; ``cat_ranges`` reads both ends of a file."""
    store: ObjectStore = request.getfixturevalue(backend)
    _write(store, "listing", [pa.table({"x": [1, 2, 3]})])
    fs = store.filesystem()
    [(path, info)] = fs.find(f"{store.bucket}/listing", detail=True).items()
    assert info["size"] > 0 and info.get(tag), sorted(info)
    head, tail = fs.cat_ranges([path, path], [0, info["size"] - 4], [4, info["size"]])
    assert head == tail == b"PAR1"
