"""Discovery and planning: file order, splits from row groups, refinement, fingerprints."""

from __future__ import annotations

import os

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from helpers import make_table, write_dataset
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowstream import StructuredDataset
from arrowstream._discovery import discover_files
from arrowstream._planning import Split, _base_splits, refine_splits


def test_directory_is_listed_recursively_sorted_and_skips_hidden(tmp_path):
    root = tmp_path / "d"
    (root / "b").mkdir(parents=True)
    (root / "a").mkdir()
    for rel in ["b/2.parquet", "a/1.parquet", "a/0.parquet"]:
        pq.write_table(make_table(0, 10), root / rel)
    (root / "_SUCCESS").write_text("")
    (root / "a" / ".0.parquet.crc").write_text("x")
    storage, entries = discover_files(str(root), None)
    assert storage.protocol in ("file", "local")
    assert [e.name for e in entries] == ["a/0.parquet", "a/1.parquet", "b/2.parquet"]
    assert all(not os.path.isabs(e.name) for e in entries)


def test_glob_single_file_and_list_agree(tmp_path):
    folder = write_dataset(tmp_path / "d", [(10, 5), (10, 5), (10, 5)])
    _, by_glob = discover_files(f"{folder}/part-00[01].parquet", None)
    _, by_list = discover_files([f"{folder}/part-001.parquet", f"{folder}/part-000.parquet"], None)
    _, single = discover_files(f"{folder}/part-002.parquet", None)
    assert [e.path for e in by_glob] == [e.path for e in by_list]
    assert [e.name for e in single] == ["part-002.parquet"]


def test_memory_filesystem(tmp_path):
    fs = fsspec.filesystem("memory")
    for i in range(2):
        with fs.open(f"/mem-ds/part-{i}.parquet", "wb") as f:
            pq.write_table(make_table(i * 50, 50), f, row_group_size=20)
    dataset = StructuredDataset("memory://mem-ds", batch_size=16)
    ids = sorted(i for batch in dataset for i in batch["id"].tolist())
    assert ids == list(range(100))
    assert dataset.num_files == 2


def test_splits_follow_row_groups_and_split_bytes(tmp_path):
    folder = write_dataset(tmp_path / "d", [(1000, 100)])
    one_per_group = StructuredDataset(folder)
    assert one_per_group.num_splits() == 10
    grouped = StructuredDataset(folder, split_bytes=1)  # too small to group: still one per row group
    assert grouped.num_splits() == 10
    metadata = pq.ParquetFile(f"{folder}/part-000.parquet").metadata
    sizes = [metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups)]
    assert 4 * min(sizes) > 3 * max(sizes)  # so a budget of 3 * max holds exactly 3 groups
    three_groups = StructuredDataset(folder, split_bytes=3 * max(sizes))
    assert three_groups.num_splits() == 4  # 3 + 3 + 3 + 1 row groups
    assert three_groups.slot_rows() == [1000]


def test_fewer_splits_than_slots_are_cut_to_row_ranges(tmp_path):
    folder = write_dataset(tmp_path / "d", [(10, 10)])  # one row group
    dataset = StructuredDataset(folder, batch_size=2)
    assert dataset.num_splits(num_workers=3) >= 3
    assert sorted(dataset.slot_rows(num_workers=3)) == [3, 3, 4]


def test_refine_splits_is_exact_and_deterministic():
    from arrowstream._discovery import FileEntry
    from arrowstream._formats import FileFooter

    footer = FileFooter(FileEntry("p", "p", 1, ""), "parquet", pa.schema([]), (5, 7, 1), (50, 70, 10), (0, 1, 2))
    splits = [Split(0, 0, 3, 0, 13, 130)]
    refined = refine_splits(splits, 5, [footer])
    assert len(refined) >= 5
    assert sum(s.num_rows for s in refined) == 13
    assert refined == refine_splits(splits, 5, [footer])
    # the row ranges tile the row groups without overlap
    covered = []
    for s in refined:
        base = sum(footer.unit_rows[: s.unit_start])
        covered += list(range(base + s.row_start, base + s.row_start + s.num_rows))
    assert covered == list(range(13))


@settings(max_examples=200)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=6), st.integers(1, 40))
def test_refine_covers_every_row_once_and_feeds_every_slot(group_rows, num_slots):
    from arrowstream._discovery import FileEntry
    from arrowstream._formats import FileFooter

    footer = FileFooter(FileEntry("p", "p", 1, ""), "parquet", pa.schema([]), tuple(group_rows),
                        tuple(10 * r for r in group_rows), tuple(range(len(group_rows))))
    splits = _base_splits([footer], split_bytes=10**9)
    refined = refine_splits(splits, num_slots, [footer])
    covered = []
    for s in refined:
        base = sum(group_rows[: s.unit_start])
        covered += list(range(base + s.row_start, base + s.row_start + s.num_rows))
    assert covered == list(range(sum(group_rows)))
    assert len(refined) >= min(num_slots, sum(group_rows))


def test_filter_prunes_row_groups_by_statistics(tmp_path):
    folder = write_dataset(tmp_path / "d", [(1000, 100)])
    dataset = StructuredDataset(folder, filter=pc.field("id") >= 950)
    assert dataset.num_splits() == 1


def test_fingerprint_tracks_files_and_modification(tmp_path):
    folder = write_dataset(tmp_path / "d", [(100, 50), (100, 50)])
    first = StructuredDataset(folder)._data.fingerprint
    assert StructuredDataset(folder)._data.fingerprint == first
    path = f"{folder}/part-001.parquet"
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert StructuredDataset(folder)._data.fingerprint != first


def test_fingerprint_does_not_depend_on_absolute_location(tmp_path):
    a = write_dataset(tmp_path / "a", [(100, 50)])
    b = write_dataset(tmp_path / "b", [(100, 50)])
    stamp = os.stat(f"{a}/part-000.parquet").st_mtime_ns
    os.utime(f"{b}/part-000.parquet", ns=(stamp, stamp))
    assert StructuredDataset(a)._data.fingerprint == StructuredDataset(b)._data.fingerprint


def test_footers_are_read_in_the_main_process_only(tmp_path, monkeypatch):
    """Workers open files to read rows; they never list directories."""
    folder = write_dataset(tmp_path / "d", [(100, 50), (100, 50)])
    dataset = StructuredDataset(folder, batch_size=32)
    calls = []
    real_find = fsspec.implementations.local.LocalFileSystem.find
    monkeypatch.setattr(fsspec.implementations.local.LocalFileSystem, "find",
                        lambda self, *a, **k: calls.append(a) or real_find(self, *a, **k))
    assert sum(len(b["id"]) for b in dataset) == 200
    assert calls == []
