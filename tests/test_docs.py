"""The docs: they read as plain Markdown (every example stands in its page, none needs the site's build to
show), the site builds under ``mkdocs build --strict``, every example script in a page runs as it is (the two
framework recipes in a venv of arrowstream and exactly what their install line installs), the Python blocks
of the quickstart and of the README's "Use" section run as they are, every checkpoint the docs write is written
atomically, no page is orphaned.

The pages are the one source of the examples: a script is a Python block whose first line names its file and
its command, ``# NAME.py; run with: python NAME.py`` (tests/docs_pages.py reads them); the framework recipes run
in a venv made for their install line (tests/recipe_venv.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from docs_pages import (
    CONTINUED,
    SCRIPT,
    install_line,
    markdown_section,
    python_blocks,
    scripts_of,
    unsafe_checkpoint_writes,
)
from recipe_venv import clean_env, recipe_venv

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]

# A block whose first line starts with NOT_RUN is not run; the rest of that line says why (real credentials ...).
NOT_RUN = "# not run:"


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
    frameworks = (tmp_path / "site" / "frameworks" / "index.html").read_text()
    assert "ArrowStreamDataModule" in frameworks and "SaveLoaderState" in frameworks, "the recipes are not on the site"


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


# -- the pages' blocks and scripts ------------------------------------------------------------------------------


SCRIPTS = [script for page in PAGES for script in scripts_of(page)]
RECIPES = [script for script in SCRIPTS if install_line(DOCS / script.page, script.section)]
PLAIN_SCRIPTS = [script for script in SCRIPTS if script not in RECIPES]
QUICKSTART_BLOCKS = [block for block in python_blocks((DOCS / "quickstart.md").read_text())
                     if not SCRIPT.match(block) and not CONTINUED.match(block)]
README_BLOCKS = python_blocks(markdown_section((ROOT / "README.md").read_text(), "## Use"))
QUICKSTART_NAMES = [f"quickstart-{index}" for index in range(len(QUICKSTART_BLOCKS))]


def data_script() -> str:
    """The quickstart's "Some data" script: every block runs in a folder where it has run."""
    (block,) = python_blocks(markdown_section((DOCS / "quickstart.md").read_text(), "## Some data"))
    return block


def test_every_example_stands_in_its_page_as_plain_markdown():
    """Nothing on GitHub or in an editor stands where an example should be: no snippet include (``--8<--``)
    but the changelog page's (the site's copy of CHANGELOG.md), no example kept in a file of its own."""
    includes = [f"{page.relative_to(ROOT)}: {line}" for page in PAGES for line in page.read_text().splitlines()
                if "--8<--" in line]
    assert includes == ['docs/changelog.md: --8<-- "CHANGELOG.md"'], includes
    assert not (DOCS / "examples").exists(), "docs/examples/ is back: examples live in their pages"
    names = [script.name for script in SCRIPTS]
    assert len(names) == len(set(names)), f"two scripts of one name on one page: {names}"
    assert {script.file for script in SCRIPTS} >= {
        "quickstart.py", "resume.py", "storage.py", "iceberg.py", "distributed.py", "text.py", "metrics.py",
        "mixing.py", "check_resume.py", "lightning_datamodule.py", "hf_trainer.py", "train.py",
        "check_my_pipeline.py", "mix.py"}
    assert {script.file for script in RECIPES} == {"lightning_datamodule.py", "hf_trainer.py"}
    for page in ("testing.md", "mixing.md"):   # a page's first example runs as it is (it once could not)
        assert SCRIPT.match(python_blocks((DOCS / page).read_text())[0]), f"{page}'s first example is no script"


class BlockRunner:
    """tests/block_runner.py: runs each block in a fresh process forked from one that imported torch, pyarrow
    and arrowstream once (a block in a process of its own costs those imports, about 3 s of CPU, each)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "block_runner.py")],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, block: str, folder: Path, file: str = "block.py", command: str = "python",
            check: bool = True) -> tuple[int, str]:
        """Run one block as the script ``file`` in ``folder``, with ``command`` (python or torchrun); its exit
        status and output (a status other than 0 fails the test unless ``check`` is false)."""
        script = folder / file
        script.write_text(block)
        if command.startswith("torchrun"):
            result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                     *command.split()[1:], str(script)],
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
        assert returncode == 0 or not check, f"this block failed:\n{block}\n{output}"
        return returncode, output

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


@pytest.mark.parametrize("script", PLAIN_SCRIPTS, ids=[script.name for script in PLAIN_SCRIPTS])
def test_each_script_of_the_docs_runs_as_it_is(script, blocks, data_folder, tmp_path):
    """Saved under its name in a folder where the quickstart's "Some data" script ran (the scripts that use
    ``data/`` say so), run with its own command."""
    shutil.copytree(data_folder, tmp_path / "data")
    blocks.run(script.code, tmp_path, file=script.file, command=script.command)


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
    """The README's "Use" block, run as it is in one folder: a fresh start that leaves a checkpoint, a run that
    finds it, loads it and trains on to the end, and a run killed in the middle of writing its checkpoint,
    which leaves the checkpoint before it whole."""
    (block,) = README_BLOCKS
    shutil.copytree(data_folder, tmp_path / "data")
    blocks.run(block, tmp_path)
    checkpoint = tmp_path / "checkpoint.pt"
    assert checkpoint.is_file(), "the loop saved no checkpoint"
    _, output = blocks.run(block + "\nprint('resumed from epoch', start_epoch)\n", tmp_path)
    assert "resumed from epoch 2" in output, output

    before = checkpoint.read_bytes()
    killed_mid_write = (
        "import torch\n\n"
        "def torn_save(obj, f, *args, **kwargs):   # the job dies with half of the file written\n"
        "    with open(f, 'wb') as out:\n"
        "        out.write(b'half a checkpoint')\n"
        "    raise SystemExit('killed while writing ' + str(f))\n\n"
        "torch.save = torn_save\n\n")
    returncode, output = blocks.run(killed_mid_write + block, tmp_path, check=False)
    assert returncode != 0 and "killed while writing" in output, output
    assert checkpoint.read_bytes() == before, "a kill mid-write changed the checkpoint"
    assert torch.load(checkpoint, weights_only=True)["epoch"] == 2


# -- checkpoints are written atomically ------------------------------------------------------------------------


def test_every_checkpoint_the_docs_write_is_written_atomically():
    """A kill in the middle of ``torch.save`` must not tear the checkpoint a resume needs: every block of every
    page (README included) that saves one writes a temporary file beside it, then ``os.replace``s it."""
    writes, unsafe = 0, []
    for page in PAGES:
        for code in python_blocks(page.read_text()):
            writes += code.count("torch.save(") + code.count("json.dump(")
            unsafe += [f"{page.relative_to(ROOT)}: {where}" for where in unsafe_checkpoint_writes(code)]
    assert not unsafe, "checkpoints written in place (a kill mid-write tears them):\n" + "\n".join(unsafe)
    assert writes >= 8, "the check found too few checkpoint writes to have read the pages"


def test_the_atomic_write_check_tells_a_torn_write_from_a_safe_one():
    assert unsafe_checkpoint_writes('for step in range(3):\n    torch.save(state, path)\n') == [
        "line 2: torch.save(state, path)"]
    assert unsafe_checkpoint_writes('with open(path, "w") as f:\n    json.dump(state, f)\n') != []
    assert unsafe_checkpoint_writes('torch.save(state, "/tmp/x.pt")\nos.replace("/tmp/x.pt", "ckpt.pt")\n') != []
    assert unsafe_checkpoint_writes('torch.save(state, path + ".tmp")\nos.replace(path + ".tmp", path)\n') == []
    assert unsafe_checkpoint_writes('with open(f"{path}.tmp", "w") as f:\n    json.dump(state, f)\n'
                                    'os.replace(f"{path}.tmp", path)\n') == []


# -- the framework recipes, after exactly their install line ----------------------------------------------------


@pytest.mark.parametrize("script", RECIPES, ids=[script.name for script in RECIPES])
def test_each_recipe_runs_after_exactly_its_install_line(script, tmp_path):
    """A framework recipe, run as a reader runs it after the install line of its section: in a venv holding
    arrowstream and what that line installs, nothing else (not the dev extras this suite runs with). The
    HF Trainer's line once lacked `accelerate`, which transformers does not install: the recipe failed."""
    install = install_line(DOCS / script.page, script.section)
    python, installed = recipe_venv(tmp_path / "venv", install)
    others = [name for name in ("lightning", "transformers", "accelerate", "deepspeed", "mkdocs", "pytest")
              if name not in installed]
    found = "import importlib.util, sys; print([n for n in sys.argv[1:] if importlib.util.find_spec(n) is not None])"
    probe = subprocess.run(
        [str(python), "-c", found, *others],
        capture_output=True, text=True, timeout=60, check=False, env=clean_env())
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]", f"the recipe's venv holds more than its install line: {probe.stdout}"
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / script.file).write_text(script.code)
    result = subprocess.run([str(python), script.file], cwd=folder, capture_output=True, text=True, timeout=240,
                            check=False, env=clean_env())
    assert result.returncode == 0, f"{script.file} after `pip install {' '.join(install)}`:\n" + (
        result.stdout + result.stderr)[-4000:]
    assert "every row once per epoch" in result.stdout, result.stdout


# -- what the quickstart says -------------------------------------------------------------------------------------


def test_the_quickstart_extras_table_names_every_extra():
    with open(ROOT / "pyproject.toml", "rb") as f:
        extras = set(tomllib.load(f)["project"]["optional-dependencies"]) - {"dev", "docs"}
    table = markdown_section((DOCS / "quickstart.md").read_text(), "## Install")
    named = {name for row in re.findall(r"^\| (.*?) \|", table, re.MULTILINE) for name in re.findall(r"`(\w+)`", row)}
    assert extras <= named, f"extras missing from the quickstart's table: {sorted(extras - named)}"


def test_the_quickstart_says_where_the_plan_cache_writes_and_how_to_move_or_stop_it(monkeypatch, tmp_path):
    from arrowstream._planning.cache import default_folder

    monkeypatch.delenv("ARROWSTREAM_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_folder() == str(tmp_path / ".cache" / "arrowstream")
    monkeypatch.setenv("ARROWSTREAM_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert default_folder() == str(tmp_path / "elsewhere")
    quickstart = (DOCS / "quickstart.md").read_text()
    for said in ("`~/.cache/arrowstream`", "`$ARROWSTREAM_CACHE_DIR`", "`$XDG_CACHE_HOME/arrowstream`",
                 'plan_cache="', "plan_cache=False"):
        assert said in quickstart, f"the quickstart does not say {said}"


def test_the_quickstart_and_the_readme_state_the_default_batch_size():
    import inspect

    from arrowstream import StructuredDataset

    default = inspect.signature(StructuredDataset.create_dataloader).parameters["batch_size"].default
    for page in (DOCS / "quickstart.md", ROOT / "README.md"):
        assert f"`batch_size` (rows per batch) defaults to {default}" in page.read_text(), page.name
