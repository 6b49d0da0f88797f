"""Dynamic assignment's core in one process: several workers' streams leasing from one pool, batches
taken in a random order (a straggler's timing), a checkpoint anywhere, and the rest read by another
number of workers: every row once."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from reference_stream import leased_runs

from arrowstream import StructuredDataset, errors
from arrowstream._core.order import SlotGrid
from arrowstream._core.stream import RunQueue
from arrowstream._layout.leases import (
    MAX_TAIL_LEASES_PER_WORKER,
    TAIL_LEASES_PER_WORKER,
    Leases,
    LocalPool,
    fixed_leases,
    last_pieces,
    lease_bounds,
    tail_pieces,
)
from arrowstream._layout.ledger import LeasedShare, fresh_work, remaining_work
from arrowstream._worker.reader import SplitReader


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("dyn")
    start = 0
    for f, rows in enumerate([700, 130, 1000, 45, 520, 300, 990, 64]):
        ids = np.arange(start, start + rows)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), root / f"part-{f}.parquet", row_group_size=100)
        start += rows
    return str(root), start


class Worker:
    """One worker's stream over leases, as a worker process reads it (without the process): full
    batches, then its last rows as pieces (see ``_dynamic.last_pieces``)."""

    def __init__(self, dataset, leases, pool, worker, num_workers, epoch, batch_size):
        options = dataset._options
        self.slot = SlotGrid(1, num_workers).slot(0, worker)
        readers = [SplitReader(dataset._plan, dataset._storage, 65536, use_threads=False)
                   for _ in range(options.interleave)]
        self.share = LeasedShare(leases, lambda: pool.take(worker))
        runs = leased_runs(readers, self.share, seed=options.seed, epoch=epoch, slot=self.slot,
                           batch_size=batch_size, interleave=options.interleave,
                           buffer_rows=options.shuffle_buffer_size)
        from arrowstream._layout.ledger import start_cursor
        self.queue = RunQueue(runs, start_cursor(options.interleave))
        self.batch_size = batch_size
        self.done = False
        self.delivered = self.queue.cursor   # after the last rows handed out
        self.pieces = None
        self.last = (lambda: last_pieces(np.diff(leases.bounds), pool.owners(), worker, num_workers, batch_size)) \
            if num_workers > 1 else None

    def next_item(self):
        """The next batch or piece (rows, its stitch tag or None, the cursor after it); None at the end."""
        self.queue.fill(self.batch_size)
        if self.queue.buffered == 0:
            self.done = True
            return None
        rows, tag = min(self.batch_size, self.queue.buffered), None
        if rows < self.batch_size and self.last is not None:
            if self.pieces is None:
                self.pieces = list(self.last())
                assert sum(r for r, _ in self.pieces) == self.queue.buffered
            rows, tag = self.pieces.pop(0)
        batch = self.queue.take(rows)
        return batch, tag, self.queue.cursor


def run(dataset, work, num_workers, epoch, batch_size, stop_after=None, rng=None, slow=None):
    """Batches of ``work`` by ``num_workers`` workers, taken in a random order (pieces stitched as the
    trainer does); stops after ``stop_after`` batches (a checkpoint) and returns the ids handed out, the
    batch sizes and the rest of the work."""
    leases = Leases(work, batch_size, num_workers)
    pool = LocalPool(len(leases))
    workers = [Worker(dataset, leases, pool, w, num_workers, epoch, batch_size) for w in range(num_workers)]
    ids, sizes = [], []
    held, next_group = {}, 0
    rng = rng or random.Random(0)
    while any(not w.done for w in workers):
        if stop_after is not None and len(sizes) >= stop_after:
            break
        live = [w for w in workers if not w.done]
        # the slow worker is picked rarely: a straggler
        weights = [0.1 if slow is not None and w is workers[slow] else 1.0 for w in live]
        worker = rng.choices(live, weights)[0]
        item = worker.next_item()
        if item is None:
            continue
        batch, tag, cursor = item
        if tag is None:
            ids += batch.column("id").to_pylist()
            sizes.append(batch.num_rows)
            worker.delivered = cursor
            continue
        held.setdefault(tag.group, (tag.parts, []))[1].append((worker, batch, cursor))
        while next_group in held and len(held[next_group][1]) == held[next_group][0]:
            parts = held.pop(next_group)[1]
            next_group += 1
            ids += [i for _, b, _ in parts for i in b.column("id").to_pylist()]
            sizes.append(sum(b.num_rows for _, b, _ in parts))
            for owner, _, after in parts:
                owner.delivered = after
    if stop_after is None or len(sizes) < stop_after:
        assert not held, "every piece made into a batch at the end"
    options = dataset._options
    rest = remaining_work(leases, pool.owners(), [w.delivered for w in workers], [w.slot for w in workers],
                          batch_size=batch_size, interleave=options.interleave, buffer_rows=options.shuffle_buffer_size)
    return ids, sizes, rest, leases


@pytest.mark.parametrize("options", [{}, {"shuffle": True}, {"shuffle": True, "shuffle_buffer_size": 150},
                                     {"shuffle": True, "shuffle_buffer_size": 70, "interleave": 2},
                                     {"interleave": 3}])
def test_every_row_once_through_checkpoints_and_other_worker_counts(folder, options):
    path, total = folder
    batch_size = 32
    dataset = StructuredDataset(path, batch_size=batch_size, plan_cache=False, seed=3, **options)
    rng = random.Random(7)
    for trial in range(6):
        work = fresh_work(dataset._plan, 1, 0, trial, dataset._options, even_batches=False)
        seen, all_sizes = [], []
        workers = rng.choice([1, 2, 3, 4])
        while True:
            stop = rng.choice([None, 1, 3, 9, 20])
            ids, sizes, work, _leases = run(dataset, work, workers, trial, batch_size, stop, rng, slow=0)
            seen += ids
            all_sizes += sizes
            if work.num_rows == 0:
                break
            workers = rng.choice([1, 2, 3, 4])   # elastic: the rest read by another number of workers
        assert len(seen) == total and sorted(seen) == list(range(total)), (trial, len(seen))
        # whole batches, except the last of the epoch
        assert all(s == batch_size for s in all_sizes[:-1]) or sorted(all_sizes).count(total % batch_size) <= 1
        assert sum(1 for s in all_sizes if s < batch_size) <= 1, all_sizes
        assert len(all_sizes) == -(-total // batch_size)


@pytest.mark.parametrize("pieces", [TAIL_LEASES_PER_WORKER, 16, MAX_TAIL_LEASES_PER_WORKER])
def test_leases_end_where_items_end_and_only_the_tail_cuts_items(pieces):
    """Issue #21: a lease that ended inside the next item (on a batch) cost a second decode of that
    unit's first pages; leases end at item ends, and only the tail cuts long items, in small pieces (the
    last eighth in pieces as small as the workers decide)."""
    rows = np.array([1000, 30, 5000, 700, 12, 64_000, 999, 3], dtype=np.int64)
    bounds = lease_bounds(rows, 64, 4, pieces)
    sizes = np.diff(bounds)
    total = int(rows.sum())
    assert bounds[0] == 0 and bounds[-1] == total and (sizes > 0).all()
    ends = set(np.cumsum(rows).tolist())
    piece = max(64, total // (4 * TAIL_LEASES_PER_WORKER))
    tail_start = total - max(total // 8, piece * 4 * 4)
    default = lease_bounds(rows, 64, 4)
    last = default[default >= total - total // 8][0]   # the last eighth: from a lease start of the default
    assert all(b in ends or b >= tail_start for b in bounds[1:].tolist()), "a cut inside an item before the tail"
    assert (bounds[bounds <= last] == default[default <= last]).all()
    assert sizes[bounds[1:] > tail_start].max() <= piece + 1
    assert sizes[bounds[:-1] >= last].max() <= min(piece, max(64, total // (4 * pieces))) + 1
    assert set(np.cumsum(rows).tolist()) <= set(bounds.tolist()), "every item end is a lease end"
    if pieces == MAX_TAIL_LEASES_PER_WORKER:   # finer: more leases
        assert len(bounds) > len(lease_bounds(rows, 64, 4))


def test_the_leases_before_the_last_eighth_are_the_same_with_any_tail():
    """The workers decide the last eighth's pieces when they reach it: every lease before it must not
    depend on that decision (the leases taken so far keep their meaning)."""
    rng = np.random.default_rng(21)
    for _ in range(200):
        rows = rng.integers(1, rng.choice([50, 5_000, 200_000]), size=rng.integers(1, 40)).astype(np.int64)
        batch_size, workers = int(rng.choice([1, 32, 1024])), int(rng.integers(0, 9))
        default = lease_bounds(rows, batch_size, workers)
        fixed = fixed_leases(default)
        for pieces in (16, 32, MAX_TAIL_LEASES_PER_WORKER):
            other = lease_bounds(rows, batch_size, workers, pieces)
            assert fixed_leases(other) == fixed and (other[:fixed + 1] == default[:fixed + 1]).all()
            assert len(other) >= len(default) and other[-1] == default[-1] == rows.sum()


@pytest.mark.parametrize("read_s,convert_s,pieces", [(0, 0, 8), (0, 5, 8), (1, 0.5, 8), (1, 1.9, 8), (1, 2, 16),
                                                     (1, 5, 32), (1, 8, 64), (0.01, 30, 64),
                                                     (0.3, 0.1, 8), (0.3, 0.59, 8), (0.3, 0.6, 16), (0.05, 0.3, 32)])
def test_tail_leases_are_finer_the_more_converting_costs_against_reading(read_s, convert_s, pieces):
    assert tail_pieces(read_s, convert_s) == pieces


@pytest.mark.parametrize("left", [[0, 0, 0], [5, 0, 0], [0, 31, 0], [10, 20, 30], [31, 31, 31, 31], [1, 0, 31],
                                  [16, 16, 0, 16, 16], [20, 17]])
def test_the_workers_last_rows_make_whole_batches_but_one(left):
    """Each worker's last rows (fewer than a batch) cut into pieces that, laid end to end in worker order,
    make whole batches; every worker computes the same cut from the dry pool alone."""
    batch_size = 32
    workers = len(left)
    rng = np.random.default_rng(sum(left))
    # leases of random rows whose totals per worker leave `left` rows
    owners = np.repeat(np.arange(workers), 3)
    lease_rows = rng.integers(1, 5, size=len(owners)) * batch_size
    for worker, rest in enumerate(left):
        lease_rows[worker * 3] += rest
    pieces = [last_pieces(lease_rows, owners, worker, workers, batch_size) for worker in range(workers)]
    assert [sum(rows for rows, _ in p) for p in pieces] == left
    groups: dict[int, list[int]] = {}
    alone = []
    for worker, mine in enumerate(pieces):
        assert len(mine) <= 2 and all(rows > 0 for rows, _ in mine)
        for rows, tag in mine:
            if tag is None:
                alone.append(rows)
            else:
                groups.setdefault(tag.group, []).append(rows)
                assert tag.parts > 1 or (len(mine) == 2 and (rows, tag) == mine[1]), "alone only after a piece"
    batches = [sum(g) for _, g in sorted(groups.items())] + alone
    assert sum(batches) == sum(left)
    assert len(batches) == -(-sum(left) // batch_size), "a rank yields ceil(rows / batch_size) batches"
    assert sum(1 for b in batches if b < batch_size) <= 1
    assert all(b <= batch_size for b in batches)
    with pytest.raises(ValueError, match="not dry"):
        last_pieces(lease_rows, np.concatenate([owners[:-1], [-1]]), 0, workers, batch_size)


# -- through the loader: worker processes, checkpoints, fresh loaders ------------------------------

DYNAMIC = {"assignment": "dynamic", "plan_cache": False, "batch_size": 32}
MIXED = {**DYNAMIC, "shuffle": True, "seed": 5, "shuffle_buffer_size": 70, "interleave": 2}


def slow_first_worker(batch):
    """A transform that makes worker 0 a straggler."""
    import time

    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is not None and info.id == 0:
        time.sleep(0.003)
    return batch


def ids_of_loader(loader, stop=None):
    ids, batches = [], 0
    for batch in loader:
        ids += [int(i) for i in batch["id"]]
        batches += 1
        if stop is not None and batches == stop:
            break
    return ids, batches


@pytest.mark.parametrize("num_workers,options", [(0, DYNAMIC), (2, MIXED), (4, {**DYNAMIC, "shuffle": True})])
def test_an_epoch_reads_every_row_once_in_exactly_len_batches_with_a_straggler(folder, num_workers, options):
    path, total = folder
    loader, dataset = StructuredDataset.create_dataloader(path, num_workers=num_workers, transform=slow_first_worker,
                                                          **options)
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        ids, batches = ids_of_loader(loader)
        assert sorted(ids) == list(range(total)) and batches == len(loader) == -(-total // 32)


def tagged_collate(batch):
    """A collate_fn that says it ran, and on how many rows (once per batch, on the whole batch)."""
    return {**batch, "collated": len(batch["id"])}


@pytest.mark.parametrize("num_workers,options", [(2, {"batch_size": 48}), (3, MIXED), (4, {"interleave": 2})])
def test_the_workers_last_rows_are_stitched_into_whole_batches_and_a_checkpoint_among_them_resumes_once(
        folder, num_workers, options):
    """Leases end where items end (issue #21), so every worker ends with fewer than a batch of rows: the
    trainer makes them into whole batches (converted, transformed and collated once, whole), the epoch has
    exactly len(loader) batches, all full but one; a checkpoint taken while pieces are held (between any
    two of the last batches) resumes exactly the rows not yielded, with another number of workers."""
    path, total = folder
    options = {**DYNAMIC, **options}
    batch_size = options["batch_size"]
    expected_batches = -(-total // batch_size)
    loader, dataset = StructuredDataset.create_dataloader(path, num_workers=num_workers, transform=slow_first_worker,
                                                          collate_fn=tagged_collate, **options)
    sizes, ids = [], []
    for batch in loader:
        assert batch["collated"] == len(batch["id"])
        sizes.append(len(batch["id"]))
        ids += [int(i) for i in batch["id"]]
    assert sorted(ids) == list(range(total))
    assert len(sizes) == len(loader) == expected_batches
    assert sum(1 for size in sizes if size < batch_size) == (1 if total % batch_size else 0)
    assert loader.metrics()["batches"] == expected_batches and loader.metrics()["rows"] == total
    # checkpoints among the last batches: where the workers' pieces are held in the trainer
    for stop in range(expected_batches - num_workers - 1, expected_batches + 1):
        loader, dataset = StructuredDataset.create_dataloader(path, num_workers=num_workers, **options)
        dataset.set_epoch(1)
        seen, _ = ids_of_loader(loader, stop)
        state = json.loads(json.dumps(loader.state_dict()))
        fresh, _ = StructuredDataset.create_dataloader(path, num_workers=num_workers % 3 + 1, **options)
        fresh.load_state_dict(state)
        rest, rest_batches = ids_of_loader(fresh)
        assert sorted(seen + rest) == list(range(total)), (stop, len(seen), len(rest))
        assert rest_batches == -(-len(rest) // batch_size), "the rest in whole batches but one"


@pytest.mark.parametrize("output_format", ["numpy", "arrow", "dict"])
def test_stitched_batches_have_the_output_format_of_the_others(folder, output_format):
    """The trainer converts the stitched batches itself: the same format, types and columns as the
    batches the workers converted."""
    path, total = folder
    loader, _ = StructuredDataset.create_dataloader(path, num_workers=3, output_format=output_format,
                                                    **{**DYNAMIC, "batch_size": 50})
    batches = list(loader)
    assert len(batches) == -(-total // 50)
    kinds = {(type(b).__name__, tuple(type(b[c]).__name__ for c in ("id", "x"))) if output_format != "arrow"
             else (type(b).__name__, tuple(str(t) for t in b.schema.types)) for b in batches}
    assert len(kinds) == 1, kinds
    ids = [int(i) for b in batches for i in (b["id"] if output_format != "arrow" else b.column("id").to_pylist())]
    assert sorted(ids) == list(range(total))


@pytest.mark.parametrize("output_format", ["torch", "numpy"])
def test_stitched_batches_of_strings_lists_and_filled_nulls_look_like_the_others(tmp_path, output_format):
    start = 0
    for f, rows in enumerate([170, 230, 90, 310]):
        ids = np.arange(start, start + rows)
        start += rows
        pq.write_table(pa.table({"id": ids, "name": [f"n{i}" for i in ids], "tags": [[int(i), 1] for i in ids],
                                 "maybe": pa.array([None if i % 7 == 0 else float(i) for i in ids])}),
                       tmp_path / f"p{f}.parquet", row_group_size=60)
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), num_workers=3, output_format=output_format,
                                                    fill_nulls={"maybe": -1.0}, **{**DYNAMIC, "batch_size": 64})
    batches = list(loader)
    assert len(batches) == -(-start // 64)
    shapes = {tuple((k, type(v).__name__, str(getattr(v, "dtype", "")), type(v[0]).__name__) for k, v in b.items())
              for b in batches}
    assert len(shapes) == 1, shapes
    rows = {int(i): (n, float(m)) for b in batches for i, n, m in zip(b["id"], b["name"], b["maybe"], strict=True)}
    assert sorted(rows) == list(range(start))
    assert all(n == f"n{i}" and m == (-1.0 if i % 7 == 0 else float(i)) for i, (n, m) in rows.items())


def test_with_a_filter_each_worker_yields_its_own_short_last_batch_and_resumes_once(folder):
    """A filter leaves a worker's rows unknown until read: no stitching, each worker's last batch may be
    short, and every kept row is still yielded once, across a checkpoint."""
    path, total = folder
    options = {**DYNAMIC, "filter": [("x", ">=", 100.0)]}
    kept = list(range(200, total))
    loader, _ = StructuredDataset.create_dataloader(path, num_workers=3, **options)
    ids, _ = ids_of_loader(loader)
    assert sorted(ids) == kept
    loader, _ = StructuredDataset.create_dataloader(path, num_workers=3, **options)
    seen, _ = ids_of_loader(loader, 50)
    state = json.loads(json.dumps(loader.state_dict()))
    fresh, _ = StructuredDataset.create_dataloader(path, num_workers=2, **options)
    fresh.load_state_dict(state)
    assert sorted(seen + ids_of_loader(fresh)[0]) == kept


@pytest.mark.parametrize("old,new,in_order", [(0, 3, None), (2, 0, None), (2, 3, None), (3, 1, None), (2, 2, True)])
def test_a_checkpoint_anywhere_resumes_the_rest_once_with_any_number_of_workers(folder, old, new, in_order):
    """With workers, batches come as they are ready by default (in_order=False); in order too."""
    path, total = folder
    order = {} if in_order is None else {"in_order": in_order}
    # before any batch, inside transfer chunks (16 batches each), after the loop
    for stop in ((0, 1, 9, None) if (old, new) == (2, 3) else (1, 9, None)):
        loader, dataset = StructuredDataset.create_dataloader(path, num_workers=old, transform=slow_first_worker,
                                                              **MIXED, **order)
        dataset.set_epoch(3)
        seen, batches = ids_of_loader(loader, stop) if stop != 0 else ([], 0)
        state = json.loads(json.dumps(loader.state_dict()))
        assert "dynamic" in state and len(json.dumps(state)) < 8_000
        fresh, fresh_dataset = StructuredDataset.create_dataloader(path, num_workers=new, **MIXED)
        fresh.load_state_dict(state)
        assert fresh_dataset.epoch == 3
        rest, rest_batches = ids_of_loader(fresh)
        assert sorted(seen + rest) == list(range(total)), (stop, len(seen), len(rest))
        assert batches + rest_batches == len(fresh)
        fresh_dataset.set_epoch(4)   # the next epoch is whole again
        assert sorted(ids_of_loader(fresh)[0]) == list(range(total))


def test_a_checkpoint_resumes_in_a_fresh_process(folder, tmp_path):
    path, total = folder
    loader, dataset = StructuredDataset.create_dataloader(path, num_workers=2, **MIXED)
    dataset.set_epoch(1)
    seen, _ = ids_of_loader(loader, 13)
    (tmp_path / "state.json").write_text(json.dumps(loader.state_dict()))
    child = (
        "import json, sys\n"
        "from arrowstream import StructuredDataset\n"
        f"loader, dataset = StructuredDataset.create_dataloader({path!r}, num_workers=3, **{MIXED!r})\n"
        f"loader.load_state_dict(json.load(open({str(tmp_path / 'state.json')!r})))\n"
        "print(json.dumps([int(i) for b in loader for i in b['id']]))\n")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=True)
    rest = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(seen + rest) == list(range(total))


def _tampered(state, edit):
    state = json.loads(json.dumps(state))
    edit(state["dynamic"])
    return state


@pytest.mark.parametrize("edit,match", [
    (lambda d: d.update(fresh_from_row=10**9), "fresh_from_row"),
    (lambda d: d["splits"].append([99, 0, 1, 0, 5, 10]), "names file 99"),
    (lambda d: d["splits"].append([0, 0, 1, 0, 10**6, 10]), "not a range of rows"),
    (lambda d: d["splits"].append([0, 0, 1, 0, 50, 10]), "more than the rank reads"),
    (lambda d: d["replays"].append({"slot": [1, 2, 0, 5], "splits": [], "start": {}, "rows": 3}), "not a slot"),
    (lambda d: d.update(epoch=-1), "epoch"),
    (lambda d: d["options"].update(seed=6), "seed: saved 6 vs current 5"),
    (lambda d: d["splits"].append(list(d["splits"][0])), "leaves some rows twice"),   # a split listed twice
    (lambda d: d.update(fresh_from_row=d["fresh_from_row"] - 40), "leaves some rows twice"),  # rows handed out again
])
def test_a_tampered_ledger_is_refused(folder, edit, match):
    """Every edit here would repeat rows or read others if it loaded."""
    path, _ = folder
    loader, _ = StructuredDataset.create_dataloader(path, num_workers=0, **MIXED)
    ids_of_loader(loader, 3)
    if "more than" in match:   # a ledger that leaves more rows than the epoch has: nothing read yet
        loader, _dataset = StructuredDataset.create_dataloader(path, num_workers=0, **MIXED)
    state = loader.state_dict()
    if "more than" not in match:   # what the edits change is there
        assert state["dynamic"]["splits"] and state["dynamic"]["fresh_from_row"] >= 40
    state = _tampered(state, edit)
    fresh, _ = StructuredDataset.create_dataloader(path, num_workers=0, **MIXED)
    with pytest.raises((errors.StateError, errors.StateMismatchError), match=match):
        fresh.load_state_dict(state)


def test_dynamic_and_static_states_do_not_load_into_each_other(folder):
    path, _ = folder
    dynamic, _ = StructuredDataset.create_dataloader(path, num_workers=0, **MIXED)
    static_options = {k: v for k, v in MIXED.items() if k != "assignment"}
    static, _ = StructuredDataset.create_dataloader(path, num_workers=0, **static_options)
    ids_of_loader(dynamic, 2)
    ids_of_loader(static, 2)
    with pytest.raises(errors.StateMismatchError, match="assignment='dynamic', this dataset has assignment='static'"):
        StructuredDataset.create_dataloader(path, num_workers=0, **static_options)[0].load_state_dict(
            dynamic.state_dict())
    with pytest.raises(errors.StateMismatchError, match="assignment: saved None vs current 'dynamic'"):
        StructuredDataset.create_dataloader(path, num_workers=0, **MIXED)[0].load_state_dict(static.state_dict())


def test_ranks_keep_their_static_rows_and_equal_batches(folder):
    path, total = folder
    seen, counts = [], []
    for rank in (0, 1):
        loader, _dataset = StructuredDataset.create_dataloader(path, num_workers=2, rank=rank, world_size=2,
                                                              plan_locally=True, **{**MIXED, "batch_size": 16})
        ids, batches = ids_of_loader(loader)
        assert batches == len(loader)
        seen += ids
        counts.append(batches)
    # equal batches; disjoint rows; even_batches trims at most about one split (100 rows) and a batch
    assert counts[0] == counts[1] and len(seen) == len(set(seen)) and total - 120 < len(seen) <= total


def test_drop_last_gives_only_whole_batches(folder):
    path, total = folder
    loader, _ = StructuredDataset.create_dataloader(path, num_workers=2, drop_last=True, **MIXED)
    sizes = [len(b["id"]) for b in loader]
    assert set(sizes) == {32} and len(sizes) == total // 32 == len(loader)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"assignment": "greedy"}, errors.InvalidArgumentError, "assignment: expected 'static' or 'dynamic'"),
    ({"assignment": 1}, errors.ArgumentTypeError, "assignment: expected"),
    ({"assignment": "dynamic", "filter": [("id", ">", 3)], "shuffle_buffer_size": 10}, errors.InvalidArgumentError,
     "a filter .* and shuffle_buffer_size"),
])
def test_bad_assignment_arguments_are_refused(folder, kwargs, error, match):
    path, _ = folder
    kwargs = {"num_workers": 0, "plan_cache": False, **kwargs}
    with pytest.raises(error, match=match):
        StructuredDataset.create_dataloader(path, **kwargs)


def test_metrics_count_each_workers_leases_and_the_tail(folder):
    path, total = folder
    loader, dataset = StructuredDataset.create_dataloader(path, num_workers=2, transform=slow_first_worker, **MIXED)
    ids_of_loader(loader)
    metrics = loader.metrics()
    leases = len(dataset.policy.epochs.leases(0, 2, dataset.policy.pool.pieces))   # the last eighth as the workers laid it out
    assert metrics["leases"] == leases == sum(w["leases"] for w in metrics["workers"]) and leases > 2
    assert all(w["leases"] > 0 for w in metrics["workers"]) and metrics["rows"] == total
    # batches come as they are ready (in_order=False by default): the straggler took less
    assert metrics["workers"][0]["rows"] < metrics["workers"][1]["rows"]
    assert 0 <= metrics["tail_s"] <= metrics["elapsed_s"]
    static, _ = StructuredDataset.create_dataloader(path, num_workers=0, plan_cache=False)
    ids_of_loader(static)
    assert static.metrics()["leases"] == 0


def test_a_merged_checkpoint_of_two_ranks_resumes_each_rank_with_other_workers(folder):
    from arrowstream import merge_state_dicts

    path, total = folder
    options = {**MIXED, "batch_size": 16, "world_size": 2, "plan_locally": True}
    seen, states = [], []
    for rank in (0, 1):
        loader, dataset = StructuredDataset.create_dataloader(path, num_workers=2, rank=rank, **options)
        dataset.set_epoch(1)
        seen += ids_of_loader(loader, 5 + rank)[0]
        states.append(loader.state_dict())
    merged = json.loads(json.dumps(merge_state_dicts(states)))
    counts = []
    for rank in (0, 1):
        loader, dataset = StructuredDataset.create_dataloader(path, num_workers=3 - rank, rank=rank, **options)
        loader.load_state_dict(merged)
        rest, batches = ids_of_loader(loader)
        seen += rest
        counts.append(5 + rank + batches)
    assert counts[0] == counts[1] == len(loader)   # even_batches holds across the resume
    assert len(seen) == len(set(seen)) and total - 120 < len(seen) <= total


def test_a_group_of_ranks_cannot_read_dynamically(folder):
    path, _ = folder
    with pytest.raises(errors.InvalidArgumentError, match="group_size=2"):
        StructuredDataset(path, rank=0, world_size=2, group_size=2, plan_locally=True, **MIXED)


def test_ranks_under_torchrun_yield_equal_batches_and_resume_once_with_other_workers(tmp_path):
    """2 ranks by torchrun (gloo), 2 workers each, a DDP step on every batch; a merged checkpoint mid-epoch
    resumed by 3 workers per rank reads the rest of each rank's rows once."""
    from test_distributed import torchrun

    start, data = 0, tmp_path / "data"
    data.mkdir()
    for f, rows in enumerate([700, 130, 1000, 45, 520, 300]):
        ids = np.arange(start, start + rows)
        pq.write_table(pa.table({"id": ids, "x": (ids * 0.5).astype(np.float32)}), data / f"part-{f}.parquet",
                       row_group_size=100)
        start += rows
    path, total = str(data), start
    options = {**MIXED, "batch_size": 16}
    scenario = {"name": "dynamic", "path": path, "num_workers": 2, "options": options, "epochs": [0, 1], "ddp": True,
                "checkpoint": {"epoch": 0, "step": 7, "num_workers": 3}}
    per_rank = [r["dynamic"] for r in torchrun(2, {"scenarios": [scenario]}, tmp_path)]
    for epoch in ("0", "1"):
        batches = [r["epochs"][epoch] for r in per_rank]
        assert len(batches[0]) == len(batches[1]) == per_rank[0]["lens"][epoch]
        ids = [i for rank in batches for b in rank for i in b]
        assert len(ids) == len(set(ids)) == total - per_rank[0]["trimmed"][epoch] - per_rank[1]["trimmed"][epoch]
    for r in per_rank:
        before = r["epochs"]["0"][:7]
        rest = r["resumed"]["0"]
        assert sorted(i for b in before + rest for i in b) == sorted(i for b in r["epochs"]["0"] for i in b)
        assert len(before) + len(rest) == r["lens"]["0"]
        assert sorted(i for b in r["resumed"]["1"] for i in b) == sorted(i for b in r["epochs"]["1"] for i in b)


def test_after_an_epoch_a_checkpoint_loads_on_another_world_size(folder):
    """Inside an epoch another world size re-plans the rest of it (tests/test_dynamic_replan.py); once every rank
    read its epoch, the next epoch is laid out for the new one."""
    from arrowstream import merge_state_dicts

    path, total = folder
    options = {**MIXED, "batch_size": 16, "plan_locally": True}
    ended, mid, seen, trimmed = [], [], [], 0
    for rank in (0, 1):
        loader, dataset = StructuredDataset.create_dataloader(path, num_workers=2, rank=rank, world_size=2, **options)
        dataset.set_epoch(4)
        seen += ids_of_loader(loader, 3)[0]
        trimmed += dataset.rows_trimmed_per_epoch(2)
        mid.append(loader.state_dict())
        ids_of_loader(loader)   # a new iteration of epoch 4 reads it whole
        ended.append(loader.state_dict())
    one, one_dataset = StructuredDataset.create_dataloader(path, num_workers=1, **options)
    one.load_state_dict(merge_state_dicts(mid))   # the rest of epoch 4, every row once across both
    one_dataset.set_epoch(4)
    rest = ids_of_loader(one)[0]
    assert len(set(seen + rest)) == len(seen + rest) == total - trimmed
    one.load_state_dict(merge_state_dicts(ended))
    assert one_dataset.epoch == 4 and ids_of_loader(one)[0] == []
    one_dataset.set_epoch(5)
    assert sorted(ids_of_loader(one)[0]) == list(range(total))


def test_a_ledger_naming_another_ranks_rows_is_refused(folder):
    path, _ = folder
    options = {**MIXED, "batch_size": 16, "world_size": 2, "plan_locally": True}
    states = []
    for rank in (0, 1):
        loader, _ = StructuredDataset.create_dataloader(path, num_workers=0, rank=rank, **options)
        ids_of_loader(loader, 4)
        states.append(json.loads(json.dumps(loader.state_dict())))
    states[0]["dynamic"]["splits"].append(states[1]["dynamic"]["splits"][0])
    loader, _ = StructuredDataset.create_dataloader(path, num_workers=0, rank=0, **options)
    with pytest.raises(errors.StateError, match="that the rank does not read"):
        loader.load_state_dict(states[0])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_state_taken_right_after_loading_is_the_loaded_one(folder, num_workers):
    """A loader that read before loading a checkpoint forgets that reading: its next state is the loaded rest."""
    path, total = folder
    loader, _ = StructuredDataset.create_dataloader(path, num_workers=num_workers, **MIXED)
    seen = ids_of_loader(loader, 5)[0]
    state = json.loads(json.dumps(loader.state_dict()))
    other, _ = StructuredDataset.create_dataloader(path, num_workers=num_workers, **MIXED)
    ids_of_loader(other, 9)
    other.load_state_dict(state)
    again = json.loads(json.dumps(other.state_dict()))
    assert again["dynamic"] == state["dynamic"]
    fresh, _ = StructuredDataset.create_dataloader(path, num_workers=0, **MIXED)
    fresh.load_state_dict(again)
    assert sorted(seen + ids_of_loader(fresh)[0]) == list(range(total))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_on_s3_leased_splits_are_read_ahead_and_resume_once(folder, s3_server, num_workers, monkeypatch):
    """On an object store each worker fetches its next leased splits in the background (read_ahead);
    a checkpoint's rest is still read once."""
    import os

    from arrowstream._storage.prefetch import Prefetcher

    fetched = []
    schedule = Prefetcher.schedule
    monkeypatch.setattr(Prefetcher, "schedule", lambda self, key, *a: fetched.append(key) or schedule(self, key, *a))
    path, total = folder
    fs = s3_server.filesystem()
    remote = s3_server.url(f"dynamic-{num_workers}")
    for name in sorted(os.listdir(path)):
        fs.put(os.path.join(path, name), f"{remote}/{name}")
    options = {**MIXED, "storage_options": s3_server.storage_options, "read_ahead": 2}
    loader, _ = StructuredDataset.create_dataloader(remote, num_workers=num_workers, **options)
    seen, _ = ids_of_loader(loader, 12)
    state = json.loads(json.dumps(loader.state_dict()))
    fresh, _ = StructuredDataset.create_dataloader(remote, num_workers=2 - num_workers // 2, **options)
    fresh.load_state_dict(state)
    assert sorted(seen + ids_of_loader(fresh)[0]) == list(range(total))
    if num_workers == 0:   # the trainer's own reads (384 rows, splits of 100): each split and the next ones ahead
        assert len({position for _, position in fetched}) >= 6


@pytest.mark.parametrize("persistent", [False, True])
def test_a_worker_killed_mid_epoch_loses_nothing_a_checkpoint_after_the_error_resumes(folder, persistent):
    """SIGKILL one worker: the loader names it (WorkerError); a state taken after the error gives the dead
    worker's leases, and what it had read but not handed out, back to the rest of the epoch."""
    import os
    import signal
    import time

    path, total = folder
    loader, _ = StructuredDataset.create_dataloader(path, num_workers=2, persistent_workers=persistent, **MIXED)
    it = iter(loader)
    seen = [int(i) for _ in range(5) for i in next(it)["id"]]
    os.kill(it._inner._workers[0].pid, signal.SIGKILL)
    time.sleep(0.3)
    with pytest.raises(errors.WorkerError, match="killed by SIGKILL"):
        while True:
            seen += [int(i) for i in next(it)["id"]]
    state = json.loads(json.dumps(loader.state_dict()))
    fresh, _ = StructuredDataset.create_dataloader(path, num_workers=3, **MIXED)
    fresh.load_state_dict(state)
    assert sorted(seen + ids_of_loader(fresh)[0]) == list(range(total))


# -- persistent workers: two pools in turn -----------------------------------------------------------


def test_two_pools_are_laid_out_in_turn_and_refuse_more_leases_than_they_hold():
    from arrowstream._worker.lease_pool import PoolSlots, SharedPool

    slots = PoolSlots(0, 3)
    first = slots.current()
    assert (first.epoch, len(first), first.take(1), first.take(0)) == (0, 3, 0, 1)
    second = slots.advance(1, 5)
    assert second is slots.current() and second is not first
    assert (second.epoch, len(second), second.owners().tolist()) == (1, 5, [-1] * 5)
    assert first.take(1) == 2 and first.owners().tolist() == [1, 0, 1]   # the old pool untouched
    assert slots.advance(2, 4) is first and first.owners().tolist() == [-1] * 4 and first.take(0) == 0
    assert slots.advance(3, first.capacity + 1) is None and slots.current() is first   # no room: nothing changes
    pool = SharedPool(0, 2, capacity=4)
    with pytest.raises(ValueError, match="room for 4"):
        pool.reset(1, 5)


def worker_pids(loader):
    return [worker.pid for worker in loader._iterator._workers]


@pytest.mark.parametrize("num_workers", [2, 3])
def test_persistent_workers_read_every_epoch_once_in_the_same_processes(folder, num_workers):
    path, total = folder
    loader, dataset = StructuredDataset.create_dataloader(path, num_workers=num_workers, transform=slow_first_worker,
                                                          persistent_workers=True, **MIXED)
    ledger = loader.state_dict()["dynamic"]   # starts the workers, which lease at once: nothing handed out yet
    left = sum(split[4] for split in ledger["splits"]) + sum(r["rows"] for r in ledger["replays"])
    assert left + total - ledger["fresh_from_row"] == total
    pids = None
    for epoch in range(3):
        dataset.set_epoch(epoch)
        ids, batches = ids_of_loader(loader)
        assert sorted(ids) == list(range(total)) and batches == len(loader)
        assert pids is None or worker_pids(loader) == pids
        pids = worker_pids(loader)


def test_persistent_workers_left_early_again_and_again_lose_nothing(folder):
    """Each iteration left after a few batches leaves fetches in flight, which take leases of its pool
    while the workers are told to start again: the next iteration's leases are in the other pool."""
    path, total = folder
    loader, dataset = StructuredDataset.create_dataloader(path, num_workers=2, transform=slow_first_worker,
                                                          persistent_workers=True, batches_per_transfer=2, **MIXED)
    for stop in (1, 4, 2, 7, 3):
        dataset.set_epoch(stop)
        assert len(ids_of_loader(loader, stop)[0]) == 32 * stop
        dataset.set_epoch(stop + 10)
        ids, batches = ids_of_loader(loader)
        assert sorted(ids) == list(range(total)) and batches == len(loader), stop
    # and a checkpoint in the middle of an iteration that followed one left early
    dataset.set_epoch(30)
    ids_of_loader(loader, 5)
    seen, _ = ids_of_loader(loader, 6)
    state = json.loads(json.dumps(loader.state_dict()))
    fresh, _ = StructuredDataset.create_dataloader(path, num_workers=3, persistent_workers=True, **MIXED)
    fresh.load_state_dict(state)
    assert sorted(seen + ids_of_loader(fresh)[0]) == list(range(total))


def test_a_checkpoint_loaded_into_running_persistent_workers_resumes_once(folder):
    path, total = folder
    loader, dataset = StructuredDataset.create_dataloader(path, num_workers=2, transform=slow_first_worker,
                                                          persistent_workers=True, **MIXED)
    dataset.set_epoch(2)
    seen, _ = ids_of_loader(loader, 9)
    state = json.loads(json.dumps(loader.state_dict()))
    ids_of_loader(loader, 20)   # read on past the checkpoint, then go back to it
    loader.load_state_dict(state)
    rest, batches = ids_of_loader(loader)
    assert sorted(seen + rest) == list(range(total)) and 9 + batches == len(loader)
    dataset.set_epoch(3)
    assert sorted(ids_of_loader(loader)[0]) == list(range(total))


def test_when_the_pools_have_no_room_for_an_epochs_leases_new_workers_start(folder, monkeypatch):
    from arrowstream._worker import lease_pool as _lease_pool

    monkeypatch.setattr(_lease_pool, "pool_capacity", lambda leases: 0)   # no room in the other pool
    path, total = folder
    loader, dataset = StructuredDataset.create_dataloader(path, num_workers=2, persistent_workers=True, **MIXED)
    pids = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        assert sorted(ids_of_loader(loader)[0]) == list(range(total))
        pids.append(worker_pids(loader))
    assert pids[0] != pids[1] != pids[2]


def costly_convert(batch):
    """A transform that costs much more than reading the batch (as a tokenizer would)."""
    import time

    time.sleep(0.01)
    return batch


def test_the_workers_lay_out_the_last_eighth_by_what_they_measured(folder):
    """The worker that reaches the last eighth first decides its tail pieces by the workers' reading and
    converting times so far: here the transform costs the most, so it is cut finer, in the first epoch."""
    path, total = folder
    loader, dataset = StructuredDataset.create_dataloader(path, num_workers=2, transform=costly_convert, **MIXED)
    assert sorted(ids_of_loader(loader)[0]) == list(range(total))
    pieces = dataset.policy.pool.pieces
    assert pieces > TAIL_LEASES_PER_WORKER and len(dataset.policy.pool) == len(dataset.policy.epochs.leases(0, 2, pieces))
    assert loader.metrics()["leases"] == len(dataset.policy.pool)


def test_the_pool_lays_out_its_last_eighth_once_when_its_first_lease_is_taken():
    from arrowstream._worker.lease_pool import SharedPool

    calls = []

    def decide(pieces, count):
        return lambda: calls.append(pieces) or (pieces, count)

    pool = SharedPool(0, 5, capacity=9, fixed=2)
    assert pool.pieces == TAIL_LEASES_PER_WORKER and len(pool) == 5
    assert [pool.take(0, decide(64, 8)), pool.take(1, decide(64, 8))] == [0, 1] and calls == []
    assert pool.take(1, decide(32, 8)) == 2 and calls == [32] and (pool.pieces, len(pool)) == (32, 8)
    assert [pool.take(0, decide(64, 9)) for _ in range(6)] == [3, 4, 5, 6, 7, None] and calls == [32]
    assert pool.snapshot() == (32, pytest.approx([0, 1, 1, 0, 0, 0, 0, 0]))
    small = SharedPool(0, 5, capacity=6, fixed=2)   # no room for the finer layout: the default stays
    assert [small.take(0, decide(64, 7)) for _ in range(6)] == [0, 1, 2, 3, 4, None]
    assert (small.pieces, len(small)) == (TAIL_LEASES_PER_WORKER, 5)
    with pytest.raises(errors.StateMismatchError, match="set_epoch was called after"):
        pool.check(0, 3, 1)


def _take_a_lease_and_hang(pool, inside):
    """A worker's step that never ends: it holds the pool's lock while it lays out the last eighth."""
    import time

    def decide():
        inside.set()
        time.sleep(120)
        return 64, 8

    pool.take(0, decide)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_worker_killed_while_it_takes_a_lease_does_not_keep_the_pool(method):
    """SIGKILL a worker inside the pool's lock (laying out the last eighth): the trainer still reads the
    pool for a checkpoint (a multiprocessing.Lock would be held by the dead worker forever: state_dict()
    hung), it finds nothing half laid out, and the next worker takes the lease the dead one never got."""
    import multiprocessing
    import os
    import signal
    import threading

    from arrowstream._worker.lease_pool import SharedPool

    context = multiprocessing.get_context(method)
    pool, inside = SharedPool(0, 5, capacity=9, fixed=0), context.Event()
    worker = context.Process(target=_take_a_lease_and_hang, args=(pool, inside), daemon=True)
    worker.start()
    assert inside.wait(120), "the worker never took the lock"
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(30)
    read = []
    trainer = threading.Thread(target=lambda: read.append(pool.snapshot()), daemon=True)
    trainer.start()
    trainer.join(30)
    assert read, "the trainer waits for a lock its dead holder keeps"
    assert (read[0][0], read[0][1].tolist()) == (TAIL_LEASES_PER_WORKER, [-1] * 5)
    assert pool.take(1, lambda: (32, 8)) == 0
    assert pool.snapshot() == (32, pytest.approx([1] + [-1] * 7))


def test_the_pool_and_its_lock_go_to_other_processes_only_when_they_start():
    import pickle

    from arrowstream._worker.lease_pool import SharedPool

    with pytest.raises(RuntimeError, match="inheritance"):
        pickle.dumps(SharedPool(0, 2))


@pytest.mark.parametrize("persistent", [False, True])
def test_finer_tail_leases_read_every_row_once_and_resume_once(folder, persistent, monkeypatch):
    """With the finest tail leases: the workers lay out the leases with the pool's count (a mismatch would
    be refused), and a checkpoint, which names rows, not leases, resumes exactly in a loader that lays out
    the default leases; a checkpoint in the tail too (where the layouts differ)."""
    import arrowstream._assignment.dynamic_epoch

    # in the workers too (forked after this)
    monkeypatch.setattr(arrowstream._assignment.dynamic_epoch, "tail_pieces", lambda read_s, convert_s: MAX_TAIL_LEASES_PER_WORKER)
    path, total = folder
    loader, dataset = StructuredDataset.create_dataloader(path, num_workers=2, transform=slow_first_worker,
                                                          persistent_workers=persistent, **MIXED)
    # before the last eighth (batch 103 of 118 on), inside it, among the stitched last batches, at the start
    for epoch, stop in ((1, 40), (2, 108), (3, 116), (4, None)):
        dataset.set_epoch(epoch)
        iterator = iter(loader)
        seen = [int(i) for _ in range(stop or 0) for i in next(iterator)["id"]]
        state = json.loads(json.dumps(loader.state_dict()))
        rest = [int(i) for batch in iterator for i in batch["id"]]
        assert sorted(seen + rest) == list(range(total)) and len(loader) == -(-total // 32)
        assert dataset.policy.pool.pieces == MAX_TAIL_LEASES_PER_WORKER
        assert len(dataset.policy.pool) > len(dataset.policy.epochs.leases(epoch, 2))
        fresh, _ = StructuredDataset.create_dataloader(path, num_workers=3, **MIXED)
        fresh.load_state_dict(state)
        assert sorted(seen + ids_of_loader(fresh)[0]) == list(range(total)), (epoch, stop)


def threads_of_reads(batch):
    """A transform that marks each batch with whether its worker's readers decode with pyarrow's threads."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()   # None: a batch stitched of the workers' last rows, transformed in the trainer
    runtime = None if info is None else info.dataset._side._runtime   # built: this batch was read with it
    flag = None if runtime is None else all(reader.use_threads for reader in runtime.readers)
    return {**batch, "threads": [flag] * len(batch["id"])}


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_decode_with_threads_only_in_the_last_eighth(folder, persistent):
    """Workers decode alone (one thread each) until they lease from the last eighth, where the workers that
    are done leave cores idle: then pyarrow's threads decode each read's columns together; alone again in
    the next epoch (persistent workers keep their readers)."""
    path, total = folder
    loader, dataset = StructuredDataset.create_dataloader(path, num_workers=2, transform=threads_of_reads,
                                                          batches_per_transfer=1, persistent_workers=persistent,
                                                          **{**MIXED, "interleave": 1})
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        flags, ids = [], []
        for batch in loader:
            flags.append(batch["threads"][0])
            ids += [int(i) for i in batch["id"]]
        assert sorted(ids) == list(range(total)) and len(flags) == len(loader)
        flags = [flag for flag in flags if flag is not None]   # the stitched batches: transformed in the trainer
        assert not any(flags[:len(flags) // 2]) and any(flags[-len(flags) // 4:]), (epoch, flags)


def test_persistent_workers_started_by_spawn_share_the_pools(folder):
    """Workers started by spawn get the pools by pickling (shared memory and a duplicate of the lock's file), not by
    inheritance: two epochs and a mid-epoch checkpoint, every row once."""
    path, total = folder
    loader, dataset = StructuredDataset.create_dataloader(path, num_workers=2, persistent_workers=True,
                                                          multiprocessing_context="spawn", **MIXED)
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        assert sorted(ids_of_loader(loader)[0]) == list(range(total))
    dataset.set_epoch(2)
    iterator = iter(loader)
    seen = [int(i) for _ in range(30) for i in next(iterator)["id"]]
    state = json.loads(json.dumps(loader.state_dict()))
    assert sorted(seen + [int(i) for batch in iterator for i in batch["id"]]) == list(range(total))
    fresh, _ = StructuredDataset.create_dataloader(path, num_workers=1, **MIXED)
    fresh.load_state_dict(state)
    assert sorted(seen + ids_of_loader(fresh)[0]) == list(range(total))
