"""The peers' virtual environments: one per peer under ``benchmarks/.venvs/<peer>/`` (git-ignored).

Each peer gets its own venv so that its dependencies never constrain arrowstream's. Every venv
installs ``torch==2.13.0`` first (the local CPU build) and then the peer's packages with
``-c constraints.txt`` (the repository's, which pins that torch), so that no peer pulls a CUDA
build. A venv is made once; a stamp file records what was installed, and a venv whose
requirements changed, or whose install failed, is set up again on the next run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .common import BENCH_DIR, REPO_ROOT, log

VENV_ROOT = BENCH_DIR / ".venvs"
CONSTRAINTS = REPO_ROOT / "constraints.txt"
TORCH = "torch==2.13.0"
STAMP = ".suite-installed"
INSTALL_TIMEOUT_S = 1200

#: pip requirements of each peer, installed after torch. pyarrow reads the Parquet files the
#: converting peers (MosaicML, LitData) turn into their own formats; torchdata gives the HF peer
#: the ``StatefulDataLoader`` that its resume goes through. ``ray[data]`` alone is not enough for
#: ``iter_torch_batches`` (it imports ``ray.train``, which needs pydantic) nor for local paths
#: (Ray imports fsspec's HTTP file system, which needs aiohttp).
REQUIREMENTS: dict[str, list[str]] = {
    "hf": ["datasets", "torchdata", "pyarrow"],
    "mosaic": ["mosaicml-streaming", "pyarrow"],
    "litdata": ["litdata", "pyarrow"],
    "ray": ["ray[data]", "pydantic", "aiohttp", "pyarrow"],
}

#: The distributions whose versions the report names, per peer.
PACKAGES: dict[str, list[str]] = {
    "hf": ["datasets", "torch", "torchdata", "pyarrow"],
    "mosaic": ["mosaicml-streaming", "torch", "pyarrow"],
    "litdata": ["litdata", "torch", "pyarrow"],
    "ray": ["ray", "torch", "pyarrow"],
}


@dataclass(frozen=True)
class Venv:
    """A peer's environment: its python, or the reason there is none."""

    peer: str
    python: Path | None
    error: str | None = None
    versions: dict[str, str] | None = None


def venv_dir(peer: str) -> Path:
    return VENV_ROOT / peer


def ensure_venv(peer: str) -> Venv:
    """The peer's venv, created and installed when missing; an error text when that fails."""
    folder = venv_dir(peer)
    python = folder / "bin" / "python"
    wanted = {"torch": TORCH, "requirements": REQUIREMENTS[peer]}
    stamp = folder / STAMP
    if python.exists() and stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return Venv(peer, python, versions=installed_versions(python, peer))
    if folder.exists():
        shutil.rmtree(folder)
    VENV_ROOT.mkdir(parents=True, exist_ok=True)
    logfile = VENV_ROOT / f"{peer}-install.log"
    log(f"setting up the {peer} venv in {folder} (pip output: {logfile})")
    start = time.perf_counter()
    steps = [
        [sys.executable, "-m", "venv", str(folder)],
        [str(python), "-m", "pip", "install", "--quiet", TORCH],
        [str(python), "-m", "pip", "install", "--quiet", "-c", str(CONSTRAINTS), *REQUIREMENTS[peer]],
    ]
    with logfile.open("w") as out:
        for step in steps:
            out.write(f"$ {' '.join(step)}\n")
            out.flush()
            try:
                done = subprocess.run(step, stdout=out, stderr=subprocess.PIPE, text=True,
                                      timeout=INSTALL_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                return Venv(peer, None, f"`{' '.join(step[2:])}` did not finish in {INSTALL_TIMEOUT_S} s")
            out.write(done.stderr)
            if done.returncode != 0:
                return Venv(peer, None, f"`pip {' '.join(step[3:])}` failed (exit {done.returncode}): "
                                        f"{last_error(done.stderr)}")
    stamp.write_text(json.dumps(wanted))
    log(f"{peer} venv ready in {time.perf_counter() - start:.0f} s")
    return Venv(peer, python, versions=installed_versions(python, peer))


def last_error(stderr: str) -> str:
    """The informative lines of pip's stderr (the ERROR lines, else the last few)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    picked = errors or lines[-5:]
    return " ".join(picked)[:1500]


def installed_versions(python: Path, peer: str) -> dict[str, str]:
    """Versions of the peer's packages in its venv (``importlib.metadata``)."""
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for name in sys.argv[1:]:\n"
            "    try: out[name] = m.version(name)\n"
            "    except m.PackageNotFoundError: out[name] = 'not installed'\n"
            "print(json.dumps(out))")
    done = subprocess.run([str(python), "-c", code, *PACKAGES[peer]], capture_output=True, text=True, check=False)
    try:
        return dict(json.loads(done.stdout))
    except ValueError:
        return {name: "unknown" for name in PACKAGES[peer]}
