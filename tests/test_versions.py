"""Versions are stated once, in pyproject.toml; every other place that names one derives it or agrees.

Places checked: requirements*.txt (derived: they install the package's extras), course.py (reads the
torch range from pyproject.toml), attn_course/environment.py (reads the installed metadata),
binder/requirements.txt (exact pins: each inside its range, every dependency pinned, so pytest runs in
that environment) and README.md (the manual torch command and the "Tested with" list = the pins).
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _stated() -> dict[str, Requirement]:
    project = PYPROJECT["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return {r.name.lower(): r for r in reqs}


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            name, version = re.split(r"==", line, maxsplit=1)
            pins[name.strip().lower()] = version.strip()
    return pins


def test_requirements_files_only_install_the_package_and_its_extras():
    for name, extras in (("requirements.txt", {"lab", "test"}), ("requirements-browser.txt", {"browser"})):
        lines = [l.split("#", 1)[0].strip() for l in (ROOT / name).read_text(encoding="utf-8").splitlines()]
        lines = [l for l in lines if l]
        assert lines == [f"-e .[{','.join(sorted(extras))}]"], f"{name} states its own versions: {lines}"
        assert extras <= set(PYPROJECT["project"]["optional-dependencies"])


def test_course_py_reads_the_torch_range_from_pyproject():
    spec = importlib.util.spec_from_file_location("course", ROOT / "course.py")
    course = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(course)
    assert Requirement(course.torch_spec()) == _stated()["torch"]
    assert "torch>=" not in (ROOT / "course.py").read_text(encoding="utf-8"), "course.py writes a torch version itself"


def test_environment_minimums_come_from_the_package_metadata():
    from attn_course import environment

    stated = _stated()
    for name, minimum in environment.MINIMUM.items():
        if name == "python":
            assert f">={minimum}" == PYPROJECT["project"]["requires-python"]
            continue
        lower = [s.version for s in stated[name].specifier if s.operator == ">="]
        assert lower == [minimum], f"{name}: environment says {minimum}, pyproject {stated[name].specifier}"
    assert set(environment.CHECKED) - {"python"} <= set(stated)


def test_binder_pins_every_dependency_inside_its_range():
    pins = _pins(ROOT / "binder" / "requirements.txt")
    for name, req in _stated().items():
        if name in ("playwright", "triton"):
            continue  # the browser test and the Triton step run in CI only, not on Binder
        assert name in pins, f"binder/requirements.txt does not pin {name}, so the Binder image may lack it"
        version = Version(pins[name].split("+")[0])
        assert version in req.specifier, f"binder pins {name}=={pins[name]}, outside {req.specifier}"


def test_readme_agrees_with_pyproject_and_binder():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r'"(torch[<>=][^"]*)"', readme)
    assert commands, "README gives no manual torch install command"
    for command in commands:
        assert Requirement(command) == _stated()["torch"], f"README says {command}"
    tested = re.search(r"## Tested with\s+(.+?)\n\n", readme, re.S)
    assert tested, "README has no 'Tested with' section"
    pins = _pins(ROOT / "binder" / "requirements.txt")
    named = {k: v.rstrip(".") for k, v in re.findall(r"\b([A-Za-z][\w-]*) (\d[\w.+]*)", tested.group(1))}
    named = {k.lower(): v for k, v in named.items() if k.lower() in pins}
    assert named, "the 'Tested with' list names no pinned package"
    for name, version in named.items():
        assert version == pins[name], f"README says {name} {version}, binder pins {pins[name]}"
