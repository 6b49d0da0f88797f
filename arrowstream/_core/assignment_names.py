"""The names of the ``assignment=`` policies, in one tuple that imports nothing.

The command line offers them (``arrowstream bench --assignment``) without importing torch, which the policies
need; :mod:`arrowstream._assignment` checks at import that its registry, ``ASSIGNMENTS``, holds these names in
this order, so the two cannot drift apart.
"""

from __future__ import annotations

ASSIGNMENT_NAMES = ("static", "dynamic")
"""Every ``assignment=`` a dataset takes, the default first."""
