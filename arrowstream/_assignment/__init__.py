"""How a rank's rows reach its workers: the ``assignment=`` policy, asked instead of testing its name.

A policy answers what the dataset and its loader ask of the epoch: the batches of an epoch (``len(loader)``),
the rows ``even_batches`` trims and ``drop_last`` drops, each slot's and rank's figures (``dataset.slot_rows``,
``batch_limits``, ``slot_yields``, ``rank_yields``, ``arrowstream inspect``: :mod:`~arrowstream._assignment.figures`), how an iteration opens a worker's stream, what the
loader does around an iteration (lease pools), what its state carries (a ledger) and how a checkpoint of it
loads. Two policies today, each in its own module:

- ``"static"`` (:mod:`arrowstream._assignment.static`): each (rank, worker) slot reads the splits the epoch
  layout gives it (longest processing time, :mod:`arrowstream._layout.layout`);
- ``"dynamic"`` (:mod:`arrowstream._assignment.dynamic`): a rank's workers lease its rows as they finish what
  they hold (:mod:`arrowstream._layout.leases`).

Each dataset makes its own policy, which owns what only it uses (the dynamic policy: its epochs and lease pools)
and is handed the rest: the dataset and the loader it is given answer :class:`~arrowstream._assignment.views.PolicyDataset`
and :class:`~arrowstream._assignment.views.PolicyLoader` with public values; no policy reads their fields.

A new policy is one module with a class that answers :class:`Assignment`, one line in :data:`ASSIGNMENTS`
(the way mosaicml/streaming names its partition algorithms in one dict), and its name in
:data:`~arrowstream._core.assignment_names.ASSIGNMENT_NAMES`, which the command line offers without importing torch
(checked here at import).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from .._core.assignment_names import ASSIGNMENT_NAMES
from ..errors import ArgumentTypeError, InvalidArgumentError
from .canonical import CanonicalOrder
from .dynamic import DynamicAssignment
from .figures import Figure
from .static import StaticAssignment
from .views import PolicyDataset, PolicyLoader

__all__ = ["ASSIGNMENTS", "Assignment", "CanonicalOrder", "Figure", "PolicyDataset", "PolicyLoader", "check_assignment",
           "check_order", "loader_in_order"]

if TYPE_CHECKING:
    from .._core.order import Slot
    from .._layout.trims import Trim
    from .._planning.options import Options
    from .._state.worker import WorkerState
    from .._worker.iterator import SlotIterator


class Assignment(Protocol):
    """What the dataset (``dataset``: a ``StructuredDataset``) and its loader (``loader``: an
    ``ArrowStreamDataLoader``) ask of an assignment policy, one made per dataset."""

    name: ClassVar[str]
    in_order: ClassVar[bool]   # the loader's default: batches in the workers' round robin (False: as they are ready)
    same_order: ClassVar[bool]   # a resume yields the same batches in the same order (check_resume can compare)
    fixed_slots: ClassVar[bool]   # each (rank, worker) slot reads what the layout gives it (a mixture needs this)
    topology_free: ClassVar[bool]   # its states resume on other topologies as they stand (order="canonical")

    def check(self, options: Options, group_size: int) -> None:
        """Refuse options the policy cannot keep its guarantees with (an ``InvalidArgumentError``)."""

    def state_options(self) -> dict[str, Any]:
        """What the policy adds to a worker state's ``options`` (compared when a state is loaded)."""

    def use_plan(self, dataset: PolicyDataset) -> None:
        """The dataset's plan or options are new (built, or changed by a loaded checkpoint): lay out again what the
        policy keeps of them."""

    def assign(self, weights: Sequence[int], num_slots: int) -> list[list[int]]:
        """Which items (splits, or a re-planned epoch's rest) each (rank, worker) slot reads, by their ``weights``
        (rows), in their given order: how the dataset lays out an epoch, re-plans one for another topology, and
        how ``arrowstream inspect`` reports it. A static slot's figures (:meth:`slot_figures`) are the epoch
        layout's own shares, so a slot's rows may depend on the items' order (the epoch's), as round robin's do."""

    # -- facts of an epoch -----------------------------------------------------------------------

    def slot_figures(self, dataset: PolicyDataset, num_workers: int) -> list[Figure]:
        """Per (rank, worker) slot of every rank, rank by rank, in the dataset's epoch as this policy reads it
        (re-planned, when a loaded checkpoint of another topology re-planned it): its rows, batches, rows yielded
        and splits (``dataset.slot_rows``, ``batch_limits``, ``slot_yields``, ``arrowstream inspect``). An
        ``InvalidArgumentError`` that says why where the policy's workers read no fixed share of their own."""

    def rank_figures(self, dataset: PolicyDataset, num_workers: int, epoch: int | None = None) -> list[Figure]:
        """Per rank, the same figures of its whole epoch (``dataset.rank_yields``, ``arrowstream inspect``,
        ``describe_state`` of a dynamic ledger): its batches are ``len(loader)`` on that rank. ``epoch``: another
        epoch than the dataset's (a checkpoint's)."""

    def num_batches(self, dataset: PolicyDataset, num_workers: int) -> int:
        """Batches this rank yields in the dataset's epoch."""

    def rows_dropped(self, dataset: PolicyDataset, num_workers: int) -> int:
        """Rows ``drop_last`` drops in the dataset's epoch on this rank."""

    def rows_trimmed(self, dataset: PolicyDataset, num_workers: int) -> int:
        """Rows ``even_batches`` trims in the dataset's epoch on this rank."""

    def trim(self, dataset: PolicyDataset, num_workers: int) -> Trim | None:
        """What ``even_batches`` trims of this rank's epoch (None: nothing is evened, or a filter decides)."""

    def stitches_last_rows(self, dataset: PolicyDataset, num_workers: int) -> bool:
        """Whether the workers' last rows are made into whole batches in the trainer (``_worker.stitch``)."""

    def replanned_from(self, dataset: PolicyDataset) -> tuple[int, int | None] | None:
        """The topology of the checkpoint the dataset's epoch was re-planned from, (world size, workers per rank;
        None where the rest was re-planned over ranks whatever their workers), or None when it was not (a
        ``TrimWarning`` names the cause)."""

    # -- iteration -------------------------------------------------------------------------------

    def iterate(self, dataset: PolicyDataset, slot: Slot,
                pending: WorkerState | None) -> SlotIterator[Any, Any]:
        """A worker's (or the trainer's) iterator over its rows of the dataset's epoch; ``pending``: a loaded
        worker state it resumes from. Its positions and states are a dataset worker's (``Position``,
        ``WorkerState``), or under ``order="canonical"`` its canonical slots' (``CanonicalPosition``,
        ``CanonicalState``)."""

    def start_state(self, dataset: PolicyDataset, slot: Slot) -> Any:
        """The state of ``slot`` before its next batch when it has not read (a ``WorkerState``, a canonical one):
        a loaded one, or the start of the dataset's epoch."""

    def start_workers(self, loader: PolicyLoader) -> None:
        """Before the loader's workers start on an iteration (they inherit what is made here)."""

    def before_iteration(self, loader: PolicyLoader) -> None:
        """Before an iteration: refuse an epoch a loaded checkpoint cannot lead to."""

    def advance(self, loader: PolicyLoader) -> None:
        """Before persistent workers start on the next iteration."""

    def started(self, loader: PolicyLoader) -> None:
        """An iteration started."""

    # -- state -----------------------------------------------------------------------------------

    def state_fields(self, loader: PolicyLoader, inner: dict[str, Any]) -> dict[str, Any]:
        """What the policy adds to a loader state beside torchdata's dict ``inner``."""

    def load_ledger(self, dataset: PolicyDataset, outers: list[dict[str, Any]]) -> int:
        """Load the ledgers of loader states (one rank's, or every rank's of a merged checkpoint); the epoch."""

    def refuse_without_ledger(self) -> None:
        """A loader state without a ledger (worker cursors only) is loaded: raise when the policy needs one."""


# name -> a policy of that kind; each dataset makes its own of the same class (``type(policy)()``), which holds its state
ASSIGNMENTS: dict[str, Assignment] = {
    StaticAssignment.name: StaticAssignment(),
    DynamicAssignment.name: DynamicAssignment(),
}
assert tuple(ASSIGNMENTS) == ASSIGNMENT_NAMES, "name each policy in _core.assignment_names (the command line offers those)"


def check_assignment(assignment: Any, options: Options, group_size: int = 1) -> Assignment:
    """A new policy of the kind named ``assignment`` (one per dataset), checked against ``options`` and
    ``group_size``."""
    names = " or ".join(repr(name) for name in ASSIGNMENTS)
    if not isinstance(assignment, str):
        raise ArgumentTypeError(f"assignment: expected {names}, got {type(assignment).__name__}")
    registered = ASSIGNMENTS.get(assignment)
    if registered is None:
        raise InvalidArgumentError(f"assignment: expected {names}, got {assignment!r}")
    policy = type(registered)()
    policy.check(options, group_size)
    return policy


def check_order(order: Any, canonical_slots: Any, policy: Assignment, options: Options,
                group_size: int = 1) -> Assignment:
    """The policy for ``order=`` (``"topology"``: ``policy``, the ``assignment=``'s; ``"canonical"``: a
    :class:`CanonicalOrder` of ``canonical_slots``, refused with ``assignment="dynamic"``)."""
    from .._layout.canonical import CANONICAL, ORDERS

    if not isinstance(order, str) or order not in ORDERS:
        raise InvalidArgumentError(f"order: expected one of {list(ORDERS)}, got {order!r}")
    if isinstance(canonical_slots, bool) or not isinstance(canonical_slots, int) or canonical_slots < 1:
        raise InvalidArgumentError(f"canonical_slots: expected an int >= 1, got {canonical_slots!r}")
    if order != CANONICAL:
        return policy
    if not policy.fixed_slots or not policy.in_order:
        raise InvalidArgumentError(
            f"order='canonical' fixes which rows every global batch holds; assignment={policy.name!r} hands rows to "
            "whichever worker is free, so the order depends on timing. Use assignment='static' with "
            "order='canonical', or order='topology'")
    canonical = CanonicalOrder(canonical_slots)
    canonical.check(options, group_size)
    return canonical


def loader_in_order(assignment: Any) -> bool:
    """The loader's default ``in_order`` for ``assignment=`` as given to ``create_dataloader`` (not checked yet:
    the dataset checks it)."""
    policy = ASSIGNMENTS.get(assignment) if isinstance(assignment, str) else None
    return True if policy is None else policy.in_order
