"""Import layers, checked per folder: a module is checked by the folder it is in, with no list to edit.

The package's folders are rooms in a building of layers (docs/architecture.md). A module may import its
own folder and the folders of lower layers, never a higher one, and no import circle may form at module
level or under ``if TYPE_CHECKING:`` (a lazy import inside a function is the one way to reach up, for the
command line's tools):

0. the pure layer: ``_core``, ``_state``, ``_layout``, ``_mixing`` and ``errors``;
1. ``_formats`` and ``_storage``: a file's bytes;
2. ``_planning`` and ``_sources``: what rows exist, cut into splits;
3. ``_worker``: how a process reads its rows;
4. ``_loader`` and ``_assignment``: torchdata's loader, its state, checkpoints; the assignment policies,
   which the loader and the dataset ask how a rank's rows go to its workers;
5. the front doors: ``dataset``, ``iceberg``, ``mixture``;
6. the tools and the package's face: ``_tools``, ``testing``, ``cli``, ``__init__``, ``__main__``.

The pure layer is planning, order and state arithmetic. It must run (and be tested) without a loader, a
worker or a file system, so it may import only:

* the standard library and numpy;
* ``pyarrow`` itself and ``pyarrow.compute``: in-memory arrays, types, record batches and compute
  expressions (the rows the layer moves are Arrow batches, a filter is an Expression); ``import
  pyarrow`` loads ``pyarrow.ipc`` on its own, so that module cannot be refused by what is loaded,
  only by what the pure modules themselves import;
* ``arrowstream.errors`` and the other pure modules.

Refused there: torch and torchdata, fsspec, and pyarrow's file and format I/O (parquet, ORC, datasets,
CSV, JSON, Feather, IPC, file systems, Flight).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

import arrowstream

PACKAGE_DIR = os.path.dirname(arrowstream.__file__)

LAYERS = {   # the first part of a module's name under the package -> its layer
    "errors": 0, "_core": 0, "_state": 0, "_layout": 0, "_mixing": 0,
    "_formats": 1, "_storage": 1,
    "_planning": 2, "_sources": 2,
    "_worker": 3,
    "_loader": 4, "_assignment": 4,
    "dataset": 5, "iceberg": 5, "mixture": 5,
    "_tools": 6, "testing": 6, "cli": 6, "": 6, "__main__": 6,   # "": the package's __init__
}
PURE = 0

REFUSED_PACKAGES = ("torch", "torchdata", "fsspec")
REFUSED_PYARROW = ("pyarrow.parquet", "pyarrow._parquet", "pyarrow.orc", "pyarrow._orc", "pyarrow.dataset",
                   "pyarrow._dataset", "pyarrow.csv", "pyarrow._csv", "pyarrow.json", "pyarrow._json",
                   "pyarrow.feather", "pyarrow.fs", "pyarrow._fs", "pyarrow.flight", "pyarrow._flight")
REFUSED_DIRECTLY = ("pyarrow.ipc",)   # loaded by ``import pyarrow``, but no pure module may use it itself


def _modules() -> dict[str, str]:
    """Every module of the package: dotted name under the package ('' for its __init__) -> path."""
    found = {}
    for folder, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = [d for d in dirs if not d.startswith(("__pycache__", "."))]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, PACKAGE_DIR)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = path
    return found


MODULES = _modules()
PURE_MODULES = sorted(m for m in MODULES if LAYERS.get(m.split(".")[0]) == PURE)


def layer_of(module: str) -> int:
    return LAYERS[module.split(".")[0]]


# -- what a module imports ------------------------------------------------------------------------------------------

def imports_of(tree: ast.Module, module: str, is_package: bool) -> list[tuple[int, str, str]]:
    """(line, imported, where) of every import of a module: ``where`` is "top" (runs on import), "typing"
    (under ``if TYPE_CHECKING:``) or "lazy" (inside a function). ``imported`` is absolute: a dotted name
    under the package prefixed with "arrowstream" (a module, or the package a name is taken from), or any
    other module's name."""
    package = module.split(".") if module else []
    if not is_package:
        package = package[:-1]
    found: list[tuple[int, str, str]] = []

    def resolve(level: int, base: str | None, names: list[str]) -> list[str]:
        if level == 0:
            return [base or ""]
        parent = package[: len(package) - (level - 1)]
        target = parent + (base.split(".") if base else [])
        out = []
        for name in names:   # `from ._core import order` imports a module
            dotted = ".".join([*target, name])
            out.append(dotted if dotted in MODULES else ".".join(target))
        return [f"arrowstream.{t}" if t else "arrowstream" for t in out]

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.body:
                visit(child, "typing")
            for child in node.orelse:
                visit(child, where)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for child in node.body:
                visit(child, "lazy")
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, where) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names]
            if node.level == 0:   # `from pyarrow import ipc` imports pyarrow.ipc
                found.extend((node.lineno, f"{node.module}.{name}", where) for name in names)
                found.append((node.lineno, node.module or "", where))
            else:
                found.extend((node.lineno, target, where) for target in resolve(node.level, node.module, names))
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    for statement in tree.body:
        visit(statement, "top")
    return found


def _parsed(module: str) -> ast.Module:
    with open(MODULES[module], encoding="utf-8") as f:
        return ast.parse(f.read(), MODULES[module])


IMPORTS = {m: imports_of(_parsed(m), m, MODULES[m].endswith("__init__.py")) for m in MODULES}


def _inside(name: str) -> str | None:
    """The module under the package that an absolute import names, or None when it is outside."""
    if name == "arrowstream":
        return ""
    return name.removeprefix("arrowstream.") if name.startswith("arrowstream.") else None


# -- every module sits in a known room -----------------------------------------------------------------------------

def test_every_module_is_in_a_folder_with_a_layer():
    unknown = sorted(m for m in MODULES if m.split(".")[0] not in LAYERS)
    assert not unknown, (f"modules outside the known folders: {unknown}; put each in the folder of its layer "
                         "(docs/architecture.md) or add the folder to LAYERS with its layer")


# -- no module reaches up ------------------------------------------------------------------------------------------

def upward_imports() -> list[str]:
    wrong = []
    for module, found in IMPORTS.items():
        for line, name, where in found:
            target = _inside(name)
            if target is None or target == module:
                continue
            if target == "" and module:   # the package itself: only its version, a constant
                continue
            if layer_of(target) > layer_of(module):
                wrong.append(f"arrowstream/{module.replace('.', '/') or '__init__'}.py:{line} ({where}) imports "
                             f"arrowstream.{target}, a higher layer ({layer_of(target)} > {layer_of(module)})")
    return wrong


def test_no_module_imports_a_higher_layer():
    wrong = [w for w in upward_imports() if "(lazy)" not in w or layer_of_of(w) < 6]
    assert not wrong, ("a module imports a higher layer; hand it the values it needs instead (a lower layer "
                       "never knows the loader or the front doors):\n" + "\n".join(wrong))


def layer_of_of(line: str) -> int:
    """The layer of the importing module of an ``upward_imports`` line."""
    path = line.split(".py:")[0].removeprefix("arrowstream/")
    return layer_of("" if path == "__init__" else path.replace("/", "."))


# -- no circles ----------------------------------------------------------------------------------------------------

def import_circles() -> list[list[str]]:
    """The circles of the graph of imports at module level and under TYPE_CHECKING (Tarjan's strongly
    connected components of more than one module, or a module importing itself)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, found in IMPORTS.items():
        for _, name, where in found:
            target = _inside(name)
            if where != "lazy" and target is not None and target != module and not (target == "" and module):
                graph[module].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in graph:
                continue
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in sorted(graph):
            if node not in index:
                connect(node)
    finally:
        sys.setrecursionlimit(limit)   # other tests in this process count on the default
    return circles


def test_no_import_circles_at_module_level_or_for_types():
    circles = import_circles()
    assert not circles, ("modules import each other (at module level or under TYPE_CHECKING); move what both need "
                         f"into a lower module, or hand values across: {circles}")


def test_the_layer_checks_see_what_they_look_for():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..dataset import StructuredDataset\n"
                     "from .order import seed\n\ndef f():\n    from .. import cli\n")
    found = imports_of(tree, "_core.window", False)
    assert (3, "arrowstream.dataset", "typing") in found
    assert (4, "arrowstream._core.order", "top") in found
    assert (7, "arrowstream.cli", "lazy") in found


# -- the pure layer loads no torch, no fsspec, no pyarrow I/O -------------------------------------------------------

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


def _loaded_by(modules: list[str]) -> dict[str, list[str]]:
    """For each module, every module in ``sys.modules`` after importing ``arrowstream.<module>`` in a fresh
    interpreter (the probes run side by side)."""
    probes = {m: subprocess.Popen([sys.executable, "-c", _PROBE, PACKAGE_DIR, m], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for m in modules}
    loaded = {}
    for module, probe in probes.items():
        out, err = probe.communicate(timeout=120)
        assert probe.returncode == 0, err
        loaded[module] = json.loads(out)
    return loaded


@pytest.mark.timeout(240)
def test_a_pure_module_loads_no_torch_fsspec_or_pyarrow_io():
    assert len(PURE_MODULES) > 30   # the walk found the pure folders
    wrong = []
    for module, loaded in _loaded_by(PURE_MODULES).items():
        assert "arrowstream.dataset" not in loaded   # the package's __init__ was left out, as it must be here
        assert f"arrowstream.{module}" in loaded     # the probe imported the module itself, not a namesake
        refused = sorted({m if m.startswith("pyarrow") else m.split(".")[0] for m in loaded if _refused(m)})
        outside = [m for m in loaded if m.startswith("arrowstream.") and m.removeprefix("arrowstream.") in MODULES
                   and layer_of(m.removeprefix("arrowstream.")) != PURE]
        if refused or outside:
            wrong.append(f"importing arrowstream.{module} loads {refused} (refused in the pure layer) and the "
                         f"arrowstream modules {outside}, which are outside it")
    assert not wrong, ("\n".join(wrong) + "\nimport the value type from a pure module (move it there if need be) "
                       "or under `if TYPE_CHECKING:` when it is only a type hint")


@pytest.mark.timeout(90)
def test_the_probe_sees_what_an_impure_module_loads():
    # the reader does I/O: loading it is what the pure modules must not do (a check that cannot pass vacuously)
    refused = {m.split(".")[0] for m in _loaded_by(["_worker.reader"])["_worker.reader"] if _refused(m)}
    assert {"torch", "fsspec"} <= refused


def test_pure_modules_import_nothing_refused_even_lazily_inside_functions():
    wrong = []
    for module in PURE_MODULES:
        for line, name, where in IMPORTS[module]:
            target = _inside(name)
            if where == "typing":
                continue
            if target is None and _refused(name, REFUSED_DIRECTLY):
                wrong.append(f"arrowstream/{module.replace('.', '/')}.py:{line} imports {name}")
            elif target is not None and target != "" and layer_of(target) != PURE:
                wrong.append(f"arrowstream/{module.replace('.', '/')}.py:{line} imports arrowstream.{target}, "
                             "outside the pure layer")
    assert not wrong, ("pure modules reach outside their layer (import the type from a pure module, or under "
                       f"`if TYPE_CHECKING:` for a type hint): {wrong}")


# -- format knowledge stays in arrowstream/_formats/ and the sources that own them (_sources/: files, Iceberg) -----

FORMAT_NAMES = {"parquet", "orc", "arrow", "ipc", "feather", "csv", "jsonl", "json", "iceberg"}
FORMAT_INTERNALS = {"TextFormat", "ParquetFormat", "OrcFormat", "IpcFormat", "IcebergFormat", "TextFile", "TextLayout",
                    "ROW_OK"}
PROTOCOL_MEMBERS = {"configured", "inspect", "reconcile", "row_ok_column", "baseline_batches", "byte_ranges",
                    "physical_rows"}
FORMAT_OWNERS = ("_formats/", "_sources/", "iceberg.py")

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
        f"arrowstream/_formats/base.py): {sorted(leaks - KNOWN_LEAKS)}")
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
