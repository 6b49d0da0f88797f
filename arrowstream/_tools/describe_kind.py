"""What ``describe_state`` asks of a kind of state (a dataset's or a mixture's): the small parts that differ.

The walk (:mod:`arrowstream._tools.describe`) reads the envelope of every state the same way: its ranks, each
rank's torchdata dict and worker states, the epoch, the counters and the share of the epoch: the envelope is
one kind for both, its ``reads`` says which :class:`StateKind` describes the rest. A
:class:`StateKind` says how its worker states are parsed, what a worker's and a
rank's lines add (a mixture's rows per source, a dynamic ledger) and how many rows its epoch holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .._core.fields import MAX_INT, REMEDY
from .._loader.torchdata_state import InnerState, read_inner
from ..errors import StateError

if TYPE_CHECKING:
    from ..dataset import StructuredDataset

UNKNOWN = "unknown without the data"
# how to give the data, for the Python API and for the command line (both print the same notes)
GIVE_THE_DATA = "describe_state(state, dataset=...) or arrowstream state show CKPT --path DATA"
ONE_RANK_OF_SEVERAL = "the state holds one rank of several: the share of the whole epoch needs every rank's state"
REPLANNED = "the epoch was re-planned from another topology: its rows are what the old workers had left, " + UNKNOWN


@dataclass(frozen=True)
class Envelope:
    """A state's outer dicts, read: one per rank it holds, each with ``rank``, ``world_size``, ``num_workers``,
    ``batches_per_transfer`` and ``reads`` checked, and where each is named in errors; the kind and version it
    is read in, those it was saved in, and what its loader read."""

    kind: str
    version: int
    saved_kind: str
    saved_version: int | None
    reads: str
    arrowstream_version: str | None
    world_size: int
    num_workers: int
    batches_per_transfer: int
    outers: list[dict[str, Any]]
    wheres: list[str]


@dataclass(frozen=True)
class EpochRows:
    """The rows of the state's epoch: each rank's (``None`` where unknown), the whole epoch's where known
    otherwise than as the ranks' sum, and why a count is unknown."""

    per_rank: list[int | None]
    total: int | None = None
    note: str | None = None


class StateKind(Protocol):
    """The parts of a kind of state that differ (see the module's docstring)."""

    reads: str   # the states it describes: those whose loader read this ("dataset", "mixture")

    def worker_states(self, outer: dict[str, Any], where: str) -> tuple[InnerState, list[Any]]:
        """A rank's torchdata dict and its worker states (``None``: no state yet), each parsed and checked."""
        ...

    def worker_fields(self, state: Any) -> dict[str, Any]:
        """What a worker's line adds to the common fields (``{}``: nothing)."""
        ...

    def rank_fields(self, outer: dict[str, Any], where: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
        """What a rank's line adds or overrides, from its outer dict and its workers' lines of the epoch."""
        ...

    def body(self, envelope: Envelope, ranks: list[dict[str, Any]], states: list[Any],
             dataset: StructuredDataset | None) -> dict[str, Any]:
        """``source``, ``assignment``, ``options``, ``data``, ``elastic``, ``column_names`` (and ``mixture``)."""
        ...

    def epoch_rows(self, description: dict[str, Any], dataset: StructuredDataset | None, states: list[Any]) -> EpochRows:
        """The rows of the described epoch, per rank and in all (``states``: every worker state, parsed)."""
        ...


def read_workers(raw: Any, num_workers: int, where: str, owner: str) -> InnerState:
    """torchdata's dict of a rank (at ``where``, in the rank's state named ``owner``), checked to hold the
    rank's ``num_workers`` workers."""
    inner = read_inner(raw, MAX_INT, where)
    if inner.num_workers != num_workers:
        raise StateError(f"the state's {owner} says num_workers={num_workers}, its torchdata state holds "
                         f"{inner.num_workers} worker(s); {REMEDY}")
    return inner


def elastic_summary(elastic: Any) -> dict[str, Any] | None:
    """An epoch re-planned from another topology (a dataset's ``Leftovers``, a mixture's ``MixElastic``:
    one cursor per old slot, ``None`` for a slot that had nothing left); ``replans``: how many topologies before
    this one read the epoch (1, or more when the old topology's epoch was itself re-planned: its ``before``)."""
    if elastic is None:
        return None
    replans, link = 0, elastic
    while link is not None:
        replans, link = replans + 1, link.before
    return {"epoch": elastic.epoch, "old_world_size": elastic.world_size, "old_num_workers": elastic.num_workers,
            "old_workers": len(elastic.cursors), "old_workers_done": sum(c is None for c in elastic.cursors),
            "replans": replans}
