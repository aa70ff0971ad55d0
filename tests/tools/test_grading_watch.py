"""One notebook in a learner process: watched, ended, its outputs read back as plain data, nothing
left behind (attn_course.tools.grading.watch, .learner, .zygote)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from attn_course.tools.grading import sandbox
from attn_course.tools.grading.plan import PlanCell
from attn_course.tools.grading.watch import clean_stale

from ._grading import TEST_LIMITS, grader

LINUX = os.path.isdir("/proc")


def _run(*sources: str, exercises=(), limits=None):
    cells = [PlanCell("setup", "import os, sys, subprocess, time")]
    cells += [PlanCell("added", s) for s in sources]
    return grader().runner.run(cells, list(exercises), limits=limits)


@pytest.mark.slow  # a fresh process, kernel or fork server: seconds
def test_each_cell_reports_and_the_learner_process_is_confined():
    run = _run("x = 1", "1 / 0", "x + 1")
    assert run.finished() and run.exit == {"exit": 0}
    assert [bool(e.get("error")) for e in run.progress if "cell" in e] == [False, False, True, False]
    assert run.progress[2]["error"] == {"type": "ZeroDivisionError", "message": "division by zero", "line": 1}
    if sandbox.landlock_abi() >= 1:
        assert any(s.startswith("landlock ABI") for s in run.sandbox), run.sandbox


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
@pytest.mark.skipif(not LINUX, reason="process containment is tested on Linux")
def test_processes_a_submission_starts_are_all_gone_afterwards(tmp_path):
    escape = ("code = 'import os, sys, time\\nif os.fork(): sys.exit(0)\\nos.setsid()\\ntime.sleep(600)'\n"
              "subprocess.Popen([sys.executable, '-c', code]).wait()\n"
              "subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
              "subprocess.Popen(['sleep', '600'], env={})")  # even without the token in its environment
    before = set(_sleepers())
    run = _run(escape)
    assert run.finished()
    time.sleep(0.3)
    assert set(_sleepers()) - before == set()
    assert sandbox.descendants(grader().runner._zygotes[0].pid) == []


def _sleepers() -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
            with open(f"/proc/{pid}/stat") as fh:
                zombie = fh.read().split()[2] == "Z"
        except OSError:
            continue
        if not zombie and (cmd.startswith(b"sleep\x00600") or b"time.sleep(600)" in cmd):
            found.append(int(pid))
    return found


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_the_notebook_limit_stops_a_process_that_ignores_interrupts():
    stubborn = ("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "while True:\n    pass")
    limits = sandbox.Limits(**{**TEST_LIMITS.__dict__, "cell_timeout": 60, "notebook_timeout": 1.5})
    run = _run(stubborn, limits=limits)
    # 1.5 s of CPU time, or (on a machine too busy to give it that) three times as long on the clock
    assert run.stopped.startswith(("used more than 1.5 s of CPU time", "ran past 4.5 s")) and not run.finished()


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_outputs_are_read_back_without_following_links_or_opening_fifos():
    plant = ("rec = os.environ['ATTN_COURSE_RECORD_DIR']\n"
             "os.symlink('/etc/passwd', rec + '/attention.npz')\n"
             "os.mkfifo(rec + '/score_matrix_bytes.npz')\n"
             "os.remove('progress.jsonl'); os.mkfifo('progress.jsonl')")
    started = time.monotonic()
    run = _run(plant, exercises=("attention", "score_matrix_bytes"))
    assert time.monotonic() - started < 60
    assert run.logs == {}
    assert any("symbolic link" in p for p in run.problems) and any("FIFO" in p for p in run.problems), run.problems


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_the_learners_folder_and_log_copies_are_removed():
    private = grader().runner.private
    cells = [PlanCell("added", "open('big.bin', 'wb').write(b'x' * 1000)\n"
                      "def score_matrix_bytes(n, batch=1, heads=1, dtype=None):\n    raise NotImplementedError()"),
             PlanCell("check", "from attn_course."
             "checks.attention import check_score_matrix_bytes\ncheck_score_matrix_bytes()", "score_matrix_bytes")]
    run = grader().runner.run(cells, ["score_matrix_bytes"])
    assert run.finished() and set(run.logs) == {"score_matrix_bytes"}
    assert [p.name for p in private.iterdir() if p.name.startswith("work-")] == []
    folder = run.logs["score_matrix_bytes"].parent
    assert folder.parent == private / "logs"
    grader().runner.forget(run)
    assert not folder.exists()


@pytest.mark.slow  # runs a learner process (forked from the grader's fork server)
def test_a_fork_bomb_is_contained_where_cgroups_are_available():
    probe = _run("raise ValueError(open('/proc/self/cgroup').read())")
    if "attn-grade-" not in probe.progress[1]["error"]["message"] or "pids:" not in probe.progress[1]["error"]["message"]:
        pytest.skip("no pids cgroup for learner processes on this machine (the guide says what then)")
    bomb = ("n = 0\ntry:\n    while n < 1000:\n        if os.fork() == 0:\n            time.sleep(600)\n"
            "            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nraise ValueError(n)")
    run = _run(bomb)
    forked = int(run.progress[1]["error"]["message"])
    assert forked < TEST_LIMITS.processes, forked
    assert sandbox.descendants(grader().runner._zygotes[0].pid) == []


@pytest.mark.skipif(not LINUX, reason="tokens are read from /proc")
@pytest.mark.slow
def test_a_grader_ends_what_a_killed_grader_of_its_folder_left_and_nothing_else(tmp_path):
    """Only the graders whose folders lie in this grader's folder count: another grader on the machine
    (another worker's, another course's) is never touched, alive or not."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a grader pid that no longer exists

    def grader_folder(base, owner: int, token: str):
        folder = base / f"attn-grade-{token}"
        folder.mkdir(parents=True)
        (folder / "token").write_text(token)
        (folder / "owner").write_text(str(owner))
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                                env=dict(os.environ, **{sandbox.TOKEN_ENV: f"{token}-1"}))
        return folder, proc

    killed_here, orphan = grader_folder(tmp_path / "mine", gone.pid, f"{gone.pid}-{time.time_ns()}")
    alive_here, alive = grader_folder(tmp_path / "mine", os.getpid(), f"{os.getpid()}-{time.time_ns()}")
    elsewhere, other = grader_folder(tmp_path / "other", gone.pid, f"{gone.pid}-{time.time_ns() + 1}")
    try:
        time.sleep(0.2)
        assert clean_stale(tmp_path / "mine") == 1
        assert orphan.wait(timeout=10) == -signal.SIGKILL
        assert not killed_here.exists()
        assert alive.poll() is None and alive_here.exists()
        assert other.poll() is None and elsewhere.exists()
    finally:
        for proc in (orphan, alive, other):
            proc.kill()
            proc.wait()
