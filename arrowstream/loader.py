"""``ArrowStreamDataLoader``: a ``StatefulDataLoader`` that checks, wraps and repairs its state.

A plain ``StatefulDataLoader`` over a :class:`~arrowstream.StructuredDataset` already resumes
exactly; this subclass adds what a production loop needs on top:

* ``state_dict()`` wraps torchdata's state with a kind, a format version and the topology,
  moved back to the last batch handed out when it is taken inside a chunk (see ``_transport``);
  with ``in_order=False``, where torchdata's own snapshot falls behind, each worker's state is
  the one after its last batch handed out (see ``_batches.delivered_state``);
* ``load_state_dict()`` takes that state, a merged checkpoint of every rank (see ``_checkpoint``)
  or a plain ``StatefulDataLoader``'s state, and checks all of it in the main process (format,
  data fingerprint, options, topology, each worker's cursor against the plan) before any worker
  starts, raising a clear error; it restores the saved epoch on the dataset; a state of another
  topology has the rest of its epoch re-planned for this one (``_elastic``); and a state taken
  after an epoch ended resumes as "that epoch is done" instead of replaying it;
* ``len(loader)`` is the exact number of batches per epoch when row counts are known;
* ``metrics()`` reads what each worker has done, live (see :mod:`arrowstream._metrics`).

torchdata's own dict inside the state is read and rewritten through ``_torchdata_state`` only.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import warnings
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader

from ._assignment import loader_in_order
from ._auto_buffer import use_buffer
from ._batches import BatchIterator, PerBatchCollate, delivered_state, rewind_into_chunk, worker_batches
from ._boundary import check_replanned_epoch_over, later_epoch_starts_whole
from ._convert import passthrough_collate
from ._credentials import as_provider
from ._epoch_watch import EpochWatch, dataset_order_varies
from ._fields import shorten
from ._lease_pool import SharedPool
from ._loader_options import check_loader_options
from ._loader_resume import check_workers, elastic_slots, follow_checkpoint_planning, mark_epoch_complete
from ._loader_state import read_checkpoint, read_loader_state
from ._metrics import Board, flatten, summarize, worker_values
from ._options import check_int
from ._order import SlotGrid
from ._resume import use_planning
from ._runtime import Transport, trainer_convert
from ._shm import semaphore_failure
from ._skip import Skipper, SkippingIterator
from ._skip_state import pending_of, read_skips
from ._state import CHECKPOINT_KIND, LOADER_KIND, STATE_VERSION, WorkerState
from ._stitch import Stitcher
from ._storage import logger
from ._torchdata_state import (
    clear_steps_since_snapshot,
    delivers_in_order,
    is_inner_state,
    iterator_finished,
    latest_worker_snapshots,
    no_in_order_warning,
    read_inner,
    set_last_yielded_worker,
    set_worker_state,
    steps_since_snapshot,
    worker_states,
)
from ._transport import MAX_BATCHES_PER_TRANSFER, ROWS_PER_TRANSFER, default_batches_per_transfer  # noqa: F401 (re-exported)
from ._watchdog import raise_death_between_iterations
from .errors import ArgumentTypeError, InvalidArgumentError, StateError, StateMismatchError


class ArrowStreamDataLoader(StatefulDataLoader):  # type: ignore[misc]
    """The loader :meth:`StructuredDataset.create_dataloader` returns; see the module docstring.

    Its batches are ``Any`` to mypy (their type follows ``output_format``, ``transform`` and ``collate_fn``,
    chosen at run time): declare the loop variable as :data:`arrowstream.TorchBatch` (``NumpyBatch``,
    ``DictBatch``, ``pyarrow.RecordBatch``) to have ``batch["x"]`` checked.

    Args:
        batches_per_transfer: With workers, how many consecutive batches of one worker travel
            to the trainer in one message (see ``arrowstream._transport``); by default as many as
            make about 16,384 rows, at most 16 (16 for ``batch_size=1024``). More amortizes the
            loader's per-message cost; fewer interleaves workers more finely. It shapes the
            order of batches, so a resumed loader takes the value of its checkpoint. Worker
            processes only; 1 with ``num_workers=0`` or ``snapshot_every_n_steps != 1``.
    """

    def __init__(self, dataset: Any, *args: Any, batches_per_transfer: int | None = None, **kwargs: Any) -> None:
        from .dataset import StructuredDataset

        if not isinstance(dataset, StructuredDataset):
            raise ArgumentTypeError(f"dataset: ArrowStreamDataLoader loads an arrowstream StructuredDataset (or "
                                    f"IcebergDataset), got {type(dataset).__name__}; use a plain StatefulDataLoader "
                                    "for other datasets")
        kwargs = _loader_arguments(dataset, args, kwargs)
        self._epoch_watch = EpochWatch("dataset")   # warns when a finished epoch starts again (no set_epoch)
        check_loader_options(kwargs.get("num_workers", 0), kwargs, dataset._credential_provider)
        collate_fn = kwargs.get("collate_fn")
        if collate_fn is not None and collate_fn is not passthrough_collate:
            kwargs["collate_fn"] = PerBatchCollate(collate_fn)  # a chunk's batches, one by one
        with warnings.catch_warnings(), no_in_order_warning():  # torchdata 0.11 calls torch.set_vital, deprecated
            warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)  # in torch 2.13
            super().__init__(dataset, **kwargs)
        if self.num_workers > 0:  # workers send Chunks, packed by the collate step (see PerBatchCollate)
            collate: Any = self.collate_fn  # type: ignore[has-type]
            if not isinstance(collate, PerBatchCollate):
                self.collate_fn = PerBatchCollate(None if collate is passthrough_collate else collate)
        if batches_per_transfer is None:
            batches_per_transfer = default_batches_per_transfer(dataset.batch_size)
        if isinstance(batches_per_transfer, bool) or not isinstance(batches_per_transfer, int) \
                or batches_per_transfer < 1:
            raise InvalidArgumentError(f"batches_per_transfer: expected an int >= 1, got {batches_per_transfer!r}")
        if self.num_workers == 0 or self.snapshot_every_n_steps != 1:
            batches_per_transfer = 1
        # how the workers hand batches over, given to the dataset before any worker starts: they inherit it
        self._transport = Transport(batches_per_transfer, send_chunks=self.num_workers > 0,
                                    board=Board(self.num_workers) if self.num_workers > 0 else None)
        self._set_batches_per_transfer(batches_per_transfer)
        self._batch_iterator: BatchIterator | None = None
        self._elastic_loaded = False  # a checkpoint re-planned for this topology, its epoch not started yet
        self._pool: SharedPool | None = None  # assignment='dynamic': the leases of the running iteration
        self._skipper = Skipper()  # loader.skip(): the batches to pass over next, and those passed over

    def _set_batches_per_transfer(self, value: int) -> None:
        self.batches_per_transfer = value
        self._transport = dataclasses.replace(self._transport, batches_per_transfer=value)
        self.dataset._side.use_transport(self._transport)

    def _get_iterator(self) -> Any:
        """torchdata's hook that starts an epoch's iterator (from a loaded state, if any): a loaded
        state whose epoch is over starts a later epoch whole (see ``arrowstream._boundary``)."""
        self._batch_iterator = None   # new workers: none of theirs handed out yet (what a state reads)
        loaded: dict[str, Any] | None = self.next_iter_state  # type: ignore[has-type]
        if loaded is not None and self.num_workers > 0:
            self.next_iter_state = self._into_later_epoch(loaded)
        self.dataset._policy.start_workers(self)   # before the workers start: they inherit it (lease pools)
        try:
            return super()._get_iterator()
        except OSError as exc:  # the semaphores of the workers' queues live in /dev/shm
            failure = semaphore_failure(exc, self.num_workers)
            if failure is None:
                raise
            raise failure from exc

    def _into_later_epoch(self, inner: dict[str, Any]) -> dict[str, Any]:
        """torchdata's state, made to start the dataset's epoch whole when the saved epoch before it is
        over: the round robin at worker 0 and nothing to replay since the last snapshot."""
        states = worker_states(inner)
        if any(state is None for state in states):
            return inner
        saved = [WorkerState.from_dict(state) for state in states if state is not None]
        if not later_epoch_starts_whole(self.dataset, saved, steps_since_snapshot(inner)):
            return inner
        inner = copy.deepcopy(inner)
        if steps_since_snapshot(inner):
            # the snapshots stand before batches yielded since: the workers start the later epoch at its
            # first row instead of replaying those batches (a real position, which the workers check)
            dataset = self.dataset
            for worker_id in range(len(states)):
                slot = SlotGrid(dataset.world_size, self.num_workers).slot(dataset.rank, worker_id)
                set_worker_state(inner, worker_id, dataset._epochs.start(slot, dataset.epoch).to_dict())
            clear_steps_since_snapshot(inner)
        set_last_yielded_worker(inner, self.num_workers - 1)  # the next batch comes from worker 0
        return inner

    def __iter__(self) -> Any:
        check_loader_options(self.num_workers, {"in_order": self.in_order})  # also when set after __init__
        policy = self.dataset._policy
        policy.before_iteration(self)
        if self._elastic_loaded:  # the first epoch after loading a checkpoint re-planned for this topology
            check_replanned_epoch_over(self.dataset, self.num_workers)
            self._elastic_loaded = False
        self._epoch_watch.starting(self._iterator, self.dataset.epoch, dataset_order_varies(self.dataset))
        if self.num_workers:   # (with none, the dataset warns in its own __iter__, in this process)
            self.dataset._warn_trims(self.num_workers)
        policy.advance(self)
        try:
            inner = super().__iter__()
        except Exception as exc:
            raise_death_between_iterations(self, exc, self.dataset.epoch)
            raise
        policy.started(self)
        if self.num_workers == 0:
            self._batch_iterator = None
            return SkippingIterator(self, inner)
        self._batch_iterator = worker_batches(inner, self._stitcher(inner))
        return SkippingIterator(self, self._batch_iterator)

    def _stitcher(self, inner: Any) -> Stitcher | None:
        """assignment='dynamic' with workers: what makes the workers' last rows into whole batches,
        converted, collated and pinned as the batches of ``inner`` (torch's iterator) are (see
        ``arrowstream._stitch``)."""
        dataset = self.dataset
        if not dataset._policy.stitches_last_rows(dataset, self.num_workers):
            return None
        convert = trainer_convert(dataset._plan, dataset._options, dataset._fill_nulls)
        # torch pins only where an accelerator is present, to its device
        collate, pin, device = self.collate_fn, inner._pin_memory, inner._pin_memory_device

        def stitched(record: Any) -> Any:
            batch = collate(convert(record))
            if pin:
                from torch.utils.data._utils.pin_memory import pin_memory

                batch = pin_memory(batch, device or None)  # type: ignore[no-untyped-call]
            return batch

        return Stitcher(stitched)

    def skip(self, batches: int) -> None:
        """Pass over the next ``batches`` batches this loader would yield (after a loss spike, say).

        The loader reads them and throws them away before it hands out the next batch (the workers
        decode them as usual), so the batches after the skip are exactly those an unskipped loader
        yields from its ``batches``-th on, and a checkpoint taken afterwards resumes after them. A skip
        that reaches past the end of the epoch ends the epoch there, with a warning; the rest of it does
        not carry into the next epoch. Call it after ``load_state_dict`` (loading a state replaces a
        pending skip with the state's). The skips are counted in :meth:`metrics`
        (``skipped_batches``, ``skipped_rows``) and recorded in the state (``skips``; a checkpoint
        taken before the skip has happened holds it as ``pending_skip``), which
        :func:`arrowstream.describe_state` reports. See docs/resume.md, "Skipping batches".

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> folder = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(folder, "part.parquet"))
            >>> loader, dataset = arrowstream.StructuredDataset.create_dataloader(path=folder, batch_size=2)
            >>> loader.skip(batches=3)
            >>> [batch["x"].tolist() for batch in loader]
            [[6, 7], [8, 9]]
            >>> loader.metrics()["skipped_rows"], loader.state_dict()["skips"]
            (6, [{'epoch': 0, 'at_batch': 0, 'batches': 3, 'rows': 6}])
        """
        self._skipper.request(batches)

    def __len__(self) -> int:
        return int(self.dataset.num_batches(self.num_workers))

    def metrics(self, flat: bool = False) -> dict[str, Any]:
        """What this rank's workers have done so far, as a dict of plain numbers (all epochs).

        Totals: ``rows``, ``batches``, ``bytes`` (stored size of the splits read to their end),
        ``splits_done``, ``read_s`` (reading and decoding), ``convert_s`` (to the output format,
        ``transform``, a worker's ``collate_fn`` and packing included), ``idle_s`` (waiting for the
        trainer to ask for more),
        ``utilization`` (busy / (busy + idle)), ``elapsed_s`` (first batch to last) and
        ``rows_per_s``; ``workers`` lists the same per worker (``rank``, ``worker``). With
        ``num_workers=0`` the trainer's process is worker 0. ``flat=True`` gives one level of
        numbers, ``"rank0/worker1/rows"``, as loggers take them. Reading it costs no message to
        the workers: call it every step if you like. See :func:`arrowstream.gather_metrics` for
        all ranks.

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> folder = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(folder, "part.parquet"))
            >>> loader, dataset = arrowstream.StructuredDataset.create_dataloader(path=folder, batch_size=4)
            >>> dataset.set_epoch(0)
            >>> batches = list(loader)
            >>> m = loader.metrics()
            >>> m["rows"], m["batches"], m["splits_done"], len(m["workers"])
            (10, 3, 1, 1)
        """
        board = self._transport.board if self.num_workers > 0 else None
        metrics = {**summarize(worker_values(board, self.dataset._side.meter), self.dataset.rank),
                   **self._skipper.metrics()}
        return flatten(metrics) if flat else metrics

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able dict: ``json.dumps`` and ``torch.save`` both work.

        It stands right after the last batch handed out. With ``in_order=False`` too: each worker's
        cursor is the one after its last batch handed out, so a resume (with ``in_order`` True or
        False, or elastic) yields exactly the rows not yet yielded, each once; only the order in which
        the workers' batches then interleave depends on timing (docs/resume.md).
        """
        from . import __version__

        with no_in_order_warning():
            inner = super().state_dict()
        batches = self._batch_iterator
        if batches is not None and not delivers_in_order(self._iterator):  # torchdata's snapshot falls behind
            inner = delivered_state(inner, batches, latest_worker_snapshots(self._iterator), self.num_workers)
        elif batches is not None and batches.inside_chunk:
            inner = rewind_into_chunk(inner, batches, self.num_workers)
        ledger = self.dataset._policy.state_fields(self, inner)   # a dynamic ledger (see _assignment)
        return {
            "kind": LOADER_KIND,
            "version": STATE_VERSION,
            "arrowstream_version": __version__,
            "rank": self.dataset.rank,
            "world_size": self.dataset.world_size,
            "num_workers": self.num_workers,
            "batches_per_transfer": self.batches_per_transfer,
            "dataloader": inner,
            **ledger,
            **self._skipper.state_fields(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the next batch is the one after the saved one.

        Every field is checked before anything is loaded (types, ranges, and each worker's cursor
        and counters against the plan): a state that would not yield every row once raises a
        ``StateError`` (see docs/state-format.md, Validation). The dataset then cuts splits by the
        checkpoint's planning version, in this epoch and the later ones (docs/state-format.md), and,
        when ``shuffle_buffer_size`` was left to its default, the checkpoint's buffer (docs/shuffle.md).
        """
        planning, buffer_rows = self.dataset._options.planning, self.dataset._options.shuffle_buffer_size
        skips = self._saved_skips(state_dict)
        try:
            self._load_state_dict(state_dict)
        except BaseException:  # a refused checkpoint leaves the dataset planning and shuffling as it did
            use_planning(self.dataset, planning)
            use_buffer(self.dataset, buffer_rows)
            raise
        self._skipper.load(*skips)

    def _saved_skips(self, state_dict: Any) -> tuple[list[Any], int]:
        """The skips a state records for this rank (see ``arrowstream._skip_state``): its own loader state's
        (the same world size), or, re-planned for another world size, the pending skip all old ranks agree
        on. The rest of the state is checked by ``_load_state_dict``."""
        if not isinstance(state_dict, dict):
            return [], 0
        if state_dict.get("kind") == LOADER_KIND:
            return read_skips(state_dict)
        ranks = state_dict.get("ranks")
        if state_dict.get("kind") != CHECKPOINT_KIND or not isinstance(ranks, list) or not ranks:
            return [], 0
        outers = [outer if isinstance(outer, dict) else {} for outer in ranks]
        if state_dict.get("world_size") == self.dataset.world_size and len(outers) > self.dataset.rank:
            return read_skips(outers[self.dataset.rank], f"checkpoint.ranks[{self.dataset.rank}]")
        return pending_of(outers)   # other ranks: each new rank skips what every old rank had pending

    def _load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if isinstance(state_dict, dict) and not state_dict:
            self._elastic_loaded = False
            self._skipper.load([], 0)
            super().load_state_dict({})
            return
        if isinstance(state_dict, dict) and state_dict.get("kind") == CHECKPOINT_KIND:
            world_size, num_workers, outers = read_checkpoint(copy.deepcopy(state_dict))
            if any("dynamic" in outer for outer in outers):
                self._load_dynamic(outers)
                return
            if (world_size, num_workers) != (self.dataset.world_size, self.num_workers):
                self._load_elastic(outers)
                return
            state_dict = outers[self.dataset.rank]
        if isinstance(state_dict, dict) and state_dict.get("kind") == LOADER_KIND and "dynamic" in state_dict:
            self._load_dynamic([read_loader_state(copy.deepcopy(state_dict))])
            return
        if isinstance(state_dict, dict) and state_dict.get("kind") == LOADER_KIND:
            outer = read_loader_state(copy.deepcopy(state_dict))
            inner, per_transfer = outer["dataloader"], outer["batches_per_transfer"]
            saved_topology = (outer["rank"], outer["world_size"], outer["num_workers"])
            topology = (self.dataset.rank, self.dataset.world_size, self.num_workers)
            if saved_topology != topology and saved_topology[1] == 1:  # one rank's state is all of it
                self._load_elastic([outer])
                return
            if saved_topology[:2] != topology[:2]:
                raise StateMismatchError(
                    f"this loader state belongs to rank {saved_topology[0]} of {saved_topology[1]}, this loader is "
                    f"rank {topology[0]} of {topology[1]}; merge every rank's state with "
                    "arrowstream.gather_state_dict(loader) (or merge_state_dicts) and load the merged checkpoint "
                    "on every rank")
            if saved_topology[2] != topology[2]:
                raise StateMismatchError(
                    f"checkpoint was taken with num_workers={saved_topology[2]}, this loader has "
                    f"num_workers={topology[2]}; with world_size={topology[1]}, re-planning the epoch for other "
                    "workers needs every rank's state: load the checkpoint of arrowstream.gather_state_dict(loader) "
                    f"(or merge_state_dicts), or build the loader with num_workers={saved_topology[2]}")
        elif isinstance(state_dict, dict) and is_inner_state(state_dict):
            inner, per_transfer = copy.deepcopy(state_dict), 1  # a plain StatefulDataLoader's state
        else:
            raise StateError("load_state_dict: expected the dict returned by loader.state_dict(), got "
                             f"{type(state_dict).__name__} with keys "
                             f"{shorten(sorted(map(str, state_dict))[:5]) if isinstance(state_dict, dict) else '-'}")
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
        self.dataset._use_elastic(next((s.elastic for s in saved if s.elastic is not None), None))
        if iterator_finished(inner):
            mark_epoch_complete(inner, self.dataset)
        if per_transfer > 1 and self.snapshot_every_n_steps != 1:
            raise StateMismatchError(
                f"checkpoint was taken with batches_per_transfer={per_transfer}, which needs "
                f"snapshot_every_n_steps=1; this loader has snapshot_every_n_steps={self.snapshot_every_n_steps}. "
                "Build the loader with snapshot_every_n_steps=1 to resume")
        if per_transfer != self.batches_per_transfer and self.num_workers > 0:
            logger.info("batches_per_transfer follows the checkpoint: %d (was %d)", per_transfer,
                        self.batches_per_transfer)
            self._set_batches_per_transfer(per_transfer)
        self._batch_iterator = None
        self._elastic_loaded = False
        super().load_state_dict(inner)

    def _refuse_without_ledger(self) -> None:
        """A state without a ledger whose worker states agree with the dataset: refused where the assignment
        policy needs one (a dynamic ledger removed: the worker cursors do not say which rows are left)."""
        self.dataset._policy.refuse_without_ledger()

    def _load_dynamic(self, outers: list[dict[str, Any]]) -> None:
        """Resume a dynamic checkpoint: the rest of its epoch is this rank's work, leased anew by this
        loader's workers (any number)."""
        epoch = self.dataset._policy.load_ledger(self.dataset, outers)
        self.dataset.set_epoch(epoch)
        # the leases of an earlier iteration say nothing of the loaded epoch's rest
        self._pool = self.dataset._pool = None
        self.dataset._active = None
        self._batch_iterator = None
        self._elastic_loaded = False
        super().load_state_dict({})

    def _load_elastic(self, outers: list[dict[str, Any]]) -> None:
        """Resume every old rank's states with this loader's topology: the rest of the saved
        epoch is re-planned over the new (rank, worker) slots (see ``arrowstream._elastic``)."""
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
        super().load_state_dict({})

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
