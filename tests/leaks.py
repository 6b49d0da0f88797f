"""What a test leaves behind: threads, child processes and ``/dev/shm`` entries (see conftest.py's fixture).

A :class:`Snapshot` is taken before a test and compared after it. What is new after the test, and still
there after a short grace period (a DataLoader's workers take a moment to exit), is a leak, except:

- threads and processes that live as long as the test process and are started once on first use
  (``SESSION_THREADS``, :func:`session_pools`, :func:`session_processes`, threads started outside
  Python), each with the reason;
- the object-store servers of the session (their process groups, ``servers.server_process_groups()``);
- ``/dev/shm`` entries of processes outside this test process's tree: other test runs share the
  machine's ``/dev/shm``, so an entry still mapped or open by a process that is not ours, or named
  by torch after a live process that is not ours (``torch_<pid>_...``), is theirs; a semaphore
  (``sem.mp-...``, named at random) is ours only if this process made it (:func:`record_semaphores`),
  as another run's that its dead owner left for its resource tracker to remove is mapped by nobody.

The cheap comparison runs after every test; the garbage collector, the grace period and the scan of
``/proc`` run only when something new is found.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

SHM = "/dev/shm"
GRACE_S = 5.0

# name prefix -> why a thread of that name may outlive the test that started it
SESSION_THREADS = {
    "fsspecIO": "fsspec's event-loop thread: one per process, started by the first async filesystem, kept until exit",
    "asyncio_": "the default executor of fsspec's event loop (getaddrinfo of aiohttp): owned by that loop",
    "tqdm_monitor": "tqdm's monitor of progress bars (the CLI's): one per process, kept after the last bar closes",
    "gcsfs-deferred-close": "gcsfs's one thread per process that closes files collected by the garbage collector, "
                            "started by the first GCS file opened",
}
_TORCH_SHM = re.compile(r"^torch_(\d+)_")


_SEMAPHORES_MADE_HERE: set[str] = set()


def record_semaphores() -> None:
    """Note the ``/dev/shm`` name of every multiprocessing semaphore this process makes (a DataLoader's
    queues), to tell them from other runs' (wraps ``SemLock.__init__``; call once, at session start)."""
    from multiprocessing import synchronize

    made = synchronize.SemLock.__init__

    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        name = getattr(self._semlock, "name", None)
        if name:
            _SEMAPHORES_MADE_HERE.add("sem." + name.lstrip("/"))

    synchronize.SemLock.__init__ = recording


def session_pools() -> set[threading.Thread]:
    """Threads of pools that live as long as the test process: pyiceberg's one executor per process
    (``ExecutorFactory``, started by the first table scan), which it never shuts down."""
    concurrent = sys.modules.get("pyiceberg.utils.concurrent")
    executor = None if concurrent is None else concurrent.ExecutorFactory._instance
    return set(getattr(executor, "_threads", ()))


def session_processes() -> set[int]:
    """Children that live as long as the test process: multiprocessing's resource tracker (one per
    process, started by the first spawned worker) and its forkserver (started by the first forkserver
    worker); both are stopped at exit."""
    pids = {getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None),
            getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)}
    return {pid for pid in pids if pid is not None}


def descendants(pid: int) -> list[int]:
    """The live (not zombie) processes below ``pid``."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return []
    return [d for c in children if not _zombie(c) for d in (c, *descendants(c))]


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _group(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except OSError:
        return -1


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir(SHM))
    except OSError:
        return set()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


@dataclass(frozen=True)
class Snapshot:
    threads: frozenset[threading.Thread]
    processes: frozenset[int]
    shm: frozenset[str]

    @classmethod
    def take(cls) -> Snapshot:
        return cls(frozenset(threading.enumerate()), frozenset(descendants(os.getpid())), frozenset(_shm_entries()))

    def new_threads(self) -> list[threading.Thread]:
        # a thread started outside Python (pyarrow's C++ I/O pool reading through a Python file) is listed as a
        # "dummy" once it runs Python code, and stays listed: Python never learns that it ended, and the pools
        # it comes from live as long as the process
        pools = session_pools()
        return [t for t in threading.enumerate() if t not in self.threads and t.is_alive() and t not in pools
                and not isinstance(t, threading._DummyThread)
                and not any(t.name.startswith(prefix) for prefix in SESSION_THREADS)]

    def new_processes(self, allowed_groups: set[int]) -> list[int]:
        allowed = session_processes()
        return [pid for pid in descendants(os.getpid()) if pid not in self.processes and pid not in allowed
                and _group(pid) not in allowed_groups]

    def new_shm(self) -> set[str]:
        return _shm_entries() - self.shm

    def leaks(self, allowed_groups: set[int], grace_s: float = GRACE_S) -> list[str]:
        """What the test left behind and kept for ``grace_s`` seconds, one line each (empty when nothing)."""
        if not (self.new_threads() or self.new_processes(allowed_groups) or self.new_shm()):
            return []
        gc.collect()   # loaders, prefetchers and queues nobody holds any more end their threads and workers here
        shm = _ours(self.new_shm())   # scanned once: other test runs' entries come and go all the time
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (self.new_threads() or self.new_processes(allowed_groups)
                                                or _existing(shm)):
            time.sleep(0.05)
        found = [f"thread {t.name!r} ({'daemon' if t.daemon else 'not daemon'}, target "
                 f"{getattr(getattr(t, '_target', None), '__qualname__', type(t).__name__)})"
                 for t in self.new_threads()]
        found += [f"process {pid} ({_cmdline(pid)})" for pid in self.new_processes(allowed_groups)]
        found += [f"{SHM}/{name}" for name in sorted(_existing(shm))]
        return found


def _existing(names: set[str]) -> set[str]:
    return {name for name in names if os.path.exists(f"{SHM}/{name}")}


def _ours(names: set[str]) -> set[str]:
    """The entries among ``names`` that no process outside this one's tree maps, holds open or is named after."""
    if not names:
        return set()
    tree = {os.getpid(), *descendants(os.getpid())}
    theirs = {name for name in names if name.startswith("sem.") and name not in _SEMAPHORES_MADE_HERE}
    for name in names:
        match = _TORCH_SHM.match(name)
        if match and int(match.group(1)) not in tree and os.path.exists(f"/proc/{match.group(1)}"):
            theirs.add(name)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in tree:
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry.name}/maps") as f:
                maps = f.read()
            theirs |= {name for name in names if f"{SHM}/{name}" in maps}
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith(SHM + "/"):
                        theirs.add(target[len(SHM) + 1:].removesuffix(" (deleted)"))
    return names - theirs
