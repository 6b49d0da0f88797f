"""The default record-level shuffle buffer: ``shuffle=True`` with ``shuffle_buffer_size`` left out.

Split-level shuffle alone leaves the rows of a row group together, so a batch holds consecutive rows;
users of HF ``datasets`` or MosaicML Streaming expect rows mixed. Left out (``None``, or ``"auto"``),
the buffer is sized by a memory budget per worker: :data:`BUDGET_BYTES` of decoded rows, the bytes per
row estimated from the plan's metadata, between :data:`MIN_BATCHES` batches and :data:`MAX_ROWS` rows.

The size is a pure function of the plan and the options (never of the machine's free memory): every
rank computes the same, and it is in each checkpoint's options, which a resume must match. A dataset
whose size was left out adopts a loaded checkpoint's size instead (:func:`adopted`), so a
checkpoint taken before this default (``shuffle_buffer_size`` 0) resumes exactly, in that epoch and
the later ones. An explicit size is compared as before.

No buffer by default when ``shuffle=False`` (the order is then the files'), nor with a filter (or
``bad_rows='skip'``): the rows a window holds are then unknown before reading, which dynamic
assignment and elastic resume inside a window refuse; a default must not make those fail.
See docs/shuffle.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from .options import Options
    from .plan import Plan

BUDGET_BYTES = 64 * 2**20  # decoded rows held per worker (its memory is about 2 to 3 times that: docs/shuffle.md)
MIN_BATCHES = 4  # a smaller window hardly moves rows across batches; with rows this large, batches dominate memory
MAX_ROWS = 1 << 17  # narrow rows: larger windows shuffle slower (a random gather out of cache; docs/shuffle.md)


def fixed_row_bytes(schema: pa.Schema) -> int:
    """Bytes per row of the fixed-width columns of ``schema`` (numbers, bools, timestamps, fixed-size lists);
    others count 0."""
    def width(kind: pa.DataType) -> float:
        if pa.types.is_fixed_size_list(kind):
            return float(kind.list_size * width(kind.value_type))
        try:
            return float(kind.bit_width) / 8
        except ValueError:   # strings, lists, structs: their width is in the data, not the schema
            return 0.0
    return int(sum(width(field.type) for field in schema))


def row_bytes(plan: Plan) -> float:
    """Decoded bytes per row, estimated from the files' metadata: the units' sizes (Parquet: uncompressed
    row groups of every column, so an overestimate with ``columns=``; text: bytes of text) over their
    rows, and at least the output schema's fixed widths (ORC stripes are sized compressed)."""
    rows = int(np.sum(plan.splits.num_rows))
    stored = float(np.sum(plan.splits.num_bytes)) / rows if rows else 0.0
    return max(stored, float(fixed_row_bytes(plan.schema)), 1.0)


def auto_buffer_rows(bytes_per_row: float, batch_size: int, windows: int = 1) -> int:
    """Rows of each of ``windows`` default buffers that a worker holds at once (a mixture's sources), for
    rows of ``bytes_per_row`` (the sum over the windows): the budget's worth, at most :data:`MAX_ROWS` in
    all, at least :data:`MIN_BATCHES` batches each (which then exceed the budget).

    Example:
        >>> auto_buffer_rows(50.0, 1024), auto_buffer_rows(1000.0, 1024), auto_buffer_rows(2**20, 32)
        (131072, 67108, 128)
        >>> auto_buffer_rows(150.0, 1024, windows=3)
        43690
    """
    return max(min(int(BUDGET_BYTES // bytes_per_row), MAX_ROWS // max(windows, 1)), MIN_BATCHES * batch_size)


def resolve_buffer(options: Options, plans: Sequence[Plan]) -> Options:
    """``options`` with the default buffer sized for ``plans`` (a dataset's one; a mixture's every source, whose
    windows a worker holds at once); unchanged when the size was given."""
    if not options.auto_buffer:
        return options
    if not options.shuffle or options.drops_rows:
        return dataclasses.replace(options, shuffle_buffer_size=0)
    rows = auto_buffer_rows(sum(row_bytes(plan) for plan in plans), options.batch_size, windows=len(plans))
    return dataclasses.replace(options, shuffle_buffer_size=rows)


def saved_buffer(saved_options: Any) -> int | None:
    """A checkpoint's ``shuffle_buffer_size`` when it is one (a bad value is refused by the state's checks)."""
    value = saved_options.get("shuffle_buffer_size") if isinstance(saved_options, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def adopted(options: Options, saved_options: Any) -> Options | None:
    """The options with a checkpoint's buffer size, when the size was left to the default and differs; None
    otherwise (an explicit size is compared with the checkpoint's as any option is)."""
    saved = saved_buffer(saved_options)
    if not options.auto_buffer or saved is None or saved == options.shuffle_buffer_size:
        return None
    return dataclasses.replace(options, shuffle_buffer_size=saved)
