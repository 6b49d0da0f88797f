"""``in_order=False`` with the static assignment: batches come as workers finish them, and a resume
still yields every row exactly once (issue #21, point 3).

torchdata snapshots its workers only when the batch it hands out is the next of its round robin, so
out of order its state stands at an older step and replays the batches since in the resumed loader's
own order: other batches, rows lost and repeated (or refused: the loader checks the count). The
loader's state says instead where each worker stands after its last batch handed out. Worker 0 is
made slow here (its ``transform`` sleeps), so delivery really is out of order, which each test checks.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
import torch
from helpers import ids_of, write_dataset

from arrowstream import StructuredDataset

NUM_ROWS = 1200
BATCHES_PER_TRANSFER = 2
pytestmark = [pytest.mark.timeout(180), pytest.mark.filterwarnings("ignore:This DataLoader will create")]


def _slow_worker_zero(batch):
    """Worker 0 sleeps over each batch; every batch says which worker made it."""
    worker = torch.utils.data.get_worker_info().id
    if worker == 0:
        time.sleep(0.005)
    return {**batch, "worker": torch.full((len(batch["id"]),), worker)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("in-order"), [(300, 50), (300, 50), (200, 50), (400, 100)])


def _loader(path, num_workers, in_order=False, **kwargs):
    options = {"batch_size": 16, "shuffle": True, "seed": 5, "shuffle_buffer_size": 64, "interleave": 2,
               "transform": _slow_worker_zero, "batches_per_transfer": BATCHES_PER_TRANSFER}
    return StructuredDataset.create_dataloader(path=path, num_workers=num_workers, in_order=in_order,
                                               **{**options, **kwargs})


def _out_of_order(workers: list[int], zero_done: bool = True) -> bool:
    """Whether a fast worker got more than a chunk ahead of worker 0 before worker 0 was done (at its
    last batch in ``workers``; ``zero_done=False``: after them all): the round robin of ``in_order=True``
    never lets it."""
    counts: Counter[int] = Counter()
    zero = [index for index, worker in enumerate(workers) if worker == 0]
    for worker in workers[:zero[-1] if zero_done else len(workers)]:
        counts[worker] += 1
        if max(counts.values()) - counts[0] > BATCHES_PER_TRANSFER:
            return True
    return False


def _assert_each_row_once(*parts: list[int]) -> None:
    rows = Counter(row for part in parts for row in part)
    repeated = sorted(row for row, count in rows.items() if count > 1)
    missing = sorted(set(range(NUM_ROWS)) - set(rows))
    assert not repeated and not missing, f"{len(repeated)} rows repeated {repeated[:5]}, {len(missing)} missing {missing[:5]}"


def _take(loader, batches):
    """The rows and the worker of each of the loader's next ``batches`` batches."""
    rows: list[int] = []
    workers: list[int] = []
    for batch in loader:
        rows += ids_of(batch)
        workers.append(int(batch["worker"][0]))
        if len(workers) == batches:
            break
    return rows, workers


def _states_along_epoch(path, num_workers, points, **kwargs):
    """One epoch of ``in_order=False``: its rows, the worker of each batch, and at each point (batches
    handed out, -1 for the last, or "after" the loop) the JSON state and the rows handed out before it."""
    loader, dataset = _loader(path, num_workers, **kwargs)
    dataset.set_epoch(0)
    points = {len(loader) if point == -1 else point for point in points}
    rows: list[int] = []
    workers: list[int] = []
    states: dict[object, tuple[dict, list[int], bool]] = {}
    for batch in loader:
        rows += ids_of(batch)
        workers.append(int(batch["worker"][0]))
        if len(workers) in points:
            inside = loader._batch_iterator.inside_chunk
            states[len(workers)] = (json.loads(json.dumps(loader.state_dict())), list(rows), inside)
    states["after"] = (json.loads(json.dumps(loader.state_dict())), list(rows), False)
    return rows, workers, states


def _rest(path, num_workers, state, epoch=0, **kwargs) -> list[int]:
    loader, dataset = _loader(path, num_workers, **kwargs)
    loader.load_state_dict(state)
    dataset.set_epoch(epoch)
    return [row for batch in loader for row in ids_of(batch)]


@pytest.mark.parametrize("num_workers", [2, 3])
def test_resume_anywhere_yields_the_rows_not_yet_seen_once(data, num_workers):
    points = {1, 7, 25, 40, 61, -1}  # odd counts fall inside a 2-batch chunk of some worker
    rows, workers, states = _states_along_epoch(data, num_workers, points)
    _assert_each_row_once(rows)  # (a) the whole epoch, out of order
    assert _out_of_order(workers), f"delivery was in order: {workers}"
    assert len(states) == len(points) + 1
    assert any(inside for _, _, inside in states.values()), "no state was taken inside a chunk"
    for state, before, _ in states.values():
        _assert_each_row_once(before, _rest(data, num_workers, state))
    # at the epoch's end (inside the loop and after it) the next epoch starts whole
    for point in (len(workers), "after"):
        _assert_each_row_once(_rest(data, num_workers, states[point][0], epoch=1))


def test_state_moves_between_in_order_and_out_of_order(data):
    _, workers, states = _states_along_epoch(data, 2, {13, 30})
    assert _out_of_order(workers)
    state, before, _ = states[13]
    _assert_each_row_once(before, _rest(data, 2, state, in_order=True))

    loader, dataset = _loader(data, 2, in_order=True)  # an in-order state, resumed out of order
    dataset.set_epoch(0)
    before = []
    for batch in loader:
        before += ids_of(batch)
        if len(before) == 21 * 16:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    _assert_each_row_once(before, _rest(data, 2, state))


def test_persistent_workers_in_a_later_epoch(data):
    loader, dataset = _loader(data, 2, persistent_workers=True)
    dataset.set_epoch(0)
    _assert_each_row_once([row for batch in loader for row in ids_of(batch)])
    dataset.set_epoch(1)
    before, workers = _take(loader, 23)
    state = json.loads(json.dumps(loader.state_dict()))
    assert _out_of_order(workers, zero_done=False)
    _assert_each_row_once(before, _rest(data, 2, state, epoch=1))


def test_elastic_resume_from_an_out_of_order_state(data):
    _, workers, states = _states_along_epoch(data, 2, {19})
    assert _out_of_order(workers)
    state, before, _ = states[19]
    for num_workers in (3, 1):
        _assert_each_row_once(before, _rest(data, num_workers, state))


def test_snapshot_every_n_steps_out_of_order(data):
    """Workers send their state with every third batch only: the positions the batches carry fill in."""
    rows, workers, states = _states_along_epoch(data, 3, {4, 20, 44}, snapshot_every_n_steps=3)
    _assert_each_row_once(rows)
    assert _out_of_order(workers)
    for state, before, _ in states.values():
        _assert_each_row_once(before, _rest(data, 3, state, snapshot_every_n_steps=3))


def test_drop_last_at_the_end_of_the_epoch(data):
    """Each worker's last short batch is dropped and counted: the state after the loop says so, and from
    either end state the saved epoch yields nothing more and the next one starts whole."""
    # 600 rows a worker: 28 batches of 21 (a whole number of chunks), then 12 rows dropped on their own
    rows, _, states = _states_along_epoch(data, 2, {-1}, drop_last=True, batch_size=21)
    assert len(set(rows)) == len(rows) < NUM_ROWS
    workers = states["after"][0]["dataloader"]["_snapshot"]["_worker_snapshots"].values()
    assert sum(w["dataset_state"]["counters"]["rows_dropped"] for w in workers) == NUM_ROWS - len(rows)
    for state, _, _ in states.values():
        assert _rest(data, 2, state, drop_last=True, batch_size=21) == []
        rest = _rest(data, 2, state, epoch=1, drop_last=True, batch_size=21)
        assert len(set(rest)) == len(rest) > NUM_ROWS - 2 * 21


def test_in_order_set_mid_epoch_does_not_change_how_the_state_is_taken(data):
    """The epoch's iterator was made out of order: setting ``in_order=True`` on the loader now changes
    nothing of its delivery, and the state still says what it handed out."""
    loader, dataset = _loader(data, 3, snapshot_every_n_steps=2)
    dataset.set_epoch(0)
    before, workers = _take(loader, 29)
    loader.in_order = True
    state = json.loads(json.dumps(loader.state_dict()))
    assert _out_of_order(workers, zero_done=False)
    _assert_each_row_once(before, _rest(data, 3, state, snapshot_every_n_steps=2))
