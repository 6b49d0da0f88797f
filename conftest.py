"""The suite's root: loads tests/hangs.py for every item, the package's doctests included (tests/conftest.py
serves tests/ only): a test that outlives its timeout ends its process with its stacks, which the run prints."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tests"))

pytest_plugins = ["hangs"]
