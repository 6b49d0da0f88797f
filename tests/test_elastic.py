"""Elastic resume (DESIGN guarantee 7): a checkpoint resumes with another number of workers.

The rest of the saved epoch is re-planned over the new workers: every row is still yielded
exactly once in that epoch, the following epochs are whole and the same as a fresh loader's of
the new topology, and a checkpoint taken inside the re-planned epoch resumes exactly. Other
world sizes go through torchrun in tests/test_distributed.py.
"""

from __future__ import annotations

from collections import Counter

import pyarrow.compute as pc
import pytest
from helpers import ids_of, json_roundtrip, make_loader, resume_epochs, run_epochs

from arrowstream import errors

OPTIONS = [
    {"batch_size": 64, "shuffle": True, "seed": 3},
    {"batch_size": 64, "shuffle": True, "seed": 3, "shuffle_buffer_size": 150, "interleave": 2},
    {"batch_size": 50, "shuffle_buffer_size": 700, "interleave": 3, "drop_last": True},
]


def first_batches(path, num_workers, options, steps, epoch=0):
    """``steps`` batches of ``epoch`` (after whole earlier epochs), and the state after them."""
    loader, dataset = make_loader(path, num_workers, **options)
    for earlier in range(epoch):
        dataset.set_epoch(earlier)
        for _ in loader:
            pass
    dataset.set_epoch(epoch)
    ids: list[int] = []
    for step, batch in enumerate(loader):
        ids += ids_of(batch)
        if step + 1 == steps:
            break
    return ids, json_roundtrip(loader.state_dict())


@pytest.mark.parametrize("options", OPTIONS, ids=["split-shuffle", "buffer-interleave", "big-buffer-drop-last"])
@pytest.mark.parametrize(("old", "new"), [(2, 3), (2, 0), (3, 1), (0, 2)])
def test_resume_with_other_workers(uneven_dataset, options, old, new):
    before, state = first_batches(uneven_dataset, old, options, steps=9)
    loader, dataset = make_loader(uneven_dataset, new, **options)
    loader.load_state_dict(state)
    assert dataset.epoch == 0
    expected_batches = len(loader)  # the re-planned epoch's own count, known before reading
    batches = [ids_of(b) for b in loader]
    assert len(batches) == expected_batches
    counts = Counter(before + [i for b in batches for i in b])
    assert max(counts.values()) == 1, "a row came twice in the re-planned epoch"
    if options.get("drop_last"):
        assert all(len(b) == options["batch_size"] for b in batches)
        assert len(counts) + dataset.rows_dropped_per_epoch(new) == dataset.num_rows
    else:
        assert sorted(counts) == list(range(dataset.num_rows))
    # later epochs: whole, and those of a fresh loader of the new topology
    fresh, fresh_dataset = make_loader(uneven_dataset, new, **options)
    for epoch in (1, 2):
        dataset.set_epoch(epoch)
        fresh_dataset.set_epoch(epoch)
        assert [ids_of(b) for b in loader] == [ids_of(b) for b in fresh]


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 0)])
def test_checkpoint_inside_the_replanned_epoch_resumes_exactly(uneven_dataset, old, new):
    options = OPTIONS[1]
    _, state = first_batches(uneven_dataset, old, options, steps=5)
    loader, dataset = make_loader(uneven_dataset, new, **options)
    loader.load_state_dict(state)
    reference, inner_state = [], None
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        for step, batch in enumerate(loader):
            reference.append(ids_of(batch))
            if epoch == 0 and step == 6:
                inner_state, consumed = json_roundtrip(loader.state_dict()), len(reference)
    fresh, fresh_dataset = make_loader(uneven_dataset, new, **options)
    fresh.load_state_dict(inner_state)
    replanned_len = len(fresh)  # the re-planned epoch's count, also in a fresh process
    fresh, fresh_dataset = make_loader(uneven_dataset, new, **options)
    resumed = resume_epochs(fresh, fresh_dataset, inner_state, 0, 1)
    assert [ids for _, _, ids in resumed] == reference[consumed:]
    assert replanned_len == sum(1 for e, _, _ in resumed if e == 0) + 7
    # and another topology inside the re-planned epoch re-plans it again: the same rows left, each once
    other, other_dataset = make_loader(uneven_dataset, 1, **options)
    again = resume_epochs(other, other_dataset, inner_state, 0, 0)
    rest = [i for _, _, ids in resumed[:sum(1 for e, _, _ in resumed if e == 0)] for i in ids]
    assert len(rest) > len(reference[consumed]) and sorted(i for _, _, ids in again for i in ids) == sorted(rest)


def test_states_at_the_epoch_boundary(uneven_dataset):
    options = OPTIONS[0]
    loader, dataset = make_loader(uneven_dataset, 2, **options)
    dataset.set_epoch(0)
    for _ in loader:
        pass
    after = json_roundtrip(loader.state_dict())
    fresh, fresh_dataset = make_loader(uneven_dataset, 3, **options)
    fresh.load_state_dict(after)
    assert [b for b in fresh] == []  # the saved epoch is over
    fresh_dataset.set_epoch(1)
    assert sorted(i for b in fresh for i in ids_of(b)) == list(range(fresh_dataset.num_rows))


def test_filter_inside_a_window_is_refused(uneven_dataset):
    options = {"batch_size": 32, "shuffle_buffer_size": 300, "filter": pc.field("label") != 3}
    _, state = first_batches(uneven_dataset, 2, options, steps=3)
    loader, _ = make_loader(uneven_dataset, 3, **options)
    with pytest.raises(errors.StateMismatchError, match="worker 0 stood inside a shuffle window, and with a filter"):
        loader.load_state_dict(state)
    # without a buffer, a filter re-plans fine: source offsets name the rows left
    options = {"batch_size": 32, "filter": pc.field("label") != 3, "shuffle": True}
    before, state = first_batches(uneven_dataset, 2, options, steps=3)
    loader, _ = make_loader(uneven_dataset, 3, **options)
    loader.load_state_dict(state)
    after = [i for b in loader for i in ids_of(b)]
    assert sorted(before + after) == [i for i in range(3130) if i % 7 != 3]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("new", "snapshot_every", "drop_last"), [(0, 1, True), (3, 2, False), (3, 3, True)])
def test_replanned_epoch_end_state_stored_with_next_epoch_number(uneven_dataset, new, snapshot_every, drop_last):
    """The state after the last batch of a re-planned epoch (2 workers -> ``new``), inside the loop or after
    it, stored as epoch + 1, resumes into exactly the uninterrupted next epoch (issue 16: with drop_last
    the rows short of a batch made it refuse the next epoch; snapshots every n > 1 steps too)."""
    options = {"batch_size": 64, "shuffle": True, "seed": 3, "drop_last": drop_last}
    _, state = first_batches(uneven_dataset, 2, options, steps=9)
    new_options = {**options, "snapshot_every_n_steps": snapshot_every} if new else options
    loader, dataset = make_loader(uneven_dataset, new, **new_options)
    loader.load_state_dict(state)
    checkpoints: dict = {}
    reference = run_epochs(loader, dataset, [0, 1], checkpoints, mid=5)
    for point in ("last", "after"):
        saved, consumed, epoch = checkpoints[point]
        fresh, fresh_dataset = make_loader(uneven_dataset, new, **new_options)
        resumed = resume_epochs(fresh, fresh_dataset, saved, epoch + 1, 1)
        assert [k for _, k, _ in resumed] == [k for _, k, _ in reference[consumed:]], point


@pytest.mark.parametrize("options", [{}, {"filter": pc.field("label") != 6}], ids=["plain", "filter"])
def test_replanned_epoch_with_rows_left_refuses_a_later_epoch(uneven_dataset, options):
    """A mid-epoch checkpoint re-planned for other workers, then set to the next epoch: refused, like a
    mid-epoch state of the same topology (it used to start the next epoch, losing the rest of the saved one)."""
    options = {"batch_size": 64, "shuffle": True, **options}
    _, state = first_batches(uneven_dataset, 2, options, steps=9)
    for state_first in (False, True):
        loader, dataset = make_loader(uneven_dataset, 0, **options)
        loader.load_state_dict(state)
        if state_first:  # a state taken before iterating builds the iterator: still refused
            loader.state_dict()
        dataset.set_epoch(1)
        with pytest.raises(errors.StateMismatchError, match=r"epoch 0 \(re-planned from world_size=1, num_workers=2\), "
                           r"which still has .* call dataset.set_epoch\(0\)"):
            next(iter(loader))
