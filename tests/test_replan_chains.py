"""Chains of re-plans, drawn at random (issue #38): every row of an epoch exactly once across any topology sequence.

A chain is 2 to 4 hops; each hop is a topology (world_size 1-3, ranks as explicit ``rank``/``world_size`` loaders in
this process, their states merged; num_workers 0-3, mostly 0 and 1) and a number of batches each rank reads of
epoch 0 before the checkpoint the next hop loads: none, a few, or past the rank's end (some ranks done, some inside
a shuffle window). The last hop reads the epoch to its end. Options are drawn too: shuffle, a small shuffle buffer
or none, interleave, drop_last, even_batches, files of even or uneven row groups.

What the hops read, together: no row twice; every row of the epoch but those the layouts left out (each slot that
ended its epoch in a layout leaves its share's rows it did not yield: trimmed by even_batches, dropped by drop_last)
once. The next epoch, read whole after the chain, is a fresh loader's on the last topology. For a dataset (static
assignment), a dynamic dataset (rows once, an order that timing decides) and a mixture (per source, each row as often
as an uninterrupted epoch on the first topology yields it, less what the layouts left out).

Each hop runs the ranks one after the other in this process; seeds are fixed (``derandomize``), so CI repeats.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from helpers import ids_of, json_roundtrip, write_dataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrowstream
from arrowstream import Mixture, Source, StructuredDataset, TrimWarning

BATCH = 16
FILES = {"even": [(96, 24), (96, 24), (96, 24)],                  # 288 rows in 12 row groups
         "uneven": [(130, 26), (70, 35), (45, 15), (37, 37)]}     # 282 rows in 12 row groups of 4 sizes
pytestmark = [pytest.mark.filterwarnings("ignore:This DataLoader will create"),
              pytest.mark.filterwarnings("ignore::arrowstream.TrimWarning")]


def _chains(max_examples: int) -> settings:
    """Few examples, always the same ones (``derandomize``); ``CHAINS_EXAMPLES=200`` hunts longer by hand."""
    return settings(max_examples=int(os.environ.get("CHAINS_EXAMPLES", max_examples)), deadline=None,
                    derandomize=True, print_blob=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


@dataclass(frozen=True)
class Hop:
    """One run of the chain: its topology and the batches each rank reads (None: to its end)."""

    world_size: int
    num_workers: int
    steps: tuple[int | None, ...]


@st.composite
def hops(draw: Any) -> list[Hop]:
    out = []
    count = draw(st.integers(2, 4))
    for index in range(count):
        world_size = draw(st.sampled_from([1, 2, 2, 3]))
        num_workers = draw(st.sampled_from([0, 0, 1, 1, 2, 3]))
        last = index == count - 1
        steps = tuple(None if last else draw(st.sampled_from([0, 1, 2, 3, 5, None])) for _ in range(world_size))
        out.append(Hop(world_size, num_workers, steps))
    return out


@st.composite
def options(draw: Any) -> dict[str, Any]:
    shuffle = draw(st.booleans())
    return {"batch_size": BATCH, "seed": 7, "shuffle": shuffle,
            "shuffle_buffer_size": draw(st.sampled_from([0, 40])) if shuffle else 0,
            "interleave": draw(st.integers(1, 3)), "drop_last": draw(st.booleans()),
            "even_batches": draw(st.booleans())}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("chains")
    return {name: write_dataset(root / name, layout) for name, layout in FILES.items()}


# -- the run of one hop, and what its layouts left out ----------------------------------------------------------


@dataclass
class Run:
    """What one hop's ranks read: each rank's ids and batches and whether its loop ran out, the merged checkpoint
    after them, and the loaders."""

    ids: list[list[Any]]
    batches: list[int]
    exhausted: list[bool]
    state: dict[str, Any]
    loaders: list[tuple[Any, Any]]


def _hop(make, hop: Hop, state: dict[str, Any] | None, rows_of) -> Run:
    ids, batches, exhausted, states, loaders = [], [], [], [], []
    for rank in range(hop.world_size):
        loader, dataset = make(hop.num_workers, rank, hop.world_size)
        if state is not None:
            loader.load_state_dict(state)
        dataset.set_epoch(0)
        mine: list[Any] = []
        steps, count, ran_out = hop.steps[rank], 0, False
        if steps != 0:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TrimWarning)
                for batch in loader:
                    mine += rows_of(batch)
                    count += 1
                    if count == steps:
                        break
                else:
                    ran_out = True
        ids.append(mine)
        batches.append(count)
        exhausted.append(ran_out)
        states.append(loader.state_dict())
        loaders.append((loader, dataset))
    merged = json_roundtrip(arrowstream.merge_state_dicts(states) if hop.world_size > 1 else states[0])
    return Run(ids, batches, exhausted, merged, loaders)


def slots_left_out(run: Run, hop: Hop, memory: dict[str, Any], figures) -> int:
    """Rows the slots that ended their epoch in this hop's layout did not yield of their share, each slot once over
    the hops of one layout (``memory``); a slot ended when its state says so or when it yielded the batches
    ``even_batches`` let it. ``figures(dataset, hop)``: each slot's rows and batch limit (None: no limits)."""
    slot_rows, limits = figures(run.loaders[0][1], hop)
    counted = memory.setdefault("counted", set())
    about = arrowstream.describe_state(run.state)
    per_rank = max(hop.num_workers, 1)
    left = 0
    for rank in about["ranks"]:
        for worker in rank["workers"]:
            index = rank["rank"] * per_rank + worker["worker"]
            if worker["epoch"] != 0 or index in counted:
                continue
            if worker["epoch_complete"] or (limits is not None and worker["batches"] >= limits[index]):
                counted.add(index)
                left += slot_rows[index] - worker["rows"]
    return left


def ranks_left_out(run: Run, hop: Hop, memory: dict[str, Any]) -> int:
    """Dynamic assignment: rows the ranks that ended their epoch in this hop's layout did not yield of their share
    (``rank_yields``; the rows and batches each rank read are counted over the hops of one layout in ``memory``). A
    rank ended when its loop ran out or it yielded its batches: its rest is then empty, and its tail (what
    ``even_batches`` and ``drop_last`` leave out) is not re-planned."""
    yields = run.loaders[0][1].rank_yields(hop.num_workers)
    rows, batches, counted = (memory.setdefault(key, value) for key, value in
                              (("rows", Counter()), ("batches", Counter()), ("counted", set())))
    left = 0
    for rank in range(hop.world_size):
        rows[rank] += len(run.ids[rank])
        batches[rank] += run.batches[rank]
        if rank not in counted and (run.exhausted[rank] or batches[rank] >= yields[rank][1]):
            counted.add(rank)
            left += yields[rank][0] - rows[rank]
    return left


def _chain(make, chain: list[Hop], rows_of, left_out,
           layout_of=lambda hop: (hop.world_size, hop.num_workers)) -> tuple[list[Any], int, list[tuple[Any, Any]]]:
    """Run the chain; the rows read over all hops, the rows its layouts left out, the last hop's loaders. A hop
    reads the layout of the one before when ``layout_of`` both is the same (a topology: its slots; dynamic
    assignment: the world size, whose ranks' rows are fixed however many workers lease them)."""
    seen: list[Any] = []
    state, left, memory, previous = None, 0, {}, None
    for hop in chain:
        over = state is not None and all(rank["epoch_over"] for rank in arrowstream.describe_state(state)["ranks"])
        run = _hop(make, hop, state, rows_of)
        if over:   # the epoch had ended: a loader of any topology reads nothing more of it, and leaves nothing out
            assert not any(run.ids), "a row read after the epoch had ended"
            state, previous = run.state, hop
            continue
        if previous is not None and layout_of(previous) != layout_of(hop):
            memory = {}   # a new layout: the rest re-planned over this topology's slots (ranks)
        left += left_out(run, hop, memory)
        seen += [row for mine in run.ids for row in mine]
        state, previous = run.state, hop
    return seen, left, run.loaders


def _next_epoch(make, loaders, hop: Hop, rows_of, ordered: bool) -> None:
    """Epoch 1, read whole on the chain's last loaders, is what fresh loaders of that topology read."""
    for rank, (loader, dataset) in enumerate(loaders):
        dataset.set_epoch(1)
        fresh, fresh_dataset = make(hop.num_workers, rank, hop.world_size)
        fresh_dataset.set_epoch(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TrimWarning)
            after = [rows_of(batch) for batch in loader]
            expected = [rows_of(batch) for batch in fresh]
        if ordered:
            assert after == expected, f"rank {rank}: epoch 1 after the chain is not a fresh loader's"
        else:
            assert sorted(r for b in after for r in b) == sorted(r for b in expected for r in b), \
                f"rank {rank}: epoch 1 after the chain holds other rows than a fresh loader's"


# -- a dataset, static and dynamic ------------------------------------------------------------------------------


def _dataset_figures(dataset, hop: Hop) -> tuple[list[int], list[int] | None]:
    return [rows for rows, _, _ in dataset.slot_yields(hop.num_workers)], dataset.batch_limits(hop.num_workers)


def _check_dataset(path: str, chain: list[Hop], opts: dict[str, Any], assignment: str) -> None:
    def make(num_workers: int, rank: int, world_size: int):
        return StructuredDataset.create_dataloader(path=path, num_workers=num_workers, rank=rank,
                                                   world_size=world_size, plan_locally=True, assignment=assignment,
                                                   plan_cache=False, **opts)

    if assignment == "static":
        def left_out(run, hop, memory):
            return slots_left_out(run, hop, memory, _dataset_figures)
    else:
        left_out = ranks_left_out
    seen, left, loaders = _chain(make, chain, ids_of, left_out, **(
        {} if assignment == "static" else {"layout_of": lambda hop: hop.world_size}))
    counts = Counter(seen)
    total = StructuredDataset(path).num_rows
    assert not counts or max(counts.values()) == 1, f"a row came twice: {[i for i, n in counts.items() if n > 1][:5]}"
    assert set(counts) <= set(range(total))
    assert len(counts) + left == total, f"{total - len(counts)} rows not read, {left} counted as trimmed or dropped"
    _next_epoch(make, loaders, chain[-1], ids_of, ordered=assignment == "static")


@pytest.mark.timeout(120)
@_chains(12)
@given(chain=hops(), opts=options(), files=st.sampled_from(sorted(FILES)))
def test_a_chain_of_replans_reads_a_datasets_epoch_exactly_once(folders, chain, opts, files):
    _check_dataset(folders[files], chain, opts, "static")


@pytest.mark.timeout(120)
@_chains(8)
@given(chain=hops(), opts=options(), files=st.sampled_from(sorted(FILES)))
def test_a_chain_of_replans_reads_a_dynamic_datasets_epoch_exactly_once(folders, chain, opts, files):
    _check_dataset(folders[files], chain, opts, "dynamic")


# -- a mixture --------------------------------------------------------------------------------------------------

MIX = {"weights": {"a": 2, "b": 1}, "epoch_rows": 360, "source_column": "src", "plan_cache": False}


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    """Source a: ids 0..281 (uneven files), b: ids 0..89 (read in more than one pass an epoch); rows are (source, id)."""
    root = tmp_path_factory.mktemp("chains-mix")
    return {"a": Source(write_dataset(root / "a", FILES["uneven"])),
            "b": Source(write_dataset(root / "b", [(90, 30)], seed=1))}


def _mix_rows(batch) -> list[tuple[str, int]]:
    return list(zip(batch["src"], batch["id"].tolist(), strict=True))


@pytest.mark.timeout(120)
@_chains(8)
@given(chain=hops(), opts=options())
def test_a_chain_of_replans_reads_a_mixtures_epoch_exactly_once_per_source(two_sources, chain, opts):
    def make(num_workers: int, rank: int, world_size: int, **changed: Any):
        return Mixture.create_dataloader(sources=two_sources, num_workers=num_workers, rank=rank,
                                         world_size=world_size, plan_locally=True, **{**MIX, **opts, **changed})

    first = chain[0]
    whole: Counter[tuple[str, int]] = Counter()
    for rank in range(first.world_size):   # the epoch uninterrupted on the first topology, nothing left out
        loader, mixture = make(first.num_workers, rank, first.world_size, even_batches=False, drop_last=False)
        mixture.set_epoch(0)
        whole.update(row for batch in loader for row in _mix_rows(batch))

    def figures(mixture, hop: Hop) -> tuple[list[int], list[int] | None]:
        quotas = [sum(quota.values()) for quota in mixture.slot_quotas(hop.num_workers)]
        even = opts["even_batches"] and hop.world_size > 1
        return quotas, mixture.batch_limits(hop.num_workers) if even else None

    def left_out(run, hop, memory):
        return slots_left_out(run, hop, memory, figures)

    seen, left, loaders = _chain(make, chain, _mix_rows, left_out)
    counts = Counter(seen)
    assert not counts - whole, f"rows more often than in the epoch: {list((counts - whole).items())[:5]}"
    assert sum((whole - counts).values()) == left, f"{sum((whole - counts).values())} rows not read, {left} counted"
    _next_epoch(make, loaders, chain[-1], _mix_rows, ordered=True)


# -- what the chains found, as plain regression tests ----------------------------------------------------------


def _dynamic_run(path, world_size, state, steps, **options):
    """Every rank of ``world_size`` (no workers) loads ``state`` and reads ``steps`` batches of epoch 0 (None: to
    its end): the ids, the rows its figures leave out (trimmed and dropped) and the merged checkpoint."""
    make = functools.partial(StructuredDataset.create_dataloader, path=path, num_workers=0, world_size=world_size,
                             plan_locally=True, assignment="dynamic", plan_cache=False, batch_size=BATCH, **options)
    ids, left, states = [], 0, []
    for rank in range(world_size):
        loader, dataset = make(rank=rank)
        if state is not None:
            loader.load_state_dict(state)
        dataset.set_epoch(0)
        for count, batch in enumerate(loader if steps != 0 else (), 1):
            ids += ids_of(batch)
            if count == steps:
                break
        left += dataset.rows_trimmed_per_epoch(0) + dataset.rows_dropped_per_epoch(0)
        states.append(loader.state_dict())
    return ids, left, json_roundtrip(arrowstream.merge_state_dicts(states) if world_size > 1 else states[0])


@pytest.mark.parametrize("steps", [0, 1])
def test_a_dynamic_replan_reads_the_rows_an_old_ranks_drop_last_would_have_dropped(folders, steps):
    """1 rank -> 2 with drop_last: the old rank's last short batch (10 rows) was cut from its ledger's work, so the
    re-plan left those rows out, read by no rank and counted by none (26 rows missing, 16 counted). The re-plan now
    takes on an old rank's rows past what it yields while it has rows left."""
    before, _, state = _dynamic_run(folders["uneven"], 1, None, steps, drop_last=True, even_batches=False)
    after, left, _ = _dynamic_run(folders["uneven"], 2, state, None, drop_last=True, even_batches=False)
    counts = Counter(before + after)
    assert max(counts.values()) == 1
    assert len(counts) + left == 282, f"{282 - len(counts)} rows not read, {left} counted as dropped"


def test_a_dynamic_replan_reads_the_rows_even_batches_would_have_trimmed_from_an_old_rank():
    """2 ranks over 3 files of 100 rows (200 rows and 100) -> 1 rank: under even_batches each old rank yields 7
    batches, so rank 0's work was cut to 112 rows and the re-plan lost its other 88, read by no rank and counted by
    none; checkpointed after 2 batches, nothing had been trimmed yet, and one rank reads the rest whole: every row
    once."""
    import tempfile

    path = write_dataset(tempfile.mkdtemp(), [(100, 100), (100, 100), (100, 100)])
    before, _, state = _dynamic_run(path, 2, None, 2)
    after, left, _ = _dynamic_run(path, 1, state, None)
    counts = Counter(before + after)
    assert max(counts.values()) == 1 and left == 0
    assert sorted(counts) == list(range(300)), f"{300 - len(counts)} rows lost"


def test_a_mixture_loop_that_ended_inside_a_replanned_epoch_loads_on_another_topology(two_sources):
    """1 worker-less rank reads 20 of its 22 batches; 3 workers take the last 40 rows, 13 or 14 each, and with drop_last
    yield none: the loop ends at once, its workers' snapshots still those of the start of their re-planned slots. Loaded
    on another topology, that ended loop was counted to its end in the epoch as planned for 3 workers (21 batches),
    not as re-planned, and refused as tampered (StateError "its workers have 21 batch(es) left")."""
    options = {**MIX, "batch_size": BATCH, "drop_last": True, "shuffle": False}

    def make(num_workers: int):
        return Mixture.create_dataloader(sources=two_sources, num_workers=num_workers, **options)

    loader, mixture = make(0)
    mixture.set_epoch(0)
    batches = iter(loader)
    before = [row for _ in range(20) for row in _mix_rows(next(batches))]
    state = json_roundtrip(loader.state_dict())
    loader, mixture = make(3)
    loader.load_state_dict(state)
    mixture.set_epoch(0)
    assert not list(loader)   # every worker's 13 or 14 rows dropped
    ended = json_roundtrip(loader.state_dict())
    loader, mixture = make(0)
    loader.load_state_dict(ended)
    mixture.set_epoch(0)
    assert not list(loader) and len(before) == 320
    mixture.set_epoch(1)
    fresh, fresh_mixture = make(0)
    fresh_mixture.set_epoch(1)
    assert [_mix_rows(b) for b in loader] == [_mix_rows(b) for b in fresh]
