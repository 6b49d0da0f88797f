"""A mixture source whose file holds other row counts than its metadata announced is named, never cut short.

A mixture reads each source in parts (stretches of passes) whose rows are counted from metadata; a part ends where its
planned rows end. A unit that holds one row more than announced must still be read to its end (where the reader
checks its rows against the footer) instead of the part stopping one row early and the row being lost silently: each
part's runs are read to their end when it ends, and at the epoch's end. The fault is injected in the metadata read
(as a corrupt footer would say it); the reader then reads the real file.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowstream
import arrowstream._planning.plan as _planning
from arrowstream import errors


def lie_about(monkeypatch, file_rows: int, unit: int, delta: int) -> None:
    """Planning believes that ``unit`` of the file of ``file_rows`` rows holds ``delta`` rows more than it does."""
    read_footer = _planning.read_footer

    def lying(storage, file_format, entry, *args):
        footer = read_footer(storage, file_format, entry, *args)
        if sum(footer.unit_rows) != file_rows:
            return footer
        rows = list(footer.unit_rows)
        rows[unit] += delta
        return dataclasses.replace(footer, unit_rows=tuple(rows))

    monkeypatch.setattr(_planning, "read_footer", lying)
    monkeypatch.setattr(_planning, "_read_local", lambda *args: None)


def two_sources(tmp_path, small_rows: int, small_group: int) -> tuple[str, str]:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    pq.write_table(pa.table({"id": list(range(1300))}), a / "f.parquet", row_group_size=400)
    pq.write_table(pa.table({"id": list(range(10000, 10000 + small_rows))}), b / "g.parquet", row_group_size=small_group)
    return str(a), str(b)


@pytest.mark.parametrize("unit", [0, -1])
@pytest.mark.parametrize("delta", [1, -1])   # the unit holds one row less / more than announced
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_unit_with_other_rows_than_announced_is_named(tmp_path, monkeypatch, delta, unit, shuffle):
    """The last unit of a source read in order, one row more than announced, was cut short: 1,799 rows of 1,801."""
    a, b = two_sources(tmp_path, 500, 100)
    lie_about(monkeypatch, 1300, unit, delta)
    mixture = arrowstream.Mixture({"a": arrowstream.Source(a), "b": arrowstream.Source(b)}, batch_size=64,
                                  shuffle=shuffle, seed=1, plan_cache=False)
    loader = arrowstream.MixtureDataLoader(mixture)
    mixture.set_epoch(0)
    with pytest.raises(errors.CorruptFileError, match="f.parquet"):
        list(loader)


@pytest.mark.parametrize("delta", [1, -1])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_small_source_held_in_memory_is_checked_too(tmp_path, monkeypatch, delta, workers):
    """A small source read in many passes is read once and held: its units are checked when it is read."""
    a, b = two_sources(tmp_path, 50, 20)
    lie_about(monkeypatch, 50, -1, delta)
    mixture = arrowstream.Mixture({"a": arrowstream.Source(a), "b": arrowstream.Source(b)},
                                  weights={"a": 0.5, "b": 0.5}, batch_size=64, seed=1, plan_cache=False)
    loader = arrowstream.MixtureDataLoader(mixture, num_workers=workers)
    mixture.set_epoch(0)
    with pytest.raises(errors.CorruptFileError, match="g.parquet"):
        list(loader)
