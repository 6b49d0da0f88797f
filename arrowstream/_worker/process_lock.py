"""A lock between the trainer and its workers that a dead holder does not keep.

``multiprocessing.Lock`` is a semaphore: a worker killed while it holds one (SIGKILL, the OOM killer) holds
it forever, and whoever asks for it next waits forever, the trainer too when it next writes a checkpoint.
:class:`ProcessLock` is a POSIX record lock (``fcntl.lockf``) on an unlinked temporary file: the kernel
releases it when its holder dies, so the next holder goes on. What the dead holder wrote under the lock may
be half done: the data it guards must be written so that every prefix of a step is a state the others can
read (see ``arrowstream._worker.lease_pool``).

Record locks belong to a process, not a thread, so a thread lock orders the threads of one process first.
Workers started by fork inherit the file; workers started by spawn or forkserver get a duplicate of its
descriptor when the lock is pickled for them (as ``multiprocessing.Lock``, only while they are started).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
from multiprocessing import context, reduction
from types import TracebackType
from typing import IO, Any


class ProcessLock:
    """A lock between processes that the kernel releases when its holder dies; ``with lock:`` holds it.

    Example::

        lock = ProcessLock()
        with lock:
            ...   # no other process (and no other thread of this one) is here
    """

    def __init__(self, file: IO[bytes] | None = None) -> None:
        self._file = file if file is not None else tempfile.TemporaryFile(prefix="arrowstream-lock-")  # noqa: SIM115 (lives with the lock)
        self._threads = threading.Lock()

    def __enter__(self) -> None:
        self._threads.acquire()
        try:
            fcntl.lockf(self._file.fileno(), fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        try:
            fcntl.lockf(self._file.fileno(), fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def __reduce__(self) -> tuple[Any, ...]:
        context.assert_spawning(self)   # elsewhere a duplicate closed later would release this process's lock
        return _rebuild, (reduction.DupFd(self._file.fileno()),)


def _rebuild(duplicate: Any) -> ProcessLock:
    """The lock in a process started by spawn or forkserver, on its own descriptor of the same file."""
    return ProcessLock(os.fdopen(duplicate.detach(), "r+b"))
