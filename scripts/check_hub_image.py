#!/usr/bin/env python3
"""Check the image Binder and a workshop hub build from this repository, without building it.

    python scripts/check_hub_image.py

repo2docker (installed on first use into .cache/r2d-venv) writes the Dockerfile it would build from
binder/ (``--no-build --debug``; no Docker engine needed). This script checks, in that Dockerfile and
in binder/postBuild, what the instructor guide promises a hub:

* binder/requirements.txt is installed into the environment the kernels and the server share;
* binder/postBuild runs, installing ``attn_course`` non-editably into that environment's site-packages
  (outside /home, so a hub's home volume cannot hide it) and the course's server settings (idle
  kernels culled) into that environment's etc/jupyter/jupyter_server_config.json;
* the Python version of binder/runtime.txt is used.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".cache" / "r2d-venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")


def main() -> int:
    if not (BIN / "repo2docker").exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
        subprocess.run([BIN / "python", "-m", "pip", "install", "-q", "jupyter-repo2docker"], check=True)
    result = subprocess.run([BIN / "repo2docker", "--no-build", "--debug", "--user-name", "jovyan", "--user-id",
                             "1000", "."], cwd=ROOT, capture_output=True, text=True)
    dockerfile = result.stdout + result.stderr
    post_build = (ROOT / "binder" / "postBuild").read_text()
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    checks = {
        "requirements installed into the kernel's environment":
            re.search(r'KERNEL_PYTHON_PREFIX\}/bin/pip install .*-r "binder/requirements.txt"', dockerfile),
        "the kernel and the server share one environment": "ENV KERNEL_PYTHON_PREFIX=${NB_PYTHON_PREFIX}" in dockerfile,
        "binder/postBuild runs": "./binder/postBuild" in dockerfile,
        f"Python {runtime.split('-')[1]} from runtime.txt": re.search(rf"python={re.escape(runtime.split('-')[1])}\b|PYTHON_VERSION={re.escape(runtime.split('-')[1])}", dockerfile),
        "attn_course installed non-editably": re.search(r"pip install --no-deps --no-cache-dir \.\s*$", post_build, re.M)
            and "-e ." not in post_build,
        "server settings installed into the environment's etc/jupyter":
            "python binder/install_server_config.py" in post_build
            and "jupyter_server_config.json" in (ROOT / "binder" / "install_server_config.py").read_text(),
    }
    for name, ok in checks.items():
        print(f"{'ok' if ok else 'FAILED':7} {name}")
    if not all(checks.values()):
        print(dockerfile[-4000:])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
