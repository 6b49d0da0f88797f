"""A trainer process for the crash tests: iterates a loader and reports its worker pids."""

from __future__ import annotations

import json
import sys
import time

from helpers import make_loader

if __name__ == "__main__":
    path, pid_file = sys.argv[1:3]
    loader, dataset = make_loader(path, 2, batch_size=64, persistent_workers=True)
    it = iter(loader)
    next(it)
    with open(pid_file, "w") as f:
        json.dump([w.pid for w in loader._iterator._workers], f)
    while True:  # keep the workers busy until the test kills this process
        time.sleep(0.05)
