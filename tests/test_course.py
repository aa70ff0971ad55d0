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


def _module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_under_test", ROOT / "course.py")
    course = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(course)
    return course


@pytest.mark.parametrize("command", ["lab", "grade", "test", "setup", "update"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_after_any_command_answers_without_installing(command, flag, monkeypatch, capsys):
    course = _module()

    def refuse(*args, **kwargs):
        raise AssertionError("--help installed or ran something")

    for name in ("setup", "run", "update", "lab", "test"):
        monkeypatch.setattr(course, name, refuse)
    assert course.main([command, flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"python3 course.py {command}")
    assert course.main([command, "--no-browser", flag]) == 0  # also after other arguments
    assert course.main(["help", command]) == 0 and capsys.readouterr().out.startswith(f"python3 course.py {command}")


def test_help_on_something_that_is_not_a_command_says_so(capsys):
    assert _module().main(["help", "frobnicate"]) == 2
    assert "no help on 'frobnicate': it is not a command" in capsys.readouterr().out


def test_grade_exit_codes_are_stated_in_help_and_readme():
    course = _module()
    for text in (course.HELP["grade"], course.__doc__, (ROOT / "README.md").read_text(encoding="utf-8")):
        flat = " ".join(text.split())
        assert "0 when no exercise failed" in flat and "1 when at least one failed" in flat, text[:200]
        assert "2 when nothing could be graded" in flat


@pytest.mark.parametrize("rest", [[], ["--no-browser"], ["--port=8899"], ["--no-browser", "--port", "8899"]])
def test_lab_opens_notebook_00_whatever_else_is_passed(rest, monkeypatch):
    course = _module()
    monkeypatch.setenv("SHELL", "/bin/sh")
    args, line = course.lab_args(list(rest), {"SHELL": "/bin/sh"})
    assert f"--LabApp.default_url=/lab/tree/{course.FIRST_NOTEBOOK}" in args
    assert course.FIRST_NOTEBOOK in args and all(a in args for a in rest)
    assert "notebook 00" in line
    if "--no-browser" in rest:
        assert "open the address it prints" in line and "opening" not in line
    else:
        assert line.startswith("opening JupyterLab at notebook 00")


def test_lab_opens_the_notebook_the_learner_names():
    course = _module()
    args, line = course.lab_args(["notebooks/05_attention.ipynb", "--no-browser"], {"SHELL": "/bin/sh"})
    assert "--LabApp.default_url=/lab/tree/notebooks/05_attention.ipynb" in args
    assert course.FIRST_NOTEBOOK not in args and "notebooks/05_attention.ipynb" in line


def test_lab_gives_terminals_the_courses_python_first(tmp_path):
    course = _module()
    env = course.env_with_venv()
    assert env["PATH"].split(course.os.pathsep)[0] == str(course.env_bin())
    bash = shutil.which("bash")
    if bash is None or course.os.name == "nt":
        pytest.skip("no bash here")
    env["SHELL"] = bash
    shell = course.terminal_shell(env, tmp_path / "shell")
    assert shell.startswith(bash) and "--rcfile" in shell and env["COURSE_BIN"] == str(course.env_bin())


def _shim_home(tmp_path: Path) -> tuple[Path, Path]:
    """A home whose start-up files put a pyenv-like `python` shim first on PATH, as many macOS set-ups do."""
    home, shims = tmp_path / "home", tmp_path / "shims"
    home.mkdir()
    shims.mkdir()
    (shims / "python").write_text("#!/bin/sh\necho shim\n")
    (shims / "python").chmod(0o755)
    line = f'export PATH="{shims}:$PATH"\n'
    for name in (".bashrc", ".bash_profile", ".zshrc", ".zprofile"):
        (home / name).write_text(line)
    return home, shims


@pytest.mark.slow  # starts shells
@pytest.mark.parametrize("name", ["bash", "zsh"])
@pytest.mark.parametrize("login", [False, True])
def test_a_terminal_shell_finds_the_courses_python_despite_a_shim(name, login, tmp_path, monkeypatch):
    shell = shutil.which(name)
    if shell is None or sys.platform == "win32":
        pytest.skip(f"{name} is not installed")
    course = _module()
    home, shims = _shim_home(tmp_path)
    monkeypatch.setattr(course.sys.stdout, "isatty", lambda: not login)
    env = dict(course.env_with_venv(), HOME=str(home), SHELL=shell)
    command = course.terminal_shell(env, tmp_path / "course-shell")
    import shlex

    done = subprocess.run([*shlex.split(command), "-c", "command -v python; echo $PATH"], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    found, path = done.stdout.strip().splitlines()[-2:]
    assert Path(found).parent == course.env_bin(), done.stdout + done.stderr
    assert str(shims) in path  # the learner's own start-up files did run


def test_one_spelling_of_the_course_command_everywhere():
    """`python3 course.py ...` on macOS and Linux; plain `python course.py` only where Windows is named."""
    import re

    places = [ROOT / "README.md", ROOT / "course.py", ROOT / "requirements.txt", ROOT / "pyproject.toml",
              ROOT / "conftest.py", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "attn_course").rglob("*.py"))]
    slips = []
    for path in places:
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"(?<![\w/.])python course\.py", text):
            if "Windows" not in text[max(0, match.start() - 60):match.start()]:
                line = text.count("\n", 0, match.start()) + 1
                slips.append(f"{path.relative_to(ROOT)}:{line}")
    assert not slips, f"`python course.py` where `python3 course.py` is meant: {slips}"
