"""torchdata's private state layout: every key arrowstream relies on is where it expects (issue #18).

``arrowstream._loader.torchdata_state`` is the one module that reads and writes torchdata's own
``StatefulDataLoader`` state, and ``relied_on`` lists every path it uses. Here real states of the
installed torchdata (0 and 2 workers; before, during and after an epoch) are checked against that
list: a torchdata that renames or reshapes a key fails loudly, naming the key and the pin to revisit.
That the list is complete is checked too, by recording what the module touches in a real state.
"""

from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path
from typing import Any

import pytest
import torchdata
from helpers import write_dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from arrowstream import StructuredDataset
from arrowstream._loader.torchdata_state import (
    ITERATOR_ATTRIBUTES,
    ITERATOR_FINISHED,
    LAST_YIELDED_WORKER_ID,
    SNAPSHOT,
    WORKER_SNAPSHOTS,
    clear_steps_since_snapshot,
    delivers_in_order,
    is_inner_state,
    iterator_finished,
    latest_worker_snapshots,
    read_inner,
    relied_on,
    set_iterator_finished,
    set_last_yielded_worker,
    set_worker_state,
    steps_since_snapshot,
    worker_state,
    worker_states,
)
from arrowstream._state.worker import WorkerState

ROOT = Path(__file__).resolve().parent.parent


def _torchdata_pin() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    return next(d for d in dependencies if d.startswith("torchdata"))


def _is(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types and object not in types:
        return False  # an int field holding a bool is a reshape too
    return isinstance(value, types)


def layout_problems(inner: Any, num_workers: int) -> list[str]:
    """What is not where ``arrowstream._loader.torchdata_state`` relies on it in a real torchdata state."""
    revisit = (f"arrowstream/_loader/torchdata_state.py relies on it: revisit that module and the pin "
               f"{_torchdata_pin()!r} in pyproject.toml")
    found = f"torchdata {torchdata.__version__}'s StatefulDataLoader state (num_workers={num_workers})"
    problems: list[str] = []
    nulls: set[tuple[str, ...]] = set()  # paths that hold an allowed None: nothing below them to look for
    for path, types in relied_on(num_workers):
        if any(path[:end] in nulls for end in range(1, len(path))):
            continue
        value, where = inner, "dataloader"
        for key in path:
            if not isinstance(value, dict):
                problems.append(f"{found}: {where} is of type {type(value).__name__}, not a dict with {key!r}; {revisit}")
                break
            if key not in value:
                problems.append(f"{found} has no {key!r} in {where} (it has {sorted(map(str, value))}); {revisit}")
                break
            value, where = value[key], f"{where}.{key}"
        else:
            if not _is(value, types):
                names = " or ".join(t.__name__ for t in types)
                problems.append(f"{found}: {where} is of type {type(value).__name__}, expected {names}; {revisit}")
            elif value is None:
                nulls.add(path)
    return problems


def _check(inner: Any, num_workers: int) -> None:
    problems = layout_problems(inner, num_workers)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture(scope="module")
def real_states(tmp_path_factory):
    """Real torchdata states of a plain StatefulDataLoader over a StructuredDataset, by num_workers:
    before the first batch, mid-epoch, and after the loop (``_iterator_finished`` true)."""
    path = write_dataset(tmp_path_factory.mktemp("torchdata_state"), [(300, 50), (200, 40)])
    states: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for num_workers in (0, 2):
        dataset = StructuredDataset(path, batch_size=32)
        with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated in torch 2.13
            warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
            loader = StatefulDataLoader(dataset, batch_size=None, num_workers=num_workers)
        taken = [("start", loader.state_dict())]
        batches = iter(loader)
        for _ in range(5):
            next(batches)
        taken.append(("mid", loader.state_dict()))
        for _ in batches:
            pass
        taken.append(("after", loader.state_dict()))
        states[num_workers] = taken
    return states


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_key_arrowstream_relies_on_is_in_a_real_state(real_states, num_workers):
    for point, inner in real_states[num_workers]:
        _check(inner, num_workers)
        # and the accessors read what they name: every worker's dataset state, in worker order
        states = [WorkerState.from_dict(state) for state in worker_states(inner)]
        assert [s.slot.worker_id for s in states] == list(range(max(num_workers, 1))), point
        parsed = read_inner(inner, 1)
        assert parsed.num_workers == num_workers and parsed.finished == (point == "after"), point


@pytest.mark.timeout(120)
def test_the_iterator_keeps_each_workers_latest_state_out_of_order(tmp_path):
    """``latest_worker_snapshots`` reads an attribute of torchdata's iterator (for ``in_order=False``):
    it is there, and it holds each worker's state after its last batch the loop received."""
    dataset = StructuredDataset(write_dataset(tmp_path, [(300, 50), (200, 40)]), batch_size=32)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
        loader = StatefulDataLoader(dataset, batch_size=None, num_workers=2, in_order=False)
    batches = iter(loader)
    missing = [name for name in ITERATOR_ATTRIBUTES if not hasattr(batches, name)]
    assert not missing, (f"torchdata {torchdata.__version__}'s iterator has no {missing}; arrowstream/_loader/torchdata_state.py "
                         f"relies on it: revisit that module and the pin {_torchdata_pin()!r} in pyproject.toml")
    assert not delivers_in_order(batches)
    for _ in range(5):
        next(batches)
    latest = latest_worker_snapshots(batches)
    assert sorted(latest) == ["worker_0", "worker_1"]
    states = [WorkerState.from_dict(latest[key]["dataset_state"]) for key in sorted(latest)]
    assert [s.slot.worker_id for s in states] == [0, 1]
    assert sum(s.batches for s in states) == 5  # one batch per item here (no chunks): all five, none ahead
    for _ in batches:
        pass


class _Recorder(dict[str, Any]):
    """A copy of a state dict that records the path of every key read or written in it (a key
    looked for and absent, as when telling the two layouts apart, is not recorded)."""

    def __init__(self, value: dict[str, Any], seen: set[tuple[str, ...]], path: tuple[str, ...] = ()) -> None:
        super().__init__({k: _Recorder(v, seen, (*path, k)) if isinstance(v, dict) else v for k, v in value.items()})
        self.seen, self.path = seen, path

    def _saw(self, key: Any) -> None:
        if super().__contains__(key):
            self.seen.add((*self.path, key))

    def __getitem__(self, key: Any) -> Any:
        self._saw(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._saw(key)
        return super().get(key, default)

    def __contains__(self, key: Any) -> bool:
        self._saw(key)
        return super().__contains__(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self._saw(key)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_relied_on_lists_every_path_the_module_reads_or_writes(real_states, num_workers):
    """So that the check above covers every key: read_inner and each accessor, on a real state."""
    seen: set[tuple[str, ...]] = set()
    for _, state in real_states[num_workers]:
        inner = _Recorder(state, seen)
        read_inner(inner, 1)
        assert is_inner_state(inner)
        assert len(worker_states(inner)) == max(num_workers, 1)
        assert steps_since_snapshot(inner) >= 0 and iterator_finished(inner) in (True, False)
        set_worker_state(inner, 0, None)
        clear_steps_since_snapshot(inner)
        set_iterator_finished(inner, False)
        if num_workers:
            worker_state(inner, 1)
            set_last_yielded_worker(inner, 0)
    relied = {path for path, _ in relied_on(num_workers)}
    assert seen - relied == set()
    assert relied - seen == set()  # and nothing listed that the module does not use


@pytest.mark.timeout(120)
def test_a_renamed_or_reshaped_key_fails_naming_it_and_the_pin(real_states):
    """The check above, broken on purpose: a real state as a torchdata that renamed one key and
    turned another into a list would write it."""
    (_, inner), *_ = [taken for taken in real_states[2] if taken[0] == "mid"]
    renamed = {**inner, SNAPSHOT: {**inner[SNAPSHOT]}}
    renamed[SNAPSHOT]["_last_worker_id"] = renamed[SNAPSHOT].pop(LAST_YIELDED_WORKER_ID)
    renamed[SNAPSHOT][WORKER_SNAPSHOTS] = list(inner[SNAPSHOT][WORKER_SNAPSHOTS].values())
    renamed[ITERATOR_FINISHED] = int(inner[ITERATOR_FINISHED])
    problems = layout_problems(renamed, 2)
    pin = _torchdata_pin()
    assert len(problems) == 3 + 2 * 6, problems  # the rename, the bool, the list, and the 6 paths of each worker
    assert all(pin in problem and "arrowstream/_loader/torchdata_state.py" in problem for problem in problems)
    assert any(f"has no {LAST_YIELDED_WORKER_ID!r} in dataloader._snapshot" in p for p in problems)
    assert any("dataloader._snapshot._worker_snapshots is of type list, expected dict" in p for p in problems)
    assert any("_worker_snapshots is of type list, not a dict with 'worker_1'" in p for p in problems)
    assert any("dataloader._iterator_finished is of type int, expected bool" in p for p in problems)
    with pytest.raises(pytest.fail.Exception, match=LAST_YIELDED_WORKER_ID):
        _check(renamed, 2)
    assert not layout_problems(inner, 2)  # the control: the real state itself


@pytest.mark.timeout(120)
def test_a_key_that_torchdata_renames_fails_naming_it_and_the_pin(tmp_path, monkeypatch):
    """The check, broken on purpose the way a torchdata release would: its own key constants renamed."""
    from torchdata.stateful_dataloader import stateful_dataloader

    monkeypatch.setattr(stateful_dataloader, "_ITERATOR_FINISHED", "_finished")
    monkeypatch.setattr(stateful_dataloader._StatefulMultiProcessingDataLoaderIter, "_LAST_YIELDED_WORKER_ID",
                        "_last_worker_id")
    path = write_dataset(tmp_path, [(100, 50)])
    for num_workers, where in ((0, ["dataloader"]), (2, ["dataloader", "dataloader._snapshot"])):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
            loader = StatefulDataLoader(StructuredDataset(path, batch_size=32), batch_size=None,
                                        num_workers=num_workers)
        problems = layout_problems(loader.state_dict(), num_workers)
        for _ in loader:  # to the end: the workers exit
            pass
        renamed = [ITERATOR_FINISHED, LAST_YIELDED_WORKER_ID][:len(where)]
        missing = [re.search(r"has no '(\w+)' in ([\w.]+) \(", p) for p in problems]
        assert [m.groups() if m else p for m, p in zip(missing, problems)] == list(zip(renamed, where))
        assert all(_torchdata_pin() in p and "revisit" in p for p in problems)
