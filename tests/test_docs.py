"""The docs site: it builds under ``mkdocs build --strict``, its runnable examples run, no page is orphaned."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXAMPLES = sorted((DOCS / "examples").glob("*.py"))


class _ConfigLoader(yaml.SafeLoader):
    """Reads mkdocs.yml, leaving mkdocs' own tags (``!relative``, ``!ENV``) unresolved."""


_ConfigLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def nav_pages(nav: Any) -> list[str]:
    """The page files of a mkdocs ``nav``, in order, relative to docs/."""
    if isinstance(nav, str):
        return [nav] if nav.endswith(".md") else []
    if isinstance(nav, list):
        return [page for entry in nav for page in nav_pages(entry)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def configured_nav() -> list[str]:
    with open(ROOT / "mkdocs.yml") as f:
        return nav_pages(yaml.load(f, Loader=_ConfigLoader)["nav"])


def test_the_site_builds_with_no_warning_under_strict(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=180,
        check=False)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "api" / "index.html").exists()


@pytest.mark.parametrize("script", EXAMPLES, ids=[script.stem for script in EXAMPLES])
def test_each_runnable_example_runs_as_it_is(script, tmp_path):
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip(), f"{script.name} printed nothing: each example says what it proved"


def test_there_are_runnable_examples():
    assert {script.stem for script in EXAMPLES} >= {"quickstart", "resume", "storage", "iceberg", "distributed"}


def test_the_api_reference_documents_every_public_name():
    import arrowstream

    api = (DOCS / "api.md").read_text()
    missing = [name for name in arrowstream.__all__ if f"::: arrowstream.{name}\n" not in api]
    assert not missing, f"names in arrowstream.__all__ without a '::: arrowstream.NAME' entry in docs/api.md: {missing}"


def test_every_page_in_the_nav_exists():
    missing = [page for page in configured_nav() if not (DOCS / page).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages that are not in docs/: {missing}"


def test_every_page_in_docs_is_in_the_nav():
    pages = {page.relative_to(DOCS).as_posix() for page in DOCS.rglob("*.md")}
    orphaned = sorted(pages - set(configured_nav()))
    assert not orphaned, f"pages in docs/ that mkdocs.yml's nav leaves out: {orphaned}"
