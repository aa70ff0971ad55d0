"""The learner's process: run one notebook's planned cells in IPython, with every check recording.

This module's :func:`run` is the only grading code that shares a process with learner code, and it
decides nothing. It runs in a child forked from the fork server (:mod:`.zygote`), which imported the
course and its libraries before any learner code ran (without ``fork``: in a fresh interpreter,
:func:`main_spawned`). In order, it

1. leaves the server's session and process group, dies with the server (``PR_SET_PDEATHSIG``),
   enters its cgroup if there is one, takes its resource limits (:mod:`.sandbox`);
2. moves into its own folder (``HOME`` and ``TMPDIR`` too), points standard input at /dev/null and
   standard output and error at /dev/null (no output is ever read back), gives up root's
   capabilities when it has them, and confines
   itself (Landlock: writes only in its folder, reads only there and in the system's, Python's and the
   course's code; else an audit hook);
3. runs the planned cells one by one in a fresh ``InteractiveShell`` with
   ``ATTN_COURSE_RECORD_DIR`` set, so every check writes its operation log into ``record/``
   (and ``ATTN_COURSE_CALL_TIMEOUT`` when the instructor lowered the checks' per-call limit);
4. appends one line of JSON per cell to ``progress.jsonl`` (did it raise, what, on which line; is
   the exercise defined at its check): untrusted notes that the grader uses only to *explain* an
   exercise that has no log, never to pass one.

A cell that runs past its time is interrupted (KeyboardInterrupt raised in it by a watchdog thread,
noted as a time-out); one that will not stop ends the process, and the grader's watch kills it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from . import sandbox

__all__ = ["run", "preload", "main_spawned", "PRELOAD", "PROGRESS", "RECORD"]

PROGRESS = "progress.jsonl"
RECORD = "record"
_MAX_TEXT = 300
_GRACE_S = 5.0  # after an interrupt, how long a cell may take to stop before the process ends itself
#: Imported before any learner code runs (by the fork server before its first fork, or by a freshly
#: spawned learner process): what notebooks' set-up cells and the checks use.
PRELOAD = ("numpy", "torch", "torch.nn", "torch.nn.functional", "torch.autograd", "matplotlib",
           "matplotlib.pyplot", "matplotlib.font_manager", "IPython.core.interactiveshell",
           "IPython.display", "traitlets.config", "tqdm", "tqdm.auto", "ipywidgets", "psutil")


def preload() -> dict[str, list[str]]:
    """Import :data:`PRELOAD` and every module of the course except its tools; returns what was
    ``loaded`` and what ``failed`` (an optional library, a module with an optional dependency)."""
    import importlib
    import pkgutil

    os.environ["MPLBACKEND"] = "Agg"
    loaded, failed = [], []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception:  # noqa: BLE001 - an optional library
            failed.append(name)
    import attn_course

    for info in pkgutil.walk_packages(attn_course.__path__, "attn_course."):
        if info.name.startswith("attn_course.tools") or info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
            loaded.append(info.name)
        except Exception:  # noqa: BLE001 - a module with an optional dependency (triton)
            failed.append(info.name)
    import matplotlib.font_manager  # noqa: F401 - the font list, loaded once here

    return {"loaded": loaded, "failed": failed}


def _cell_error(exc: BaseException | None, filename_prefix: str = "<ipython-input-") -> dict[str, Any] | None:
    """Type, message and the line of the learner's cell where ``exc`` was raised."""
    if exc is None:
        return None
    info: dict[str, Any] = {"type": type(exc).__name__}
    try:
        info["message"] = (exc.msg if isinstance(exc, SyntaxError) and exc.msg else str(exc))[:_MAX_TEXT]
    except BaseException:  # noqa: BLE001 - a learner's exception may have an unprintable message
        info["message"] = ""
    if isinstance(exc, SyntaxError):
        info["line"] = exc.lineno
        return info
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        name = frame.f_code.co_filename
        if name.startswith(filename_prefix) or "/ipykernel_" in name:
            line = lineno
    if line is not None:
        info["line"] = line
    return info


class _Watchdog:
    """Interrupts the main thread when a cell runs past its time; ends the process if it will not stop."""

    def __init__(self) -> None:
        self.fired = False
        self._timer: threading.Timer | None = None

    def start(self, seconds: float) -> None:
        self.fired = False

        def fire() -> None:
            self.fired = True
            if hasattr(signal, "pthread_kill"):
                # A real signal (not _thread.interrupt_main) also breaks a blocking call such as sleep().
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            else:  # Windows
                import _thread

                _thread.interrupt_main()
            time.sleep(_GRACE_S)
            os._exit(3)  # the cell swallowed the interrupt: the grader sees "stopped"

        self._timer = threading.Timer(seconds, fire)
        self._timer.daemon = True
        self._timer.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _prepare(job: dict[str, Any]) -> list[str]:
    """Steps 1–2 of the module docstring; returns notes on what could not be applied."""
    from ...checks.boundary import CALL_TIMEOUT_ENV, RECORD_ENV  # preloaded with the course (torch)

    notes: list[str] = []
    work = Path(job["work"])
    if hasattr(os, "setsid"):
        os.setsid()
    if sandbox.set_parent_death_signal() and os.getppid() == 1:  # the server died between fork and here
        os._exit(2)
    for procs in job.get("cgroup", []):
        try:
            Path(procs).write_text(str(os.getpid()))
        except OSError as exc:
            notes.append(f"cgroup: {exc}")
    limits = sandbox.Limits(**job["limits"])
    notes += sandbox.apply_rlimits(limits)
    env = os.environ
    for key in [k for k in env if k.startswith(("JPY_", "JUPYTER_", "ATTN_COURSE_"))]:
        del env[key]
    env.update({
        "HOME": str(work / "home"), "TMPDIR": str(work / "tmp"), "MPLCONFIGDIR": str(work / "home" / ".mpl"),
        "IPYTHONDIR": str(work / "home" / ".ipython"), "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1", sandbox.TOKEN_ENV: job["token"], RECORD_ENV: str(work / RECORD),
    })
    if limits.call_timeout:  # an instructor's cap on every check's per-call limit (the boundary applies it)
        env[CALL_TIMEOUT_ENV] = str(float(limits.call_timeout))
    threads = str(job.get("threads") or 1)
    env.update({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})
    import tempfile

    tempfile.tempdir = None
    os.chdir(work)
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    try:
        if sandbox.drop_capabilities():
            notes.append("root without capabilities")
    except OSError as exc:
        notes.append(f"could not drop root's capabilities: {exc}")
    protect, readable = [Path(p) for p in job.get("protect", [])], job.get("readable")
    if job.get("confine", True):
        try:
            notes.append(sandbox.confine(work, readable=readable))
        except (RuntimeError, OSError) as exc:
            notes.append(f"{exc}; " + sandbox.audit_guard(work, protect=protect, readable=readable or []))
    else:  # --no-landlock: the fallback alone, as on a machine without Landlock
        notes.append(sandbox.audit_guard(work, protect=protect, readable=readable or []))
    return notes


def _shell():
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "NoColor"
    config.InteractiveShell.xmode = "Plain"
    return InteractiveShell.instance(config=config)


def run(job: dict[str, Any]) -> None:
    """The learner process's whole life (never returns)."""
    code = 0
    try:
        started = time.perf_counter()
        notes = _prepare(job)
        # Opened after standard input, output and error point at /dev/null (it must not be fd 0, 1 or 2).
        progress = open(Path(job["work"]) / PROGRESS, "a", encoding="utf-8")

        def emit(entry: dict[str, Any]) -> None:
            progress.write(json.dumps(entry, ensure_ascii=False) + "\n")
            progress.flush()

        emit({"start": True, "sandbox": notes, "seconds": round(time.perf_counter() - started, 3)})
        try:
            import torch

            torch.set_num_threads(int(job.get("threads") or 1))
        except Exception:  # noqa: BLE001
            pass
        signal.signal(signal.SIGINT, signal.default_int_handler)
        shell = _shell()
        from ...checks import cells  # each check knows how its exercise cell's last run ended (as in a notebook)

        cells.install(shell)
        emit({"shell": True, "seconds": round(time.perf_counter() - started, 3)})
        watchdog = _Watchdog()
        for index, cell in enumerate(job["cells"]):
            entry: dict[str, Any] = {"cell": index}
            watchdog.start(float(cell.get("timeout") or job["limits"]["cell_timeout"]))
            started = time.perf_counter()
            try:
                result = shell.run_cell(cell["source"], store_history=True)
                error = result.error_before_exec or result.error_in_exec
            except BaseException as exc:  # noqa: BLE001 - SystemExit and friends raised past IPython
                error = exc
            finally:
                watchdog.stop()
            entry["seconds"] = round(time.perf_counter() - started, 3)
            if watchdog.fired:
                entry["timeout"] = True
            if error is not None:
                entry["error"] = _cell_error(error)
            if cell.get("exercise") and cell.get("kind") == "check":
                entry["defined"] = cell["name"] in shell.user_ns
            emit(entry)
        emit({"done": True})
        progress.close()
    except BaseException as exc:  # noqa: BLE001 - never let an exception escape into the fork server's code
        code = 1
        with contextlib.suppress(BaseException):
            with open(Path(job["work"]) / PROGRESS, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"crash": f"{type(exc).__name__}: {exc}"[:_MAX_TEXT]}) + "\n")
    finally:
        os._exit(code)


def main_spawned() -> None:
    """Where ``fork`` does not exist (Windows): a fresh interpreter imports what the fork server would
    have, reads its job from standard input and runs it. Slower (PyTorch is imported per notebook)."""
    job = json.loads(sys.stdin.readline())
    preload()
    run(job)
