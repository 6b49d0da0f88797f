"""mypy --strict on the package (STYLE: typed, py.typed shipped), ruff on everything."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_package_is_mypy_strict_clean():
    result = subprocess.run([sys.executable, "-m", "mypy", "arrowstream"], cwd=ROOT, capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_code_is_ruff_clean():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
