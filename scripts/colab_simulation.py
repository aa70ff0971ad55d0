#!/usr/bin/env python3
"""Run course notebooks the way Colab would, in a fresh virtual environment standing in for a Colab runtime.

    python scripts/colab_simulation.py [NOTEBOOK ...]     # default: solutions/05_attention.ipynb and its exercise copy

The stand-in runtime has what Colab ships (torch, numpy, matplotlib, ipywidgets, ipykernel, tqdm…), a
stand-in ``google.colab`` module whose ``output.enable_custom_widget_manager()`` records that it was
called, and NOT the course's package. Each notebook gets its Colab set-up cell (``python -m attn_course
links``) and runs top to bottom in that runtime, the set-up cell installing the package from this
checkout instead of GitHub (``ATTN_COURSE_COLAB_SOURCE``). It then checks that:

* every cell ran, and every check reported (passed in a solution, "not attempted" in an exercise copy);
* the widget manager was turned on and widget outputs were produced;
* no second PyTorch was installed (the same torch version, one torch distribution).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".cache" / "colab-venv"
PY = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
# What a Colab runtime already has (versions from the course's own pins, so it installs offline here).
PREINSTALLED = ["torch", "numpy", "matplotlib", "ipywidgets", "ipykernel", "tqdm", "nbformat", "nbclient", "psutil"]
STAND_IN = '''"""Stand-in for Colab's google.colab module (the course's Colab simulation)."""
'''
OUTPUT = '''"""Stand-in for google.colab.output: records that the custom widget manager was enabled."""
import os

def enable_custom_widget_manager():
    marker = os.environ.get("COLAB_SIM_MARKER")
    if marker:
        with open(marker, "a") as fh:
            fh.write("enabled\\n")
'''
RUNNER = r'''
import json, sys
import nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=False,
               resources={"metadata": {"path": sys.argv[3]}}).execute()
nbformat.write(nb, sys.argv[2])
'''


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "binder" / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            out[name.strip().lower()] = version.strip()
    return out


def ensure_runtime() -> None:
    if PY.exists():
        return
    print(f"creating the stand-in Colab runtime in {VENV}")
    venv.EnvBuilder(with_pip=True).create(VENV)
    versions = pins()
    specs = [f"{name}=={versions[name]}" if name in versions else name for name in PREINSTALLED]
    subprocess.run([str(PY), "-m", "pip", "install", "-q", *specs], check=True)
    site = Path(subprocess.run([str(PY), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "google" / "colab").mkdir(parents=True, exist_ok=True)
    (site / "google" / "colab" / "__init__.py").write_text(STAND_IN)
    (site / "google" / "colab" / "output.py").write_text(OUTPUT)


def torch_state() -> tuple[str, int]:
    out = subprocess.run([str(PY), "-c", "import importlib.metadata as m, torch; "
                          "print(torch.__version__); print(sum(1 for d in m.distributions() "
                          "if (d.metadata['Name'] or '').lower() == 'torch'))"], capture_output=True, text=True, check=True)
    version, count = out.stdout.split()
    return version, int(count)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    import nbformat

    from attn_course import registry
    from attn_course.checks.result import Status, result_from_output
    from attn_course.tools import links, nbmeta

    ensure_runtime()
    subprocess.run([str(PY), "-m", "pip", "uninstall", "-q", "-y", "attn_course"], capture_output=True)
    before = torch_state()
    paths = [Path(p) for p in argv] or [ROOT / "solutions" / "05_attention.ipynb", ROOT / "notebooks" / "05_attention.ipynb"]
    failures = 0
    with tempfile.TemporaryDirectory(prefix="colab-sim-") as tmp:
        tmp = Path(tmp)
        marker = tmp / "widget-manager"
        env = dict(os.environ, COLAB_SIM_MARKER=str(marker), **{links.COLAB_SOURCE_ENV: str(ROOT)})
        env.pop("VIRTUAL_ENV", None)
        env["PYTHONPATH"] = ""
        # Colab imports google.colab in every kernel before the first cell: an IPython startup file does that here.
        ipython_dir = tmp / "ipython"
        (ipython_dir / "profile_default" / "startup").mkdir(parents=True)
        (ipython_dir / "profile_default" / "startup" / "00-colab.py").write_text("import google.colab\n")
        env["IPYTHONDIR"] = str(ipython_dir)
        for path in paths:
            nb = nbformat.read(path, as_version=4)
            entry = registry.by_slug(path.stem)
            links.apply_header(nb, entry, "exercise" if path.parent.name == "notebooks" else "solution",
                               links.repository(ROOT), None)
            source, done = tmp / f"in-{path.name}", tmp / f"out-{path.name}"
            nbformat.write(nb, source)
            work = tmp / f"work-{path.stem}"
            work.mkdir()
            result = subprocess.run([str(PY), "-c", RUNNER, str(source), str(done), str(work)], env=env,
                                    capture_output=True, text=True)
            if result.returncode != 0:
                print(f"FAILED  {path.relative_to(ROOT)}: the notebook stopped\n{result.stderr[-3000:]}")
                failures += 1
                continue
            ran = nbformat.read(done, as_version=4)
            expected = Status.PASSED if path.parent.name == "solutions" else Status.NOT_ATTEMPTED
            statuses = {}
            for ex in nbmeta.exercises(ran):
                found = [r for r in map(result_from_output, ran.cells[ex.check_cell].outputs) if r]
                statuses[ex.id] = found[0].status if found else None
            widgets = sum("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                          for c in ran.cells if c.cell_type == "code" for o in c.outputs)
            ok = statuses and all(s is expected for s in statuses.values()) and widgets > 0
            failures += not ok
            print(f"{'ok' if ok else 'FAILED':7} {path.relative_to(ROOT)}: checks {sorted({str(s) for s in statuses.values()})}, "
                  f"{widgets} widget output(s)")
        enabled = marker.exists()
        failures += not enabled
        print(f"{'ok' if enabled else 'FAILED':7} Colab's custom widget manager was {'turned on' if enabled else 'never turned on'}")
    after = torch_state()
    same_torch = before == after and after[1] == 1
    failures += not same_torch
    print(f"{'ok' if same_torch else 'FAILED':7} torch before {before}, after {after} (no second PyTorch)")
    print("Colab simulation:", "OK" if not failures else f"{failures} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
