"""The docs site: it builds under ``mkdocs build --strict``, its runnable examples run, the Python blocks of the
quickstart and of the README's "Use" section run as they are, no page is orphaned."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
EXAMPLES = sorted((DOCS / "examples").glob("*.py"))

# A block whose first line starts with NOT_RUN is not run; the rest of that line says why (real credentials ...).
NOT_RUN = "# not run:"
# A block whose first line names a torchrun command runs under torchrun, with that many processes.
TORCHRUN = re.compile(r"^# .*run with: torchrun --nproc-per-node=(\d+)")
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


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


# -- the Python blocks of the quickstart and of the README ----------------------------------------------------------


def markdown_section(text: str, heading: str) -> str:
    """The text under ``heading`` (a ``## `` line), up to the next heading of that level."""
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def python_blocks(text: str) -> list[str]:
    """The fenced Python blocks of a markdown text, except snippet includes (their scripts run as examples)."""
    return [block for block in PYTHON_BLOCK.findall(text) if "--8<--" not in block]


def data_script() -> str:
    """The quickstart's "Some data" script: every block runs in a folder where it has run."""
    (block,) = python_blocks(markdown_section((DOCS / "quickstart.md").read_text(), "## Some data"))
    return block


QUICKSTART_BLOCKS = python_blocks((DOCS / "quickstart.md").read_text())
README_BLOCKS = python_blocks(markdown_section((ROOT / "README.md").read_text(), "## Use"))
QUICKSTART_NAMES = [f"quickstart-{index}" for index in range(len(QUICKSTART_BLOCKS))]


class BlockRunner:
    """tests/block_runner.py: runs each block in a fresh process forked from one that imported torch, pyarrow
    and arrowstream once (a block in a process of its own costs those imports, about 3 s of CPU, each)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "block_runner.py")],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, block: str, folder: Path) -> str:
        """Run one block as a script in ``folder`` (under torchrun if it says so); its output."""
        script = folder / "block.py"
        script.write_text(block)
        torchrun = TORCHRUN.match(block)
        if torchrun:
            result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                     f"--nproc-per-node={torchrun[1]}", str(script)],
                                    cwd=folder, capture_output=True, text=True, timeout=120, check=False)
            returncode, output = result.returncode, result.stdout + result.stderr
        else:
            # this test's plan cache folder (tests/conftest.py), which the runner did not inherit
            env = {name: os.environ[name] for name in ["ARROWSTREAM_CACHE_DIR"] if name in os.environ}
            request = {"folder": str(folder), "script": str(script), "env": env}
            assert self.process.stdin is not None and self.process.stdout is not None
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            returncode = json.loads(self.process.stdout.readline())["returncode"]
            output = (folder / "output.txt").read_text()
        assert returncode == 0, f"this block failed:\n{block}\n{output}"
        return output

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def blocks():
    runner = BlockRunner()
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def data_folder(blocks, tmp_path_factory):
    """A folder where the quickstart's "Some data" script ran, written once for the module."""
    folder = tmp_path_factory.mktemp("quickstart-data")
    blocks.run(data_script(), folder)
    return folder / "data"


@pytest.mark.parametrize("block", QUICKSTART_BLOCKS, ids=QUICKSTART_NAMES)
def test_each_python_block_of_the_quickstart_runs_on_its_own(block, blocks, data_folder, tmp_path):
    if block.startswith(NOT_RUN):
        reason = block.splitlines()[0][len(NOT_RUN):].strip()
        assert reason, f"a block marked '{NOT_RUN}' says why on the same line:\n{block}"
        return
    shutil.copytree(data_folder, tmp_path / "data")
    blocks.run(block, tmp_path)


def test_the_blocks_are_found_and_few_are_left_unrun():
    assert len(QUICKSTART_BLOCKS) >= 10 and len(README_BLOCKS) == 1
    not_run = [name for name, block in zip(QUICKSTART_NAMES, QUICKSTART_BLOCKS) if block.startswith(NOT_RUN)]
    assert len(not_run) <= 2, f"blocks not run: {not_run}; a block runs unless it truly cannot (real credentials)"


def test_the_readme_loop_runs_and_resumes_from_its_own_checkpoint(blocks, data_folder, tmp_path):
    """The README's "Use" block, run twice in one folder as it is: a fresh start that leaves a checkpoint, then
    a run that finds it, loads it and trains on to the end."""
    (block,) = README_BLOCKS
    shutil.copytree(data_folder, tmp_path / "data")
    blocks.run(block, tmp_path)
    assert (tmp_path / "checkpoint.pt").is_file(), "the loop saved no checkpoint"
    output = blocks.run(block + "\nprint('resumed from epoch', start_epoch)\n", tmp_path)
    assert "resumed from epoch 2" in output, output
