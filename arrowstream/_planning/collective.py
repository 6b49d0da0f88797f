"""Building one dataset on every rank: the ranks agree with rank 0, within a bounded wait, or stop.

Under ``torch.distributed`` rank 0 lists the files and reads their metadata once, and the other
ranks take its plan. Before that, the ranks meet in the process group's store, where every wait
has a deadline (a collective would wait for a missing rank until the process group's timeout):

1. rank 0 puts the fingerprint of its arguments and topology (:func:`fingerprint_of`);
2. every other rank waits for it, compares its own, and answers with the differences;
3. rank 0 waits for every answer and puts the verdict, which every rank raises if it is one.

A difference is a :class:`~arrowstream.TopologyError` on every rank naming the argument and both
values; a rank that does not come within ``ARROWSTREAM_HANDSHAKE_TIMEOUT`` seconds (300 by default)
is one on the ranks that came. Only after an agreed verdict is the plan broadcast: every rank is
known to be there. Keys live under ``arrowstream/dataset/<n>/``, ``n`` counting the handshakes this
process group completed; one that timed out leaves no key and does not count, so the ranks' next
dataset meets under the same ``n`` on every rank.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ..errors import ArrowStreamError, InvalidArgumentError, TopologyError

if TYPE_CHECKING:
    from .._sources.files import Origin
    from .._storage.filesystem import Storage
    from .._storage.retry import RetryPolicy
    from .options import Options
    from .plan import Plan

TIMEOUT_VARIABLE = "ARROWSTREAM_HANDSHAKE_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0  # ranks reach the constructor seconds apart; a rank absent 5 minutes is not coming
MAX_SHOWN = 96  # characters of a value in a fingerprint; a longer one is cut and keeps a digest of the rest
MAX_DIFFERENCES = 4  # arguments named in one message
MAX_RANKS_SHOWN = 16  # ranks listed in one message

T = TypeVar("T")

_completed: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # process group -> handshakes


class _Verdict(NamedTuple):
    message: str  # empty when the ranks agree
    complete: bool  # every rank took part (the handshake counts)


class _Keys:
    def __init__(self, count: int) -> None:
        self.prefix = f"arrowstream/dataset/{count}/"
        self.fingerprint, self.verdict = self.prefix + "rank0", self.prefix + "verdict"
        self.read_count, self.all_read = self.prefix + "read", self.prefix + "all-read"

    def answer(self, rank: int) -> str:
        return f"{self.prefix}answer{rank}"


def collective_world_size() -> int:
    """The world size of an initialised ``torch.distributed`` default group, else 1."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def handshake_timeout() -> float:
    """Seconds a rank waits for the others while building a dataset (``ARROWSTREAM_HANDSHAKE_TIMEOUT``)."""
    raw = os.environ.get(TIMEOUT_VARIABLE)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise InvalidArgumentError(f"{TIMEOUT_VARIABLE}={raw!r}: expected seconds > 0 (default "
                                   f"{DEFAULT_TIMEOUT_S:g}); set it to a number or unset it")
    return seconds


def callable_name(function: Any) -> str | None:
    """A callable by its qualified name (never its repr, which holds an address that differs by process)."""
    if function is None:
        return None
    module = getattr(function, "__module__", None) or type(function).__module__
    return f"{module}.{getattr(function, '__qualname__', type(function).__qualname__)}"


def show(value: Any) -> str:
    """A value's canonical JSON form, cut to ``MAX_SHOWN`` characters (with a digest of the whole) if longer."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    except (TypeError, ValueError):  # keys of mixed types, a circular value
        text = repr(value)
    if len(text) <= MAX_SHOWN:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{text[:MAX_SHOWN - 32]}... ({len(text):,} chars, sha256 {digest})"


def plan_arguments(source_arguments: dict[str, Any], options: Options, even_batches: bool, world_size: int,
                   group_size: int) -> dict[str, Any]:
    """What decides a dataset's plan and batches, compared between ranks: the source's arguments (no
    credentials), the options and the topology; ``transform`` is compared by its qualified name."""
    return {**source_arguments, "format": options.format, "batch_size": options.batch_size,
            "shuffle": options.shuffle, "seed": options.seed,
            "shuffle_buffer_size": "auto" if options.auto_buffer else options.shuffle_buffer_size,
            "interleave": options.interleave, "drop_last": options.drop_last, "split_bytes": options.split_bytes,
            "columns": options.columns and list(options.columns),
            "filter": None if options.filter is None else str(options.filter),
            "parse_options": None if options.parse_options is None else options.parse_options.state(),
            "output_format": options.output_format, "transform": callable_name(options.transform),
            "fill_nulls": options.fill_nulls, "even_batches": even_batches,
            "world_size": world_size, "group_size": group_size,
            # the batches' columns, as output_format: compared where asked (what ranks compared before stays)
            **({"with_row_ids": True} if options.with_row_ids else {})}


def fingerprint_of(arguments: dict[str, Any]) -> dict[str, str]:
    """What each rank compares with rank 0: every argument by name, in its shown form."""
    return {name: show(value) for name, value in arguments.items()}


def agree(fingerprint: dict[str, str]) -> None:
    """Meet every rank of the default process group; raise :class:`~arrowstream.TopologyError` if one
    differs from rank 0 or does not come within :func:`handshake_timeout`."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    group = distributed_c10d._get_default_group()
    store = distributed_c10d._get_default_store()
    rank, world_size, timeout = dist.get_rank(), dist.get_world_size(), handshake_timeout()
    count = _completed.get(group, 0)
    keys = _Keys(count)
    if rank == 0:
        verdict = _lead(store, keys, fingerprint, world_size, timeout)
    else:
        verdict = _follow(store, keys, fingerprint, rank, timeout)
    if verdict.complete:
        _completed[group] = count + 1
    if verdict.message:
        raise TopologyError(verdict.message)


def _waited(store: Any, keys: list[str], seconds: float) -> bool:
    import torch.distributed as dist

    try:
        store.wait(keys, timedelta(seconds=seconds))
    except dist.DistStoreError:
        return False
    return True


def _forget(store: Any, keys: list[str]) -> None:
    """Delete keys, as far as the store can (a store without ``delete_key`` keeps a few bytes)."""
    for key in keys:
        try:
            store.delete_key(key)
        except RuntimeError:  # c10d's errors; a store that does not implement deletion
            return


def _lead(store: Any, keys: _Keys, fingerprint: dict[str, str], world_size: int, timeout: float) -> _Verdict:
    store.set(keys.fingerprint, json.dumps(fingerprint))
    others = range(1, world_size)
    arrived = _waited(store, [keys.answer(r) for r in others], timeout)
    present = list(others) if arrived else [r for r in others if store.check([keys.answer(r)])]
    answers = {r: json.loads(store.get(keys.answer(r))) for r in present}
    missing = [r for r in others if r not in answers]
    message = _missing_message(present, missing, timeout) if missing else _difference_message(answers)
    store.set(keys.verdict, json.dumps({"message": message, "ranks": len(present), "complete": not missing}))
    if present:  # the keys go once every rank that came read the verdict
        _waited(store, [keys.all_read], timeout)
    _forget(store, [keys.fingerprint, keys.verdict, keys.read_count, keys.all_read, *map(keys.answer, present)])
    return _Verdict(message, not missing)


def _follow(store: Any, keys: _Keys, fingerprint: dict[str, str], rank: int, timeout: float) -> _Verdict:
    if not _waited(store, [keys.fingerprint], timeout):
        return _Verdict(
            f"rank {rank} built a dataset under torch.distributed, but rank 0 did not build one within {timeout:g} s "
            f"({TIMEOUT_VARIABLE}); rank 0 plans for every rank, so each builds the same dataset at about the same "
            "point. If this dataset is for some ranks only (evaluation), pass plan_locally=True (with rank=0, "
            f"world_size=1 to read every row on this rank); if rank 0 only gets there later, raise {TIMEOUT_VARIABLE}",
            False)
    # a race is left: rank 0 gives up and removes this key at the moment this rank finished waiting for it
    lead = json.loads(store.get(keys.fingerprint))
    differences = [[name, lead.get(name, "(absent)"), fingerprint.get(name, "(absent)")]
                   for name in sorted(lead.keys() | fingerprint.keys()) if lead.get(name) != fingerprint.get(name)]
    store.set(keys.answer(rank), json.dumps(differences))
    if not _waited(store, [keys.verdict], 2 * timeout):  # rank 0 waits at most `timeout` since its fingerprint
        _forget(store, [keys.answer(rank)])
        return _Verdict(f"rank 0 did not answer rank {rank} within {2 * timeout:g} s while the ranks built a "
                        "dataset; it failed or stopped there. See rank 0's error", False)
    verdict = json.loads(store.get(keys.verdict))
    if store.add(keys.read_count, 1) >= verdict["ranks"]:
        store.set(keys.all_read, "1")
    return _Verdict(verdict["message"], verdict["complete"])


def _ranks(ranks: list[int]) -> str:
    """A list of ranks, its first ones only when long."""
    return str(ranks) if len(ranks) <= MAX_RANKS_SHOWN else f"{str(ranks[:MAX_RANKS_SHOWN])[:-1]}, ... ({len(ranks)} ranks)]"


def _missing_message(present: list[int], missing: list[int], timeout: float) -> str:
    built = f"ranks {_ranks([0, *present])}" if present else "rank 0"
    return (f"a dataset was built on {built} under torch.distributed, but rank(s) {_ranks(missing)} did not build one within "
            f"{timeout:g} s ({TIMEOUT_VARIABLE}); rank 0 plans for every rank, so each builds the same dataset at "
            "about the same point. If this dataset is for some ranks only (evaluation on rank 0), pass "
            "plan_locally=True (with rank=0, world_size=1 to read every row on this rank); if the other ranks only "
            f"get there later, raise {TIMEOUT_VARIABLE}")


def _difference_message(answers: dict[int, list[list[str]]]) -> str:
    differing = sorted(rank for rank, differences in answers.items() if differences)
    if not differing:
        return ""
    rank, differences = differing[0], answers[differing[0]]
    named = "; ".join(f"{name} is {ours} on rank 0 but {theirs} on rank {rank}"
                      for name, ours, theirs in differences[:MAX_DIFFERENCES])
    rest = [name for name, _, _ in differences[MAX_DIFFERENCES:]]
    more = f" (and {', '.join(rest)} differ too)" if rest else ""
    also = f"; ranks {_ranks(differing[1:])} differ from rank 0 as well" if differing[1:] else ""
    return (f"the ranks build different datasets: {named}{more}{also}. Rank 0 plans for every rank, so every rank "
            "must pass the same path and options: fix the rank(s) that differ, or pass plan_locally=True (with "
            "rank= and world_size=) to a dataset that each rank plans and reads apart")


def plan_together(source: Origin, options: Options, retry: RetryPolicy, arguments: dict[str, Any], *,
                  collective: bool) -> tuple[Storage, Plan]:
    """The storage and the plan of ``source``. ``collective`` (under torch.distributed, unless
    ``plan_locally``): every rank first checks that it builds what rank 0 builds (:func:`agree` on
    ``arguments``, see :func:`plan_arguments`); then rank 0 lists and reads the metadata once and hands
    the plan to the other ranks, which list nothing (a source that plans on every rank, such as an
    Iceberg table's, plans on each)."""
    if collective:
        agree(fingerprint_of(arguments))
    if not collective or not source.plans_on_rank0:
        return source.plan(options, retry)
    return share_from_rank0(functools.partial(source.plan, options, retry))


def share_from_rank0(make: Callable[[], T]) -> T:
    """``make()`` on rank 0, its result on every rank (its error raised on every rank instead)."""
    import torch.distributed as dist

    payload: list[Any] = [None]
    failure: Exception | None = None
    if dist.get_rank() == 0:
        try:
            payload = [("value", make())]
        except Exception as exc:  # noqa: BLE001 - every rank raises it, instead of the others waiting forever
            failure = exc
            payload = [("error", exc if isinstance(exc, ArrowStreamError) else RuntimeError(repr(exc)))]
    dist.broadcast_object_list(payload, src=0)
    kind, value = payload[0]
    if failure is not None:
        raise failure
    if kind == "error":
        raise value
    return value  # type: ignore[no-any-return]
