"""Validation of ``StatefulDataLoader``'s own keywords, each error naming the keyword and the fix.

torchdata checks few of them, and with bare ``assert``s or builtin errors; some bad values are
accepted and break exact resume silently (``in_order=False``: torchdata gives no guarantee
about the state of a loader that hands batches out of order; ``ArrowStreamDataLoader`` makes
that state exact itself, see ``arrowstream._loader.batches.delivered_state``; a ``MixtureDataLoader`` refuses it).
Every keyword is checked here, in the main process, before the loader is built or a worker starts.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Mapping
from typing import Any

import torch

from .._planning.options import check_bool, check_int
from .._storage.credentials import check_start_method
from ..errors import ArgumentTypeError, InvalidArgumentError

# rows come from the dataset: batches, order and the last short batch are the dataset's options
_DATASET_OWNED = {
    "batch_size": "batch_size=None (the dataset yields whole batches: set batch_size on the dataset)",
    "shuffle": "shuffle left out (set shuffle=/seed= on the dataset)",
    "sampler": "sampler left out (the dataset orders its own rows: shuffle=, seed=)",
    "batch_sampler": "batch_sampler left out (set batch_size on the dataset)",
    "drop_last": "drop_last left out (set drop_last on the dataset)",
}
_DATASET_OWNED_DEFAULTS: dict[str, Any] = {"batch_size": None, "shuffle": None, "sampler": None,
                                           "batch_sampler": None, "drop_last": False}


def _callable_or_none(name: str, value: Any, what: str) -> None:
    if value is not None and not callable(value):
        raise ArgumentTypeError(f"{name}: expected {what} or None, got {type(value).__name__} {value!r}")


def _check_dataset_owned(options: Mapping[str, Any]) -> None:
    for name, default in _DATASET_OWNED_DEFAULTS.items():
        value = options.get(name, default)
        if value is default or (name == "shuffle" and value is False):
            continue
        raise InvalidArgumentError(f"{name}: the loader of an arrowstream dataset takes {_DATASET_OWNED[name]}; "
                                   f"got {name}={value!r}")


def _check_workers_only(num_workers: int, options: Mapping[str, Any]) -> None:
    """Keywords that only mean something with worker processes."""
    if num_workers > 0:
        return
    for name, idle in (("prefetch_factor", None), ("persistent_workers", False), ("timeout", 0),
                       ("multiprocessing_context", None)):
        value = options.get(name, idle)
        if value is not idle and value != idle:
            raise InvalidArgumentError(f"{name}: applies to worker processes only, and num_workers=0; leave "
                                       f"{name} out or pass num_workers >= 1 (got {name}={value!r})")


def _check_context(value: Any) -> None:
    if value is None or isinstance(value, multiprocessing.context.BaseContext):
        return
    if not isinstance(value, str):
        raise ArgumentTypeError(f"multiprocessing_context: expected a start method name or a multiprocessing "
                                f"context, got {type(value).__name__} {value!r}")
    methods = multiprocessing.get_all_start_methods()
    if value not in methods:
        raise InvalidArgumentError(f"multiprocessing_context: unknown start method {value!r}; use one of {methods}")


def _check_timeout(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"timeout: expected seconds as a number, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise InvalidArgumentError(f"timeout: expected seconds >= 0 (0 waits for ever), got {value!r}")


def start_method(context: Any) -> str:
    """How the loader's workers will be started: its ``multiprocessing_context``, else the default one
    (read without fixing it, as ``multiprocessing.get_start_method()`` would)."""
    if context is None:
        return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    return context if isinstance(context, str) else str(context.get_start_method())


def check_loader_options(num_workers: Any, options: Mapping[str, Any], credential_provider: Any = None, *,
                         mixture: bool = False) -> None:
    """Check ``num_workers`` and the ``StatefulDataLoader`` keywords in ``options`` (those passed).

    Raises an :class:`~arrowstream.errors.ArgumentTypeError` or
    :class:`~arrowstream.errors.InvalidArgumentError` naming the first bad keyword, or the
    dataset's ``credential_provider`` when it cannot be pickled and the workers start by spawn or
    forkserver (which send them the dataset by pickle). ``mixture``: the options of a
    ``MixtureDataLoader``, which refuses ``in_order=False``.

    Example:
        >>> check_loader_options(2, {"prefetch_factor": 4, "persistent_workers": True, "in_order": False})
        >>> check_loader_options(2, {"in_order": False}, mixture=True)
        Traceback (most recent call last):
        ...
        arrowstream.errors.InvalidArgumentError: in_order: a MixtureDataLoader does not take in_order=False: its checkpoint names each worker's place by torchdata's round robin, so batches handed out ahead of their turn would be read again or lost by a resume (guarantee 4, exact resume). Leave in_order at True: each worker of a mixture reads a fixed share of every source, so the epoch ends with the slowest worker either way; to keep a slow worker from stalling the others' batches, raise prefetch_factor (or read_ahead, num_workers)
    """
    check_int("num_workers", num_workers, 0)
    _check_dataset_owned(options)
    if "in_order" in options and not check_bool("in_order", options["in_order"]) and mixture:
        raise InvalidArgumentError(
            "in_order: a MixtureDataLoader does not take in_order=False: its checkpoint names each worker's place by "
            "torchdata's round robin, so batches handed out "
            "ahead of their turn would be read again or lost by a resume (guarantee 4, exact resume). Leave in_order "
            "at True: each worker of a mixture reads a fixed share of every source, so the epoch ends with the "
            "slowest worker either way; to keep a slow worker from stalling the others' batches, raise "
            "prefetch_factor (or read_ahead, num_workers)")
    if options.get("prefetch_factor") is not None:
        check_int("prefetch_factor", options["prefetch_factor"], 1)
    if "snapshot_every_n_steps" in options:
        value = options["snapshot_every_n_steps"]
        if value is None:
            raise InvalidArgumentError(
                "snapshot_every_n_steps: None never snapshots the workers' state, so every resume would read the "
                "epoch again up to the checkpoint; pass an int >= 1 (1, the default, makes resume cheap)")
        check_int("snapshot_every_n_steps", value, 1)
    for name in ("persistent_workers", "pin_memory"):
        if name in options:
            check_bool(name, options[name])
    if "timeout" in options:
        _check_timeout(options["timeout"])
    _check_context(options.get("multiprocessing_context"))
    _callable_or_none("collate_fn", options.get("collate_fn"), "a callable")
    _callable_or_none("worker_init_fn", options.get("worker_init_fn"), "a callable taking the worker id")
    generator = options.get("generator")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ArgumentTypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
    device = options.get("pin_memory_device", "")
    if not isinstance(device, str):
        raise ArgumentTypeError(f"pin_memory_device: expected a device name such as 'cuda', got "
                                f"{type(device).__name__} {device!r}")
    _check_workers_only(num_workers, options)
    if callable(credential_provider):
        check_start_method(credential_provider, num_workers, start_method(options.get("multiprocessing_context")))
