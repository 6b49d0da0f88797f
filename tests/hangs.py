"""A pytest plugin: the last resort against a test that hangs past its timeout (the root conftest.py loads it,
for every test and doctest of the suite).

pytest-timeout fails a test by SIGALRM when its time is up, and stops watching it then: a teardown that
blocks afterwards, or a wait the signal cannot break, would hold its pytest-xdist worker, and the whole run,
until CI gives up on it, with nothing in the log to say where. So each test also arms faulthandler's watchdog
(a C thread: it fires even when the GIL is never released) for its timeout plus :data:`GRACE_S`: the worker
writes every thread's stack into a file named after the test and exits, xdist reports the test as crashed and
goes on with a new worker, and the controller prints the file at the end of the run, where a CI log's tail
shows it.

The files live in a folder named after the controller's pid (a worker is its child), so that runs side by
side do not read each other's.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any

import pytest

GRACE_S = float(os.environ.get("ARROWSTREAM_HANG_GRACE_S", "60"))  # after a test's timeout, before its process ends

_file: IO[str] | None = None
_RUNNER_FRAMES = ("/_pytest/", "/pluggy/", "/execnet/", "/xdist/", "/pytest_timeout.py", 'File "<string>"')


def _folder(controller_pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"arrowstream-hangs-{controller_pid}"


def timeout_of(item: Any) -> float:
    """The timeout pytest-timeout gives ``item``: its ``timeout`` marker's, else the ini file's (0: none)."""
    marker = item.get_closest_marker("timeout")
    return float(marker.args[0]) if marker and marker.args else float(item.config.getini("timeout") or 0)


def arm(nodeid: str, timeout: float, in_worker: bool) -> None:
    """Before ``nodeid`` runs: its process dumps its stacks and exits ``timeout + GRACE_S`` seconds from now."""
    global _file
    if _file is None:
        folder = _folder(os.getppid() if in_worker else os.getpid())
        folder.mkdir(exist_ok=True)
        _file = open(folder / f"{os.getpid()}.txt", "w")  # noqa: SIM115 (faulthandler writes it until exit)
    _file.seek(0)
    _file.truncate()
    _file.write(f"{nodeid} did not end {timeout + GRACE_S:.0f} s after it started (timeout {timeout:.0f} s); "
                "its process's threads stood here:\n")
    _file.flush()
    faulthandler.dump_traceback_later(timeout + GRACE_S, exit=True, file=_file)


def disarm() -> None:
    faulthandler.cancel_dump_traceback_later()


def reports(controller_pid: int) -> list[str]:
    """What the processes of this run that hung wrote (a file holding only its header is a test that ended),
    and the folder removed."""
    folder = _folder(controller_pid)
    found = []
    for path in sorted(folder.glob("*.txt")):
        lines = path.read_text(errors="replace").splitlines(keepends=True)
        if len(lines) > 1:   # pytest's own frames left out: the CI log's tail keeps the test's
            found.append("".join(line for line in lines if not any(part in line for part in _RUNNER_FRAMES)))
    shutil.rmtree(folder, ignore_errors=True)
    return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    timeout = timeout_of(item)
    if timeout:
        arm(item.nodeid, timeout, in_worker="PYTEST_XDIST_WORKER" in os.environ)
    try:
        yield
    finally:
        disarm()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for report in reports(os.getpid()):
        terminalreporter.section("hung", sep="!")
        terminalreporter.write(report)
