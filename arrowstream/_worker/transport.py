"""Worker-to-trainer transport: several batches per message, numbers in one buffer.

A ``StatefulDataLoader`` pays a fixed cost per item a worker sends (a queue round trip and a
state snapshot, about 0.2 ms here), and torch's default transport of a tensor passes one file
descriptor per tensor over a fresh socket (about 0.5 ms each). A 1,024-row batch of eleven
numeric columns would spend several milliseconds in transit for a fraction of that in decoding.

A :class:`Chunk` carries up to ``k`` consecutive batches of one worker; without a ``transform``,
as one converted span of their rows that the trainer slices into the batches (``sizes``). Every
tensor and numeric ndarray (on the CPU, not requiring grad, of a plain numeric dtype) is copied
once into one contiguous byte buffer; on arrival, the batches are rebuilt as zero-copy views of
that buffer. Arrow objects (batches, arrays, tables) ride in the same buffer as Arrow IPC
streams, which carry every Arrow type (pickle has no class for some, ``month_interval`` for one)
and arrive as zero-copy views too: without a ``transform``, columns of Python objects (strings,
lists) travel so, and the trainer makes their objects batch by batch as it hands the batches out
(``objects``, see :meth:`Chunk.finish`). Other values are pickled into the same buffer. The
buffer goes through the worker's shared-memory ring (see ``_ring``), or by value through the
loader's queue when there is no ring or no free slot fits it.

A chunk is packed by :meth:`Chunk.pack` in the worker's own thread, before the loader's queue
takes it: an error there reaches the trainer as a :class:`~arrowstream.errors.WorkerError`
naming the worker, the files and the value that could not be packed. What the queue's feeder
thread then pickles is plain data (numbers, bytes, one buffer) that cannot fail; an exception in
that thread would only be printed, and the batch lost.

Each batch also carries its worker's cursor, so the loader can checkpoint in the middle of a chunk.
"""

from __future__ import annotations

import io
import os
import pickle
import threading
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import get_worker_info

from .._core.cursor import Position
from .._core.values import GcPaused
from ..errors import ArrowStreamError, WorkerError
from . import ring as _ring
from .convert import finish_objects

# (batch index, key, "torch" | "numpy", dtype, shape, byte offset)
_Entry = tuple[int, str, str, np.dtype[Any], tuple[int, ...], int]


_TORCH_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                 torch.float32, torch.float64, torch.uint16, torch.uint32, torch.uint64}


def _packable(value: Any, numpy_as_torch: bool) -> tuple[np.ndarray, str] | None:
    """The array to copy into the chunk buffer and how to hand it back, or None to pickle ``value``."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf" or value.dtype.byteorder == ">":
            return None
        return np.ascontiguousarray(value), "torch" if numpy_as_torch else "numpy"
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu" or value.requires_grad or value.dtype not in _TORCH_DTYPES:
            return None
        return value.contiguous().numpy(), "torch"
    return None


ROWS_PER_TRANSFER = 16384  # default message size: ~0.2 ms of loader overhead spread over this many rows
MAX_BATCHES_PER_TRANSFER = 16


def default_batches_per_transfer(batch_size: int) -> int:
    """Batches per message so that one carries about ``ROWS_PER_TRANSFER`` rows (1 to 16)."""
    return max(1, min(MAX_BATCHES_PER_TRANSFER, ROWS_PER_TRANSFER // batch_size))


class Chunk:
    """Consecutive batches of one worker, packed for one trip through the loader's queue.

    ``numpy_as_torch``: the worker left numeric columns as ndarrays, and the trainer side
    turns them into tensors (``torch.from_numpy``, no copy), which saves a round trip.
    """

    def __init__(self, worker_id: int, batches: list[Any], positions: list[Any],
                 numpy_as_torch: bool = False, sizes: list[int] | None = None, objects: str | None = None,
                 files: Callable[[], list[str]] | None = None,
                 packed: tuple[list[_Entry], np.ndarray, list[Any] | int] | None = None) -> None:
        self.worker_id = worker_id
        self.positions = positions  # after each batch: a Position (a dataset's), or a mixture worker's state dict
        self.sizes = sizes  # set: ``batches`` is one span of these many rows per batch
        self.objects = objects  # set: Python objects are still Arrow, for this output format
        self.files = files  # the files this chunk's rows come from, asked only for an error message
        self._numpy_as_torch = numpy_as_torch
        self._batches: list[Any] | None = batches if packed is None else None   # packed: unpacked when asked
        self._packed = packed
        self._wire: tuple[Any, ...] | None = None  # what the queue sends, made by pack()
        # told (started, done) when the worker has collated and packed it: that time is converting, and the
        # worker's meter counts it so (never sent: the queue pickles only what pack() made)
        self.on_packed: Callable[[float, float], None] | None = None

    def __len__(self) -> int:
        return len(self.positions)

    def peek(self) -> Any:
        """The first batch, as the worker made it (before packing)."""
        assert self._batches is not None and self._wire is None, "peek runs before the chunk is packed"
        return self._batches[0]

    def map_batches(self, fn: Any) -> Chunk:
        """The same chunk with ``fn`` applied to each batch (in the worker, before packing)."""
        assert self._batches is not None and self._wire is None, "map_batches runs before the chunk is packed"
        return Chunk(self.worker_id, [fn(b) for b in self._finished(self._batches)], self.positions,
                     self._numpy_as_torch, files=self.files)

    def _layout(self) -> tuple[list[_Entry], list[np.ndarray], int, int]:
        """Entries, the byte views to pack in order, where the pickled rest starts, the total size."""
        assert self._batches is not None
        found: list[tuple[int, str, str, np.ndarray]] = []
        skeletons: list[Any] = []
        for index, batch in enumerate(self._batches):
            if not isinstance(batch, dict):
                skeletons.append(batch)
                continue
            skeleton = {}
            for key, value in batch.items():
                packable = _packable(value, self._numpy_as_torch)
                skeleton[key] = value if packable is None else None  # keeps the key order
                if packable is not None:
                    found.append((index, key, packable[1], packable[0]))
            skeletons.append(skeleton)
        # widest items first: every offset is then a multiple of its array's item size
        found.sort(key=lambda item: -item[3].dtype.itemsize)
        entries: list[_Entry] = []
        offset = 0
        for index, key, kind, array in found:
            entries.append((index, key, kind, array.dtype, array.shape, offset))
            offset += array.nbytes
        parts = [array.reshape(-1).view(np.uint8) for *_, array in found]
        # the rest rides in the same buffer: Arrow objects as IPC streams, then the pickle of
        # the skeletons, which the trainer unpickles with the garbage collector paused
        pickler = _Pickler(offset, parts)
        pickler.dump(skeletons)
        rest = np.frombuffer(pickler.file.getbuffer(), dtype=np.uint8)
        skeleton_offset = pickler.offset
        parts.append(rest)
        return entries, parts, skeleton_offset, skeleton_offset + rest.nbytes

    def pack(self) -> Chunk:
        """Serialize for the loader's queue, in the worker's own thread (see the module docstring).

        Into a slot of this worker's shared-memory ring, or by value when there is no ring or no
        free slot that fits. Raises :class:`~arrowstream.errors.WorkerError` naming what could not
        be packed.
        """
        if self._wire is None and self._packed is None:
            try:
                self._wire = self._serialize()
            except ArrowStreamError:
                raise
            except Exception as exc:
                raise WorkerError(_describe_failure(self, self._batches or [], exc)) from exc
        return self

    def _serialize(self) -> tuple[Any, ...]:
        entries, parts, skeleton_offset, nbytes = self._layout()
        # rings only from loader workers, whose chunks are pickled by the loader's queue alone
        ring = _ring.worker_ring(nbytes) if get_worker_info() is not None else None
        slot = ring.claim(nbytes) if ring is not None else None
        if ring is None or slot is None:
            return _rebuild, (self.worker_id, self.positions, entries, np.concatenate(parts), skeleton_offset,
                              self.sizes, self.objects)
        np.concatenate(parts, out=ring.view(slot, nbytes))
        announcement = ring.announcement()
        return _rebuild_from_ring, (self.worker_id, self.positions, entries, skeleton_offset, ring.id, os.getpid(),
                                    announcement, slot, ring.slot_bytes, nbytes, self.sizes, self.objects)

    def __reduce__(self) -> tuple[Any, ...]:
        """Runs in the worker's queue feeder thread: sends what :meth:`pack` made."""
        if self._packed is not None:
            return _rebuild, (self.worker_id, self.positions, *self._packed, self.sizes, self.objects)
        return self.pack()._wire  # type: ignore[return-value]

    def batches(self) -> list[Any]:
        """The batches, rebuilt as views of the received buffer."""
        if self._batches is None:
            assert self._packed is not None
            self._batches = _unpack(*self._packed)
        if self.sizes is not None:
            self._batches, self.sizes = _split(self._batches[0], self.sizes), None
        return self._batches

    def finish(self, batch: Any) -> Any:
        """One batch of :meth:`batches` as the user gets it: its Python objects made now.

        Made batch by batch as they are handed out, the objects die young; made for a whole
        chunk at once, they would outlive collections and push the collector into full sweeps.
        """
        return batch if self.objects is None else finish_objects(batch, self.objects)

    def _finished(self, batches: list[Any]) -> list[Any]:
        """Every batch, split and finished (for a collate_fn in the worker)."""
        if self.sizes is not None:
            batches, self.sizes = _split(batches[0], self.sizes), None
        if self.objects is not None:
            batches, self.objects = [finish_objects(b, self.objects) for b in batches], None
        return batches

    def pin_memory(self) -> Chunk:
        """Called by the loader's pin-memory thread: one pinned copy of the buffer for all batches."""
        if self._packed is None:
            return self
        from torch.utils.data._utils.pin_memory import pin_memory

        entries, buffer, skeletons = self._packed
        if isinstance(skeletons, int):
            skeletons = _loads_quietly(buffer, skeletons)
        pinned = torch.from_numpy(buffer).pin_memory().numpy()
        return _rebuild(self.worker_id, self.positions, entries, pinned,
                        pin_memory(skeletons), self.sizes, self.objects)  # type: ignore[no-untyped-call]


_IPC_ALIGNMENT = 64
_ARROW_KINDS = ((pa.RecordBatch, "batch"), (pa.Table, "table"), (pa.Array, "array"), (pa.ChunkedArray, "chunked"))


class _Pickler(pickle.Pickler):
    """Pickles into memory; Arrow objects go into ``parts`` as IPC streams from ``offset`` on."""

    def __init__(self, offset: int, parts: list[np.ndarray]) -> None:
        self.file = io.BytesIO()
        super().__init__(self.file, protocol=pickle.HIGHEST_PROTOCOL)
        self.offset = offset
        self.parts = parts

    def reducer_override(self, obj: Any) -> Any:
        for arrow_type, kind in _ARROW_KINDS:
            if isinstance(obj, arrow_type):
                return _arrow_from_ipc, self._write(kind, obj)
        return NotImplemented

    def _write(self, kind: str, obj: Any) -> tuple[str, int, int]:
        if kind == "array":
            obj = pa.RecordBatch.from_arrays([obj], ["_"])
        elif kind == "chunked":
            obj = pa.Table.from_arrays([obj], ["_"])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, obj.schema) as writer:
            writer.write(obj)
        data = np.frombuffer(sink.getvalue(), dtype=np.uint8)
        padding = -self.offset % _IPC_ALIGNMENT  # Arrow reads its buffers in place when they are aligned
        if padding:
            self.parts.append(np.zeros(padding, dtype=np.uint8))
        start = self.offset + padding
        self.parts.append(data)
        self.offset = start + data.nbytes
        return kind, start, data.nbytes


_reading = threading.local()  # the buffer whose pickle is being loaded (main or pin-memory thread)


def _arrow_from_ipc(kind: str, start: int, nbytes: int) -> Any:
    """An Arrow object of the chunk buffer being unpickled: zero-copy views of the buffer."""
    buffer: np.ndarray = _reading.buffer
    reader = pa.ipc.open_stream(pa.py_buffer(buffer[start:start + nbytes]))
    if kind in ("batch", "array"):
        batch = reader.read_next_batch()
        return batch if kind == "batch" else batch.column(0)
    table = reader.read_all()
    return table if kind == "table" else table.column(0)


def _loads_quietly(buffer: np.ndarray, offset: int) -> Any:
    """Unpickle the skeletons at ``offset`` of ``buffer``, with the cyclic garbage collector paused.

    A chunk's string and list columns unpickle into tens of thousands of objects; in a trainer
    that holds millions of objects, every few hundred allocations start a collection that walks
    them all (measured: 9.7 ms instead of 1.7 ms for one chunk of 8,192 rows).
    """
    previous = getattr(_reading, "buffer", None)
    _reading.buffer = buffer
    try:
        with GcPaused():
            return pickle.loads(buffer[offset:].data)
    finally:
        _reading.buffer = previous


def _describe_failure(chunk: Chunk, batches: list[Any], exc: BaseException) -> str:
    """What of ``batches`` (``chunk``'s) could not be packed, for the error: the value (column and type) and the
    files."""
    culprit = "a value"
    for batch in batches:
        items = batch.items() if isinstance(batch, dict) else [("", batch)]
        for key, value in items:
            if _packs(value):
                continue
            if isinstance(value, pa.RecordBatch):
                culprit = f"an Arrow batch with columns {[f'{f.name}: {f.type}' for f in value.schema]}"
            else:
                culprit = f"column {key!r} ({type(value).__module__}.{type(value).__qualname__})" if key \
                    else f"a {type(value).__module__}.{type(value).__qualname__}"
            break
        else:
            continue
        break
    files = ", ".join(chunk.files()) if chunk.files is not None else "(unknown)"
    return (f"DataLoader worker {chunk.worker_id} could not pack {culprit} to send it to the trainer "
            f"({type(exc).__name__}: {exc}); rows of {files}. The batch was not lost silently: make the "
            "transform return picklable values (tensors, arrays, lists, Arrow), or choose columns= "
            "without that column")


def _packs(value: Any) -> bool:
    try:
        _Pickler(0, []).dump(value)
    except Exception:  # noqa: BLE001 (only asks whether it packs; the caller reports the error)
        return False
    return True


def _unpack(entries: list[_Entry], buffer: np.ndarray, skeletons: list[Any] | int) -> list[Any]:
    decoded: list[Any] = _loads_quietly(buffer, skeletons) if isinstance(skeletons, int) else skeletons
    batches = [dict(s) if isinstance(s, dict) else s for s in decoded]
    for index, key, kind, dtype, shape, offset in entries:
        count = 1
        for dim in shape:
            count *= dim
        array = buffer[offset:offset + count * dtype.itemsize].view(dtype).reshape(shape)
        batches[index][key] = torch.from_numpy(array) if kind == "torch" else array
    return batches


def _split(span: Any, sizes: list[int]) -> list[Any]:
    """Batches of ``sizes`` rows out of one span: zero-copy slices of its columns."""
    out, start = [], 0
    for size in sizes:
        if isinstance(span, pa.RecordBatch):
            out.append(span.slice(start, size))
        else:
            out.append({key: value[start:start + size] for key, value in span.items()})
        start += size
    return out


def _rebuild_from_ring(worker_id: int, positions: list[Position], entries: list[_Entry], skeletons: int,
                       ring_id: int, owner_pid: int, announcement: bytes | None, slot: int, slot_bytes: int,
                       nbytes: int, sizes: list[int] | None, objects: str | None) -> Chunk:
    if announcement is not None:
        _ring.register(ring_id, owner_pid, ForkingPickler.loads(announcement))
    return _rebuild(worker_id, positions, entries, _ring.take(ring_id, slot, slot_bytes, nbytes), skeletons, sizes,
                    objects)


def _rebuild(worker_id: int, positions: list[Position], entries: list[_Entry], buffer: np.ndarray,
             skeletons: list[Any] | int, sizes: list[int] | None = None, objects: str | None = None) -> Chunk:
    return Chunk(worker_id, [], positions, sizes=sizes, objects=objects, packed=(entries, buffer, skeletons))
