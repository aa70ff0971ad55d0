"""The fork server: one process that imports the course once and forks a fresh learner process per notebook.

Starting a Jupyter kernel and importing PyTorch for every notebook cost seconds each; forking a
process that has already imported them costs milliseconds, and every fork starts from the same
clean state (nothing a learner ran before is in it: it ran in a sibling, now dead). The server
itself never runs learner code.

Protocol (one JSON object per line): the grader writes a job to the server's standard input; the
server answers ``{"started": pid}`` when it forked the learner process and ``{"ended": pid, "status":
…}`` when that process and everything it started are gone. The server is a subreaper (no descendant
can leave its tree) and dies with the grader (``PR_SET_PDEATHSIG``).

:class:`Zygote` is the grader's side: start the server, hand it jobs, read its answers.

Where there is no ``fork`` (Windows), the server starts a fresh interpreter per notebook instead
(:func:`attn_course.tools.grading.learner.main_spawned`), which imports what the server would have
(:func:`~attn_course.tools.grading.learner.preload`): the same protocol and the same learner process,
seconds slower each. The server depends on :mod:`.learner`, never the other way round.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import sandbox
from .learner import preload, run

__all__ = ["Zygote", "ZygoteDied", "main", "SPAWN_ENV"]

class ZygoteDied(RuntimeError):
    """The fork server ended (or never became ready)."""


# ============================================================================ the server process
def _reap_all(timeout: float = 10.0) -> None:
    """Kill every descendant left (re-parented orphans included) and reap them all."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sandbox.kill_tree(os.getpid(), include_root=False, timeout=1.0)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return  # no children left at all
        if not sandbox.descendants(os.getpid()):
            return
        time.sleep(0.01)


def _describe(status: int) -> dict[str, Any]:
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None}


def _queued_at_exit(pid: int) -> float | None:
    """Seconds the learner process's main thread (where its cells and checks run) spent ready to run but
    waiting for a processor, read once it has ended and before it is reaped (Linux); None elsewhere. The
    grader's own measure of "the computer was too busy", which the learner's process could only report."""
    try:
        while True:
            try:
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
                break
            except InterruptedError:
                continue
        with open(f"/proc/{pid}/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (AttributeError, OSError, ValueError, IndexError):  # no waitid or /proc (macOS, Windows)
        return None


def _spawn(job: dict[str, Any]) -> int:
    """Start a learner process without fork (Windows, or ``ATTN_COURSE_GRADING_SPAWN=1``)."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r}); "
            "from attn_course.tools.grading.learner import main_spawned; main_spawned()")
    proc = subprocess.Popen([sys.executable, "-I", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, text=True)
    proc.stdin.write(json.dumps(job) + "\n")
    proc.stdin.close()
    _SPAWNED[proc.pid] = proc
    return proc.pid


_SPAWNED: dict[int, subprocess.Popen] = {}
#: Set (to 1) in the grader's environment, learner processes are started fresh instead of forked.
SPAWN_ENV = "ATTN_COURSE_GRADING_SPAWN"


def main() -> None:
    """The server's life: preload, then fork one learner process per job line until stdin closes."""
    sandbox.set_parent_death_signal()
    sandbox.become_subreaper()
    spawn = not hasattr(os, "fork") or os.environ.get(SPAWN_ENV) == "1"
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)  # nothing a library prints may corrupt the protocol
    os.close(devnull)

    def send(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    send({"ready": True, "pid": os.getpid(), **({"loaded": [], "failed": []} if spawn else preload())})
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        if spawn:
            pid = _spawn(job)
            send({"started": pid})
            returncode = _SPAWNED.pop(pid).wait()
            sandbox.kill_tree(os.getpid(), include_root=False)
            status = {"exit": returncode} if returncode >= 0 else {"signal": -returncode}
            send({"ended": pid, "status": status})
            continue
        pid = os.fork()
        if pid == 0:  # the learner process
            with contextlib.suppress(OSError):
                replies.close()
                os.close(0)
            run(job)  # never returns
            os._exit(1)
        send({"started": pid})
        cpu, queued = None, _queued_at_exit(pid)
        while True:
            try:
                _, status, usage = os.wait4(pid, 0)
                cpu = round(usage.ru_utime + usage.ru_stime, 3)
                break
            except InterruptedError:
                continue
            except ChildProcessError:
                status = 0
                break
        _reap_all()
        send({"ended": pid, "status": _describe(status), "cpu": cpu, "queued": queued})


# ============================================================================ the grader's side
class Zygote:
    """A running fork server, seen from the grader."""

    def __init__(self, *, course_root: Path, cwd: Path):
        """Start the server (returns at once; :meth:`wait_ready` waits for its imports). The server dies
        with the *thread* that starts it (``PR_SET_PDEATHSIG``): start it from one that lives on."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ATTN_COURSE_", "JPY_", "JUPYTER_", "PYTHON")) or k == SPAWN_ENV}
        env.update({"MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"})
        if sys.platform == "darwin":  # fork after Objective-C initialisation is refused without this
            env["OBJC_DISABLE_INITIALIZE_FORK_SAFETY"] = "YES"
        code = (f"import sys; sys.path.insert(0, {str(course_root)!r}); "
                "from attn_course.tools.grading.zygote import main; main()")
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=cwd, env=env,
                                     start_new_session=True, text=True, encoding="utf-8")
        self._replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.info: dict[str, Any] = {}

    def wait_ready(self, timeout: float = 300.0) -> "Zygote":
        if not self.info:
            message = self._next(timeout)
            if not message.get("ready"):
                self.close()
                raise ZygoteDied("the grading process did not start")
            self.info = message
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self._replies.put(json.loads(line))
        self.proc.stdout.close()  # the server is gone (end of file): nothing more to read
        self._replies.put(None)

    def _next(self, timeout: float | None) -> dict[str, Any]:
        try:
            message = self._replies.get(timeout=timeout)
        except queue.Empty:
            return {}
        if message is None:
            self._replies.put(None)
            raise ZygoteDied("the grading process ended")
        return message

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, job: dict[str, Any]) -> int:
        """Fork a learner process for ``job``; returns its pid."""
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise ZygoteDied(f"the grading process is gone ({exc})") from None
        message = self._next(60.0)
        if "started" not in message:
            raise ZygoteDied("the grading process did not fork")
        return int(message["started"])

    def ended(self, timeout: float) -> dict[str, Any] | None:
        """The ``ended`` message, or None if the learner process is still running after ``timeout``."""
        message = self._next(timeout)
        return message if "ended" in message else None

    def close(self) -> None:
        """Stop the server and everything below it."""
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()
        sandbox.kill_tree(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def copy_course(target: Path) -> Path:
    """A private copy of the ``attn_course`` package under ``target`` (what the server imports), made
    from the files the grader itself imported. Returns the folder to put on ``sys.path``."""
    import attn_course

    source = Path(attn_course.__file__).resolve().parent
    shutil.copytree(source, target / "attn_course", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path in (target / "attn_course").rglob("*"):
        with contextlib.suppress(OSError):
            path.chmod(0o555 if path.is_dir() else 0o444)
    with contextlib.suppress(OSError):
        (target).chmod(0o555)
    return target


if __name__ == "__main__":  # pragma: no cover - started by Zygote with -c
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    main()
