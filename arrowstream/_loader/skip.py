"""``loader.skip(batches=n)``: pass over the next n batches (loss-spike surgery), counted and remembered.

The loader reads the n batches and throws them away before it hands out the next one: the workers decode
them as usual, so the cursor after the skip is exactly where an unskipped run would stand n batches later,
and every exactness promise of the cursor still holds (no cursor arithmetic). A skip reaching past the end
of the epoch ends the epoch there (a warning says how many batches were skipped); the rest of it is not
carried into the next epoch.

The loader state remembers the skips, done and pending (see ``arrowstream._state.skips``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

from .._core.fields import MAX_INT, shorten
from .._state.skips import PENDING_SKIP, SKIPS, Skip
from ..errors import ArgumentTypeError, InvalidArgumentError
from .torchdata_state import worker_states


def check_batches(batches: Any, pending: int = 0) -> int:
    """``skip``'s argument: an int of 0 or more that, with the ``pending`` skip it adds to, a state can hold
    (``pending_skip`` is a count of a state: at most 2**63 - 1, more batches than any epoch has)."""
    if isinstance(batches, bool) or not isinstance(batches, int):
        raise ArgumentTypeError(f"batches: skip() takes a number of batches as an int, got {type(batches).__name__} "
                                f"{shorten(batches)}")
    if batches < 0:
        raise InvalidArgumentError(f"batches: skip() passes over the next batches, so it takes 0 or more, got {batches}; "
                                   "to go back, load an earlier checkpoint")
    if batches > MAX_INT - pending:
        already = f" on top of the {pending} already asked for" if pending else ""
        raise InvalidArgumentError(
            f"batches: skip() takes at most {MAX_INT - pending} batch(es){already} (2**63 - 1 in all: what a checkpoint "
            f"records, and more than any epoch has), got {shorten(batches)}; a skip past the end of the epoch ends "
            "the epoch there, so skip(batches=len(loader)) skips all of it")
    return batches


def _consumed(state: dict[str, Any], epoch: int) -> tuple[int, int]:
    """(batches, rows) a rank's loader state has handed out in ``epoch`` (the one its loader iterates), as its
    workers count them (a dataset's worker state holds them in ``counters``, a mixture's at its top). Workers that
    stand in an earlier epoch (a loaded state at the end of one, before the first batch of the next) have handed
    out none of it."""
    states = [s for s in worker_states(state["dataloader"]) if isinstance(s, dict)]
    current = [s.get("counters", s) for s in states if s["epoch"] == epoch]
    return sum(int(c["batches"]) for c in current), sum(int(c["rows"]) for c in current)


class Skipper:
    """A loader's skips: the one asked for and not done yet, those done (saved in its state), and what this
    loader skipped itself (its metrics)."""

    def __init__(self) -> None:
        self.pending = 0
        self.done: list[Skip] = []
        self.skipped_batches = 0
        self.skipped_rows = 0

    def request(self, batches: Any) -> None:
        self.pending += check_batches(batches, self.pending)

    def state_fields(self) -> dict[str, Any]:
        """The keys a loader state gets (none when nothing was ever skipped: the state is unchanged)."""
        fields: dict[str, Any] = {}
        if self.done:
            fields[SKIPS] = [skip.to_dict() for skip in self.done]
        if self.pending:
            fields[PENDING_SKIP] = self.pending
        return fields

    def load(self, done: list[Skip], pending: int) -> None:
        self.done, self.pending = list(done), pending

    def metrics(self) -> dict[str, int]:
        return {"skipped_batches": self.skipped_batches, "skipped_rows": self.skipped_rows}

    def run(self, loader: Any, batches: Iterator[Any]) -> None:
        """Take the pending skip's batches from ``batches`` and throw them away, and record the skip. At the
        end of the epoch the skip ends (``StopIteration`` goes on to the caller)."""
        wanted, self.pending = self.pending, 0
        epoch = loader.dataset.epoch   # the epoch this iteration reads
        at_batch, rows_before = _consumed(loader.state_dict(), epoch)
        taken = 0
        try:
            for _ in range(wanted):
                next(batches)
                taken += 1
        except StopIteration:
            warnings.warn(f"loader.skip(batches={wanted}) reached the end of epoch {epoch} after {taken} "
                          "batch(es): the epoch ends there, and the rest of the skip is dropped (it does not "
                          "carry into the next epoch)", UserWarning, stacklevel=3)
            self._record(loader, epoch, at_batch, taken, rows_before)
            raise
        self._record(loader, epoch, at_batch, taken, rows_before)

    def _record(self, loader: Any, epoch: int, at_batch: int, batches: int, rows_before: int) -> None:
        """Record a skip of ``batches`` batches (none: nothing to record): its rows are what the workers'
        counters moved by since ``rows_before``."""
        if not batches:
            return
        skip = Skip(epoch, at_batch, batches, _consumed(loader.state_dict(), epoch)[1] - rows_before)
        self.done.append(skip)
        self.skipped_batches += skip.batches
        self.skipped_rows += skip.rows


class SkippingIterator:
    """The loader's iterator: its batches, after the pending skip (if any) has been taken out. Everything
    else is the wrapped iterator's (torchdata's, or the chunks' ``BatchIterator``): ``_inner``, ``_workers``."""

    def __init__(self, loader: Any, skipper: Skipper, batches: Iterator[Any]) -> None:
        self._loader, self._skipper, self._batches = loader, skipper, batches

    def __iter__(self) -> SkippingIterator:
        return self

    def __next__(self) -> Any:
        skipper = self._skipper
        if skipper.pending:
            skipper.run(self._loader, self._batches)
        return next(self._batches)

    def __len__(self) -> int:
        return len(self._batches)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batches, name)
