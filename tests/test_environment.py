"""Notebook 00's environment report: versions, device, widgets, and an honest READY / NOT READY line."""

import subprocess
import sys

import pytest

from attn_course import environment as env


def test_this_environment_is_ready():
    rep = env.report()
    assert rep.ready, rep.problems
    line = env.verdict(rep)
    assert line.startswith("READY: ") and "\n" not in line
    assert rep.versions["torch"] in line


def test_versions_cover_every_package_with_a_minimum():
    found = env.versions()
    assert set(found) == set(env.MINIMUM)
    assert found["python"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}")


@pytest.mark.parametrize("text, expected", [("2.13.0+cpu", (2, 13, 0)), ("8.1.9", (8, 1, 9)), ("2.4.0rc1", (2, 4, 0)), ("3.10", (3, 10))])
def test_version_parsing(text, expected):
    assert env._version_tuple(text) == expected


def test_device_is_one_of_the_three_kinds_and_computes():
    kind, name = env.device()
    assert kind in {"cpu", "cuda", "mps"} and name
    assert env.torch_check("cpu") is None


def test_widgets_check_passes_here():
    assert env.widget_check() is None


def test_missing_package_makes_it_not_ready_and_says_what_to_fix(monkeypatch):
    real = env._installed
    monkeypatch.setattr(env, "_installed", lambda name: None if name == "ipywidgets" else real(name))
    rep = env.report()
    assert not rep.ready
    line = env.verdict(rep)
    assert line.startswith("NOT READY: ") and "ipywidgets is not installed" in line and "course.py setup" in line
    assert line.count("ipywidgets is not installed") == 1, line  # the version list and the widget check agree: once


def test_missing_ipywidgets_is_named_once_even_when_it_cannot_be_imported(monkeypatch):
    real = env._installed
    monkeypatch.setattr(env, "_installed", lambda name: None if name == "ipywidgets" else real(name))
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # `import ipywidgets` fails, as when it is missing
    rep = env.report()
    assert rep.problems.count("ipywidgets is not installed") == 1, rep.problems


def test_the_fix_says_restart_the_kernel_only_in_a_notebook(monkeypatch):
    real = env._installed
    monkeypatch.setattr(env, "_installed", lambda name: None if name == "ipywidgets" else real(name))
    rep = env.report()
    in_terminal, in_notebook = env.verdict(rep, kernel=False), env.verdict(rep, kernel=True)
    assert "restart the kernel" not in in_terminal and "run this check again" in in_terminal
    assert in_notebook.endswith("then restart the kernel")
    assert not env.in_kernel()  # pytest is a terminal: the default is the terminal's wording
    assert env.verdict(rep) == in_terminal
    assert "python3 course.py setup" in in_terminal


def test_old_package_is_reported_with_its_minimum(monkeypatch):
    real = env._installed
    monkeypatch.setattr(env, "_installed", lambda name: "2.0.1" if name == "torch" else real(name))
    line = env.verdict(env.report())
    minimum = env.MINIMUM["torch"]
    assert "NOT READY" in line and f"torch 2.0.1 is older than {minimum}" in line


def test_missing_jupyterlab_is_a_note_not_a_blocker(monkeypatch):
    real = env._installed
    monkeypatch.setattr(env, "_installed", lambda name: None if name in ("jupyterlab", "jupyterlab_widgets") else real(name))
    rep = env.report()
    assert rep.ready and any("jupyterlab is not installed" in note for note in rep.notes)


def test_broken_torch_on_a_device_is_reported():
    assert "fails on" in env.torch_check("no-such-device")


@pytest.mark.slow  # a fresh process, kernel or fork server: seconds
def test_print_report_and_command_line(capsys):
    env.print_report()
    out = capsys.readouterr().out
    assert "torch" in out and out.strip().splitlines()[-1].startswith("READY")
    run = subprocess.run([sys.executable, "-m", "attn_course.environment"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "READY:" in run.stdout
