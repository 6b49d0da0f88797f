"""Packaging: one version everywhere, the extras and the install hints agree, the changelog is cut for
this version, and no message or page tells users to install arrowstream from an index it is not on.

The wheel and the sdist themselves are built, installed into a clean venv and smoke-run by
.ci/wheel_check.py (`make wheel-check`), which CI (.ci/run) runs after the suite.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib

from setuptools.config.pyprojecttoml import read_configuration

import arrowstream
from arrowstream._core.install import EXTRAS, install_hint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_the_built_version_is_arrowstream_version():
    """setuptools reads the version from arrowstream/__init__.py: what pip installs is __version__."""
    config = read_configuration(os.path.join(ROOT, "pyproject.toml"))
    assert config["project"]["version"] == arrowstream.__version__ == "0.2.0"


def test_the_newest_changelog_release_is_this_version():
    """The release is cut: the newest `## [x.y.z]` heading of CHANGELOG.md is __version__."""
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", f.read(), re.MULTILINE)
    assert releases and releases[0] == arrowstream.__version__, releases[:2]


def test_install_hints_name_the_extras_of_pyproject():
    extras = {name: tuple(packages) for name, packages in _pyproject()["project"]["optional-dependencies"].items()
              if name not in ("dev", "docs")}
    assert EXTRAS == extras
    assert install_hint("cli") == ('pip install "tqdm>=4.60" "matplotlib>=3.8" (or the "cli" extra: pip install '
                                   '".[cli]" in a checkout of arrowstream, pip install '
                                   f'"arrowstream-{arrowstream.__version__}-py3-none-any.whl[cli]" with its wheel)')


def test_the_python_versions_stated_agree():
    project = _pyproject()["project"]
    stated = [c.rsplit(" :: ", 1)[1] for c in project["classifiers"]
              if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert project["requires-python"] == f">={stated[0]}"
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in stated     # the suite runs on one of them


def test_no_message_or_page_says_to_install_arrowstream_from_an_index():
    """Until arrowstream is published, `pip install arrowstream` or `"arrowstream[s3]"` finds nothing."""
    from_index = re.compile(r"""pip install\s+["']?arrowstream(\[|["'`\s]|$)""", re.MULTILINE)
    offenders = []
    for folder in ("arrowstream", "docs"):
        for base, _, names in os.walk(os.path.join(ROOT, folder)):
            for name in names:
                if name.endswith((".py", ".md")):
                    path = os.path.join(base, name)
                    with open(path) as f:
                        offenders += [f"{os.path.relpath(path, ROOT)}: {m.group(0)}" for m in from_index.finditer(f.read())]
    with open(os.path.join(ROOT, "README.md")) as f:
        offenders += [f"README.md: {m.group(0)}" for m in from_index.finditer(f.read())]
    assert not offenders
