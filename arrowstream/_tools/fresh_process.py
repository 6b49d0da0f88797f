"""Run a function in a new process (``spawn``), as a restarted job would, and get its result or its error.

Used by ``testing.check_resume(fresh_process=True)``. The function and its arguments travel by pickle,
so they must be importable by name (a module-level function, a ``functools.partial`` of one).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgumentError

WHY = "fresh_process=True runs it in a new process (spawn), which imports it by its module and name"


def check_importable(name: str, function: Any) -> None:
    """Refuse, naming the argument, a callable a spawned process cannot import: a lambda, a nested
    function, one typed into an interactive session, or anything else that does not pickle."""
    qualname = getattr(function, "__qualname__", "")
    if "<lambda>" in qualname or "<locals>" in qualname:
        kind = "a lambda" if "<lambda>" in qualname else "a function defined inside another function"
        raise InvalidArgumentError(f"{name}: {WHY}, and {qualname!r} is {kind}, which cannot be imported; define it "
                                   "at the top level of a module (bind arguments with functools.partial), or pass "
                                   "fresh_process=False")
    main = sys.modules.get("__main__")
    if getattr(function, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
        raise InvalidArgumentError(f"{name}: {WHY}, and {qualname!r} was defined in an interactive session, which "
                                   "a new process cannot import; put it in a module file, or pass fresh_process=False")
    try:
        pickle.dumps(function)
    except Exception as exc:
        raise InvalidArgumentError(f"{name}: {WHY}, and it cannot be pickled ({exc}); define it at the top level of "
                                   "a module (bind arguments with functools.partial), or pass fresh_process=False") \
            from exc


def run_in_fresh_process(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in a spawned process: its result, or its error raised again here (with the
    process's traceback as a note). The result comes back through a file, whatever its size."""
    context = multiprocessing.get_context("spawn")
    # a process started by spawn starts its own children (a loader's workers) by spawn too: give it this
    # process's default start method, as a restarted job has
    start_method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    with tempfile.TemporaryDirectory(prefix="arrowstream-fresh-process-") as folder:
        out = os.path.join(folder, "outcome.pickle")
        process = context.Process(target=_child, args=(function, args, out, start_method),
                                  name="arrowstream-fresh-process")
        process.start()
        try:
            process.join()
        finally:   # interrupted (Ctrl-C, a test's timeout): end the child too, rather than leave it running
            if process.is_alive():
                process.terminate()
                process.join(5)
                if process.is_alive():
                    process.kill()
                    process.join()
        if not os.path.exists(out):   # killed (out of memory?) or crashed before it wrote its outcome
            raise RuntimeError(f"the fresh process running {getattr(function, '__qualname__', function)} exited with "
                               f"code {process.exitcode} and sent nothing back")
        with open(out, "rb") as f:
            result, error, trace = pickle.load(f)
    if error is not None:
        error.add_note(f"in the fresh process:\n{trace}")
        raise error
    return result


def _child(function: Callable[..., Any], args: tuple[Any, ...], out: str, start_method: str) -> None:
    multiprocessing.set_start_method(start_method, force=True)
    outcome: tuple[Any, BaseException | None, str]
    try:
        outcome = (function(*args), None, "")
    except Exception as exc:  # noqa: BLE001 - the parent raises it again, whatever it is
        outcome = (None, exc, traceback.format_exc())
    try:
        payload = pickle.dumps(outcome)
        pickle.loads(payload)   # an error class whose __init__ takes other arguments pickles, but does not load
    except Exception:  # noqa: BLE001 - an error that does not pickle comes back as its text
        payload = pickle.dumps((None, RuntimeError(f"{type(outcome[1]).__name__}: {outcome[1]}"), outcome[2]))
    with open(out + ".part", "wb") as f:   # whole or absent: a process killed while writing leaves no outcome
        f.write(payload)
    os.replace(out + ".part", out)
