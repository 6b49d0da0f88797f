"""The skips of ``loader.skip()`` in a loader state: what was skipped, and what is still to skip (pure).

Both keys are optional (absent: none), so a state without a skip is unchanged (docs/state-format.md,
"Skipped batches"):

* ``skips``: ``[{"epoch", "at_batch", "batches", "rows"}, ...]``, every skip done so far, in order;
  ``at_batch`` is the batches of the epoch the rank had handed out before it (as its workers count them);
* ``pending_skip``: batches asked for by ``skip()`` and not yet skipped (a checkpoint taken between
  ``skip()`` and the next batch); the loader that loads the state skips them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._core.fields import Fields, shorten
from ..errors import StateError

SKIPS = "skips"
PENDING_SKIP = "pending_skip"


@dataclass(frozen=True)
class Skip:
    """One skip done: in ``epoch``, after ``at_batch`` batches of it, ``batches`` batches of ``rows`` rows."""

    epoch: int
    at_batch: int
    batches: int
    rows: int

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "at_batch": self.at_batch, "batches": self.batches, "rows": self.rows}

    @classmethod
    def from_dict(cls, value: Any, where: str) -> Skip:
        fields = Fields(value, where)
        return cls(fields.integer("epoch"), fields.integer("at_batch"), fields.integer("batches", 1),
                   fields.integer("rows"))


def read_skips(outer: dict[str, Any], where: str = "loader state") -> tuple[list[Skip], int]:
    """The skips a loader state records and its pending skip (0: none); both keys optional (absent: none)."""
    fields = Fields(outer, where)
    done = [Skip.from_dict(entry, f"{where}.{SKIPS}[{index}]")
            for index, entry in enumerate(fields.sequence(SKIPS) if SKIPS in outer else [])]
    pending = fields.integer(PENDING_SKIP, 1) if PENDING_SKIP in outer else 0
    return done, pending


def pending_of(outers: list[dict[str, Any]]) -> tuple[list[Skip], int]:
    """The skips of the loader states of every old rank, re-planned for another topology: their pending skip,
    when they agree (each new rank skips it), and the first rank's record of those done."""
    read = [read_skips(outer, f"ranks[{index}]") for index, outer in enumerate(outers)]
    pendings = sorted({pending for _, pending in read})
    if len(pendings) > 1:
        raise StateError(f"the checkpoint's ranks have different pending skips ({shorten(pendings)} batches) and are "
                         "re-planned for another topology, where no rank stands for one of them; load it with the "
                         "topology it was taken with, or call loader.skip() again after loading")
    return read[0][0], pendings[0]

