"""The pure elastic planner (``arrowstream._layout.elastic``), property-based: no files, no loader, no workers.

Random plans (files of units of rows, cut into splits), an old topology whose workers each stopped
after a random number of batches, and a new topology: the rest of the epoch re-planned over the new
slots hands out every row the old workers had not, exactly once (also from a state taken inside the
re-planned epoch), each new slot yields the rows its share announces, and the epochs after it are
whole. Rows are ids (``file index * ROWS_PER_FILE + row of the file``) from an in-memory reader, so
hundreds of layouts run in seconds; tests/test_elastic.py checks the same through real loaders.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from helpers import replan_layouts, share_runs
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_stream import EpochStream

from arrowstream._core.cursor import Cursor, Run
from arrowstream._core.order import Slot, SlotGrid, assign_lpt, slot_split_ids, window_seed
from arrowstream._core.piece import Piece
from arrowstream._core.plan_types import PLANNING_VERSION, FileEntry, Split
from arrowstream._core.stream import open_runs
from arrowstream._formats import FileFooter
from arrowstream._layout.elastic import assign_shares, cut_shares, remaining_items
from arrowstream._layout.layout import Layouts
from arrowstream._layout.replan import item_rows
from arrowstream._planning.plan import Plan, build_plan
from arrowstream._state.identity import DataIdentity
from arrowstream._state.worker import EVEN_CUT, LPT_CUT, Leftovers, WorkerState

ROWS_PER_FILE = 1_000_000
DATA = DataIdentity("0" * 32, 1, 0)
OPTIONS = {"planning": PLANNING_VERSION}  # what a worker state must name
SCHEMA = pa.schema([("id", pa.int64())])


class IdReader:
    """The ids of a split's rows from a source offset, ``piece_rows`` at a time (a SplitReader's contract)."""

    def __init__(self, plan: Plan, piece_rows: int) -> None:
        self.plan, self.piece_rows = plan, piece_rows

    def read(self, split: Split, position: int, offset: int) -> Iterator[Piece]:
        footer = self.plan.files[split.file_index]
        first = split.file_index * ROWS_PER_FILE + sum(footer.unit_rows[:split.unit_start]) + split.row_start
        for start in range(offset, split.num_rows, self.piece_rows):
            end = min(start + self.piece_rows, split.num_rows)
            ids = np.arange(first + start, first + end, dtype=np.int64)
            yield Piece(pa.record_batch({"id": ids}), position, start, end, None)

    def close(self) -> None:
        pass


def make_plan(files: list[list[int]], split_bytes: int | None) -> Plan:
    footers = [FileFooter(FileEntry(f"f{i}", f"f{i}", 10 * sum(units) + 8, ""), "parquet", SCHEMA, tuple(units),
                          tuple(10 * rows for rows in units), tuple(range(len(units))))
               for i, units in enumerate(files)]
    return build_plan("file", footers, SCHEMA, ["id"], None, split_bytes, identity={})


def all_ids(files: list[list[int]]) -> list[int]:
    return [i * ROWS_PER_FILE + row for i, units in enumerate(files) for row in range(sum(units))]


def slots(world_size: int, num_workers: int) -> list[Slot]:
    return [Slot(rank, world_size, worker, num_workers)
            for rank in range(world_size) for worker in range(max(num_workers, 1))]


def through_json(state: WorkerState) -> WorkerState:
    return WorkerState.from_dict(json.loads(json.dumps(state.to_dict())))


def stream_of(runs: Iterator[Run], end: Cursor, layout: dict[str, Any], slot: Slot, start: WorkerState) -> EpochStream:
    return EpochStream(runs=runs, end=end, batch_size=layout["batch_size"], drop_last=False,
                       convert=lambda batch: batch, data=DATA, options=OPTIONS, epoch=start.epoch, slot=slot, start=start)


def take(stream: EpochStream, batches: int | None = None) -> tuple[list[int], bool]:
    """The ids of up to ``batches`` batches (all when None), and whether the stream ended."""
    ids: list[int] = []
    while batches is None or batches > 0:
        try:
            ids += stream.next_record().column("id").to_pylist()
        except StopIteration:
            return ids, True
        batches = None if batches is None else batches - 1
    return ids, False


def normal_stream(plan: Plan, layout: dict[str, Any], slot: Slot, epoch: int) -> EpochStream:
    """A slot's epoch as the dataset reads it when nothing is re-planned."""
    splits = plan.splits_for(slot.num_slots)
    mine = [splits[i] for i in slot_split_ids([s.num_rows for s in splits], slot, shuffle=layout["shuffle"],
                                              seed=layout["seed"], epoch=epoch)]
    return splits_stream(plan, layout, slot, epoch, mine)


def splits_stream(plan: Plan, layout: dict[str, Any], slot: Slot, epoch: int, mine: Sequence[Split]) -> EpochStream:
    """A slot's epoch over the splits ``mine``, in their order."""
    start = Cursor.start(len(mine), layout["interleave"])
    readers = [IdReader(plan, layout["piece_rows"]) for _ in range(layout["interleave"])]
    runs = open_runs(readers, mine, batch_size=layout["batch_size"], interleave=layout["interleave"],
                     buffer_rows=layout["buffer_rows"], start=start,
                     window_seed=functools.partial(window_seed, layout["seed"], epoch, slot))
    return stream_of(runs, Cursor.end(len(mine)), layout, slot,
                     WorkerState(DATA, OPTIONS, epoch, slot, start, 0, 0, 0, False))


def share_stream(plan: Plan, layout: dict[str, Any], source: Leftovers, shares: list[Any], slot: Slot,
                 state: WorkerState | None = None) -> EpochStream:
    """A new slot's part of the re-planned epoch, from its start or from ``state``."""
    share = shares[slot.index]
    if state is None:
        start = Cursor.start(len(share.splits), layout["interleave"])
        state = WorkerState(DATA, OPTIONS, source.epoch, slot, start, 0, 0, 0, False, source)
    readers = [IdReader(plan, layout["piece_rows"]) for _ in range(layout["interleave"])]
    runs = share_runs(readers, share, seed=layout["seed"], epoch=source.epoch, slot=slot,
                      batch_size=layout["batch_size"], interleave=layout["interleave"],
                      buffer_rows=layout["buffer_rows"], start=state.cursor)
    return stream_of(runs, Cursor((), len(share.splits), replay_index=len(share.replays)), layout, slot, state)


layouts = st.fixed_dictionaries({
    **replan_layouts(),
    "cut": st.sampled_from([EVEN_CUT, LPT_CUT]),   # LPT: how states before version 9 re-planned, still resumed
    # batches each old worker handed out before the checkpoint (all of them: it finished), and where each
    # new worker's checkpoint inside the re-planned epoch is taken
    "old_cuts": st.lists(st.integers(0, 12), min_size=12, max_size=12),
    "new_cuts": st.lists(st.integers(0, 8), min_size=12, max_size=12),
})


@settings(max_examples=250, deadline=None)
@given(layouts)
def test_the_replanned_epoch_hands_out_every_row_left_exactly_once(layout):
    plan = make_plan(layout["files"], layout["split_bytes"])
    epoch = layout["epoch"]
    handed: list[int] = []
    cursors: list[Cursor | None] = []
    for slot, cut in zip(slots(*layout["old"]), layout["old_cuts"], strict=False):
        stream = normal_stream(plan, layout, slot, epoch)
        ids, finished = take(stream, cut)
        handed += ids
        state = through_json(stream.state())
        cursors.append(None if finished or state.epoch_complete else state.cursor)
    source = Leftovers(epoch, *layout["old"], tuple(cursors), layout["cut"])
    items = remaining_items(plan, source, shuffle=layout["shuffle"], seed=layout["seed"], assign=assign_lpt,
                            batch_size=layout["batch_size"], interleave=layout["interleave"],
                            buffer_rows=layout["buffer_rows"], planning=PLANNING_VERSION)
    new_slots = slots(*layout["new"])
    if layout["cut"] == EVEN_CUT:
        shares = cut_shares(items, len(new_slots))
        rows = [share.num_rows for share in shares]
        assert max(rows) - min(rows) <= 1, "the rows left were not cut into equal stretches"
        assert sum(rows) == sum(map(item_rows, items))
    else:
        shares = assign_shares(items, len(new_slots))
    assert len(shares) == len(new_slots)

    replanned: list[int] = []
    for slot, cut in zip(new_slots, layout["new_cuts"], strict=False):
        whole, _ = take(share_stream(plan, layout, source, shares, slot))
        assert len(whole) == shares[slot.index].num_rows   # what the loader's len() counts on, before reading
        stream = share_stream(plan, layout, source, shares, slot)
        head, finished = take(stream, cut)
        resumed = share_stream(plan, layout, source, shares, slot, through_json(stream.state()))
        tail = [] if finished else take(resumed)[0]
        assert head + tail == whole, "a checkpoint inside the re-planned epoch did not resume exactly"
        replanned += whole

    counts = Counter(handed + replanned)
    assert max(counts.values()) == 1, "a row came twice"
    assert sorted(counts) == all_ids(layout["files"]), "a row was lost"

    for later in (epoch + 1, epoch + 2):   # whole again, each a fresh epoch of the new topology
        ids = [i for slot in new_slots for i in take(normal_stream(plan, layout, slot, later))[0]]
        assert sorted(ids) == all_ids(layout["files"])


def round_robin(weights, num_slots):
    """An assignment policy other than LPT: item i to slot i mod num_slots."""
    return [list(range(slot, len(weights), num_slots)) for slot in range(num_slots)]


@dataclass(frozen=True)
class Order:
    """What the layout reads of a dataset's options (``OrderOptions``)."""

    batch_size: int
    interleave: int
    seed: int
    shuffle: bool
    shuffle_buffer_size: int
    drop_last: bool = False
    drops_rows: bool = False
    planning: int = PLANNING_VERSION


@settings(max_examples=150, deadline=None)
@given(layouts)
def test_a_replan_finds_the_old_workers_splits_by_the_layouts_own_policy(layout):
    """The layout's ``assign`` (here round robin) gives the old workers their splits; the re-plan must find
    them by it too, or it re-plans other rows than those the old workers had left (lost and repeated)."""
    plan = make_plan(layout["files"], layout["split_bytes"])
    epoch = layout["epoch"]
    options = Order(layout["batch_size"], layout["interleave"], layout["seed"], layout["shuffle"], layout["buffer_rows"])
    layouts = Layouts(plan, options, even_batches=False, assign=round_robin)
    old = layouts.layout(epoch, SlotGrid(*layout["old"]))
    left: Counter[int] = Counter()   # what the old workers would have handed out after the checkpoint
    cursors: list[Cursor | None] = []
    for slot, cut in zip(slots(*layout["old"]), layout["old_cuts"], strict=False):
        stream = splits_stream(plan, layout, slot, epoch, old.share(slot).splits)
        _, finished = take(stream, cut)
        state = through_json(stream.state())
        left += Counter(take(stream)[0])
        cursors.append(None if finished or state.epoch_complete else state.cursor)
    leftovers = Leftovers(epoch, *layout["old"], tuple(cursors), layout["cut"])
    replanned = layouts.layout(epoch, SlotGrid(*layout["new"]), leftovers)
    read: Counter[int] = Counter()
    for slot in slots(*layout["new"]):
        read += Counter(take(share_stream(plan, layout, leftovers, list(replanned.shares), slot))[0])
    assert read == left, "the re-plan read other rows than the old workers had left"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 500), min_size=0, max_size=12), st.integers(1, 16))
def test_shares_cover_the_ranges_and_leave_a_slot_idle_only_when_rows_run_out(rows, num_slots):
    ranges = [Split(i, 0, 1, 0, n, 10 * n) for i, n in enumerate(rows)]
    shares = assign_shares(ranges, num_slots)
    assert len(shares) == num_slots
    covered: dict[int, int] = {}
    for split in sorted((s for share in shares for s in share.splits), key=lambda s: (s.file_index, s.row_start)):
        assert split.row_start == covered.get(split.file_index, 0), "a range was cut with a gap or an overlap"
        covered[split.file_index] = split.row_start + split.num_rows
    assert [covered.get(i, 0) for i in range(len(rows))] == rows
    pieces = [s for share in shares for s in share.splits]
    if any(share.num_rows == 0 for share in shares):   # ranges are halved until every slot has one
        assert len(pieces) < num_slots and all(s.num_rows == 1 for s in pieces)
