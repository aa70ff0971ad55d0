"""Shared by the launch checks in scripts/ (Binder, Colab, nbgrader): throwaway virtual environments and a
clean copy of the course, built quietly.

* ``venv_with_torch`` builds a virtual environment once (kept under .cache/, rebuilt when what it was built
  from changes, or when an earlier build stopped half-way) whose PyTorch is the CPU build pinned in
  binder/requirements.txt, installed FIRST and on its own, so that nothing installed afterwards can pull
  a second (CUDA) PyTorch.
* ``source_copy`` copies the course's files (what git tracks, plus new files git does not ignore) into a
  folder, so that ``pip install .`` builds there and never writes build/ or *.egg-info into the checkout
  that other people are working in.
* ``quiet`` runs a command and prints nothing unless it fails; then it prints the command and the end of
  what it said, and stops the script.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache"


def quiet(cmd: list, *, what: str, **kwargs) -> subprocess.CompletedProcess:
    """Run ``cmd`` with its output captured; on failure print ``what`` failed and why, and exit 1."""
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-4000:]
        print(f"FAILED  {what}: {' '.join(map(str, cmd))} (exit {result.returncode})\n{tail}")
        raise SystemExit(1)
    return result


def binder_pins() -> dict[str, str]:
    """``{name: version}`` for every ``name==version`` line of binder/requirements.txt."""
    out = {}
    for line in (ROOT / "binder" / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            out[name.strip().lower()] = version.strip()
    return out


def torch_spec() -> str:
    """``torch==X.Y.Z`` for the pinned CPU build (without ``+cpu``: pip finds the build on the local wheel
    folder or the PyTorch CPU index; a local file wins over PyPI's CUDA build of the same version)."""
    return "torch==" + binder_pins()["torch"].split("+")[0]


def bin_dir(env: Path) -> Path:
    return env / ("Scripts" if os.name == "nt" else "bin")


def venv_with_torch(env: Path, installs: list[list[str]], *, key: str = "", fresh: bool = True) -> Path:
    """Create (or reuse) the virtual environment ``env``: PyTorch first, then each pip argument list of
    ``installs`` in turn. Returns its python. When ``installs`` or ``key`` change (or an earlier build
    stopped half-way) it is rebuilt: from nothing if ``fresh`` and it was built from something else, else by
    installing again on top. An index that cannot be reached is given up at once (``PIP_RETRIES=0``): the
    PyTorch CPU index of binder/requirements.txt is unreachable where the CPU build lies on disk."""
    python = bin_dir(env) / ("python.exe" if os.name == "nt" else "python")
    digest = hashlib.sha256(repr((torch_spec(), installs, key, sys.version_info[:2])).encode()).hexdigest()
    stamp = env / ".built-from"
    if stamp.exists() and stamp.read_text() == digest and python.exists():
        return python
    usable = python.exists() and subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0
    changed = stamp.exists()  # built completely from something else (no stamp: a build that stopped half-way)
    if (fresh and changed) or not usable:
        shutil.rmtree(env, ignore_errors=True)
        venv.EnvBuilder(with_pip=True).create(env)
    stamp.unlink(missing_ok=True)
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    pip_env = dict(os.environ, PIP_RETRIES=os.environ.get("PIP_RETRIES", "0"))
    quiet([*pip, torch_spec()], what=f"installing PyTorch into {env.name}", env=pip_env)
    for args in installs:
        quiet([*pip, *args], what=f"building {env.name}", cwd=ROOT, env=pip_env)
    stamp.write_text(digest)
    return python


def source_copy(dest: Path) -> Path:
    """Copy the course's files (tracked, and untracked but not ignored) into ``dest``; return ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    dest.mkdir(parents=True, exist_ok=True)
    if listed.returncode == 0:
        for name in filter(None, listed.stdout.split("\0")):
            source = ROOT / name
            if source.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest / name)
    else:  # not a git checkout (an unpacked archive): everything but caches and environments
        shutil.copytree(ROOT, dest, dirs_exist_ok=True, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", ".cache", "__pycache__", "*.egg-info", "build", ".pytest_cache"))
    return dest


def torch_distributions(python: Path) -> list[str]:
    """``["torch 2.13.0+cpu", ...]``: every installed distribution named torch (more than one = two PyTorches)."""
    out = quiet([python, "-c", "import importlib.metadata as m; print('\\n'.join(d.metadata['Name'] + ' ' + d.version "
                 "for d in m.distributions() if (d.metadata['Name'] or '').lower() == 'torch'))"],
                what="listing PyTorch")
    return out.stdout.split("\n")[:-1] if out.stdout else []
