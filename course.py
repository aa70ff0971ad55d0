#!/usr/bin/env python3
"""Set up and run the course with one command, the same on Linux, macOS and Windows.

    python course.py lab     # first time: make .venv, install the course, then open JupyterLab
    python course.py test    # install if needed, then run the whole test suite (pytest)
    python course.py setup   # only install

The environment lives in .venv next to this file and is reinstalled only when requirements.txt or
pyproject.toml change. Run from an already activated virtual environment (or conda env), the
course installs into that one instead. Only the standard library is used here, on purpose: this
script runs before anything is installed.

PyTorch: on Linux and Windows machines without an NVIDIA driver, the small CPU-only build is
installed first (the default download is a CUDA build of several GB). Set COURSE_TORCH=default to
skip that and let pip choose, e.g. to get CUDA support.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP_NAME = ".attn_course-installed"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_SPEC = "torch>=2.3,<2.14"  # keep in step with requirements.txt
FIRST_NOTEBOOK = "notebooks/00_setup.ipynb"


def say(message: str) -> None:
    print(f"[course] {message}", flush=True)


def in_active_env() -> bool:
    return sys.prefix != sys.base_prefix or bool(os.environ.get("CONDA_PREFIX"))


def env_python() -> Path:
    if in_active_env():
        return Path(sys.executable)
    sub = "Scripts/python.exe" if os.name == "nt" else "bin/python"
    return VENV / sub


def wanted_digest() -> str:
    h = hashlib.sha256()
    for name in ("requirements.txt", "pyproject.toml"):
        h.update((ROOT / name).read_bytes())
    return h.hexdigest()[:16]


def run(*cmd: object, check: bool = True) -> int:
    code = subprocess.call([str(c) for c in cmd], cwd=ROOT)
    if check and code != 0:
        say(f"command failed ({code}): {' '.join(map(str, cmd))}")
        sys.exit(code)
    return code


def wants_cpu_torch(python: Path) -> bool:
    if os.environ.get("COURSE_TORCH", "cpu") == "default" or platform.system() == "Darwin":
        return False  # macOS wheels on PyPI are already CPU/MPS builds
    if shutil.which("nvidia-smi"):
        return False  # an NVIDIA GPU is there: let pip take the CUDA build
    has_torch = subprocess.call([str(python), "-c", "import torch"], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL) == 0
    return not has_torch


def setup() -> Path:
    python = env_python()
    if not in_active_env() and not python.exists():
        say(f"creating a virtual environment in {VENV.name}/")
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = Path(sys.prefix if in_active_env() else VENV) / STAMP_NAME
    if stamp.exists() and stamp.read_text().strip() == wanted_digest():
        return python
    say("installing the course (a few minutes the first time)")
    if wants_cpu_torch(python):
        say("installing the CPU-only build of PyTorch (set COURSE_TORCH=default to skip)")
        code = run(python, "-m", "pip", "install", "--retries", "1", "--timeout", "30",
                   "--index-url", CPU_TORCH_INDEX, TORCH_SPEC, check=False)
        if code != 0:
            say("the CPU-only PyTorch index could not be used; pip will choose a build instead")
    run(python, "-m", "pip", "install", "-r", "requirements.txt")
    stamp.write_text(wanted_digest() + "\n")
    say("installed")
    return python


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command in ("help", "-h", "--help"):
        print(__doc__)
        return 0
    if command not in ("setup", "lab", "test"):
        say(f"unknown command {command!r}; use setup, lab or test")
        return 2
    python = setup()
    if command == "lab":
        say("opening JupyterLab (stop it with Ctrl+C)")
        args = rest or [FIRST_NOTEBOOK]
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers often run as root; JupyterLab refuses it
            say("running as root (a container?): passing --allow-root to JupyterLab")
            args = [*args, "--allow-root"]
        return run(python, "-m", "jupyterlab", *args, check=False)
    if command == "test":
        return run(python, "-m", "pytest", *rest, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
