#!/usr/bin/env python3
"""Build an environment from binder/requirements.txt exactly as repo2docker does (pip install -r, then
binder/postBuild's non-editable install of the package) and run pytest inside it.

    python scripts/binder_env_test.py [PYTEST ARGS...]

Without arguments it runs a representative part of the suite: the version and registry tests, the
check core's tests and one solution notebook under strict nbval. The environment is kept in
.cache/binder-venv and rebuilt when binder/requirements.txt changes.
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
VENV = ROOT / ".cache" / "binder-venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
DEFAULT = ["tests/test_versions.py", "tests/test_registry.py", "tests/checks/test_core.py", "solutions/05_attention.ipynb"]


def main(argv: list[str]) -> int:
    # The PyTorch CPU index may be unreachable (as on this project's CI machines, which install from a
    # local mirror): fail over at once instead of retrying every package.
    os.environ.setdefault("PIP_RETRIES", "0")
    os.environ.setdefault("PIP_TIMEOUT", "10")
    digest = hashlib.sha256((ROOT / "binder" / "requirements.txt").read_bytes()).hexdigest()
    stamp = VENV / ".binder-requirements"
    if not stamp.exists() or stamp.read_text() != digest:
        shutil.rmtree(VENV, ignore_errors=True)
        print(f"building {VENV} from binder/requirements.txt")
        venv.EnvBuilder(with_pip=True).create(VENV)
        subprocess.run([BIN / "python", "-m", "pip", "install", "-q", "-r", "binder/requirements.txt"], cwd=ROOT, check=True)
        stamp.write_text(digest)
    # binder/postBuild's install: the package itself, non-editable, without further dependencies.
    subprocess.run([BIN / "python", "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", "."], cwd=ROOT,
                   check=True)
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    result = subprocess.run([BIN / "python", "-m", "pytest", "-q", *(argv or DEFAULT)], cwd=ROOT, env=env)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
