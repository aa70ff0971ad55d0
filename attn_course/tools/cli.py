"""Course tooling: ``python -m attn_course <command>``; ``--help`` on any command says more."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _exercises(args: argparse.Namespace) -> int:
    from .exercises import generate

    return generate(Path(args.solutions), Path(args.notebooks), check_only=args.check)


def _grade(args: argparse.Namespace) -> int:
    if args.class_folder:
        from .grading import main_class

        if args.paths:
            print("grade --class takes one folder of submissions; leave out the other paths.")
            return 2
        return main_class(args.class_folder, out_dir=args.out, solutions=args.solutions, cell_timeout=args.timeout,
                          notebook_timeout=args.notebook_timeout, memory_limit_mb=args.memory_limit,
                          address_space_mb=args.address_space_limit or None, jobs=args.jobs)
    from .grading import main

    return main(args.paths, cell_timeout=args.timeout, json_path=args.json, csv_path=args.csv)


def _bench_course(args: argparse.Namespace) -> int:
    from .budgets import main

    return main(args.paths, repeats=args.repeats, json_path=args.json)


def _run_solutions(args: argparse.Namespace) -> int:
    from .solutions import main

    return main(args.paths)


def _bench(args: argparse.Namespace) -> int:
    from ..bench import main

    return main(args.bench_args)


def _schedule(args: argparse.Namespace) -> int:
    from .schedule import main

    return main(args.schedule_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m attn_course", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("exercises", help="generate notebooks/ from solutions/ (one source)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 and list what is stale")
    p.add_argument("--solutions", default="solutions", help="folder of solution notebooks (default: solutions)")
    p.add_argument("--notebooks", default="notebooks", help="folder of exercise notebooks (default: notebooks)")
    p.set_defaults(run=_exercises)

    p = sub.add_parser("grade", help="run notebooks and print one row per exercise")
    p.add_argument("paths", nargs="*", help="notebooks or folders (default: notebooks/)")
    p.add_argument("--timeout", type=int, default=60, help="seconds a cell may run (default: 60)")
    p.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    p.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    g = p.add_argument_group("grading a class (--class)")
    g.add_argument("--class", dest="class_folder", metavar="FOLDER",
                   help="a folder with one sub-folder or one notebook per learner; writes one class table")
    g.add_argument("--out", metavar="FOLDER",
                   help="where grades.csv, table.csv and summary.md go (default: ./grades-<class folder name>)")
    g.add_argument("--solutions", metavar="FOLDER", help="the course's solution notebooks (default: the course's)")
    g.add_argument("--notebook-timeout", type=int, default=600, metavar="S",
                   help="seconds one notebook may take in all before its kernel is killed (default: 600)")
    g.add_argument("--memory-limit", type=int, default=2048, metavar="MB",
                   help="resident memory one kernel may use before it is killed (default: 2048, Binder's limit)")
    g.add_argument("--address-space-limit", type=int, default=8192, metavar="MB",
                   help="Linux/macOS: address-space limit (RLIMIT_AS) of the kernel; 0 for none (default: 8192)")
    g.add_argument("--jobs", type=int, default=1, metavar="N", help="notebooks graded at the same time (default: 1)")
    p.set_defaults(run=_grade)

    p = sub.add_parser("bench-course", help="measure each solution notebook's time and peak memory")
    p.add_argument("paths", nargs="*", help="notebooks or folders (default: solutions/)")
    p.add_argument("--repeats", type=int, default=1, help="runs per notebook; the worst is reported")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.set_defaults(run=_bench_course)

    p = sub.add_parser("run-solutions", help="re-execute solution notebooks in place (maintainers)")
    p.add_argument("paths", nargs="*", help="notebooks or folders (default: solutions/)")
    p.set_defaults(run=_run_solutions)

    p = sub.add_parser("bench", help="time attention implementations on this machine's best device",
                       add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(run=_bench)

    p = sub.add_parser("schedule", help="estimate learner time per notebook and build workshop schedules",
                       add_help=False)
    p.add_argument("schedule_args", nargs=argparse.REMAINDER)
    p.set_defaults(run=_schedule)
    return parser


# Commands that parse everything after their name themselves (their own --help included).
PASS_THROUGH = {"bench": _bench, "schedule": _schedule}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASS_THROUGH:
        rest = argv[1:]
        return PASS_THROUGH[argv[0]](argparse.Namespace(bench_args=rest, schedule_args=rest))
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
