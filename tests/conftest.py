"""Shared fixtures: small generated Parquet datasets and the resume harness."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))

# seeded randomness only: property tests draw the same examples on every run (and in CI);
# HYPOTHESIS_PROFILE=explore draws new ones, to hunt for bugs locally
settings.register_profile("seeded", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "seeded"))

from helpers import write_dataset


@pytest.fixture
def uneven_dataset(tmp_path):
    """3 files, 3,130 rows, row groups of 250 / 400 / 120 rows: splits of unequal sizes."""
    return write_dataset(tmp_path / "uneven", [(1000, 250), (1530, 400), (600, 120)])


@pytest.fixture
def small_dataset(tmp_path):
    """2 files of 2 row groups each, 400 rows."""
    return write_dataset(tmp_path / "small", [(200, 100), (200, 100)])
