"""The package's layers, read from its source (every import, those inside functions too):

* the learner runtime — what a notebook's kernel imports: every module of ``attn_course`` but the
  tooling — never imports ``attn_course.tools`` (a learner's kernel never loads the instructor's tools);
* no two modules of the package import each other, directly or round a circle;
* no module imports another module's private name (``from .x import _name``): what two modules share
  has a public name, in the module that owns it (``attn_course/checks/kit/`` for what several
  topics' checks share);
* a topic's checks (``attn_course.checks.<topic>``, a module or a package) import only the check kit and
  the layers under it, their own package, and the course's reference code — never another topic's checks;
* no file of the checks (a topic's, the kit's, the layers under it) is over :data:`CHECK_FILE_LINES` lines:
  what needs more is a package with one module per exercise or per job.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from attn_course import registry

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attn_course"

#: Modules outside ``attn_course.tools`` that are not part of the learner runtime, and why.
NOT_RUNTIME = {
    "attn_course.__main__": "`python -m attn_course`: the command line, which is the tools' front door",
    "attn_course.pytest_plugin": "loaded by pytest (nbval) in a test process, never by a notebook's kernel",
}


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _owner(dotted: str) -> str | None:
    """The package module that ``dotted`` (a module, or a name inside one) lives in."""
    while dotted and dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


@functools.lru_cache(maxsize=None)
def imports(module: str) -> list[tuple[str, str | None, int]]:
    """``(module imported, name taken from it or None, line)`` for every import of a package module."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(owner, None, node.lineno) for a in node.names if (owner := _owner(a.name))]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{source}.{alias.name}" in MODULES:  # `from . import sandbox`: a module
                    found.append((f"{source}.{alias.name}", None, node.lineno))
                elif owner := _owner(source):
                    found.append((owner, alias.name, node.lineno))
    return found


#: What every topic's checks are written with: the kit and the layers it stands on.
CHECK_LAYERS = ("attn_course.checks.kit", "attn_course.checks.core", "attn_course.checks.compare",
                "attn_course.checks.boundary", "attn_course.checks.result", "attn_course.checks.cells",
                "attn_course.checks.exceptions")
TOPICS = [nb.checks for nb in registry.NOTEBOOKS if nb.checks]
#: A check reads top to bottom as a specification, and so do the layers it is written with: past this many
#: lines a file of checks/ is split.
CHECK_FILE_LINES = 600


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _topic_may_import(topic: str, target: str) -> bool:
    """Whether the checks of ``topic`` may import ``target``: the kit's layers, their own package, reference code."""
    reference = not _within(target, "attn_course.checks") and not _within(target, "attn_course.tools")
    return reference or _within(target, topic) or any(_within(target, layer) for layer in CHECK_LAYERS)


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


@pytest.mark.slow
def test_the_learner_runtime_never_imports_the_tools():
    runtime = [m for m in MODULES if not m.startswith("attn_course.tools") and m not in NOT_RUNTIME]
    leaks = [f"{_where(m, line)} imports {target}" for m in runtime for target, _, line in imports(m)
             if target.startswith("attn_course.tools")]
    assert not leaks, "learner code imports the tools (move what it needs out of attn_course/tools/):\n" + "\n".join(leaks)


def test_no_module_imports_another_modules_private_names():
    private = [f"{_where(m, line)}: from {target} import {name}" for m in MODULES for target, name, line in imports(m)
               if name and name.startswith("_") and not name.startswith("__") and target != m]
    assert not private, ("private names imported across modules (give what is shared a public name in the module "
                         "that owns it):\n" + "\n".join(private))


def test_no_import_circles():
    graph = {m: sorted({t for t, _, _ in imports(m) if t != m}) for m in MODULES}
    circles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in graph[module]:
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [module, target]))
            elif target not in state:
                visit(target, path + [module])
        state[module] = 2

    for module in graph:
        if module not in state:
            visit(module, [])
    assert not circles, "modules that import each other (one owner per idea: move the shared part):\n" + "\n".join(circles)


def test_the_layer_reader_sees_imports_of_every_kind():
    """The rules above only hold if the reader finds relative, absolute, package-level and lazy imports."""
    found = {(t, n) for t, n, _ in imports("attn_course.tools.grading.zygote")}
    assert ("attn_course.tools.grading.sandbox", None) in found  # from . import sandbox
    assert ("attn_course.tools.grading.learner", "preload") in found  # from .learner import preload
    found = {(t, n) for t, n, _ in imports("attn_course.tools.grading.learner")}
    assert ("attn_course.checks.boundary", "RECORD_ENV") in found  # inside a function, three levels up
    assert ("attn_course", None) in {(t, n) for t, n, _ in imports("attn_course.tools.grading.learner")}  # import attn_course


def test_a_topics_checks_import_only_the_kit_their_own_package_and_reference_code():
    assert TOPICS and all(t in MODULES for t in TOPICS), "a registered checks module is not in attn_course/"
    strays = []
    for topic in TOPICS:
        for module in [m for m in MODULES if _within(m, topic)]:
            strays += [f"{_where(module, line)} imports {target}" for target, _, line in imports(module)
                       if not _topic_may_import(topic, target)]
    assert not strays, ("a topic's checks import another topic's checks (move what they share into "
                        "attn_course/checks/kit/ or a reference module):\n" + "\n".join(strays))


@pytest.mark.parametrize("target, allowed", [
    ("attn_course.checks.kit.mistakes", True), ("attn_course.checks.core", True), ("attn_course.softmax", True),
    ("attn_course.checks.masks.answers", True), ("attn_course.checks.masks", True), ("attn_course", True),
    ("attn_course.checks.inference.oracle", False), ("attn_course.checks.masksx", False),
    ("attn_course.tools.tables", False), ("attn_course.checks", False)])
def test_the_topic_rule_tells_the_kit_and_reference_code_from_another_topics_checks(target, allowed):
    assert _topic_may_import("attn_course.checks.masks", target) is allowed


def test_no_file_of_the_checks_is_over_the_size_a_reader_takes_in():
    sizes = {MODULES[m]: len(MODULES[m].read_text(encoding="utf-8").splitlines())
             for m in MODULES if _within(m, "attn_course.checks")}
    measured = {m for m in MODULES if _within(m, "attn_course.checks")}
    assert all(topic in measured for topic in TOPICS) and any(_within(m, "attn_course.checks.boundary") for m in measured)
    long = [f"{path.relative_to(ROOT)}: {n} lines" for path, n in sizes.items() if n > CHECK_FILE_LINES]
    assert not long, (f"over {CHECK_FILE_LINES} lines (split it into a package: one module per exercise or per job, "
                      "what its modules share in modules named for their job):\n" + "\n".join(long))
