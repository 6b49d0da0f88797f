"""One re-plan for a dataset and a mixture (``arrowstream._layout.replan``), property-based: they cannot drift.

A dataset is a mixture of one source. Random plans, an old topology whose workers each stopped after a
random number of batches, and a new topology: the dataset's re-plan (:func:`remaining_items`,
:func:`cut_shares`, read as a new worker reads its share) and the re-plan of a mixture of one source whose
old slots read the same splits with the same window seeds (:func:`replanned_parts`, read through
:class:`SourceRows`) leave the same rows: per old slot, what that slot had not handed out (checked against
the rows its own stream goes on to hand out), and per new slot, the same stretch. Rows are ids from the
in-memory reader of tests/test_elastic_plan.py, so hundreds of layouts run in seconds.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pyarrow as pa
from helpers import replan_layouts
from hypothesis import given, settings
from hypothesis import strategies as st
from test_elastic_plan import IdReader, make_plan, normal_stream, share_stream, slots, take, through_json

from arrowstream._core.cursor import Cursor
from arrowstream._core.order import Slot, assign_lpt, slot_split_ids, window_seed
from arrowstream._core.plan_types import PLANNING_VERSION
from arrowstream._layout.elastic import cut_shares, remaining_items
from arrowstream._layout.replan import item_rows
from arrowstream._mixing.elastic import replanned_parts
from arrowstream._mixing.parts import ListParts, Part, Parts
from arrowstream._mixing.quotas import SPANS, TRACKS
from arrowstream._mixing.source_rows import SourceRows
from arrowstream._mixing.stream import MixSlot
from arrowstream._planning.plan import Plan
from arrowstream._state.mixture import MixElastic, SourceCursor
from arrowstream._state.worker import EVEN_CUT, Leftovers

NAME = "only"   # the mixture's one source


def old_parts(plan: Plan, layout: dict[str, Any], slot: Slot) -> Parts:
    """An old slot's parts of the one source: one part, the splits the dataset gives the slot, read with its seeds."""
    splits = plan.splits_for(slot.num_slots)
    mine = tuple(splits[i] for i in slot_split_ids([s.num_rows for s in splits], slot, shuffle=layout["shuffle"],
                                                   seed=layout["seed"], epoch=layout["epoch"]))
    seeds = functools.partial(window_seed, layout["seed"], layout["epoch"], slot)
    return ListParts([Part(mine, sum(s.num_rows for s in mine), seeds)])


def dataset_rows(plan: Plan, layout: dict[str, Any], cursors: list[Cursor | None]) -> list[Counter[int]]:
    """Each new slot's rows of the dataset's re-plan."""
    leftovers = Leftovers(layout["epoch"], *layout["old"], tuple(cursors), EVEN_CUT)
    items = remaining_items(plan, leftovers, shuffle=layout["shuffle"], seed=layout["seed"], assign=assign_lpt,
                            batch_size=layout["batch_size"], interleave=layout["interleave"],
                            buffer_rows=layout["buffer_rows"], planning=PLANNING_VERSION)
    new_slots = slots(*layout["new"])
    shares = cut_shares(items, len(new_slots))
    assert sum(share.num_rows for share in shares) == sum(map(item_rows, items))
    return [Counter(take(share_stream(plan, layout, leftovers, shares, slot))[0]) for slot in new_slots]


def mixture_rows(plan: Plan, layout: dict[str, Any], cursors: list[dict[str, SourceCursor] | None]) -> list[Counter[int]]:
    """Each new slot's rows of the re-plan of the mixture of one source, read as a mixture's worker reads them."""
    elastic = MixElastic(layout["epoch"], *layout["old"], tuple(cursors), layout["pass_layout"])
    per_old = [old_parts(plan, layout, slot) for slot in slots(*layout["old"])]
    news = [MixSlot(layout["epoch"], slot.rank, slot.world_size, slot.worker_id, slot.num_workers)
            for slot in slots(*layout["new"])]
    out = []
    for parts in replanned_parts(per_old, elastic, NAME, news, seed=layout["seed"], batch_size=layout["batch_size"],
                                 interleave=layout["interleave"], buffer_rows=layout["buffer_rows"]):
        readers = [IdReader(plan, layout["piece_rows"]) for _ in range(layout["interleave"])]
        rows = SourceRows(NAME, readers, parts, batch_size=layout["batch_size"], interleave=layout["interleave"],
                          buffer_rows=layout["buffer_rows"], start=SourceCursor(0, None, 0), url="memory://only")
        pieces, _ = rows.take_marked([parts.rows])
        out.append(Counter(pa.concat_batches(pieces).column("id").to_pylist() if pieces else []))
    return out


layouts = st.fixed_dictionaries({
    **replan_layouts(),
    "pass_layout": st.sampled_from([SPANS, TRACKS]),   # spans: a part not opened goes on whole
    "old_cuts": st.lists(st.integers(0, 12), min_size=9, max_size=9),   # batches each old slot handed out
    "unopened": st.booleans(),   # an old slot that handed out nothing: its part not opened (else its first row)
})


@settings(max_examples=150, deadline=None)
@given(layouts)
def test_a_dataset_and_a_mixture_of_one_source_leave_the_same_rows(layout):
    plan = make_plan(layout["files"], layout["split_bytes"])
    cursors: list[Cursor | None] = []
    mix_cursors: list[dict[str, SourceCursor] | None] = []
    truth: list[Counter[int]] = []   # what each old slot would have handed out after its checkpoint
    for slot, cut in zip(slots(*layout["old"]), layout["old_cuts"], strict=False):
        stream = normal_stream(plan, layout, slot, layout["epoch"])
        ids, finished = take(stream, cut)
        state = through_json(stream.state())
        truth.append(Counter(take(stream)[0]))
        if finished or state.epoch_complete:
            cursors.append(None)
            mix_cursors.append(None)
            continue
        cursors.append(state.cursor)
        unopened = not ids and layout["unopened"]
        mix_cursors.append({NAME: SourceCursor(0, None if unopened else state.cursor, len(ids))})

    # every old slot together: each new slot gets the same stretch of rows either way
    together = dataset_rows(plan, layout, cursors)
    assert together == mixture_rows(plan, layout, mix_cursors), "a new slot's rows differ between the two re-plans"
    assert sum(together, Counter()) == sum(truth, Counter()), "the re-plan lost or repeated a row"

    # one old slot at a time: the same rows left, and exactly those it had not handed out
    for index, cursor in enumerate(cursors):
        alone = [cursor if i == index else None for i in range(len(cursors))]
        mix_alone = [mix_cursors[index] if i == index else None for i in range(len(cursors))]
        left = sum(dataset_rows(plan, layout, alone), Counter())
        assert left == sum(mixture_rows(plan, layout, mix_alone), Counter()), f"old slot {index}: rows left differ"
        assert left == truth[index], f"old slot {index}: the rows left are not those it had not handed out"
