"""Import layers: the pure modules import no torch, no fsspec and no pyarrow file I/O.

The pure layer is planning, order and state arithmetic: value types, epoch order, cursors, shuffle
windows, interleaving, the epoch stream, elastic re-planning, state parsing. It must run (and be
tested) without a loader, a worker or a file system, so it may import only:

* the standard library and numpy;
* ``pyarrow`` itself and ``pyarrow.compute``: in-memory arrays, types, record batches and compute
  expressions (the rows the layer moves are Arrow batches, a filter is an Expression); ``import
  pyarrow`` loads ``pyarrow.ipc`` on its own, so that module cannot be refused by what is loaded,
  only by what the pure modules themselves import (the second test);
* ``arrowstream.errors`` and the other pure modules.

Refused: torch and torchdata, fsspec, and pyarrow's file and format I/O (parquet, ORC, datasets,
CSV, JSON, Feather, IPC, file systems, Flight). Imports under ``if TYPE_CHECKING:`` are for type
hints only and never run, so they are free.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

import arrowstream

PURE_MODULES = [
    "_plan_types",    # Split
    "_piece",         # Piece
    "_hashing",       # seeds, permutations, fingerprint
    "_fields",
    "_order",
    "_cursor",        # Cursor, Run, Position
    "_window",
    "_interleave",
    "_stream",
    "_state",
    "_position",
    "_elastic",
    "_boundary",
    "_loader_state",
    "errors",
    # the epoch layout module of issue #18 point 2 joins here
]

REFUSED_PACKAGES = ("torch", "torchdata", "fsspec")
REFUSED_PYARROW = ("pyarrow.parquet", "pyarrow._parquet", "pyarrow.orc", "pyarrow._orc", "pyarrow.dataset",
                   "pyarrow._dataset", "pyarrow.csv", "pyarrow._csv", "pyarrow.json", "pyarrow._json",
                   "pyarrow.feather", "pyarrow.fs", "pyarrow._fs", "pyarrow.flight", "pyarrow._flight")
REFUSED_DIRECTLY = ("pyarrow.ipc",)   # loaded by ``import pyarrow``, but no pure module may use it itself

PACKAGE_DIR = os.path.dirname(arrowstream.__file__)

# the package is a bare namespace here: arrowstream/__init__.py imports the loader (and so torch)
_PROBE = """
import importlib, json, sys, types
package = types.ModuleType("arrowstream")
package.__path__ = [sys.argv[1]]
sys.modules["arrowstream"] = package
importlib.import_module("arrowstream." + sys.argv[2])
print(json.dumps(sorted(sys.modules)))
"""


def _refused(module: str, also: tuple[str, ...] = ()) -> bool:
    return module.split(".")[0] in REFUSED_PACKAGES or any(
        module == name or module.startswith(name + ".") for name in (*REFUSED_PYARROW, *also))


def _loaded_by(module: str) -> list[str]:
    """Every module in ``sys.modules`` after importing ``arrowstream.<module>`` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", _PROBE, PACKAGE_DIR, module], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout)
    return loaded


@pytest.mark.parametrize("module", PURE_MODULES)
def test_a_pure_module_loads_no_torch_fsspec_or_pyarrow_io(module):
    loaded = _loaded_by(module)
    assert "arrowstream.dataset" not in loaded   # the package's __init__ was left out, as it must be here
    refused = sorted({m if m.startswith("pyarrow") else m.split(".")[0] for m in loaded if _refused(m)})
    outside = [m for m in loaded if m.startswith("arrowstream.") and m.removeprefix("arrowstream.") not in PURE_MODULES]
    assert not refused and not outside, (
        f"importing arrowstream.{module} loads {refused} (refused in the pure layer) and the arrowstream modules "
        f"{outside}, which are outside it; import the value type from a pure module (move it there if need be) "
        "or under `if TYPE_CHECKING:` when it is only a type hint")
    assert f"arrowstream.{module}" in loaded   # the probe imported the module itself, not a namesake


def _imports(tree: ast.Module) -> list[tuple[int, str, int]]:
    """(line, module, relative level) of every import that runs: at the top, in functions, anywhere but
    under ``if TYPE_CHECKING:``."""
    found: list[tuple[int, str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 0:   # `from pyarrow import ipc` imports pyarrow.ipc
                found.extend((node.lineno, f"{base}.{alias.name}", 0) for alias in node.names)
                found.append((node.lineno, base, 0))
            elif base:
                found.append((node.lineno, base, node.level))
            else:                  # `from . import _order`
                found.extend((node.lineno, alias.name, node.level) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_pure_modules_import_nothing_refused_even_lazily_inside_functions():
    wrong = []
    for module in PURE_MODULES:
        path = os.path.join(PACKAGE_DIR, *module.split(".")) + ".py"
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for line, name, level in _imports(tree):
            if level == 0 and _refused(name, REFUSED_DIRECTLY):
                wrong.append(f"arrowstream/{module}.py:{line} imports {name}")
            elif level == 1 and name not in PURE_MODULES:
                wrong.append(f"arrowstream/{module}.py:{line} imports arrowstream.{name}, outside the pure layer")
            elif level > 1:
                wrong.append(f"arrowstream/{module}.py:{line} imports from a parent package")
    assert not wrong, ("pure modules reach outside their layer (import the type from a pure module, or under "
                       f"`if TYPE_CHECKING:` for a type hint): {wrong}")

