#!/usr/bin/env python3
"""Prove the course's nbgrader metadata with the real nbgrader (the real nbgrader works on ``solutions/``;
docs/maintainers.md).

    python scripts/nbgrader_roundtrip.py [-v] [NN ...]     # default: 03 and 05

nbgrader (0.9.6, from PyPI) lives in its own virtual environment, .cache/nbgrader-venv (built on first use,
about 2 minutes; it pins parts of the Jupyter stack), with the pinned CPU PyTorch installed first, the
course's other dependencies, and the course's package (non-editable, from a clean copy of this checkout,
reinstalled on every run). In a throwaway nbgrader course folder, for each chosen notebook:

1. ``nbgrader generate_assignment`` on the solution notebook must succeed (it validates the metadata:
   unique ``grade_id``s, points on graded cells, solution markers) and give a student version whose code
   cells equal those of ``notebooks/`` (written by ``python -m attn_course exercises``);
2. ``nbgrader autograde`` of two submissions — the solution notebook, and the unfilled exercise
   notebook — must give full marks to the first and zero to the second, with every graded (check) cell
   found in the gradebook.

Prints one line when all is well (``-v``: a line per notebook); on a problem, what went wrong; exit 1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _launch_env import CACHE, ROOT, bin_dir, quiet, source_copy, venv_with_torch  # noqa: E402

VENV = CACHE / "nbgrader-venv"
NBGRADER = "nbgrader==0.9.6"
DEFAULT = ["03", "05"]
ASSIGNMENT = "attention"
SCORES = r'''
import json, sys
from nbgrader.api import Gradebook
course, assignment, students, notebooks = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4].split(",")
out = {}
with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
    for student in students:
        for nb in notebooks:
            sub = gb.find_submission_notebook(nb, assignment, student)
            out[f"{student}/{nb}"] = {"score": sub.score, "max_score": sub.max_score,
                                      "cells": {g.name: [g.score, g.max_score] for g in sub.grades}}
print(json.dumps(out))
'''


def course_dependencies() -> list[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in deps if not d.replace(" ", "").lower().startswith("torch")]


def code_cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in nb["cells"] if c["cell_type"] == "code"]


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    numbers = [a for a in argv if a != "-v"] or DEFAULT
    started = time.monotonic()
    python = venv_with_torch(VENV, [[NBGRADER, *course_dependencies()]], fresh=False)
    nbgrader = bin_dir(VENV) / "nbgrader"
    # nbgrader runs tools of its environment by name (alembic): that environment comes first on PATH.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{bin_dir(VENV)}{os.pathsep}{env.get('PATH', '')}"
    names = []
    for number in numbers:
        found = sorted((ROOT / "solutions").glob(f"{number}_*.ipynb"))
        if len(found) != 1:
            print(f"FAILED  no single solution notebook numbered {number!r}: {[p.name for p in found]}")
            return 1
        names.append(found[0].name)
    problems: list[str] = []
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="nbgrader-") as tmp:
        tmp = Path(tmp)
        quiet([python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", source_copy(tmp / "src")],
              what="installing attn_course into the nbgrader environment")
        course = tmp / "course"
        source = course / "source" / ASSIGNMENT
        source.mkdir(parents=True)
        (course / "nbgrader_config.py").write_text(
            f"c = get_config()\nc.CourseDirectory.root = {str(course)!r}\nc.CourseDirectory.course_id = 'attention'\n"
            "c.ExecutePreprocessor.timeout = 300\n")
        for name in names:
            shutil.copy(ROOT / "solutions" / name, source / name)
        result = subprocess.run([nbgrader, "generate_assignment", ASSIGNMENT, "--force"], cwd=course, env=env,
                                capture_output=True, text=True)
        if result.returncode != 0:
            print(f"FAILED  nbgrader generate_assignment\n{(result.stdout + result.stderr)[-4000:]}")
            return 1
        for name in names:
            released = course / "release" / ASSIGNMENT / name
            ours, theirs = code_cells(ROOT / "notebooks" / name), code_cells(released)
            if ours != theirs:
                diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
                problems.append(f"nbgrader's student version of {name} differs from notebooks/{name} at code cell "
                                f"{diff}: ours {ours[diff:diff + 1]!r}, nbgrader's {theirs[diff:diff + 1]!r}")
        submissions = {"solution": ROOT / "solutions", "unfilled": ROOT / "notebooks"}
        for student, folder in submissions.items():
            (course / "submitted" / student / ASSIGNMENT).mkdir(parents=True)
            for name in names:
                shutil.copy(folder / name, course / "submitted" / student / ASSIGNMENT / name)
        result = subprocess.run([nbgrader, "autograde", ASSIGNMENT, "--force"], cwd=course, env=env,
                                capture_output=True, text=True)
        if result.returncode != 0:
            print(f"FAILED  nbgrader autograde\n{(result.stdout + result.stderr)[-4000:]}")
            return 1
        scores = json.loads(quiet([python, "-c", SCORES, course, ASSIGNMENT, ",".join(submissions),
                                   ",".join(Path(n).stem for n in names)],
                                  what="reading nbgrader's gradebook", cwd=course, env=env).stdout)
        for name in names:
            checks = [c for c in json.loads((ROOT / "solutions" / name).read_text())["cells"]
                      if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
            for student in submissions:
                got = scores[f"{student}/{Path(name).stem}"]
                want = got["max_score"] if student == "solution" else 0
                graded = len(got["cells"])
                if got["score"] != want or graded != len(checks) or not got["max_score"]:
                    problems.append(f"nbgrader autograde of the {student} {name}: {got['score']} of {got['max_score']} "
                                    f"points over {graded} graded cell(s) (expected {want}, {len(checks)} cells)\n"
                                    f"{json.dumps(got['cells'])}")
                lines.append(f"{student} {name}: {got['score']:g} / {got['max_score']:g} points, {graded} graded cells")
        version = quiet([nbgrader, "--version"], what="nbgrader --version", env=env).stdout.strip().splitlines()[-1]
    for line in lines if verbose or problems else []:
        print("  " + line)
    for problem in problems:
        print("FAILED  " + problem)
    if problems:
        return 1
    print(f"nbgrader round trip: OK (nbgrader {version.split()[-1]}; generate_assignment and autograde on "
          f"{', '.join(names)}; {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
