"""The loader of a :class:`~arrowstream.Mixture`: a ``StatefulDataLoader`` whose state is checked on load."""

from __future__ import annotations

import copy
import inspect
import warnings
from typing import TYPE_CHECKING, Any

from torchdata.stateful_dataloader import StatefulDataLoader

from ._convert import passthrough_collate
from ._fields import REMEDY, Fields, shorten
from ._loader_options import check_loader_options
from ._mix_resume import check_worker_state, follow
from ._mix_stream import MixSlot, MixWorkerState
from ._options import check_int
from ._torchdata_state import (
    clear_steps_since_snapshot,
    is_inner_state,
    iterator_finished,
    set_iterator_finished,
    set_last_yielded_worker,
    set_worker_state,
    steps_since_snapshot,
    worker_states,
)
from ._watchdog import name_dead_workers
from .errors import ArgumentTypeError, NotSupportedYetError, StateError

if TYPE_CHECKING:
    from .mixture import Mixture

MIX_LOADER_KIND = "arrowstream.mixture_loader"
MIX_LOADER_VERSION = 1


class MixtureDataLoader(StatefulDataLoader):  # type: ignore[misc]
    """The ``StatefulDataLoader`` of a :class:`~arrowstream.Mixture` (see ``Mixture.create_dataloader``):
    ``len`` from metadata, and a state that is checked, field by field, before it is loaded."""

    def __init__(self, mixture: Mixture, **kwargs: Any) -> None:
        from .mixture import Mixture

        if not isinstance(mixture, Mixture):
            raise ArgumentTypeError(f"dataset: MixtureDataLoader loads an arrowstream Mixture, got {type(mixture).__name__}")
        kwargs.setdefault("batch_size", None)
        kwargs.setdefault("collate_fn", passthrough_collate)
        check_loader_options(kwargs.get("num_workers", 0), kwargs)
        with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated in torch 2.13
            warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
            super().__init__(mixture, **kwargs)

    def __len__(self) -> int:
        return int(self.dataset.num_batches(self.num_workers))

    def __iter__(self) -> Any:
        inner = super().__iter__()
        if self.num_workers > 0:
            name_dead_workers(inner)
        return inner

    def _get_iterator(self) -> Any:
        loaded: dict[str, Any] | None = self.next_iter_state  # type: ignore[has-type]
        if loaded is not None and self.num_workers > 0:
            states = [None if s is None else MixWorkerState.from_dict(s) for s in worker_states(loaded)]
            if all(s is not None and s.epoch_complete and s.epoch < self.dataset.epoch for s in states) \
                    and not steps_since_snapshot(loaded):
                loaded = copy.deepcopy(loaded)
                set_last_yielded_worker(loaded, self.num_workers - 1)  # a later epoch starts at worker 0
                self.next_iter_state = loaded
        return super()._get_iterator()

    def state_dict(self) -> dict[str, Any]:
        """A JSON-able dict: ``json.dumps`` and ``torch.save`` both work."""
        from . import __version__

        mixture = self.dataset
        return {"kind": MIX_LOADER_KIND, "version": MIX_LOADER_VERSION, "arrowstream_version": __version__,
                "rank": mixture.rank, "world_size": mixture.world_size, "num_workers": self.num_workers,
                "dataloader": super().state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the next batch is the one after the saved one. At an epoch
        boundary the mixture may have changed (weights, ``epoch_rows``, sources); see docs/mixing.md."""
        if isinstance(state_dict, dict) and not state_dict:
            super().load_state_dict({})
            return
        fields = Fields(state_dict, "mixture loader state")
        if fields.value.get("kind") != MIX_LOADER_KIND:
            raise StateError(f"load_state_dict: expected the dict returned by a mixture loader's state_dict(), got kind "
                             f"{shorten(fields.value.get('kind'))}; {REMEDY}")
        version = fields.integer("version")
        if version != MIX_LOADER_VERSION:
            raise StateError(f"the mixture loader state has version {version}; this arrowstream reads version "
                             f"{MIX_LOADER_VERSION}: upgrade arrowstream to load it")
        mixture = self.dataset
        saved = (fields.integer("rank"), fields.integer("world_size"), fields.integer("num_workers"))
        current = (mixture.rank, mixture.world_size, self.num_workers)
        if saved != current:
            raise NotSupportedYetError(
                f"the checkpoint was taken by rank {saved[0]} of {saved[1]} with num_workers={saved[2]}; this loader is "
                f"rank {current[0]} of {current[1]} with num_workers={current[2]}. Mixtures resume with the same ranks "
                "and workers (elastic resume of mixtures is not available yet): build the loader with "
                f"world_size={saved[1]} and num_workers={saved[2]}")
        inner = copy.deepcopy(fields.value.get("dataloader"))
        if not isinstance(inner, dict) or not is_inner_state(inner):
            raise StateError(f"the mixture loader state's dataloader is not a StatefulDataLoader state; {REMEDY}")
        raw = worker_states(inner)
        if len(raw) != max(self.num_workers, 1):
            raise StateError(f"the mixture loader state holds {len(raw)} worker state(s) for num_workers="
                             f"{self.num_workers}; {REMEDY}")
        states = [None if s is None else MixWorkerState.from_dict(s, f"worker {i}'s mixture state")
                  for i, s in enumerate(raw)]
        present = [s for s in states if s is not None]
        if present:
            epoch = follow(mixture, present)
            for worker_id, state in enumerate(states):
                if state is not None:
                    check_worker_state(mixture, state, MixSlot(state.epoch, mixture.rank, mixture.world_size,
                                                                worker_id, self.num_workers))
            if iterator_finished(inner):   # taken after the loop ended: every worker is done with the epoch
                self._mark_complete(inner, states, epoch)
        super().load_state_dict(inner)

    def _mark_complete(self, inner: dict[str, Any], states: list[MixWorkerState | None], epoch: int) -> None:
        mixture = self.dataset
        limits = mixture.batch_limits(self.num_workers, epoch)
        per_rank = max(self.num_workers, 1)
        left = sum(limits[mixture.rank * per_rank + i] - s.batches for i, s in enumerate(states)
                   if s is not None and not s.epoch_complete)
        if left != steps_since_snapshot(inner):
            raise StateError(f"the mixture loader state says the epoch ended, but its workers have {left} batch(es) "
                             f"left against {steps_since_snapshot(inner)} yielded since their snapshots; {REMEDY}")
        for worker_id, state in enumerate(states):
            if state is not None:
                done = MixWorkerState(**{**state.__dict__, "epoch_complete": True})
                set_worker_state(inner, worker_id, done.to_dict())
        clear_steps_since_snapshot(inner)
        set_iterator_finished(inner, False)


_LOADER_PARAMS = set(inspect.signature(StatefulDataLoader.__init__).parameters) - {"self", "dataset"}


def build_mixture_loader(mixture_cls: type, mixture_args: dict[str, Any], *, num_workers: int,
                         **kwargs: Any) -> tuple[MixtureDataLoader, Any]:
    """Split keywords between the mixture and the loader, build both."""
    check_int("num_workers", num_workers, 0)
    params = set(inspect.signature(mixture_cls).parameters)
    mixture_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in params}
    unknown = sorted(set(kwargs) - _LOADER_PARAMS)
    reserved = sorted(set(kwargs) & {"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"})
    if unknown or reserved:
        raise ArgumentTypeError(f"Mixture.create_dataloader: unknown keyword(s) {unknown or reserved}; mixture keywords "
                                f"are {sorted(params)}, loader keywords those of StatefulDataLoader")
    check_loader_options(num_workers, kwargs)
    mixture = mixture_cls(**mixture_args, **mixture_kwargs)
    return MixtureDataLoader(mixture, num_workers=num_workers, **kwargs), mixture
