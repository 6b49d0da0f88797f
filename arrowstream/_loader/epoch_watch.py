"""The warning when a loader reads a finished epoch again because ``set_epoch`` was not called.

The order of an epoch is a pure function of (data, seed, epoch, ...): a loop that never calls
``dataset.set_epoch(epoch)`` reads epoch 0 every time, the same batches in the same order, and
nothing fails. The loader's ``__iter__`` runs in the trainer's process and knows which epoch its
last iteration read and whether that iteration ran to its end (torchdata's iterator says so); when
the next one starts on that same epoch, and the order depends on the epoch, it warns once.

Not warned: an iteration that starts again before the end (``next(iter(loader))``, a loop left
with ``break``), the first iteration after ``load_state_dict`` (which drops torchdata's iterator),
and datasets whose order does not depend on the epoch (``shuffle=False`` and no buffer: the same
order every epoch, by design).
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import RepeatedEpochWarning


def dataset_order_varies(dataset: Any) -> bool:
    """Whether a ``StructuredDataset``'s epochs differ: shuffled splits, or rows in seeded windows."""
    options = dataset.options
    return bool(options.shuffle or options.shuffle_buffer_size)


def mixture_order_varies(mixture: Any) -> bool:
    """Whether a ``Mixture``'s epochs differ: shuffled, or a source whose quota is not all of its rows (each
    epoch then takes the rows after the last epoch's)."""
    if dataset_order_varies(mixture):
        return True
    quotas, rows = mixture.quotas(), mixture.source_rows()
    return any(quotas.get(name) and quotas[name] != rows[name] for name in rows)


class EpochWatch:
    """The epoch a loader's last iteration read, to warn once when a finished epoch starts again.

    ``what`` names the object whose ``set_epoch`` the warning asks for (``"dataset"``, ``"mixture"``).
    """

    def __init__(self, what: str) -> None:
        self._what = what
        self._epoch: int | None = None
        self._warned = False

    def starting(self, previous: Any, epoch: int, varies: bool) -> None:
        """An iteration of ``epoch`` starts; ``previous`` is torchdata's iterator of the last one (or None)."""
        finished = previous is not None and bool(getattr(previous, "_finished", False))
        if finished and epoch == self._epoch and varies and not self._warned:
            self._warned = True
            warnings.warn(RepeatedEpochWarning(
                f"the loader starts epoch {epoch} again: its last iteration read all of epoch {epoch}, and "
                f"{self._what}.set_epoch was not called with another epoch since, so this iteration repeats the "
                f"same batches in the same order. Call {self._what}.set_epoch(epoch) before each epoch: "
                f"`for epoch in range(num_epochs): {self._what}.set_epoch(epoch); for batch in loader: ...` "
                "(warned once per loader)"), stacklevel=3)
        self._epoch = epoch
