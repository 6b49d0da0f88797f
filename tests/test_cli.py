"""The command line: ``arrowstream demo`` runs the whole story and checks it."""

from __future__ import annotations

import subprocess
import sys


def test_demo_trains_checkpoints_resumes_and_proves_exactly_once(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "arrowstream", "demo", "--rows", "30000", "--batch-size", "256",
         "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "checkpoint saved after" in out
    assert out.count("every row exactly once") == 2
    assert "resumed batches equal the uninterrupted run" in out
    assert "rows/s" in out
    assert (tmp_path / "checkpoint.pt").exists()


def test_demo_fails_loudly_when_the_checkpoint_is_wrong(tmp_path, monkeypatch):
    """The demo's own check is real: a resume that skips a batch is caught."""
    from arrowstream import _demo
    from arrowstream.cli import main

    original = _demo.run_phase

    def skip_one_batch(args):
        code = original(args)
        if args.phase == "resume":
            import json
            path = tmp_path / "resume.json"
            record = json.loads(path.read_text())
            record["batches"] = record["batches"][1:]
            path.write_text(json.dumps(record))
        return code

    def run_in_process(cmd, check):
        argv = cmd[cmd.index("demo"):]
        assert main(argv) == 0

    monkeypatch.setattr(_demo, "run_phase", skip_one_batch)
    monkeypatch.setattr(_demo.subprocess, "run", run_in_process)
    assert main(["demo", "--rows", "5000", "--batch-size", "256", "--workers", "0", "--dir", str(tmp_path)]) == 1


def test_demo_on_an_iceberg_table_resumes_on_the_pinned_snapshot(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "arrowstream", "demo", "--iceberg", "--rows", "30000", "--batch-size", "256",
         "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "Iceberg table demo.regression" in out
    assert "the table moves on: 7,500 rows appended" in out
    assert out.count("every row exactly once") == 2          # of the 30,000 rows of the pinned snapshot
    assert "resumed batches equal the uninterrupted run" in out
    assert (tmp_path / "data" / "catalog.db").exists()
