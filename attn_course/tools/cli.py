"""``python -m attn_course <command>``: the course's tooling. ``--help`` on any command says more.

One way to parse arguments for every tool: each command is a module of :mod:`attn_course.tools` with
``configure(parser)`` (adds its arguments) and ``run(args) -> exit code``. A module is imported only
when its command runs, so ``python -m attn_course --help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

#: command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "grade": ("attn_course.tools.grading", "grade notebooks: one row per exercise (a learner's, or a class's with --class)"),
    "exercises": ("attn_course.tools.exercises", "generate notebooks/ from solutions/ (one source); never overwrites your edits"),
    "run-solutions": ("attn_course.tools.solutions", "re-execute solution notebooks in place (maintainers)"),
    "bench-course": ("attn_course.tools.budgets", "measure each solution notebook's time and peak memory against the budgets"),
    "schedule": ("attn_course.tools.schedule", "estimate learner time per notebook and build workshop schedules"),
    "bench": ("attn_course.tools.bench", "time attention implementations on this machine's best device"),
    "mutants": ("attn_course.tools.mutants", "mutation-test the checks: which mutated solutions does a check pass?"),
    "links": ("attn_course.tools.links", "write the badges, notebook links and Colab cells from the repository's address"),
}


def _number(kind: type, allowed, rule: str):
    """An argparse type: a number of ``kind`` for which ``allowed(value)`` holds, else "TEXT ``rule``"."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not allowed(value):
            raise argparse.ArgumentTypeError(f"{text} {rule}")
        return value
    parse.__name__ = kind.__name__  # what argparse names in "invalid ... value"
    return parse


def positive(kind: type = float):
    """An argparse type: a number of ``kind`` above 0 (a limit of 0 or less would fail every answer)."""
    return _number(kind, lambda value: value > 0, "must be above 0")


#: An argparse type: an integer of 0 (no limit) or more.
at_least_zero = _number(int, lambda value: value >= 0, "must be 0 (no limit) or more")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported to add its arguments."""
    parser = argparse.ArgumentParser(prog="python -m attn_course",
                                     description="The course's tooling. `python -m attn_course COMMAND --help` says more.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(command).parse_args(argv)
    try:
        return importlib.import_module(COMMANDS[args.command][0]).run(args)
    except (OSError, ValueError, KeyError) as exc:  # a missing or unreadable file, a value the command refuses
        if os.environ.get("ATTN_COURSE_TRACEBACK"):  # a maintainer chasing a bug wants the whole story
            raise
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"python -m attn_course {args.command}: {type(exc).__name__}: {message} "
              "(ATTN_COURSE_TRACEBACK=1 shows where)", file=sys.stderr)
        return 2
