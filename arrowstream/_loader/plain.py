"""A dataset handed to a loader that is not arrowstream's: what it can tell of that loader, and what it says.

An arrowstream dataset yields whole batches, so its loader must not batch again: ``batch_size=None``.
torch's ``DataLoader(dataset)`` batches by default (``batch_size=1``: every tensor gains a dimension of 1,
every text a 1-tuple), and ``DataLoader(dataset, batch_size=256)`` stacks 256 of them, or fails inside torch.
A loader without ``state_dict`` (torch's) reads the right batches but cannot resume.

How the dataset knows, in every process that reads: torch's ``DataLoader`` and torchdata's
``StatefulDataLoader`` read an ``IterableDataset`` through one kind of fetcher,
``torch.utils.data._utils.fetch._IterableDatasetFetcher``, made by ``_DatasetKind.create_fetcher`` where the
rows are read: in the trainer when the loader's iterator is made (``num_workers=0``), in each worker when
it starts (fork, spawn, forkserver alike), and again at each epoch in a persistent worker
(``_ResumeIteration``). The fetcher's ``__init__`` stores the loader's ``auto_collation`` (``batch_size`` not
None) and then calls ``iter(dataset)``. So the dataset's ``__iter__`` looks at its caller, once per epoch
and process: when that is the fetcher's ``__init__`` (the very code object, not a name) and the fetcher's
dataset is this dataset, :meth:`LoaderWatch.check` reads the flag from it, and raises before any batch is
read. The fetcher was asked for by torch's own ``_worker_loop`` or ``_SingleProcessDataLoaderIter``
(code objects again) only for torch's plain ``DataLoader``; torchdata's loaders (arrowstream's among them)
have their own, so only a plain ``DataLoader`` gets the warning: once per dataset, from the trainer with
``num_workers=0``, else from worker 0 (its stderr: the trainer's process runs no code of the dataset then),
across epochs and worker processes through a flag in shared memory.

Anything else is left alone, never refused: iterating the dataset directly (``for batch in dataset``), an
``IterableDataset`` of the user's that wraps it (it may cut the batches into rows, which a loader may then
batch), other loaders, and a torch whose fetcher works otherwise (the checks then find no fetcher).

Why the caller's frame: nothing else reaches the loader. ``get_worker_info()`` gives a worker the dataset,
not the loader; with workers the trainer's process runs no code of the dataset at all (under fork nothing of
it is called there), so no mark set there could be read; and patching torch's fetcher would change every
loader of the process. The check compares code objects and the fetcher's dataset by identity: when a torch
release moves the call, it finds no fetcher and stays silent rather than refuse wrongly, and
tests/test_plain_loaders.py fails.

:func:`no_random_access` is the error of ``dataset[i]`` and ``len(dataset)``, which are not offered yet.
"""

from __future__ import annotations

import warnings
from types import FrameType
from typing import Any, ClassVar

import torch
from torch.utils.data import dataloader as _torch_loader
from torch.utils.data import get_worker_info
from torch.utils.data._utils import fetch as _torch_fetch
from torch.utils.data._utils import worker as _torch_worker

from .._worker.shm import share
from ..errors import ArgumentTypeError, InvalidArgumentError, PlainLoaderWarning

_FETCHER_INIT = _torch_fetch._IterableDatasetFetcher.__init__.__code__
_CREATE_FETCHER = _torch_loader._DatasetKind.create_fetcher.__code__
# where torch's own DataLoader (not torchdata's) asks for a fetcher: a worker, or the trainer with num_workers=0
_PLAIN_TORCH = (_torch_worker._worker_loop.__code__, _torch_loader._SingleProcessDataLoaderIter.__init__.__code__)


class LoaderWatch:
    """One dataset's look at the loader that iterates it; see the module docstring."""

    def __init__(self, what: str) -> None:
        # set once the plain-DataLoader warning was shown: shared, so that workers of later epochs see it
        self._warned = share(torch.zeros(1, dtype=torch.uint8), f"{what}: the loader watch")

    def check(self, dataset: Any, caller: FrameType | None) -> None:
        """Called by ``dataset.__iter__`` with its caller's frame: raise when that is a loader's fetcher that
        batches again, warn (once) when it is torch's plain ``DataLoader``'s."""
        frame = _fetcher_frame(dataset, caller)
        if frame is None:
            return
        name = type(dataset).__name__
        if frame.f_locals["self"].auto_collation:
            raise InvalidArgumentError(
                f"batch_size: {name} yields whole batches ({dataset.batch_size} rows each, its batch_size) and the "
                "DataLoader iterating it has a batch_size too (torch's DataLoader takes batch_size=1 when it is left "
                "out), so it would batch those batches again; build the loader with "
                f"{name}.create_dataloader(...), or pass batch_size=None to your own: "
                "StatefulDataLoader(dataset, batch_size=None, num_workers=N) (torchdata), which also resumes exactly")
        if not _asked_by_plain_torch(frame) or int(self._warned[0]):
            return
        info = get_worker_info()
        if info is None or info.id == 0:
            warnings.warn(
                f"{name} is read by torch's DataLoader, which has no state_dict: the batches are right, but a run "
                f"cannot be checkpointed and resumed; for exact resume build the loader with "
                f"{name}.create_dataloader(...), or use torchdata's StatefulDataLoader(dataset, batch_size=None, "
                "num_workers=N) (shown once per dataset)", PlainLoaderWarning, stacklevel=2)
            self._warned[0] = 1   # after the warning: a filter that makes it an error raises every time


def _fetcher_frame(dataset: Any, caller: FrameType | None) -> FrameType | None:
    """The frame of the torch fetcher's ``__init__`` that calls ``iter(dataset)`` (directly, or through the
    ``__iter__`` of a subclass that calls ``super().__iter__()``), for ``dataset`` itself; else None."""
    frame = caller
    while frame is not None and frame.f_code.co_name == "__iter__" and frame.f_locals.get("self") is dataset:
        frame = frame.f_back
    if frame is None or frame.f_code is not _FETCHER_INIT:
        return None
    fetcher = frame.f_locals.get("self")
    if not isinstance(fetcher, _torch_fetch._IterableDatasetFetcher) or fetcher.dataset is not dataset:
        return None
    return frame


def _asked_by_plain_torch(fetcher_frame: FrameType) -> bool:
    """Whether the fetcher being made in ``fetcher_frame`` was asked for by torch's own ``DataLoader``."""
    frame = fetcher_frame.f_back
    if frame is not None and frame.f_code is _CREATE_FETCHER:
        frame = frame.f_back
    return frame is not None and any(frame.f_code is code for code in _PLAIN_TORCH)


def no_random_access(dataset: Any, asked: str, sizes: str) -> ArgumentTypeError:
    """The error of ``len(dataset)`` (``asked`` starts with ``len(``) and ``dataset[i]``, naming what exists
    today; ``sizes``: the dataset's own ways to its sizes. Cheap and never failing: ``list(dataset)`` asks
    ``len()`` first (and takes a TypeError for "no length"), and so does a plain DataLoader's ``len(loader)``."""
    name = type(dataset).__name__
    loader = f"the loader {name}.create_dataloader(...) returns"
    if asked.startswith("len("):
        return ArgumentTypeError(
            f"{asked}: {name} streams batches and has no len() yet (nor random access, dataset[i]); batches per "
            f"epoch: len(loader) of {loader} (torch's len() of a plain DataLoader asks the dataset, hence this "
            f"error), or {sizes}")
    return ArgumentTypeError(
        f"{asked}: {name} streams batches and has no random access yet; read its batches in order from {loader} "
        f"(or `for batch in dataset`); batches per epoch: len(loader), or {sizes}")


class Streamed:
    """``len()``, ``[i]`` and truth of a dataset read as a stream, where random access is not offered yet:
    :func:`no_random_access` errors naming what exists (``_called`` names the object in them, ``_sizes`` its
    own ways to its sizes), and always true (``bool()`` must not ask ``len()``).

    ``stream_kind`` says which of arrowstream's loaders reads it: ``"dataset"`` (``ArrowStreamDataLoader``) or
    ``"mixture"`` (``MixtureDataLoader``), which check it without importing the front doors."""

    _called = "dataset"
    stream_kind: ClassVar[str] = "dataset"

    def _sizes(self) -> str:   # pragma: no cover - every dataset answers
        raise NotImplementedError

    def __len__(self) -> int:
        """Not yet: raises an :class:`~arrowstream.errors.ArgumentTypeError` (a ``TypeError``, which torch, tools
        and ``list()`` take for "no length") that names ``len(loader)`` and the object's own sizes."""
        raise no_random_access(self, f"len({self._called})", self._sizes())

    def __getitem__(self, index: Any) -> Any:
        """Not yet: the object is read as a stream; raises an :class:`~arrowstream.errors.ArgumentTypeError`."""
        raise no_random_access(self, f"{self._called}[{index!r:.40}]", self._sizes())

    def __bool__(self) -> bool:
        return True   # not len(): a dataset is true, as it was before __len__ raised


def stream_kind(value: Any) -> str | None:
    """Which of arrowstream's loaders reads ``value``: its :attr:`Streamed.stream_kind`, or None for anything else."""
    return value.stream_kind if isinstance(value, Streamed) else None
