"""``describe_state``'s parts for a ``Mixture``'s states (a loader state or a merged checkpoint whose ``reads`` is
``"mixture"``): worker states, the rows taken of each source, the quotas and their history; a mixture's epoch
holds the sum of its quotas."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._core.fields import Fields
from .._loader.torchdata_state import InnerState
from .._state.canonical import is_canonical
from .._state.mixture import MixWorkerState
from .._state.versions import MIXTURE as READS_MIXTURE
from .._state.versions import STATE_VERSION
from .._state.worker_states import read_worker_state
from .describe_canonical import CanonicalWorker, canonical_body, read_canonical_worker
from .describe_kind import ONE_RANK_OF_SEVERAL, REPLANNED, Envelope, EpochRows, elastic_summary, read_workers

if TYPE_CHECKING:
    from ..dataset import StructuredDataset


class MixtureKind:
    """A ``Mixture``'s loader state or merged checkpoint (``reads``: ``"mixture"``)."""

    reads: str = READS_MIXTURE

    def worker_states(self, outer: dict[str, Any], where: str) -> tuple[InnerState, list[MixWorkerState | None]]:
        inner = read_workers(Fields(outer, where).mapping("dataloader").value, outer["num_workers"],
                             f"{where}.dataloader", where)
        states: list[Any] = [
            None if s is None else read_canonical_worker(s, f"{where} worker {w}'s mixture state", READS_MIXTURE)
            if is_canonical(s) else _mixture_state(s, f"{where} worker {w}'s mixture state")
            for w, s in enumerate(inner.worker_states)]
        # the version each was saved in (its parser migrates it without saying)
        outer.setdefault("saved_state_versions", []).extend(
            s["version"] for s in inner.worker_states if isinstance(s, dict))
        return inner, states

    def worker_fields(self, state: MixWorkerState | CanonicalWorker | None) -> dict[str, Any]:
        if isinstance(state, CanonicalWorker):   # order="canonical": its canonical slots' rows of each source
            taken: dict[str, int] = {}
            for inner in state.state.states:
                for name, cursor in inner.cursors.items():
                    taken[name] = taken.get(name, 0) + cursor.taken
            return {"sources": taken, **state.fields()}
        return {"sources": {} if state is None else {n: c.taken for n, c in state.cursors.items()}}

    def rank_fields(self, outer: dict[str, Any], where: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
        names = dict.fromkeys(name for line in lines for name in line["sources"])
        fields: dict[str, Any] = {"sources": {name: sum(line["sources"].get(name, 0) for line in lines)
                                              for name in names}}
        if lines and "canonical_slots" in lines[0]:   # every worker gives its part of each of the rank's batches
            fields["batches"] = lines[0]["batches"]
        return fields

    def body(self, envelope: Envelope, ranks: list[dict[str, Any]], states: list[MixWorkerState | CanonicalWorker],
             dataset: StructuredDataset | None) -> dict[str, Any]:
        canonical = [s for s in states if isinstance(s, CanonicalWorker)]
        head_options = dict(canonical[0].options) if canonical else None
        if canonical:   # order="canonical": the mixture's sources as its canonical slots' states say them
            states = [inner for worker in canonical for inner in worker.state.states]
        mixture_states = [s for s in states if isinstance(s, MixWorkerState)]
        first = mixture_states[0] if mixture_states else None
        sources = {} if first is None else {
            name: {"quota": e.quota, "start": e.start, "rows": sum(r["sources"].get(name, 0) for r in ranks),
                   "data": dict(first.data[name])}
            for name, e in first.epochs.items()}
        epoch_rows = sum(s["quota"] for s in sources.values()) or None
        elastic = next((s.elastic for s in mixture_states if s.elastic is not None), None)
        saved = [v for outer in envelope.outers for v in outer.get("saved_state_versions", [])]
        return {
            "source": "mixture", "assignment": "static",
            "options": head_options if head_options is not None else {} if first is None else dict(first.options),
            "canonical": canonical_body(canonical, None) if canonical else None,
            "data": None,
            "elastic": None if elastic is None else elastic_summary(elastic),
            "column_names": None,
            "mixture": {"weights": {n: s["quota"] / epoch_rows for n, s in sources.items()} if epoch_rows else {},
                        "epoch_rows": epoch_rows, "sources": sources,
                        "history": [] if first is None else [[e, dict(q)] for e, q in first.history],
                        "replanned": elastic is not None,
                        "state_version": STATE_VERSION, "saved_state_version": min(saved, default=None)},
        }

    def epoch_rows(self, description: dict[str, Any], dataset: StructuredDataset | None, states: list[Any]) -> EpochRows:
        """A mixture's epoch is the sum of its quotas; a rank's part of it, that of its slots (one rank: all)."""
        ranks, total = description["ranks"], description["mixture"]["epoch_rows"]
        if description["elastic"] is not None:
            return EpochRows([None] * len(ranks), note=REPLANNED)
        if description["topology"]["world_size"] == 1:
            return EpochRows([total] * len(ranks))
        return EpochRows([None] * len(ranks), total, ONE_RANK_OF_SEVERAL)


def _mixture_state(raw: Any, where: str) -> MixWorkerState:
    state = read_worker_state(raw, where, READS_MIXTURE)
    assert isinstance(state, MixWorkerState), "read as a mixture's"
    return state


MIXTURE = MixtureKind()
