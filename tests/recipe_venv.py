"""A venv for a docs recipe: this checkout's arrowstream and exactly what the recipe's install line adds, as
``pip install`` would bring it into an empty venv, but linked from this environment's installed files (no
download, no build): a reader's fresh environment, in a second and offline. tests/test_docs.py runs the
framework recipes in it, so that an install line that misses a package (as the HF Trainer's once missed
`accelerate`) fails the suite, however complete the dev extras are.
"""

from __future__ import annotations

import importlib.metadata
import os
import tomllib
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def requirements_closure(requirements: list[str]) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions that ``requirements`` need, with theirs, extras and markers honoured: what
    ``pip install`` of them brings into an empty venv (taken from this environment)."""
    found: dict[str, tuple[importlib.metadata.Distribution, set[str]]] = {}
    pending = [Requirement(requirement) for requirement in requirements]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f"{requirement} is not installed here: the docs' recipes need it (pyproject.toml's dev extra)")
        extras = found[name][1] if name in found else set()
        if name in found and set(requirement.extras) <= extras:
            continue
        extras |= set(requirement.extras)
        found[name] = (distribution, extras)
        for line in distribution.requires or []:
            needed = Requirement(line)
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra}) for extra in extras | {""}):
                pending.append(needed)
    return {name: distribution for name, (distribution, _) in found.items()}


def recipe_venv(folder: Path, install: list[str]) -> tuple[Path, set[str]]:
    """A venv that holds this checkout's arrowstream, what it depends on, and exactly what ``pip install
    INSTALL`` adds: each distribution's files linked from this environment (no download, no build). Returns
    its Python and the names of the distributions in it."""
    for requirement in install:
        parsed = Requirement(requirement)
        version = importlib.metadata.version(parsed.name)
        assert parsed.specifier.contains(version, prereleases=True), (
            f"the docs' install line asks for {requirement}; this environment has {version}")
    with open(ROOT / "pyproject.toml", "rb") as f:
        own = tomllib.load(f)["project"]["dependencies"]
    venv.create(folder, with_pip=False, symlinks=True)
    (site,) = folder.glob("lib/python*/site-packages")
    distributions = requirements_closure(own + install)
    for distribution in distributions.values():
        source = Path(str(distribution.locate_file("")))
        for file in distribution.files or []:
            if ".." in file.parts or not (source / file).exists():
                continue
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                target.symlink_to(source / file)
    (site / "arrowstream").symlink_to(ROOT / "arrowstream")
    return folder / "bin" / "python", set(distributions)


def clean_env() -> dict[str, str]:
    """This environment without what would let this one's packages into the recipe's venv."""
    return {name: value for name, value in os.environ.items()
            if name not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
