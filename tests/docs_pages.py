"""The docs' pages as tests/test_docs.py reads them: fenced blocks with the section each stands in, the example
scripts a page holds, the install line of a section, and the checkpoint writes of a block that are not atomic.

A script is a Python block whose first line names its file and its command, ``# NAME.py; run with: python
NAME.py`` (or ``torchrun --nproc-per-node=N NAME.py``); a block whose first line is ``# NAME.py, continued``
goes on with the script of that name above it on the same page. A script's section may hold an install line
(``pip install ...`` in a bash block): what a reader installs before running it.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import shlex
from pathlib import Path

SCRIPT = re.compile(r"^# (?P<file>[\w-]+\.py); run with: (?P<command>python|torchrun --nproc-per-node=\d+) (?P=file)\b")
CONTINUED = re.compile(r"^# (?P<file>[\w-]+\.py), continued\b")
FENCED = re.compile(r"^```(?P<language>\w*)\n(?P<code>.*?)^```$", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^## .*$", re.MULTILINE)
PIP_INSTALL = re.compile(r"^pip install (?P<arguments>[^#\n]+)", re.MULTILINE)


@dataclasses.dataclass
class Block:
    language: str
    code: str
    section: str   # the "## " heading the block stands under ("" before the first)


@dataclasses.dataclass
class Script:
    """An example script of a page: its blocks joined, as a reader saves them into one file."""

    page: str
    file: str
    command: str
    code: str
    section: str   # where its first block stands, with its install line if it has one

    @property
    def name(self) -> str:
        return f"{self.page}:{self.file}"


def blocks_of(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, in order, each with the section it stands in."""
    headings = [(match.start(), match.group(0)) for match in HEADING.finditer(text)]
    blocks = []
    for match in FENCED.finditer(text):
        section = next((heading for start, heading in reversed(headings) if start < match.start()), "")
        blocks.append(Block(match["language"], match["code"], section))
    return blocks


def python_blocks(text: str) -> list[str]:
    return [block.code for block in blocks_of(text) if block.language == "python"]


def scripts_of(page: Path) -> list[Script]:
    scripts: list[Script] = []
    for block in blocks_of(page.read_text()):
        if block.language != "python":
            continue
        started, continued = SCRIPT.match(block.code), CONTINUED.match(block.code)
        if started:
            scripts.append(Script(page.name, started["file"], started["command"], block.code, block.section))
        elif continued:
            assert scripts and scripts[-1].file == continued["file"], (
                f"{page.name}: '# {continued['file']}, continued' follows no block of {continued['file']}")
            scripts[-1].code += "\n\n" + block.code
    return scripts


def install_line(page: Path, section: str) -> list[str]:
    """What the ``pip install`` lines of a page's section install, as pip arguments; none: []."""
    arguments: list[str] = []
    for block in blocks_of(page.read_text()):
        if block.section == section and block.language in ("bash", "console", "sh"):
            arguments += [argument for match in PIP_INSTALL.finditer(block.code)
                          for argument in shlex.split(match["arguments"])]
    return arguments


def markdown_section(text: str, heading: str) -> str:
    """The text under ``heading`` (a ``## `` line), up to the next heading of that level."""
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


# -- checkpoints written atomically -----------------------------------------------------------------------------


def _is_call(node: ast.AST, owner: str, name: str) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name
            and isinstance(node.func.value, ast.Name) and node.func.value.id == owner)


def _written_file(statement: ast.stmt) -> ast.expr | None:
    """The file a statement writes a checkpoint to: ``torch.save(obj, FILE)``, or ``json.dump`` into a
    ``with open(FILE, "w")``; None for any other statement."""
    if isinstance(statement, ast.Expr) and _is_call(statement.value, "torch", "save"):
        call = statement.value
        assert isinstance(call, ast.Call)
        return call.args[1] if len(call.args) > 1 else next(k.value for k in call.keywords if k.arg == "f")
    if isinstance(statement, ast.With) and any(_is_call(node, "json", "dump") for node in ast.walk(statement)):
        for item in statement.items:
            opened = item.context_expr
            if (isinstance(opened, ast.Call) and isinstance(opened.func, ast.Name) and opened.func.id == "open"
                    and len(opened.args) > 1 and isinstance(opened.args[1], ast.Constant)
                    and "w" in str(opened.args[1].value)):
                return opened.args[0]
    return None


def _beside(temporary: ast.expr, final: ast.expr) -> bool:
    """Whether ``temporary`` names a file in ``final``'s folder: a literal in the same folder, or a name built
    from the final one (``path + ".tmp"``, ``f"{path}.tmp"``)."""
    if isinstance(temporary, ast.Constant) and isinstance(final, ast.Constant):
        return os.path.dirname(str(temporary.value)) == os.path.dirname(str(final.value))
    return ast.unparse(final) in ast.unparse(temporary)


def unsafe_checkpoint_writes(code: str) -> list[str]:
    """The checkpoint writes of a block not made atomic: each must write a temporary file in the checkpoint's
    folder, and the next statement must be ``os.replace(temporary, checkpoint)``."""
    unsafe = []
    for node in ast.walk(ast.parse(code)):
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(node, field, None)
            if not isinstance(statements, list):
                continue
            for index, statement in enumerate(statements):
                written = _written_file(statement)
                if written is None:
                    continue
                following = statements[index + 1] if index + 1 < len(statements) else None
                replace = following.value if isinstance(following, ast.Expr) else None
                if not (isinstance(replace, ast.Call) and _is_call(replace, "os", "replace") and len(replace.args) == 2
                        and ast.unparse(replace.args[0]) == ast.unparse(written)
                        and ast.unparse(replace.args[1]) != ast.unparse(written)
                        and _beside(written, replace.args[1])):
                    unsafe.append(f"line {statement.lineno}: {ast.unparse(statement).splitlines()[0]}")
    return unsafe
