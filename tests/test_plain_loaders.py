"""A dataset handed to a loader that is not arrowstream's (#37, Build 1).

A loader that batches the dataset's batches again (``batch_size`` not None: torch's ``DataLoader(dataset)``
takes 1) is refused with an arrowstream error before the first batch, in every front door (a dataset, an
Iceberg table, a mixture), with 0 or 2 workers, fork or spawn, persistent or not, torch's loader or
torchdata's. With ``batch_size=None`` a plain ``StatefulDataLoader`` works silently and torch's plain
``DataLoader`` works with one warning that it cannot resume. ``dataset[i]`` and ``len(dataset)`` name what
exists today, as ``TypeError``s, which torch, tools and ``list()`` take for "no length".
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import warnings

import pyarrow as pa
import pytest
from helpers import ids_of, make_loader, write_dataset
from iceberg_tables import make_catalog
from torch.utils.data import DataLoader, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from arrowstream import IcebergDataset, Mixture, PlainLoaderWarning, Source, StructuredDataset, errors

BATCH = 64
REFUSED = r"batch_size: \w+ yields whole batches .*create_dataloader\(\.\.\.\), or pass batch_size=None"


@pytest.fixture(autouse=True)
def _quiet_torchdata():
    with warnings.catch_warnings():   # torchdata 0.11 calls torch.set_vital, deprecated in torch 2.13
        warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
        yield


@pytest.fixture(params=["dataset", "iceberg", "mixture"])
def front_door(request, tmp_path):
    """The dataset each front door builds directly: a dataset of 400 rows, an Iceberg table of 300, a mixture of
    two sources taking 300 rows an epoch; batches of 64 rows."""
    path = write_dataset(tmp_path / "data", [(200, 100), (200, 100)])
    if request.param == "dataset":
        dataset = StructuredDataset(path, batch_size=BATCH)
    elif request.param == "iceberg":
        catalog, config = make_catalog(str(tmp_path / "warehouse"))
        rows = pa.table({"id": pa.array(range(300), pa.int64()), "x": pa.array([i / 2 for i in range(300)])})
        catalog.create_table("db.events", schema=rows.schema).append(rows)
        dataset = IcebergDataset("db.events", catalog_config=config, batch_size=BATCH)
    else:
        other = write_dataset(tmp_path / "other", [(100, 50)], seed=1)
        dataset = Mixture({"a": Source(path), "b": Source(other)}, batch_size=BATCH, epoch_rows=300)
    return dataset


def _first_batch(loader):
    try:
        iterator = iter(loader)
        return next(iterator)
    except Exception as error:
        # the traceback's frames hold torch's iterator (also one that raised while it started its workers):
        # freed later by the cyclic collector, its queues' feeder threads close before its __del__ asks the
        # workers to end, and torch then waits 5 s for each (torch's own shutdown, reproduced without
        # arrowstream). Dropped here, the iterator is freed at once, while its queues are open: milliseconds.
        error.__traceback__ = None
        raise error from None
    finally:
        iterator = None
        gc.collect()   # a loader's workers end now, not when the test's frames go


@pytest.mark.parametrize("make", [
    lambda ds, collate: DataLoader(ds, collate_fn=collate),                  # torch's default batch_size=1
    lambda ds, collate: DataLoader(ds, batch_size=256, collate_fn=collate),
    lambda ds, collate: StatefulDataLoader(ds, batch_size=4, collate_fn=collate),
], ids=["DataLoader-default", "DataLoader-256", "StatefulDataLoader-4"])
def test_a_loader_that_batches_again_is_refused_before_the_first_batch(front_door, make):
    collated = []
    loader = make(front_door, lambda batches: collated.append(batches) or batches)
    name = type(front_door).__name__
    with pytest.raises(errors.InvalidArgumentError, match=REFUSED) as refused:
        _first_batch(loader)
    assert isinstance(refused.value, ValueError)
    assert f"{name}.create_dataloader(...)" in str(refused.value) and f"({BATCH} rows each" in str(refused.value)
    assert collated == []   # refused before a batch was read or collated
    rows = 400 if type(front_door) is StructuredDataset else 300
    assert sum(len(b["id"]) for b in front_door) == rows   # and read alone, it reads on


@pytest.mark.slow
@pytest.mark.parametrize(("make", "context"), [
    (lambda ds: DataLoader(ds, num_workers=2), "fork"),   # the case: batch_size=1, shapes (1, 64)
    (lambda ds: StatefulDataLoader(ds, batch_size=256, num_workers=2, persistent_workers=True,
                                   multiprocessing_context="spawn"), "spawn"),
], ids=["DataLoader-fork", "StatefulDataLoader-spawn-persistent"])
def test_workers_refuse_it_too(small_dataset, make, context):
    """The worker raises where torch asks it for its iterator; the loader hands the error over first thing."""
    dataset = StructuredDataset(small_dataset, batch_size=BATCH)
    with pytest.raises(errors.InvalidArgumentError, match=REFUSED) as refused:
        _first_batch(make(dataset))
    assert "worker process" in str(refused.value)


def test_a_subclass_calling_super_iter_is_refused_as_well(small_dataset):
    class Mine(StructuredDataset):
        def __iter__(self):
            return super().__iter__()

    with pytest.raises(errors.InvalidArgumentError, match=r"Mine\.create_dataloader"):
        _first_batch(DataLoader(Mine(small_dataset, batch_size=BATCH), batch_size=8))


def test_a_wrapper_of_the_users_is_left_alone(small_dataset):
    """An IterableDataset of the user's that cuts the batches into rows may be batched by its loader."""
    class Rows(IterableDataset):
        def __init__(self, dataset):
            self.dataset = dataset

        def __iter__(self):
            for batch in self.dataset:
                yield from (int(i) for i in batch["id"])

    batches = list(DataLoader(Rows(StructuredDataset(small_dataset, batch_size=BATCH)), batch_size=32))
    assert [len(b) for b in batches] == [32] * 12 + [16]
    assert sorted(int(i) for b in batches for i in b) == list(range(400))


def test_torchs_plain_dataloader_reads_the_batches_and_warns_once(front_door):
    loader = DataLoader(front_door, batch_size=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in (0, 1):
            front_door.set_epoch(epoch)
            alone = [ids_of(b) for b in front_door]
            assert [ids_of(b) for b in loader] == alone
            assert [ids_of(b) for b in DataLoader(front_door, batch_size=None)] == alone   # another loader
    warned = [w for w in caught if issubclass(w.category, PlainLoaderWarning)]
    assert len(warned) == 1, [str(w.message) for w in caught]
    message = str(warned[0].message)
    name = type(front_door).__name__
    assert "no state_dict" in message and f"{name}.create_dataloader(...)" in message
    assert "StatefulDataLoader(dataset, batch_size=None" in message
    assert issubclass(PlainLoaderWarning, UserWarning)


def test_an_error_filter_makes_the_warning_an_error_each_time(small_dataset):
    dataset = StructuredDataset(small_dataset, batch_size=BATCH)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlainLoaderWarning)
        for _ in range(2):
            with pytest.raises(PlainLoaderWarning):
                iter(DataLoader(dataset, batch_size=None))


_FORKED = """
import sys
import torch
from torch.utils.data import DataLoader
from arrowstream import StructuredDataset

dataset = StructuredDataset(sys.argv[1], batch_size=64)
loader = DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=sys.argv[2] == "1")
for epoch in range(3):
    dataset.set_epoch(epoch)
    ids = torch.cat([batch["id"] for batch in loader])
    print(epoch, len(ids), len(set(ids.tolist())), flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True], ids=["workers", "persistent-workers"])
def test_forked_workers_warn_once_over_epochs(small_dataset, persistent):
    """With workers the trainer runs no code of the dataset: worker 0 warns, on its stderr, once for all epochs
    (a flag in shared memory), here in a process of its own, as a user's script runs (no pytest filters)."""
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(_FORKED), small_dataset, str(int(persistent))],
                         capture_output=True, text=True, timeout=240, check=False,
                         env={**os.environ, "PYTHONWARNINGS": ""})
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:3] == ["0 400 400", "1 400 400", "2 400 400"]
    assert run.stderr.count("PlainLoaderWarning") == 1, run.stderr


@pytest.mark.slow
def test_spawned_workers_warn_once_over_epochs(small_dataset, capfd):
    dataset = StructuredDataset(small_dataset, batch_size=BATCH)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        assert sorted(i for b in loader for i in ids_of(b)) == list(range(400))
    assert capfd.readouterr().err.count("PlainLoaderWarning") == 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_loaders_are_not_warned(small_dataset, num_workers):
    """torchdata's StatefulDataLoader and create_dataloader's loader: no warning (an error filter, which forked
    workers inherit, would raise it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlainLoaderWarning)
        dataset = StructuredDataset(small_dataset, batch_size=BATCH)
        plain = StatefulDataLoader(dataset, batch_size=None, num_workers=num_workers)
        ours, _ = make_loader(small_dataset, num_workers, batch_size=BATCH)
        for loader in (plain, ours):
            for epoch in (0, 1):
                loader.dataset.set_epoch(epoch)
                assert sorted(i for b in loader for i in ids_of(b)) == list(range(400))


def test_dataset_index_and_len_say_what_exists_today(front_door):
    name = type(front_door).__name__
    for ask, pattern in ((lambda: front_door[0], r"\[0\]: \w+ streams batches and has no random access yet"),
                         (lambda: len(front_door), r"len\(\w+\): \w+ streams batches and has no len\(\) yet")):
        with pytest.raises(errors.ArgumentTypeError, match=pattern) as refused:
            ask()
        message = str(refused.value)
        assert isinstance(refused.value, TypeError)
        assert "len(loader)" in message and f"{name}.create_dataloader(...)" in message
        assert ".num_batches(num_workers)" in message
        assert ("num_rows" if isinstance(front_door, StructuredDataset) else "quotas()") in message


def test_what_asks_for_a_length_still_works(small_dataset):
    """``list()``, truth, torch's and torchdata's ``len(loader)`` (a TypeError: no length, as before) and the
    length of create_dataloader's loader."""
    dataset = StructuredDataset(small_dataset, batch_size=BATCH)
    assert bool(dataset) and len(list(dataset)) == 7
    for plain in (DataLoader(dataset, batch_size=None), StatefulDataLoader(dataset, batch_size=None)):
        with pytest.raises(TypeError, match=r"len\(dataset\)"):
            len(plain)
    loader, built = make_loader(small_dataset, 2, batch_size=BATCH)
    assert len(loader) == built.num_batches(2) == len(list(loader))
    tqdm = pytest.importorskip("tqdm")
    assert tqdm.tqdm(dataset, disable=True).total is None
