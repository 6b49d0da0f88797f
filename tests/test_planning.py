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
from arrowstream._core.order import assign_lpt, epoch_order, even_batch_limits, rows_yielded, slot_row_counts
from arrowstream._core.plan_types import FileEntry, Split
from arrowstream._planning.cutting import _single_units, base_splits, refine_splits, refine_splits_v1
from arrowstream._planning.discovery import discover_files


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
    from arrowstream._formats import FileFooter

    footer = FileFooter(FileEntry("p", "p", 1, ""), "parquet", pa.schema([]), tuple(group_rows),
                        tuple(10 * r for r in group_rows), tuple(range(len(group_rows))))
    splits = base_splits([footer], split_bytes=10**9)
    refined = refine_splits(splits, num_slots, [footer])
    covered = []
    for s in refined:
        base = sum(group_rows[: s.unit_start])
        covered += list(range(base + s.row_start, base + s.row_start + s.num_rows))
    assert covered == list(range(sum(group_rows)))
    assert len(refined) >= min(num_slots, sum(group_rows))


def entry_footers(files: list[list[int]]):
    from arrowstream._formats import FileFooter

    return [FileFooter(FileEntry(f"f{i}", f"f{i}", 1, ""), "parquet", pa.schema([]), tuple(units),
                       tuple(10 * r for r in units), tuple(range(len(units)))) for i, units in enumerate(files)]


def _covered(refined: list[Split], files: list[list[int]]) -> list[tuple[int, int]]:
    """(file, row) of every row the splits hold, in split order."""
    rows = []
    for s in refined:
        base = sum(files[s.file_index][: s.unit_start])
        rows += [(s.file_index, r) for r in range(base + s.row_start, base + s.row_start + s.num_rows)]
    return rows


def _trimmed_per_slot(loads: list[int], world_size: int, batch_size: int) -> list[int]:
    """Rows even_batches leaves out of each slot of ``loads`` (rank by rank)."""
    limits = even_batch_limits(loads, world_size, batch_size, False)
    return [rows - rows_yielded(rows, limit, batch_size, False) for rows, limit in zip(loads, limits, strict=True)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3000), min_size=1, max_size=3), min_size=1, max_size=3),
       st.integers(1, 4), st.integers(0, 3), st.integers(1, 512), st.integers(0, 3), st.booleans())
def test_cut_units_give_every_slot_its_share_within_one_batch(files, world_size, num_workers, batch_size, seed,
                                                              shuffle):
    """Planning version 2: every row once; when units are cut for idle slots, every slot holds
    ``rows // slots`` rows or one more under LPT, in any epoch order, so ``even_batches`` trims at
    most one batch per slot."""
    num_slots = world_size * max(num_workers, 1)
    footers = entry_footers(files)
    splits = base_splits(footers, split_bytes=None)
    refined = refine_splits(splits, num_slots, footers)
    assert sorted(_covered(refined, files)) == [(f, r) for f, units in enumerate(files) for r in range(sum(units))]
    singles = [u for s in splits for u in _single_units(s, footers[s.file_index])]
    if len(singles) >= num_slots:  # nothing is cut: whole units (or splits), as in version 1
        assert refined == refine_splits_v1(splits, num_slots, footers)
        return
    assert len(refined) <= len(singles) + num_slots          # each piece ends a unit or fills a slot
    assert all(s.unit_stop - s.unit_start == 1 for s in refined)   # a cut piece stays inside its unit
    order = epoch_order(len(refined), shuffle=shuffle, seed=seed, epoch=seed)
    rows = [refined[int(i)].num_rows for i in order]
    owned = assign_lpt(rows, num_slots)
    assert sorted(i for items in owned for i in items) == list(range(len(refined)))   # each split to one slot
    loads = [sum(rows[i] for i in items) for items in owned]
    mean = sum(loads) / num_slots
    assert all(abs(load - mean) < 1 for load in loads)                                # hence within one batch
    assert loads == slot_row_counts(rows, num_slots)
    if world_size > 1:
        assert all(trimmed <= batch_size for trimmed in _trimmed_per_slot(loads, world_size, batch_size))


def test_one_file_of_two_row_groups_over_3_ranks_of_2_workers_trims_at_most_a_batch_per_slot(tmp_path):
    """Issue #19: 4,000 rows in 2 row groups over 3 ranks x 2 workers, batch_size=128. Version 1 cut
    8 ranges of 500 rows, two slots got 1,000 and even_batches trimmed 976 rows every epoch."""
    folder = write_dataset(tmp_path / "d", [(4000, 2000)])
    datasets = [StructuredDataset(folder, batch_size=128, rank=rank, world_size=3, plan_locally=True)
                for rank in range(3)]
    assert sorted(datasets[0].slot_rows(2)) == [666, 666, 667, 667, 667, 667]
    trimmed = [d.rows_trimmed_per_epoch(2) for d in datasets]
    assert sum(trimmed) <= 6 * 128
    assert trimmed == [0, 0, 0]
    assert len({d.num_batches(2) for d in datasets}) == 1
    for dataset in datasets:   # the layout older checkpoints were taken in, which they keep
        dataset.use_planning(1)
    assert sorted(datasets[0].slot_rows(2)) == [500, 500, 500, 500, 1000, 1000]
    assert sum(d.rows_trimmed_per_epoch(2) for d in datasets) == 976


def test_cut_units_of_two_files_over_four_ranks_are_read_once_in_equal_shares(tmp_path):
    folder = write_dataset(tmp_path / "d", [(37, 37), (6, 6)])   # 2 units, 43 rows, 4 readers: 10 or 11 each
    ids = []
    for rank in range(4):
        dataset = StructuredDataset(folder, batch_size=4, rank=rank, world_size=4, even_batches=False,
                                    plan_locally=True)
        assert sorted(dataset.slot_rows()) == [10, 11, 11, 11]
        mine = [i for batch in dataset for i in batch["id"].tolist()]
        assert len(mine) == dataset.slot_rows()[rank]
        ids += mine
    assert sorted(ids) == list(range(43))


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
