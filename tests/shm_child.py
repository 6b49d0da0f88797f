"""A trainer process for the shared-memory tests: a loader whose /dev/shm runs out.

Usage: ``shm_child.py MODE SCENARIO DATASET``, printing one JSON line on stdout.

MODE ``tmpfs``: the test started this process in a private mount namespace with a tiny tmpfs on
/dev/shm (nothing outside it is affected). MODE ``injected`` (where mounting is not permitted):
the allocations fail as they would there: a torch segment over ``TMPFS_BYTES`` fails with
torch's ENOSPC RuntimeError, and in the ``full`` scenario every segment and semaphore takes pages
of a budget, ENOSPC when it is spent.

SCENARIO ``ring``: two epochs of 2 persistent workers whose rings cannot fit in /dev/shm: every
row once per epoch. SCENARIO ``full``: /dev/shm with room for 0, 1, 2, ... pages (a filler file
takes the rest), one attempt each to build the loader and read an epoch, until one succeeds:
every attempt before it is a clear error, within seconds. SCENARIO ``plain``: the dataset in a
plain ``StatefulDataLoader``, whose batches' tensors do not fit in /dev/shm (torch puts them
there in the queue's feeder thread): the error the loop gets.
"""

from __future__ import annotations

import errno
import gc
import json
import logging
import multiprocessing
import os
import sys
import time
from multiprocessing import synchronize

import torch
from helpers import ids_of, make_loader
from torchdata.stateful_dataloader import StatefulDataLoader

from arrowstream import StructuredDataset

PAGE = 4096
TMPFS_BYTES = 1 << 20  # the test's tmpfs for the ring scenario
PLAIN_TMPFS_BYTES = 32 << 10  # injected for the plain scenario: a batch's int64 column (64 KiB) does not fit
FILLER = "/dev/shm/filler"
ROWS = 40000


def _ids_of_an_epoch(loader, dataset, epoch):
    dataset.set_epoch(epoch)
    return sorted(i for batch in loader for i in ids_of(batch))


def ring(mode):
    if mode == "injected":
        _inject(budget=None)
    loader, dataset = make_loader(sys.argv[3], 2, batch_size=1024, persistent_workers=True)
    exact = [_ids_of_an_epoch(loader, dataset, epoch) == list(range(ROWS)) for epoch in (0, 1)]
    workers = [w.pid for w in loader._iterator._workers]
    del loader, dataset
    return {"exact": exact, "workers": workers, "left": _left_in_dev_shm(mode)}


def full(mode):
    attempts = []
    for pages in range(64):
        if mode == "tmpfs":
            _leave_room(pages)
        else:
            _inject(budget=pages)
        started = time.monotonic()
        stage, outcome = "dataset", {}
        try:
            loader, dataset = make_loader(sys.argv[3], 2, batch_size=1024)
            stage = "iter"
            batches = iter(loader)
            stage = "epoch"
            exact = sorted(i for batch in batches for i in ids_of(batch)) == list(range(ROWS))
            outcome = {"exact": exact}
            del loader, dataset, batches
        except Exception as exc:  # noqa: BLE001 (reported to the test, which checks what it is)
            outcome = {"error": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
        outcome.update(pages=pages, stage=stage, seconds=time.monotonic() - started,
                       children=len(multiprocessing.active_children()), left=_left_in_dev_shm(mode))
        attempts.append(outcome)
        gc.collect()
        if "exact" in outcome:
            break
    return {"attempts": attempts}


def plain(mode):
    if mode == "injected":
        share_fd = torch.UntypedStorage._share_fd_cpu_

        def _share_fd_cpu_(storage):
            if storage.nbytes() > PLAIN_TMPFS_BYTES:
                raise RuntimeError(f"unable to allocate shared memory(shm) for file </torch_{os.getpid()}_1_1>: "
                                   "No space left on device (28)")
            return share_fd(storage)

        torch.UntypedStorage._share_fd_cpu_ = _share_fd_cpu_
    loader = StatefulDataLoader(StructuredDataset(sys.argv[3], batch_size=8192), batch_size=None, num_workers=2)
    started = time.monotonic()
    try:
        rows = sum(len(batch["id"]) for batch in loader)
    except Exception as exc:  # noqa: BLE001 (reported to the test)
        return {"error": [c.__name__ for c in type(exc).__mro__], "message": str(exc),
                "seconds": time.monotonic() - started}
    return {"rows": rows}


def _leave_room(pages):
    """Fill the private /dev/shm but ``pages`` pages with a file."""
    gc.collect()  # what the previous attempt held is given back
    fd = os.open(FILLER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    size, block = 0, b"\0" * PAGE
    try:
        while True:
            size += os.write(fd, block)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    os.ftruncate(fd, max(0, size - pages * PAGE))
    os.close(fd)


def _left_in_dev_shm(mode):
    """What torch left in the private /dev/shm (its segments are unlinked as soon as they exist)."""
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith("torch_")) if mode == "tmpfs" else []


_budget = [0]
_share_memory = torch.Tensor.share_memory_
_semlock_init = synchronize.SemLock.__init__


def _inject(budget):
    """Allocations fail as in a tiny /dev/shm: over TMPFS_BYTES, or past ``budget`` pages (None: no budget)."""
    _budget[0] = budget

    def share_memory_(tensor):
        pages = -(-tensor.untyped_storage().nbytes() // PAGE)
        if tensor.untyped_storage().nbytes() > TMPFS_BYTES or (_budget[0] is not None and pages > _budget[0]):
            raise RuntimeError(f"unable to allocate shared memory(shm) for file </torch_{os.getpid()}_1_1>: "
                               "No space left on device (28)")
        if _budget[0] is not None:
            _budget[0] -= pages
        return _share_memory(tensor)

    def semlock_init(self, *args, **kwargs):
        if _budget[0] is not None:
            if _budget[0] < 1:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            _budget[0] -= 1
        _semlock_init(self, *args, **kwargs)

    torch.Tensor.share_memory_ = share_memory_
    synchronize.SemLock.__init__ = semlock_init


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    mode, scenario = sys.argv[1:3]
    print(json.dumps({"ring": ring, "full": full, "plain": plain}[scenario](mode)), flush=True)
