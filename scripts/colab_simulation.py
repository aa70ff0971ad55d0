#!/usr/bin/env python3
"""Run course notebooks the way Colab would, in a fresh virtual environment standing in for a Colab runtime.

    python scripts/colab_simulation.py [-v] [NOTEBOOK ...]   # default: solutions/05_attention.ipynb and its exercise copy

The stand-in runtime (.cache/colab-venv, built on first use, about 2 minutes) has what Colab ships —
PyTorch installed first, on its own, as Colab's preinstalled one (the CPU build pinned in
binder/requirements.txt, ``pip install torch==X.Y.Z``), then numpy, matplotlib, ipywidgets, ipykernel, tqdm,
nbformat, nbclient, psutil at the versions of binder/requirements.txt — plus a stand-in ``google.colab``
package imported in every kernel before the first cell (as Colab does), whose
``output.enable_custom_widget_manager()`` records that it was called and from which Python. It does NOT
have the course's package.

Each notebook gets its Colab set-up cell (cell id ``colab-setup``, written by ``attn_course.tools.links``)
and runs top to bottom in that runtime as Colab's *Run all* does — every cell tag ignored (the
``raises-exception`` tags removed), stopping at the first cell that raises — the set-up cell installing
the package from a clean copy of this checkout instead of GitHub (``ATTN_COURSE_COLAB_SOURCE``). The
script then checks that:

* the notebook ran to its last cell, in the stand-in runtime's Python, and every check reported (passed
  in a solution, "not attempted" in an exercise copy, where Run All must not stop at an unfinished
  exercise);
* the set-up cell installed ``attn_course`` into the runtime's site-packages (not editable);
* Colab's custom widget manager was turned on and widget outputs were produced;
* no second PyTorch was installed (one torch distribution, the same version before and after).

Prints one line when all is well (``-v``: a line per check); on a problem, what went wrong; exit 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _launch_env import CACHE, ROOT, binder_pins, quiet, source_copy, torch_distributions, venv_with_torch  # noqa: E402

VENV = CACHE / "colab-venv"
# What a Colab runtime already has besides PyTorch (at the course's tested versions).
PREINSTALLED = ["numpy", "matplotlib", "ipywidgets", "ipykernel", "tqdm", "nbformat", "nbclient", "psutil"]
STAND_IN = '''"""Stand-in for Colab's google.colab package (scripts/colab_simulation.py)."""
'''
OUTPUT = '''"""Stand-in for google.colab.output: records that the custom widget manager was turned on, and by which Python."""
import os
import sys


def enable_custom_widget_manager():
    marker = os.environ.get("COLAB_SIM_MARKER")
    if marker:
        with open(marker, "a") as fh:
            fh.write(sys.executable + "\\n")
'''
RUNNER = r'''
import sys
import nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=False,
               resources={"metadata": {"path": sys.argv[3]}}).execute()
nbformat.write(nb, sys.argv[2])
'''


def build_runtime() -> Path:
    versions = binder_pins()
    specs = [f"{name}=={versions[name]}" if name in versions else name for name in PREINSTALLED]
    python = venv_with_torch(VENV, [specs], key=STAND_IN + OUTPUT, fresh=False)
    site = Path(quiet([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                      what="finding the runtime's site-packages").stdout.strip())
    (site / "google" / "colab").mkdir(parents=True, exist_ok=True)
    (site / "google" / "colab" / "__init__.py").write_text(STAND_IN)
    (site / "google" / "colab" / "output.py").write_text(OUTPUT)
    return python


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    argv = [a for a in argv if a != "-v"]
    sys.path.insert(0, str(ROOT))
    import nbformat

    from attn_course import registry
    from attn_course.checks.result import Status, result_from_output
    from attn_course.tools import links, nbmeta

    started = time.monotonic()
    python = build_runtime()
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "attn_course"], capture_output=True)
    before = torch_distributions(python)
    paths = [Path(p).resolve() for p in argv] or [ROOT / "solutions" / "05_attention.ipynb",
                                                  ROOT / "notebooks" / "05_attention.ipynb"]
    problems: list[str] = []
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="colab-sim-") as tmp:
        tmp = Path(tmp)
        source = source_copy(tmp / "course")
        marker = tmp / "widget-manager"
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
        env.update(COLAB_SIM_MARKER=str(marker), PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}",
                   **{links.COLAB_SOURCE_ENV: str(source)})
        # Colab imports google.colab in every kernel before the first cell: an IPython startup file does that here.
        ipython_dir = tmp / "ipython"
        (ipython_dir / "profile_default" / "startup").mkdir(parents=True)
        (ipython_dir / "profile_default" / "startup" / "00-colab.py").write_text("import google.colab\n")
        env["IPYTHONDIR"] = str(ipython_dir)
        for path in paths:
            name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            kind = "exercise" if path.parent.name == "notebooks" else "solution"
            nb = nbformat.read(path, as_version=4)
            links.apply_header(nb, registry.by_slug(path.stem), kind, links.repository(ROOT), None)
            for cell in nb.cells:  # Colab reads no cell tags: Run all stops at the first cell that raises
                if nbmeta.RAISES in cell.get("metadata", {}).get("tags", []):
                    cell.metadata["tags"] = [t for t in cell.metadata["tags"] if t != nbmeta.RAISES]
            given, done = tmp / f"in-{path.name}", tmp / f"out-{path.name}"
            nbformat.write(nb, given)
            work = tmp / f"work-{kind}-{path.stem}"
            work.mkdir()
            result = subprocess.run([python, "-c", RUNNER, given, done, work], env=env, cwd=work,
                                    capture_output=True, text=True)
            if result.returncode != 0:
                problems.append(f"{name}: the notebook stopped\n{result.stderr[-3000:]}")
                continue
            ran = nbformat.read(done, as_version=4)
            expected = Status.PASSED if kind == "solution" else Status.NOT_ATTEMPTED
            statuses = {}
            for ex in nbmeta.exercises(ran):
                found = [r for r in map(result_from_output, ran.cells[ex.check_cell].outputs) if r]
                statuses[ex.id] = found[0].status if found else None
            widgets = sum("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                          for c in ran.cells if c.cell_type == "code" for o in c.outputs)
            wrong = {k: str(s) for k, s in statuses.items() if s is not expected}
            if not statuses or wrong:
                problems.append(f"{name}: expected every check {expected}, got {wrong or 'no checks'}")
            if not widgets:
                problems.append(f"{name}: no widget output")
            lines.append(f"{name}: {len(statuses)} check(s) {expected}, {widgets} widget output(s)")
        kernels = marker.read_text().split() if marker.exists() else []
        if not kernels:
            problems.append("Colab's custom widget manager was never turned on (the set-up cell did not run on 'Colab')")
        elif any(Path(k).parent != python.parent for k in kernels):
            problems.append(f"a kernel ran outside the stand-in runtime: {sorted(set(kernels))}")
        installed = subprocess.run(
            [python, "-c", "import importlib.metadata as m, json, attn_course; d = m.distribution('attn_course'); "
             "print(json.dumps([attn_course.__file__, d.read_text('direct_url.json')]))"],
            cwd=tmp, env=env, capture_output=True, text=True)
        if installed.returncode != 0:
            problems.append(f"attn_course is not installed in the runtime after the set-up cell\n{installed.stderr[-1500:]}")
        else:
            where, direct = json.loads(installed.stdout)
            editable = bool(json.loads(direct or "{}").get("dir_info", {}).get("editable"))
            if editable or "site-packages" not in where:
                problems.append(f"attn_course was installed editable or outside site-packages: {where}")
            lines.append(f"attn_course installed by the set-up cell at {where}")
    after = torch_distributions(python)
    if len(after) != 1 or after != before:
        problems.append(f"a second PyTorch: torch distributions before {before}, after {after}")
    lines.append(f"PyTorch before and after: {after}")
    for line in lines if verbose or problems else []:
        print("  " + line)
    for problem in problems:
        print("FAILED  " + problem)
    if problems:
        return 1
    print(f"Colab simulation: OK ({len(paths)} notebook(s), {after[0]}, {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
