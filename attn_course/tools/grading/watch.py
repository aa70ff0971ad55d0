"""Run one notebook's plan in a learner process, watch it, end it, and bring back only plain data.

:class:`Runner` owns the grader's private folder and one fork server (:mod:`.zygote`) per job slot.
For each notebook it makes a fresh folder for the learner process (its only writable place), hands
the plan to the server, and watches the process tree from the grader: CPU time (and, as a backstop,
wall time), the memory every
process the submission started allocated (the cgroup's count, else their unique set sizes summed:
libraries shared with the server are not counted), and how much the folder grew. When the notebook is
done or a limit is passed, every process of the submission is killed (the server's whole subtree,
the cgroup if there is one, anything still carrying the run's token). Only then are the learner's
outputs read back — ``progress.jsonl`` and each check's log, opened without following links,
size-limited, copied into the grader's own folder, which no learner process can write — and the
learner's folder is deleted.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import files, sandbox
from .learner import PROGRESS, RECORD
from .plan import PlanCell
from .zygote import Zygote, ZygoteDied, copy_course

__all__ = ["Run", "Runner", "clean_stale", "MAX_LOG_BYTES", "WALL_FACTOR"]

#: A notebook may use ``notebook_timeout`` seconds of CPU time, and this many times as long on the clock
#: (waiting, or a machine too busy to give it the CPU): its verdict does not depend on the machine's load.
WALL_FACTOR = 3
#: The largest check log read back (bytes on disk).
MAX_LOG_BYTES = 256 * 2**20
_MAX_PROGRESS = 4 * 2**20
_EXERCISE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
_WORK_PREFIX = "attn-grade-"


@dataclass
class Run:
    """What came back from one learner process (untrusted except ``stopped``, ``seconds``, ``peak_mb``)."""

    progress: list[dict[str, Any]] = field(default_factory=list)  # one entry per planned cell, as reported
    logs: dict[str, Path] = field(default_factory=dict)  # exercise id -> the grader's private copy of its log
    stopped: str = ""  # why the grader stopped the process ("" when it ended by itself)
    exit: dict[str, Any] = field(default_factory=dict)  # how the learner process ended
    seconds: float = 0.0
    cpu: float | None = None  # CPU seconds of the learner process itself (not of processes it started)
    queued: float | None = None  # seconds its main thread waited for a processor (Linux; the grader's measure)
    peak_mb: float | None = None
    sandbox: list[str] = field(default_factory=list)  # what confinement the learner process reported
    problems: list[str] = field(default_factory=list)  # files that could not be read back, and why

    def finished(self) -> bool:
        return any(entry.get("done") for entry in self.progress)

    def cell(self, index: int) -> dict[str, Any]:
        for entry in self.progress:
            if entry.get("cell") == index:
                return entry
        return {}


def _rmtree(path: Path) -> None:
    def retry(func, target, _exc):
        # A learner's folder may hold a link in a folder it made read-only: unlinking it fails, and a chmod
        # of the link would change what it points to (a classmate's notebook, the grades). Never follow one.
        with contextlib.suppress(OSError):
            for folder in (os.path.dirname(target), target):
                if not os.path.islink(folder):
                    os.chmod(folder, stat.S_IRWXU)
            func(target)

    try:
        shutil.rmtree(path, onerror=retry)
    except RecursionError:  # folders nested deeper than Python recurses (shutil.rmtree recurses per level)
        _flatten(Path(path))
        with contextlib.suppress(RecursionError):
            shutil.rmtree(path, onerror=retry)


def _flatten(path: Path) -> None:
    """Move everything below ``path`` up into ``path`` itself, one level at a time, without recursion and
    with two folders open at most: a learner's process may leave folders nested thousands deep (beyond
    Python's recursion limit and the longest path), which must not stop the grader removing them. Links
    are moved as links, never followed."""
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        top = os.open(path, flags)
    except OSError:
        return
    count, tag = 0, secrets.token_hex(6)
    try:
        moved = True
        while moved:
            moved = False
            with os.scandir(top) as entries:
                folders = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
            for name in folders:
                with contextlib.suppress(OSError, NotImplementedError):  # a folder, never a link (listed so)
                    os.chmod(name, stat.S_IRWXU, dir_fd=top, follow_symlinks=False)
                try:
                    child = os.open(name, flags, dir_fd=top)
                except OSError:
                    continue
                try:
                    with os.scandir(child) as entries:
                        inner = [e.name for e in entries]
                    for item in inner:
                        count += 1
                        with contextlib.suppress(OSError):
                            os.rename(item, f".flat-{tag}-{count}", src_dir_fd=child, dst_dir_fd=top)
                            moved = True
                finally:
                    os.close(child)
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=top)
    finally:
        os.close(top)


def clean_stale(base: Path) -> int:
    """Clean up after graders that were killed (SIGKILL) with their private folder in ``base``: kill what
    their submissions left running where no cgroup held it (processes still carrying the token written
    in that folder), then delete the folder. A grader is gone when the pid in its folder's ``owner`` is.
    Only folders in ``base`` are looked at, never the whole machine: another grader's run (another
    course, another test) is not this grader's to end. Returns how many processes were killed."""
    killed = 0
    with contextlib.suppress(OSError):
        for folder in base.glob(_WORK_PREFIX + "*"):
            try:
                owner = int((folder / "owner").read_text())
            except (OSError, ValueError):
                continue
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    killed += sandbox.sweep((folder / "token").read_text().strip())
                _rmtree(folder)
            except PermissionError:
                pass
    return killed


def _always_protected() -> list[str]:
    """Folders no learner process reads, whatever the command: the course's folder (its solutions), and the
    grader's working folder and home, where class folders and grades usually are."""
    from ..layout import find_root

    folders = [os.getcwd(), os.path.expanduser("~")]
    for root in (find_root(), find_root(Path(__file__).resolve().parent)):  # where the grader runs; its own course
        if root is not None:
            folders.append(str(root))
    return folders


class Runner:
    """Runs plans in learner processes; use as a context manager (everything is cleaned up at exit)."""

    def __init__(self, limits: sandbox.Limits, *, jobs: int = 1, confine: bool = True, threads: int | None = None,
                 temp_root: Path | None = None):
        """Learner processes may read none of the course's own folder, the grader's working folder and home,
        or this runner's folder (but their own), nor what :meth:`guard` adds."""
        import psutil  # noqa: F401 - imported now, before any learner code runs, like everything the grader uses

        self.limits, self.jobs, self.confine = limits, max(1, jobs), confine
        self.threads = threads or max(1, (os.cpu_count() or 1) // self.jobs)
        base = Path(temp_root or tempfile.gettempdir())
        clean_stale(base)
        sandbox.Cgroup.clean_stale()
        self.private = Path(tempfile.mkdtemp(prefix=_WORK_PREFIX, dir=base))
        self.token = f"{os.getpid()}-{secrets.token_hex(6)}"
        (self.private / "token").write_text(self.token)  # before "owner": a folder with an owner has its token
        (self.private / "owner").write_text(str(os.getpid()))
        os.chmod(self.private, 0o711)  # learner processes may pass through to their own folder, not list
        self.logs = self.private / "logs"
        self.logs.mkdir(mode=0o700)
        self.course_root = copy_course(self.private / "course")
        self.protect = [*_always_protected(), str(self.private)]
        self._readable: list[str] | None = None
        self._zygotes: dict[int, Zygote] = {}
        # Fork servers die with the thread that started them (PR_SET_PDEATHSIG), so one thread that
        # lives as long as this runner starts them all.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attn-grade-spawner")
        self._lock = threading.Lock()
        self._count = 0
        self.running: dict[int, str] = {}  # slot -> what it is grading (for attributing changes)

    def guard(self, folders: list[Path]) -> "Runner":
        """Protect ``folders`` too (the class folder, ``--out``, the solutions) from the notebooks run next."""
        new = [str(f) for f in folders if f is not None and str(f) not in self.protect]
        if new:
            self.protect += new
            self._readable = None
        return self

    def readable(self) -> list[str]:
        """What a confined learner process may read (:func:`~.sandbox.readable_roots`), worked out once, at the
        first notebook: by then this process has loaded PyTorch and the course, and their libraries count."""
        if self._readable is None:
            self._readable = sandbox.readable_roots([self.course_root], protect=self.protect)
        return self._readable

    @property
    def landlocked(self) -> bool:
        """Whether learner processes are confined by the kernel (Landlock), not only by an audit hook."""
        return self.confine and sandbox.landlock_abi() >= 1

    # ------------------------------------------------------------------ lifetime
    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for zygote in list(self._zygotes.values()):
            zygote.close()
        self._zygotes.clear()
        self._spawner.shutdown(wait=False)
        sandbox.sweep(self.token)
        with contextlib.suppress(OSError):
            os.chmod(self.private / "course", 0o755)
        _rmtree(self.private)

    def _start(self, slot: int) -> Zygote:
        zygote = self._zygotes.get(slot)
        if zygote is None or not zygote.alive():
            if zygote is not None:
                zygote.close()
            zygote = self._spawner.submit(Zygote, course_root=self.course_root, cwd=self.private).result()
            self._zygotes[slot] = zygote
        return zygote

    def _zygote(self, slot: int) -> Zygote:
        return self._start(slot).wait_ready()

    def start(self) -> "Runner":
        """Start every slot's fork server now (each imports PyTorch: seconds) without waiting for them."""
        for slot in range(self.jobs):
            self._start(slot)
        return self

    def warm(self) -> None:
        """Start every slot's fork server and wait until all are ready."""
        for zygote in [self._start(slot) for slot in range(self.jobs)]:
            zygote.wait_ready()

    # ------------------------------------------------------------------ one notebook
    def run(self, cells: list[PlanCell], exercises: list[str], *, slot: int = 0, label: str = "",
            limits: sandbox.Limits | None = None) -> Run:
        limits = limits or self.limits
        with self._lock:
            self._count += 1
            number = self._count
        work = self.private / f"work-{number}"
        for sub in ("", RECORD, "tmp", "home"):
            (work / sub).mkdir(mode=0o755, exist_ok=True)
        token = f"{self.token}-{number}"
        group = sandbox.Cgroup.create(f"{self.token}-{number}", limits)
        timeout = float(limits.cell_timeout)
        job = {"work": str(work), "token": token, "limits": asdict(limits), "threads": self.threads,
               "confine": self.confine, "readable": self.readable(), "protect": self.protect, "cgroup": group.join_path() if group else [],
               "cells": [c.job(timeout * 2 if c.kind == "check" else timeout) for c in cells]}
        self.running[slot] = label
        run = Run()
        start = time.monotonic()
        try:
            zygote = self._zygote(slot)
            try:
                pid = zygote.start(job)
                run.stopped, ended, run.peak_mb = self._watch(zygote, pid, work, start, group, limits)
                run.exit, run.cpu, run.queued = ended.get("status", {}), ended.get("cpu"), ended.get("queued")
            except ZygoteDied as exc:
                run.stopped = f"the grading process died ({exc})"
                zygote.close()
        finally:
            run.seconds = round(time.monotonic() - start, 2)
            if group is not None:
                if not run.stopped and group.out_of_memory():
                    run.stopped = f"used more than {limits.memory_mb} MiB of memory and was killed"
                group.kill()
            sandbox.sweep(token)
            self.running.pop(slot, None)
            self._collect(work, exercises, number, run)
            _rmtree(work)
        return run

    def _watch(self, zygote: Zygote, pid: int, work: Path, start: float, group,
               limits: sandbox.Limits) -> tuple[str, dict, float | None]:
        """Watch until the learner process has ended; returns (why it was stopped, the server's ``ended``
        message, peak memory in MiB)."""
        peak = 0
        stopped = ""
        disk_start = shutil.disk_usage(work).free
        next_disk = 0.0
        while True:
            elapsed = time.monotonic() - start
            # Most notebooks end within a second: look often at first, then every quarter second.
            ended = zygote.ended(0.02 if elapsed < 0.5 else 0.25)
            if ended is not None:
                return stopped, ended, round(peak / 2**20, 1) if peak else None
            elapsed = time.monotonic() - start
            if elapsed < 0.5:
                continue
            used = group.memory() if group is not None else None
            if used is None:
                used = sandbox.tree_memory(zygote.pid)
            peak = max(peak, used)
            if not stopped:
                if group is not None and group.out_of_memory():  # the kernel killed one of its processes
                    stopped = f"used more than {limits.memory_mb} MiB of memory and was killed"
                elif used > limits.memory_mb * 2**20:
                    stopped = f"used more than {limits.memory_mb} MiB of memory and was stopped"
                elif sandbox.tree_cpu(zygote.pid) > limits.notebook_timeout:
                    stopped = f"used more than {limits.notebook_timeout:g} s of CPU time in all and was stopped"
                elif elapsed > WALL_FACTOR * limits.notebook_timeout:
                    stopped = f"ran past {WALL_FACTOR * limits.notebook_timeout:g} s in all and was stopped"
                elif elapsed >= next_disk:
                    next_disk = elapsed + 0.5
                    if disk_start - shutil.disk_usage(work).free > limits.disk_mb * 2**20 and \
                            _size(work) > limits.disk_mb * 2**20:
                        stopped = f"wrote more than {limits.disk_mb} MiB of files and was stopped"
                if stopped:
                    if group is not None:
                        group.kill()
                    sandbox.kill_tree(zygote.pid, include_root=False)
                    ended = zygote.ended(30.0)
                    if ended is None:  # the server itself is stuck: replace it
                        zygote.close()
                        return stopped, {}, round(peak / 2**20, 1) if peak else None
                    return stopped, ended, round(peak / 2**20, 1) if peak else None

    def _collect(self, work: Path, exercises: list[str], number: int, run: Run) -> None:
        try:
            text = files.read_file(work / PROGRESS, limit=_MAX_PROGRESS).decode("utf-8", "replace")
        except files.Unreadable as exc:
            run.problems.append(f"progress: {exc}")
            text = ""
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                entry = files.plain(entry)  # written by the learner's process: strings the reports can hold
                if not isinstance(entry.get("error", {}), dict):
                    entry["error"] = {"type": "an exception"}
                if entry.get("start") and isinstance(entry.get("sandbox"), list):
                    run.sandbox = [str(s)[:200] for s in entry["sandbox"]][:10]
                elif "cell" in entry or "done" in entry:
                    run.progress.append(entry)
                elif "crash" in entry:
                    run.problems.append(f"the learner process failed: {str(entry['crash'])[:200]}")
        target = self.logs / str(number)
        # The logs are read through a descriptor of the record folder itself: the learner's process may have
        # replaced that folder by a link to another learner's (still running) record folder, whose logs
        # would then be graded as its own.
        try:
            folder = files.open_folder(work / RECORD)
        except files.Unreadable as exc:
            if os.path.lexists(work / RECORD):
                run.problems.append(f"the checks' log folder is {exc}; no log was read")
            return
        try:
            for exercise in exercises:
                if not _EXERCISE.match(exercise):
                    continue
                name = f"{exercise}.npz"
                try:
                    os.lstat(name, dir_fd=folder)
                except OSError:
                    continue
                try:
                    data = files.read_file(name, limit=MAX_LOG_BYTES, dir_fd=folder)
                except files.Unreadable as exc:
                    run.problems.append(f"{exercise}: the check's log is {exc}")
                    continue
                target.mkdir(mode=0o700, exist_ok=True)
                copy = target / name
                copy.write_bytes(data)
                run.logs[exercise] = copy
        finally:
            os.close(folder)

    def forget(self, run: Run) -> None:
        """Delete the private copies of a run's logs (once its verdicts are reached)."""
        for folder in {path.parent for path in run.logs.values()}:
            _rmtree(folder)
        run.logs = {}


def _size(folder: Path) -> int:
    """The bytes of the files below ``folder`` (links not followed), without recursion: a learner's folders
    may be nested deeper than Python recurses (os.walk does, per level). Files nested past the longest path
    cannot be measured: then the folder counts as larger than any limit (infinity)."""
    total, stack = 0, [str(folder)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    with contextlib.suppress(OSError):
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        else:
                            total += entry.stat(follow_symlinks=False).st_size
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                return float("inf")  # type: ignore[return-value]
            continue
    return total
