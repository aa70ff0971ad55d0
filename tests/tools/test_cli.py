"""The command line (attn_course.tools.cli): every command parses its own arguments one way, and
`python -m attn_course --help` lists them without importing their modules."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attn_course.tools import cli


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_command_module_configures_and_runs(command):
    module = importlib.import_module(cli.COMMANDS[command][0])
    assert callable(module.configure) and callable(module.run), command
    sub = cli.build_parser(command)._subparsers._group_actions[0].choices[command]
    assert sub.format_help().startswith("usage: python -m attn_course " + command)


def test_help_lists_every_command_quickly():
    out = subprocess.run([sys.executable, "-m", "attn_course", "--help"], capture_output=True, text=True, check=True)
    for command in cli.COMMANDS:
        assert command in out.stdout
    probe = subprocess.run([sys.executable, "-c", "import sys; from attn_course.tools import cli; "
                            "cli.build_parser(); print('torch' in sys.modules)"], capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "False", "building the parser imported torch"


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["no-such-command"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["grade", "--timeout", "0"], "--timeout: 0 must be above 0"),  # would fail every right answer
    (["grade", "--memory-limit", "-1"], "--memory-limit: -1 must be above 0"),
    (["grade", "--jobs", "two"], "--jobs: 'two' is not an integer"),
    (["grade", "--address-space-limit", "-2"], "must be 0 (no limit) or more"),
    (["schedule", "--start", "25:00"], "'25:00' is not a time of day written HH:MM"),
    (["schedule", "--wpm", "0"], "--wpm: 0 must be above 0"),
    (["bench-course", "--repeats", "0"], "--repeats: 0 must be above 0"),
    (["bench", "--threads", "0"], "--threads: 0 must be above 0"),
])
def test_a_limit_or_setting_that_makes_no_sense_is_refused_before_anything_runs(argv, said, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2 and said in capsys.readouterr().err


def test_a_missing_or_unreadable_file_is_one_line_and_exit_2_not_a_traceback(tmp_path, capsys, monkeypatch):
    (tmp_path / "notes.md").write_text("# not a notebook\n")
    for argv, said in [(["run-solutions", str(tmp_path / "99_nope.ipynb")], "No such file or directory"),
                       (["run-solutions", str(tmp_path / "notes.md")], "NotJSONError"),
                       (["links", "--root", str(tmp_path / "missing")], "pyproject.toml"),
                       (["mutants", str(tmp_path / "99_nope.ipynb")], "no notebook '99_nope' in the course")]:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"python -m attn_course {argv[0]}: ") and said in err and "\n" not in err, (argv, err)
    monkeypatch.setenv("ATTN_COURSE_TRACEBACK", "1")  # a maintainer asks for the traceback: the exception itself
    with pytest.raises(FileNotFoundError):
        cli.main(["run-solutions", str(tmp_path / "99_nope.ipynb")])


def test_options_that_cannot_apply_are_named_not_ignored(capsys):
    assert cli.main(["mutants", "--exercise", "bogus", "solutions/01_dot_product.ipynb"]) == 2
    assert "--exercise bogus: no such exercise in 01_dot_product.ipynb" in capsys.readouterr().err
    assert cli.main(["grade", "--shard", "1/2"]) == 2  # a shard of one learner's own notebooks means nothing
    assert "--shard splits a class" in capsys.readouterr().out


def test_exercises_check_writes_nothing(tmp_path, capsys):
    assert cli.main(["exercises", "--check", "--notebooks", str(tmp_path / "nowhere")]) == 1
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.slow  # a fresh Python process
@pytest.mark.parametrize("in_jupyter_terminal", [False, True])
def test_a_python_without_the_courses_libraries_gets_told_which_python_to_use(in_jupyter_terminal):
    # what `python -m attn_course grade` does in the course's folder with the system's Python, or with a
    # pyenv/conda shim that a shell's start-up files put first (also in JupyterLab's terminal): the package
    # is found in the folder, its libraries are not
    code = ("import runpy, sys; sys.modules['nbformat'] = None; sys.argv = ['attn_course', 'grade']; "
            "runpy.run_module('attn_course', run_name='__main__')")
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_SERVER_ROOT"}
    if in_jupyter_terminal:
        env["JUPYTER_SERVER_ROOT"] = str(Path.cwd())  # what Jupyter Server sets in its terminals
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "nbformat is missing" in out.stderr and sys.executable in out.stderr  # names the Python it found
    assert "python3 course.py grade" in out.stderr and ".venv/bin/python -m attn_course grade" in out.stderr
    assert "use JupyterLab's terminal" not in out.stderr and "(`python3 course.py lab`)" not in out.stderr
    assert ("pyenv or conda" in out.stderr) == in_jupyter_terminal


@pytest.mark.slow  # a fresh Python process
def test_tool_processes_read_notebooks_without_building_jsonschemas_iri_parsers():
    """attn_course/tools/__init__.py keeps rfc3987_syntax out (1.2-1.5 s per process); notebooks are still
    read and validated by nbformat as before."""
    code = ("import sys; import attn_course.tools, nbformat; "
            "nb = nbformat.read('solutions/05_attention.ipynb', as_version=4); nbformat.validate(nb); "
            "bad = nbformat.v4.new_notebook(); bad.cells = [{'cell_type': 'nonsense'}]; "
            "print(sys.modules.get('rfc3987_syntax', 'absent'), nbformat.validator.isvalid(bad))")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(cli.__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    blocked, bad_is_valid = done.stdout.split()
    assert blocked == "None" and bad_is_valid == "False", done.stdout
