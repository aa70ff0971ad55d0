"""The verdicts: every check replayed in the grader's own process, from nothing but the learner's outputs.

For each exercise of the course notebook, the course's :class:`~attn_course.checks.core.Check` (imported
before any learner code ran) is evaluated on a :class:`~attn_course.checks.boundary.ReplaySession`
over the log the check wrote in the learner's process: every call of the learner's code is answered
from that log as decoded plain data, and comparison and diagnosis run here, in code no submission
touched. Whatever the learner's process printed, displayed, patched or forged, the status comes from
this replay — or, when there is no log, from why there is none, found without trusting the learner's
process to pass anything: a syntax error (the grader compiles the cell), no exercise cell, a cell
that raised or ran too long, a limit the grader enforced, a check that was stopped or replaced.

The learner process's own report (``progress.jsonl``) is used only to *explain* a missing log; it can
make a verdict worse, never better. Flags (copied solutions, the course's own functions returned as
answers, tampering) go beside the status for the instructor to judge.
"""

from __future__ import annotations

from ...checks.boundary import ReplayMismatch, ReplaySession
from .collect import Submission
from .model import ERROR, FAILED, NOT_ATTEMPTED, PASSED, Row
from .plan import PlanCell, exercise_cells
from .watch import Run
from . import static

__all__ = ["judge", "unreadable_rows"]

_SHORT = 120


def _short(text: str, limit: int = _SHORT) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _raised(entry: dict) -> str:
    error = entry.get("error") or {}
    name = _short(error.get("type", "an exception"), 40)
    line = error.get("line")
    where = f" in line {line}" if isinstance(line, int) else ""
    message = _short(error.get("message", ""), 80)
    return f"{name}{where}" + (f": {message}" if message else "")


class _Replay(ReplaySession):
    """A replay that remembers whether the check asked for something the log does not hold."""

    incomplete = False

    def run(self, *args, **kwargs):
        try:
            return super().run(*args, **kwargs)
        except ReplayMismatch:
            self.incomplete = True
            raise


def _log_flags(session: ReplaySession, name: str) -> list[str]:
    """Evidence in the log itself: the exercise is a function of the course's package."""
    info = next(session.recorded("inspect"), None)
    where = str(info.get("defined_in", "")) if isinstance(info, dict) else ""
    if where.split(".")[0] == "attn_course":
        return [f"`{name}` is the course's own {where} code, not the learner's"]
    return []


def unreadable_rows(sub: Submission) -> list[Row]:
    """Rows for a course notebook whose file could not be read or run."""
    assert sub.notebook is not None
    return [Row(sub.learner, sub.notebook.slug, ident, ERROR, _short(sub.problem), list(sub.flags), source=sub.rel)
            for ident in sub.notebook.exercises]


def _reference_module(slug: str) -> str | None:
    """The notebook's module of reference implementations (the registry's), None for a notebook it does not list."""
    try:
        from ...registry import by_slug

        return by_slug(slug).reference
    except Exception:  # noqa: BLE001 - a course notebook the registry does not list (yet)
        return None


def judge(sub: Submission, cells: list[PlanCell], run: Run) -> list[Row]:
    """One row per exercise of ``sub``'s course notebook (see the module docstring)."""
    course_nb = sub.notebook
    assert course_nb is not None and sub.nb is not None
    mine = exercise_cells(sub.nb, course_nb)
    position = {(c.kind, c.exercise): k for k, c in enumerate(cells) if c.exercise}
    notebook_flags = list(sub.flags)
    imported: dict[str, str] = {}  # names the learner's added cells import from the course's code
    for cell in cells:
        if cell.kind == "added":
            names = static.course_names(cell.source, allowed_imports=course_nb.allowed_imports)
            imported.update(names)
            # A demonstration may import the course's code (an older copy of one counts as added): only an
            # exercise using it is flagged (below), and importing the checks themselves.
            harmless = frozenset(n for n in names.values() if not n.startswith("attn_course.checks"))
            for flag in static.suspicious(cell.source, allowed_imports=course_nb.allowed_imports | harmless):
                flag = f"a cell the learner added {flag}"
                if flag not in notebook_flags:
                    notebook_flags.append(flag)
    notes = _notes(cells, run)
    setup = {name: full for src in course_nb.setup for name, full in static.course_names(src).items()}
    reference = _reference_module(course_nb.slug)
    rows = []
    for ident, ex in course_nb.exercises.items():
        source = sub.nb.cells[mine[ident]].source if ident in mine else None
        flags = list(notebook_flags)
        if source is not None:
            found = static.suspicious(source, allowed_imports=course_nb.allowed_imports)
            flags += [f"its exercise cell {f}" for f in found]
            for name in sorted(static.used_names(source) & set(imported)):
                flags.append(f"its exercise cell uses `{name}`, the course's code ({imported[name]})")
            if reference:
                flags += [f"its exercise cell {f}" for f in static.reference_uses(source, setup, exercise=ident,
                                                                                 reference=reference)]
        ex_entry = run.cell(position.get(("exercise", ident), -1))
        check_entry = run.cell(position.get(("check", ident), -1))
        status, message = _verdict(ex, source, ex_entry, check_entry, run, flags)
        rows.append(Row(sub.learner, course_nb.slug, ident, status, message, flags, notes, sub.rel, run.seconds,
                        run.cpu, run.peak_mb))
    return rows


def _verdict(ex, source: str | None, ex_entry: dict, check_entry: dict, run: Run, flags: list[str]) -> tuple[str, str]:
    if ex.check is None:
        return ERROR, _short(f"not graded: {ex.problem}")
    log = run.logs.get(ex.id)
    if log is not None:
        try:
            session = _Replay(log)
        except ReplayMismatch as exc:
            flags.append("the check's log was damaged or forged")
            return FAILED, _short(f"the check's record cannot be used ({exc})")
        result = ex.check.evaluate(session=session)
        flags += [f for f in _log_flags(session, ex.name) if f not in flags]
        busy = result.details.get("busy") if result.status.value == ERROR else None
        if busy and run.queued is not None and run.queued + 0.1 < 0.5 * busy["waited"] - busy["computed"]:
            # "Too busy" means the code was ready to run and kept waiting for a processor (boundary/outcomes.py),
            # at least this long, in this process, by the grader's own count. Less: the times were made up.
            flags.append(f"its check said the computer was too busy, yet the grader measured {run.queued:.1f} s of "
                         "waiting for a processor in the whole run: the times were reported falsely")
            return FAILED, "the check ran too long and was stopped (is your code very slow, or endless?)"
        if session.incomplete:  # the check was cut short in the learner's process: say by what
            if check_entry.get("timeout"):
                return FAILED, "the check ran too long and was stopped (is your code very slow, or endless?)"
            if check_entry.get("error"):
                return FAILED, _short(f"your code stopped the check: it raised {_raised(check_entry)}")
            if run.stopped:
                return FAILED, _short(f"never finished: your notebook {run.stopped}")
            # The check ran to its end in the learner's process, yet asked other questions there than the
            # same check asks here (the checks are deterministic): its inputs or calls were changed in that
            # process (PyTorch patched, the check edited), or the check has a bug. Not a pass either way.
            flags.append("the check's record does not match the course's check replayed in the grader "
                         "(its inputs or calls were different in the learner's process)")
            if result.status.value == PASSED:  # a check that swallowed the mismatch never passes on it
                return ERROR, "not graded: the check's record is incomplete"
        return result.status.value, _short(result.summary)
    return _without_log(ex, source, ex_entry, check_entry, run, flags)


def _without_log(ex, source, ex_entry, check_entry, run: Run, flags: list[str]) -> tuple[str, str]:
    name = ex.name
    if source is not None:
        syntax = static.syntax_error(source)
        if syntax is not None:
            return FAILED, _short(syntax.text())
    if not check_entry:  # the check cell never reported: the process stopped before it
        if run.stopped.startswith("the grading process"):
            return ERROR, _short(f"not graded: {run.stopped}")
        if run.stopped:
            return FAILED, _short(f"never checked: your notebook {run.stopped}")
        if ex_entry.get("timeout"):
            return FAILED, _short(f"your exercise cell ran too long and was stopped; `{name}` was never checked")
        return FAILED, _short(f"never checked: your code ended the grading process ({_ending(run)})")
    if source is None:
        if check_entry.get("defined") is False:
            return NOT_ATTEMPTED, f"no exercise cell for `{name}` (deleted?)"
    elif ex_entry.get("timeout"):
        return FAILED, _short(f"your exercise cell ran past its time and was stopped, so `{name}` was never defined")
    elif ex_entry.get("error") and check_entry.get("defined") is False:
        return FAILED, _short(f"your exercise cell raised {_raised(ex_entry)}, so `{name}` was never defined")
    elif ex_entry.get("error"):  # the check grades nothing but a clean run of its exercise cell (checks.cells)
        return FAILED, _short(f"fix your exercise cell and run it again: it raised {_raised(ex_entry)}")
    elif not static.defines(source, name) and check_entry.get("defined") is False:
        return FAILED, _short(f"your exercise cell does not define `{name}`")
    if check_entry.get("timeout"):
        return FAILED, "the check ran too long and was stopped (is your code very slow, or endless?)"
    if check_entry.get("defined") is False:
        return FAILED, _short(f"`{name}` was not defined when the check ran (did a later cell delete it?)")
    flags.append("the course's check ran but left no record: something in the notebook stopped or replaced it")
    if check_entry.get("error"):
        return FAILED, _short(f"the check could not run: its cell raised {_raised(check_entry)}")
    return FAILED, "the check left no record (something in your notebook stopped or replaced it)"


def _ending(run: Run) -> str:
    status = run.exit or {}
    if "signal" in status:
        return f"killed by signal {status['signal']}"
    if status.get("exit") is not None:
        return f"exit status {status['exit']}"
    return "it ended early"


def _notes(cells: list[PlanCell], run: Run) -> str:
    """What else happened: the grader's stop, cells the learner added that raised, unread files."""
    notes = []
    if run.stopped:
        notes.append(f"stopped: {run.stopped}")
    elif run.progress and not run.finished():
        notes.append(f"the learner's process ended early ({_ending(run)})")
    for k, cell in enumerate(cells):
        if cell.kind not in ("added", "demo"):
            continue
        entry = run.cell(k)
        if entry.get("timeout"):
            notes.append(f"cell {cell.origin + 1} (added) ran too long and was stopped")
        elif entry.get("error"):
            notes.append(f"cell {cell.origin + 1} ({cell.kind}) raised {_raised(entry)}")
        if len(notes) >= 3:
            break
    notes += run.problems[:2]
    return _short("; ".join(notes), 300)
