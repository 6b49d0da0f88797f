"""What a slot reads of an epoch: the one question both fronts' epoch layouts answer, and the stream it opens.

A dataset lays its epochs out by its assignment policy (``_layout/layout.py``'s ``Epochs``: shares of whole splits,
LPT for static, or an epoch re-planned from ``Leftovers``); a mixture by quotas and passes (``_mixing/layout.py``'s
``MixEpochs``, with its history of quotas: ``MixEpochs.with_history``). The two policies differ by design (either
changed would change every existing checkpoint's order), so they are two answers to one question,
:class:`EpochLayouts`: for (slot, epoch), a :class:`SlotEpoch`, everything a slot's stream needs of its epoch. The
dataset's answer is one source over ``share_parts`` of its share. :func:`stream_of` opens the stream of such an
answer from a start (a dataset's ``DatasetStart``, a mixture's ``MixWorkerState``) and each source's readers: the one
way a slot's stream is built (``arrowstream._worker.open_slot`` for both fronts, ``share_stream`` for a share).
Opening is once per epoch; nothing here is on the per-batch path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from .source_rows import SourceRows
from .stream import MixSlot, MixStream, StreamStart

if TYPE_CHECKING:
    import pyarrow as pa

    from .._core.interleave import PieceReader
    from .._core.order import Slot
    from .._state.mixture import SourceCursor
    from .bulk import HeldSource
    from .parts import Parts
    from .source_rows import ReadAhead

P = TypeVar("P")
S = TypeVar("S")
S_co = TypeVar("S_co", covariant=True)


@dataclass(frozen=True)
class SourceParts:
    """One source's share of a slot's epoch: its name and its parts, in reading order (its quota: their rows)."""

    name: str
    parts: Parts

    @property
    def rows(self) -> int:
        """The rows the slot takes of this source in the epoch (its quota; with rows known only by reading, at most)."""
        return self.parts.rows


@dataclass(frozen=True)
class SlotEpoch:
    """Everything a slot's stream needs of its epoch, whichever front laid it out.

    ``slot``: the slot and epoch (seeds, states); ``sources``: each source's parts, in the order a batch takes them;
    ``max_batches``: the slot's ``even_batches`` limit (None: none); ``rows_known``: False when a filter (or
    ``bad_rows="skip"``) leaves rows out while reading, so each part's rows are an upper bound; ``batch_order``: how
    a mixture's batch orders its sources' rows (:data:`~arrowstream._state.mixture.BATCH_ORDERS`; None: one source
    after another); ``replanned``: the epoch is the rest of one of another topology (replays and row ranges), read
    with no read-ahead."""

    slot: MixSlot
    sources: tuple[SourceParts, ...]
    max_batches: int | None
    rows_known: bool = True
    batch_order: str | None = None
    replanned: bool = False

    @property
    def names(self) -> list[str]:
        return [source.name for source in self.sources]

    def parts(self, name: str) -> Parts:
        """The parts of source ``name``."""
        for source in self.sources:
            if source.name == name:
                return source.parts
        raise KeyError(name)


@runtime_checkable
class EpochLayouts(Protocol):
    """What a front's epoch layout answers: what ``slot`` reads in ``epoch`` (see :class:`SlotEpoch`)."""

    def slot_epoch(self, slot: Slot, epoch: int) -> SlotEpoch: ...


@dataclass(frozen=True)
class SourceReading:
    """How one source of a slot's epoch is read: its readers (one per interleaved lane), what its errors name
    (``url``), its read-ahead of remote splits (None: none) and, for a small source held in memory, the held rows."""

    readers: Sequence[PieceReader]
    url: str
    read_ahead: ReadAhead | None = None
    held: HeldSource | None = None


class OpenStart(StreamStart[P, S_co], Protocol):
    """What a stream starts from: a :class:`StreamStart` that says where each source stands."""

    @property
    def cursors(self) -> Mapping[str, SourceCursor]: ...


def stream_of(epoch: SlotEpoch, start: OpenStart[P, S], reading: Mapping[str, SourceReading], *, seed: int,
              batch_size: int, interleave: int, buffer_rows: int, drop_last: bool,
              cast: Callable[[str, pa.RecordBatch], pa.RecordBatch] | None = None, whole_cursors: bool = False,
              ends_when_asked: bool = False) -> MixStream[P, S]:
    """The stream of ``epoch`` from ``start``, each source read as ``reading`` says (by name).

    ``cast``: of each source's rows to one schema (None: as read); ``whole_cursors`` and ``ends_when_asked``: a
    dataset's positions and end (see :class:`SourceRows`, :class:`MixStream`). In a re-planned epoch each source's
    read-ahead is told to read nothing ahead (it may hold an earlier epoch's splits) and is not used."""
    sources = []
    for source in epoch.sources:
        how = reading[source.name]
        read_ahead = how.read_ahead
        if read_ahead is not None and epoch.replanned:   # replays and ranges of another topology
            read_ahead.begin(())
            read_ahead = None
        sources.append(SourceRows(source.name, how.readers, source.parts, batch_size=batch_size, interleave=interleave,
                                  buffer_rows=buffer_rows, start=start.cursors[source.name], url=how.url,
                                  read_ahead=read_ahead, held=how.held, rows_known=epoch.rows_known,
                                  whole_cursors=whole_cursors))
    return MixStream(sources, [source.rows for source in epoch.sources], cast=cast, batch_size=batch_size,
                     drop_last=drop_last, max_batches=epoch.max_batches, batch_order=epoch.batch_order, seed=seed,
                     slot=epoch.slot, start=start, ends_when_asked=ends_when_asked)
