"""docs/maintainers.md teaches what the code does:

* every block quoted from the code (``<!-- quoted: PATH -->`` before a fenced block) is in PATH,
  verbatim, and the worked example is a whole, real check of the course;
* every name its "Writing a check" table places in a module is in that module, every file it names
  exists, and every ``python -m attn_course`` command it names is one;
* "Adding a notebook" works: a throwaway notebook built by its steps, in a copy of the repository's
  layout, passes the course's own consistency checks (registry, generated notebook, links, schedule,
  README syllabus), and its check passes the solution and diagnoses a wrong answer.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import io
import json
import re
import shutil
import textwrap
from pathlib import Path

import nbformat
from attn_course import registry
from attn_course.checks.result import Status
from attn_course.tools import exercises, links, nbmeta
from attn_course.tools.cli import COMMANDS
from attn_course.tools.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "maintainers.md").read_text(encoding="utf-8")
QUOTED = re.compile(r"<!-- quoted: (\S+) -->\n```python\n(.*?)```", re.S)


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", GUIDE, re.S | re.M)
    assert match, f"docs/maintainers.md has no section '{title}'"
    return match.group(1)


def test_every_quoted_block_is_in_its_module_verbatim():
    quotes = QUOTED.findall(GUIDE)
    assert quotes, "docs/maintainers.md quotes no code"
    for path, block in quotes:
        source = (ROOT / path).read_text(encoding="utf-8")
        assert block in source, f"this block of docs/maintainers.md is no longer in {path}: update the doc\n{block}"


def test_the_worked_example_is_a_whole_check_of_the_course():
    checks = []
    for path, block in QUOTED.findall(section("Writing a check")):
        tree = ast.parse(textwrap.dedent(block)) if block.startswith(("@", "def")) else None
        for node in tree.body if tree else []:
            if isinstance(node, ast.FunctionDef) and any("check" in ast.unparse(d) for d in node.decorator_list):
                checks.append((path, node.name, block))
    assert checks, "the worked example quotes no decorated check"
    for path, name, block in checks:
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
        lines = (ROOT / path).read_text(encoding="utf-8").splitlines(keepends=True)
        whole = "".join(lines[node.decorator_list[0].lineno - 1: node.end_lineno])
        assert block == whole, f"the doc quotes part of {name}; quote it whole"
        assert getattr(module, name).exercise in {e for nb in registry.NOTEBOOKS for e in nb.exercises}


def test_names_files_and_commands_in_the_guide_exist():
    rows = re.findall(r"^\| `checks/(\w+)\.py` \| (.*) \|$", section("Writing a check"), re.M)
    assert len(rows) >= 4, "the table of what checks are written with is gone"
    for row in rows:
        module = importlib.import_module(f"attn_course.checks.{row[0]}")
        for span in re.findall(r"`@?([A-Za-z_]\w*)", row[1]):
            assert hasattr(module, span), f"docs/maintainers.md places `{span}` in checks/{row[0]}.py, which lacks it"
    for path in set(re.findall(r"`((?:attn_course|tests|docs|scripts)/[\w./-]+\.(?:py|md|json))`", GUIDE)):
        assert (ROOT / path).exists(), f"docs/maintainers.md names {path}, which does not exist"
    for command in set(re.findall(r"python -m attn_course ([\w-]+)", GUIDE)):
        assert command in COMMANDS, f"docs/maintainers.md names `python -m attn_course {command}`, which is no command"
    assert ".run.Runner" not in GUIDE and "expect_close style" not in GUIDE


# ============================================================================ "Adding a notebook", done
SOLUTION = '''def double(x):
    """Twice ``x``. x: a tensor of any shape; returns a tensor of the same shape."""
    ### BEGIN SOLUTION
    return 2 * x
    ### END SOLUTION
'''
REFERENCE = '''"""Reference code of notebook 99, a throwaway one (tests/test_docs.py)."""


def double(x):
    return 2 * x
'''
CHECKS = '''"""Checks of notebook 99, a throwaway one (tests/test_docs.py)."""

import torch

from attn_course.checks.compare import Mistake, as_tensor, expect_close
from attn_course.checks.core import Learner, check


@check("double", expects="a function double(x) returning a tensor shaped like x")
def check_double(fn: Learner) -> str:
    x = torch.arange(6.0).reshape(2, 3) - 1
    tried = "double(x) with x of shape (2, 3)"
    out = as_tensor(fn(x), tried=tried)
    expect_close(out, 2 * x, tried=tried, mistakes=[
        Mistake("squared instead of doubled", "you multiplied x by itself", "multiply by 2", lambda: x * x)])
    return "doubles a (2, 3) tensor"
'''


def _notebook() -> nbformat.NotebookNode:
    cells = [nbformat.v4.new_markdown_cell("# 99 · A throwaway\n\nOne exercise: double a tensor."),
             nbformat.v4.new_code_cell("import torch", metadata={"tags": [nbmeta.SETUP]}),
             nbformat.v4.new_markdown_cell("Write `double(x)`: x, any shape → the same shape."),
             nbformat.v4.new_code_cell(SOLUTION, metadata={"tags": [nbmeta.EXERCISE]}),
             nbformat.v4.new_code_cell("from throwaway.checks.topic import check_double\ncheck_double()",
                                       metadata={"tags": [nbmeta.CHECK]})]
    return nbformat.v4.new_notebook(cells=cells)


def _define(source: str):
    namespace: dict = {}
    exec(compile(source, "<exercise cell>", "exec"), namespace)  # noqa: S102 - the test's own notebook
    return namespace["double"]


def test_a_notebook_added_by_the_checklist_passes_the_courses_consistency_checks(tmp_path, monkeypatch):
    steps = section("Adding a notebook")
    root = tmp_path / "course"
    (root / "docs").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "docs/schedule.md", "docs/schedule-timings.json"):
        shutil.copy(ROOT / name, root / name)
    last = registry.NOTEBOOKS[-1]  # the neighbour whose "next" link changes
    for folder in ("solutions", "notebooks"):
        (root / folder).mkdir()
        shutil.copy(ROOT / folder / last.filename, root / folder / last.filename)

    # 1. the solution notebook
    nbformat.write(_notebook(), root / "solutions" / "99_throwaway.ipynb")
    # 2. the registry row
    nb = registry.Notebook("99", "99_throwaway", "A throwaway", "throwaway.topic", "throwaway.checks.topic",
                           ("double",))
    monkeypatch.setattr(registry, "NOTEBOOKS", registry.NOTEBOOKS + (nb,))
    # 3-4. the reference and checks modules, and their tests
    package = tmp_path / "modules" / "throwaway"
    (package / "checks").mkdir(parents=True)
    for path, text in {"__init__.py": "", "topic.py": REFERENCE, "checks/__init__.py": "", "checks/topic.py": CHECKS}.items():
        (package / path).write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))
    for path in nb.test_files():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text('"""The tests of notebook 99."""\n', encoding="utf-8")
    # 5. the schedule (run times written here stand for `schedule`'s own measurement, which runs kernels)
    timings = root / "docs" / "schedule-timings.json"
    measured = json.loads(timings.read_text())
    timings.write_text(json.dumps({name: measured.get(name, 1.0) for name in (last.filename, nb.filename)}) + "\n")
    assert cli(["schedule", "--notebooks", str(root / "solutions"), "--timings", str(timings),
                "--out", str(root / "docs" / "schedule.md")]) == 0
    # 6. the links header (7, running the solution in a kernel, is left to the slow tests)
    assert links.run(argparse.Namespace(root=str(root), check=False, hub=None), out=io.StringIO()) == 0
    # 8. the exercise notebook
    assert exercises.generate(root / "solutions", root / "notebooks", out=io.StringIO()) == 0
    # 9. the README's syllabus row, with the minutes of docs/schedule.md
    minutes = re.search(r"^\| 99_throwaway · .*?\*\*(\d+)\*\* \|$", (root / "docs" / "schedule.md").read_text(), re.M)
    assert minutes, "docs/schedule.md has no row for the new notebook"
    readme = root / "README.md"
    readme.write_text(_with_row(readme.read_text(encoding="utf-8"), minutes.group(1)), encoding="utf-8")

    # What the course's consistency tests hold every notebook to, here for the new one:
    for name in ("solutions", "notebooks"):
        assert (root / name / nb.filename).exists()
    assert exercises.generate(root / "solutions", root / "notebooks", check_only=True, out=io.StringIO()) == 0
    report = io.StringIO()
    assert links.run(argparse.Namespace(root=str(root), check=True, hub=None), out=report) == 0, report.getvalue()
    solution = nbformat.read(root / "solutions" / nb.filename, as_version=4)
    assert solution.cells[0].get("id") == links.HEADER_ID and f"[{last.number} · {last.title}]" in solution.cells[0].source
    neighbour = nbformat.read(root / "solutions" / last.filename, as_version=4)
    assert "[99 · A throwaway](99_throwaway.ipynb) →" in neighbour.cells[0].source
    found = nbmeta.exercises(solution)  # read from the nbgrader metadata that step 8 wrote
    assert [e.id for e in found] == list(nb.exercises) and found[0].check_cell == found[0].cell + 1
    for module in (nb.reference, nb.checks):
        assert f"notebook {nb.number}" in importlib.import_module(module).__doc__
    assert all((root / path).exists() for path in nb.test_files())
    stated = re.findall(r"^\| 99 \| \[.*\| (\d+) \|$", readme.read_text(encoding="utf-8"), re.M)
    assert stated == [minutes.group(1)]

    # The check cell works on both sides: the solution passes, the generated stub is not attempted,
    # a wrong answer is named.
    check = getattr(importlib.import_module(nb.checks), registry.check_name("double"))
    assert check.evaluate(_define(solution.cells[found[0].cell].source)).status is Status.PASSED
    exercise = nbformat.read(root / "notebooks" / nb.filename, as_version=4)
    stub = exercise.cells[found[0].cell].source
    assert "raise NotImplementedError()" in stub and "2 * x" not in stub
    assert check.evaluate(_define(stub)).status is Status.NOT_ATTEMPTED
    assert check.evaluate(lambda x: x * x).summary == "squared instead of doubled"

    # The checklist names every file this build touched, and the commands it ran.
    for path in ("solutions/NN_topic.ipynb", "attn_course/registry.py", "attn_course/<topic>.py",
                 "tests/test_<topic>.py", "attn_course/checks/<topic>.py", "tests/checks/test_<topic>.py",
                 "docs/schedule-timings.json", "docs/schedule.md", "notebooks/NN_topic.ipynb", "README.md"):
        assert f"**`{path}`**" in steps, f"'Adding a notebook' does not name {path}"
    for command in ("schedule", "links", "exercises", "run-solutions"):
        assert f"python -m attn_course {command}" in steps


def _with_row(readme: str, minutes: str) -> str:
    """The README with a syllabus row for notebook 99 after the last one."""
    rows = list(re.finditer(r"^\| \d\d \| \[.*\| \d+ \|$", readme, re.M))
    assert rows, "README.md has no syllabus rows"
    end = rows[-1].end()
    return readme[:end] + f"\n| 99 | [a throwaway](notebooks/99_throwaway.ipynb) | double | {minutes} |" + readme[end:]
