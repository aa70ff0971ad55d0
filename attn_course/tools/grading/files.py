"""Reading what learners hand in, safely: no FIFO, device or link is opened, nothing too large is read.

* :func:`read_file` opens a path without following a final symbolic link and without blocking (a
  FIFO named ``*.ipynb`` cannot hang the grader), refuses anything that is not a regular file
  (``/dev/zero`` behind a name), and checks the size *before* reading;
* :func:`scan_class` walks a class folder without following links (so nothing outside it is read)
  and sorts every entry into a notebook to consider or a named warning: every entry is accounted
  for. Only the path *below* the class folder counts (a class folder under ``/home/x/backups/`` is
  fine);
* :func:`snapshot` / :func:`changes` describe a folder's files (type, size, modification time), so
  that a file created or changed while a submission ran is noticed and attributed.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MAX_NOTEBOOK_BYTES", "Unreadable", "read_file", "open_folder", "Found", "Scan", "scan_class", "scan_paths",
           "snapshot", "changes", "ARCHIVES"]

MAX_NOTEBOOK_BYTES = 64 * 2**20
MAX_ENTRIES = 5000  # per learner folder: a folder with more is not searched further
MAX_DEPTH = 12
ARCHIVES = (".zip", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".7z", ".rar")
#: Folders never searched for notebooks (environments, caches, version control).
SKIPPED_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", "site-packages", "node_modules",
                ".cache", ".local", ".ipython", ".jupyter", ".config", ".mozilla", ".npm", ".conda"}
CHECKPOINTS = ".ipynb_checkpoints"


def text(value: str) -> str:
    """``value`` as text that can be written as UTF-8: a file name's undecodable bytes (which Python keeps as
    lone surrogates) and any lone surrogate (from ``"\\ud800"`` in JSON a learner's process wrote) become
    backslash escapes, so that one odd name or message cannot stop the journal or a report being written."""
    value = str(value)
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape" if _only_escapes(value) else "backslashreplace") \
            .decode("utf-8", "backslashreplace")


def _only_escapes(value: str) -> bool:
    """Whether every surrogate in ``value`` is one of those os.fsdecode makes of an undecodable byte."""
    return all(not 0xD800 <= ord(c) <= 0xDFFF or 0xDC80 <= ord(c) <= 0xDCFF for c in value)


def plain(value):
    """JSON-like data with every string (keys too) made writable by :func:`text`."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, dict):
        return {text(k) if isinstance(k, str) else k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


class Unreadable(Exception):
    """A file the grader will not (or cannot) read; the message names why."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def _is_link(path, dir_fd: int | None) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path, dir_fd=dir_fd).st_mode)
    except (OSError, NotImplementedError):
        return False


def read_file(path: Path, *, limit: int = MAX_NOTEBOOK_BYTES, dir_fd: int | None = None) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; raises Unreadable otherwise. ``dir_fd``: a
    folder's descriptor (:func:`open_folder`) that a relative ``path`` names a file directly inside."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    flags |= getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd) if dir_fd is not None else os.open(path, flags)
    except OSError as exc:
        if _is_link(path, dir_fd):
            raise Unreadable("a symbolic link (not followed)") from None
        raise Unreadable(f"cannot be opened ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(f"{_kind(info.st_mode)}, not a file")
        if info.st_size > limit:
            raise Unreadable(f"too large ({info.st_size / 2**20:.0f} MiB; the limit is {limit / 2**20:.0f} MiB)")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise Unreadable(f"grew past the limit of {limit / 2**20:.0f} MiB while being read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_folder(path: Path) -> int:
    """A descriptor of the folder ``path`` itself, never of what a symbolic link there points to (a
    learner who replaced a folder the grader made by a link to someone else's would have the grader read
    that); raises Unreadable otherwise. Files inside are then read with ``read_file(name, dir_fd=…)``."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if os.path.islink(path):
            raise Unreadable("a symbolic link (not followed)") from None
        raise Unreadable(f"cannot be opened ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise Unreadable("not a folder")
    return fd


@dataclass
class Found:
    """A notebook to consider for a learner. ``where`` says what kind of copy it is."""

    learner: str
    path: Path
    rel: str  # path relative to the class folder (what messages show)
    where: str = "notebook"  # notebook | backup | checkpoint | solutions

    @property
    def priority(self) -> int:
        return {"notebook": 0, "backup": 1, "checkpoint": 2, "solutions": 3}[self.where]


@dataclass
class Scan:
    learners: dict[str, list[Found]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _where(parts: tuple[str, ...]) -> str:
    if CHECKPOINTS in parts:
        return "checkpoint"
    if "backups" in parts:
        return "backup"
    if "solutions" in parts:
        return "solutions"
    return "notebook"


def _walk(folder: Path, learner: str, root: Path, scan: Scan) -> list[Found]:
    """Every notebook below ``folder`` (links not followed); everything else named in warnings."""
    found: list[Found] = []
    others: list[str] = []
    seen = 0
    stack = [(folder, 0)]
    while stack:
        current, depth = stack.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError as exc:
            scan.warnings.append(f"{_rel(current, root)}: cannot be listed ({exc.strerror or exc}); skipped")
            continue
        for entry in entries:
            seen += 1
            if seen > MAX_ENTRIES:
                scan.warnings.append(f"{learner}: more than {MAX_ENTRIES} files; the rest was not searched")
                return found
            path = Path(entry.path)
            rel = _rel(path, root)
            try:
                if entry.is_symlink():
                    scan.warnings.append(f"{rel}: a symbolic link; not followed, not graded")
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if entry.name in SKIPPED_DIRS or (entry.name.startswith(".") and entry.name != CHECKPOINTS):
                        others.append(text(entry.name) + "/")
                    elif depth >= MAX_DEPTH:
                        scan.warnings.append(f"{rel}: nested too deeply; not searched")
                    else:
                        stack.append((path, depth + 1))
                    continue
                if not entry.is_file(follow_symlinks=False):
                    mode = entry.stat(follow_symlinks=False).st_mode
                    scan.warnings.append(f"{rel}: {_kind(mode)}; not read")
                    continue
            except OSError as exc:
                scan.warnings.append(f"{rel}: cannot be examined ({exc.strerror or exc})")
                continue
            lower = entry.name.lower()
            if lower.endswith(".ipynb"):
                parts = Path(os.path.relpath(path, folder)).parts[:-1]
                found.append(Found(learner, path, rel, _where(parts)))
            elif lower.endswith(ARCHIVES):
                scan.warnings.append(f"{rel}: an archive; unpack it into the learner's folder to have it graded")
            else:
                others.append(text(entry.name))
    if others:
        shown = ", ".join(sorted(others)[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
        scan.warnings.append(f"{learner}: ignored what is not a notebook: {shown}")
    return found


def _rel(path: Path, root: Path) -> str:
    try:
        return text(Path(path).relative_to(root))
    except ValueError:
        return text(path)


def scan_class(folder: Path) -> Scan:
    """One learner per sub-folder (its notebooks, at any depth) or per notebook directly in ``folder``."""
    root = Path(folder)
    scan = Scan()
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        scan.warnings.append(f"{root}: cannot be listed ({exc.strerror or exc})")
        return scan
    owners: dict[str, str] = {}  # learner's name -> the entry name (without .ipynb) it was made from
    for entry in entries:
        path, name = Path(entry.path), text(entry.name)  # the learner's name, and how warnings show the entry
        try:
            if entry.is_symlink():
                scan.warnings.append(f"{name}: a symbolic link; not followed, not graded")
            elif entry.is_dir(follow_symlinks=False):
                if name == CHECKPOINTS:
                    scan.warnings.append(f"{name}/: Jupyter's checkpoint copies of the notebooks beside it; "
                                         "not graded (each learner's own notebook is)")
                    continue
                name = _learner_name(name, entry.name, owners, scan)
                notebooks = _walk(path, name, root, scan)
                scan.learners[name] = notebooks
                if not notebooks:
                    scan.warnings.append(f"{name}: no notebook in this folder; every exercise is 'not submitted'")
            elif entry.is_file(follow_symlinks=False) and name.lower().endswith(".ipynb"):
                learner = _learner_name(name[: -len(".ipynb")], entry.name[: -len(".ipynb")], owners, scan)
                scan.learners.setdefault(learner, []).append(Found(learner, path, name))
            elif entry.is_file(follow_symlinks=False) and name.lower().endswith(ARCHIVES):
                scan.warnings.append(f"{name}: an archive; unpack it into a folder per learner to have it graded")
            elif entry.is_file(follow_symlinks=False):
                scan.warnings.append(f"{name}: not a notebook or a learner's folder; ignored")
            else:
                scan.warnings.append(f"{name}: {_kind(entry.stat(follow_symlinks=False).st_mode)}; not read")
        except OSError as exc:
            scan.warnings.append(f"{name}: cannot be examined ({exc.strerror or exc})")
    return scan


def _learner_name(name: str, raw: str, owners: dict[str, str], scan: Scan) -> str:
    """``name``, unless another entry of the class folder already gave a learner that name (two names that
    differ only in bytes that are not UTF-8, shown escaped: ``ada\\xff`` and ``ada<0xff>``): then a name of
    its own, and a warning. A folder ``ada/`` and a notebook ``ada.ipynb`` beside it stay one learner."""
    if owners.setdefault(name, raw) == raw:
        return name
    k = 2
    while f"{name} ({k})" in owners:
        k += 1
    unique = f"{name} ({k})"
    owners[unique] = raw
    scan.warnings.append(f"{unique}: another entry of the class folder is shown with the same name, {name}; "
                         f"graded as {unique}")
    return unique


def scan_paths(paths: list[Path], learner: str = "you") -> Scan:
    """One learner's notebooks: files named directly, and notebooks below named folders."""
    scan = Scan()
    found: list[Found] = []
    for p in paths:
        p = Path(p)
        if p.is_dir() and not p.is_symlink():
            found += _walk(p, learner, p, scan)
        elif p.name.lower().endswith(".ipynb"):
            found.append(Found(learner, p, str(p)))
        else:
            scan.warnings.append(f"{p}: not a notebook or a folder; ignored")
    scan.learners[learner] = found
    return scan


def snapshot(folder: Path, *, limit: int = 200_000) -> dict[str, tuple]:
    """``relative path -> (type, size, mtime_ns, inode)`` of everything below ``folder`` (links not followed)."""
    out: dict[str, tuple] = {}
    stack = [Path(folder)]
    while stack and len(out) < limit:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            rel = text(os.path.relpath(entry.path, folder))
            out[rel] = (stat.S_IFMT(info.st_mode), info.st_size, info.st_mtime_ns, info.st_ino)
            if stat.S_ISDIR(info.st_mode):
                stack.append(Path(entry.path))
    return out


def changes(before: dict[str, tuple], after: dict[str, tuple]) -> list[tuple[str, str]]:
    """``(relative path, "created" | "changed" | "deleted")`` between two snapshots (folders' own
    times ignored: they change whenever anything inside does)."""
    found = []
    for rel, info in after.items():
        if rel not in before:
            found.append((rel, "created"))
        elif info != before[rel] and not stat.S_ISDIR(info[0]):
            found.append((rel, "changed"))
    found += [(rel, "deleted") for rel in before if rel not in after]
    return sorted(found)
