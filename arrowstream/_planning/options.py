"""Validation of the dataset's arguments, each error naming the argument and the fix."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._core.hashing import fingerprint
from .._core.plan_types import PLANNING_VERSION
from .._formats import TextSettings
from ..errors import ArgumentTypeError, InvalidArgumentError

TEXT_FORMATS = ("csv", "jsonl")
MAX_INTERLEAVE = 1024  # each open split holds a file and a decoded read: file handles and memory run out beyond


OUTPUT_FORMATS = ("torch", "numpy", "arrow", "dict")   # what a batch may be (arrowstream._worker.convert makes them)


AUTO = "auto"   # shuffle_buffer_size sized by memory (arrowstream._planning.auto_buffer)


def buffer_argument(value: Any) -> tuple[int, bool]:
    """``shuffle_buffer_size`` as given: ``(rows, False)`` for an int, ``(0, True)`` when left to the
    default (``None`` or ``"auto"``; the rows are set once the plan is known, :func:`resolve_buffer`)."""
    if value is None or (isinstance(value, str) and value == AUTO):
        return 0, True
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"shuffle_buffer_size: expected an int (rows), or None / 'auto' for a buffer sized "
                                f"by memory (the default), got {type(value).__name__} {value!r}")
    if value < 0:
        raise InvalidArgumentError(f"shuffle_buffer_size: must be >= 0 (0: split order only), got {value}")
    return value, False


@dataclass(frozen=True)
class Options:
    """The validated knobs of a dataset."""

    format: str
    batch_size: int
    shuffle: bool
    seed: int
    shuffle_buffer_size: int
    interleave: int
    columns: tuple[str, ...] | None
    filter: pc.Expression | None
    output_format: str
    transform: Callable[[Any], Any] | None
    drop_last: bool
    split_bytes: int | None
    fill_nulls: Any
    parse_options: TextSettings | None = None
    planning: int = PLANNING_VERSION  # how splits are cut for slots: a loaded checkpoint's version (_state.resume)
    # add _file and _row to every batch (arrowstream._core.row_ids); not in the state: it changes no row's place
    with_row_ids: bool = False
    auto_buffer: bool = False  # shuffle_buffer_size left out: sized by the plan, or a checkpoint's (auto_buffer)

    @property
    def drops_rows(self) -> bool:
        """Whether rows may be left out while reading (a filter, or bad text rows skipped), so that the rows
        each worker yields are unknown before reading."""
        return self.filter is not None or (self.parse_options is not None and self.parse_options.bad_rows == "skip")

    def state_options(self) -> dict[str, Any]:
        """The options that decide which rows come in which batch: they must match on resume."""
        return {
            "format": self.format,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "shuffle_buffer_size": self.shuffle_buffer_size,
            "interleave": self.interleave,
            "drop_last": self.drop_last,
            "split_bytes": self.split_bytes,
            "planning": self.planning,
            "columns": None if self.columns is None else fingerprint(list(self.columns))[:16],
            "filter": None if self.filter is None else fingerprint(str(self.filter))[:16],
            **({} if self.parse_options is None else {"parse_options": fingerprint(self.parse_options.state())[:16]}),
        }


def check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise InvalidArgumentError(f"{name}: must be >= {minimum}, got {value}")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name}: expected True or False, got {type(value).__name__} {value!r}")
    return value


def _interleave(value: Any) -> int:
    interleave = check_int("interleave", value, 1)
    if interleave > MAX_INTERLEAVE:
        raise InvalidArgumentError(
            f"interleave: at most {MAX_INTERLEAVE} splits open per worker, got {value}; each keeps a file open and "
            "a decoded read of up to 65,536 rows in memory. Lower interleave; shuffle_buffer_size mixes rows "
            "further at the cost of memory only")
    return interleave


def _filter(value: Any) -> pc.Expression | None:
    if value is None or isinstance(value, pc.Expression):
        return value
    if isinstance(value, Sequence) and not isinstance(value, str):
        try:
            return pq.filters_to_expression(value)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"filter: cannot read {value!r} as DNF filters ({exc})") from None
    raise ArgumentTypeError(
        f"filter: expected a pyarrow.compute.Expression such as pc.field('x') > 0 (or DNF tuples), "
        f"got {type(value).__name__}")


def _columns(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ArgumentTypeError(f"columns: expected a list of column names, got {type(value).__name__} {value!r}")
    if not value:
        raise InvalidArgumentError("columns: the list is empty; pass None to read every column")
    if not all(isinstance(c, str) for c in value):
        raise ArgumentTypeError(f"columns: every name must be a str, got {value!r}")
    if len(set(value)) != len(value):
        raise InvalidArgumentError(f"columns: names repeat in {value!r}")
    return tuple(value)


def validate_options(*, format: str, batch_size: int, shuffle: bool, seed: int, shuffle_buffer_size: Any,
                     interleave: int, columns: Any, filter: Any, output_format: str, transform: Any,
                     drop_last: bool, split_bytes: int | None, fill_nulls: Any,
                     parse_options: Any = None, with_row_ids: Any = False) -> Options:
    """Check every argument; raise an arrowstream error naming the first bad one. ``format`` is the
    source's, which checked it (``arrowstream._sources.files``)."""
    if output_format not in OUTPUT_FORMATS:
        raise InvalidArgumentError(
            f"output_format: unknown output format {output_format!r}; use one of {list(OUTPUT_FORMATS)}")
    if transform is not None and not callable(transform):
        raise ArgumentTypeError(f"transform: expected a callable, got {type(transform).__name__}")
    if split_bytes is not None:
        check_int("split_bytes", split_bytes, 1)
    if fill_nulls is not None and not isinstance(fill_nulls, (int, float, bool, Mapping)):
        raise ArgumentTypeError(f"fill_nulls: expected a number or a dict of column -> number, got {fill_nulls!r}")
    if parse_options is not None and format not in TEXT_FORMATS:
        raise InvalidArgumentError(f"parse_options: apply to format='csv' or 'jsonl', not {format!r}; leave it out")
    settings = TextSettings.from_user(format, parse_options) if format in TEXT_FORMATS else None
    buffer_rows, auto_buffer = buffer_argument(shuffle_buffer_size)   # auto: 0 until the plan sizes it
    return Options(
        format=format,
        batch_size=check_int("batch_size", batch_size, 1),
        shuffle=check_bool("shuffle", shuffle),
        seed=check_int("seed", seed, 0),
        shuffle_buffer_size=buffer_rows,
        interleave=_interleave(interleave),
        columns=_columns(columns),
        filter=_filter(filter),
        output_format=output_format,
        transform=transform,
        drop_last=check_bool("drop_last", drop_last),
        split_bytes=split_bytes,
        fill_nulls=fill_nulls,
        parse_options=settings,
        with_row_ids=check_bool("with_row_ids", with_row_ids),
        auto_buffer=auto_buffer,
    )


def check_storage_arguments(storage_options: Any, credential_provider: Any) -> None:
    """Refuse ``storage_options`` that are not a dict and a ``credential_provider`` that is not a callable."""
    if storage_options is not None and not isinstance(storage_options, dict):
        raise ArgumentTypeError(f"storage_options: expected a dict, got {type(storage_options).__name__}")
    if credential_provider is not None and not callable(credential_provider):
        raise ArgumentTypeError(f"credential_provider: expected a callable returning storage options, got "
                                f"{type(credential_provider).__name__}")


def check_even_batches(even_batches: Any, world_size: int, options: Options) -> bool:
    """Whether batches are evened out across ``world_size`` ranks: asked, and more than one reader of
    distinct data (with one there is nothing to even out); refused with a filter, which makes them unknown."""
    even = check_bool("even_batches", even_batches) and world_size > 1
    if even and options.drops_rows:
        raise InvalidArgumentError(
            f"even_batches: with world_size={world_size} and a filter (filter= or row_filter=, or "
            "parse_options bad_rows='skip'), the batches each rank yields "
            "are unknown before reading, so they cannot be evened out from metadata. Pass "
            "even_batches=False and keep ranks in step yourself (torch.distributed.algorithms.Join), "
            "or filter in transform= instead")
    return even
