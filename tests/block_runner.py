"""Runs the docs' Python blocks for tests/test_docs.py, each in a fresh process forked from this one.

torch, pyarrow and arrowstream are imported once, here (about 3 s of CPU a process); each block then runs
in a child forked for it, as ``__main__`` in its own folder, with only the names it defines itself, and
exits as a script does (``atexit`` handlers, loader workers joined). Protocol, one JSON line per block
on stdin: ``{"folder": ..., "script": ..., "env": {...}}``; one JSON line back: ``{"returncode": int}``.
The block's stdout and stderr go to ``FOLDER/output.txt``.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

import numpy  # noqa: F401 (imported once for every block)
import pyarrow.parquet  # noqa: F401
import torch  # noqa: F401

import arrowstream  # noqa: F401


def run_script(folder: str, script: str, env: dict[str, str]) -> None:
    """In the forked child: the block as a script in ``folder``. An exception or ``sys.exit`` in it ends the
    child as it would end a script: a traceback on stderr and status 1, or the status given."""
    os.chdir(folder)
    os.environ.update(env)
    output = os.open("output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(output, 1)
    os.dup2(output, 2)
    sys.argv = [script]
    sys.path[0] = folder
    runpy.run_path(script, run_name="__main__")


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child ends here, as a script would, and never reads stdin again
            run_script(request["folder"], request["script"], request["env"])
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main()
