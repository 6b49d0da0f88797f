"""A mixture in a user's own ``StatefulDataLoader``, changed at an epoch boundary, keeps each source's position.

DESIGN.md: weights and the set of sources may change at an epoch boundary, and each source keeps its position in its
passes. ``Mixture.create_dataloader``'s loader follows the checkpoint (``Mixture.follow``); a plain
``StatefulDataLoader(mixture, batch_size=None, num_workers=N)`` hands the state to ``Mixture.load_state_dict`` (in the
trainer with ``num_workers=0``, else in each worker), which must follow it the same way: the rows of each source after
the change are the reference loader's, epoch after epoch, and every pass of a source holds each of its rows once.
Workers started afresh for a later epoch (``persistent_workers=False``) are copies of the trainer's mixture, which
torchdata never hands the state; they read the followed history from the mixture's shared cell.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from test_mixing import write_source
from torchdata.stateful_dataloader import StatefulDataLoader

from arrowstream import Mixture, Source

BASES = {"a": 0, "b": 10_000, "c": 20_000}
ROWS = {"a": 100, "b": 60, "c": 50}
OPTIONS = {"epoch_rows": 60, "batch_size": 10, "shuffle": True, "seed": 3, "source_column": "src",
           "plan_cache": False}
BEFORE = {"a": 1, "b": 1}
EPOCHS = (1, 2, 3, 4, 5)   # read after the change


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("plain_change")
    return {name: write_source(root / name, BASES[name], rows, group=20) for name, rows in ROWS.items()}


def _sources(folders, names):
    return {name: Source(folders[name]) for name in names}


def _plain(folders, weights, num_workers, persistent):
    mixture = Mixture(sources=_sources(folders, weights), weights=weights, **OPTIONS)
    return StatefulDataLoader(mixture, batch_size=None, num_workers=num_workers,
                              persistent_workers=persistent), mixture


def _own(folders, weights, num_workers, persistent):
    return Mixture.create_dataloader(sources=_sources(folders, weights), weights=weights, num_workers=num_workers,
                                     persistent_workers=persistent, **OPTIONS)


def _epoch(loader, mixture, epoch):
    mixture.set_epoch(epoch)
    return [list(zip(batch["src"], batch["id"].tolist(), strict=True)) for batch in loader]


def _per_source(batches):
    """Each source's rows of an epoch, in the order they came."""
    rows: dict[str, list[int]] = {}
    for batch in batches:
        for name, row in batch:
            rows.setdefault(name, []).append(row)
    return rows


def _run(make, folders, after, num_workers, persistent):
    """Epoch 0 with ``BEFORE``, a checkpoint after its loop, a fresh loader of weights ``after`` resumed from it."""
    loader, mixture = make(folders, BEFORE, num_workers, persistent)
    _epoch(loader, mixture, 0)
    state = json.loads(json.dumps(loader.state_dict()))
    loader, mixture = make(folders, after, num_workers, persistent)
    loader.load_state_dict(state)
    return [_epoch(loader, mixture, epoch) for epoch in EPOCHS], mixture


@pytest.mark.timeout(240)
@pytest.mark.parametrize("after", [{"a": 2, "b": 1}, {"a": 1, "c": 1}, {"a": 1, "b": 1, "c": 2}],
                         ids=["weights", "b-out-c-in", "c-added"])
@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
def test_a_plain_loader_keeps_each_sources_position_across_a_change(folders, after, num_workers, persistent):
    epochs, mixture = _run(_plain, folders, after, num_workers, persistent)
    reference, _ = _run(_own, folders, after, num_workers, persistent)
    for got, want in zip(epochs, reference, strict=True):
        if num_workers == 0:
            assert got == want   # one process: the very batches
        else:   # the workers' batches interleave as each loader delivers them: each source's rows, in each worker's order
            assert {name: Counter(rows) for name, rows in _per_source(got).items()} == \
                   {name: Counter(rows) for name, rows in _per_source(want).items()}
    loader, before = _plain(folders, BEFORE, 0, False)
    first = _per_source(_epoch(loader, before, 0))["a"]
    # the mixture stands where the checkpoint left it: epoch 0's quotas of the sources it keeps, then its own
    assert mixture.history == [(0, {n: q for n, q in before.quotas().items() if n in after}), (1, mixture.quotas())]
    if num_workers == 0:   # a source kept goes on in its passes: "a" took 30 rows in epoch 0, its first pass goes on
        taken = first + [row for batches in epochs for row in _per_source(batches)["a"]]
        assert len(taken) >= ROWS["a"]
        assert sorted(taken[:ROWS["a"]]) == list(range(BASES["a"], BASES["a"] + ROWS["a"]))
