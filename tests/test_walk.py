"""Symbolic links inside a local dataset folder are followed as pyarrow follows them; a loop or a
dangling link is a clear error naming the link (issue 16: 9 rows reachable, 3 read, no error)."""

from __future__ import annotations

import os

import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from helpers import ids_of, make_table

from arrowstream import StructuredDataset, errors


@pytest.fixture
def linked(tmp_path):
    """``data/`` holds one file of 3 rows, a link to a folder of two files and a link to a file: 9 rows."""
    for folder in ("data", "elsewhere/more", "elsewhere/other"):
        (tmp_path / folder).mkdir(parents=True)
    pq.write_table(make_table(0, 3), tmp_path / "data" / "a.parquet")
    pq.write_table(make_table(3, 3), tmp_path / "elsewhere" / "more" / "b.parquet")
    pq.write_table(make_table(6, 3), tmp_path / "elsewhere" / "more" / "c.parquet")
    pq.write_table(make_table(9, 3), tmp_path / "elsewhere" / "other" / "d.parquet")
    os.symlink(tmp_path / "elsewhere" / "more", tmp_path / "data" / "more")
    os.symlink(tmp_path / "elsewhere" / "other" / "d.parquet", tmp_path / "data" / "d.parquet")
    os.symlink(tmp_path / "elsewhere" / "other", tmp_path / "data" / "_hidden")  # skipped like any '_' name
    return tmp_path


def _ids(path, num_workers=0):
    dataset = StructuredDataset(path, batch_size=4)
    return sorted(i for batch in dataset for i in ids_of(batch)), dataset


def test_links_to_files_and_folders_are_read_like_pyarrow(linked):
    data = linked / "data"
    ids, dataset = _ids(data)
    assert ids == sorted(pads.dataset(data).to_table().column("id").to_pylist()) == list(range(12))
    names = [f.entry.name for f in dataset._plan.files]
    assert names == ["a.parquet", "d.parquet", "more/b.parquet", "more/c.parquet"]  # the links' own paths
    os.remove(data / "_hidden")  # a glob, as before, takes names starting with '_' when they match
    assert _ids(str(data / "**" / "*.parquet"))[0] == list(range(12))  # a glob goes through linked folders
    assert _ids(str(data / "*.parquet"))[0] == [0, 1, 2, 9, 10, 11]  # and takes linked files
    os.symlink(data, linked / "data-link")
    assert _ids(linked / "data-link")[0] == list(range(12))  # the dataset's own folder given by a link


def test_a_loop_of_links_is_refused(linked):
    os.symlink(linked / "data", linked / "elsewhere" / "more" / "back")  # data/more/back -> data
    with pytest.raises(errors.InvalidArgumentError, match=r"symbolic link '.*more/back'.*holds the link itself"):
        StructuredDataset(linked / "data")
    os.remove(linked / "elsewhere" / "more" / "back")
    os.symlink(linked / "data" / "ping", linked / "data" / "pong")  # two links pointing at each other
    os.symlink(linked / "data" / "pong", linked / "data" / "ping")
    with pytest.raises(errors.InvalidArgumentError, match=r"symbolic link '.*data/ping'.* loop of links"):
        StructuredDataset(linked / "data")


def test_a_dangling_link_is_an_error_naming_it(linked):
    os.symlink(linked / "gone.parquet", linked / "data" / "e.parquet")
    with pytest.raises(errors.DatasetNotFoundError, match=r"symbolic link '.*data/e\.parquet'.*gone\.parquet.*does "
                       "not exist") as info:
        StructuredDataset(linked / "data")
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(errors.DatasetNotFoundError, match=r"symbolic link '.*data/e\.parquet'"):
        StructuredDataset(linked / "data" / "e.parquet")
