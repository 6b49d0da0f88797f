"""mypy --strict on the package (STYLE: typed, py.typed shipped), ruff on everything."""

from __future__ import annotations

import os
import re
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


def test_a_batch_alias_lets_mypy_check_a_training_loop(tmp_path):
    """A loader's batches are Any to mypy; declared as arrowstream.TorchBatch, `batch["x"]` is checked."""
    (tmp_path / "loop.py").write_text(
        "import arrowstream\n"
        "loader, dataset = arrowstream.StructuredDataset.create_dataloader(path='data/')\n"
        "batch: arrowstream.TorchBatch\n"
        "for batch in loader:\n"
        "    reveal_type(batch['x'])\n"
        "    batch['x'].no_such_method()\n"
        "numpy_batch: arrowstream.NumpyBatch = {'x': [1]}\n"
        "dict_batch: arrowstream.DictBatch = {'x': 1}\n")
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", str(tmp_path / "loop.py")], cwd=ROOT,
                            env={**os.environ, "MYPYPATH": ROOT}, capture_output=True, text=True, timeout=600,
                            check=False)
    found = {int(m.group(1)): line for line in result.stdout.splitlines() if (m := re.search(r"loop\.py:(\d+): ", line))}
    assert sorted(found) == [5, 6, 8], result.stdout   # line 7 is right; nothing of the loader is Any-only
    assert re.search(r'Revealed type is "torch\._tensor\.Tensor \| (builtins\.)?list\[Any\]"', found[5]), found[5]
    assert 'has no attribute "no_such_method"' in found[6] and "[dict-item]" in found[8]


def test_dir_of_the_package_is_its_public_api_and_submodules():
    import arrowstream
    import arrowstream.testing  # a public submodule, imported

    names = dir(arrowstream)
    assert not {"Any", "TYPE_CHECKING", "annotations", "importlib", "_LAZY"} & set(names), names
    assert set(arrowstream.__all__) <= set(names)
    assert not [name for name in names if name.startswith("_") and name != "__version__"], names
    assert "testing" in names and all(hasattr(arrowstream, name) for name in names)
