"""The fork server (attn_course.tools.grading.zygote): imports once, forks a clean learner process per
job, dies with the grader."""

from __future__ import annotations

import pytest

import threading

import psutil

from attn_course.tools.grading.learner import PRELOAD
from attn_course.tools.grading.plan import PlanCell
from attn_course.tools.grading.zygote import Zygote

from ._grading import grader


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_every_job_starts_from_the_same_clean_state():
    """What one learner's process defines or patches is gone for the next: each is a fresh fork."""
    runner = grader().runner
    first = runner.run([PlanCell("added", "import torch\ntorch.leftover = 1\nLEFT = 1")], [])
    second = runner.run([PlanCell("added", "import torch\nassert not hasattr(torch, 'leftover')\nLEFT")], [])
    assert "error" not in first.progress[0]
    assert second.progress[0]["error"]["type"] == "NameError"  # LEFT is undefined, torch is untouched
    info = runner._zygotes[0].info
    assert set(PRELOAD) - {"ipywidgets"} <= set(info["loaded"]) and "attn_course.checks.core" in info["loaded"]


@pytest.mark.slow  # a fresh process, kernel or fork server: seconds
def test_a_server_dies_with_the_thread_that_started_it(tmp_path):
    """PR_SET_PDEATHSIG follows the starting thread: that is why the runner starts servers from one
    long-lived thread. Here a thread starts one, waits until it is ready, ends — and the server is gone."""
    from attn_course.tools.grading.zygote import copy_course

    holder = {}
    root = copy_course(tmp_path / "course")
    thread = threading.Thread(target=lambda: holder.update(z=Zygote(course_root=root, cwd=tmp_path).wait_ready()))
    thread.start()
    thread.join()
    zygote = holder["z"]
    try:
        psutil.Process(zygote.pid).wait(timeout=60)
        assert not zygote.alive()
    finally:
        zygote.close()


@pytest.mark.slow  # a fresh process, kernel or fork server: seconds
def test_without_fork_each_notebook_gets_a_fresh_interpreter(tmp_path, monkeypatch):
    """The Windows path (no os.fork), forced here: the same verdicts, from a spawned learner process."""
    from attn_course.tools.grading import collect, files
    from attn_course.tools.grading.pipeline import Grader
    from attn_course.tools.grading.zygote import SPAWN_ENV

    from ._grading import TEST_LIMITS, correct, course, write

    monkeypatch.setenv(SPAWN_ENV, "1")
    path = write(correct(), tmp_path / "ada" / "05_attention.ipynb")
    sub = collect.read_submission(files.Found("ada", path, "ada/05_attention.ipynb"), course())
    with Grader(course(), TEST_LIMITS, jobs=1) as spawning:
        rows = spawning.grade(sub)
    assert [r.status for r in rows] == ["passed", "passed"], [r.message for r in rows]
