"""The notebook runner (attn_course.tools.runner): a cell past its time-out is interrupted and the run goes on."""

from __future__ import annotations

import nbformat
import pytest

from attn_course.tools.runner import execute


def _tiny(cells: list[str]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


@pytest.mark.slow
def test_runner_interrupts_a_cell_past_its_timeout_and_goes_on(tmp_path):
    nb = _tiny(["x = 1", "while True:\n    pass", "1 / 0", "import os\nprint(os.getcwd())"])
    run = execute(nb, cwd=tmp_path, cell_timeout=3, measure_memory=True)
    assert run.problem is None
    assert run.errors == [1, 2]
    assert run.notebook.cells[1].outputs[0]["ename"] == "KeyboardInterrupt"
    assert run.notebook.cells[3].outputs[0]["text"].strip() == str(tmp_path)
    assert run.peak_rss_bytes and 10 * 2**20 < run.peak_rss_bytes < 2**30
    assert len(run.notebook.cells) == 4  # the memory probe is removed again


@pytest.mark.slow
def test_the_kernels_own_warnings_stay_out_of_the_output(tmp_path):
    """"[IPKernelApp] WARNING | Kernel is running over TCP without encryption" is noise in every command."""
    import subprocess
    import sys

    code = ("import nbformat; from pathlib import Path; from attn_course.tools.runner import execute\n"
            "nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('print(6 * 7)')])\n"
            "nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}\n"
            f"run = execute(nb, cwd=Path({str(tmp_path)!r}))\n"
            "print(run.problem, run.notebook.cells[0].outputs[0]['text'].strip())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "None 42", done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr


@pytest.mark.slow
def test_a_kernel_that_never_answers_is_started_once_more(tmp_path, monkeypatch):
    from attn_course.tools import runner

    real, calls = runner.run_client, []

    def first_kernel_silent(client, env, cell_timeout):
        calls.append(client)
        if len(calls) == 1:  # what nbclient reports when a kernel misses its first message
            return "RuntimeError: Kernel didn't respond in 60 seconds"
        return real(client, env, cell_timeout)

    monkeypatch.setattr(runner, "run_client", first_kernel_silent)
    run = execute(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")]), cwd=tmp_path)
    assert run.problem is None and len(calls) == 2 and calls[0] is not calls[1]
    assert run.notebook.cells[0].outputs[0]["text"] == "42\n"


def test_nbval_starts_a_silent_kernel_once_more(monkeypatch):
    import nbval.kernel

    import conftest

    attempts = []

    def silent_once(*args, **kwargs):
        attempts.append(kwargs)
        if len(attempts) == 1:
            raise RuntimeError("Kernel didn't respond in 60 seconds")
        return "km", "kc"

    monkeypatch.setattr(conftest, "_start_new_kernel", silent_once)
    assert nbval.kernel.start_new_kernel(startup_timeout=60) == ("km", "kc") and len(attempts) == 2
    attempts.clear()
    monkeypatch.setattr(conftest, "_start_new_kernel", lambda **kw: (_ for _ in ()).throw(RuntimeError("silent")))
    with pytest.raises(RuntimeError):  # twice silent: an error, as before
        nbval.kernel.start_new_kernel(startup_timeout=60)
