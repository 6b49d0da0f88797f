"""Build the wheel and the sdist, check what they hold, install the wheel into a clean venv, smoke-run it.

CI (.ci/run) runs this after the suite, as `make wheel-check`. Steps:

1. `python -m build` on a copy of the repository's files (sdist, then the wheel built from the
   sdist: a file missing from the sdist breaks the wheel) into a temporary folder;
2. the sdist holds the package with py.typed, the README, the changelog, the whole test suite and
   the docs; the wheel holds the package with py.typed, the license and the `arrowstream` command, no tests,
   and its metadata says this version, requires-python and the classifiers;
3. a clean venv (no dev extras, nothing from the repository's .venv): torch first from its CPU
   build, pinned by constraints.txt as the Makefile does, then the wheel;
4. .ci/wheel_smoke.py with that venv's Python, from outside the repository: import, a loader with
   2 workers over generated Parquet files, a checkpoint resumed exactly, the install hint of a
   missing extra, `arrowstream --help`, `inspect`, `bench --plot` failing fast, `demo`.

Options: `--python PATH` (the interpreter the clean venv is made from; default this one's base),
`--keep` (leave the temporary folder and print it).
"""

from __future__ import annotations

import argparse
import ast
import email.parser
import glob
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SDIST_FILES = ["README.md", "CHANGELOG.md", "LICENSE", "pyproject.toml", "constraints.txt", "Makefile", "arrowstream/py.typed",
               "arrowstream/__init__.py", "arrowstream/cli.py", "arrowstream/_formats/parquet.py",
               "tests/conftest.py", "tests/helpers.py", "tests/test_resume.py", "docs/quickstart.md", "mkdocs.yml",
               ".ci/wheel_smoke.py"]
SDIST_FOLDERS = ["tests/golden/", "docs/images/"]
WHEEL_FILES = ["arrowstream/__init__.py", "arrowstream/py.typed", "arrowstream/cli.py", "arrowstream/__main__.py",
               "arrowstream/_formats/parquet.py"]
WHEEL_NEVER = ("tests/", "docs/", "benchmarks/", ".ci/")


def fail(what: str) -> None:
    sys.exit(f"wheel check: FAILED: {what}")


def ok(what: str) -> None:
    print(f"wheel check: ok: {what}", flush=True)


def source_version() -> str:
    """``__version__`` as arrowstream/__init__.py writes it (read, not imported)."""
    with open(os.path.join(ROOT, "arrowstream", "__init__.py")) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return str(ast.literal_eval(node.value))
    fail("no __version__ in arrowstream/__init__.py")
    return ""


def clean_env() -> dict[str, str]:
    """This environment without what would let the repository or its venv leak into the clean venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(os.path.join(ROOT, ".venv")))
    return env


def run(command: list[str], **kwargs: Any) -> float:
    began = time.perf_counter()
    result = subprocess.run(command, check=False, env=clean_env(), **kwargs)
    if result.returncode != 0:
        fail(f"{' '.join(command)} exited with {result.returncode}")
    return time.perf_counter() - began


def source_copy(folder: str) -> str:
    """The files of the repository (tracked, and new ones git does not ignore) copied to ``folder``.

    Built in place, setuptools would also pack what a stale ``arrowstream.egg-info/SOURCES.txt`` lists,
    and a file missing from MANIFEST.in or the package data would go unnoticed."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if os.path.isfile(os.path.join(ROOT, name)):   # a file deleted but not yet committed is not there
            os.makedirs(os.path.join(folder, os.path.dirname(name)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), os.path.join(folder, name))
    return folder


def build(source: str, dist: str) -> float:
    return run([sys.executable, "-m", "build", "--outdir", dist, source], stdout=subprocess.DEVNULL)


def check_sdist(path: str, version: str) -> None:
    top = f"arrowstream-{version}/"
    with tarfile.open(path) as archive:
        names = {name[len(top):] for name in archive.getnames() if name.startswith(top)}
    missing = [name for name in SDIST_FILES if name not in names]
    missing += [folder for folder in SDIST_FOLDERS if not any(name.startswith(folder) for name in names)]
    if missing:
        fail(f"the sdist lacks {missing}")
    stray = [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    if stray:
        fail(f"the sdist holds build leftovers: {stray[:5]}")
    ok(f"sdist {os.path.basename(path)}: {len(names)} entries, package, tests, docs, changelog")


def check_wheel(path: str, version: str) -> None:
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        info = f"arrowstream-{version}.dist-info/"
        metadata = email.parser.Parser().parsestr(archive.read(info + "METADATA").decode())
        entry_points = archive.read(info + "entry_points.txt").decode()
    missing = [name for name in WHEEL_FILES if name not in names]
    if missing:
        fail(f"the wheel lacks {missing}")
    stray = [name for name in names if name.startswith(WHEEL_NEVER)]
    if stray:
        fail(f"the wheel holds files that are not the package: {stray[:5]}")
    if metadata["Version"] != version or metadata["Requires-Python"] != ">=3.11":
        fail(f"the wheel's metadata says version {metadata['Version']}, Requires-Python {metadata['Requires-Python']}")
    classifiers = metadata.get_all("Classifier") or []
    for wanted in ("Programming Language :: Python :: 3.11", "Typing :: Typed"):
        if wanted not in classifiers:
            fail(f"the wheel's metadata lacks the classifier {wanted!r}")
    if metadata["License-Expression"] != "Apache-2.0" or info + "licenses/LICENSE" not in names:
        fail(f"the wheel lacks its license: License-Expression {metadata['License-Expression']}, "
             f"{info}licenses/LICENSE {'present' if info + 'licenses/LICENSE' in names else 'missing'}")
    if "arrowstream = arrowstream.cli:main" not in entry_points:
        fail(f"the wheel does not install the arrowstream command: {entry_points!r}")
    ok(f"wheel {os.path.basename(path)}: {len(names)} files, py.typed, the arrowstream command, version {version}")


def install(venv: str, python: str, wheel: str) -> float:
    run([python, "-m", "venv", venv])
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--quiet"]
    constraints = ["-c", os.path.join(ROOT, "constraints.txt")]
    seconds = run([*pip, *constraints, "torch==2.13.0"])    # its CPU build first, as the Makefile
    return seconds + run([*pip, *constraints, wheel])


def main() -> None:
    parser = argparse.ArgumentParser(description="build, check and smoke-run the wheel and the sdist")
    parser.add_argument("--python", default=getattr(sys, "_base_executable", sys.executable),
                        help="the interpreter the clean venv is made from")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    version = source_version()
    began = time.perf_counter()
    work = tempfile.mkdtemp(prefix="arrowstream-wheel-check-")
    try:
        dist = os.path.join(work, "dist")
        build_s = build(source_copy(os.path.join(work, "source")), dist)
        (sdist,), (wheel,) = glob.glob(f"{dist}/*.tar.gz"), glob.glob(f"{dist}/*.whl")
        ok(f"python -m build: {build_s:.1f} s")
        check_sdist(sdist, version)
        check_wheel(wheel, version)
        install_s = install(os.path.join(work, "venv"), args.python, wheel)
        ok(f"clean venv from {args.python}: torch 2.13.0 and the wheel installed in {install_s:.1f} s")
        smoke = os.path.join(work, "smoke")
        os.makedirs(smoke)
        smoke_s = run([os.path.join(work, "venv", "bin", "python"), os.path.join(ROOT, ".ci", "wheel_smoke.py"),
                       smoke], cwd=smoke)
        ok(f"smoke run: {smoke_s:.1f} s")
    finally:
        if args.keep:
            print(f"wheel check: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wheel check: passed in {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
