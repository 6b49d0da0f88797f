"""A dataset's epochs under ``assignment="dynamic"``: the work of each epoch, a worker's stream over the
leases it takes, and the ledger a checkpoint saves (see :mod:`arrowstream._layout.leases` for the model,
:mod:`arrowstream._layout.ledger` for a worker's side).

The ledger is the rest of the epoch as a :class:`~arrowstream._layout.leases.Work`, in splits of the plan:
replays (each an old worker's slot, the splits its window read, where it stood, the rows left), explicit
splits, and the row of the rank's fresh splits from which everything is left. It is JSON, a few hundred
bytes per worker, whatever the number of files, and is checked against the plan when loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .._core.cursor import Cursor
from .._core.fields import REMEDY, Fields, check_int, shorten
from .._core.order import Slot, SlotGrid
from .._core.plan_types import Split, split_rows
from .._layout.leased_parts import leased_stream
from .._layout.leases import TAIL_LEASES_PER_WORKER, Leases, PoolLeases, StitchTag, Work, last_pieces, tail_pieces
from .._layout.ledger import (
    LeasedShare,
    Replanned,
    items_after,
    rank_share,
    remaining_work,
    replanned_stretches,
    replanned_work,
    start_cursor,
    work_of,
)
from .._layout.replan import Replay
from .._state.compatible import check_compatible
from .._state.identity import DataIdentity
from .._state.ledger_rows import EpochRows, Rank, check_yielded, rows_left, yielded_to_dict
from .._state.versions import check_planning
from .._state.worker import WorkerState
from .._worker.metrics import worker_values
from ..errors import StateError, StateMismatchError
from .figures import Figure

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._core.cursor import Position
    from .._mixing.stream import MixStream
    from .._planning.options import Options
    from .._planning.plan import Plan
    from .._worker.runtime import WorkerRuntime
    from .views import PolicyDataset

class DynamicEpochs:
    """What a dataset with dynamic assignment asks of its epochs: each epoch's :class:`Work` (a loaded
    ledger's for the first iteration of the epoch it was saved in, else the rank's fresh rows) and its leases.

    A loaded ledger is *pending* until an iteration of its epoch starts: that iteration reads it, the next
    ones read the epoch whole (as a static checkpoint's worker states serve one iteration). While it is
    pending, an iteration of another epoch is refused unless the ledger leaves nothing (:meth:`refusal`).
    The loader tells its workers which work an iteration reads through the lease pool (``pool.loaded``).
    """

    def __init__(self, plan: Plan, options: Options, world_size: int, rank: int, even_batches: bool) -> None:
        self._plan, self._options = plan, options
        self._world_size, self._rank, self._even_batches = world_size, rank, even_batches
        self.loaded: tuple[int, Work] | None = None   # a checkpoint's rest of its epoch (kept for the workers)
        self.pending = False   # the loaded rest is not read yet: the next iteration of its epoch reads it
        # epoch -> its fresh work, the rank's rows before cuts, and the splits (and replays) they are in
        self._fresh: dict[int, tuple[Work, int, int]] = {}
        self._placed: dict[int, EpochRows] = {}   # epoch -> its fresh rows, placed (to check a ledger's rows)
        self.replanned: Replanned | None = None   # an epoch re-planned from a checkpoint of another world size

    @property
    def plan(self) -> Plan:
        return self._plan

    @property
    def options(self) -> Options:
        return self._options

    @property
    def even_batches(self) -> bool:
        return self._even_batches

    def checking(self, world_size: int, rank: int, even_batches: bool, replanned: Replanned | None = None) -> DynamicEpochs:
        """The epochs of rank ``rank`` of ``world_size`` on the same plan and options but ``even_batches`` (another
        rank's ledger is checked against them), re-planned from ``replanned``."""
        epochs = DynamicEpochs(self._plan, self._options, world_size, rank, even_batches)
        epochs.use_replanned(replanned)
        return epochs

    def use_replanned(self, replanned: Replanned | None) -> None:
        """Lay out ``replanned.epoch`` from every old rank's rest (None: every epoch from the plan)."""
        self.replanned = replanned
        self._fresh, self._placed = {}, {}

    def replan(self, plan: Plan, options: Options) -> None:
        """The dataset's plan or options changed (a checkpoint's planning or buffer, a table that moved on): the
        epochs are laid out again from them; a loaded rest stays."""
        self._plan, self._options = plan, options
        self._fresh, self._placed = {}, {}

    def _laid_out(self, epoch: int) -> tuple[Work, int, int]:
        laid_out = self._fresh.get(epoch)
        if laid_out is None:
            if len(self._fresh) >= 4:
                del self._fresh[next(iter(self._fresh))]
            replanned = self.replanned
            if replanned is not None and replanned.epoch == epoch:
                work, rows = replanned_work(replanned.rests, self._world_size, self._rank, self._options.batch_size,
                                            self._options.drop_last, self._even_batches, replanned.tails)
                items = len(replanned_stretches(replanned.rests, self._world_size, replanned.tails)[self._rank])
                laid_out = (work, rows, items)
            else:
                share, kept = rank_share(self._plan, self._world_size, self._rank, epoch, self._options,
                                         self._even_batches)
                laid_out = (work_of(share, kept), int(split_rows(share).sum()), len(share))
            self._fresh[epoch] = laid_out
        return laid_out

    def left_out(self, epoch: int) -> tuple[Replay[Slot] | Split, ...]:
        """The rank's rows of ``epoch`` past those it yields (``even_batches`` trims them, ``drop_last`` drops them
        when it ends), in its reading order: what a re-plan for another world size takes on while the rank had rows
        left (``Replanned.tails``)."""
        replanned = self.replanned
        if replanned is not None and replanned.epoch == epoch:
            stretch = replanned_stretches(replanned.rests, self._world_size, replanned.tails)[self._rank]
            items = [i for i in stretch if isinstance(i, Replay)] + [i for i in stretch if not isinstance(i, Replay)]
        else:
            items = list(rank_share(self._plan, self._world_size, self._rank, epoch, self._options,
                                    self._even_batches)[0])
        return items_after(items, self.fresh(epoch).num_rows)

    def fresh(self, epoch: int) -> Work:
        """The rank's rows of ``epoch``, cut to the rows it yields."""
        return self._laid_out(epoch)[0]

    def rank(self, epoch: int) -> Rank:
        """What a ledger of ``epoch`` is checked against: the rank's rows of it, placed (see ``_ledger_rows``)."""
        placed = self._placed.get(epoch)
        if placed is None:
            if len(self._placed) >= 4:
                del self._placed[next(iter(self._placed))]
            fresh = self.fresh(epoch)
            placed = self._placed[epoch] = EpochRows(self._plan, fresh.fresh, fresh.replays)
        return Rank(placed, self._rank, self._world_size, self._options)

    def load(self, epoch: int, work: Work) -> None:
        """A checkpoint's rest of ``epoch``, pending: the next iteration of that epoch reads it."""
        self.loaded, self.pending = (epoch, work), True

    def pending_rest(self) -> tuple[int, Work] | None:
        """The loaded rest while no iteration has read it: what a checkpoint taken now holds."""
        return self.loaded if self.pending else None

    def reads_loaded(self, epoch: int) -> bool:
        """Whether an iteration of ``epoch`` that starts now reads the loaded rest."""
        return self.pending and self.loaded is not None and self.loaded[0] == epoch

    def refusal(self, epoch: int) -> StateMismatchError | None:
        """Why an iteration of ``epoch`` may not start now: a pending rest of another epoch with rows left, or of a
        later epoch (the rows left would never be read, as a static checkpoint's are not:
        ``_resume.pending_for_epoch``); None when it may."""
        if not self.pending or self.loaded is None:
            return None
        saved, work = self.loaded
        left = work.num_rows
        if saved == epoch or (epoch > saved and left == 0):
            return None
        where = f"mid-epoch, {left} row(s) of this rank not yielded yet" if left else "complete"
        return StateMismatchError(
            f"the checkpoint is in epoch {saved} ({where}) but the dataset is set to epoch {epoch}; call "
            f"dataset.set_epoch({saved}) before iterating to finish the saved epoch, or start without loading the "
            "checkpoint")

    def started(self, epoch: int) -> None:
        """An iteration of ``epoch`` started: a pending rest it reads, or one that leaves nothing before a later
        epoch, is done with."""
        if self.pending and self.refusal(epoch) is None:
            self.pending = False

    def work(self, epoch: int, loaded: bool = False) -> Work:
        """The rows of ``epoch`` this rank's workers lease: the loaded rest (``loaded``), else the fresh rows."""
        if loaded:
            assert self.loaded is not None and self.loaded[0] == epoch, "the pool reads a rest that was not loaded"
            return self.loaded[1]
        return self.fresh(epoch)

    def leases(self, epoch: int, num_workers: int, pieces: int = TAIL_LEASES_PER_WORKER, loaded: bool = False) -> Leases:
        """The leases of ``epoch`` for ``num_workers`` workers, ``pieces`` tail leases per worker (the pool's:
        see :func:`~arrowstream._layout.leases.tail_pieces`), over the loaded rest (``loaded``) or the fresh rows."""
        return Leases(self.work(epoch, loaded), self._options.batch_size, num_workers, pieces)

    def batches(self, epoch: int) -> int:
        """Batches this rank yields in a whole ``epoch`` (the workers' last rows stitched into whole batches, all full but one)."""
        rows = self.fresh(epoch).num_rows
        return -(-rows // self._options.batch_size)

    def figure(self, epoch: int) -> Figure:
        """The rank's whole ``epoch`` (re-planned, when it was): its rows, the batches it yields (:meth:`batches`),
        the rows they hold and the splits (and replays) its workers lease."""
        work, rows, items = self._laid_out(epoch)
        return Figure(rows, self.batches(epoch), work.num_rows, items)

    def rows_left_out(self, epoch: int) -> tuple[int, int]:
        """Rows of the rank's share of ``epoch`` that ``even_batches`` trims and that ``drop_last`` drops."""
        work, rank_rows, _ = self._laid_out(epoch)
        kept = work.num_rows
        whole = rank_rows - rank_rows % self._options.batch_size if self._options.drop_last else rank_rows
        if kept < whole:   # evened out: what is left out is trimmed (as a static slot's would be)
            return rank_rows - kept, 0
        return 0, rank_rows - whole

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fresh": {}, "_placed": {}}


def dynamic_stream(runtime: WorkerRuntime, leases: PoolLeases, take: Callable[[], int | None], slot: Slot,
                   epoch: int, options: Options, start: WorkerState,
                   owners: Callable[[], npt.NDArray[np.int64]] | None = None) -> MixStream[Position, WorkerState]:
    """A worker's batches of ``epoch`` (from worker state ``start``, the epoch's first): the rows of the leases it
    takes with ``take``, read by the one stream (:func:`~arrowstream._layout.leased_parts.leased_stream`); ``owners``
    (who took each lease, read once the pool is dry): its last rows are cut into pieces stitched with the other
    workers' (None: its last batch is short, if it must be)."""
    last = None
    if owners is not None:
        def last() -> list[tuple[int, StitchTag | None]]:   # the pool is dry: its last eighth laid out
            return last_pieces(np.diff(leases.current.bounds), owners(), slot.worker_id, slot.num_workers,
                               options.batch_size)

    # object stores: the next leased splits fetched in the background (runtime.read_ahead)
    return leased_stream(runtime.readers, LeasedShare(leases, take), start, seed=options.seed,
                         batch_size=options.batch_size, interleave=options.interleave,
                         buffer_rows=options.shuffle_buffer_size, read_ahead=runtime.read_ahead, last_pieces=last)


def lease_taker(pool: Any, leases: PoolLeases, runtime: WorkerRuntime, worker: int) -> Callable[[], int | None]:
    """How worker ``worker`` takes its next lease from ``pool`` (None once it is dry). The worker that reaches
    the last eighth first lays it out by what every worker measured so far (see
    :func:`~arrowstream._layout.leases.tail_pieces`). From the last eighth on, the worker decodes with pyarrow's
    threads: the workers that are done leave cores idle, which then decode a costly row group (one that a cut
    would not make cheaper) together."""
    meter, board = runtime.meter, runtime.transport.board

    def decide() -> tuple[int, int]:
        measured = worker_values(board, meter)
        pieces = tail_pieces(sum(v["read_s"] for v in measured), sum(v["convert_s"] for v in measured))
        return pieces, len(leases.of(pieces))

    def take() -> int | None:
        lease: int | None = pool.take(worker, decide)
        if lease is not None:
            meter.leased()
        last = lease is None or lease >= pool.fixed
        for reader in runtime.readers:
            reader.use_threads = reader.threads_by_default or last
        return lease

    return take


def start_state(data: DataIdentity, state_options: dict[str, Any], epoch: int, slot: Slot,
                interleave: int) -> WorkerState:
    return WorkerState(data, state_options, epoch, slot, start_cursor(interleave), 0, 0, 0, False, None)


# -- the ledger as JSON ---------------------------------------------------------------------------


def _split_to_list(split: Split) -> list[int]:
    return [split.file_index, split.unit_start, split.unit_stop, split.row_start, split.num_rows, split.num_bytes]


def work_to_dict(epoch: int, work: Work, yielded: dict[str, int]) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "replays": [{"slot": [r.slot.world_size, r.slot.num_workers, r.slot.rank, r.slot.worker_id],
                     "splits": [_split_to_list(s) for s in r.splits], "start": r.start.to_dict(), "rows": r.rows}
                    for r in work.replays],
        "splits": [_split_to_list(s) for s in work.splits],
        "fresh_from_row": work.fresh_from_row,
        "yielded": yielded,
    }


def _split_from_list(plan: Plan, value: Any, where: str) -> Split:
    """A split of the ledger, checked against the plan: a file, units and rows it has."""
    if not isinstance(value, list) or len(value) != 6:
        raise StateError(f"the state's {where} is {shorten(value)}, expected [file, unit start, unit stop, row start, "
                         f"rows, bytes]; {REMEDY}")
    file_index, unit_start, unit_stop, row_start, num_rows, num_bytes = (
        check_int(v, f"{where}[{i}]") for i, v in enumerate(value))
    if file_index >= len(plan.files):
        raise StateError(f"the state's {where} names file {file_index}, but the dataset has {len(plan.files)} file(s); "
                         f"{REMEDY}")
    unit_rows = plan.files[file_index].unit_rows
    if not unit_start < unit_stop <= len(unit_rows) or num_rows < 1 \
            or row_start + num_rows > sum(unit_rows[unit_start:unit_stop]):
        raise StateError(f"the state's {where} ({shorten(value)}) is not a range of rows of "
                         f"{plan.url(file_index)} (units {unit_start}..{unit_stop} of {len(unit_rows)}); {REMEDY}")
    return Split(file_index, unit_start, unit_stop, row_start, num_rows, num_bytes)


def work_from_dict(value: Any, plan: Plan, epochs: DynamicEpochs, options: Options,
                   where: str = "dynamic") -> tuple[int, Work]:
    """The ledger of a dynamic checkpoint: its epoch and the rest of that epoch, checked against the plan: its
    splits and replays where the rank's leased rows are, and with ``yielded`` all of the rank's rows of the
    epoch (see :mod:`arrowstream._state.ledger_rows`)."""
    fields = Fields(value, where)
    epoch = fields.integer("epoch")
    replays = []
    for number, replay in enumerate(fields.sequence("replays")):
        name = f"{where}.replays[{number}]"
        entry = Fields(replay, name)
        slot_fields = entry.sequence("slot")
        if len(slot_fields) != 4:
            raise StateError(f"the state's {name}.slot is {shorten(slot_fields)}, expected [world size, workers, rank, "
                             f"worker]; {REMEDY}")
        world, workers, rank, worker = (check_int(v, f"{name}.slot[{i}]") for i, v in enumerate(slot_fields))
        if world < 1 or rank >= world or worker >= max(workers, 1):
            raise StateError(f"the state's {name}.slot is {shorten(slot_fields)}: not a slot; {REMEDY}")
        splits = tuple(_split_from_list(plan, s, f"{name}.splits[{i}]") for i, s in enumerate(entry.sequence("splits")))
        start = Cursor.from_dict(entry.mapping("start").value, f"{name}.start")
        rows = entry.integer("rows", 1)   # inside its window: see _ledger_rows
        replays.append(Replay(SlotGrid(world, workers).slot(rank, worker), splits, start, rows))
    splits = tuple(_split_from_list(plan, s, f"{where}.splits[{i}]") for i, s in enumerate(fields.sequence("splits")))
    fresh = epochs.fresh(epoch)
    fresh_rows = fresh.num_rows
    fresh_from = fields.integer("fresh_from_row", 0, fresh_rows - sum(r.rows for r in fresh.replays))
    work = Work(tuple(replays), splits, fresh.fresh, fresh_from)
    if work.num_rows > fresh_rows:
        raise StateError(f"the state's {where} leaves {work.num_rows} row(s) of epoch {epoch}, more than the rank reads "
                         f"in an epoch ({fresh_rows}); {REMEDY}")
    placed = epochs.rank(epoch)
    check_yielded(fields.get("yielded"), placed, rows_left(plan, work, epoch, placed, where), epoch, where)
    return epoch, work


# -- the loader's side ------------------------------------------------------------------------------


def dynamic_ledger(dataset: PolicyDataset, epochs: DynamicEpochs, pool: Any, cursors: Sequence[Cursor | None],
                   num_workers: int) -> dict[str, Any]:
    """The ``dynamic`` part of a loader state: the rest of the epoch being read (or, before any
    iteration, of the dataset's epoch), with the data and options it must resume on. ``cursors``: each
    worker's after its last batch handed out (None: it has handed out none yet)."""
    options = dataset.options
    pending = epochs.pending_rest()
    if pending is not None:   # a loaded rest no iteration has read yet (state_dict() may have started workers)
        epoch, work = pending
    elif pool is None:
        epoch = dataset.epoch
        work = epochs.fresh(epoch)
    else:
        epoch = pool.epoch
        pieces, owners = pool.snapshot()
        leases = epochs.leases(epoch, num_workers, pieces, loaded=pool.loaded)
        grid = SlotGrid(dataset.world_size, num_workers)
        slots = [grid.slot(dataset.rank, worker) for worker in range(max(num_workers, 1))]
        started = [start_cursor(options.interleave) if cursor is None else cursor for cursor in cursors]
        work = remaining_work(leases, owners, started, slots, batch_size=options.batch_size,
                              interleave=options.interleave, buffer_rows=options.shuffle_buffer_size)
    rank = epochs.rank(epoch)
    yielded = yielded_to_dict(rank, rows_left(epochs.plan, work, epoch, rank, "dynamic"))
    replanned = epochs.replanned
    source = replanned.value if replanned is not None and replanned.epoch == epoch else None
    return {**work_to_dict(epoch, work, yielded), "replanned": source, "data": dataset.identity.to_dict(),
            "options": dict(dataset.state_options)}


def load_dynamic_ledger(dataset: PolicyDataset, epochs: DynamicEpochs, outers: Sequence[dict[str, Any]]) -> int:
    """Check the ledgers of loader states (one, or every rank's of a merged checkpoint) against ``dataset`` and
    make the rest of the saved epoch the work of its ``epochs`` (re-planned in place when the dataset follows the
    checkpoint's planning version, buffer or source); the saved epoch."""
    missing = [index for index, outer in enumerate(outers) if "dynamic" not in outer]
    if missing:
        raise StateMismatchError(f"checkpoint rank {missing[0]} was taken with assignment='static' and others with "
                                 f"'dynamic'; {REMEDY}")
    # cut splits as the checkpoint did (its planning version), with its buffer when the dataset's was left out: as a
    # static state's first worker state makes the dataset do (``_state.resume.follow_planning``); the ledgers'
    # options are then compared with the dataset's (a rank of another version is refused, saved vs current)
    saved_options = Fields(outers[0]["dynamic"], "dynamic").mapping("options")
    dataset.use_planning(check_planning(saved_options))
    dataset.adopt_buffer(saved_options.value)
    # an Iceberg table that moved on since the checkpoint: its pinned snapshot, planned before a ledger is checked
    dataset.follow_origin(_ledger_state(outers[0]))
    world_size = outers[0]["world_size"]
    current = _Current(dataset.identity, dataset.state_options, dataset.data_identity)
    if world_size != dataset.world_size:
        replanned = _replanned(epochs, current, outers, dataset.world_size)
        epochs.use_replanned(replanned)
        epochs.load(replanned.epoch, epochs.fresh(replanned.epoch))
        return replanned.epoch
    outer = outers[0] if len(outers) == 1 else outers[dataset.rank]
    if outer["rank"] != dataset.rank:
        raise StateMismatchError(f"this loader state belongs to rank {outer['rank']} of {world_size}, this loader is "
                                 f"rank {dataset.rank}; load each rank's own state, or the merged checkpoint on every rank")
    saved = _ledger_state(outer)
    checked = _ledger_epochs(outer["dynamic"], epochs.checking(dataset.world_size, dataset.rank, epochs.even_batches),
                             "dynamic")
    epoch, work = work_from_dict(outer["dynamic"], epochs.plan, checked, epochs.options)
    check_compatible(saved, current.data, current.state_options, current.identity, followed=True)
    epochs.use_replanned(checked.replanned)
    epochs.load(epoch, work)
    return epoch


def _ledger_epochs(ledger: Any, epochs: DynamicEpochs, where: str) -> DynamicEpochs:
    """``epochs`` re-planned as ``ledger`` says its epoch was (its ``replanned``), to check it against."""
    source = Fields(ledger, where).get("replanned")
    if source is not None:
        epochs.use_replanned(replanned_from_dict(source, epochs, f"{where}.replanned"))
    return epochs


MAX_REPLANS = 64
"""Re-plans of re-plans a ledger may hold: one per change of world size inside one epoch, far more than a run makes."""


def replanned_from_dict(value: Any, epochs: DynamicEpochs, where: str, depth: int = 1) -> Replanned:
    """The ``replanned`` field of a ledger: every old rank's rest of the epoch (each checked against the plan as
    its rank had laid the epoch out, re-planned in turn where it was) and the world size they were taken on.
    ``depth``: how many re-plans deep ``value`` is (at most :data:`MAX_REPLANS`)."""
    if depth > MAX_REPLANS:
        root = where[:where.index(".replanned")]
        raise StateError(f"the state's {root}.replanned holds re-plans of re-plans more than {MAX_REPLANS} deep: one "
                         f"is made per change of world size inside one epoch, and a checkpoint of a re-plan {MAX_REPLANS} "
                         f"deep is not re-planned again; {REMEDY}")
    fields = Fields(value, where)
    world_size = fields.integer("world_size", 1)
    even_batches = fields.boolean("even_batches")
    rests = fields.sequence("rests")
    if len(rests) != world_size:
        raise StateError(f"the state's {where}.rests holds {len(rests)} ledger(s), expected one per old rank: "
                         f"{world_size} for world_size={world_size}; {REMEDY}")
    inner = fields.get("replanned")
    source = None if inner is None else replanned_from_dict(inner, epochs, f"{where}.replanned", depth + 1)
    with_tails = fields.boolean("tails") if "tails" in fields.value else False   # written from version 12 on (absent: an older re-plan, laid out as it was)
    works, found, tails = [], set(), []
    for rank, rest in enumerate(rests):
        name = f"{where}.rests[{rank}]"
        if Fields(rest, name).get("yielded") is None:
            raise StateError(f"the state's {name}.yielded is missing: an old rank's rest names the rows it had yielded; "
                             f"{REMEDY}")
        old = epochs.checking(world_size, rank, even_batches, source)
        epoch, work = work_from_dict(rest, epochs.plan, old, epochs.options, name)
        works.append(work)
        found.add(epoch)
        tails.append(old.left_out(epoch) if with_tails else ())
    if len(found) != 1 or (source is not None and source.epoch not in found):
        raise StateError(f"the state's {where} holds rests of epochs {sorted(found)}, expected one epoch; {REMEDY}")
    value = {"world_size": world_size, "even_batches": even_batches, "rests": list(rests), "replanned": inner}
    return Replanned(found.pop(), world_size, tuple(works), {**value, "tails": True} if with_tails else value,
                     tuple(tails) if with_tails else ())


def _replans(value: Any) -> int:
    """How many re-plans deep a ledger's checked ``replanned`` field is (0: None)."""
    depth = 0
    while isinstance(value, dict):
        depth, value = depth + 1, value.get("replanned")
    return depth


@dataclass(frozen=True)
class _Current:
    """What a ledger's data and options are checked against: the dataset's."""

    data: DataIdentity
    state_options: dict[str, Any]
    identity: str


def _replanned(epochs: DynamicEpochs, current: _Current, outers: Sequence[dict[str, Any]],
               new_world_size: int) -> Replanned:
    """The rest of the epoch of a merged checkpoint of another world size: every old rank's ledger, checked, to be
    re-planned over ``new_world_size`` ranks (see :func:`~arrowstream._layout.ledger.replanned_work`)."""
    world_size = outers[0]["world_size"]
    ranks = [outer["rank"] for outer in outers]
    if ranks != list(range(world_size)):
        raise StateMismatchError(
            f"checkpoint was taken with world_size={world_size} and assignment='dynamic', this loader has "
            f"world_size={new_world_size}: re-planning the rest of the epoch for another world size needs every "
            f"old rank's ledger (each holds the rows its rank had left), and this state holds rank(s) "
            f"{shorten(ranks)} only. Load the merged checkpoint of every rank (arrowstream.gather_state_dict or "
            "merge_state_dicts)")
    rests, sources, found, tails = [], [], [], []
    evens = [_ledger_state(outer).options.get("even_batches") for outer in outers]
    if any(even != evens[0] for even in evens):
        other = next(rank for rank, even in enumerate(evens) if even != evens[0])
        raise StateMismatchError(
            f"the checkpoint's rank 0 was taken with even_batches={evens[0]} and its rank {other} with "
            f"even_batches={evens[other]}: the ranks of one run yield alike, and the rows each old rank left follow "
            f"from its own, so these ledgers are not of one run. Load a checkpoint merged from the states of one run's "
            "ranks (arrowstream.gather_state_dict or merge_state_dicts), all built with the same even_batches")
    for rank, outer in enumerate(outers):
        where = f"checkpoint.ranks[{rank}].dynamic"
        saved = _ledger_state(outer)
        even_batches = evens[rank]   # the old world size's (off on one rank), the same on every rank
        check_compatible(saved, current.data, {**current.state_options, "even_batches": even_batches}, current.identity,
                         followed=True)
        old = _ledger_epochs(outer["dynamic"], epochs.checking(world_size, rank, bool(even_batches)), where)
        epoch, work = work_from_dict(outer["dynamic"], epochs.plan, old, epochs.options, where)
        placed = old.rank(epoch)
        tails.append(old.left_out(epoch))
        rests.append((work, work_to_dict(epoch, work, yielded_to_dict(placed, rows_left(epochs.plan, work, epoch,
                                                                                           placed, where)))))
        sources.append(Fields(outer["dynamic"], where).get("replanned"))
        found.append(epoch)
    if len(set(found)) > 1:
        other = next(rank for rank, epoch in enumerate(found) if epoch != found[0])
        raise StateMismatchError(
            f"the checkpoint's rank 0 is in epoch {found[0]} and its rank {other} in epoch {found[other]}: the rest of "
            f"one epoch is re-planned for world_size={new_world_size}, and these ranks were not in the same one. "
            f"Resume with world_size={world_size} until every rank is in the same epoch, then change")
    if any(source != sources[0] for source in sources):
        raise StateError(f"the checkpoint's ranks' ledgers say their epoch was re-planned from different checkpoints; "
                         f"{REMEDY}")
    if _replans(sources[0]) >= MAX_REPLANS:   # one more would make a checkpoint that no loader takes
        raise StateMismatchError(
            f"checkpoint was taken with world_size={world_size} in epoch {found[0]}, which was re-planned "
            f"{MAX_REPLANS} times already for another world size; re-planning it once more for "
            f"world_size={new_world_size} would save checkpoints nested deeper than a loader takes. Resume with "
            f"world_size={world_size} until the epoch ends, then change")
    return Replanned(found[0], world_size, tuple(work for work, _ in rests),
                     {"world_size": world_size, "even_batches": bool(even_batches),
                      "rests": [value for _, value in rests], "replanned": sources[0], "tails": True}, tuple(tails))


def _ledger_state(outer: dict[str, Any]) -> WorkerState:
    """What a rank's ledger says of the data and options it was taken on, as a worker state (for the checks
    and the source's ``follow`` that a static state goes through)."""
    ledger = Fields(outer["dynamic"], "dynamic")
    return WorkerState(DataIdentity.from_dict(ledger.mapping("data")), dict(ledger.mapping("options").value),
                       ledger.integer("epoch"), SlotGrid(outer["world_size"], 0).slot(outer["rank"], 0), start_cursor(1), 0, 0,
                       0, False, None)
