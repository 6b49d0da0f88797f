"""A griffe extension for the API reference: make the package's docstrings render as written.

- ``Example:`` (Napoleon's singular, used throughout arrowstream) is read as ``Examples:``, so
  griffe turns its ``>>>`` lines into code blocks instead of an admonition of plain text.
- reST roles (``:class:`X```, ``:meth:`X```, ...) become inline code.

mkdocs.yml loads it (``extensions:`` of the mkdocstrings python handler); it is not a page.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE_HEADER = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)
_REST_ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data|obj):`~?([^`]+)`")


class DocstringsAsWritten(griffe.Extension):
    """Rewrites each docstring before griffe parses it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        value = _EXAMPLE_HEADER.sub(r"\1Examples:", obj.docstring.value)
        obj.docstring.value = _REST_ROLE.sub(r"`\1`", value)
