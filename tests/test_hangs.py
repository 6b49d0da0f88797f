"""The suite's last resort against a hang (tests/hangs.py, loaded by the root conftest.py): a test that outlives
its timeout, in a way pytest-timeout's signal cannot end, ends its pytest-xdist worker; the run goes on and
prints where the test stood."""

from __future__ import annotations

import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))

HANGING = '''
import time
import pytest

@pytest.mark.timeout(1)
def test_hangs_through_its_timeout():
    try:
        time.sleep(60)
    finally:   # swallows pytest-timeout's failure: only the process's end stops it
        while True:
            try:
                time.sleep(60)
            except BaseException:
                pass

def test_after_it():
    pass
'''


def test_a_test_that_outlives_its_timeout_ends_its_worker_and_the_run_prints_where_it_stood(tmp_path):
    (tmp_path / "test_hanging.py").write_text(HANGING)
    env = {**os.environ, "PYTHONPATH": TESTS, "ARROWSTREAM_HANG_GRACE_S": "1"}
    command = [sys.executable, "-m", "pytest", "-p", "hangs", "-p", "no:cacheprovider", "-n", "1", "-q", "test_hanging.py"]
    run = subprocess.run(command, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    assert "worker 'gw0' crashed while running 'test_hanging.py::test_hangs_through_its_timeout'" in out
    assert "test_hanging.py::test_hangs_through_its_timeout did not end 2 s after it started (timeout 1 s)" in out
    assert 'test_hanging.py", line 12 in test_hangs_through_its_timeout' in out
    assert "/_pytest/" not in out.split("did not end")[1]   # pytest's own frames left out
    assert "1 failed, 1 passed" in out
