"""Grade notebooks: run each in its own kernel and report every exercise as a row of a table.

A check cell is a code cell tagged ``check`` (or, failing tags, one that calls ``check_<name>(...)``).
Each yields one row: *passed*, *failed* with the check's message, *not attempted*, or *error* when the
cell never ran (kernel died, notebook unreadable). Where the course's own solution notebook is
found, the check cells are taken from it, so an edited or deleted check cell cannot change a grade.
The learner's file is only read; it runs from a temporary copy.

A whole class (``grade --class SUBMISSIONS``: one folder or one notebook per learner) is graded by
:func:`grade_class`. Every notebook runs in its own worker process and kernel, from a private copy,
under limits: a wall-clock limit per notebook, a memory limit on the kernel's resident memory
(watched, and the kernel killed when it passes it) and, on Linux, an address-space limit
(``RLIMIT_AS``) so that one huge allocation fails at once. Inside the kernel an audit hook refuses
Python-level writes outside the notebook's own working folder. Whatever a submission does (loops
forever, raises at import, deletes cells, is not JSON, tries to write elsewhere, eats memory), it
becomes rows saying so and the rest of the class is graded. The learners' files are checksummed
before and after; grading never writes to them.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

from .runner import execute, run_client

CHECK_CALL = re.compile(r"\bcheck_(\w+)\s*\(")
PASSED, FAILED, NOT_ATTEMPTED, ERROR = "passed", "failed", "not attempted", "error"


@dataclass
class Row:
    notebook: str
    exercise: str
    status: str
    message: str = ""


def check_cells(nb: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """``(cell index, exercise name)`` for every check cell of ``nb``.

    Cells tagged ``check`` when the notebook uses tags; otherwise every code cell calling ``check_*``.
    """
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    tagged = [(i, c) for i, c in code if "check" in c.metadata.get("tags", [])]
    found = []
    for index, cell in tagged or code:
        match = CHECK_CALL.search(cell.source)
        if match:
            found.append((index, match.group(1)))
    return found


def _first_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def outcome(cell: nbformat.NotebookNode, exercise: str) -> tuple[str, str]:
    """Read a status and a message off an executed check cell's outputs."""
    if cell.get("execution_count") is None and not cell.get("outputs"):
        return ERROR, "this check never ran"
    for output in cell.get("outputs", []):
        if output.get("output_type") != "error":
            continue
        name, value = output.get("ename", ""), output.get("evalue", "")
        value = re.sub(r"^\s*" + re.escape(exercise) + r"\s*:\s*", "", value)
        if name == "KeyboardInterrupt":
            return FAILED, "timed out: the cell ran too long and was interrupted (an infinite loop?)"
        if "not attempted" in value:
            return NOT_ATTEMPTED, _first_line(value)
        if name in ("AssertionError", "CheckFailed", "NotAttempted"):
            return FAILED, _first_line(value)
        if name == "NameError":
            return FAILED, _first_line(f"{name}: {value} (is the exercise cell above run, or was it deleted?)")
        return FAILED, _first_line(f"{name}: {value}")
    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    if "✓" in text:
        return PASSED, ""
    return FAILED, "the check printed no verdict (was the check cell edited?)"


def find_solution(path: Path) -> Path | None:
    """The course's solution notebook with the same name, looked up beside and above ``path``."""
    for folder in [path.parent, *path.parent.parents, Path.cwd()]:
        candidate = folder / "solutions" / path.name
        if candidate.exists() and candidate.resolve() != path.resolve():
            return candidate
    return None


def with_reference_checks(nb: nbformat.NotebookNode, solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Put the solution's check cells into ``nb`` (replacing edited ones, restoring deleted ones)."""
    reference = {name: solution.cells[i] for i, name in check_cells(solution)}
    present = {}
    for index, name in check_cells(nb):
        present[name] = index
        if name in reference:
            nb.cells[index].source = reference[name].source
    for name, cell in reference.items():
        if name not in present:
            restored = nbformat.v4.new_code_cell(cell.source)
            restored.metadata["tags"] = ["check"]
            nb.cells.append(restored)
    return nb


def grade_notebook(path: Path, *, cell_timeout: int = 60, label: str | None = None) -> list[Row]:
    """Grade one notebook; never raises for a broken notebook, it becomes a row instead."""
    label = label or str(path)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:
        return [Row(label, "-", ERROR, _first_line(f"not a readable notebook: {type(exc).__name__}: {exc}"))]
    solution_path = find_solution(path)
    if solution_path is not None:
        try:
            nb = with_reference_checks(nb, nbformat.read(solution_path, as_version=4))
        except Exception:
            pass  # an unreadable solution should not block grading with the learner's own checks
    checks = check_cells(nb)
    if not checks:
        return []  # a notebook without exercises (e.g. 00_setup) has nothing to grade
    with tempfile.TemporaryDirectory(prefix="attn-grade-") as tmp:
        run = execute(nb, cwd=Path(tmp), cell_timeout=cell_timeout)
    rows = []
    for index, name in checks:
        status, message = outcome(run.notebook.cells[index], name)
        if status == ERROR and run.problem:
            message = f"never ran: {run.problem}"
        rows.append(Row(label, name, status, message))
    return rows


def expand(paths: list[str]) -> list[Path]:
    """Notebook files named directly, plus every ``*.ipynb`` inside named folders (checkpoints skipped)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(
                q for q in sorted(p.rglob("*.ipynb"))
                if ".ipynb_checkpoints" not in q.parts and "backups" not in q.parts
            )
        else:
            found.append(p)
    return found


def format_table(rows: list[Row]) -> str:
    """The rows as an aligned plain-text table followed by totals."""
    headers = ("notebook", "exercise", "result")
    body = [
        (r.notebook, r.exercise, r.status + (f": {r.message}" if r.message and r.status != PASSED else ""))
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(headers[:2])]
    lines = [f"{headers[0]:<{widths[0]}}  {headers[1]:<{widths[1]}}  {headers[2]}"]
    lines.append("-" * len(lines[0]))
    lines += [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in body]
    counts = {s: sum(r.status == s for r in rows) for s in (PASSED, FAILED, NOT_ATTEMPTED, ERROR)}
    lines.append("")
    lines.append(
        f"Total: {counts[PASSED]} of {len(rows)} exercises passed "
        f"({counts[FAILED]} failed, {counts[NOT_ATTEMPTED]} not attempted, {counts[ERROR]} errors)"
    )
    return "\n".join(lines)


def write_rows(rows: list[Row], path: Path) -> None:
    """Write rows as JSON (``.json``) or CSV (anything else)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps([asdict(r) for r in rows], indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=["notebook", "exercise", "status", "message"])
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


def main(paths: list[str], *, cell_timeout: int, json_path: str | None, csv_path: str | None, out=sys.stdout) -> int:
    notebooks = expand(paths or ["notebooks"])
    if not notebooks:
        print(f"No notebooks found in {' '.join(paths or ['notebooks'])}.", file=out)
        return 2
    rows: list[Row] = []
    try:
        from tqdm import tqdm

        progress = tqdm(notebooks, desc="grading", unit="notebook", file=sys.stderr, disable=len(notebooks) < 2)
    except ImportError:  # pragma: no cover - tqdm is a course dependency
        progress = notebooks
    for nb_path in progress:
        rows.extend(grade_notebook(nb_path, cell_timeout=cell_timeout))
    print(format_table(rows), file=out)
    for target in filter(None, [json_path, csv_path]):
        write_rows(rows, Path(target))
        print(f"wrote {target}", file=out)
    return 0 if rows and all(r.status == PASSED for r in rows) else 1


# ============================================================================ grading a class
#
# The parent process (grade_class) never runs learner code. For each submitted notebook it starts a
# worker process (``python -m attn_course.grading --worker``), which starts the kernel. The parent
# watches the worker's process tree for time and memory and kills the tree when a limit is passed.
# The worker streams one JSON line per executed check cell through a pipe the kernel cannot reach,
# so results obtained before a kill are kept.

NOT_SUBMITTED = "not submitted"
STATUSES = (PASSED, FAILED, NOT_ATTEMPTED, ERROR, NOT_SUBMITTED)
GUARD_MARK = "attn_course grading: writing outside the submission's folder is not allowed"

# Runs in the kernel at start-up (an IPython startup file). Audit hooks cannot be removed once added.
_GUARD_SOURCE = r'''
import os as _os, sys as _sys

def _attn_course_guard(root=_os.path.realpath(_os.getcwd())):
    allowed = (root, _os.devnull, "/dev/shm")
    write_flags = _os.O_WRONLY | _os.O_RDWR | _os.O_CREAT | _os.O_TRUNC | _os.O_APPEND
    path_events = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.utime",
                   "os.truncate", "shutil.rmtree", "os.setxattr", "os.removexattr"}
    pair_events = {"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.copytree",
                   "shutil.move", "shutil.copymode", "shutil.copystat"}

    def inside(path):
        if isinstance(path, int) or path is None:
            return True  # an open file descriptor: its path was checked when it was opened
        try:
            real = _os.path.realpath(_os.path.abspath(_os.fsdecode(path)))
        except Exception:
            return False
        return any(real == a or real.startswith(a.rstrip("/") + "/") for a in allowed)

    def refuse(path):
        raise PermissionError(__GUARD_MARK__ + ": " + _os.fsdecode(path))

    def hook(event, args):
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writing = (isinstance(flags, int) and flags & write_flags) or (
                isinstance(mode, str) and any(c in mode for c in "wax+"))
            if writing and not inside(path):
                refuse(path)
        elif event in path_events:
            if args and not inside(args[0]):
                refuse(args[0])
        elif event in pair_events:
            for path in args[:2]:
                if not inside(path):
                    refuse(path)

    _sys.addaudithook(hook)

_attn_course_guard()
del _attn_course_guard
'''.replace("__GUARD_MARK__", repr(GUARD_MARK))


@dataclass
class ClassRow:
    """One exercise of one learner (or, with exercise "-", a notebook that could not be graded)."""

    learner: str
    notebook: str
    exercise: str
    status: str
    message: str = ""
    seconds: float | None = None  # the whole notebook's grading time
    peak_mb: float | None = None  # the kernel's largest resident memory seen
    note: str = ""  # what else happened in that notebook (a crash at import, a blocked write, a kill)


@dataclass
class Submission:
    learner: str
    path: Path
    solution: Path | None  # the course notebook this is, or None when it could not be told


def course_solutions() -> Path:
    """The course's solutions/ folder (beside the package in a checkout, else in the current folder)."""
    here = Path(__file__).resolve().parents[1] / "solutions"
    return here if here.is_dir() else Path.cwd() / "solutions"


def _identify(path: Path, solutions: dict[str, Path], check_names: dict[str, set[str]]) -> Path | None:
    """Which course notebook ``path`` is: by file name, by the generator's record, by its check calls."""
    if path.name in solutions:
        return solutions[path.name]
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception:
        return None
    recorded = Path(str(nb.metadata.get("attn_course", {}).get("generated_from", ""))).name
    if recorded in solutions:
        return solutions[recorded]
    mine = {name for _, name in check_cells(nb)}
    best = max(solutions, key=lambda n: len(mine & check_names[n]), default=None)
    return solutions[best] if best and mine & check_names[best] else None


def collect_class(folder: Path, solutions_dir: Path) -> list[Submission]:
    """One learner per sub-folder (all its notebooks) or per notebook file directly in ``folder``."""
    solutions = {p.name: p for p in sorted(solutions_dir.glob("*.ipynb"))}
    check_names = {}
    for name, p in solutions.items():
        try:
            check_names[name] = {n for _, n in check_cells(nbformat.read(p, as_version=4))}
        except Exception:
            check_names[name] = set()
    found = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or entry.name in ("backups", ".ipynb_checkpoints"):
            continue
        if entry.is_dir():
            for nb_path in expand([str(entry)]):
                found.append(Submission(entry.name, nb_path, _identify(nb_path, solutions, check_names)))
        elif entry.suffix == ".ipynb":
            found.append(Submission(entry.stem, entry, _identify(entry, solutions, check_names)))
    return found


def checksums(paths) -> dict[str, str]:
    import hashlib

    return {str(p): hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths if Path(p).is_file()}


def _tree(pid: int):
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _kill_tree(pid: int) -> None:
    import psutil

    procs = _tree(pid)  # collect first: the kernel runs in its own session, a group kill would miss it
    for p in reversed(procs):
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)


def _set_address_space_limit(limit_bytes: int | None):
    def apply() -> None:
        if limit_bytes:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    return apply


def _matplotlib_font_caches() -> list[Path]:
    """The grader's own matplotlib font-list caches (empty when there are none yet)."""
    global _FONT_CACHES
    if _FONT_CACHES is None:
        try:
            import matplotlib

            _FONT_CACHES = sorted(Path(matplotlib.get_cachedir()).glob("fontlist-*.json"))
        except Exception:
            _FONT_CACHES = []
    return _FONT_CACHES


_FONT_CACHES: list[Path] | None = None


def run_submission(
    sub: Submission,
    *,
    cell_timeout: int = 60,
    notebook_timeout: int = 600,
    memory_limit_mb: int = 2048,
    address_space_mb: int | None = 8192,
    threads: int | None = None,
) -> list[ClassRow]:
    """Grade one submitted notebook in a worker process under limits; always returns rows, never raises."""
    import os
    import subprocess
    import threading
    import time

    label = sub.solution.name if sub.solution else sub.path.name
    expected: list[str] = []
    if sub.solution is not None:
        try:
            expected = [n for _, n in check_cells(nbformat.read(sub.solution, as_version=4))]
        except Exception:
            expected = []

    def rows_for(results: dict, default_status: str, default_message: str, **extra) -> list[ClassRow]:
        names = expected or list(results) or ["-"]
        out = []
        for name in names:
            status, message = results.get(name, (default_status, default_message))
            out.append(ClassRow(sub.learner, label, name, status, message, **extra))
        return out

    data = b""
    try:
        data = sub.path.read_bytes()
        nbformat.reads(data.decode("utf-8"), as_version=4)
    except Exception as exc:
        if not data.strip():
            msg = "not a readable notebook: the file is empty"
        else:
            kind = "not valid JSON" if "JSON" in type(exc).__name__ else "not a readable notebook"
            msg = _first_line(f"{kind}: {type(exc).__name__}: {exc}", 200)
        return rows_for({}, ERROR, msg, note=msg)
    if sub.solution is None:
        msg = "not one of the course's notebooks (no solution with this name or these checks)"
        return [ClassRow(sub.learner, label, "-", ERROR, msg, note=msg)]

    with tempfile.TemporaryDirectory(prefix="attn-class-") as tmp:
        work = Path(tmp) / "work"  # the kernel's folder: a private copy of this one notebook
        work.mkdir()
        (work / sub.path.name).write_bytes(data)
        for sub_dir in ("tmp", ".mpl", ".ipython/profile_default/startup", ".runtime"):
            (work / sub_dir).mkdir(parents=True, exist_ok=True)
        (work / ".ipython/profile_default/startup/00-attn-course-guard.py").write_text(_GUARD_SOURCE)
        for cache in _matplotlib_font_caches():  # spare each kernel a font-cache rebuild (seconds)
            shutil.copy2(cache, work / ".mpl" / cache.name)
        job = {"notebook": str(work / sub.path.name), "solution": str(sub.solution), "cell_timeout": cell_timeout}
        env = dict(os.environ)
        env.update({"HOME": str(work), "TMPDIR": str(work / "tmp"), "MPLCONFIGDIR": str(work / ".mpl"),
                    "IPYTHONDIR": str(work / ".ipython"), "JUPYTER_RUNTIME_DIR": str(work / ".runtime"),
                    "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"})
        if threads:
            env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
        posix = os.name == "posix"
        read_fd, write_fd = os.pipe() if posix else (None, None)
        cmd = [sys.executable, "-m", "attn_course.grading", "--worker", str(write_fd if posix else -1)]
        proc = subprocess.Popen(
            cmd, cwd=work, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE if not posix else subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, pass_fds=(write_fd,) if posix else (),
            preexec_fn=_set_address_space_limit(address_space_mb * 2**20 if address_space_mb else None) if posix else None,
        )
        if posix:
            os.close(write_fd)
            stream = os.fdopen(read_fd, "r", encoding="utf-8", errors="replace")
        else:  # pragma: no cover - Windows: results on stdout, marked
            stream = proc.stdout
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()

        messages: list[dict] = []

        def read_messages() -> None:
            for line in stream:
                line = line.strip()
                if line.startswith("ATTN_GRADE "):
                    line = line[len("ATTN_GRADE "):]
                try:
                    messages.append(json.loads(line))
                except ValueError:
                    pass

        reader = threading.Thread(target=read_messages, daemon=True)
        reader.start()
        start = time.perf_counter()
        peak = 0
        stopped = ""
        import psutil

        while proc.poll() is None:
            elapsed = time.perf_counter() - start
            rss = 0
            for p in _tree(proc.pid)[1:]:  # the kernel and anything it started, not the worker itself
                try:
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            peak = max(peak, rss)
            if rss > memory_limit_mb * 2**20:
                stopped = (f"stopped: the kernel used more than {memory_limit_mb} MB of memory "
                           f"(the limit for one notebook) and was killed")
            elif elapsed > notebook_timeout:
                stopped = f"stopped: the notebook ran past {notebook_timeout} s (the limit for one notebook) and was killed"
            if stopped:
                _kill_tree(proc.pid)
                break
            time.sleep(0.1)
        proc.wait()
        reader.join(timeout=10)
        seconds = round(time.perf_counter() - start, 2)

    results = {m["exercise"]: (m["status"], m["message"]) for m in messages if "exercise" in m}
    done = next((m for m in messages if m.get("done")), None)
    notes = [] if done is None else list(done.get("notes", []))
    if stopped:
        notes.append(stopped)
        default = stopped.replace("stopped:", "never ran:", 1)
    elif done is None:
        default = f"never ran: the grading process ended early (exit code {proc.returncode})"
        notes.append(default)
    else:
        default = f"never ran: {done['problem']}" if done.get("problem") else "this check never ran"
    return rows_for(results, ERROR, default, seconds=seconds,
                    peak_mb=round(peak / 2**20, 1) if peak else None, note="; ".join(notes))


def _worker_main(channel_fd: int) -> int:
    """In the worker process: run one notebook, streaming each check cell's verdict as a JSON line."""
    import os

    from nbclient import NotebookClient

    job = json.loads(sys.stdin.read())
    out = os.fdopen(channel_fd, "w", encoding="utf-8") if channel_fd >= 0 else sys.stdout
    prefix = "" if channel_fd >= 0 else "ATTN_GRADE "

    def send(message: dict) -> None:
        out.write(prefix + json.dumps(message, ensure_ascii=False) + "\n")
        out.flush()

    notes: list[str] = []
    nb = nbformat.read(job["notebook"], as_version=4)
    deleted = [name for _, name in check_cells(nbformat.read(job["solution"], as_version=4))
               if name not in {n for _, n in check_cells(nb)}]
    if deleted:
        notes.append(f"check cell(s) missing from the submission, restored: {', '.join(deleted)}")
    nb = with_reference_checks(nb, nbformat.read(job["solution"], as_version=4))
    checks = dict(check_cells(nb))

    def on_cell_executed(cell, cell_index, execute_reply):
        if cell_index in checks:
            status, message = outcome(cell, checks[cell_index])
            send({"exercise": checks[cell_index], "status": status, "message": message})
            return
        for output in cell.get("outputs", []):
            if output.get("output_type") != "error":
                continue
            value = output.get("evalue", "")
            if GUARD_MARK in value:
                notes.append(f"cell {cell_index} tried to write outside its folder ({_first_line(value, 160)}); refused")
            elif not any(n.startswith("first error") for n in notes):
                notes.append(f"first error outside a check: cell {cell_index} raised "
                             f"{_first_line(output.get('ename', '') + ': ' + value, 160)}")

    client = NotebookClient(
        nb, timeout=job["cell_timeout"], interrupt_on_timeout=True, allow_errors=True, kernel_name="python3",
        resources={"metadata": {"path": str(Path(job["notebook"]).parent)}}, record_timing=False,
        on_cell_executed=on_cell_executed,
    )
    env = dict(os.environ)
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    problem = run_client(client, env, job["cell_timeout"])
    if problem:
        notes.append(problem)
    send({"done": True, "problem": problem, "notes": notes})
    return 0


def grade_class(
    folder: Path,
    *,
    solutions_dir: Path | None = None,
    cell_timeout: int = 60,
    notebook_timeout: int = 600,
    memory_limit_mb: int = 2048,
    address_space_mb: int | None = 8192,
    jobs: int = 1,
    progress: bool = True,
) -> tuple[list[ClassRow], list[str]]:
    """Grade every learner's submission in ``folder``; returns the rows and any integrity warnings."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    solutions_dir = solutions_dir or course_solutions()
    subs = collect_class(folder, solutions_dir)
    learner_files = [p for p in folder.rglob("*") if p.is_file()]
    before = checksums(learner_files)
    threads = max(1, (os.cpu_count() or 1) // max(1, jobs)) if jobs > 1 else None

    def one(sub: Submission) -> list[ClassRow]:
        try:
            return run_submission(sub, cell_timeout=cell_timeout, notebook_timeout=notebook_timeout,
                                  memory_limit_mb=memory_limit_mb, address_space_mb=address_space_mb,
                                  threads=threads)
        except Exception as exc:  # a bug in grading itself must not stop the class either
            return [ClassRow(sub.learner, sub.path.name, "-", ERROR, _first_line(f"grading failed: {exc!r}"))]

    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=len(subs), desc="grading", unit="notebook", file=sys.stderr)
        except ImportError:  # pragma: no cover
            bar = None
    rows: list[ClassRow] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for result in pool.map(one, subs):
            rows.extend(result)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()

    # Every learner gets a row for every exercise of every notebook anyone in the class submitted.
    graded = {(r.learner, r.notebook) for r in rows}
    learners = sorted({s.learner for s in subs})
    notebooks = {}
    for r in rows:
        if r.exercise != "-":
            notebooks.setdefault(r.notebook, [])
            if r.exercise not in notebooks[r.notebook]:
                notebooks[r.notebook].append(r.exercise)
    for learner in learners:
        for nb_name, exercises in sorted(notebooks.items()):
            if (learner, nb_name) not in graded:
                rows.extend(ClassRow(learner, nb_name, ex, NOT_SUBMITTED) for ex in exercises)
    order = {name: i for i, name in enumerate(sorted(notebooks))}
    rows.sort(key=lambda r: (r.learner, order.get(r.notebook, len(order)), r.notebook))

    after = checksums(learner_files)
    warnings = [f"{p} changed while the class was graded" for p in before if after.get(p) != before[p]]
    warnings += [f"{p} appeared in the class folder while it was graded"
                 for p in checksums(q for q in folder.rglob("*") if q.is_file()) if p not in before]
    return rows, warnings


def _diagnosis_key(message: str) -> str:
    """Messages that differ only in numbers count as the same diagnosis."""
    return re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "#", message.split(" — ")[-1] if " — " in message else message)[:160]


def class_summary(rows: list[ClassRow], warnings: list[str], *, top: int = 5) -> str:
    """A readable Markdown report: per learner, per exercise, and the exercises most often failed."""
    from collections import Counter

    learners = sorted({r.learner for r in rows})
    exercises = list(dict.fromkeys((r.notebook, r.exercise) for r in rows if r.exercise != "-"))
    lines = ["# Class grades", "",
             f"{len(learners)} learners, {len(exercises)} exercises, "
             f"{sum(r.status == PASSED for r in rows)} of {len(rows)} rows passed.", ""]
    lines += ["## Per learner", "",
              "| learner | passed | failed | not attempted | error | not submitted | what happened |",
              "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for learner in learners:
        mine = [r for r in rows if r.learner == learner]
        c = Counter(r.status for r in mine)
        notes = sorted({f"{r.notebook}: {r.note}" for r in mine if r.note})
        happened = "; ".join(notes).replace("|", "\\|")
        lines.append(f"| {learner} | {c[PASSED]} of {len(mine)} | {c[FAILED]} | {c[NOT_ATTEMPTED]} | "
                     f"{c[ERROR]} | {c[NOT_SUBMITTED]} | {_first_line(happened, 400)} |")
    lines += ["", "## Per exercise", "",
              "| notebook | exercise | passed | failed | not attempted | error | not submitted |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    failing = []
    for nb_name, ex in exercises:
        these = [r for r in rows if r.notebook == nb_name and r.exercise == ex]
        c = Counter(r.status for r in these)
        lines.append(f"| {nb_name} | {ex} | {c[PASSED]} | {c[FAILED]} | {c[NOT_ATTEMPTED]} | {c[ERROR]} | "
                     f"{c[NOT_SUBMITTED]} |")
        wrong = [r for r in these if r.status in (FAILED, ERROR)]
        if wrong:
            keys = Counter(_diagnosis_key(r.message) for r in wrong)
            key, count = keys.most_common(1)[0]
            example = next(r.message for r in wrong if _diagnosis_key(r.message) == key)
            failing.append((len(wrong), nb_name, ex, count, example))
    lines += ["", "## Most often failed", ""]
    if not failing:
        lines.append("No exercise failed.")
    else:
        lines += ["| exercise | failed or error | most common diagnosis (how many) |", "| --- | ---: | --- |"]
        for n, nb_name, ex, count, example in sorted(failing, key=lambda t: (-t[0], t[1], t[2]))[:top]:
            lines.append(f"| {ex} ({nb_name}) | {n} | {_first_line(example, 240).replace('|', '/')} ({count}) |")
    if warnings:
        lines += ["", "## Integrity warnings", ""] + [f"- {w}" for w in warnings]
    return "\n".join(lines) + "\n"


def write_class(rows: list[ClassRow], warnings: list[str], out_dir: Path) -> dict[str, Path]:
    """Write grades.csv (one row per learner and exercise), table.csv (learners × exercises), summary.md."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"grades": out_dir / "grades.csv", "table": out_dir / "table.csv", "summary": out_dir / "summary.md"}
    fields = ["learner", "notebook", "exercise", "status", "message", "seconds", "peak_mb", "note"]
    with paths["grades"].open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    exercises = list(dict.fromkeys(f"{r.notebook}:{r.exercise}" for r in rows if r.exercise != "-"))
    with paths["table"].open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["learner", "passed", "of", *exercises])
        for learner in sorted({r.learner for r in rows}):
            mine = {f"{r.notebook}:{r.exercise}": r.status for r in rows if r.learner == learner}
            writer.writerow([learner, sum(s == PASSED for s in mine.values()), len(exercises),
                             *(mine.get(e, ERROR) for e in exercises)])
    paths["summary"].write_text(class_summary(rows, warnings), encoding="utf-8")
    return paths


def main_class(folder: str, *, out_dir: str | None, solutions: str | None, cell_timeout: int,
               notebook_timeout: int, memory_limit_mb: int, address_space_mb: int | None, jobs: int,
               out=sys.stdout) -> int:
    import time

    root = Path(folder)
    if not root.is_dir():
        print(f"{folder} is not a folder of submissions.", file=out)
        return 2
    target = Path(out_dir) if out_dir else Path(f"grades-{root.resolve().name}")
    if target.resolve() == root.resolve() or root.resolve() in target.resolve().parents:
        print("Write the grades outside the submissions folder (--out).", file=out)
        return 2
    start = time.perf_counter()
    rows, warnings = grade_class(root, solutions_dir=Path(solutions) if solutions else None,
                                 cell_timeout=cell_timeout, notebook_timeout=notebook_timeout,
                                 memory_limit_mb=memory_limit_mb, address_space_mb=address_space_mb, jobs=jobs)
    if not rows:
        print(f"No submissions found in {folder}.", file=out)
        return 2
    paths = write_class(rows, warnings, target)
    print(paths["summary"].read_text(encoding="utf-8"), file=out)
    print(f"graded in {time.perf_counter() - start:.0f} s; wrote " + ", ".join(str(p) for p in paths.values()),
          file=out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(_worker_main(int(sys.argv[2])))
    print("usage: python -m attn_course grade ...  (this module's own entry point is for its worker)")
    sys.exit(2)
