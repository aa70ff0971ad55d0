"""Containment of a learner's process: what it may write, which limits it runs under, how it ends.

Everything here is a primitive the grader combines (:mod:`.learner` calls the confining half inside
the freshly forked learner process, :mod:`.watch` the watching and killing half in the grader):

* :func:`confine` — Landlock (Linux ≥ 5.13): from then on the process and everything it
  starts may create, change or delete files only inside its own folder (``/dev/null`` aside), may read
  only there and in the folders :func:`readable_roots` lists (the system's, Python's, the course's
  private copy: never the class folder, the course's solutions or the grader's other folders), may not
  ptrace processes outside its sandbox (any ABI) nor signal them (ABI ≥ 6) (the grader, other learners), may
  open no TCP connection (ABI ≥ 4). The kernel enforces it, for subprocesses and C code too, and it
  cannot be undone. Where Landlock is missing, :func:`audit_guard` refuses Python-level writes
  outside the folder and reads inside the protected folders (an audit hook: subprocesses and C code
  are not covered) and the grader falls back on detection;
* :func:`apply_rlimits` — address space, file size, core dumps and open files, each clamped to the
  current limits, so that a shell with lower limits can never make setting them fail;
* :func:`set_parent_death_signal` / :func:`become_subreaper` — a learner process dies with the
  process that started it, and every process it starts, double-forked or in a new session, stays a
  descendant of the fork server (a subreaper), where :func:`kill_tree` finds it;
* :data:`TOKEN_ENV` — every learner process carries a token in its environment (its grader's token and
  the run's number); :func:`sweep` kills whatever still carries a grader's or a run's token (a last
  resort for anything that escaped the tree; the grader also sweeps the token of a grader that was
  killed, read from that grader's folder: :func:`~.watch.clean_stale`);
* :class:`Cgroup` — where the machine lets the grader create cgroups (root, or a delegated v2
  subtree): a memory and process-count limit enforced by the kernel, and a kill of the whole group.

Nothing in this module runs learner code.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Limits", "TOKEN_ENV", "apply_rlimits", "clamp", "confine", "readable_roots", "audit_guard",
           "landlock_abi", "set_parent_death_signal", "become_subreaper", "drop_capabilities", "kill_tree",
           "descendants", "tree_memory", "tree_cpu", "sweep", "Cgroup"]

#: Environment variable carried by every process a submission runs (value: the grading run's token).
TOKEN_ENV = "ATTN_COURSE_GRADING_TOKEN"


@dataclass
class Limits:
    """What one notebook's learner process may use. Times are wall-clock seconds."""

    cell_timeout: float = 60.0  # one cell (an exercise cell, a cell the learner added, a check cell)
    notebook_timeout: float = 300.0  # CPU seconds for everything one notebook runs (3x that on the clock)
    memory_mb: int = 2048  # memory the learner process and all it started allocate (Binder's limit)
    address_space_mb: int | None = 8192  # RLIMIT_AS of each process (one huge allocation fails at once)
    file_size_mb: int = 256  # the largest file the learner process may write
    disk_mb: int = 1024  # how much the learner's folder may grow in all
    processes: int = 64  # processes (and threads) the learner's code may run at once (where cgroups are available)
    open_files: int = 1024
    call_timeout: float | None = None  # lower every check's per-call limit (None: the checks' own)


# ------------------------------------------------------------------------------------------ rlimits
def clamp(wanted: int | None, current: tuple[int, int]) -> tuple[int, int]:
    """The (soft, hard) pair to set for a limit of ``wanted`` given the ``current`` (soft, hard) pair:
    never above the current hard limit (which would fail), never higher than what is already set."""
    import resource

    soft, hard = current
    inf = resource.RLIM_INFINITY
    target = inf if wanted is None else int(wanted)
    if hard != inf:
        target = hard if target == inf else min(target, hard)
    if soft != inf:
        target = soft if target == inf else min(target, soft)
    return target, target


def apply_rlimits(limits: Limits) -> list[str]:
    """Set the learner process's resource limits; returns what could not be set (never raises)."""
    try:
        import resource
    except ImportError:  # Windows
        return ["no resource limits on this system"]
    wanted = {
        "RLIMIT_AS": None if not limits.address_space_mb else limits.address_space_mb * 2**20,
        "RLIMIT_FSIZE": limits.file_size_mb * 2**20,
        "RLIMIT_CORE": 0,
        "RLIMIT_NOFILE": limits.open_files,
    }
    # RLIMIT_NPROC is left alone: it counts every process of the user (the grader's too) and root
    # ignores it; the process count is limited by a cgroup where there is one.
    problems = []
    for name, value in wanted.items():
        which = getattr(resource, name, None)
        if which is None:
            continue
        try:
            resource.setrlimit(which, clamp(value, resource.getrlimit(which)))
        except (ValueError, OSError) as exc:
            problems.append(f"{name}: {exc}")
    return problems


# ------------------------------------------------------------------------------------------ prctl
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 1, 36, 38


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        return libc
    except OSError:
        return None


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Linux: this process gets ``sig`` when the thread that started it ends."""
    libc = _libc()
    return bool(libc) and libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def become_subreaper() -> bool:
    """Linux: orphaned descendants are re-parented to this process instead of init, so none escapes
    :func:`descendants` by double-forking or starting a new session."""
    libc = _libc()
    return bool(libc) and libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


_PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
_SECURE_NOROOT_ALL_LOCKED = 0x2F  # NOROOT, NO_SETUID_FIXUP and KEEP_CAPS, each locked


def drop_capabilities() -> bool:
    """When running as root: give up every capability for good (bounding, ambient, effective,
    permitted, inheritable; no way back through exec). The process keeps user id 0, so it still
    reads the root-owned Python installation, but it can no longer raise its limits, bypass file
    permissions, trace or signal other users' processes, mount, or load kernel modules."""
    libc = _libc()
    if libc is None or os.geteuid() != 0:
        return False
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if libc.prctl(_PR_SET_SECUREBITS, _SECURE_NOROOT_ALL_LOCKED, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "could not set the secure bits")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable (two 32-bit words each): none
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    return True


# ------------------------------------------------------------------------------------------ Landlock
_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446  # the same on every Linux architecture
_RULE_PATH_BENEATH = 1
_FS = {  # access rights, the ABI that introduced each
    "WRITE_FILE": (1 << 1, 1), "REMOVE_DIR": (1 << 4, 1), "REMOVE_FILE": (1 << 5, 1), "MAKE_CHAR": (1 << 6, 1),
    "MAKE_DIR": (1 << 7, 1), "MAKE_REG": (1 << 8, 1), "MAKE_SOCK": (1 << 9, 1), "MAKE_FIFO": (1 << 10, 1),
    "MAKE_BLOCK": (1 << 11, 1), "MAKE_SYM": (1 << 12, 1), "REFER": (1 << 13, 2), "TRUNCATE": (1 << 14, 3),
}
_READ = {"EXECUTE": 1 << 0, "READ_FILE": 1 << 2, "READ_DIR": 1 << 3}  # ABI 1: handled when reads are confined
_FILE_RIGHTS = ("WRITE_FILE", "TRUNCATE")  # the rights that apply to a single file
_NET_TCP = 0b11  # bind and connect (ABI 4)
_SCOPES = 0b11  # abstract unix sockets and signals (ABI 6)
#: Readable by every learner process: the system's programs, libraries and settings, and what the kernel shows
#: of processes and devices. Python's folders and the libraries' are added by :func:`readable_roots`.
SYSTEM_READABLE = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/proc", "/sys", "/dev")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers (0: none)."""
    libc = _libc()
    if libc is None:
        return 0
    abi = libc.syscall(_SYS_CREATE, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    return max(0, int(abi))


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or below it (both real, absolute paths)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _python_folders() -> list[str]:
    """Python's own folders, its import path, and the folders of every file mapped into this process (the
    shared libraries PyTorch and NumPy loaded, wherever they were installed)."""
    import sysconfig

    folders = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
               os.path.dirname(os.path.realpath(sys.executable)), *sysconfig.get_paths().values(),
               *(p for p in sys.path if p)]
    with contextlib.suppress(OSError):
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path (when a file)
                path = fields[5].strip() if len(fields) == 6 else ""
                if path.startswith("/") and not path.endswith("(deleted)"):
                    folders.append(os.path.dirname(path))
    return folders


def readable_roots(extra: list[Path] = (), *, protect: list[Path] = ()) -> list[str]:
    """The folders a confined learner process may read: :data:`SYSTEM_READABLE`, Python's folders and the
    loaded libraries' (:func:`_python_folders`) and ``extra``, less everything inside ``protect`` (the class
    folder, the course's own folder with its solutions, the grader's folders, the grader's home): a
    readable folder that holds a protected one is replaced by its other entries, level by level, so
    nothing on the way to a protected folder is readable beyond what the system needs.
    A folder inside a protected one that is named here (a virtual environment inside the course's
    folder, the course's private copy inside the grader's folder) stays readable."""
    protected = sorted({os.path.realpath(p) for p in protect})
    roots: set[str] = set()
    seen: set[str] = set()

    def cover(folder: str) -> None:
        if folder in seen:
            return
        seen.add(folder)
        holds = [p for p in protected if _inside(p, folder)]
        if not holds:
            roots.add(folder)
        elif folder not in holds:  # holds a protected folder: take its other entries one by one
            with contextlib.suppress(OSError):
                for entry in sorted(os.listdir(folder)):
                    cover(os.path.realpath(os.path.join(folder, entry)))

    for folder in [*SYSTEM_READABLE, *_python_folders(), *map(str, extra)]:
        real = os.path.realpath(folder)
        if os.path.exists(real):
            cover(real)
    kept = sorted(roots)
    return [r for r in kept if not any(r != o and _inside(r, o) for o in kept)]  # a folder's subfolders are in it


def confine(folder: Path, *, readable: list[str] | None = None, files: tuple[str, ...] = ("/dev/null",)) -> str:
    """Restrict this process and all it starts: writes only inside ``folder`` (and to ``files``), reads
    (and programs run) only inside ``folder`` and ``readable`` when that is given (:func:`readable_roots`),
    no signals or ptrace outside, no TCP. Returns what was applied ("landlock ABI 7: …"); raises OSError
    when Landlock is present but could not be applied, RuntimeError when it is absent."""
    abi = landlock_abi()
    if abi < 1:
        raise RuntimeError("Landlock is not available on this system")
    libc = _libc()
    fs = 0
    for bit, since in _FS.values():
        if abi >= since:
            fs |= bit
    read = sum(_READ.values()) if readable is not None else 0
    attr = _RulesetAttr(fs | read, _NET_TCP if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(_SYS_CREATE, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        file_rights = 0
        for name in _FILE_RIGHTS:
            bit, since = _FS[name]
            if abi >= since:
                file_rights |= bit
        rules = [(str(folder), fs | read), *((f, file_rights | (read & ~_READ["READ_DIR"])) for f in files),
                 *((r, read) for r in readable or ())]
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    rights &= file_rights | (read & ~_READ["READ_DIR"])  # a file takes the rights of a file only
                rule = _PathBeneath(rights, fd)
                if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
        if libc.syscall(_SYS_RESTRICT, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    what = ["writes only in its folder"]
    if readable is not None:
        what.append("reads only in it and the system's, Python's and the course's code")
    if abi >= 4:
        what.append("no TCP")
    if abi >= 6:
        what.append("no signals outside")
    return f"landlock ABI {abi}: " + ", ".join(what)


def audit_guard(folder: Path, *, protect: list[Path] = (), readable: list[str] = ()) -> str:
    """The fallback without Landlock: an audit hook refusing Python-level writes outside ``folder`` and
    reads (files opened, folders listed) inside ``protect`` (the class folder, the course's folder, the
    grader's folders) unless inside ``folder`` or ``readable`` (:func:`readable_roots`). Learner code cannot
    remove it, but subprocesses and C code do not pass through it."""
    root = os.path.realpath(folder)
    allowed = (root, os.devnull)
    secret = tuple(os.path.realpath(p) for p in protect)
    exempt = (root, *readable)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    one = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.utime", "os.truncate",
           "shutil.rmtree", "os.setxattr", "os.removexattr", "os.mkfifo", "os.mknod"}
    both = {"os.rename", "shutil.move"}  # the source is removed too
    target = {"os.link", "os.symlink", "shutil.copyfile", "shutil.copytree"}  # only the target is written
    listing = {"os.listdir", "os.scandir"}

    def real(path, relative_to_fd: bool = False) -> str | None:
        """The real path; None when unknown: a relative path climbing with '..' in a call that may take a
        ``dir_fd`` (the hook is not told which folder it is relative to)."""
        try:
            text = os.fsdecode(path)
            if relative_to_fd and not os.path.isabs(text) and ".." in Path(text).parts:
                return None
            return os.path.realpath(os.path.abspath(text))
        except Exception:  # noqa: BLE001
            return None

    def inside(path, relative_to_fd: bool = False) -> bool:
        if path is None or isinstance(path, int):
            return True
        where = real(path, relative_to_fd)
        return where is not None and any(_inside(where, a) for a in allowed)

    def hidden(path, relative_to_fd: bool = False) -> bool:
        if path is None or isinstance(path, int):
            return False
        where = real(path, relative_to_fd)
        return where is None or (any(_inside(where, s) for s in secret) and not any(_inside(where, e) for e in exempt))

    def hook(event, args):
        paths = ()
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writing = (isinstance(flags, int) and flags & write_flags) or (
                isinstance(mode, str) and any(c in mode for c in "wax+"))
            if not writing and hidden(path, True):
                raise PermissionError(f"grading: reading the class's or the course's files is not allowed: {path!r}")
            # A folder's descriptor would let later calls (dir_fd=…) name files the hook cannot place: only the
            # notebook's own folders may be opened so.
            if path is not None and not isinstance(path, int) and not inside(path, True) and \
                    os.path.isdir(real(path, True) or ""):
                raise PermissionError(f"grading: opening a folder outside the notebook's folder is not allowed: {path!r}")
            if writing and not inside(path, True):
                raise PermissionError(f"grading: writing outside the notebook's folder is not allowed: {path!r}")
        elif event == "os.link" and hidden(args[0], True):  # the new name would read the protected file
            raise PermissionError(f"grading: linking the class's or the course's files is not allowed: {args[0]!r}")
        elif event in listing and args and hidden(args[0] if args[0] is not None else "."):
            raise PermissionError(f"grading: listing the class's or the course's folders is not allowed: {args[0]!r}")
        elif event in one:
            paths = args[:1]
        elif event in both:
            paths = args[:2]
        elif event in target:
            paths = args[1:2]
        for path in paths:
            if not inside(path, True):
                raise PermissionError(f"grading: writing outside the notebook's folder is not allowed: {path!r}")

    sys.addaudithook(hook)
    return "audit hook: Python-level writes only in its folder" + (
        ", no Python-level reads of the class's or the course's files" if secret else "") + " (no Landlock)"


# ------------------------------------------------------------------------------------------ processes
def descendants(pid: int) -> list:
    """Every live descendant of ``pid`` (psutil processes), deepest last."""
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _live(procs: list) -> list:
    import psutil

    alive = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
    return alive


def tree_memory(pid: int, *, include_root: bool = False) -> int:
    """Bytes of memory private to ``pid``'s descendants (their unique set sizes, summed): what they
    allocated, not the libraries they share with the process they were forked from."""
    import psutil

    procs = descendants(pid)
    if include_root:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_full_info().uss
    return total


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used by ``pid``'s descendants, the children they reaped included."""
    import psutil

    total = 0.0
    for p in descendants(pid):
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
    return total


def kill_tree(pid: int, *, include_root: bool = True, timeout: float = 10.0) -> int:
    """SIGKILL ``pid``'s process group and every descendant, again and again until none is alive (a
    process forking while it is being killed is caught on the next round). Zombies are left to their
    parent (or the subreaper) to reap. Returns how many processes were sent a signal."""
    import psutil

    killed = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs = descendants(pid)
        if include_root:
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
            with contextlib.suppress(OSError, AttributeError):  # no process groups on Windows
                os.killpg(pid, signal.SIGKILL)
        alive = _live(procs)
        if not alive:
            break
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
                killed += 1
        time.sleep(0.01)
    return killed


def _tokens() -> list[tuple[int, str]]:
    """``(pid, token)`` of every process (Linux: read from /proc) whose environment carries a token."""
    if not os.path.isdir("/proc"):
        return []
    prefix = f"{TOKEN_ENV}=".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read(1 << 20)
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(prefix):
                found.append((int(entry), item[len(prefix):].decode("ascii", "replace")))
                break
    return found


def _kill(pid: int) -> int:
    try:
        os.kill(pid, signal.SIGKILL)
        return 1
    except OSError:
        return 0


def sweep(token: str) -> int:
    """Kill every process of this user whose environment carries ``TOKEN_ENV=token``, or the token of one
    of its runs (``token-N``) (Linux: read from /proc). Returns how many were killed. Only the given
    token: what other graders run on the machine, alive or not, is never touched."""
    if not token:
        return 0
    return sum(_kill(pid) for pid, found in _tokens() if found == token or found.startswith(token + "-"))


# ------------------------------------------------------------------------------------------ cgroups
class Cgroup:
    """A cgroup for one learner process, where this machine allows one (else :meth:`create` gives None).

    cgroup v2: a child of the grader's own cgroup (needs a delegated subtree: root, or
    ``systemd-run --user --scope -p Delegate=yes``); v1: children in the memory and pids hierarchies."""

    PREFIX = "attn-grade-"

    def __init__(self, dirs: list[Path], version: int):
        self.dirs, self.version = dirs, version

    @staticmethod
    def _bases() -> tuple[int, list[Path]]:
        """(cgroup version, the folders under which this process may create its groups)."""
        if not sys.platform.startswith("linux") or not os.path.isdir("/sys/fs/cgroup"):
            return 0, []
        try:
            own = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            return 0, []
        v2 = [line.split(":", 2)[2] for line in own if line.startswith("0::")]
        if os.path.exists("/sys/fs/cgroup/cgroup.controllers") and v2:
            return 2, [Path("/sys/fs/cgroup") / v2[0].lstrip("/")]
        bases = []
        for line in own:
            _, controllers, path = line.split(":", 2)
            for controller in ("memory", "pids"):
                if controller in controllers.split(","):
                    bases.append(Path("/sys/fs/cgroup") / controller / path.lstrip("/"))
        return 1, bases

    @classmethod
    def create(cls, name: str, limits: Limits) -> "Cgroup | None":
        version, bases = cls._bases()
        return cls._make([b / (cls.PREFIX + name) for b in bases], version, limits) if bases else None

    @classmethod
    def _make(cls, dirs: list[Path], version: int, limits: Limits) -> "Cgroup | None":
        made = []
        try:
            for d in dirs:
                d.mkdir()
                made.append(d)
            group = cls(made, version)
            group._limit(limits)
            return group
        except OSError:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    d.rmdir()
            return None

    def _write(self, name: str, value: str) -> bool:
        for d in self.dirs:
            if (d / name).exists():
                (d / name).write_text(value)
                return True
        return False

    def _limit(self, limits: Limits) -> None:
        memory = str(limits.memory_mb * 2**20)
        if self.version == 2:
            if not (self._write("memory.max", memory) and self._write("pids.max", str(limits.processes))):
                raise OSError("cgroup v2 controllers are not delegated here")
            self._write("memory.swap.max", "0")
        else:
            if not self._write("memory.limit_in_bytes", memory):
                raise OSError("no v1 memory controller")
            self._write("pids.max", str(limits.processes))

    def join_path(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid to, to enter this group."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return found

    def memory(self) -> int | None:
        """Bytes the group's processes use now, as the kernel charges them (None if unknown)."""
        for d in self.dirs:
            name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
            with contextlib.suppress(OSError, ValueError):
                if (d / name).exists():
                    return int((d / name).read_text())
        return None

    def out_of_memory(self) -> bool:
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                name = "memory.events" if self.version == 2 else "memory.oom_control"
                if (d / name).exists():
                    events = dict(line.split()[:2] for line in (d / name).read_text().splitlines() if line.strip())
                    return int(events.get("oom_kill", 0)) > 0
        return False

    def kill(self) -> None:
        """Kill every process in the group (v2: ``cgroup.kill``), then remove the group."""
        for _ in range(50):
            if self.version == 2:
                with contextlib.suppress(OSError):
                    self._write("cgroup.kill", "1")
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)

    @classmethod
    def clean_stale(cls) -> None:
        """Remove the groups of graders that were killed (the grader's pid leads the group's name)."""
        for base in cls._bases()[1]:
            with contextlib.suppress(OSError):
                for d in base.glob(cls.PREFIX + "*"):
                    try:
                        os.kill(int(d.name[len(cls.PREFIX):].split("-")[0]), 0)
                        continue  # its grader is alive
                    except ProcessLookupError:
                        pass
                    except (ValueError, PermissionError):
                        continue
                    cls([d], 2 if (d / "cgroup.kill").exists() else 1).kill()
