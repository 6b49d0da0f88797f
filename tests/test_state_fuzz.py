"""State fuzzing (issue #16): a mutated state is refused with a ``StateError`` at load, or resumes exactly.

Valid states (0 and 2 workers; shuffle buffer and interleave; an epoch re-planned for another
topology; merged checkpoints) are changed one field at a time, the way a corrupted or hand-edited
checkpoint would be: another type, negative, huge, off by one, a bool for an int, a key deleted
or added, list items swapped, in the worker states, the loader's wrapper, the merged checkpoint
and torchdata's own dict. Whatever loads must yield exactly the rows the run had not yielded
before the checkpoint, each once. The dynamic ledger of ``assignment="dynamic"`` (issue #36) is
fuzzed the same way, its own fields most of the time, with no field left out.

Two changes are left out, because they make another valid state, which loads and yields its own
rest: a worker state's ``epoch`` (the same position in another epoch's order), and, in a
re-planned epoch, old workers' cursors in ``elastic.cursors`` swapped or set to null (an old worker
that had finished). Telling the latter apart would need the rows each old worker had left, which
the state format does not store.

Mixtures (#36) the same way: mixture loader states (0 and 2 workers, a shuffle buffer, interleave, a
source of 5 rows read in 8 passes an epoch, so held and each part read whole), a mixture worker
state alone (as a plain ``StatefulDataLoader`` loads it into the mixture), merged checkpoints of two
ranks (loaded by rank 0 of 2, and re-planned for one rank) and a state inside that re-planned epoch.
Whatever loads must yield the same rows, as a multiset of (source, id) (a source read in passes
gives a row several times), as the untampered resume: the rest of the saved epoch and the next one.
The same two changes are left out, for the same reasons: a mixture worker state's ``epoch`` (a
state done with epoch 0 edited to epoch 1 is the valid state done with epoch 1), and the old slots'
cursors of a re-planned epoch swapped or set to null.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import ids_of, json_roundtrip, make_loader, write_dataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arrowstream import Mixture, Source, errors, merge_state_dicts
from arrowstream._mixing.stream import MixSlot
from arrowstream._worker.held import holds

OPTIONS = {"batch_size": 16, "interleave": 2, "shuffle_buffer_size": 64, "even_batches": False}
OTHER_TYPES = [None, "x", 1.5, [], {}, True, False, [0, 0]]


@dataclass
class Case:
    """A valid state, the loader it loads into, and the rows it must yield: all but ``before``."""

    state: dict[str, Any]
    num_workers: int
    loader_args: dict[str, Any]
    before: list[int]
    rows: list[int]


def _run(path: str, num_workers: int, batches: int, **kwargs: Any) -> tuple[dict[str, Any], list[int], list[int]]:
    """The state after ``batches`` batches of epoch 0 (None: after the loop), the ids before it, all ids."""
    loader, dataset = make_loader(path, num_workers, **OPTIONS, **kwargs)
    dataset.set_epoch(0)
    ids: list[int] = []
    state = None
    for step, batch in enumerate(loader):
        ids += ids_of(batch)
        if step + 1 == batches:
            state, before = json_roundtrip(loader.state_dict()), list(ids)
    if state is None:
        state, before = json_roundtrip(loader.state_dict()), list(ids)
    return state, before, ids


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Case]:
    """1,000 rows in 11 splits; every case's state is taken once, in this process (0 workers) or two."""
    path = write_dataset(tmp_path_factory.mktemp("fuzz"), [(600, 100), (400, 80)])
    out: dict[str, Case] = {"path": path}  # type: ignore[dict-item]
    for name, batches in (("mid", 7), ("after", None)):
        state, before, rows = _run(path, 0, batches or 0)
        out[name] = Case(state, 0, {}, before, rows)
    ranks = [_run(path, 0, 3 + rank, rank=rank, world_size=2) for rank in range(2)]
    merged = merge_state_dicts([state for state, _, _ in ranks])
    out["merged"] = Case(merged, 0, {"rank": 0, "world_size": 2}, ranks[0][1], ranks[0][2])
    out["merged-replanned"] = Case(merged, 0, {}, ranks[0][1] + ranks[1][1], list(range(1000)))
    # inside an epoch re-planned for one rank: its worker state carries where the two ranks stood
    loader, _ = make_loader(path, 0, **OPTIONS)
    loader.load_state_dict(merged)
    it = iter(loader)
    replanned = [i for _ in range(4) for i in ids_of(next(it))]
    out["elastic"] = Case(json_roundtrip(loader.state_dict()), 0, {}, out["merged-replanned"].before + replanned,
                          list(range(1000)))
    state, before, rows = _run(path, 2, 5)
    out["workers2"] = Case(state, 2, {}, before, rows)
    return out


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every field of a JSON value, containers included, depth first (deterministic order)."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key in sorted(value):
            out += _paths(value[key], (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


def _mutations(value: Any, path: tuple[Any, ...]) -> list[str]:
    ops = ["type", "delete"]
    if path[-1] == "cursors" or (len(path) > 1 and path[-2] == "cursors"):
        return ["delete", "add"] if path[-1] == "cursors" else ["delete"]  # see the module docstring
    if isinstance(value, int) and not isinstance(value, bool):
        ops += ["negative", "huge", "plus1", "minus1", "bool"]
    if isinstance(value, bool):
        ops += ["int"]
    if isinstance(value, (dict, list)):
        ops += ["add"]
    if isinstance(value, list) and len(value) >= 2:
        ops += ["swap"]
    return ops


@st.composite
def mutated(draw: Any, state: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``state`` with one field changed, and what was done (for the failure message)."""
    paths = [p for p in _paths(state) if not (p[-1] == "epoch" and "slot" in _parent(state, p))]
    path = draw(st.sampled_from(paths))
    state = copy.deepcopy(state)
    parent = _parent(state, path)
    key = path[-1]
    value = parent[key]
    op = draw(st.sampled_from(_mutations(value, path)))
    if op == "delete":
        del parent[key]
    elif op == "type":
        parent[key] = draw(st.sampled_from([v for v in OTHER_TYPES if type(v) is not type(value)]))
    elif op == "negative":
        parent[key] = -1 - value
    elif op == "huge":
        parent[key] = draw(st.sampled_from([10**6, 10**9, 2**64]))
    elif op in ("plus1", "minus1"):
        parent[key] = value + (1 if op == "plus1" else -1)
    elif op == "bool":
        parent[key] = bool(value)
    elif op == "int":
        parent[key] = int(value)
    elif op == "add":
        if isinstance(value, dict):
            value[draw(st.sampled_from(["extra", "_snapshot", "dataset_state", "lanes", "kind"]))] = 0
        else:
            value.append(copy.deepcopy(value[-1]) if value else 0)
    else:  # swap
        i, j = draw(st.sampled_from([(0, 1), (0, len(value) - 1), (len(value) - 2, len(value) - 1)]))
        value[i], value[j] = value[j], value[i]
    return state, f"{op} at {'.'.join(map(str, path))}"


def _parent(state: dict[str, Any], path: tuple[Any, ...]) -> Any:
    target: Any = state
    for key in path[:-1]:
        target = target[key]
    return target


def _refused_or_exact(case: Case, path: str, state: dict[str, Any], what: str) -> None:
    loader, _ = make_loader(path, case.num_workers, **OPTIONS, **case.loader_args)
    try:
        loader.load_state_dict(state)
    except errors.StateError:
        return
    after = [i for batch in loader for i in ids_of(batch)]
    assert sorted(case.before + after) == sorted(case.rows), f"{what}: loaded, and yielded other rows than the rest"


def _fuzz(max_examples: int) -> settings:
    return settings(max_examples=max_examples, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.parametrize("name", ["mid", "after", "merged", "merged-replanned", "elastic"])
@pytest.mark.timeout(120)
def test_a_mutated_state_is_refused_or_resumes_exactly(cases, name):
    case = cases[name]

    @_fuzz(150)
    @given(mutated(case.state))
    def check(change):
        _refused_or_exact(case, cases["path"], *change)

    check()


@pytest.mark.timeout(180)
def test_a_mutated_state_with_workers_is_refused_or_resumes_exactly(cases):
    """Fewer examples: a state that loads starts two worker processes."""
    case = cases["workers2"]

    @_fuzz(40)
    @given(mutated(case.state))
    def check(change):
        _refused_or_exact(case, cases["path"], *change)

    check()


# -- dynamic ledgers (issue #36): a ledger edited is refused, or leaves exactly the rows it left ------------


@pytest.fixture(scope="module")
def dynamic_cases(cases) -> dict[str, Case]:
    """Ledgers of ``assignment="dynamic"``: one process after 7 batches (a replay of its window and the rest of
    the splits it held), and an epoch resumed from 2 workers' ledger by one process, a batch on (the rest
    of the old workers' windows: 48 rows at least, whatever the timing). 0 workers: a resume reads in this
    process."""
    path, dynamic = cases["path"], {"assignment": "dynamic"}
    out: dict[str, Case] = {}
    state, before, rows = _run(path, 0, 7, **dynamic)
    out["dynamic-mid"] = Case(state, 0, dynamic, before, rows)
    old, before, rows = _run(path, 2, 5, **dynamic)
    loader, _ = make_loader(path, 0, **OPTIONS, **dynamic)
    loader.load_state_dict(old)
    it = iter(loader)
    before = before + ids_of(next(it))
    out["dynamic-resumed"] = Case(json_roundtrip(loader.state_dict()), 0, dynamic, before, list(range(1000)))
    for case in out.values():
        assert case.state["dynamic"]["replays"] and case.state["dynamic"]["splits"]
    return out


def _ledger_mutated(state: dict[str, Any]) -> Any:
    """One field of the ledger changed (mostly), or of the whole state."""
    ledger = mutated(state["dynamic"]).map(lambda change: ({**state, "dynamic": change[0]}, f"dynamic.{change[1]}"))
    return st.one_of(ledger, ledger, ledger, mutated(state))


@pytest.mark.parametrize("name", ["dynamic-mid", "dynamic-resumed"])
@pytest.mark.timeout(120)
def test_a_mutated_dynamic_ledger_is_refused_or_leaves_exactly_the_rest(cases, dynamic_cases, name):
    case = dynamic_cases[name]

    @_fuzz(60)
    @given(_ledger_mutated(case.state))
    def check(change):
        _refused_or_exact(case, cases["path"], *change)

    check()

# -- mixtures ---------------------------------------------------------------------------------------------------

MIX = {"weights": {"a": 0.5, "b": 0.3, "t": 0.2}, "epoch_rows": 200, "batch_size": 16, "source_column": "src",
       "shuffle": True, "shuffle_buffer_size": 24, "interleave": 2, "plan_cache": False}


@dataclass
class MixCase:
    """A valid mixture state, the loader it loads into (or the mixture alone: ``num_workers`` None), and the rows
    (source, id) that the untampered resume yields: the rest of the saved epoch and the next one."""

    state: dict[str, Any]
    num_workers: int | None
    loader_args: dict[str, Any]
    epoch: int
    rows: Counter[tuple[str, int]]


def _mix_loader(paths: dict[str, str], num_workers: int, **kwargs: Any) -> tuple[Any, Any]:
    sources = {name: Source(path, columns=["id"], split_bytes=1) for name, path in paths.items()}
    return Mixture.create_dataloader(sources=sources, num_workers=num_workers, **MIX, **kwargs)


def _mix_rows(batches: Any, mixture: Any, epoch: int) -> Counter[tuple[str, int]]:
    """The rows of ``epoch`` and the next one (``batches``: the loader, or the mixture itself)."""
    rows: Counter[tuple[str, int]] = Counter()
    for current in (epoch, epoch + 1):
        mixture.set_epoch(current)
        for batch in batches:
            rows.update(zip(batch["src"], ids_of(batch), strict=True))
    return rows


def _mix_state(paths: dict[str, str], num_workers: int, epoch: int, batches: int | None,
               **kwargs: Any) -> dict[str, Any]:
    """The loader state after ``batches`` batches of ``epoch`` (None: after its loop), the epochs before read."""
    loader, mixture = _mix_loader(paths, num_workers, **kwargs)
    for current in range(epoch + 1):
        mixture.set_epoch(current)
        batch_iter = iter(loader)
        for _ in range(batches if current == epoch and batches is not None else len(loader)):
            next(batch_iter)
        if current < epoch or batches is None:
            assert next(batch_iter, None) is None
    state = json_roundtrip(loader.state_dict())
    del batch_iter
    return state


def _mix_loaded(paths: dict[str, str], case: MixCase, state: dict[str, Any]) -> tuple[Any, Any]:
    """``state`` loaded as ``case`` loads it: (what to iterate, the mixture); a ``StateError`` if it is refused."""
    loader, mixture = _mix_loader(paths, case.num_workers or 0, **case.loader_args)
    if case.num_workers is None:   # a worker state alone, into the mixture (a plain StatefulDataLoader's path)
        mixture.load_state_dict(state)
        return mixture, mixture
    loader.load_state_dict(state)
    return loader, mixture


@pytest.fixture(scope="module")
def mix_cases(tmp_path_factory) -> dict[str, Any]:
    """Sources of 240, 100 and 5 rows (the last read in 8 passes an epoch: held, each part read whole), 200 rows
    an epoch; each case's state is taken once, in this process (0 workers) or two."""
    root = tmp_path_factory.mktemp("mixfuzz")
    paths = {"a": write_dataset(root / "a", [(150, 30), (90, 30)]), "b": write_dataset(root / "b", [(100, 25)]),
             "t": write_dataset(root / "t", [(5, 5)])}
    out: dict[str, Any] = {"paths": paths}

    def case(name: str, state: dict[str, Any], num_workers: int | None, epoch: int, **loader_args: Any) -> None:
        out[name] = MixCase(state, num_workers, loader_args, epoch, Counter())
        out[name].rows = _mix_rows(*_mix_loaded(paths, out[name], state), epoch)

    case("mix-mid", _mix_state(paths, 0, 1, 5), 0, 1)   # epoch 1: each source inside a pass
    case("mix-after", _mix_state(paths, 0, 0, None), 0, 0)
    case("mix-worker", out["mix-mid"].state["dataloader"]["dataset_state"], None, 1)
    ranks = [_mix_state(paths, 0, 0, 3 + rank, rank=rank, world_size=2, plan_locally=True) for rank in range(2)]
    merged = merge_state_dicts(ranks)
    case("mix-merged", merged, 0, 0, rank=0, world_size=2, plan_locally=True)
    case("mix-merged-replanned", merged, 0, 0)
    loader, mixture = _mix_loader(paths, 0)   # inside the epoch re-planned for one rank
    tiny = mixture._sources[2]   # read in 8 passes an epoch: held, each part read whole
    assert holds(tiny.plan, len(mixture._epochs.parts(mixture.history, MixSlot(0, 0, 2, 0, 0))["t"]))
    loader.load_state_dict(merged)
    mixture.set_epoch(0)
    batch_iter = iter(loader)
    for _ in range(2):
        next(batch_iter)
    case("mix-elastic", json_roundtrip(loader.state_dict()), 0, 0)
    del batch_iter
    case("mix-workers2", _mix_state(paths, 2, 0, 3, persistent_workers=True), 2, 0, persistent_workers=True)
    return out


def _mix_refused_or_exact(paths: dict[str, str], case: MixCase, state: dict[str, Any], what: str) -> None:
    try:
        batches, mixture = _mix_loaded(paths, case, state)
    except errors.StateError:
        return
    rows = _mix_rows(batches, mixture, case.epoch)
    assert rows == case.rows, f"{what}: loaded, and yielded other rows than the untampered resume"


@pytest.mark.parametrize("name", ["mix-mid", "mix-after", "mix-worker", "mix-merged", "mix-merged-replanned",
                                  "mix-elastic"])
@pytest.mark.timeout(120)
def test_a_mutated_mixture_state_is_refused_or_resumes_exactly(mix_cases, name):
    case = mix_cases[name]

    @_fuzz(150)
    @given(mutated(case.state))
    def check(change):
        _mix_refused_or_exact(mix_cases["paths"], case, *change)

    check()


@pytest.mark.timeout(180)
def test_a_mutated_mixture_state_with_workers_is_refused_or_resumes_exactly(mix_cases):
    """Fewer examples: a state that loads starts two worker processes."""
    case = mix_cases["mix-workers2"]

    @_fuzz(40)
    @given(mutated(case.state))
    def check(change):
        _mix_refused_or_exact(mix_cases["paths"], case, *change)

    check()


# -- what a state reads (v11): one loader state kind and one merged checkpoint kind for both fronts ---------------

GOLDEN = Path(__file__).parent / "golden"


def _golden_state(name: str) -> dict[str, Any]:
    return json.loads((GOLDEN / name).read_text())["state"]


def _retired_mixture_checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """A merged mixture checkpoint as versions before 11 wrote it (of one rank's state of the retired kind)."""
    return {"kind": "arrowstream.mixture_checkpoint", "version": 1, "world_size": 1,
            "num_workers": state["num_workers"], "ranks": [state]}


@pytest.mark.parametrize("name,wanted", [
    ("mid", "mixture"), ("merged", "mixture"), ("workers2", "mixture"),
    ("mix-mid", "dataset"), ("mix-merged", "dataset"), ("mix-workers2", "dataset"),
    ("golden:v10/workers2-shuffle-mid.json", "mixture"), ("golden:v1/workers2-shuffle-mid.json", "mixture"),
    ("golden:v10/merged-rank1of2-workers1-mid.json", "mixture"),
    ("golden:mixture-v1/workers2-shuffle-interleave-mid.json", "dataset"),
    ("golden-merged:mixture-v4/workers2-passes-mid.json", "dataset"),
])
@pytest.mark.timeout(120)
def test_a_state_of_the_other_front_is_refused_naming_what_each_reads(cases, mix_cases, name, wanted):
    """A dataset's state (of this version or an older one, a loader state or a merged checkpoint) loaded into a
    mixture's loader, or the reverse: a StateMismatchError that says what the state and the loader read, and where
    the state loads; the loader is left as it was (it still resumes its own state)."""
    if name.startswith("golden"):
        state = _golden_state(name.partition(":")[2])
        state = _retired_mixture_checkpoint(state) if name.startswith("golden-merged") else state
    else:
        state = (mix_cases if name.startswith("mix-") else cases)[name].state
    saved = "dataset" if wanted == "mixture" else "mixture"
    if wanted == "mixture":
        loader, _ = _mix_loader(mix_cases["paths"], 0)
        own, where = mix_cases["mix-mid"], "StructuredDataset.create_dataloader"   # where the state loads
    else:
        loader, _ = make_loader(cases["path"], 0, **OPTIONS)
        own, where = cases["mid"], "Mixture.create_dataloader"
    with pytest.raises(errors.StateMismatchError,
                       match=rf"taken by the loader of a {saved} \(its reads is '{saved}'\), this loader reads a "
                             rf"{wanted}; .*{where}"):
        loader.load_state_dict(copy.deepcopy(state))
    loader.load_state_dict(copy.deepcopy(own.state))   # refused, it was left as it was


@pytest.mark.parametrize("value", ["Dataset", "", "mixtures", None, 1, True, ["dataset"], {}, "missing"])
def test_a_tampered_reads_is_refused_naming_the_field(cases, value):
    """``reads`` says which loader wrote the state: anything but "dataset" or "mixture" (or no ``reads``) is a
    StateError naming the field, in a loader state, in each rank of a merged checkpoint, and in merge_state_dicts."""
    loader, _ = make_loader(cases["path"], 0, **OPTIONS)
    state = copy.deepcopy(cases["mid"].state)
    merged = copy.deepcopy(cases["merged"].state)
    for outer in (state, merged["ranks"][1]):
        if value == "missing":
            del outer["reads"]
        else:
            outer["reads"] = value
    field = r"has no 'reads' field" if value == "missing" else r"reads is .*, expected what the loader that wrote it"
    with pytest.raises(errors.StateError, match=rf"the state's loader state.{field}"):
        loader.load_state_dict(state)
    merged_loader, _ = make_loader(cases["path"], 0, **OPTIONS, rank=0, world_size=2)
    with pytest.raises(errors.StateError, match=rf"the state's checkpoint\.ranks\[1\].{field}"):
        merged_loader.load_state_dict(merged)
    with pytest.raises(errors.StateError, match=rf"the state's state 1.{field}"):
        merge_state_dicts([cases["merged"].state["ranks"][0], merged["ranks"][1]])


def test_reads_flipped_to_the_loaders_front_is_refused_by_the_worker_states(cases, mix_cases):
    """A dataset's state edited to say it reads a mixture (or the reverse) passes the front check, and its worker
    states, which say they read the other (v12: one worker kind), are refused."""
    dataset_state = copy.deepcopy(cases["mid"].state)
    dataset_state["reads"] = "mixture"
    loader, _ = _mix_loader(mix_cases["paths"], 0)
    with pytest.raises(errors.StateMismatchError, match=r"taken by a worker of a dataset's loader \(its reads is "
                                                        r"'dataset'\), this loader reads a mixture"):
        loader.load_state_dict(dataset_state)
    mixture_state = copy.deepcopy(mix_cases["mix-mid"].state)
    mixture_state["reads"] = "dataset"
    loader, _ = make_loader(cases["path"], 0, **OPTIONS)
    with pytest.raises(errors.StateMismatchError, match=r"taken by a worker of a mixture's loader \(its reads is "
                                                        r"'mixture'\), this loader reads a dataset"):
        loader.load_state_dict(mixture_state)


def test_a_merged_checkpoint_of_both_fronts_is_refused(cases, mix_cases):
    """Its ranks must read what the first does (and, in a checkpoint of before v11, what its kind said); two loader
    states of different fronts do not merge."""
    merged = copy.deepcopy(cases["merged"].state)
    merged["ranks"][1] = copy.deepcopy(mix_cases["mix-merged"].state["ranks"][1])
    loader, _ = make_loader(cases["path"], 0, **OPTIONS, rank=0, world_size=2)
    with pytest.raises(errors.StateError, match=r"checkpoint\.ranks\[1\] has rank, world_size, num_workers, "
                                                r"batches_per_transfer, reads = \(1, 2, 0, 1, 'mixture'\), expected "
                                                r"\(1, 2, 0, 1, 'dataset'\)"):
        loader.load_state_dict(merged)
    retired = _retired_mixture_checkpoint(copy.deepcopy(cases["mid"].state))   # the retired kind holds a dataset's
    with pytest.raises(errors.StateError, match=r"reads = \(0, 1, 0, 1, 'dataset'\), expected \(0, 1, 0, 1, 'mixture'\)"):
        make_loader(cases["path"], 0, **OPTIONS)[0].load_state_dict(retired)
    with pytest.raises(errors.StateMismatchError, match="state 1 was taken by the loader of a mixture, state 0 by "
                                                        "the loader of a dataset"):
        merge_state_dicts([cases["merged"].state["ranks"][0], mix_cases["mix-merged"].state["ranks"][1]])


@pytest.mark.parametrize("version", [0, 2, 11, "1", True, None])
def test_a_retired_mixture_kind_of_another_version_is_refused(cases, version):
    """A mixture's loader wrote "arrowstream.mixture_loader" and "arrowstream.mixture_checkpoint" as version 1
    only: any other version was not written by arrowstream."""
    state = {**_golden_state("mixture-v1/workers0-buffer-mid.json"), "version": version}
    loader, _ = make_loader(cases["path"], 0, **OPTIONS)
    with pytest.raises(errors.StateVersionError, match="'arrowstream.mixture_loader' has version .*, but a mixture's "
                                                       "loader wrote that kind as version 1 only"):
        loader.load_state_dict(state)
    with pytest.raises(errors.StateVersionError, match="'arrowstream.mixture_checkpoint' has version"):
        loader.load_state_dict({**_retired_mixture_checkpoint(state), "version": version})


# -- one worker state kind (v12): a dataset's and a mixture's worker states are "arrowstream.worker", ``reads`` ------


def _with_worker(state: dict[str, Any], edit: Any) -> dict[str, Any]:
    """``state`` (a loader state without workers) with its one worker state edited by ``edit``."""
    state = copy.deepcopy(state)
    edit(state["dataloader"]["dataset_state"])
    return state


def _loader_of(cases: dict[str, Any], mix_cases: dict[str, Any], front: str) -> Any:
    return _mix_loader(mix_cases["paths"], 0)[0] if front == "mixture" else make_loader(cases["path"], 0, **OPTIONS)[0]


def _own(cases: dict[str, Any], mix_cases: dict[str, Any], front: str) -> dict[str, Any]:
    return (mix_cases["mix-mid"] if front == "mixture" else cases["mid"]).state


@pytest.mark.parametrize("front", ["dataset", "mixture"])
def test_both_fronts_write_one_worker_kind_with_one_head(cases, mix_cases, front):
    """The same kind, version and head under the same names; a mixture keeps its own fields beside it."""
    from arrowstream._state.versions import STATE_VERSION

    worker = _own(cases, mix_cases, front)["dataloader"]["dataset_state"]
    assert (worker["kind"], worker["version"], worker["reads"]) == ("arrowstream.worker", STATE_VERSION, front)
    assert set(worker["slot"]) == {"rank", "world_size", "worker_id", "num_workers"}
    assert set(worker["counters"]) == {"rows", "batches", "rows_dropped"} and worker["counters"]["batches"] > 0
    own = {"data", "cursor"} if front == "dataset" else {"history", "sources"}
    assert set(worker) == {"kind", "version", "reads", "epoch", "slot", "counters", "epoch_complete", "options",
                           "elastic"} | own
    assert worker["elastic"] is None   # not re-planned


@pytest.mark.parametrize("front", ["dataset", "mixture"])
@pytest.mark.parametrize("value", ["Dataset", "", "mixtures", None, 1, True, ["dataset"], {}, "missing"])
def test_a_tampered_worker_reads_is_refused_naming_the_field(cases, mix_cases, front, value):
    def edit(worker: dict[str, Any]) -> None:
        if value == "missing":
            del worker["reads"]
        else:
            worker["reads"] = value

    loader = _loader_of(cases, mix_cases, front)
    field = r"has no 'reads' field" if value == "missing" else r"\.reads is .*, expected what the loader that wrote it"
    with pytest.raises(errors.StateError, match=field) as refused:
        loader.load_state_dict(_with_worker(_own(cases, mix_cases, front), edit))
    assert not isinstance(refused.value, errors.StateMismatchError)
    loader.load_state_dict(copy.deepcopy(_own(cases, mix_cases, front)))   # refused, it was left as it was


@pytest.mark.parametrize("front", ["dataset", "mixture"])
@pytest.mark.parametrize("key", ["rows", "batches", "rows_dropped"])
@pytest.mark.parametrize("value", [-1, True, 1.0, "1", None, "missing"])
def test_tampered_worker_counters_are_refused_naming_the_field(cases, mix_cases, front, key, value):
    def edit(worker: dict[str, Any]) -> None:
        if value == "missing":
            del worker["counters"][key]
        else:
            worker["counters"][key] = value

    with pytest.raises(errors.StateError, match=rf"counters(\.{key} is| has no '{key}' field)"):
        _loader_of(cases, mix_cases, front).load_state_dict(_with_worker(_own(cases, mix_cases, front), edit))


@pytest.mark.parametrize("front", ["dataset", "mixture"])
@pytest.mark.parametrize("counters", ["missing", None, [], "top-level"])
def test_worker_counters_out_of_their_place_are_refused(cases, mix_cases, front, counters):
    """v12 keeps a mixture's counters under ``counters``, as a dataset's: at the top (as the retired kind had them)
    they are not read."""
    def edit(worker: dict[str, Any]) -> None:
        moved = worker.pop("counters")
        if counters == "top-level":
            worker.update(moved)
        elif counters != "missing":
            worker["counters"] = counters

    with pytest.raises(errors.StateError, match=r"counters"):
        _loader_of(cases, mix_cases, front).load_state_dict(_with_worker(_own(cases, mix_cases, front), edit))


@pytest.mark.parametrize("front", ["dataset", "mixture"])
def test_a_worker_state_of_the_other_front_is_refused_naming_what_it_reads(cases, mix_cases, front):
    """A mixture's worker state that says it reads a dataset (or the reverse), in its own loader: its loader state
    reads the loader's front, the worker does not; and a worker state of the other front handed to the dataset or
    mixture alone (a plain StatefulDataLoader's path)."""
    other = "dataset" if front == "mixture" else "mixture"
    flipped = _with_worker(_own(cases, mix_cases, front), lambda worker: worker.update(reads=other))
    loader = _loader_of(cases, mix_cases, front)
    match = rf"taken by a worker of a {other}'s loader \(its reads is '{other}'\), this loader reads a {front}"
    with pytest.raises(errors.StateMismatchError, match=match):
        loader.load_state_dict(flipped)
    alone = make_loader(cases["path"], 0, **OPTIONS)[1] if front == "dataset" else _mix_loader(mix_cases["paths"], 0)[1]
    foreign = _own(cases, mix_cases, other)["dataloader"]["dataset_state"]
    with pytest.raises(errors.StateMismatchError, match=rf"its reads is '{other}'\), this loader reads a {front}"):
        alone.load_state_dict(copy.deepcopy(foreign))


@pytest.mark.parametrize("version", [13, 12, 5, 0, "4", True, None])
def test_a_mixture_worker_state_of_the_retired_kind_at_another_version_is_refused(cases, mix_cases, version):
    """A mixture's worker wrote "arrowstream.mixture_worker" as versions 1 to 4 only: a state of this version with
    the old kind name (or the old kind at a version it never had) was not written by arrowstream."""
    state = _with_worker(mix_cases["mix-mid"].state, lambda worker: worker.update(kind="arrowstream.mixture_worker",
                                                                                    version=version))
    with pytest.raises(errors.StateVersionError, match=r"'arrowstream.mixture_worker' has version .*, but a mixture's "
                                                       r"worker wrote that kind as versions 1 to 4 only"):
        _mix_loader(mix_cases["paths"], 0)[0].load_state_dict(state)


def test_a_retired_mixture_worker_state_migrates_to_the_one_kind_and_resumes_exactly(mix_cases):
    """The mixture's worker state written as the retired kind of version 4 wrote it reads as the same state (the
    counters moved, ``elastic`` null, ``reads`` added) and resumes the same rows; versions 1 and 2 read with the
    option defaults they had (their batches permuted, passes in tracks)."""
    from helpers import as_retired_mixture_worker

    from arrowstream._state.mixture import MixWorkerState
    from arrowstream._state.versions import upgraded_worker
    from arrowstream._state.worker_states import read_worker_state

    case = mix_cases["mix-mid"]
    worker = case.state["dataloader"]["dataset_state"]
    retired = as_retired_mixture_worker(copy.deepcopy(worker), 4)
    assert "counters" not in retired and "reads" not in retired and "elastic" not in retired
    assert upgraded_worker(copy.deepcopy(retired)) == worker
    assert read_worker_state(copy.deepcopy(retired)) == MixWorkerState.from_dict(copy.deepcopy(worker))
    batches, mixture = _mix_loaded(mix_cases["paths"], case, _with_worker(case.state, lambda w: (w.clear(),
                                                                                                 w.update(retired))))
    assert _mix_rows(batches, mixture, case.epoch) == case.rows
    old = read_worker_state(as_retired_mixture_worker(copy.deepcopy(worker), 2))
    assert (old.options["batch_order"], old.options["pass_layout"]) == ("permuted", "tracks")


def test_one_entry_point_reads_any_worker_state_by_what_it_reads(cases, mix_cases):
    """Either front's worker state of any version: a dataset's (this version, and version 1 of the golden files)
    as a WorkerState, a mixture's (this version, and the retired kind of version 1) as a MixWorkerState; asked for
    one front, the other's is refused."""
    from arrowstream._state.mixture import MixWorkerState
    from arrowstream._state.worker import WorkerState
    from arrowstream._state.worker_states import read_worker_state

    dataset = cases["mid"].state["dataloader"]["dataset_state"]
    mixture = mix_cases["mix-mid"].state["dataloader"]["dataset_state"]
    old_dataset = _golden_state("v1/workers0-ordered-mid.json")["dataloader"]["dataset_state"]
    old_mixture = _golden_state("mixture-v1/workers0-buffer-mid.json")["dataloader"]["dataset_state"]
    assert old_mixture["kind"] == "arrowstream.mixture_worker" and old_dataset["version"] == 1
    for state, parser in ((dataset, WorkerState), (old_dataset, WorkerState), (mixture, MixWorkerState),
                          (old_mixture, MixWorkerState)):
        read = read_worker_state(copy.deepcopy(state))
        assert type(read) is parser and read == parser.from_dict(copy.deepcopy(state))
        assert read.head.reads == ("dataset" if parser is WorkerState else "mixture")
    with pytest.raises(errors.StateMismatchError, match=r"its reads is 'mixture'\), this loader reads a dataset"):
        read_worker_state(copy.deepcopy(old_mixture), reads="dataset")
    with pytest.raises(errors.StateMismatchError, match=r"its reads is 'dataset'\), this loader reads a mixture"):
        read_worker_state(copy.deepcopy(dataset), reads="mixture")


# -- one elastic head: a dataset's Leftovers and a mixture's MixElastic, parsed, under the same names ---------------


def test_both_fronts_parse_elastic_as_one_typed_head(cases, mix_cases):
    """An epoch re-planned for another topology: a dataset's worker state and a mixture's both parse ``elastic`` into
    an ``ElasticHead`` (epoch, old world size and num_workers, one cursor entry per old slot, cut), written under the
    same names; a mixture's entries are its place in each source."""
    from arrowstream._state.mixture import MixElastic, SourceCursor
    from arrowstream._state.worker import ElasticHead, Leftovers
    from arrowstream._state.worker_states import read_worker_state

    dataset = read_worker_state(cases["elastic"].state["dataloader"]["dataset_state"])
    mixture = read_worker_state(mix_cases["mix-elastic"].state["dataloader"]["dataset_state"])
    assert isinstance(dataset.elastic, Leftovers) and isinstance(mixture.elastic, MixElastic)
    for elastic in (dataset.elastic, mixture.elastic):
        assert isinstance(elastic, ElasticHead) and (elastic.world_size, elastic.num_workers) == (2, 0)
        assert len(elastic.cursors) == 2 and elastic.cut == "even"
        assert set(elastic.to_dict()) >= {"epoch", "world_size", "num_workers", "cursors", "cut"}
    assert all(isinstance(place, SourceCursor) for entry in mixture.elastic.cursors if entry for place in entry.values())
    assert type(mixture.elastic).from_dict(mixture.elastic.to_dict(), "elastic") == mixture.elastic


@pytest.mark.parametrize("edit,match", [
    (lambda e: e.update(cut="lpt"), r"elastic\.cut is 'lpt', expected one of \['even'\]"),
    (lambda e: e.pop("cut"), r"elastic\.cut is None"),
    (lambda e: e.pop("pass_layout"), r"elastic has no 'pass_layout' field"),
    (lambda e: e.update(pass_layout="rows"), r"elastic\.pass_layout is 'rows'"),
    (lambda e: e["cursors"].append(None), r"elastic\.cursors holds 3 entries, expected one per old worker: 2"),
    (lambda e: e.update(cursors=[0, None]), r"elastic\.cursors\[0\] is 0, expected a dict"),
], ids=["cut-lpt", "cut-missing", "pass-layout-missing", "pass-layout-other", "cursors-more", "cursor-int"])
def test_a_tampered_mixture_elastic_is_refused_naming_the_field(mix_cases, edit, match):
    """A mixture's re-plan cuts the rows left evenly, always: another cut (a dataset's older "lpt") is refused, as is
    an ``elastic`` without the head's fields or its own ``pass_layout``."""
    case = mix_cases["mix-elastic"]
    state = _with_worker(case.state, lambda worker: edit(worker["elastic"]))
    with pytest.raises(errors.StateError, match=match):
        _mix_loaded(mix_cases["paths"], case, state)


def test_a_retired_mixture_elastic_migrates_to_the_one_head():
    """The golden mixture state of version 4 inside a re-planned epoch: its ``elastic`` gets the ``cut`` a dataset's
    names (even: a mixture always cut so) and keeps its ``pass_layout``; one of version 3 or older, which had no
    ``pass_layout``, reads as tracks."""
    from arrowstream._loader.torchdata_state import worker_states
    from arrowstream._state.mixture import MixWorkerState
    from arrowstream._state.versions import upgraded_worker

    state = _golden_state("mixture-v4/elastic-workers3-from-workers2-mid.json")
    saved = [w for w in worker_states(state["dataloader"]) if w is not None and "elastic" in w]
    assert saved and all("cut" not in w["elastic"] for w in saved)
    for worker in saved:
        upgraded = upgraded_worker(copy.deepcopy(worker))
        assert upgraded["elastic"] == {**worker["elastic"], "cut": "even"}
        assert MixWorkerState.from_dict(copy.deepcopy(worker)).elastic.cut == "even"
        older = {**copy.deepcopy(worker), "version": 3}
        del older["elastic"]["pass_layout"]
        assert upgraded_worker(older)["elastic"]["pass_layout"] == "tracks"
