"""Check that your own pipeline resumes exactly: :func:`check_resume`.

arrowstream's tests check exact resume for its own options; your pipeline adds a ``transform``, a
``collate_fn``, options and data of its own. :func:`check_resume` runs it the way a training job
does: an uninterrupted run, then, for each checkpoint point, a run interrupted there (its
``state_dict()`` passed through ``json`` and ``torch.save``) and a fresh loader resumed from it,
whose batches must equal the uninterrupted run's, byte for byte, to the end. The first difference
raises an ``AssertionError`` that says where (checkpoint, batch, epoch, worker, column, element).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ._assignment.static import StaticAssignment
from ._tools.batch_diff import first_difference, snapshot
from ._tools.fresh_process import check_importable, run_in_fresh_process
from .errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["ResumeReport", "check_resume"]

MakeLoader = Callable[[], Any]


@dataclass(frozen=True)
class ResumeReport:
    """What :func:`check_resume` checked; every checkpoint resumed exactly (else it raised).

    Attributes:
        points: Batches handed out before each checkpoint, in the order of the run (0: before
            the first batch).
        epoch_ends: Those of ``points`` taken after the loop over an epoch had ended (resumed with
            the next epoch number, as a loop that checkpoints at the end of each epoch stores it).
        num_batches: Batches of the uninterrupted run, all epochs.
        batches_compared: Batches of resumed runs compared with the uninterrupted run.
        epochs: Epochs of each run.
        fresh_process: Whether each resume ran in a new process.
        elapsed_s: Seconds the whole check took.
    """

    points: tuple[int, ...]
    epoch_ends: tuple[int, ...]
    num_batches: int
    batches_compared: int
    epochs: int
    fresh_process: bool
    elapsed_s: float

    def __repr__(self) -> str:
        # the checkpoint after an epoch's loop comes after the one inside it, at the same batch count
        ends = [p in self.epoch_ends and self.points[i + 1:i + 2] != (p,) for i, p in enumerate(self.points)]
        where = ", ".join(f"{p} (after the epoch's loop)" if end else str(p) for p, end in zip(self.points, ends))
        process = "each in a fresh process" if self.fresh_process else "in this process"
        checkpoints = "1 checkpoint" if len(self.points) == 1 else f"{len(self.points)} checkpoints"
        return (f"ResumeReport({checkpoints} resumed exactly, after batches {where} of "
                f"{self.num_batches} over {self.epochs} epochs; {self.batches_compared} batches compared, "
                f"{process}, in {self.elapsed_s:.1f} s)")


@dataclass(frozen=True)
class _Point:
    """A checkpoint: after ``batches`` batches of the run, in ``epoch``, inside the loop or after it."""

    batches: int
    epoch: int
    after_loop: bool = False

    @property
    def resume_epoch(self) -> int:
        """The epoch number stored with the state: the next one after the loop ended."""
        return self.epoch + 1 if self.after_loop else self.epoch

    def describe(self) -> str:
        if self.after_loop:
            return f"the checkpoint taken after the loop over epoch {self.epoch} ended (after batch {self.batches})"
        if self.batches == 0:
            return "the checkpoint taken before the first batch"
        return f"the checkpoint taken after batch {self.batches} (epoch {self.epoch})"


@dataclass(frozen=True)
class _Batch:
    """One batch of a run: its epoch, its step in the epoch, its worker (None: unknown), its values."""

    epoch: int
    step: int
    worker: int | None
    values: Any


def check_resume(make_loader: MakeLoader, points: int | Sequence[int] = 4, epochs: int = 2,
                 fresh_process: bool = False, at_epoch_ends: bool = True) -> ResumeReport:
    """Check that the loader ``make_loader()`` builds resumes exactly from checkpoints at many points.

    Runs ``epochs`` epochs uninterrupted (calling ``set_epoch``), then, for each point: a fresh
    loader runs the same loop up to the point (its batches must match too) and takes
    ``state_dict()``, which goes through ``json.dumps``/``json.loads`` and ``torch.save``/
    ``torch.load``; another fresh loader loads it and runs the rest of the loop. Every batch after
    the point must equal the uninterrupted run's: same keys, dtypes, shapes and bytes (tensors,
    ndarrays, Arrow batches, lists and nested dicts of them), in the same epochs, and as many.
    It costs one run of ``epochs`` epochs per checkpoint, plus one: use a small slice of your data.

    The loader's own errors (a ``StateMismatchError`` for a state it refuses, a worker's error) are
    raised as they are, with a note naming the checkpoint; with ``fresh_process=True``, as the new
    process raised them (a ``RuntimeError`` with their text if they cannot travel back).

    Args:
        make_loader: Builds the pipeline, with no arguments: returns what ``create_dataloader``
            returns, ``(loader, dataset)`` (or ``(loader, mixture)``), or a bare loader (its
            ``.dataset`` gets ``set_epoch``). Each call must build the same pipeline: same data,
            options, seed, transform. Use ``functools.partial`` to bind arguments.
        points: An int ``n``: a checkpoint before the first batch and ``n`` spread evenly over
            the run's batches. Or a list of batch counts (0 to the run's number of batches), each
            checkpoint taken inside the loop right after that many batches (0: before the first).
        epochs: Epochs of each run (at least 1); 2 or more also checks the epoch boundary.
        fresh_process: Resume in a new process (``multiprocessing`` spawn), as a restarted job
            does. ``make_loader`` must then be importable: a function defined at the top level of a
            module (or a ``functools.partial`` of one), not a lambda or a nested function.
        at_epoch_ends: Also a checkpoint after the loop over each epoch but the last has ended,
            resumed with the next epoch number (as a loop that checkpoints after each epoch stores it).

    Returns:
        A :class:`ResumeReport` of what was checked.

    Raises:
        AssertionError: A resumed run diverged from the uninterrupted one (the message names the
            checkpoint, the first batch that differs, its epoch and step, the worker that made it
            when the loader tells, and the column and element that differ), yielded another number
            of batches, or two loaders built by ``make_loader`` differed before any checkpoint; or
            the state did not survive ``json``.
        InvalidArgumentError: ``points`` or ``epochs`` is not valid, or ``fresh_process=True`` with
            a ``make_loader`` a new process cannot import.

    Example:
        >>> import functools, os, tempfile
        >>> import numpy as np, pyarrow as pa, pyarrow.parquet as pq, torch
        >>> from arrowstream import StructuredDataset
        >>> from arrowstream.testing import check_resume
        >>> folder = tempfile.mkdtemp()
        >>> pq.write_table(pa.table({"x": np.arange(1_000)}), os.path.join(folder, "part.parquet"),
        ...                row_group_size=100)
        >>> def add_noise(batch):   # deterministic: seeded by the batch's own content
        ...     rng = np.random.default_rng(int(batch["x"][0]))
        ...     return {**batch, "noisy": batch["x"] + torch.from_numpy(rng.normal(size=len(batch["x"])))}
        >>> make = functools.partial(StructuredDataset.create_dataloader, path=folder, batch_size=64,
        ...                          shuffle=True, seed=0, shuffle_buffer_size=300, transform=add_noise)
        >>> report = check_resume(make, points=3)
        >>> report.points, report.num_batches
        ((0, 8, 16, 16, 24), 32)
    """
    started = time.perf_counter()
    _check_arguments(make_loader, points, epochs, fresh_process, at_epoch_ends)
    reference = _uninterrupted_run(make_loader, epochs)
    plan = _plan_points(points, reference, epochs, at_epoch_ends)
    compared = 0
    # a checkpoint after some batches first: its interrupted run tells a make_loader that builds another
    # pipeline each call (a new seed) from a pipeline that does not resume
    for point in sorted(plan, key=lambda p: p.batches == 0):
        checkpoint = _interrupted_run(make_loader, reference, point)
        try:
            resumed = (run_in_fresh_process(_resumed_run, make_loader, checkpoint, epochs) if fresh_process
                       else _resumed_run(make_loader, checkpoint, epochs))
        except Exception as exc:  # the loader's own error (a refused state, a worker's error) stays what it is
            exc.add_note(f"check_resume: raised while resuming from {point.describe()}")
            raise
        compared += _compare_continuation(reference, point, resumed)
    return ResumeReport(
        points=tuple(point.batches for point in plan),
        epoch_ends=tuple(point.batches for point in plan if point.after_loop),
        num_batches=len(reference), batches_compared=compared, epochs=epochs, fresh_process=fresh_process,
        elapsed_s=time.perf_counter() - started)


def _check_arguments(make_loader: Any, points: Any, epochs: Any, fresh_process: Any, at_epoch_ends: Any) -> None:
    if not callable(make_loader):
        raise ArgumentTypeError(f"make_loader: expected a function that builds the loader, with no arguments "
                                f"(e.g. functools.partial(StructuredDataset.create_dataloader, ...)), got "
                                f"{type(make_loader).__name__}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise InvalidArgumentError(f"epochs: expected an int >= 1, got {epochs!r}")
    if isinstance(points, bool) or not isinstance(points, (int, Sequence)) or isinstance(points, str):
        raise InvalidArgumentError(f"points: expected an int (how many checkpoints to spread over the run) or a "
                                   f"list of batch counts, got {points!r}")
    if isinstance(points, int) and points < 0:
        raise InvalidArgumentError(f"points: expected an int >= 0 or a list of batch counts, got {points}")
    for name, flag in (("fresh_process", fresh_process), ("at_epoch_ends", at_epoch_ends)):
        if not isinstance(flag, bool):
            raise ArgumentTypeError(f"{name}: expected True or False, got {flag!r}")
    if fresh_process:
        check_importable("make_loader", make_loader)


def _build(make_loader: MakeLoader) -> tuple[Any, Any]:
    """``make_loader()`` as ``(loader, dataset)``: what it returned, or a bare loader and its dataset."""
    made = make_loader()
    if isinstance(made, tuple) and len(made) == 2 and _is_loader(made[0]):
        loader, dataset = made
    elif _is_loader(made):
        loader, dataset = made, made.dataset
    else:
        raise ArgumentTypeError(f"make_loader: expected it to return (loader, dataset) as create_dataloader does, or "
                                f"a loader with state_dict and load_state_dict, got {type(made).__name__}")
    if not callable(getattr(dataset, "set_epoch", None)):
        raise ArgumentTypeError(f"make_loader: the dataset it returned ({type(dataset).__name__}) has no set_epoch; "
                                "return (loader, dataset) as create_dataloader does")
    if loader.num_workers > 0 and (getattr(loader, "in_order", True) is False
                                   or not getattr(dataset, "policy", StaticAssignment).same_order):
        raise InvalidArgumentError(
            "make_loader: its loader hands out batches in an order that depends on timing (in_order=False or "
            "assignment='dynamic'; a resume yields exactly the rows not yet yielded, but not in one fixed order), so "
            "runs cannot be compared batch by batch; check the same pipeline with in_order=True and "
            "assignment='static'")
    return loader, dataset


def _is_loader(value: Any) -> bool:
    return all(callable(getattr(value, name, None)) for name in ("state_dict", "load_state_dict", "__iter__"))


def _worker_of_last_batch(loader: Any) -> int | None:
    """The worker that made the batch just handed out: 0 (the trainer's process) without workers, the
    worker of the chunk it came in with arrowstream's loaders, None when the loader does not tell."""
    if loader.num_workers == 0:
        return 0
    worker = getattr(loader, "last_batch_worker", None)   # arrowstream's loaders (StreamLoader)
    return worker if isinstance(worker, int) else None


def _stop_workers(loader: Any) -> None:
    """End the loader's workers now (a loop left early, or persistent workers), not at garbage collection."""
    shutdown = getattr(getattr(loader, "_iterator", None), "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def _uninterrupted_run(make_loader: MakeLoader, epochs: int) -> list[_Batch]:
    return _run(make_loader, None, 0, epochs)


def _run(make_loader: MakeLoader, state: dict[str, Any] | None, first_epoch: int, epochs: int) -> list[_Batch]:
    """A fresh loader, loaded with ``state`` if any, run from ``first_epoch`` to the last epoch."""
    loader, dataset = _build(make_loader)
    batches = []
    try:
        if state is not None:
            loader.load_state_dict(state)
        for epoch in range(first_epoch, epochs):
            dataset.set_epoch(epoch)
            for step, batch in enumerate(loader):
                batches.append(_Batch(epoch, step, _worker_of_last_batch(loader), snapshot(batch)))
    finally:
        _stop_workers(loader)
    return batches


def _plan_points(points: int | Sequence[int], reference: list[_Batch], epochs: int,
                 at_epoch_ends: bool) -> list[_Point]:
    """The checkpoints, in the order of the run."""
    total = len(reference)
    if isinstance(points, int):
        counts = [0, *sorted({round((i + 1) * total / (points + 1)) for i in range(points)} - {0, total})]
    else:
        counts = sorted(set(points))
        bad = [k for k in counts if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= total]
        if bad:
            raise InvalidArgumentError(f"points: expected batch counts from 0 to {total} (the uninterrupted run's "
                                       f"batches over {epochs} epochs), got {bad}")
    plan = [_Point(k, reference[k - 1].epoch if k else 0) for k in counts]
    if at_epoch_ends:
        ends = [index + 1 for index, batch in enumerate(reference)
                if batch.epoch < epochs - 1 and (index + 1 == total or reference[index + 1].epoch != batch.epoch)]
        plan += [_Point(k, reference[k - 1].epoch, after_loop=True) for k in ends]
    if not plan:
        raise InvalidArgumentError("points: no checkpoint to check (an empty list, and at_epoch_ends=False or a "
                                   "single epoch); give batch counts or an int")
    return sorted(plan, key=lambda p: (p.batches, p.after_loop))


def _interrupted_run(make_loader: MakeLoader, reference: list[_Batch], point: _Point) -> bytes:
    """The run up to ``point`` (its batches checked against the reference), and its checkpoint as the
    bytes ``torch.save`` writes, after the state went through JSON."""
    loader, dataset = _build(make_loader)
    try:
        state = _run_to(loader, dataset, reference, point)
    finally:
        _stop_workers(loader)
    checkpoint = {"loader": _through_json(state, point), "epoch": point.resume_epoch}
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.getvalue()


def _run_to(loader: Any, dataset: Any, reference: list[_Batch], point: _Point) -> Any:
    index = 0
    for epoch in range(point.epoch + 1):
        dataset.set_epoch(epoch)
        if index == point.batches and not point.after_loop:
            return loader.state_dict()   # before the first batch (or of an epoch that has none)
        for step, batch in enumerate(loader):
            got = _Batch(epoch, step, _worker_of_last_batch(loader), snapshot(batch))
            if index >= len(reference):
                raise AssertionError(f"check_resume: the run up to {point.describe()} yielded more than the "
                                     f"uninterrupted run's {len(reference)} batches; {_not_deterministic()}")
            _compare(reference[index], got, index, f"the run up to {point.describe()}", _not_deterministic())
            index += 1
            if index == point.batches and not point.after_loop:
                return loader.state_dict()
    if point.after_loop and index == point.batches:
        return loader.state_dict()
    raise AssertionError(f"check_resume: the run up to {point.describe()} yielded {index} batches up to it, the "
                         f"uninterrupted run {point.batches}; {_not_deterministic()}")


def _through_json(state: Any, point: _Point) -> Any:
    try:
        text = json.dumps(state)
    except (TypeError, ValueError) as exc:
        raise AssertionError(f"check_resume: the state of {point.describe()} is not JSON ({exc}); a loader state "
                             "must be plain JSON types") from exc
    loaded = json.loads(text)
    if loaded != state:
        raise AssertionError(f"check_resume: the state of {point.describe()} changes through json.dumps/json.loads "
                             "(a tuple, a non-string key?); a loader state must be plain JSON types")
    return loaded


def _resumed_run(make_loader: MakeLoader, checkpoint: bytes, epochs: int) -> list[_Batch]:
    """The canonical loop from a checkpoint: a fresh loader loads it and runs to the last epoch."""
    saved = torch.load(io.BytesIO(checkpoint), weights_only=True)
    return _run(make_loader, saved["loader"], saved["epoch"], epochs)


def _compare_continuation(reference: list[_Batch], point: _Point, resumed: list[_Batch]) -> int:
    """Check the resumed batches against the reference's after ``point``; how many were compared."""
    expected = reference[point.batches:]
    where = f"the run resumed from {point.describe()}"
    for offset, (want, got) in enumerate(zip(expected, resumed)):
        _compare(want, got, point.batches + offset, where, _not_resumable())
    if len(resumed) != len(expected):
        last = f"its last in epoch {resumed[-1].epoch}" if resumed else "none"
        raise AssertionError(f"check_resume: {where} yielded {len(resumed)} batches ({last}), the uninterrupted run "
                             f"{len(expected)} after that point (to batch {len(reference)} in epoch "
                             f"{reference[-1].epoch if reference else 0}); {_not_resumable()}")
    return len(expected)


def _compare(want: _Batch, got: _Batch, index: int, where: str, hint: str) -> None:
    """Raise the first difference between a batch and the reference's batch ``index`` (0-based)."""
    difference: str | None
    if want.epoch != got.epoch:
        difference = f"it came in epoch {got.epoch}, expected in epoch {want.epoch}"
    else:
        difference = first_difference(want.values, got.values)
    if difference is None:
        return
    raise AssertionError(f"check_resume: {where} diverged at batch {index + 1} of the run (batch {want.step + 1} of "
                         f"epoch {want.epoch}{_workers(want, got)}): {difference}; {hint}")


def _workers(want: _Batch, got: _Batch) -> str:
    if got.worker is None and want.worker is None:
        return ""
    if got.worker == want.worker:
        return f", from worker {got.worker}"
    return f", from worker {got.worker}, the uninterrupted run's from worker {want.worker}"


def _not_deterministic() -> str:
    return ("two loaders built by make_loader yield different batches, so no resume can match: does make_loader "
            "change its seed or options between calls, or does the transform or collate_fn draw unseeded randomness?")


def _not_resumable() -> str:
    return ("the pipeline does not resume exactly: randomness in a transform or collate_fn must come from the "
            "batch's own content or a seed fixed by make_loader, not from a generator whose position the "
            "checkpoint does not hold")
