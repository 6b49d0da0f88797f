"""The one ``load_state_dict`` of arrowstream's loaders (``StreamLoader``): a state checked, then dispatched.

:class:`LoadsState` is the part of the loader shell that takes a state in: an empty state, a merged checkpoint
of every rank (this topology's: this rank's part), this rank's own state, one rank's state that is all of it
(any topology), or another topology's; the skips the state records; and the checkpoint's
``batches_per_transfer``. A state is read once for both loaders (``arrowstream._state.loader``: one loader state
kind and one merged checkpoint kind, older ones migrated), and one of a loader that read the other kind of data
(its ``reads``) is refused. What differs between a dataset's loader and a mixture's is the hooks at the end
(``_load_own``, ``_load_other_topology``, ...), which ``ArrowStreamDataLoader`` and ``MixtureDataLoader`` fill.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

from torchdata.stateful_dataloader import StatefulDataLoader

from .._core.fields import REMEDY, shorten
from .._state.loader import CHECKPOINT_KINDS, LOADER_KINDS, read_checkpoint, read_loader_state
from .._state.skips import Skip, pending_of, read_skips
from .._state.versions import CHECKPOINT_KIND, DATASET, LOADER_KIND
from .._storage.filesystem import logger
from ..errors import StateError, StateMismatchError
from .skip import Skipper
from .torchdata_state import is_inner_state


class LoadsState:
    """``load_state_dict`` and its hooks, for :class:`~arrowstream._loader.shell.StreamLoader` (a
    ``StatefulDataLoader``, whose attributes are named below)."""

    READS: ClassVar[str]   # what the loader reads, as its states' ``reads`` says: "dataset", "mixture"
    TAKES_PLAIN_STATE: ClassVar[bool] = False   # loads a plain StatefulDataLoader's state
    dataset: Any
    num_workers: int
    snapshot_every_n_steps: int
    batches_per_transfer: int
    _skipper: Skipper

    def _set_batches_per_transfer(self, value: int) -> None:
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (or a merged checkpoint of every rank); the next batch is the one
        after the saved one.

        Every field is checked before anything is loaded (types, ranges, and each worker's cursor
        and counters against the plan): a state that would not yield every row once raises a
        ``StateError`` (see docs/state-format.md, Validation), and leaves the loader as it was, and what its
        dataset or mixture reads (``reading()``/``read_as()``: an Iceberg table's snapshot, the plans). A dataset
        then cuts splits by the checkpoint's planning version, in this epoch and the later ones
        (docs/state-format.md); a mixture may have changed at an epoch boundary (weights, ``epoch_rows``,
        sources; docs/mixing.md). With ``shuffle_buffer_size`` left to its default, both take the
        checkpoint's buffer (docs/shuffle.md).
        """
        before = self.dataset.reading()   # what loading may change of what the dataset (or mixture) reads
        skips = self._saved_skips(state_dict)
        try:
            self._load_state_dict(state_dict)
        except BaseException:  # a refused checkpoint leaves the dataset (or mixture) reading what it read
            self.dataset.read_as(before)
            raise
        self._skipper.load(*skips)

    def _saved_skips(self, state_dict: Any) -> tuple[list[Skip], int]:
        """The skips a state records for this rank (see ``arrowstream._state.skips``): its own loader state's
        (the same world size), or, re-planned for another world size, the pending skip all old ranks agree
        on. The rest of the state is checked by ``_load_state_dict``."""
        if not isinstance(state_dict, dict):
            return [], 0
        if state_dict.get("kind") in LOADER_KINDS:
            return read_skips(state_dict)
        ranks = state_dict.get("ranks")
        if state_dict.get("kind") not in CHECKPOINT_KINDS or not isinstance(ranks, list) or not ranks:
            return [], 0
        outers = [outer if isinstance(outer, dict) else {} for outer in ranks]
        if state_dict.get("world_size") == self.dataset.world_size and len(outers) > self.dataset.rank:
            return read_skips(outers[self.dataset.rank], f"checkpoint.ranks[{self.dataset.rank}]")
        return pending_of(outers)   # other ranks: each new rank skips what every old rank had pending

    def _load_state_dict(self, state_dict: Any) -> None:
        """The one dispatch: an empty state, a merged checkpoint (this topology's: this rank's part), this
        rank's state, one rank's state that is all of it (any topology), or another topology's."""
        if isinstance(state_dict, dict) and not state_dict:
            self._forget_loaded()
            self._skipper.load([], 0)
            self._load_torchdata({})
            return
        kind = state_dict.get("kind") if isinstance(state_dict, dict) else None
        if kind in CHECKPOINT_KINDS:
            world_size, num_workers, outers = read_checkpoint(_copied(state_dict))
            self._check_reads(outers[0]["reads"], "merged checkpoint")
            if self._load_ledger(outers):
                return
            if (world_size, num_workers) != (self.dataset.world_size, self.num_workers):
                self._load_other_topology(outers)
                return
            outer = outers[self.dataset.rank]
        elif kind in LOADER_KINDS:
            outer = read_loader_state(_copied(state_dict))
            self._check_reads(outer["reads"], "loader state")
        elif self.TAKES_PLAIN_STATE and isinstance(state_dict, dict) and is_inner_state(state_dict):
            self._load_own({"dataloader": _copied(state_dict), "batches_per_transfer": 1})
            return
        else:
            keys = shorten(sorted(map(str, state_dict))[:5]) if isinstance(state_dict, dict) else "-"
            raise StateError(f"load_state_dict: expected the dict returned by this loader's state_dict() (kind "
                             f"{LOADER_KIND!r}) or a merged checkpoint of it (kind {CHECKPOINT_KIND!r}), "
                             f"got {type(state_dict).__name__} of kind {shorten(kind)} with keys {keys}; pass the "
                             "state unchanged, to a loader of the same kind of data (a dataset or a mixture)")
        if self._load_ledger([outer]):
            return
        saved = (outer["rank"], outer["world_size"], outer["num_workers"])
        current = (self.dataset.rank, self.dataset.world_size, self.num_workers)
        if saved != current and saved[1] == 1:  # one rank's state is all of it
            self._load_other_topology([outer])
            return
        if saved[:2] != current[:2]:
            raise StateMismatchError(
                f"this loader state belongs to rank {saved[0]} of {saved[1]}, this loader is rank {current[0]} of "
                f"{current[1]}; merge every rank's state with arrowstream.gather_state_dict(loader) (or "
                "merge_state_dicts) and load the merged checkpoint on every rank")
        if saved[2] != current[2]:
            raise StateMismatchError(
                f"checkpoint was taken with num_workers={saved[2]}, this loader has num_workers={current[2]}; with "
                f"world_size={current[1]}, re-planning the epoch for other workers needs every rank's state: load "
                "the checkpoint of arrowstream.gather_state_dict(loader) (or merge_state_dicts), or build the loader "
                f"with num_workers={saved[2]}")
        self._load_own(outer)

    def _check_reads(self, reads: str, what: str) -> None:
        """Refuse a state of a loader that read the other kind of data (a mixture's in a dataset's loader, or the
        reverse): its worker states are the other kind's."""
        if reads == self.READS:
            return
        build = ("Mixture.create_dataloader (or MixtureDataLoader) with the sources and options of the run that "
                 "took it") if reads != DATASET else ("StructuredDataset.create_dataloader (IcebergDataset for a "
                                                     "table, or ArrowStreamDataLoader) on the data and options of "
                                                     "the run that took it")
        raise StateMismatchError(
            f"load_state_dict: the {what} was taken by the loader of a {reads} (its reads is {reads!r}), this loader "
            f"reads a {self.READS}; a {reads}'s checkpoint resumes only a {reads}: load it into the loader of {build}")

    def _load_torchdata(self, inner: dict[str, Any]) -> None:
        """Hand torchdata its own state (checked), for the next iteration."""
        StatefulDataLoader.load_state_dict(self, inner)

    def _follow_per_transfer(self, per_transfer: int) -> None:
        """Take the checkpoint's ``batches_per_transfer``: it shapes the order of batches."""
        if per_transfer > 1 and self.snapshot_every_n_steps != 1:
            raise StateMismatchError(
                f"checkpoint was taken with batches_per_transfer={per_transfer}, which needs "
                f"snapshot_every_n_steps=1; this loader has snapshot_every_n_steps={self.snapshot_every_n_steps}. "
                "Build the loader with snapshot_every_n_steps=1 to resume")
        if per_transfer != self.batches_per_transfer and self.num_workers > 0:
            logger.info("batches_per_transfer follows the checkpoint: %d (was %d)", per_transfer,
                        self.batches_per_transfer)
            self._set_batches_per_transfer(per_transfer)

    # -- hooks: a dataset's loader and a mixture's ---------------------------------------------------

    def _load_ledger(self, outers: list[dict[str, Any]]) -> bool:
        """Load states that are no workers' cursors (a dynamic ledger); False: none is."""
        return False

    def _forget_loaded(self) -> None:
        """An empty state is loaded: forget what a loaded checkpoint left."""

    def _load_own(self, outer: dict[str, Any]) -> None:
        """Load this rank's state, of this topology (``outer``: read by ``arrowstream._state.loader.read_loader_state``,
        reading what this loader reads)."""
        raise NotImplementedError

    def _load_other_topology(self, outers: list[dict[str, Any]]) -> None:
        """Load every old rank's states (in rank order) with this loader's topology."""
        raise NotImplementedError


def _copied(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A copy of a state to check and load (its parsers migrate in place); a state nested too deep to copy is no
    state a loader wrote: a ``StateError``, never a ``RecursionError``."""
    try:
        return copy.deepcopy(state_dict)
    except RecursionError:
        raise StateError("load_state_dict: the state is nested deeper than Python can copy, where a loader's state "
                         "nests a few levels (a dynamic ledger's replanned one per re-plan, 64 at most); it is not "
                         f"a state a loader wrote: {REMEDY}") from None
