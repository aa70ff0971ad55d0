#!/usr/bin/env python3
"""Set up and run the course with one command, the same on Linux, macOS and Windows.

    python course.py lab       # first time: make .venv, install the course, open JupyterLab at notebook 00
    python course.py grade     # grade your notebooks: one row per exercise (passed / failed: why / not attempted)
    python course.py update    # get the course's latest version without losing any of your work
    python course.py test      # install if needed, then run the whole test suite (what CI runs)
    python course.py setup     # only install

The environment lives in .venv next to this file and is reinstalled only when pyproject.toml or
requirements.txt change. Run from an already activated virtual environment (or conda env), the
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
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP_NAME = ".attn_course-installed"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
FIRST_NOTEBOOK = "notebooks/00_setup.ipynb"
SERVER_CONFIG = ROOT / "binder" / "jupyter_server_config.json"  # kernel culling; also used by Binder


def say(message: str) -> None:
    print(f"[course] {message}", flush=True)


def torch_spec() -> str:
    """The torch requirement as pyproject.toml states it (the one place versions are written)."""
    match = re.search(r'"(torch\s*[<>=!~][^"]*)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return match.group(1).replace(" ", "") if match else "torch"


def in_active_env() -> bool:
    return sys.prefix != sys.base_prefix or bool(os.environ.get("CONDA_PREFIX"))


def env_prefix() -> Path:
    return Path(sys.prefix) if in_active_env() else VENV


def env_python() -> Path:
    if in_active_env():
        return Path(sys.executable)
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def wanted_digest() -> str:
    h = hashlib.sha256()
    for name in ("requirements.txt", "pyproject.toml", "binder/jupyter_server_config.json"):
        path = ROOT / name
        if path.exists():
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def run(*cmd: object, check: bool = True, env: dict[str, str] | None = None) -> int:
    code = subprocess.call([str(c) for c in cmd], cwd=ROOT, env=env)
    if check and code != 0:
        say(f"command failed ({code}): {' '.join(map(str, cmd))}")
        sys.exit(code)
    return code


def wants_cpu_torch(python: Path) -> bool:
    if os.environ.get("COURSE_TORCH", "cpu") == "default" or platform.system() == "Darwin":
        return False  # macOS wheels on PyPI are already CPU/MPS builds
    if shutil.which("nvidia-smi"):
        return False  # an NVIDIA GPU is there: let pip take the CUDA build
    has_torch = subprocess.call([str(python), "-c", "import torch"], stderr=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL) == 0
    return not has_torch


def install_server_config(prefix: Path) -> None:
    """Put the course's Jupyter server settings (idle kernels culled) where this environment's Jupyter reads them."""
    target = prefix / "etc" / "jupyter" / "jupyter_server_config.d" / "attn-course.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SERVER_CONFIG, target)


def setup() -> Path:
    python = env_python()
    if not in_active_env() and not python.exists():
        say(f"creating a virtual environment in {VENV.name}/")
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = env_prefix() / STAMP_NAME
    if stamp.exists() and stamp.read_text().strip() == wanted_digest():
        return python
    say("installing the course (a few minutes the first time)")
    if wants_cpu_torch(python):
        say("installing the CPU-only build of PyTorch (set COURSE_TORCH=default to skip)")
        code = run(python, "-m", "pip", "install", "--retries", "1", "--timeout", "30",
                   "--index-url", CPU_TORCH_INDEX, torch_spec(), check=False)
        if code != 0:
            say("the CPU-only PyTorch index could not be used; pip will choose a build instead")
    run(python, "-m", "pip", "install", "-r", "requirements.txt")
    install_server_config(env_prefix())
    stamp.write_text(wanted_digest() + "\n")
    say("installed")
    return python


def env_with_venv() -> dict[str, str]:
    """This environment with the course's interpreter first on PATH, so that `python` in JupyterLab's
    terminal (and every subprocess) is the course's Python."""
    env = dict(os.environ)
    if not in_active_env():
        bin_dir = VENV / ("Scripts" if os.name == "nt" else "bin")
        env["PATH"] = str(bin_dir) + os.pathsep + env.get("PATH", "")
        env["VIRTUAL_ENV"] = str(VENV)
    return env


def lab(python: Path, rest: list[str]) -> int:
    say("opening JupyterLab at notebook 00 (stop it with Ctrl+C)")
    args = [f"--ServerApp.root_dir={ROOT}"]
    if rest:
        args += rest
    else:
        # Open notebook 00 in the browser and print a URL that opens it too (headless machines).
        args += [FIRST_NOTEBOOK, f"--LabApp.default_url=/lab/tree/{FIRST_NOTEBOOK}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers often run as root; JupyterLab refuses it
        say("running as root (a container?): passing --allow-root to JupyterLab")
        args.append("--allow-root")
    return run(python, "-m", "jupyterlab", *args, check=False, env=env_with_venv())


def test(python: Path, rest: list[str]) -> int:
    parallel = []
    if subprocess.call([str(python), "-c", "import xdist"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0:
        parallel = ["-n", "auto", "--dist", "loadfile"]  # a notebook's cells stay on one worker, in order
    return run(python, "-m", "pytest", *parallel, *rest, check=False, env=env_with_venv())


# ----------------------------------------------------------------------------- update
def git(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def update() -> int:
    """Bring in the course's new version. Your work is never overwritten: a notebook you changed that
    the course also changed keeps your version, and the new one is saved beside it as
    ``NN_topic.updated.ipynb``."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        say("this folder is not a git clone (or git is missing): download the course again into a new folder "
            "and copy your notebooks over")
        return 2
    try:
        branch = git("rev-parse", "--abbrev-ref", "HEAD").stdout.strip()
        upstream = git("rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{u}", check=False).stdout.strip()
        if not upstream:
            say(f"branch {branch!r} follows no remote branch; nothing to update from")
            return 2
        say(f"fetching {upstream}")
        git("fetch", "--quiet")
        ahead = int(git("rev-list", "--count", f"{upstream}..HEAD").stdout.strip())
        if ahead:
            say(f"you have {ahead} commit(s) of your own; merge the course's version yourself: git merge {upstream}")
            return 2
        incoming = set(filter(None, git("diff", "--name-only", "HEAD", upstream).stdout.splitlines()))
        if not incoming:
            say("already up to date")
            return 0
        mine = set()
        for line in git("status", "--porcelain", "--untracked-files=no").stdout.splitlines():
            mine.add(line[3:].split(" -> ")[-1].strip('"'))
        both = sorted(incoming & mine)
        kept = {path: (ROOT / path).read_bytes() for path in both if (ROOT / path).exists()}
        for path in kept:  # set your version aside (in memory) so the fast-forward can go through
            git("checkout", "HEAD", "--", path)
        try:
            git("merge", "--ff-only", "--quiet", upstream)
        finally:
            for path, content in kept.items():
                new = ROOT / path
                if new.exists() and new.read_bytes() != content:
                    beside = new.with_name(new.stem + ".updated" + new.suffix)
                    shutil.copyfile(new, beside)
                    say(f"{path}: you changed it and so did the course; yours is kept, the new version is {beside.relative_to(ROOT)}")
                new.write_bytes(content)
        say(f"updated to {git('rev-parse', '--short', 'HEAD').stdout.strip()}; {len(incoming)} file(s) changed upstream")
    except RuntimeError as exc:
        say(str(exc))
        return 1
    return 0


COMMANDS = ("setup", "lab", "test", "grade", "update")


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command in ("help", "-h", "--help"):
        print(__doc__)
        return 0
    if command not in COMMANDS:
        say(f"unknown command {command!r}; use one of: {', '.join(COMMANDS)}")
        return 2
    if command == "update":
        return update()
    python = setup()
    if command == "lab":
        return lab(python, rest)
    if command == "test":
        return test(python, rest)
    if command == "grade":
        return run(python, "-m", "attn_course", "grade", *rest, check=False, env=env_with_venv())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
