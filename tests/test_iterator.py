"""One worker iterator (arrowstream._worker.iterator) for a dataset and a mixture: the same handing-out behaviour.

``iter(dataset)`` and ``iter(mixture)`` are one ``SlotIterator`` over their slot's stream. Both hand their batches
out so that a state taken between any two batches resumes exactly, at ``num_workers=0`` too, where a mixture
hands out spans batch by batch and a dataset reads one record at a time; and in a worker both send chunks
that end where the slot's batch count is a multiple of ``batches_per_transfer``, from a state taken inside one.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from helpers import ids_of, json_roundtrip, write_ids
from torchdata.stateful_dataloader import StatefulDataLoader

from arrowstream import Mixture, Source, StructuredDataset
from arrowstream._worker.iterator import SlotIterator
from arrowstream._worker.runtime import Transport
from arrowstream._worker.transport import default_batches_per_transfer

BATCH_SIZE = 10
ROWS = 230   # 23 batches: a mixture's span at num_workers=0 holds 16 (ROWS_PER_TRANSFER // 10, at most 16)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_ids(tmp_path_factory.mktemp("iterator"), (130, 100), row_group_size=25)


def _make(kind: str, folder: str, num_workers: int, **kwargs: Any) -> tuple[Any, Any]:
    options = {"batch_size": BATCH_SIZE, "num_workers": num_workers, "output_format": "dict", "shuffle": True,
               "seed": 3, "plan_cache": False, **kwargs}
    if kind == "dataset":
        return StructuredDataset.create_dataloader(path=folder, **options)
    return Mixture.create_dataloader(sources={"only": Source(folder)}, **options)


def _ids(batches: list[Any]) -> list[list[int]]:
    return [ids_of(batch) for batch in batches]


@pytest.mark.parametrize("kind", ["dataset", "mixture"])
def test_both_are_the_one_iterator(folder, kind):
    _, dataset = _make(kind, folder, 0)
    assert type(iter(dataset)) is SlotIterator


@pytest.mark.parametrize("kind", ["dataset", "mixture"])
def test_a_state_between_two_batches_of_a_span_resumes_exactly_at_zero_workers(folder, kind):
    """At num_workers=0 a mixture reads a span of 16 batches and hands them out one by one (a dataset one record
    at a time): a state taken after any batch inside it stands there, and a fresh loader resumes right after it."""
    assert default_batches_per_transfer(BATCH_SIZE) == 16
    loader, _ = _make(kind, folder, 0)
    whole = _ids(list(loader))
    assert sorted(i for batch in whole for i in batch) == list(range(ROWS))
    for k in (1, 5, 15, 16, 17, 22):   # inside the first span, at its end, inside the second, before the last
        loader, _ = _make(kind, folder, 0)
        taken = iter(loader)
        head = [ids_of(next(taken)) for _ in range(k)]
        state = json_roundtrip(loader.state_dict())
        resumed, _ = _make(kind, folder, 0)
        resumed.load_state_dict(state)
        assert head + _ids(list(resumed)) == whole, (kind, k)


def _worker_state(state: dict[str, Any]) -> dict[str, Any]:
    """Worker 0's own state inside a loader's state (torchdata's snapshot of it)."""
    worker: dict[str, Any] = state["dataloader"]["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    return worker


def _chunk_batches(chunk: Any) -> list[int]:
    """In the worker (a collate_fn): the slot's batch count after each batch of a chunk."""
    return [position.batches for position in chunk.positions]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["dataset", "mixture"])
def test_chunks_end_at_multiples_of_batches_per_transfer_from_a_state_inside_one(folder, kind):
    """A worker that resumes from a state taken after 2 batches, with 3 batches per transfer, sends 1 batch first
    and then 3 at a time: its chunks end where they ended before the checkpoint, a dataset's and a mixture's."""
    loader, _ = _make(kind, folder, 1, batches_per_transfer=3)
    taken = iter(loader)
    try:
        next(taken), next(taken)
        state = json_roundtrip(loader.state_dict())
    finally:
        getattr(taken, "_inner", taken)._shutdown_workers()
    worker_state = _worker_state(state)
    assert worker_state.get("counters", worker_state)["batches"] == 2   # a dataset's counters, a mixture's own
    _, dataset = _make(kind, folder, 1, batches_per_transfer=3)
    transport = Transport(batches_per_transfer=3, send_chunks=True)
    dataset.worker_side.use_transport(transport)
    # torchdata's plain loader hands the worker its state and yields the chunks as they come (its collate_fn sees
    # them in the worker): the arrowstream loaders unpack them
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # a plain loader over arrowstream's dataset is warned of
        plain = StatefulDataLoader(dataset, batch_size=None, num_workers=1, collate_fn=_chunk_batches)
        plain.load_state_dict(state["dataloader"])
        counts = list(plain)
    # 23 batches in the epoch: 2 handed out before the checkpoint, then up to 3 at a time, ending at multiples of 3
    assert counts == [[3]] + [[b, b + 1, b + 2] for b in range(4, 22, 3)] + [[22, 23]]
