#!/usr/bin/env python3
"""Build the Binder / hub environment the way repo2docker does and run pytest inside it.

    python scripts/binder_env_test.py [-v] [PYTEST ARGS...]

1. A virtual environment (.cache/binder-venv, rebuilt when binder/requirements.txt changes; about 3
   minutes the first time) gets ``pip install -r binder/requirements.txt`` — its PyTorch, the pinned
   CPU build, installed first and on its own, so that nothing can pull a CUDA build.
2. A clean copy of the repository (what repo2docker copies into the image) runs ``binder/postBuild``
   itself, with that environment's ``python`` first on PATH.
3. With the copy moved away — as a hub's home volume hides the repository folder — ``attn_course``
   must still import, from the environment's site-packages, not as an editable install; and a Jupyter
   server started in the environment must read the course's culling settings from the environment's
   etc/jupyter (binder/jupyter_server_config.json).
4. pytest runs in the copy, in that environment: by default the version and registry tests, the
   check core's tests and one solution notebook under strict nbval (the pyproject's addopts).

Prints one line when all is well (``-v``: pytest's own output too); on a problem, what went wrong; exit 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _launch_env import CACHE, ROOT, quiet, source_copy, venv_with_torch  # noqa: E402

VENV = CACHE / "binder-venv"
DEFAULT = ["tests/test_versions.py", "tests/test_registry.py", "tests/checks/test_core.py", "solutions/05_attention.ipynb"]
# What a Jupyter server in the environment must end up with (binder/jupyter_server_config.json).
SERVER_PROBE = r'''
import json, sys
from jupyter_server.serverapp import ServerApp
app = ServerApp()
app.initialize(argv=["--ServerApp.root_dir=" + sys.argv[1]], find_extensions=False, new_httpserver=False)
km = app.kernel_manager
print(json.dumps({"MappingKernelManager": {k: getattr(km, k) for k in
                                           ("cull_idle_timeout", "cull_interval", "cull_connected", "cull_busy")},
                  "TerminalManager": {k: v for k, v in app.config.get("TerminalManager", {}).items()},
                  "ResourceUseDisplay": {k: v for k, v in app.config.get("ResourceUseDisplay", {}).items()}}))
'''
IMPORT_PROBE = ("import attn_course, importlib.metadata as m, json; d = m.distribution('attn_course'); "
                "print(json.dumps([attn_course.__file__, d.read_text('direct_url.json')]))")


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    argv = [a for a in argv if a != "-v"]
    started = time.monotonic()
    digest = hashlib.sha256((ROOT / "binder" / "requirements.txt").read_bytes()).hexdigest()
    python = venv_with_torch(VENV, [["-r", "binder/requirements.txt"]], key=digest)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="binder-") as tmp:
        tmp = Path(tmp)
        home = tmp / "home"
        home.mkdir()
        # No user-level Jupyter or pip configuration: only what the image itself carries counts.
        env.update(PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}", HOME=str(home),
                   JUPYTER_CONFIG_DIR=str(home / ".jupyter"), PIP_DISABLE_PIP_VERSION_CHECK="1")
        for key in ("JUPYTER_CONFIG_PATH", "JUPYTER_PATH", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
            env.pop(key, None)
        repo = source_copy(tmp / "repo")
        subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "attn_course"], capture_output=True, env=env)
        quiet(["bash", "binder/postBuild"], what="binder/postBuild", cwd=repo, env=env)

        hidden = repo.rename(tmp / "repo-hidden")  # a hub mounts the learner's home over the repository folder
        elsewhere = tmp / "elsewhere"
        elsewhere.mkdir()
        where, direct = json.loads(quiet([python, "-c", IMPORT_PROBE], what="import attn_course with the repository "
                                         "folder hidden", cwd=elsewhere, env=env).stdout)
        if json.loads(direct or "{}").get("dir_info", {}).get("editable") or "site-packages" not in where:
            problems.append(f"attn_course is editable or outside site-packages: {where}")
        expected = json.loads((ROOT / "binder" / "jupyter_server_config.json").read_text())
        got = json.loads(quiet([python, "-c", SERVER_PROBE, elsewhere], what="starting a Jupyter server's "
                               "configuration", cwd=elsewhere, env=env).stdout.strip().splitlines()[-1])
        if got != expected:
            problems.append(f"the Jupyter server in the environment read {got}, not binder/jupyter_server_config.json's {expected}")
        repo = hidden.rename(tmp / "repo")

        result = subprocess.run([python, "-m", "pytest", "-q", *(argv or DEFAULT)],
                                cwd=repo, env=env, capture_output=not verbose, text=True)
        if result.returncode != 0:
            problems.append(f"pytest failed in the Binder environment (exit {result.returncode})\n"
                            + ((result.stdout or "") + (result.stderr or ""))[-5000:])
        summary = (result.stdout or "").strip().splitlines()[-1:] if not verbose else []
    for problem in problems:
        print("FAILED  " + problem)
    if problems:
        return 1
    print(f"Binder environment: OK (postBuild, non-editable attn_course, culling settings; pytest: "
          f"{summary[0] if summary else 'passed'}; {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
