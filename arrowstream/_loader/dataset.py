"""``ArrowStreamDataLoader``: a ``StatefulDataLoader`` that checks, wraps and repairs its state.

A plain ``StatefulDataLoader`` over a :class:`~arrowstream.StructuredDataset` already resumes
exactly; this subclass adds what a production loop needs on top:

* ``state_dict()`` wraps torchdata's state with a kind, a format version and the topology,
  moved back to the last batch handed out when it is taken inside a chunk (see ``arrowstream._worker.transport``);
  with ``in_order=False``, where torchdata's own snapshot falls behind, each worker's state is
  the one after its last batch handed out (see ``arrowstream._loader.batches.delivered_state``);
* ``load_state_dict()`` takes that state, a merged checkpoint of every rank (see ``arrowstream._loader.checkpoint``)
  or a plain ``StatefulDataLoader``'s state, and checks all of it in the main process (format,
  data fingerprint, options, topology, each worker's cursor against the plan) before any worker
  starts, raising a clear error; it restores the saved epoch on the dataset; a state of another
  topology has the rest of its epoch re-planned for this one (``arrowstream._layout.elastic``); and a state taken
  after an epoch ended resumes as "that epoch is done" instead of replaying it;
* ``len(loader)`` is the exact number of batches per epoch when row counts are known;
* ``metrics()`` reads what each worker has done, live (see :mod:`arrowstream._worker.metrics`).

All of that is the loader shell a mixture's loader shares (``arrowstream._loader.shell``); here are
the dataset's hooks: how its state is read and checked against the plan, elastic re-planning and
``assignment='dynamic'`` (its leases and its ledger).

torchdata's own dict inside the state is read and rewritten through ``arrowstream._loader.torchdata_state`` only.
"""

from __future__ import annotations

import inspect
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader

from .._assignment import loader_in_order
from .._core.order import SlotGrid
from .._layout.boundary import check_replanned_epoch_over, later_epoch_starts_whole
from .._planning.options import check_int
from .._state.canonical import is_canonical
from .._state.versions import DATASET
from .._state.worker import WorkerState
from .._storage.credentials import as_provider
from .._storage.filesystem import logger
from .._worker.convert import passthrough_collate
from .._worker.stitch import Stitcher
from .._worker.transport import MAX_BATCHES_PER_TRANSFER, ROWS_PER_TRANSFER, default_batches_per_transfer  # noqa: F401 (re-exported)
from ..errors import ArgumentTypeError, StateMismatchError
from .batches import BatchIterator, delivered_state, moved_state, rewind_into_chunk
from .canonical import canonical_transfer, canonical_worker_states
from .epoch_watch import dataset_order_varies
from .options import check_loader_options
from .plain import stream_kind
from .resume import check_workers, elastic_slots, follow_checkpoint_planning, mark_epoch_complete
from .shell import StreamLoader
from .torchdata_state import (
    delivers_in_order,
    iterator_finished,
    latest_worker_snapshots,
    read_inner,
    steps_since_snapshot,
    worker_states,
)


class ArrowStreamDataLoader(StreamLoader):
    """The loader :meth:`StructuredDataset.create_dataloader` returns; see the module docstring.

    Its batches are ``Any`` to mypy (their type follows ``output_format``, ``transform`` and ``collate_fn``,
    chosen at run time): declare the loop variable as :data:`arrowstream.TorchBatch` (``NumpyBatch``,
    ``DictBatch``, ``pyarrow.RecordBatch``) to have ``batch["x"]`` checked.

    Args:
        batches_per_transfer: With workers, how many consecutive batches of one worker travel
            to the trainer in one message (see ``arrowstream._worker.transport``); by default as many as
            make about 16,384 rows, at most 16 (16 for ``batch_size=1024``). More amortizes the
            loader's per-message cost; fewer interleaves workers more finely. It shapes the
            order of batches, so a resumed loader takes the value of its checkpoint. Worker
            processes only; 1 with ``num_workers=0`` or ``snapshot_every_n_steps != 1``.
    """

    READS = DATASET
    WATCH = "dataset"
    TAKES_PLAIN_STATE = True

    def __init__(self, dataset: Any, *args: Any, batches_per_transfer: int | None = None, **kwargs: Any) -> None:
        if stream_kind(dataset) != "dataset":
            raise ArgumentTypeError(f"dataset: ArrowStreamDataLoader loads an arrowstream StructuredDataset (or "
                                    f"IcebergDataset), got {type(dataset).__name__}; use a plain StatefulDataLoader "
                                    "for other datasets")
        kwargs = _loader_arguments(dataset, args, kwargs)
        if dataset.policy.topology_free:
            batches_per_transfer = canonical_transfer(kwargs, batches_per_transfer)
        self._elastic_loaded = False  # a checkpoint re-planned for this topology, its epoch not started yet
        self._start(dataset, kwargs, batches_per_transfer, dataset.credential_provider)

    # -- the hooks of StreamLoader ----------------------------------------------------------------------

    def _use_transport(self) -> None:
        self.dataset.worker_side.use_transport(self._transport)

    def _meter(self) -> Any:
        return self.dataset.worker_side.meter

    def _order_varies(self) -> bool:
        return dataset_order_varies(self.dataset)

    def _before_iteration(self) -> None:
        self.dataset.policy.before_iteration(self)
        if self._elastic_loaded:  # the first epoch after loading a checkpoint re-planned for this topology
            check_replanned_epoch_over(self.dataset, self.num_workers)
            self._elastic_loaded = False

    def _before_workers(self) -> None:
        self.dataset.policy.advance(self)

    def _iteration_started(self) -> None:
        self.dataset.policy.started(self)

    def _before_get_iterator(self) -> None:
        self.dataset.policy.start_workers(self)   # before the workers start: they inherit it (lease pools)

    def _later_epoch_starts_whole(self, inner: dict[str, Any]) -> bool:
        if self.dataset.policy.topology_free:   # its checkpoints resume from the dataset, not torchdata's dict
            return False
        states = worker_states(inner)
        if any(state is None for state in states):
            return False
        saved = [WorkerState.from_dict(state) for state in states if state is not None]
        return later_epoch_starts_whole(self.dataset, saved, steps_since_snapshot(inner))

    def _epoch_start(self, worker_id: int) -> dict[str, Any]:
        dataset = self.dataset
        slot = SlotGrid(dataset.world_size, self.num_workers).slot(dataset.rank, worker_id)
        return dict(dataset.policy.start_state(dataset, slot).to_dict())

    def _handed_out(self, inner: dict[str, Any], batches: BatchIterator) -> dict[str, Any]:
        if not delivers_in_order(self._iterator):  # torchdata's snapshot falls behind
            return delivered_state(inner, batches, latest_worker_snapshots(self._iterator), self.num_workers)
        if batches.inside_chunk:
            return rewind_into_chunk(inner, batches, self.num_workers)
        return inner

    def _state_extras(self, inner: dict[str, Any]) -> dict[str, Any]:
        ledger: dict[str, Any] = self.dataset.policy.state_fields(self, inner)   # a dynamic ledger (_assignment)
        return ledger

    def _load_ledger(self, outers: list[dict[str, Any]]) -> bool:
        if self.dataset.policy.topology_free or _canonical_states(outers):
            self._load_canonical(outers)
            return True
        if not any("dynamic" in outer for outer in outers):
            return False
        self._load_dynamic(outers)
        return True

    def _forget_loaded(self) -> None:
        self._elastic_loaded = False
        self.dataset.forget_loaded()

    def _joins_parts(self) -> bool:
        return bool(self.dataset.policy.topology_free)

    def _moved_state(self, raw: Any, position: Any, where: str) -> dict[str, Any]:
        return moved_state(raw, position, where)

    def _load_canonical(self, outers: list[dict[str, Any]]) -> None:
        """Resume a checkpoint of ``order="canonical"`` (one rank's, or every rank's merged), of any topology that
        divides the canonical slots: each canonical slot goes on from its state, whichever worker reads it now."""
        saved = canonical_worker_states(outers, DATASET)   # every worker's, whatever the topology
        epoch = self.dataset.load_canonical(saved, "checkpoint")
        self.dataset.set_epoch(epoch)
        self._batch_iterator = None
        self._elastic_loaded = False
        self._load_torchdata({})

    def _load_own(self, outer: dict[str, Any]) -> None:
        inner, per_transfer = outer["dataloader"], outer["batches_per_transfer"]
        parsed = read_inner(inner, self.snapshot_every_n_steps)
        if parsed.num_workers != self.num_workers:
            raise StateMismatchError(
                f"checkpoint was taken with num_workers={parsed.num_workers}, this loader has "
                f"num_workers={self.num_workers}; build the loader with num_workers={parsed.num_workers} to resume")
        follow_checkpoint_planning(self.dataset, [parsed])
        saved = check_workers(self.dataset, parsed, self.dataset.rank, self.dataset.world_size)
        self._refuse_without_ledger()
        self.dataset.set_epoch(max(s.epoch for s in saved))
        # inside an epoch re-planned for this topology: the counts of that epoch (len, trimmed rows)
        self.dataset.use_replanned(next((s.elastic for s in saved if s.elastic is not None), None))
        if iterator_finished(inner):
            mark_epoch_complete(inner, self.dataset.epochs)
        self._follow_per_transfer(per_transfer)
        self._batch_iterator = None
        self._elastic_loaded = False
        self._load_torchdata(inner)

    def _load_other_topology(self, outers: list[dict[str, Any]]) -> None:
        self._load_elastic(outers)

    # -- the assignment policy's part ------------------------------------------------------------------

    def _stitcher(self, inner: Any) -> Stitcher | None:
        """assignment='dynamic' with workers: what makes the workers' last rows into whole batches,
        converted, collated and pinned as the batches of ``inner`` (torch's iterator) are (see
        ``arrowstream._worker.stitch``)."""
        dataset = self.dataset
        if not dataset.policy.stitches_last_rows(dataset, self.num_workers):
            return None
        convert = dataset.trainer_converter()
        # torch pins only where an accelerator is present, to its device
        collate, pin, device = self.collate_fn, inner._pin_memory, inner._pin_memory_device

        def stitched(record: Any) -> Any:
            batch = collate(convert(record))
            if pin:
                from torch.utils.data._utils.pin_memory import pin_memory

                batch = pin_memory(batch, device or None)  # type: ignore[no-untyped-call]
            return batch

        return Stitcher(stitched)

    def _refuse_without_ledger(self) -> None:
        """A state without a ledger whose worker states agree with the dataset: refused where the assignment
        policy needs one (a dynamic ledger removed: the worker cursors do not say which rows are left)."""
        self.dataset.policy.refuse_without_ledger()

    def _load_dynamic(self, outers: list[dict[str, Any]]) -> None:
        """Resume a dynamic checkpoint: the rest of its epoch is this rank's work, leased anew by this
        loader's workers (any number)."""
        epoch = self.dataset.load_ledger(outers)   # the leases of an earlier iteration are forgotten
        self.dataset.set_epoch(epoch)
        self._batch_iterator = None
        self._elastic_loaded = False
        self._load_torchdata({})

    def _load_elastic(self, outers: list[dict[str, Any]]) -> None:
        """Resume every old rank's states with this loader's topology: the rest of the saved
        epoch is re-planned over the new (rank, worker) slots (see ``arrowstream._layout.elastic``)."""
        old_world, old_workers, slots = elastic_slots(self.dataset, outers)
        self._refuse_without_ledger()
        epoch = max(saved.epoch for saved, _ in slots)
        self.dataset.set_epoch(epoch)
        self.dataset.begin_elastic_epoch(epoch, old_world, old_workers,
                                         [(saved, finished) for saved, finished in slots])
        self._elastic_loaded = True
        logger.info("elastic resume: the rest of epoch %d, saved with world_size=%d, num_workers=%d, is "
                    "re-planned for world_size=%d, num_workers=%d", epoch, old_world, old_workers,
                    self.dataset.world_size, self.num_workers)
        self._batch_iterator = None
        self._load_torchdata({})


def _canonical_states(outers: list[dict[str, Any]]) -> bool:
    """Whether loader states hold canonical worker states (a checkpoint of ``order="canonical"``)."""
    for outer in outers:
        inner = outer.get("dataloader")
        if not isinstance(inner, dict):
            continue
        try:
            states = worker_states(inner)
        except (KeyError, TypeError, AttributeError, ValueError):   # a bad torchdata dict: refused where it is read
            states = []
        if any(is_canonical(state) for state in states):
            return True
    return False


_RESERVED = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")
_LOADER_SIGNATURE = inspect.signature(StatefulDataLoader.__init__)


def _loader_arguments(dataset: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every argument given to the loader by name (positional ones too); ``batch_size`` None by default."""
    try:
        bound = _LOADER_SIGNATURE.bind_partial(None, dataset, *args, **kwargs)
    except TypeError as exc:
        raise ArgumentTypeError(f"ArrowStreamDataLoader: {exc}; its keywords are those of StatefulDataLoader "
                                "and batches_per_transfer") from None
    arguments = {k: v for k, v in bound.arguments.items() if k not in ("self", "dataset")}
    arguments.setdefault("batch_size", None)
    return arguments


def _dataset_keywords(dataset_cls: type) -> set[str]:
    """Keyword names of the dataset class and of the arrowstream classes it extends."""
    names: set[str] = set()
    for klass in dataset_cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or not klass.__module__.startswith("arrowstream"):
            continue
        names |= {p.name for p in inspect.signature(init).parameters.values()
                  if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - {"self"}
    return names


def build_dataloader(dataset_cls: type, *, dataset_args: dict[str, Any], num_workers: int,
                     **kwargs: Any) -> tuple[ArrowStreamDataLoader, Any]:
    """Split keywords between the dataset and the loader, build both."""
    check_int("num_workers", num_workers, 0)
    dataset_params = _dataset_keywords(dataset_cls)
    dataset_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in dataset_params}
    loader_params = (set(inspect.signature(StatefulDataLoader.__init__).parameters) - {"self", "dataset"}) | {
        "batches_per_transfer"}
    unknown = sorted(set(kwargs) - loader_params)
    if unknown:
        raise ArgumentTypeError(f"create_dataloader: unknown keyword(s) {unknown}; dataset keywords are "
                                f"{sorted(dataset_params)}, loader keywords {sorted(loader_params - set(_RESERVED))}")
    provider = dataset_kwargs.get("credential_provider")
    if callable(provider):  # wrapped once: its picklability is checked here, and the dataset keeps it
        provider = dataset_kwargs["credential_provider"] = as_provider(provider)
    if not loader_in_order(dataset_kwargs.get("assignment", "static")) and num_workers > 0:
        kwargs.setdefault("in_order", False)   # batches as workers have them: a slow worker holds up no other
    check_loader_options(num_workers, kwargs, provider)  # before planning, which may be long
    dataset = dataset_cls(**dataset_args, **dataset_kwargs)
    kwargs.setdefault("collate_fn", passthrough_collate)
    loader = ArrowStreamDataLoader(dataset, batch_size=None, num_workers=num_workers, **kwargs)
    return loader, dataset
