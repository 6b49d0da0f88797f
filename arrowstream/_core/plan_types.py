"""The value types of a plan that every layer shares: a file of the listing, a split, the splits as columns.

Pure: numpy, no I/O, no torch, no fsspec (``tests/test_layers.py`` checks it). :mod:`arrowstream._planning.plan`
builds these from the files' metadata and re-exports them.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, overload

import numpy as np
import numpy.typing as npt
from numpy.typing import ArrayLike

if TYPE_CHECKING:
    import pyarrow as pa

PLANNING_VERSION = 2
"""How splits are cut for a number of slots (``arrowstream._planning.plan.REFINERS``): recorded in every worker
state (``options.planning``), so that a checkpoint keeps the layout it was taken in. 1: row groups cut into
ranges of about ``rows // slots`` (state versions up to 5); 2: cut so that every slot has ``rows // slots``
rows or one more."""
PLANNING_VERSIONS = (1, 2)


@dataclass(frozen=True, slots=True)
class Split:
    """Rows ``[row_start, row_start + num_rows)`` of the units ``[unit_start, unit_stop)`` of one file
    (row groups, stripes, record batches); ``row_start`` counts from the first row of ``unit_start``."""

    file_index: int
    unit_start: int
    unit_stop: int
    row_start: int
    num_rows: int
    num_bytes: int


_COLUMNS = ("file_index", "unit_start", "unit_stop", "row_start", "num_rows", "num_bytes")


class SplitTable(Sequence[Split]):
    """Splits as six int64 columns: what a plan of a million units holds instead of a million objects.

    It reads as the list of :class:`Split` it replaces (``len``, an index, a slice, iteration and ``==``
    make ``Split`` values on demand), so the pure layers take either; hot paths read the columns
    (``num_rows`` ...) and :meth:`take` picks rows without building a ``Split``. It pickles as six arrays.

    Example:
        >>> table = SplitTable.from_splits([Split(0, 0, 1, 0, 100, 800), Split(1, 0, 2, 0, 50, 400)])
        >>> len(table), table[1], int(table.num_rows.sum())
        (2, Split(file_index=1, unit_start=0, unit_stop=2, row_start=0, num_rows=50, num_bytes=400), 150)
    """

    __slots__ = _COLUMNS

    file_index: npt.NDArray[np.int64]
    unit_start: npt.NDArray[np.int64]
    unit_stop: npt.NDArray[np.int64]
    row_start: npt.NDArray[np.int64]
    num_rows: npt.NDArray[np.int64]
    num_bytes: npt.NDArray[np.int64]

    def __init__(self, file_index: ArrayLike, unit_start: ArrayLike, unit_stop: ArrayLike, row_start: ArrayLike,
                 num_rows: ArrayLike, num_bytes: ArrayLike) -> None:
        columns = [np.ascontiguousarray(c, dtype=np.int64) for c in
                   (file_index, unit_start, unit_stop, row_start, num_rows, num_bytes)]
        if any(c.ndim != 1 or len(c) != len(columns[0]) for c in columns):
            raise ValueError(f"split columns must be 1-D of one length, got shapes {[c.shape for c in columns]}")
        for name, column in zip(_COLUMNS, columns, strict=True):
            column.flags.writeable = False   # shared by every layout and worker: never changed in place
            object.__setattr__(self, name, column)

    @classmethod
    def from_splits(cls, splits: Iterable[Split]) -> SplitTable:
        """The table of ``splits`` (a table is returned as it is)."""
        if isinstance(splits, SplitTable):
            return splits
        rows = [(s.file_index, s.unit_start, s.unit_stop, s.row_start, s.num_rows, s.num_bytes) for s in splits]
        array = np.array(rows, dtype=np.int64).reshape(len(rows), len(_COLUMNS))
        return cls(*array.T)

    def columns(self) -> tuple[npt.NDArray[np.int64], ...]:
        return tuple(getattr(self, name) for name in _COLUMNS)

    def take(self, indices: ArrayLike) -> SplitTable:
        """The splits at ``indices`` (any integer array), in that order."""
        picked = np.asarray(indices, dtype=np.int64)
        return SplitTable(*(column[picked] for column in self.columns()))

    def __len__(self) -> int:
        return len(self.file_index)

    @overload
    def __getitem__(self, index: int) -> Split: ...

    @overload
    def __getitem__(self, index: slice) -> SplitTable: ...

    def __getitem__(self, index: int | slice) -> Split | SplitTable:
        if isinstance(index, slice):
            return SplitTable(*(column[index] for column in self.columns()))
        position = operator.index(index)
        if not -len(self) <= position < len(self):
            raise IndexError(f"split index {position} out of range for {len(self)} splits")
        return Split(*(int(column[position]) for column in self.columns()))

    def __iter__(self) -> Iterator[Split]:
        for values in zip(*(column.tolist() for column in self.columns()), strict=True):
            yield Split(*values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SplitTable):
            return len(self) == len(other) and all(
                np.array_equal(a, b) for a, b in zip(self.columns(), other.columns(), strict=True))
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking sequence semantics, as the list it replaces

    def __repr__(self) -> str:
        return f"SplitTable({len(self)} splits, {int(self.num_rows.sum())} rows)"

    def __getstate__(self) -> tuple[npt.NDArray[np.int64], ...]:
        return self.columns()

    def __setstate__(self, state: tuple[npt.NDArray[np.int64], ...]) -> None:
        SplitTable.__init__(self, *state)


def split_available(splits: Sequence[Split], index: int) -> bool:
    """Whether ``splits`` has a split ``index``. Splits leased as they are read (dynamic assignment: a
    sequence with ``lease_through(i)``) lease up to it first; a plain sequence has what it has."""
    if index < len(splits):
        return True
    lease_through = getattr(splits, "lease_through", None)
    return lease_through is not None and bool(lease_through(index))


def split_rows(splits: Sequence[Split]) -> npt.NDArray[np.int64]:
    """The rows of each split, from the column when ``splits`` is a table."""
    if isinstance(splits, SplitTable):
        return splits.num_rows
    return np.fromiter((s.num_rows for s in splits), dtype=np.int64, count=len(splits))


@dataclass(frozen=True)
class FileEntry:
    """One data file: its filesystem path, a portable name, size and modification tag.

    ``version`` is what reads are pinned to (see ``arrowstream._storage.pinned``): the ETag on S3 and Azure,
    the generation on GCS, the modification time of a local file; "" where the listing gave none. It
    is not in the data fingerprint (``tag`` is), which stays what checkpoints of earlier releases hold.

    ``inode`` and ``changed_ns`` (a local file's ``st_ino`` and ``st_ctime_ns``; 0 elsewhere) are what
    ``os.utime`` cannot restore: the plan cache compares them, so that a file rewritten with its size
    and modification time kept is not planned from the footers of the file it was. They are in no
    fingerprint (a ``chmod``, a hard link or a copy changes them, not the data), pin no read, and are
    not kept in a plan (whose entries have 0): entries compare without them.
    """

    path: str
    name: str
    size: int
    tag: str
    version: str = ""
    inode: int = field(default=0, compare=False)
    changed_ns: int = field(default=0, compare=False)


class PlanFiles(Protocol):
    """What the pure layers read of a plan's files (``arrowstream._formats.footers.FooterTable``): a column per fact."""

    @property
    def names(self) -> pa.Array: ...

    @property
    def sizes(self) -> npt.NDArray[np.int64]: ...

    @property
    def unit_offsets(self) -> npt.NDArray[np.int64]: ...

    @property
    def unit_rows(self) -> npt.NDArray[np.int64]: ...


class PlanView(Protocol):
    """What the pure layers read of a plan (``arrowstream._planning.plan.Plan``, which planning builds): its files,
    its splits (cut for a number of slots as a planning version cuts them), its schema and identity."""

    @property
    def files(self) -> PlanFiles: ...

    @property
    def splits(self) -> SplitTable: ...

    @property
    def schema(self) -> pa.Schema: ...

    @property
    def identity(self) -> dict[str, Any]: ...

    @property
    def num_rows(self) -> int: ...

    def splits_for(self, num_slots: int, planning: int = PLANNING_VERSION) -> SplitTable: ...

    def url(self, file_index: int) -> str: ...


class OrderOptions(Protocol):
    """What the pure layers read of a dataset's options (``arrowstream._planning.options.Options``): how rows are ordered
    and cut into batches."""

    @property
    def batch_size(self) -> int: ...

    @property
    def drop_last(self) -> bool: ...

    @property
    def drops_rows(self) -> bool: ...

    @property
    def interleave(self) -> int: ...

    @property
    def planning(self) -> int: ...

    @property
    def seed(self) -> int: ...

    @property
    def shuffle(self) -> bool: ...

    @property
    def shuffle_buffer_size(self) -> int: ...
