"""``python -m attn_course grade``: a learner's own notebooks, a class (``--class``), or merged shards.

    python -m attn_course grade [NOTEBOOK|FOLDER ...]            # default: notebooks/ of the course
    python -m attn_course grade --class FOLDER --out DIR [--jobs 2] [--shard I/N] [--assigned 01,05]
    python -m attn_course grade --merge DIR [DIR ...] --out DIR  # one class table from shards

Both gradings go through the same :class:`~.pipeline.Grader`; this module only finds the files,
keeps the journal and writes the reports.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..cli import at_least_zero, positive
from .journal import ClassInfo, Journal, key_for, read_journals, shard_of
from .model import Row
from .sandbox import Limits

__all__ = ["configure", "run", "grade_learner", "grade_class", "merge"]


#: What the exit status of grading one learner's notebooks means (``--help`` and the README say the same).
EXIT_STATUS = """exit status (grading your own notebooks): 0 when no exercise failed (every one passed or is not
attempted yet), 1 when at least one failed or could not be graded, 2 when nothing could be graded (no
course notebook found, a wrong argument), 130 when interrupted. A class (--class, --merge): 0 when the
table was written, whatever the grades."""


def exit_status(rows: list[Row]) -> int:
    """0 when no exercise failed (passed or not attempted yet: an exercise not done yet is not a failure of
    grading), 1 when one failed or could not be graded (error), 2 when there was nothing to grade."""
    from .model import ERROR, FAILED

    if not rows:
        return 2
    return 1 if any(r.status in (FAILED, ERROR) for r in rows) else 0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_STATUS
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("paths", nargs="*", help="notebooks or folders (default: the course's notebooks/)")
    parser.add_argument("--json", metavar="FILE", help="also write your rows as JSON")
    parser.add_argument("--csv", metavar="FILE", help="also write your rows as CSV")
    g = parser.add_argument_group("grading a class")
    g.add_argument("--class", dest="class_folder", metavar="FOLDER",
                   help="a folder with one sub-folder (or one notebook) per learner; writes one class table")
    g.add_argument("--out", metavar="DIR", help="where grades.csv, table.csv, summary.md and the journal go "
                   "(default: ./grades-<class folder name>); grading again with the same --out resumes")
    g.add_argument("--fresh", action="store_true", help="ignore the journal in --out and grade everything again")
    g.add_argument("--shard", metavar="I/N", help="grade only the I-th of N parts of the class (learners in "
                   "name order, every N-th); merge the parts with --merge")
    g.add_argument("--merge", nargs="+", metavar="DIR", help="build one class table from the --out folders of shards")
    g.add_argument("--assigned", metavar="LIST", help="the notebooks the table counts, e.g. 01,03,05 "
                   "(default: every notebook with exercises, as attn_course.registry.assigned() lists)")
    g.add_argument("--jobs", type=positive(int), default=None, metavar="N",
                   help="notebooks graded at the same time (default: 2, or 1 on a one-core machine)")
    g = parser.add_argument_group("the course and the limits")
    g.add_argument("--solutions", metavar="FOLDER", help="the course's solution notebooks "
                   "(default: solutions/ of the course folder you are in)")
    g.add_argument("--timeout", type=positive(float), default=60, metavar="S", help="seconds one cell may run (default: 60)")
    g.add_argument("--notebook-timeout", type=positive(float), default=300, metavar="S",
                   help="CPU seconds one notebook's cells may use in all before they are stopped, and three "
                        "times as long on the clock (default: 300)")
    g.add_argument("--memory-limit", type=positive(int), default=2048, metavar="MiB",
                   help="memory one notebook's processes may allocate in all (default: 2048, Binder's limit)")
    g.add_argument("--address-space-limit", type=at_least_zero, default=8192, metavar="MiB",
                   help="address-space limit (RLIMIT_AS) of each process; 0 for none (default: 8192)")
    g.add_argument("--call-timeout", type=positive(float), default=None, metavar="S",
                   help="lower the time limit of every call a check makes to the learner's code")
    g.add_argument("--no-landlock", dest="confine", action="store_false",
                   help="confine learner processes only as on a machine without Landlock (an audit hook, and "
                        "noticing changed files afterwards); for testing")


def _skip_uri_grammar() -> None:
    """nbformat imports jsonschema, which builds a URI grammar at import time when the optional
    ``rfc3987_syntax`` is installed (2 s of CPU). Notebook validation never checks URI formats, so the
    command does without it: a None entry makes that optional import fail at once, as if not installed."""
    if "jsonschema" not in sys.modules:
        sys.modules.setdefault("rfc3987_syntax", None)


def run(args: argparse.Namespace) -> int:
    _skip_uri_grammar()
    from .course import CourseNotFound

    try:
        if args.merge:
            if args.class_folder or args.paths:
                print("grade --merge takes only the shards' folders and --out.")
                return 2
            return merge([Path(p) for p in args.merge], Path(args.out or "grades"))
        limits = Limits(cell_timeout=args.timeout, notebook_timeout=args.notebook_timeout,
                        memory_mb=args.memory_limit, address_space_mb=args.address_space_limit or None,
                        call_timeout=args.call_timeout)
        jobs = args.jobs or min(2, os.cpu_count() or 1)
        assigned = [a for a in (args.assigned or "").split(",") if a.strip()] or None
        if args.shard and not args.class_folder:
            print("grade --shard splits a class: give it with --class FOLDER.")
            return 2
        if args.class_folder:
            if args.paths:
                print("grade --class takes one folder of submissions; leave out the other paths.")
                return 2
            return grade_class(Path(args.class_folder), out=Path(args.out) if args.out else None,
                               solutions=args.solutions, limits=limits, jobs=jobs, shard=args.shard,
                               assigned=assigned, fresh=args.fresh, confine=args.confine)
        return grade_learner([Path(p) for p in args.paths], solutions=args.solutions, limits=limits, jobs=jobs,
                             json_path=args.json, csv_path=args.csv, confine=args.confine)
    except (CourseNotFound, ValueError) as exc:
        print(f"grade: {exc}")
        return 2
    except KeyboardInterrupt:
        print("grade: interrupted")
        return 130


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM (a batch system's stop) ends grading like Ctrl-C: cleanly, reports written."""
    def on_term(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _progress(total: int, what: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=what, unit="notebook", file=sys.stderr, disable=total < 2 or None,
                leave=False, dynamic_ncols=True)


def _default_notebooks() -> list[Path]:
    from ..layout import find_root

    root = find_root()
    return [root / "notebooks"] if root is not None else [Path("notebooks")]


# ============================================================================ one learner
def grade_learner(paths: list[Path], *, solutions: str | None = None, limits: Limits | None = None, jobs: int = 2,
                  json_path: str | None = None, csv_path: str | None = None, confine: bool = True,
                  out=sys.stdout) -> int:
    """Grade one learner's notebooks and print the table; the exit code is :func:`exit_status`'s."""
    from . import collect, files, report
    from .course import Course, find_solutions
    from .pipeline import Grader
    from .watch import Runner

    started = time.monotonic()
    paths = paths or _default_notebooks()
    solutions_dir = find_solutions(solutions)
    scan = files.scan_paths(paths)
    found = scan.learners.get("you", [])
    jobs = max(1, min(jobs, len(found)))
    with _terminate_as_interrupt(), Runner(limits or Limits(), jobs=jobs, confine=confine) as runner:
        runner.guard([*(p.resolve().parent if p.is_file() else p for p in paths), solutions_dir]).start()
        course = Course(solutions_dir)  # loaded while the fork servers import PyTorch
        subs, _, warnings = collect.collect("you", found, course)
        warnings = scan.warnings + warnings
        subs = sorted(subs, key=lambda s: list(course.notebooks).index(s.notebook.slug))
        if not subs:
            for w in warnings:
                print(f"warning: {w}", file=out)
            print(f"No course notebook found in {' '.join(map(str, paths))}.", file=out)
            return 2
        rows = _grade_all(Grader(course, runner=runner), subs, lambda sub, got: None)
    print(report.learner_table(rows), file=out)
    for w in warnings:
        print(report._cut(f"warning: {w}", report.WIDTH), file=out)
    for target in filter(None, [json_path, csv_path]):
        report.write_rows(rows, Path(target))
        print(f"wrote {target}", file=out)
    print(f"graded in {time.monotonic() - started:.0f} s", file=out)
    return exit_status(rows)


def _grade_all(grader, subs: list, done) -> list[Row]:
    """Grade ``subs`` on the grader's job slots; ``done(sub, rows)`` is called as each finishes."""
    slots: queue.Queue = queue.Queue()
    for slot in range(grader.runner.jobs):
        slots.put(slot)
    lock = threading.Lock()

    def one(sub) -> list[Row]:
        slot = slots.get()
        try:
            rows = grader.grade(sub, slot=slot)
        except Exception as exc:  # noqa: BLE001 - a bug in grading must not stop the class
            rows = [Row(sub.learner, sub.notebook.slug, ex, "error", f"grading failed: {type(exc).__name__}: {exc}",
                        list(sub.flags), source=sub.rel) for ex in sub.notebook.exercises]
        finally:
            slots.put(slot)
        with lock:
            done(sub, rows)
        return rows

    results: list[Row] = []
    if grader.runner.jobs > 1 and len(subs) > 1:
        grader.runner.warm()
    bar = _progress(len(subs), "grading")
    try:
        with ThreadPoolExecutor(max_workers=grader.runner.jobs) as pool:
            for rows in pool.map(one, subs):
                results += rows
                bar.update()
    finally:
        bar.close()
    return results


# ============================================================================ a class
def grade_class(folder: Path, *, out: Path | None = None, solutions: str | None = None, limits: Limits | None = None,
                jobs: int = 2, shard: str | None = None, assigned: list[str] | None = None, fresh: bool = False,
                confine: bool = True, stdout=sys.stdout, runner=None) -> int:
    """Grade a class folder into ``out`` (see the module docstring); resumes from ``out``'s journal.
    ``runner``: a started :class:`~.run.Runner` to use (its limits and confinement replace ``limits``
    and ``confine``; it is left open), instead of one made and closed here."""
    from .course import find_solutions
    from .watch import Runner

    started = time.monotonic()
    folder = Path(folder)
    if not folder.is_dir():
        print(f"{folder} is not a folder of submissions.", file=stdout)
        return 2
    out = Path(out) if out else Path(f"grades-{folder.resolve().name}")
    if out.resolve() == folder.resolve() or folder.resolve() in out.resolve().parents:
        print("Write the grades outside the submissions folder (--out).", file=stdout)
        return 2
    index, count = shard_of(shard)
    solutions_dir = find_solutions(solutions)
    if runner is not None:
        return _grade_class(folder, out, solutions_dir, runner.limits, runner, (index, count), assigned, fresh,
                            runner.confine, stdout, started)
    limits = limits or Limits()
    runner = Runner(limits, jobs=jobs, confine=confine).start()  # imports PyTorch while the course loads
    try:
        return _grade_class(folder, out, solutions_dir, limits, runner, (index, count), assigned, fresh, confine,
                            stdout, started)
    finally:
        runner.close()


def _grade_class(folder, out, solutions_dir, limits, runner, shard, assigned, fresh, confine, stdout, started) -> int:
    from . import collect, files, report
    from .course import Course
    from .pipeline import Grader

    index, count = shard
    runner.guard([folder, out, solutions_dir])  # no learner process reads the class, the grades or the solutions
    course = Course(solutions_dir, assigned=assigned)
    scan = files.scan_class(folder)
    learners = sorted(scan.learners)[index - 1::count]
    info = ClassInfo(learners=learners, assigned=course.assigned,
                     exercises={s: course.notebooks[s].exercise_ids() for s in course.assigned},
                     titles={s: course.notebooks[s].title for s in course.assigned}, shards=[f"{index}/{count}"])
    mine = set(learners)
    info.warnings += [w for w in scan.warnings if index == 1 or w.split(":")[0].split("/")[0] in mine]
    if course.preload_failed:
        info.warnings.append(f"course modules that could not be imported: {', '.join(course.preload_failed)}")
    info.warnings += course.problems
    subs = []
    for learner in learners:
        chosen, _, warnings = collect.collect(learner, scan.learners[learner], course)
        info.warnings += warnings
        for sub in chosen:
            if sub.notebook.slug in course.assigned:
                subs.append(sub)
            else:
                info.warnings.append(f"{sub.rel}: {sub.notebook.slug} is not assigned (--assigned); not graded")
    handed_in = {collect.file_slug(item.rel) for learner in learners for item in scan.learners[learner]}
    if ungraded := sorted(handed_in & set(course.ungraded)):  # only what someone handed in
        info.warnings.append(f"not graded, no exercises: {', '.join(ungraded)}")
    journal = Journal(out, fresh=fresh)
    earlier = [e.get("course") for e in journal.entries if e.get("kind") == "class" and e.get("course")]
    if earlier and earlier[-1] != course.fingerprint():
        info.warnings.append("the course's files changed since this journal was begun: notebooks graded before "
                             "keep their verdicts; grade with --fresh to check everything with the current course")
    journal.describe_class(info, course=course.fingerprint())
    before = files.snapshot(folder)
    pending = []
    for sub in subs:
        # Resuming reuses a verdict when the file, its course notebook and the limits are the same.
        key = key_for(sub.learner, sub.rel, sub.sha, sub.notebook.digest, limits.__dict__, confine)
        if journal.done(key) is None:
            pending.append((key, sub))
    state = {"snapshot": before, "graded": 0}
    keys = {id(sub): key for key, sub in pending}
    # Without Landlock a submission's subprocess could write into the class folder: look after every
    # notebook, to name who ran then. With it, no learner process can write there; one look at the end.
    watch_each = not runner.landlocked

    def notice(running: list[str]) -> None:
        after = files.snapshot(folder)
        for rel, change in files.changes(state["snapshot"], after):
            owner = Path(rel).parts[0]
            text = f"{rel} was {change} while grading ran (in {owner}'s folder"
            text += f"; running then: {', '.join(dict.fromkeys(running))})" if running else ")"
            journal.warn(text)
            info.warnings.append(text)
        state["snapshot"] = after

    def done(sub, rows):
        journal.graded(keys[id(sub)], rows, sha=sub.sha, code=sub.code, attempted=sub.attempted,
                       solution_copy=sub.solution_copy, source=sub.rel)
        if watch_each:
            notice([sub.rel] + list(runner.running.values()))
        state["graded"] += 1
        if state["graded"] % 20 == 0:
            tampered = journal.verify()  # before the journal is read back for the interim reports
            if tampered and tampered not in info.warnings:
                info.warnings.append(tampered)
            _write(out, journal, info)

    interrupted = False
    try:
        with _terminate_as_interrupt():
            grader = Grader(course, runner=runner)
            _grade_all(grader, [s for _, s in pending], done)
    except KeyboardInterrupt:
        interrupted = True
        info.warnings.append("grading was interrupted: the table holds what was graded so far; "
                             "run the same command again to finish")
    notice([])
    if course.changed():
        info.warnings.append("the course's own files changed while grading ran: grade again from a clean copy")
    tampered = journal.verify()
    if tampered and tampered not in info.warnings:
        info.warnings.append(tampered)
    journal.describe_class(info, course=course.fingerprint())
    journal.close()
    paths = _write(out, journal, info)
    rows = report.class_rows(*read_journals([out]))
    print(f"{len(learners)} learners, {len(subs)} notebooks ({len(subs) - len(pending)} already in the journal): "
          + report._total_line(rows, "rows") + f"; {len(info.warnings)} warnings", file=stdout)
    print(f"graded in {time.monotonic() - started:.0f} s; wrote " + ", ".join(str(p) for p in paths.values()),
          file=stdout)
    return 130 if interrupted else 0


def _write(out: Path, journal: Journal, info: ClassInfo) -> dict[str, Path]:
    from . import report

    merged, entries = read_journals([out])
    merged.warnings = list(dict.fromkeys(merged.warnings + info.warnings))
    return report.write_class(report.class_rows(merged, entries), merged, out)


def merge(folders: list[Path], out: Path, *, stdout=sys.stdout) -> int:
    """One class table from the ``--out`` folders of several shards."""
    from . import report

    missing = [str(f) for f in folders if not (Path(f) / "journal.jsonl").is_file()]
    if missing:
        print(f"no grading journal in: {', '.join(missing)}", file=stdout)
        return 2
    info, entries = read_journals(folders)
    rows = report.class_rows(info, entries)
    paths = report.write_class(rows, info, out)
    print(f"merged {len(folders)} folders ({', '.join(sorted(info.shards))}): {len(info.learners)} learners; "
          + report._total_line(rows, "rows"), file=stdout)
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=stdout)
    return 0
