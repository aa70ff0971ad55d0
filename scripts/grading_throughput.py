"""How fast ``python -m attn_course grade --class`` grades a class: generate one, grade it, extrapolate.

    .venv/bin/python scripts/grading_throughput.py [--learners 10] [--jobs 2] [--keep DIR]

Generates a class folder of ``--learners`` learners, each handing in every assigned notebook of the
course (12 notebooks: 10 learners give 120 notebooks). Each learner's notebook is one of four
variants, rotating over learners and notebooks so that every notebook appears in every variant:

* ``correct`` — the solution's exercise cells (with the learner's name in a comment, so no two
  files are byte-identical);
* ``unfilled`` — the generated exercise notebook as handed out (every check "not attempted");
* ``wrong`` — the solution with its first ``dim=-1`` turned into ``dim=0`` in every exercise cell,
  or, where there is none, with a ``+ 1`` after the first ``return`` (a wrong value);
* ``raises`` — the solution with ``raise RuntimeError`` as the first line of every exercise body.

It then runs the real command in a subprocess (``--jobs`` job slots, a fresh ``--out``), and prints
from ``grades.csv``: the wall time of the whole command, notebooks per minute, the per-notebook
learner-process seconds by course notebook, and the status counts.

Extrapolation to a workshop (60 learners × 10 notebooks = 600 notebooks), three ways:

1. from throughput (the headline): the command's wall time / notebooks graded × 600 — it already
   reflects ``--jobs`` notebooks running side by side and the start-up spread over the class;
2. from per-notebook times: the mean learner-process wall seconds per notebook (grades.csv) × 600 /
   jobs, plus the start-up; printed also for the correct notebooks alone (the worst case: every
   check runs all its cases);
3. from CPU: the CPU seconds of the command and all its processes / notebooks × 600 / cores (what an
   otherwise idle machine would take).

The machine's load (``os.getloadavg``) is printed before and after: on a shared machine 1 and 2 err high.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attn_course.tools import nbmeta  # noqa: E402

VARIANTS = ("correct", "unfilled", "wrong", "raises")
WORKSHOP = 60 * 10


def _wrong(source: str) -> str:
    if "dim=-1" in source:
        return source.replace("dim=-1", "dim=0", 1)
    return re.sub(r"(\n\s+return [^\n]+)", r"\1 + 1", source, count=1)


def _raises(source: str) -> str:
    return re.sub(r"(def [^\n]+:\n)(\s+)", r"\1\2raise RuntimeError('not like this')\n\2", source, count=1)


def make_class(folder: Path, learners: int, solutions: Path, exercises: Path) -> dict[tuple[str, str], str]:
    """Write ``learners`` learner folders into ``folder``; returns ``(learner, slug) -> variant``."""
    from attn_course import registry

    made: dict[tuple[str, str], str] = {}
    slugs = [nb.slug for nb in registry.assigned()]
    for i in range(learners):
        name = f"learner{i:03d}"
        (folder / name).mkdir(parents=True)
        for k, slug in enumerate(slugs):
            variant = VARIANTS[(i + k) % len(VARIANTS)]
            if variant == "unfilled":
                nb = nbformat.read(exercises / f"{slug}.ipynb", as_version=4)
            else:
                nb = nbformat.read(solutions / f"{slug}.ipynb", as_version=4)
                for cell in nb.cells:
                    if nbmeta.role(cell) == nbmeta.EXERCISE:
                        source = f"# {name}'s answer\n" + cell.source
                        cell.source = {"correct": source, "wrong": _wrong(source), "raises": _raises(source)}[variant]
            for cell in nb.cells:
                if cell.cell_type == "code":
                    cell.outputs, cell.execution_count = [], None
            nbformat.write(nb, folder / name / f"{slug}.ipynb")
            made[(name, slug)] = variant
    return made


def _load() -> str:
    try:
        return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=10, help="learners in the generated class (default 10)")
    parser.add_argument("--jobs", type=int, default=2, help="grade --jobs (default 2)")
    parser.add_argument("--solutions", default=str(ROOT / "solutions"))
    parser.add_argument("--exercises", default=str(ROOT / "notebooks"))
    parser.add_argument("--keep", metavar="DIR", help="generate the class and grades here and keep them")
    args = parser.parse_args(argv)

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="attn-throughput-"))
    try:
        folder, out = work / "class", work / "grades"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        variants = make_class(folder, args.learners, Path(args.solutions), Path(args.exercises))
        made = Counter(variants.values())
        total = len(variants)
        print(f"generated {total} notebooks ({args.learners} learners; "
              + ", ".join(f"{v} {made[v]}" for v in VARIANTS) + f") in {folder}")
        print(f"machine: {os.cpu_count()} CPUs; before: {_load()}")
        cmd = [sys.executable, "-m", "attn_course", "grade", "--class", str(folder), "--out", str(out),
               "--jobs", str(args.jobs), "--solutions", args.solutions]
        start = time.monotonic()
        cpu0 = os.times()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - start
        cpu1 = os.times()
        print(f"after: {_load()}")
        if done.returncode != 0:
            print(done.stdout + done.stderr)
            return 1
        print(done.stdout.strip())
        rows = list(csv.DictReader(io.StringIO((out / "grades.csv").read_text(encoding="utf-8-sig"))))
        per_notebook: dict[tuple[str, str], float] = {}
        for r in rows:
            if r["seconds"]:
                per_notebook[(r["learner"], r["notebook"])] = float(r["seconds"])
        graded = len(per_notebook)
        children_cpu = (cpu1.children_user + cpu1.children_system) - (cpu0.children_user + cpu0.children_system)
        by_slug = defaultdict(list)
        for (_, slug), s in per_notebook.items():
            by_slug[slug].append(s)
        print("\nlearner-process seconds per notebook (wall clock, from grades.csv): median / max")
        for slug in sorted(by_slug):
            values = by_slug[slug]
            print(f"  {slug:22} {statistics.median(values):6.2f} / {max(values):6.2f}  (n={len(values)})")
        print("statuses: " + ", ".join(f"{k} {v}" for k, v in Counter(r["status"] for r in rows).most_common()))
        mean = statistics.fmean(per_notebook.values())
        per_min = graded / wall * 60
        print(f"\n{graded} notebooks in {wall:.0f} s wall with --jobs {args.jobs}: {per_min:.1f} notebooks/minute; "
              f"CPU of the command and all its processes: {children_cpu:.0f} s")
        print(f"extrapolation to 60 learners x 10 notebooks ({WORKSHOP}):")
        print(f"  from throughput: {wall / graded:.2f} s wall per notebook x {WORKSHOP} = "
              f"{wall / graded * WORKSHOP / 60:.1f} min")
        print(f"  from per-notebook time: mean {mean:.2f} s x {WORKSHOP} / {args.jobs} jobs = "
              f"{mean * WORKSHOP / args.jobs / 60:.1f} min (+ start-up)")
        correct = [s for key, s in per_notebook.items() if variants.get(key) == "correct"]
        if correct:
            worst = statistics.fmean(correct)
            print(f"  an all-correct class (every check runs to its end): mean {worst:.2f} s per correct notebook "
                  f"x {WORKSHOP} / {args.jobs} jobs = {worst * WORKSHOP / args.jobs / 60:.1f} min (+ start-up)")
        print(f"  from CPU: {children_cpu / graded:.2f} CPU-s per notebook x {WORKSHOP} / {os.cpu_count()} cores = "
              f"{children_cpu / graded * WORKSHOP / (os.cpu_count() or 1) / 60:.1f} min")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
