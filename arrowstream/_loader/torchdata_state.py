"""torchdata's ``StatefulDataLoader`` state dict: the one module that knows its private layout.

A loader state wraps torchdata's own dict (its ``dataloader`` field), and arrowstream reads and
rewrites parts of it: the workers' dataset states, the round robin's last yielded worker, the
batches yielded since the workers' snapshots, whether the loop ended. Those keys are private to
torchdata (``torchdata/stateful_dataloader/stateful_dataloader.py`` and ``incremental_state.py``)
and may change in any release: the ``torchdata`` pin in ``pyproject.toml`` keeps them as they
are. Everything else goes through the functions here, and :func:`relied_on` lists every path they
use; ``tests/test_torchdata_state.py`` checks that list against real states of the installed
torchdata, so a torchdata that renames or reshapes one of them fails there, naming the key.

Two layouts, by ``num_workers``:

* ``0``: one flat dict, the dataset's state at ``dataset_state``;
* ``N > 0``: ``_snapshot`` holds the workers' last snapshot (``_main_snapshot`` with ``_num_workers``,
  ``_worker_snapshots["worker_<i>"]["dataset_state"]``, ``_snapshot_step``,
  ``_last_yielded_worker_id``), and beside it ``_steps_since_snapshot`` counts the batches yielded
  since, which torchdata fetches again and throws away on resume.

With ``in_order=False`` the snapshot falls behind (torchdata takes one only when the item it handed
out is the next in its round robin), so the loader reads the states the iterator keeps between
snapshots instead (:func:`latest_worker_snapshots`, an attribute of torchdata's iterator, listed in
:data:`ITERATOR_ATTRIBUTES`) and moves the snapshot up to now (:func:`snapshot_now`).

:func:`read_inner` checks every field torchdata reads on resume: it reads them with plain indexing
and hands them to ``range`` and ``itertools``, so a missing key is a ``KeyError``,
``_steps_since_snapshot=10**6`` a bare ``StopIteration``, and a ``fetcher_ended`` of true an epoch
that silently yields nothing. The worker states inside are left to the dataset, which knows the
plan (``StructuredDataset.check_state``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .._core.fields import REMEDY, Fields, check_int, is_int, shorten
from ..errors import StateError

# torchdata's keys (0.10 and 0.11): both layouts
ITERATOR_FINISHED = "_iterator_finished"
DATASET_STATE = "dataset_state"
FETCHER_STATE = "fetcher_state"
DATASET_ITER_STATE = "dataset_iter_state"
FETCHER_ENDED = "fetcher_ended"
SAMPLER_ITER_YIELDED = "_sampler_iter_yielded"
LEN_CALLED = "_IterableDataset_len_called"
SHARED_SEED = "_shared_seed"
# num_workers=0 only
NUM_YIELDED = "_num_yielded"
# num_workers > 0 only
SNAPSHOT = "_snapshot"
MAIN_SNAPSHOT = "_main_snapshot"
WORKER_SNAPSHOTS = "_worker_snapshots"
NUM_WORKERS = "_num_workers"
BASE_SEED = "_base_seed"
SNAPSHOT_STEP = "_snapshot_step"
LAST_YIELDED_WORKER_ID = "_last_yielded_worker_id"
STEPS_SINCE_SNAPSHOT = "_steps_since_snapshot"
WORKER_ID = "worker_id"
# torchdata's multiprocessing iterator (not its state): each worker's latest state, updated with every item it
# hands out, in order or not (an ``_IncrementalWorkerState`` per ``worker_<i>``, read with ``get_state()``),
# and whether it delivers in order (the loader's ``in_order`` when the iterator was made)
ITERATOR_WORKER_SNAPSHOTS = "_worker_snapshots"
ITERATOR_IN_ORDER = "_in_order"
ITERATOR_ATTRIBUTES = (ITERATOR_WORKER_SNAPSHOTS, ITERATOR_IN_ORDER)

Path = tuple[str, ...]
_NONE = type(None)
_INT_OR_NONE: tuple[type, ...] = (int, _NONE)
_FETCHER: tuple[tuple[Path, tuple[type, ...]], ...] = (
    ((FETCHER_STATE,), (dict, _NONE)),
    ((FETCHER_STATE, DATASET_ITER_STATE), (object,)),
    ((FETCHER_STATE, FETCHER_ENDED), (bool,)),
)


def worker_key(worker_id: int) -> str:
    """The key of a worker's snapshot in ``_worker_snapshots``."""
    return f"worker_{worker_id}"


def relied_on(num_workers: int) -> list[tuple[Path, tuple[type, ...]]]:
    """Every path into torchdata's dict that this module reads or writes, for a loader with
    ``num_workers``, with the types it may hold there (``int`` excludes ``bool``; below a
    ``None`` that its path allows, nothing is looked for)."""
    paths: list[tuple[Path, tuple[type, ...]]] = [((ITERATOR_FINISHED,), (bool,))]
    if num_workers == 0:
        paths += [((DATASET_STATE,), (dict,)), ((SAMPLER_ITER_YIELDED,), (int,)), ((NUM_YIELDED,), (int,)),
                  ((LEN_CALLED,), _INT_OR_NONE), ((SHARED_SEED,), _INT_OR_NONE), *_FETCHER]
        return paths
    main = (SNAPSHOT, MAIN_SNAPSHOT)
    paths += [((SNAPSHOT,), (dict,)), ((SNAPSHOT, SNAPSHOT_STEP), (int,)), ((SNAPSHOT, LAST_YIELDED_WORKER_ID), (int,)),
              ((STEPS_SINCE_SNAPSHOT,), (int,)), (main, (dict,)), ((*main, NUM_WORKERS), (int,)),
              ((*main, SAMPLER_ITER_YIELDED), (int,)), ((*main, BASE_SEED), (int,)),
              ((*main, LEN_CALLED), _INT_OR_NONE), ((*main, SHARED_SEED), _INT_OR_NONE),
              ((SNAPSHOT, WORKER_SNAPSHOTS), (dict,))]
    for worker_id in range(num_workers):
        worker = (SNAPSHOT, WORKER_SNAPSHOTS, worker_key(worker_id))
        paths += [(worker, (dict,)), ((*worker, WORKER_ID), (int,)), ((*worker, DATASET_STATE), (dict,)),
                  *(((*worker, *path), types) for path, types in _FETCHER)]
    return paths


def is_inner_state(value: dict[str, Any]) -> bool:
    """Whether a dict is torchdata's own state (a plain ``StatefulDataLoader.state_dict()``)."""
    return SNAPSHOT in value or DATASET_STATE in value


def worker_states(inner: dict[str, Any]) -> list[Any]:
    """The dataset state of each worker, in worker order (one for num_workers=0); None where there is none."""
    if SNAPSHOT in inner:
        snapshots = inner[SNAPSHOT][WORKER_SNAPSHOTS]
        return [snapshots[key].get(DATASET_STATE) for key in sorted(snapshots, key=lambda k: int(k.split("_")[-1]))]
    return [inner.get(DATASET_STATE)]


def worker_state(inner: dict[str, Any], worker_id: int) -> Any:
    """The dataset state of one worker (of a loader with workers)."""
    return inner[SNAPSHOT][WORKER_SNAPSHOTS][worker_key(worker_id)][DATASET_STATE]


def set_worker_state(inner: dict[str, Any], worker_id: int, state: Any) -> None:
    """Replace one worker's dataset state in ``inner`` (worker 0 is the only one with num_workers=0)."""
    if SNAPSHOT in inner:
        inner[SNAPSHOT][WORKER_SNAPSHOTS][worker_key(worker_id)][DATASET_STATE] = state
    else:
        assert worker_id == 0, "a num_workers=0 state holds one worker state"
        inner[DATASET_STATE] = state


def iterator_finished(inner: dict[str, Any]) -> bool:
    """Whether the state was taken after the loop ended (the epoch's last batch was yielded)."""
    return bool(inner.get(ITERATOR_FINISHED))


def set_iterator_finished(inner: dict[str, Any], finished: bool) -> None:
    inner[ITERATOR_FINISHED] = finished


def steps_since_snapshot(inner: dict[str, Any]) -> int:
    """The batches yielded after the workers' snapshots (0 with num_workers=0, which has none)."""
    return int(inner.get(STEPS_SINCE_SNAPSHOT, 0))


def clear_steps_since_snapshot(inner: dict[str, Any]) -> None:
    """Nothing yielded since the workers' snapshots: torchdata replays nothing on resume."""
    if STEPS_SINCE_SNAPSHOT in inner:
        inner[STEPS_SINCE_SNAPSHOT] = 0


def set_last_yielded_worker(inner: dict[str, Any], worker_id: int) -> None:
    """Where the round robin stands: the next batch comes from the worker after ``worker_id``."""
    inner[SNAPSHOT][LAST_YIELDED_WORKER_ID] = worker_id


def delivers_in_order(iterator: Any) -> bool:
    """Whether torchdata's multiprocessing ``iterator`` hands items out in its round robin: the loader's
    ``in_order`` when the iterator was made (a persistent one keeps it, whatever is set later)."""
    return bool(getattr(iterator, ITERATOR_IN_ORDER))


def latest_worker_snapshots(iterator: Any) -> dict[str, Any]:
    """What each worker of torchdata's multiprocessing ``iterator`` sent with the last item of it that the
    loader handed out (or with its end of the epoch), by ``worker_<i>`` key: the snapshot torchdata would
    take now. It keeps them up to date with every item, in order or not, between its snapshots."""
    snapshots = getattr(iterator, ITERATOR_WORKER_SNAPSHOTS)
    return {key: copy.deepcopy(snapshot.get_state()) for key, snapshot in snapshots.items()}


def snapshot_now(inner: dict[str, Any], worker_snapshots: dict[str, Any],
                 last_yielded_worker_id: int | None) -> dict[str, Any]:
    """A copy of ``inner`` (a loader with workers) whose snapshot stands where the loader stands: the workers'
    states ``worker_snapshots``, the round robin after ``last_yielded_worker_id`` (None: where it was),
    nothing yielded since (torchdata replays nothing on resume)."""
    state = copy.deepcopy(inner)
    snapshot = state[SNAPSHOT]
    snapshot[SNAPSHOT_STEP] = int(snapshot[SNAPSHOT_STEP]) + steps_since_snapshot(state)
    snapshot[WORKER_SNAPSHOTS] = copy.deepcopy(worker_snapshots)
    if last_yielded_worker_id is not None:
        snapshot[LAST_YIELDED_WORKER_ID] = last_yielded_worker_id
    clear_steps_since_snapshot(state)
    return state


class _DropInOrderWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "in_order=False" not in record.getMessage()


@contextlib.contextmanager
def no_in_order_warning() -> Iterator[None]:
    """Silence torchdata's warning that ``in_order=False`` gives no guarantee for its state: the loader
    that says so makes that state exact itself (it would be logged at every ``state_dict()``)."""
    torchdata_logger = logging.getLogger("torchdata.stateful_dataloader.stateful_dataloader")
    quiet = _DropInOrderWarning()
    torchdata_logger.addFilter(quiet)
    try:
        yield
    finally:
        torchdata_logger.removeFilter(quiet)


@dataclass(frozen=True)
class InnerState:
    """What torchdata's dict says, checked: its workers' states (in worker order) and which of them
    it considers done (the loop ended, or the worker's fetcher did)."""

    num_workers: int
    worker_states: list[Any]
    done: list[bool]
    finished: bool
    steps_since_snapshot: int = 0  # batches yielded after the workers' snapshots (not in their states)


def _optional_int(fields: Fields, key: str) -> None:
    value = fields.get(key)
    if value is not None and not is_int(value):
        raise StateError(f"the state's {fields.name(key)} is {shorten(value)}, expected an int or null; {REMEDY}")


def _fetcher_ended(fields: Fields) -> bool:
    """Whether torchdata's fetcher says the dataset ended (the fields it reads are there either way)."""
    fetcher = fields.get(FETCHER_STATE)
    if fetcher is None:
        return False
    fetcher_fields = Fields(fetcher, fields.name(FETCHER_STATE))
    fetcher_fields.get(DATASET_ITER_STATE)
    return fetcher_fields.boolean(FETCHER_ENDED)


def read_inner(inner: Any, snapshot_every_n_steps: int, where: str = "dataloader") -> InnerState:
    """torchdata's ``StatefulDataLoader`` dict, with every field it reads on resume checked."""
    fields = Fields(inner, where)
    finished = fields.boolean(ITERATOR_FINISHED)
    if SNAPSHOT not in fields.value:  # num_workers=0
        for key in (SAMPLER_ITER_YIELDED, NUM_YIELDED):
            fields.integer(key)
        for key in (LEN_CALLED, SHARED_SEED):
            _optional_int(fields, key)
        ended = _fetcher_ended(fields)
        return InnerState(0, [fields.get(DATASET_STATE)], [finished or ended], finished)
    snapshot = fields.mapping(SNAPSHOT)
    main = snapshot.mapping(MAIN_SNAPSHOT)
    num_workers = main.integer(NUM_WORKERS, 1)
    main.integer(SAMPLER_ITER_YIELDED)
    main.integer(BASE_SEED, -(2**63))
    for key in (LEN_CALLED, SHARED_SEED):
        _optional_int(main, key)
    snapshot.integer(SNAPSHOT_STEP)
    snapshot.integer(LAST_YIELDED_WORKER_ID, 0, num_workers - 1)
    steps = fields.integer(STEPS_SINCE_SNAPSHOT, 0, snapshot_every_n_steps - 1)
    workers = snapshot.mapping(WORKER_SNAPSHOTS)
    keys = [worker_key(index) for index in range(num_workers)]
    if set(workers.value) != set(keys):
        raise StateError(f"the state's {workers.where} has entries {shorten(list(workers.value))}, expected "
                         f"{shorten(keys)} for {num_workers} worker(s); {REMEDY}")
    states, done = [], []
    for index, key in enumerate(keys):
        worker = workers.mapping(key)
        check_int(worker.get(WORKER_ID), worker.name(WORKER_ID), index, index)
        states.append(worker.get(DATASET_STATE))
        _fetcher_ended(worker)  # a worker's fetcher starts again whatever it says
        # after batches yielded since the snapshots, a snapshot stands before its worker's end (checked
        # as a whole by the loader: those batches must be exactly what the workers had left)
        done.append(finished and steps == 0)
    return InnerState(num_workers, states, done, finished, steps)
