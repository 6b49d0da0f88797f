"""What an assignment policy is handed: the few values and actions it needs of its dataset and of its loader.

A policy (:mod:`arrowstream._assignment`) owns its own state (the dynamic policy: its epochs, lease pools and
the iteration it made) and reads the rest through these two protocols, which ``StructuredDataset`` and
``ArrowStreamDataLoader`` answer with public properties and methods: no policy reaches into their fields.
torchdata's own loop (its iterator, the iteration ``state_dict()`` starts) is reached through the loader
shell's methods only (:class:`arrowstream._loader.shell.StreamLoader`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._core.cursor import Position
    from .._core.order import Slot
    from .._layout.layout import Epochs
    from .._planning.options import Options
    from .._planning.plan import Plan
    from .._state.identity import DataIdentity
    from .._state.worker import WorkerState
    from .._worker.iterator import Opened
    from .._worker.runtime import WorkerRuntime


class PolicyDataset(Protocol):
    """What a policy reads of its dataset (a ``StructuredDataset``): values as they stand now (the plan and the
    options change when a checkpoint is loaded; the policy is told by ``use_plan``), and three actions."""

    @property
    def epoch(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def even_batches(self) -> bool: ...

    @property
    def options(self) -> Options: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def epochs(self) -> Epochs: ...

    @property
    def identity(self) -> DataIdentity: ...

    @property
    def state_options(self) -> dict[str, Any]: ...

    @property
    def data_identity(self) -> str: ...

    def worker_runtime(self) -> WorkerRuntime: ...

    def open_epoch(self, slot: Slot, pending: WorkerState | None) -> Opened[Position, WorkerState]: ...

    def use_planning(self, planning: int) -> None: ...

    def adopt_buffer(self, saved_options: Any) -> None: ...

    def follow_origin(self, saved: WorkerState) -> None: ...


class PolicyLoader(Protocol):
    """What a policy reads of its loader (an ``ArrowStreamDataLoader``), and the few things it asks of
    torchdata's loop, through the loader shell."""

    @property
    def dataset(self) -> PolicyDataset: ...

    @property
    def num_workers(self) -> int: ...

    @property
    def persistent_workers(self) -> bool: ...

    def holds_iteration(self) -> bool:
        """Whether torchdata holds an iterator (with workers: their processes) for the next ``iter()``."""

    def holds_state_dict_iteration(self, unread: bool = False) -> bool:
        """Whether the iterator torchdata holds was started by ``state_dict()`` (the next ``iter()`` goes on with
        it); ``unread``: and it has not read its epoch to the end."""

    def end_iteration(self) -> None:
        """End the iterator torchdata holds (its workers now) and forget it: the next ``iter()`` starts a new one."""

    def positions_handed_out(self) -> dict[int, Any]:
        """Each worker's position after its last batch handed out (for the workers that handed out any)."""
