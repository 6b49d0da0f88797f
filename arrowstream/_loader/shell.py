"""``StreamLoader``: the one loader shell of a dataset (``ArrowStreamDataLoader``) and a mixture
(``MixtureDataLoader``), a ``StatefulDataLoader`` that checks, wraps and repairs its state.

It holds, once for both:

* the transport (workers send chunks of ``batches_per_transfer`` batches, see ``arrowstream._worker.transport``) and
  the collate step that packs them;
* ``__iter__``: the options checked again, the epoch watch, the trims warning, the watchdog, the
  chunks unpacked batch by batch, and ``skip`` (``arrowstream._loader.skip``); the epoch-boundary rule in
  ``_get_iterator``: a loaded state whose epoch is over starts the later epoch whole;
* the state envelope of ``state_dict`` (kind, version, what it reads, topology, ``batches_per_transfer``, torchdata's
  dict, the skips); the one ``load_state_dict`` dispatch is ``arrowstream._loader.load_state.LoadsState``'s: an empty
  state, a merged checkpoint of every rank, this rank's own state, one rank's state that is all of it,
  another topology;
* ``metrics`` and ``len``.

What differs between a dataset and a mixture is a few hooks, named below (``_load_own``,
``_load_other_topology``, ...): how a state of each is read and checked, and what each lays out.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from typing import Any, ClassVar, Protocol

from torchdata.stateful_dataloader import StatefulDataLoader

from .._state.versions import LOADER_KIND, STATE_VERSION
from .._worker.convert import passthrough_collate
from .._worker.metrics import Board, flatten, summarize, worker_values
from .._worker.runtime import Transport
from .._worker.shm import semaphore_failure
from .._worker.stitch import Stitcher
from .._worker.transport import default_batches_per_transfer
from .._worker.watchdog import raise_death_between_iterations
from ..errors import InvalidArgumentError
from .batches import BatchIterator, PerBatchCollate, worker_batches
from .canonical import PartsZip, handed_out_state, rank_batches
from .epoch_watch import EpochWatch
from .load_state import LoadsState
from .options import check_loader_options
from .skip import Skipper, SkippingIterator
from .torchdata_state import (
    clear_steps_since_snapshot,
    no_in_order_warning,
    set_last_yielded_worker,
    set_worker_state,
    steps_since_snapshot,
)


class Loadable(Protocol):
    """What the loader shell reads of what it loads (a ``StructuredDataset``, a ``Mixture``), beside its own
    loader's hooks: the epoch, the rank among the ranks, the batch size, the batches per epoch, the trims
    warning, and what it reads (put back when a checkpoint is refused)."""

    @property
    def epoch(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def batch_size(self) -> int: ...

    def num_batches(self, num_workers: int = 0) -> int: ...

    def warn_trims(self, num_workers: int) -> None: ...

    def reading(self) -> Any: ...   # what loading a checkpoint may change of what it reads

    def read_as(self, reading: Any) -> None: ...   # put back after a refused checkpoint


class StreamLoader(LoadsState, StatefulDataLoader):  # type: ignore[misc]
    """The shell of arrowstream's loaders (see the module docstring); not built directly. Its
    ``load_state_dict`` is :class:`~arrowstream._loader.load_state.LoadsState`'s."""

    WATCH: ClassVar[str]             # what ``set_epoch`` is called on: "dataset", "mixture"
    MIXTURE: ClassVar[bool] = False  # the options of a mixture's loader (see check_loader_options)

    def _start(self, dataset: Loadable, kwargs: dict[str, Any], batches_per_transfer: int | None,
               credential_provider: Any = None) -> None:
        """Build torchdata's loader over ``dataset`` (``kwargs``: its keywords, by name) and the transport."""
        self._epoch_watch = EpochWatch(self.WATCH)   # warns when a finished epoch starts again (no set_epoch)
        check_loader_options(kwargs.get("num_workers", 0), kwargs, credential_provider, mixture=self.MIXTURE)
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
                                    board=Board(self.num_workers, self._counted_sources())
                                    if self.num_workers > 0 else None)
        self._batch_iterator: BatchIterator | None = None
        self._parts: PartsZip | None = None   # order="canonical" with workers: their parts joined
        self._skipper = Skipper()  # loader.skip(): the batches to pass over next, and those passed over
        self._set_batches_per_transfer(batches_per_transfer)

    def _set_batches_per_transfer(self, value: int) -> None:
        """Batches per message (it shapes the order of batches: a resumed loader takes its checkpoint's)."""
        self.batches_per_transfer = value
        self._transport = dataclasses.replace(self._transport, batches_per_transfer=value)
        self._use_transport()

    # -- iterating ------------------------------------------------------------------------------------

    def __iter__(self) -> Any:
        check_loader_options(self.num_workers, {"in_order": self.in_order}, mixture=self.MIXTURE)  # set after __init__
        self._before_iteration()
        self._epoch_watch.starting(self._iterator, self.dataset.epoch, self._order_varies())
        if self.num_workers:   # (with none, the dataset warns in its own __iter__, in this process)
            self.dataset.warn_trims(self.num_workers)
        self._before_workers()
        try:
            inner = super().__iter__()
        except Exception as exc:
            raise_death_between_iterations(self, exc, self.dataset.epoch)
            raise
        self._iteration_started()
        if self.num_workers == 0:
            self._batch_iterator = None
            return SkippingIterator(self, self._skipper, inner)
        self._batch_iterator = worker_batches(inner, self._stitcher(inner))
        return SkippingIterator(self, self._skipper, self._rank_batches(self._batch_iterator, inner))

    @property
    def last_batch_worker(self) -> int | None:
        """The worker that made the batch just handed out: 0 (the trainer's process) without workers, the
        worker of the chunk it came in with workers; ``None`` before the first batch of an iteration.

        Example:
            >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
            >>> folder = tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(folder, "part.parquet"))
            >>> loader, dataset = arrowstream.StructuredDataset.create_dataloader(path=folder, batch_size=4)
            >>> batch = next(iter(loader))
            >>> loader.last_batch_worker
            0
        """
        if self.num_workers == 0:
            return 0
        chunk = None if self._batch_iterator is None else self._batch_iterator.chunk
        return None if chunk is None else chunk.worker_id

    def _get_iterator(self) -> Any:
        """torchdata's hook that starts an epoch's iterator (from a loaded state, if any): a loaded
        state whose epoch is over starts a later epoch whole (see :meth:`_into_later_epoch`)."""
        self._batch_iterator = None   # new workers: none of theirs handed out yet (what a state reads)
        loaded: dict[str, Any] | None = self.next_iter_state  # type: ignore[has-type]
        if loaded is not None and self.num_workers > 0:
            self.next_iter_state = self._into_later_epoch(self._expanded(loaded))
        self._before_get_iterator()
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
        if not self._later_epoch_starts_whole(inner):
            return inner
        inner = copy.deepcopy(inner)
        if steps_since_snapshot(inner):
            # the snapshots stand before batches yielded since: the workers start the later epoch at its
            # first row instead of replaying those batches (a real position, which the workers check)
            for worker_id in range(self.num_workers):
                set_worker_state(inner, worker_id, self._epoch_start(worker_id))
            clear_steps_since_snapshot(inner)
        set_last_yielded_worker(inner, self.num_workers - 1)  # the next batch comes from worker 0
        return inner

    # -- torchdata's loop, for the assignment policies (arrowstream._assignment.views.PolicyLoader) ------------

    def holds_iteration(self) -> bool:
        """Whether torchdata holds an iterator (with workers: their processes) for the next ``iter()``."""
        return self._iterator is not None

    def holds_state_dict_iteration(self, unread: bool = False) -> bool:
        """Whether the iterator torchdata holds was started by ``state_dict()`` (the next ``iter()`` goes on with
        it, workers and all); ``unread``: and it has not read its epoch to the end."""
        iterator: Any = self._iterator
        if not self._initial_iter_for_state_dict:
            return False
        return not (unread and iterator is not None and iterator._finished)

    def end_iteration(self) -> None:
        """End the iterator torchdata holds (its workers now) and forget it, as torchdata's ``load_state_dict``
        does: the next ``iter()`` starts a new one."""
        iterator: Any = self._iterator
        if self.num_workers > 0 and iterator is not None:
            iterator._shutdown_workers()
        self._iterator: Any = None   # torchdata's own fields, as its load_state_dict leaves them
        self._initial_iter_for_state_dict = False

    def positions_handed_out(self) -> dict[int, Any]:
        """Each worker's position after its last batch handed out in this iteration, for the workers that
        handed out any (with workers; see ``BatchIterator.handed_out``)."""
        return {} if self._batch_iterator is None else self._batch_iterator.handed_out()

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
        :func:`arrowstream.describe_state` reports. A dataset's loader and a mixture's skip alike.
        See docs/resume.md, "Skipping batches".

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
        ``rows_per_s``; ``skipped_batches`` and ``skipped_rows`` (see :meth:`skip`); ``workers`` lists the
        same per worker (``rank``, ``worker``). A mixture's loader adds the rows of each source,
        ``"rows/NAME"``, in the totals and in each worker's line. With
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
        workers = worker_values(board, self._meter())
        metrics = {**summarize(workers, self.dataset.rank), **self._skipper.metrics()}
        self._add_metrics(metrics, workers)
        return flatten(metrics) if flat else metrics

    # -- the state ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able dict: ``json.dumps`` and ``torch.save`` both work.

        It stands right after the last batch handed out. With ``in_order=False`` too: each worker's
        cursor is the one after its last batch handed out, so a resume (with ``in_order`` True or
        False, or elastic) yields exactly the rows not yet yielded, each once; only the order in which
        the workers' batches then interleave depends on timing (docs/resume.md).
        """
        from .. import __version__

        with no_in_order_warning():
            inner = self._expanded(super().state_dict())
        if self._batch_iterator is not None and self._parts is not None:   # order="canonical", joined parts
            inner = handed_out_state(inner, self._parts, self._moved_state, self.num_workers)
        elif self._batch_iterator is not None:
            inner = self._handed_out(inner, self._batch_iterator)
        return {
            "kind": LOADER_KIND,
            "version": STATE_VERSION,
            "reads": self.READS,
            "arrowstream_version": __version__,
            "rank": self.dataset.rank,
            "world_size": self.dataset.world_size,
            "num_workers": self.num_workers,
            "batches_per_transfer": self.batches_per_transfer,
            "dataloader": inner,
            **self._state_extras(inner),
            **self._skipper.state_fields(),
        }

    # -- hooks: a dataset's loader and a mixture's ---------------------------------------------------

    def _use_transport(self) -> None:
        """Hand ``self._transport`` to the dataset, before any worker starts."""
        raise NotImplementedError

    def _meter(self) -> Any:
        """This process's meter (``num_workers=0``: the trainer reads)."""
        raise NotImplementedError

    def _counted_sources(self) -> int:
        """A mixture's number of sources, whose rows the metrics count (the board's width)."""
        return 0

    def _add_metrics(self, metrics: dict[str, Any], workers: list[dict[str, Any]]) -> None:
        """Add what only this kind of loader counts to ``metrics``, from each worker's counters ``workers``."""

    def _order_varies(self) -> bool:
        """Whether another epoch gives another order (the epoch watch warns only then)."""
        raise NotImplementedError

    def _before_iteration(self) -> None:
        """Refuse an iteration a loaded checkpoint cannot lead to (the first of ``__iter__``)."""

    def _before_workers(self) -> None:
        """Right before torchdata starts (or reuses) the workers of an iteration."""

    def _iteration_started(self) -> None:
        """Right after torchdata started the iteration."""

    def _before_get_iterator(self) -> None:
        """Right before torchdata makes a new iterator (new workers)."""

    def _stitcher(self, inner: Any) -> Stitcher | None:
        """What makes pieces of the workers' last rows into whole batches; None: no pieces."""
        return None

    def _rank_batches(self, batches: BatchIterator, inner: Any) -> Any:
        """The rank's batches out of the workers' (``inner``: torch's iterator): as they come, or under
        ``order="canonical"`` one part of each worker joined (``arrowstream._loader.canonical``)."""
        self._parts = None
        if not self._joins_parts():
            return batches
        joined = rank_batches(batches, inner, self.num_workers)
        self._parts = joined if isinstance(joined, PartsZip) else None
        return joined

    def _joins_parts(self) -> bool:
        """Whether a rank's batch is one part of each worker (``order="canonical"``)."""
        return False

    def _moved_state(self, raw: Any, position: Any, where: str) -> dict[str, Any]:
        """A worker's state (a dict) of this epoch moved to ``position``, one of its chunks' (``order="canonical"``:
        where each worker stands after its part of the last batch handed out)."""
        raise NotImplementedError

    def _expanded(self, inner: dict[str, Any]) -> dict[str, Any]:
        """torchdata's state with every worker state whole (a worker may send a compact one)."""
        return inner

    def _later_epoch_starts_whole(self, inner: dict[str, Any]) -> bool:
        """Whether a loaded torchdata state (with workers) stands at the end of an epoch before the dataset's."""
        raise NotImplementedError

    def _epoch_start(self, worker_id: int) -> dict[str, Any]:
        """The state of a worker at the start of the dataset's epoch."""
        raise NotImplementedError

    def _handed_out(self, inner: dict[str, Any], batches: BatchIterator) -> dict[str, Any]:
        """torchdata's state, moved to the last batch handed out (it may stand after a whole chunk)."""
        raise NotImplementedError

    def _state_extras(self, inner: dict[str, Any]) -> dict[str, Any]:
        """Fields of the state beside torchdata's dict (a dynamic ledger)."""
        return {}
