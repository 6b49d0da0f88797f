"""A mixture under ``order="canonical"``: its epochs laid out over the canonical slots, read side by side.

Each canonical slot ``c`` is a mixture slot of ``canonical_slots`` ranks without workers (rank ``c``), with batches
of ``chunk`` rows (``arrowstream._layout.canonical``): its quotas of every source, passes and positions are the
mixture's own, laid out for those slots (:class:`CanonicalLayout`: the mixture's epochs with the chunk as batch
size). So each source's rows in global batch ``k`` are fixed by the canonical sequence, whatever topology reads it.
:class:`CanonicalView` is the mixture as the checks of a canonical slot's state see it (``_state/mixture_resume``'s
``MixtureView``): the canonical layout, options and batch size, the rest the mixture's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._core.order import even_batch_limits
from .._layout.canonical import Canonical, check_canonical
from .._mixing.layout import History, MixEpochs, SourcePlan
from .._mixing.quotas import quotas_at
from .._mixing.stream import MixSlot
from .._planning.auto_buffer import auto_buffer_rows, row_bytes
from .._state.mixture import MixWorkerState, SourceCursor, SourceEpoch

if TYPE_CHECKING:
    from .._planning.options import Options
    from .._sources.mixture import Planned
    from .._state.canonical import SlotAt
    from .._state.mixture_resume import MixtureView


@dataclasses.dataclass
class CanonicalLayout:
    """A mixture's canonical order: its slots and chunk, the epochs laid out over them (made again when the mixture's
    own layout is), and a loaded checkpoint's canonical slots' states (``resume``, of epoch ``resume_epoch``)."""

    canonical: Canonical
    resume: dict[int, SlotAt] = dataclasses.field(default_factory=dict)
    resume_epoch: int = -1
    _made_for: Any = None
    _epochs: MixEpochs | None = None

    @classmethod
    def of(cls, slots: int, batch_size: int, world_size: int) -> CanonicalLayout:
        return cls(check_canonical(slots, batch_size, world_size))

    def options(self, options: Options, sources: Sequence[Planned]) -> Options:
        """The options a canonical slot reads with: batches of the chunk, the default buffer spread over the
        canonical slots (each holds a window of every source)."""
        canonical = self.canonical
        buffer = options.shuffle_buffer_size
        if options.auto_buffer and buffer:
            buffer = auto_buffer_rows(sum(row_bytes(s.plan) for s in sources) * canonical.slots, canonical.chunk,
                                      windows=canonical.slots * len(sources))
        return dataclasses.replace(options, batch_size=canonical.chunk, shuffle_buffer_size=buffer)

    def epochs(self, mixture_epochs: MixEpochs, options: Options, sources: Sequence[Planned]) -> MixEpochs:
        """The canonical slots' epochs, laid out again whenever the mixture's own are (``mixture_epochs``, made anew
        for new sources or options) or their pass layout changes."""
        key = (mixture_epochs, mixture_epochs.pass_layout)
        if self._epochs is None or self._made_for is None or self._made_for[0] is not key[0] \
                or self._made_for[1] != key[1]:
            inner = self.options(options, sources)
            self._epochs = MixEpochs([SourcePlan(s.name, s.plan.splits, s.plan.num_rows) for s in sources],
                                     shuffle=inner.shuffle, seed=inner.seed, batch_size=inner.batch_size,
                                     interleave=inner.interleave, buffer_rows=inner.shuffle_buffer_size,
                                     pass_layout=mixture_epochs.pass_layout)
            self._made_for = key
        return self._epochs

    def limits(self, epochs: MixEpochs, history: History, epoch: int, drop_last: bool) -> list[int]:
        """Each canonical slot's chunks in ``epoch`` (evened: every canonical slot the same)."""
        rows = [sum(q.values()) for q in epochs.slot_rows(history, epoch, self.canonical.slots, 0)]
        return even_batch_limits(rows, self.canonical.slots, self.canonical.chunk, drop_last)

    def forget(self) -> None:
        self.resume, self.resume_epoch = {}, -1


def inner_start(slot: MixSlot, options: dict[str, Any], history: History, starts: Mapping[str, int],
                data: Mapping[str, Any]) -> MixWorkerState:
    """Canonical slot ``slot``'s state before the first chunk of its epoch."""
    quotas = quotas_at(history, slot.epoch)
    return MixWorkerState(slot.epoch, slot.rank, slot.world_size, 0, 0, 0, 0, 0, False, options,
                          [(e, dict(q)) for e, q in history],
                          {name: SourceEpoch(starts[name], quotas.get(name, 0)) for name in starts},
                          {name: SourceCursor(0, None, 0) for name in starts}, dict(data), None)


class CanonicalView:
    """The mixture as a canonical slot's state is checked against (``MixtureView``): the canonical layout, its
    options and chunk, its state options; the rest is the mixture's."""

    def __init__(self, mixture: MixtureView, epochs: MixEpochs, options: Options,
                 state_options: dict[str, Any]) -> None:
        self._mixture, self._epochs, self._options, self._state_options = mixture, epochs, options, state_options

    @property
    def planned_sources(self) -> Any:
        return self._mixture.planned_sources

    @property
    def names(self) -> list[str]:
        return self._mixture.names

    @property
    def options(self) -> Options:
        return self._options

    @property
    def batch_size(self) -> int:
        return self._options.batch_size

    @property
    def history(self) -> History:
        return self._mixture.history

    @property
    def epochs(self) -> MixEpochs:
        return self._epochs

    @property
    def pass_layout(self) -> str:
        return self._mixture.pass_layout

    def quotas(self, epoch: int | None = None) -> dict[str, int]:
        return self._mixture.quotas(epoch)

    def state_options(self) -> dict[str, Any]:
        return dict(self._state_options)

    def use_pass_layout(self, pass_layout: str) -> None:
        self._mixture.use_pass_layout(pass_layout)

    def slot_totals(self, history: History, epoch: int, world_size: int, num_workers: int,
                    lacking: Mapping[str, int] | None = None) -> list[int]:
        rows = [sum(q.values()) for q in self._epochs.slot_rows(history, epoch, world_size, num_workers)]
        if lacking:
            from .._mixing.quotas import positions

            starts, in_effect = positions(history, epoch), quotas_at(history, epoch)
            for name, source_rows in lacking.items():
                per_slot = self._epochs.source_slot_rows(name, source_rows, starts[name], in_effect[name], len(rows))
                rows = [r + extra for r, extra in zip(rows, per_slot, strict=True)]
        return rows
