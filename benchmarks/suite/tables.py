"""The generated tables: seeded, written once into ``benchmarks/data/`` (git-ignored), reused.

* ``numeric``: 8 float32 columns ``f0..f7``, ``id`` (int64, the global row number, which
  identifies a batch after a resume), ``user`` (int64, random), ``label`` (int8).
* ``mixed``: the same plus ``name`` (a short string, 4 to 12 characters) and ``values``
  (``list<float32>``, 0 to 8 floats per row).

Each table is split into ``files`` Parquet files of about equal size (snappy, row groups of
``row_group_rows`` rows). A folder holds a ``_manifest.json`` with its parameters, so a later run
with the same parameters reuses it instead of writing it again.
"""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .common import BENCH_DIR, FLOAT_COLUMNS

DATA_ROOT = BENCH_DIR / "data"
KINDS = ("numeric", "mixed")
MANIFEST = "_manifest.json"  # "_": arrowstream skips it when it lists the folder
NAME_ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)


@dataclass(frozen=True)
class TableSpec:
    kind: str
    rows: int
    files: int
    row_group_rows: int
    seed: int

    @property
    def folder(self) -> Path:
        return DATA_ROOT / f"suite-{self.kind}-{self.rows}-f{self.files}-rg{self.row_group_rows}-s{self.seed}"


@dataclass(frozen=True)
class Table:
    """A written table: its files (in order) and facts for the report."""

    spec: TableSpec
    files: list[Path]
    bytes: int
    row_groups: int
    file_rows: list[int]

    @property
    def folder(self) -> Path:
        return self.spec.folder


def names(rng: np.random.Generator, rows: int) -> pa.Array:
    """Short random strings, 4 to 12 lowercase letters and digits."""
    lengths = rng.integers(4, 13, size=rows, dtype=np.int32)
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    chars = NAME_ALPHABET[rng.integers(0, len(NAME_ALPHABET), size=int(offsets[-1]))]
    return pa.StringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()))


def float_lists(rng: np.random.Generator, rows: int) -> pa.Array:
    """``list<float32>`` with 0 to 8 values per row."""
    lengths = rng.integers(0, 9, size=rows, dtype=np.int32)
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = rng.standard_normal(int(offsets[-1]), dtype=np.float32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def make_part(kind: str, rng: np.random.Generator, start: int, rows: int) -> pa.Table:
    columns: dict[str, pa.Array] = {name: pa.array(rng.standard_normal(rows, dtype=np.float32))
                                    for name in FLOAT_COLUMNS}
    columns["id"] = pa.array(np.arange(start, start + rows, dtype=np.int64))
    columns["user"] = pa.array(rng.integers(0, 1 << 40, size=rows, dtype=np.int64))
    columns["label"] = pa.array(rng.integers(0, 10, size=rows, dtype=np.int8))
    if kind == "mixed":
        columns["name"] = names(rng, rows)
        columns["values"] = float_lists(rng, rows)
    return pa.table(columns)


def load(spec: TableSpec) -> Table | None:
    """The table written earlier with the same parameters, or ``None``."""
    manifest = spec.folder / MANIFEST
    if not manifest.exists() or json.loads(manifest.read_text()) != asdict(spec):
        return None
    files = sorted(spec.folder.glob("part-*.parquet"))
    if len(files) != spec.files:
        return None
    return describe(spec, files)


def describe(spec: TableSpec, files: list[Path]) -> Table:
    metas = [pq.ParquetFile(path).metadata for path in files]
    return Table(spec, files, sum(p.stat().st_size for p in files), sum(m.num_row_groups for m in metas),
                 [m.num_rows for m in metas])


def write(spec: TableSpec) -> Table:
    """Write the table (files of about equal size; ids run on across files)."""
    if spec.kind not in KINDS:
        raise ValueError(f"unknown table kind {spec.kind!r}")
    if spec.folder.exists():
        shutil.rmtree(spec.folder)
    spec.folder.mkdir(parents=True)
    rng = np.random.default_rng([spec.seed, KINDS.index(spec.kind)])
    bounds = np.linspace(0, spec.rows, spec.files + 1).astype(np.int64).tolist()
    files = []
    for index, (start, stop) in enumerate(itertools.pairwise(bounds)):
        path = spec.folder / f"part-{index:03d}.parquet"
        pq.write_table(make_part(spec.kind, rng, start, stop - start), path,
                       row_group_size=spec.row_group_rows, compression="snappy")
        files.append(path)
    (spec.folder / MANIFEST).write_text(json.dumps(asdict(spec)))
    return describe(spec, files)


def ensure(spec: TableSpec) -> Table:
    """The table for ``spec``: reused when already written, else written now."""
    return load(spec) or write(spec)
