"""Golden state files: every released state format version keeps loading, forever (guarantee 8)."""

from __future__ import annotations

import glob
import json
import os
import sys

import pytest
from helpers import (
    assert_replanned_continuation,
    golden_worker_version,
    ids_of,
    make_loader,
    replanned_by_an_older_cut,
)

from arrowstream._loader.torchdata_state import worker_state, worker_states

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
sys.path.insert(0, GOLDEN)

from make_golden import prepare_copy

FILES = sorted(f for f in glob.glob(os.path.join(GOLDEN, "v*", "*.json")) if not os.path.basename(f).startswith("mixture-"))


def test_there_is_a_golden_file_for_the_current_version():
    from arrowstream._state.versions import STATE_VERSION

    assert any(f"{os.sep}v{STATE_VERSION}{os.sep}" in f for f in FILES)


def test_there_are_golden_files_of_the_current_version_for_both_fronts():
    """From v11 a dataset's loader and a mixture's write one loader state kind and one merged checkpoint kind: the
    golden files of this version hold both fronts' states of both levels, mid-epoch and with workers."""
    from arrowstream._state.versions import CHECKPOINT_KIND, LOADER_KIND, STATE_VERSION

    found = set()
    for path in FILES + MIXTURE_FILES:
        with open(path) as f:
            golden = json.load(f)
        state = golden["state"]
        if state["version"] == STATE_VERSION and golden.get("num_workers") and "mid" in os.path.basename(path):
            ranks = state["ranks"] if state["kind"] == CHECKPOINT_KIND else [state]
            found |= {(state["kind"], rank["reads"]) for rank in ranks}
    assert found == {(kind, reads) for kind in (LOADER_KIND, CHECKPOINT_KIND) for reads in ("dataset", "mixture")}


def test_the_worker_states_of_the_current_version_are_one_kind_for_both_fronts():
    """From v12 a dataset's worker and a mixture's write one worker state kind: every worker state of this version's
    golden files (static, re-planned, dynamic, canonical and mixture cases) is "arrowstream.worker" of this version,
    reading what its loader state reads, with the one head; a mixture's keeps its sources beside it, a canonical one
    (from v13) its canonical slots' states."""
    from arrowstream._state.versions import CHECKPOINT_KIND, LOADER_KIND, STATE_VERSION

    seen = set()
    for path in [f for f in FILES + MIXTURE_FILES if f"{os.sep}v{STATE_VERSION}{os.sep}" in f]:
        with open(path) as f:
            state = json.load(f)["state"]
        for outer in state["ranks"] if state["kind"] == CHECKPOINT_KIND else [state]:
            for worker in worker_states(outer["dataloader"]):
                if worker is None:
                    continue
                assert (worker["kind"], worker["version"], worker["reads"]) == (
                    "arrowstream.worker", STATE_VERSION, outer["reads"]), path
                if "canonical" in worker:   # from v13: the head and the states of the canonical slots it reads
                    _check_canonical_worker(worker, path, outer["reads"])
                    seen.add((outer["reads"], "canonical", worker["slot"]["num_workers"], state["kind"]))
                    continue
                assert {"epoch", "slot", "counters", "epoch_complete", "options", "elastic"} <= set(worker), path
                assert ("sources" in worker) == (outer["reads"] == "mixture"), path
                if worker["elastic"] is not None:   # one elastic head too; a mixture's own pass_layout beside it
                    own = {"pass_layout"} if outer["reads"] == "mixture" else set()
                    twice = {"before"} if "before" in worker["elastic"] else set()   # re-planned again: optional
                    assert set(worker["elastic"]) == {"epoch", "world_size", "num_workers", "cursors", "cut"} | own | twice
                    if twice:   # the re-plan it was re-planned from, the same head (its own before only if deeper)
                        assert {"epoch", "world_size", "num_workers", "cursors", "cut"} | own <= set(
                            worker["elastic"]["before"]), path
                        seen.add((outer["reads"], "twice"))
                seen.add((outer["reads"], worker["elastic"] is not None, "dynamic" in outer))
    assert {("dataset", False, False), ("dataset", True, False), ("dataset", False, True), ("mixture", False, False),
            ("mixture", True, False), ("dataset", "twice"), ("mixture", "twice")} <= seen
    assert {("dataset", "canonical", 2, LOADER_KIND), ("dataset", "canonical", 1, CHECKPOINT_KIND),
            ("dataset", "canonical", 0, LOADER_KIND), ("mixture", "canonical", 2, LOADER_KIND),
            ("mixture", "canonical", 1, CHECKPOINT_KIND)} <= seen   # order="canonical" (v13): workers, ranks, none


def _check_canonical_worker(worker, path, reads):
    """A canonical worker state (v13) as docs/state-format.md says: the head (no ``elastic``: its canonical slots'
    states have their own) and ``canonical``; each canonical slot's state a worker state of this version of its
    front (``reads``: a dataset's, a mixture's), of rank c among ``slots`` ranks without workers, contiguous, at the
    worker's epoch and batch, the counters their sums."""
    from arrowstream._state.versions import STATE_VERSION

    assert set(worker) == {"kind", "version", "reads", "epoch", "slot", "counters", "epoch_complete", "options",
                           "canonical"}, path
    slots, states = worker["canonical"]["slots"], worker["canonical"]["states"]
    assert (worker["options"]["order"], worker["options"]["canonical_slots"]) == ("canonical", slots), path
    # from v14: the batches and rows each canonical slot handed out past its state (absent: none)
    past = worker["canonical"].get("past", [{"batches": 0, "rows": 0}] * len(states))
    assert set(worker["canonical"]) <= {"slots", "states", "past"} and len(past) == len(states), path
    first = states[0]["slot"]["rank"]
    for c, (inner, passed) in enumerate(zip(states, past, strict=True), first):
        assert (inner["kind"], inner["version"], inner["reads"]) == ("arrowstream.worker", STATE_VERSION, reads)
        assert inner["slot"] == {"rank": c, "world_size": slots, "worker_id": 0, "num_workers": 0}, path
        assert (inner["epoch"], inner["counters"]["batches"] + passed["batches"]) == (worker["epoch"],
                                                                                     worker["counters"]["batches"])
        own = {"data", "cursor"} if reads == "dataset" else {"sources", "history"}
        assert own | {"elastic"} <= set(inner) and "canonical" not in inner and inner["elastic"] is None, path
    assert worker["counters"]["rows"] == sum(inner["counters"]["rows"] + passed["rows"]
                                             for inner, passed in zip(states, past, strict=True)), path
    assert worker["counters"]["rows_dropped"] == sum(inner["counters"]["rows_dropped"] for inner in states), path


def test_states_of_version_12_migrate_to_13_unchanged():
    """v13 added order="canonical" (a canonical worker state, the options order and canonical_slots); a v12 state of
    every kind (loader, merged checkpoint, each worker state inside) migrates to v13, and on to this version, with only
    its version changed."""
    for path, _, worker in migrated_unchanged(12):
        assert "canonical" not in worker, path


def migrated_unchanged(version):
    """Every golden state of ``version``, checked to migrate to this version with only its version changed, and each
    worker state inside it, checked so too: (path, the loader state holding it, the worker state)."""
    from arrowstream._state import versions

    for path in sorted(glob.glob(os.path.join(GOLDEN, f"v{version}", "*.json"))):
        with open(path) as f:
            state = json.load(f)["state"]
        assert state["version"] == version, path
        assert versions.upgrade(json.loads(json.dumps(state)), state["kind"]) == {
            **state, "version": versions.STATE_VERSION}, path
        for outer in state["ranks"] if state["kind"] == versions.CHECKPOINT_KIND else [state]:
            for worker in (w for w in worker_states(outer["dataloader"]) if w is not None):
                assert worker["version"] == version, path
                assert versions.upgraded_worker(json.loads(json.dumps(worker))) == {
                    **worker, "version": versions.STATE_VERSION}, path
                yield path, outer, worker


def test_states_of_version_13_migrate_to_14_unchanged():
    """v14 added ``canonical.past`` to a canonical worker state (absent: none); a v13 state of every kind migrates to
    v14 with only its version changed, and the canonical ones say no batches past their states."""
    from arrowstream._state.canonical import CanonicalState

    canonical = 0
    for path, outer, worker in migrated_unchanged(13):
        if "canonical" in worker:
            parsed = CanonicalState.from_dict(json.loads(json.dumps(worker)), path, reads=outer["reads"])
            assert parsed.past == () and [parsed.past_of(i) for i in range(len(parsed.states))] == \
                [(0, 0)] * len(parsed.states), path
            canonical += 1
    assert canonical >= 5   # the v13 canonical states of both fronts, workers, ranks


@pytest.mark.parametrize("golden_file", FILES, ids=[os.path.relpath(f, GOLDEN) for f in FILES])
def test_golden_state_resumes_to_the_recorded_batches(tmp_path, golden_file):
    with open(golden_file) as f:
        golden = json.load(f)
    path = prepare_copy(str(tmp_path / "data"), golden.get("data", "data"))   # data-cut: a plan cut into ranges
    if golden["options"].get("data_identity") == "layout":   # a copy of the data with other modification times
        for name in os.listdir(path):
            os.utime(os.path.join(path, name))
    loader, dataset = make_loader(path, golden["num_workers"], **golden["options"])
    loader.load_state_dict(golden["state"])
    resumed, per_epoch = [], []
    for epoch in range(golden["epoch"], golden["epochs"][-1] + 1):
        dataset.set_epoch(epoch)
        per_epoch.append([ids_of(batch) for batch in loader])
        resumed += per_epoch[-1]
    if replanned_by_an_older_cut(golden):
        assert_replanned_continuation(golden, per_epoch)
        return
    if golden["options"].get("assignment") == "dynamic":
        # a dynamic resume promises the rows not yet yielded, each once, not their order (leases are laid
        # out anew): the same rows as recorded, in as many batches
        assert sorted(i for b in resumed for i in b) == sorted(i for b in golden["continuation_ids"] for i in b)
        assert len(resumed) == len(golden["continuation_ids"])
        return
    assert resumed == golden["continuation_ids"]


def _worker_state(loader_state):
    return worker_state(loader_state["dataloader"], 0)


def test_v1_states_migrate_step_by_step():
    """v2 added batches_per_transfer to the loader state (a v1 loader sent one batch per message);
    v3 turned the worker's (split_index, row_offset) into one lane of the interleaved cursor."""
    from arrowstream._state import versions

    with open(os.path.join(GOLDEN, "v1", "workers2-shuffle-mid.json")) as f:
        loader_state = json.load(f)["state"]
    upgraded = versions.upgrade(loader_state, versions.LOADER_KIND)
    assert upgraded["version"] == versions.STATE_VERSION
    assert upgraded["batches_per_transfer"] == 1
    worker = _worker_state(loader_state)
    v2 = versions.MIGRATIONS[(versions.WORKER_KIND, 1)](worker)
    assert v2["cursor"] == worker["cursor"]
    v3 = versions.MIGRATIONS[(versions.WORKER_KIND, 2)](v2)
    old = worker["cursor"]
    assert v3["cursor"] == {"lanes": [[old["split_index"], old["row_offset"]]],
                            "next_split_index": old["split_index"] + 1, "turn_index": 0, "block_offset": 0,
                            "window_index": 0, "window_offset": 0}


def test_a_v1_mixture_state_migrates_to_the_one_loader_kind():
    """A mixture's loader state of the retired kind (version 1, the first of which lack batches_per_transfer) is
    read as version 11 has it: the dataset's kind, ``reads`` added, its other fields unchanged."""
    from arrowstream._state.loader import read_loader_state
    from arrowstream._state.versions import LOADER_KIND, STATE_VERSION

    with open(os.path.join(GOLDEN, "mixture-v1", "workers2-shuffle-interleave-mid.json")) as f:
        saved = json.load(f)["state"]
    assert saved["kind"] == "arrowstream.mixture_loader" and "batches_per_transfer" not in saved
    read = read_loader_state(json.loads(json.dumps(saved)))
    assert {k: read[k] for k in ("kind", "version", "reads", "batches_per_transfer")} == {
        "kind": LOADER_KIND, "version": STATE_VERSION, "reads": "mixture", "batches_per_transfer": 1}
    assert {k: v for k, v in read.items() if k not in ("kind", "version", "reads", "batches_per_transfer")} == \
        {k: v for k, v in saved.items() if k not in ("kind", "version")}


@pytest.mark.parametrize("golden_file", [f for f in sorted(glob.glob(os.path.join(GOLDEN, "mixture-v*", "*.json")))
                                         if "-state-v" not in f and "elastic" not in f],
                         ids=lambda f: os.path.relpath(f, GOLDEN))
def test_a_v1_merged_mixture_checkpoint_resumes_to_the_recorded_batches(tmp_path, golden_file):
    """The retired merged mixture checkpoint (version 1) of a golden rank's state migrates to the one checkpoint
    kind and resumes as the state does."""
    from make_golden_mixture import batch_record, make

    golden, (loader, mixture) = _golden_mixture(tmp_path, golden_file, make)
    state = golden["state"]
    loader.load_state_dict({"kind": "arrowstream.mixture_checkpoint", "version": 1, "world_size": 1,
                            "num_workers": state["num_workers"], "ranks": [state]})
    resumed = []
    for epoch in range(golden["epoch"], golden["epochs"][-1] + 1):
        mixture.set_epoch(epoch)
        resumed += [batch_record(batch) for batch in loader]
    assert resumed == golden["continuation"]


# a mixture's: mixture-v<N>[-state-v<M>]/<case>.json, and from v12 (one worker kind) v<M>/mixture-<case>.json
MIXTURE_FILES = sorted(glob.glob(os.path.join(GOLDEN, "mixture-v*", "*.json"))
                       + glob.glob(os.path.join(GOLDEN, "v*", "mixture-*.json")))


def _golden_mixture(tmp_path, golden_file, make):
    """The golden record, and its mixture's loader over a fresh copy of the fixture data."""
    with open(golden_file) as f:
        golden = json.load(f)
    prepare_copy(str(tmp_path / "data"), "data")
    prepare_copy(str(tmp_path / "data-cut"), "data-cut")
    if golden.get("layout"):   # a copy of that source's data with other modification times
        for name in os.listdir(tmp_path / "data"):
            os.utime(tmp_path / "data" / name)
    return golden, make(str(tmp_path), golden)


@pytest.mark.parametrize("golden_file", MIXTURE_FILES, ids=[os.path.relpath(f, GOLDEN) for f in MIXTURE_FILES])
def test_golden_mixture_state_resumes_to_the_recorded_batches(tmp_path, golden_file):
    from make_golden_mixture import batch_record, make

    golden, (loader, mixture) = _golden_mixture(tmp_path, golden_file, make)
    loader.load_state_dict(golden["state"])
    resumed = []
    for epoch in range(golden["epoch"], golden["epochs"][-1] + 1):
        mixture.set_epoch(epoch)
        resumed += [batch_record(batch) for batch in loader]
    assert resumed == golden["continuation"]


@pytest.mark.parametrize("golden_file", [f for f in MIXTURE_FILES if "mid" in os.path.basename(f)],
                         ids=lambda f: os.path.relpath(f, GOLDEN))
def test_a_run_resumed_from_a_golden_mixture_state_checkpoints_in_its_order(tmp_path, golden_file):
    """A run resumed from an old state keeps that state's order inside batches, and its own checkpoints say
    so: one taken two batches after the golden one resumes, in a fresh loader, to the recorded batches."""
    from make_golden_mixture import batch_record, make

    golden, (loader, mixture) = _golden_mixture(tmp_path, golden_file, make)
    loader.load_state_dict(golden["state"])
    mixture.set_epoch(golden["epoch"])
    it = iter(loader)
    first = [batch_record(next(it)) for _ in range(2)]
    state = json.loads(json.dumps(loader.state_dict()))
    assert first == golden["continuation"][:2]
    version = golden_worker_version(golden_file)
    saved_order = "even" if version >= 3 else "permuted"   # versions 1 and 2 permuted each batch
    saved_layout = "spans" if version >= 4 else "tracks"   # versions 1 to 3 read passes in per-slot tracks
    saved = [s for s in worker_states(state["dataloader"]) if s is not None]
    assert {s["options"]["batch_order"] for s in saved} == {saved_order}
    assert {s["options"]["pass_layout"] for s in saved} == {saved_layout}
    again, again_mixture = make(str(tmp_path), golden)
    again.load_state_dict(state)
    resumed = []
    for epoch in range(golden["epoch"], golden["epochs"][-1] + 1):
        again_mixture.set_epoch(epoch)
        resumed += [batch_record(batch) for batch in again]
    assert resumed == golden["continuation"][2:]


def test_there_are_golden_mixture_states():
    assert len(MIXTURE_FILES) >= 3
