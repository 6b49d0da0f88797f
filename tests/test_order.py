"""Pure planning functions: epoch order, LPT assignment, slots (property-based)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from arrowstream._core.hashing import derive_seed, derive_seeds, permutation, permutations
from arrowstream._core.order import Slot, SlotGrid, assign_lpt, epoch_order, slot_row_counts, slot_split_ids
from arrowstream._mixing.quotas import batch_permutation, batch_permutations

weights = st.lists(st.integers(min_value=1, max_value=10_000), min_size=0, max_size=200)


@given(st.integers(0, 500), st.integers(0, 2**64 - 1))
def test_permutation_is_a_permutation(n, seed):
    order = permutation(n, seed)
    assert sorted(order.tolist()) == list(range(n))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3000), st.lists(st.integers(0, 2**64 - 1), max_size=5), st.sampled_from([None, 12, 40, 60, 63]))
def test_permutations_computed_together_are_each_seeds_permutation(n, seeds, index_bits):
    # index_bits: the low bits of a key that hold its index; with many, keys agree on the bits above and the
    # rows where they do are argsorted instead (the exact path, checked too)
    index_bits = None if index_bits is not None and (1 << index_bits) < n else index_bits
    orders = permutations(n, seeds, index_bits)
    assert orders.shape == (len(seeds), n)
    assert [order.tolist() for order in orders] == [permutation(n, seed).tolist() for seed in seeds]


def test_a_spans_batch_permutations_are_its_batches_permutations():
    together = batch_permutations(1024, 7, 3, 1, 4, [16, 17, 18])
    assert [order.tolist() for order in together] == [batch_permutation(1024, 7, 3, 1, 4, b).tolist() for b in (16, 17, 18)]


@given(st.lists(st.integers(0, 2**64 - 1), max_size=6), st.lists(st.integers(0, 2**64 - 1), max_size=20))
def test_seeds_derived_together_are_each_derived_alone(parts, last):
    together = derive_seeds(np.array(last, dtype=np.uint64), *parts)
    assert [int(seed) for seed in together] == [derive_seed(*parts, x) for x in last]


def test_permutation_is_stable_across_releases():
    # pinned values: a change here breaks resume of every saved shuffled checkpoint
    assert permutation(8, derive_seed(1, 2)).tolist() == [7, 4, 6, 0, 1, 3, 2, 5]


@given(st.integers(1, 300), st.integers(0, 1000), st.integers(0, 50))
def test_epoch_order_is_deterministic_and_epoch_dependent(n, seed, epoch):
    a = epoch_order(n, shuffle=True, seed=seed, epoch=epoch)
    assert np.array_equal(a, epoch_order(n, shuffle=True, seed=seed, epoch=epoch))
    if n >= 20:
        assert not np.array_equal(a, epoch_order(n, shuffle=True, seed=seed, epoch=epoch + 1))
    assert epoch_order(n, shuffle=False, seed=seed, epoch=epoch).tolist() == list(range(n))


@settings(max_examples=200)
@given(weights, st.integers(1, 16))
def test_lpt_assigns_every_item_to_exactly_one_slot(w, num_slots):
    owned = assign_lpt(w, num_slots)
    flat = sorted(i for items in owned for i in items)
    assert flat == list(range(len(w)))
    assert all(items == sorted(items) for items in owned)


@settings(max_examples=200)
@given(weights, st.integers(1, 16))
def test_lpt_balance_bound(w, num_slots):
    loads = [sum(w[i] for i in items) for items in assign_lpt(w, num_slots)]
    if w:
        # Graham's bound for LPT: max load <= mean load + largest item
        assert max(loads) <= sum(w) / num_slots + max(w)


@given(weights.filter(bool), st.integers(1, 8), st.integers(0, 100), st.integers(0, 20))
def test_slots_partition_the_epoch(w, num_slots, seed, epoch):
    seen = []
    for index in range(num_slots):
        slot = Slot(0, 1, index, num_slots)
        seen += slot_split_ids(w, slot, shuffle=True, seed=seed, epoch=epoch)
    assert sorted(seen) == list(range(len(w)))


@given(weights.filter(bool), st.integers(1, 8), st.integers(0, 100))
def test_slot_rows_do_not_depend_on_epoch(w, num_slots, seed):
    expected = slot_row_counts(w, num_slots)
    for epoch in range(3):
        rows = [sum(w[i] for i in slot_split_ids(w, Slot(0, 1, s, num_slots), shuffle=True, seed=seed, epoch=epoch))
                for s in range(num_slots)]
        assert rows == expected


def test_slot_index_covers_ranks_and_workers():
    indices = [Slot(r, 3, w, 2).index for r in range(3) for w in range(2)]
    assert indices == list(range(6))
    assert Slot(0, 1, 0, 0).num_slots == 1


@given(st.integers(1, 8), st.integers(0, 6))
def test_slot_grid_numbers_every_slot_once_rank_by_rank(world_size, num_workers):
    grid = SlotGrid(world_size, num_workers)
    slots = [grid.slot_at(index) for index in range(grid.num_slots)]
    assert [slot.index for slot in slots] == list(range(grid.num_slots))
    assert grid.num_slots == world_size * max(num_workers, 1)  # no workers: the rank's own process reads
    for rank in range(world_size):
        assert slots[grid.rank_range(rank)] == grid.rank_slots(rank)
        assert all(slot.rank == rank and slot.grid == grid for slot in grid.rank_slots(rank))
    assert {slot.worker_id for slot in slots} == set(range(grid.workers_per_rank))
