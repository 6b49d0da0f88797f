"""How a slot's rows become its batches, decided once per process: one record at a time, or a span at once.

A dataset's runtime and a mixture's opened epoch build the same :class:`Converters` with
:func:`make_converters`, and the worker iterator (:mod:`arrowstream._worker.iterator`) converts with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .convert import make_converter


@dataclass(frozen=True)
class Converters:
    """A slot's converters to the output format."""

    convert: Callable[[pa.RecordBatch], Any]   # one record batch to one batch, ``transform`` applied
    span_convert: Callable[[pa.RecordBatch], Any] | None   # a chunk's batches as one span (no ``transform``: else None)
    objects: str | None   # the output format a span's object columns are unpacked to by the trainer
    numpy_as_torch: bool   # numpy arrays that the trainer makes tensors of (see _transport)


def numpy_as_torch(output_format: str, transform: Callable[[Any], Any] | None, batches_per_transfer: int,
                   in_worker: bool) -> bool:
    """Whether a worker sends numpy arrays that the trainer makes tensors of (see ``_transport``)."""
    return in_worker and batches_per_transfer > 1 and transform is None and output_format == "torch"


def with_transform(converter: Callable[[Any], Any], transform: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    return converter if transform is None else (lambda batch: transform(converter(batch)))


def make_converters(output_format: str, schema: pa.Schema, fill_nulls: Any, transform: Callable[[Any], Any] | None,
                    *, batches_per_transfer: int, in_worker: bool) -> Converters:
    """The converters of batches of ``schema`` to ``output_format`` in this process (``in_worker``: a loader
    worker's), as the loader's transport sends them (``batches_per_transfer``)."""
    as_torch = numpy_as_torch(output_format, transform, batches_per_transfer, in_worker)
    made = "numpy" if as_torch else output_format   # the trainer side makes the tensors (see _transport)
    convert = with_transform(make_converter(made, schema, fill_nulls, in_worker=in_worker, torch_values=as_torch),
                             transform)
    # without a transform, a span's columns are converted at once; Python objects are made batch by batch
    span_convert = None if transform is not None else make_converter(
        made, schema, fill_nulls, in_worker=in_worker, objects_later=True, torch_values=as_torch)
    objects = output_format if output_format in ("torch", "numpy", "dict") else None
    return Converters(convert, span_convert, objects, as_torch)
