"""course.py, the learner's entry point: versions read from pyproject.toml, commands as documented, and
`update` bringing in the course's new version without ever losing a learner's work."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def _course(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "course.py", *args], cwd=cwd, capture_output=True, text=True)


@pytest.fixture
def clone(tmp_path):
    """An upstream repository with course.py and two notebooks, and a learner's clone of it."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    upstream = tmp_path / "upstream"
    (upstream / "notebooks").mkdir(parents=True)
    shutil.copy(ROOT / "course.py", upstream / "course.py")
    (upstream / "notebooks" / "01_a.ipynb").write_text('{"v": 1}\n')
    (upstream / "notebooks" / "02_b.ipynb").write_text('{"v": 1}\n')
    (upstream / "README.md").write_text("v1\n")
    _git(upstream, "init", "-q", "-b", "main")
    _git(upstream, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    _git(upstream, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1")
    learner = tmp_path / "learner"
    _git(tmp_path, "clone", "-q", str(upstream), str(learner))
    return upstream, learner


def _publish(upstream: Path, changes: dict[str, str]) -> None:
    for name, text in changes.items():
        (upstream / name).write_text(text)
    _git(upstream, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "v2")


def test_update_keeps_every_edit_and_puts_the_new_version_beside_it(clone):
    upstream, learner = clone
    (learner / "notebooks" / "01_a.ipynb").write_text('{"my": "answers"}\n')  # work on a notebook the course changes
    (learner / "notebooks" / "02_b.ipynb").write_text('{"also": "mine"}\n')   # and on one it does not
    (learner / "notes.txt").write_text("untracked notes\n")
    _publish(upstream, {"notebooks/01_a.ipynb": '{"v": 2}\n', "README.md": "v2\n"})

    result = _course(learner, "update")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (learner / "notebooks" / "01_a.ipynb").read_text() == '{"my": "answers"}\n'
    assert (learner / "notebooks" / "01_a.updated.ipynb").read_text() == '{"v": 2}\n'
    assert (learner / "notebooks" / "02_b.ipynb").read_text() == '{"also": "mine"}\n'
    assert (learner / "notes.txt").read_text() == "untracked notes\n"
    assert (learner / "README.md").read_text() == "v2\n"
    assert "01_a.updated.ipynb" in result.stdout
    assert _git(learner, "rev-parse", "HEAD") == _git(upstream, "rev-parse", "HEAD")

    again = _course(learner, "update")
    assert again.returncode == 0 and "already up to date" in again.stdout


def test_update_with_local_commits_changes_nothing_and_says_how(clone):
    upstream, learner = clone
    (learner / "mine.txt").write_text("x\n")
    _git(learner, "add", "mine.txt")
    _git(learner, "-c", "user.name=l", "-c", "user.email=l@l", "commit", "-qm", "my commit")
    _publish(upstream, {"README.md": "v2\n"})
    head = _git(learner, "rev-parse", "HEAD")
    result = _course(learner, "update")
    assert result.returncode == 2 and "git merge" in result.stdout
    assert _git(learner, "rev-parse", "HEAD") == head and (learner / "README.md").read_text() == "v1\n"


def test_torch_range_comes_from_pyproject_and_unknown_commands_are_refused():
    import importlib.util

    spec = importlib.util.spec_from_file_location("course", ROOT / "course.py")
    course = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(course)
    assert course.torch_spec().startswith("torch>=")
    result = _course(ROOT, "frobnicate")
    assert result.returncode == 2 and "unknown command" in result.stdout
    assert "update" in _course(ROOT, "help").stdout
