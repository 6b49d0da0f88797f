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
    "_identity",      # what a loaded checkpoint must match of the data (data_identity)
    "_position",
    "_elastic",
    "_boundary",
    "_loader_state",
    "errors",
    "_layout",        # the epoch layout: every slot's share and limit (issue #18 point 2)
    "_resume",        # resume checks of the dataset: a loaded state against the plan, elastic re-planning
    "_mix_plan",      # a mixture's quotas, passes, slots' segments and batch shares
    "_mix_stream",    # a mixture slot's batches and its state
    "_mix_span",      # a mixture span's rows cut per batch
    "_take",          # gathering rows by index for every type (view types as their large counterparts)
    "_mix_resume",    # a mixture's state checks and following a checkpoint
    "_mix_position",  # a mixture worker state's counters and cursors checked against the plan
    "_mix_schema",    # one schema for a mixture's sources
    "_nullability",   # types that differ only in nullability joined (a dataset's files, a mixture's sources)
    "_mix_elastic",   # a mixture epoch re-planned for another topology
    "_mix_layout",    # a mixture's epochs: every slot's parts of every source
    "_mix_state",     # a mixture worker's state
    "_mix_parts",     # a slot's parts of a source in an epoch, without walking them
    "_mix_bulk",      # a held source's parts read whole: their rows' order and cursors
    "_trims",         # what even_batches trims of an epoch, and the warning
    "_skip_state",    # the skips of loader.skip() in a loader state
    "_dynamic",       # dynamic assignment: a rank's work, its leases, a worker's stream over them, the ledger
    "_ledger_rows",   # the rows a dynamic ledger leaves, checked against the plan (positions, never rows)
    "_row_ids",       # with_row_ids: the _file and _row columns added as rows are decoded
    "_auto_buffer",   # the default shuffle buffer: sized from the plan, or a loaded checkpoint's
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


@pytest.mark.timeout(90)
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


@pytest.mark.timeout(90)
def test_the_probe_sees_what_an_impure_module_loads():
    # the reader does I/O: loading it is what the pure modules must not do (a check that cannot pass vacuously)
    refused = {m.split(".")[0] for m in _loaded_by("_reader") if _refused(m)}
    assert {"torch", "fsspec"} <= refused


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


# -- format knowledge stays in arrowstream/_formats/ and the sources that own them (files: _source.py; Iceberg) -----

FORMAT_NAMES = {"parquet", "orc", "arrow", "ipc", "feather", "csv", "jsonl", "json", "iceberg"}
FORMAT_INTERNALS = {"TextFormat", "ParquetFormat", "OrcFormat", "IpcFormat", "IcebergFormat", "TextFile", "TextLayout",
                    "ROW_OK"}
PROTOCOL_MEMBERS = {"configured", "inspect", "reconcile", "row_ok_column", "baseline_batches", "byte_ranges",
                    "physical_rows"}
FORMAT_OWNERS = ("_formats/", "_source.py", "_iceberg_source.py", "_iceberg.py", "iceberg.py")

# what is left, each to be removed from here by the change that removes it (the test fails on a stale entry too)
KNOWN_LEAKS: set[tuple[str, str]] = set()


def _names_a_format(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and node.value in FORMAT_NAMES:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for elt in node.elts for n in _names_a_format(elt)]
    return []


def _is_format(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "format") or (isinstance(node, ast.Attribute)
                                                                     and node.attr == "format")


def format_knowledge(tree: ast.Module) -> set[str]:
    """What a module outside the formats knows of them: comparisons of a ``format`` with format names,
    tables keyed by format names, the formats' own classes and constants, ``getattr`` on protocol members."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_format(side) for side in sides):
                found.update(f"compares a format with {name!r}" for side in sides for name in _names_a_format(side))
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if k is not None]
            if len(keys) > 1 and all(_names_a_format(k) for k in keys):
                found.add("dispatches on format names (a dict keyed by them)")
        elif isinstance(node, ast.Name) and node.id in FORMAT_INTERNALS:
            found.add(f"names {node.id}")
        elif isinstance(node, ast.alias) and node.name in FORMAT_INTERNALS:
            found.add(f"names {node.name}")
        elif isinstance(node, ast.Attribute) and node.attr in FORMAT_INTERNALS:
            found.add(f"names {node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in PROTOCOL_MEMBERS):
            found.add(f"asks {node.func.id}(..., {node.args[1].value!r}) instead of the format protocol")
    return found


def test_format_knowledge_stays_in_the_formats():
    leaks = set()
    for folder, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, PACKAGE_DIR).replace(os.sep, "/")
            if not name.endswith(".py") or relative.startswith(FORMAT_OWNERS) or relative in FORMAT_OWNERS:
                continue
            with open(path, encoding="utf-8") as f:
                leaks.update((relative, what) for what in format_knowledge(ast.parse(f.read(), path)))
    assert leaks - KNOWN_LEAKS == set(), (
        "generic code knows a file format by name: ask the format instead (a member of FileFormat/UnitFormat in "
        f"arrowstream/_formats/_base.py): {sorted(leaks - KNOWN_LEAKS)}")
    assert KNOWN_LEAKS - leaks == set(), f"fixed, so remove them from KNOWN_LEAKS: {sorted(KNOWN_LEAKS - leaks)}"


@pytest.mark.parametrize("source, leak", [
    ('if footer.format == "parquet": pass', "compares a format with 'parquet'"),
    ('ok = footer.format in ("csv", "jsonl")', "compares a format with 'csv'"),
    ("from ._formats.text import ROW_OK", "names ROW_OK"),
    ("fix = getattr(file_format, 'reconcile', None)", "asks getattr(..., 'reconcile') instead of the format protocol"),
    ("if isinstance(f, TextFormat): pass", "names TextFormat"),
])
def test_the_format_knowledge_check_sees_what_it_looks_for(source, leak):
    assert leak in format_knowledge(ast.parse(source))
