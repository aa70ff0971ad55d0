"""Learner-time estimates per notebook, computed from the notebooks, and workshop schedules built from them.

``python -m attn_course schedule`` reads every solution notebook and estimates the time a learner
needs for it with a stated model, never guessed minutes::

    minutes = markdown words / WPM            (reading the text)
            + code lines / LPM                 (reading and running the demonstration and check cells)
            + exercises × EXERCISE_MINUTES     (writing each exercise until its check passes)
            + measured run time                (the notebook executed top to bottom in a fresh kernel)

rounded up to whole minutes. The run time comes from ``bench-course`` results (``--timings``, by
default ``docs/schedule-timings.json``, written the first time) or a fresh run (``--measure``).
From those estimates it builds a 3-hour and a full-day workshop (breaks at notebook boundaries;
what does not fit is listed as take-home) and writes ``docs/schedule.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

from . import nbmeta
from .cli import positive

WPM = 130  # words per minute for technical prose with formulas (plain prose is read at 200-250)
CODE_LPM = 15  # lines of code per minute, read and run
EXERCISE_MINUTES = 8  # per exercise: write it, run its check, fix it once
# Short workshops take the core path first; the rest is added while it fits (course order is kept).
# The 3-hour path goes straight to attention (dot product, softmax, attention); the notebooks are
# independent, so skipping 02 or 04 leaves nothing broken.
THREE_HOUR_PRIORITY = ["00", "01", "03", "05", "02", "06", "07", "04", "08", "09"]


@dataclass
class Estimate:
    notebook: str
    title: str
    words: int
    code_lines: int
    exercises: int
    run_seconds: float
    reading_min: float
    code_min: float
    exercise_min: float
    run_min: float
    minutes: int  # the total, rounded up


def _title(nb) -> str:
    """The notebook's first Markdown heading without its number ("03 · Softmax" -> "Softmax"), or ""."""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            if line.startswith("#"):
                return re.sub(r"^\d+\s*[·:.-]\s*", "", line.lstrip("#").strip())
    return ""


def count_words(markdown: str) -> int:
    """Words a reader reads: markup, links' targets, HTML tags and image links left out; a formula's symbols count."""
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", markdown)  # images
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: keep the text
    text = re.sub(r"<[^>]+>", " ", text)  # HTML tags
    text = re.sub(r"[#*_`|>]+", " ", text)
    text = re.sub(r"\\[a-zA-Z]+", " x ", text)  # LaTeX commands read as one symbol
    return len(re.findall(r"[\w\u00c0-\u024f√]+", text))


def estimate(path: Path, run_seconds: float, *, wpm: float = WPM, code_lpm: float = CODE_LPM,
             exercise_minutes: float = EXERCISE_MINUTES) -> Estimate:
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if not {"links", "colab"} & set(c.metadata.get("tags", []))]  # course plumbing
    words = sum(count_words(c.source) for c in cells if c.cell_type == "markdown")
    exercises = sum(nbmeta.role(c) == nbmeta.EXERCISE for c in cells)
    code_lines = sum(
        1
        for c in cells
        if c.cell_type == "code" and nbmeta.role(c) != nbmeta.EXERCISE
        for line in c.source.splitlines()
        if line.strip() and not line.strip().startswith("#")
    )
    reading, code = words / wpm, code_lines / code_lpm
    work, run = exercises * exercise_minutes, run_seconds / 60
    return Estimate(path.name, _title(nb), words, code_lines, exercises, round(run_seconds, 1), round(reading, 1),
                    round(code, 1), round(work, 1), round(run, 1), math.ceil(reading + code + work + run))


def measure_run_seconds(paths: list[Path]) -> dict[str, float]:
    """Run each notebook once in a fresh kernel (as ``bench-course`` does) and return its seconds."""
    import tempfile

    from .runner import execute

    seconds = {}
    for path in paths:
        with tempfile.TemporaryDirectory(prefix="attn-schedule-") as tmp:
            run = execute(nbformat.read(path, as_version=4), cwd=Path(tmp), allow_errors=False)
        seconds[path.name] = round(run.seconds, 1)
        print(f"measured {path.name}: {run.seconds:.1f} s", file=sys.stderr)
    return seconds


def load_timings(path: Path) -> dict[str, float]:
    """Seconds per notebook from ``bench-course --json`` output (a list of rows) or a {name: seconds} map."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict) and "notebooks" in data:
        data = data["notebooks"]
    if isinstance(data, list):
        return {row["notebook"]: float(row["seconds"]) for row in data}
    return {name: float(s) for name, s in data.items()}


# ----------------------------------------------------------------------------- schedules
@dataclass
class Slot:
    start: int  # minutes from the start of the day
    minutes: int
    what: str


def clock_time(text: str) -> str:
    """An argparse type: a time of day written HH:MM (24-hour clock)."""
    if not re.fullmatch(r"([01]?\d|2[0-3]):[0-5]\d", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a time of day written HH:MM, e.g. 09:00 or 13:30")
    return text


def _clock(start_hhmm: str, offset: int) -> str:
    h, m = map(int, start_hhmm.split(":"))
    total = h * 60 + m + offset
    return f"{total // 60:02d}:{total % 60:02d}"


def _fit(estimates: list[Estimate], capacity: int, priority: list[str]) -> tuple[list[Estimate], list[Estimate]]:
    """Notebooks taken in priority order while they fit in ``capacity`` minutes; returned in course order."""
    by_prefix = {e.notebook[:2]: e for e in estimates}
    chosen, used = set(), 0
    for prefix in priority + [p for p in by_prefix if p not in priority]:
        e = by_prefix.get(prefix)
        if e is not None and used + e.minutes <= capacity:
            chosen.add(e.notebook)
            used += e.minutes
    inside = [e for e in estimates if e.notebook in chosen]
    return inside, [e for e in estimates if e.notebook not in chosen]


def build(estimates: list[Estimate], *, length: int, opening: int, closing: int,
          breaks: list[tuple[int, int, str]], priority: list[str], extras: list[tuple[int, str]] = ()):
    """Slots for a day of ``length`` minutes: an opening, the notebooks that fit (breaks placed at the
    first notebook boundary at or after each break's planned time), the extras, a closing."""
    capacity = length - opening - closing - sum(b[1] for b in breaks) - sum(x[0] for x in extras)
    inside, outside = _fit(estimates, capacity, priority)
    slots = [Slot(0, opening, "Welcome, goals, open the notebooks (Binder / hub link)")]
    t = opening
    pending = sorted(breaks)
    for e in inside:
        while pending and t >= pending[0][0]:
            at, minutes, name = pending.pop(0)
            slots.append(Slot(t, minutes, name))
            t += minutes
        slots.append(Slot(t, e.minutes, f"{e.notebook[:-6]} · {e.title}"))
        t += e.minutes
    for at, minutes, name in pending:  # breaks not yet taken
        slots.append(Slot(t, minutes, name))
        t += minutes
    for minutes, name in extras:
        slots.append(Slot(t, minutes, name))
        t += minutes
    slack = length - closing - t
    slots.append(Slot(t, closing + max(0, slack), "Questions, wrap-up, what to do next"
                      + (f" (includes {slack} min of slack)" if slack > 0 else "")))
    return slots, outside


def _table(slots: list[Slot], start: str) -> list[str]:
    lines = ["| time | minutes | what |", "| --- | ---: | --- |"]
    lines += [f"| {_clock(start, s.start)}–{_clock(start, s.start + s.minutes)} | {s.minutes} | {s.what} |"
              for s in slots]
    return lines


def render(estimates: list[Estimate], *, wpm: float, code_lpm: float, exercise_minutes: float, source: str,
           start: str = "09:00") -> str:
    total = sum(e.minutes for e in estimates)
    lines = [
        "# Workshop schedule",
        "",
        "<!-- Generated by `python -m attn_course schedule`; do not edit by hand. -->",
        "",
        "Learner time per notebook is computed from the notebooks themselves, with this model:",
        "",
        f"- **reading**: the markdown's words at **{wpm:g} words per minute** (technical text with formulas);",
        f"- **code**: the non-empty, non-comment lines of the demonstration and check cells at "
        f"**{code_lpm:g} lines per minute** (read, run, look at the output);",
        f"- **exercises**: **{exercise_minutes:g} minutes per exercise** (write it, run its check, fix it once);",
        f"- **running**: the notebook's measured execution time, top to bottom in a fresh kernel ({source}).",
        "",
        "The sum is rounded up to whole minutes. Change the model with `--wpm`, `--code-lpm` and "
        "`--exercise-minutes`; re-measure with `--measure`.",
        "",
        "| notebook | words | code lines | exercises | run (s) | reading | code | exercises | running | **minutes** |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for e in estimates:
        lines.append(f"| {e.notebook[:-6]} · {e.title} | {e.words} | {e.code_lines} | {e.exercises} | "
                     f"{e.run_seconds:g} | {e.reading_min:g} | {e.code_min:g} | {e.exercise_min:g} | "
                     f"{e.run_min:g} | **{e.minutes}** |")
    lines += [f"| **all notebooks** | {sum(e.words for e in estimates)} | {sum(e.code_lines for e in estimates)} | "
              f"{sum(e.exercises for e in estimates)} | {sum(e.run_seconds for e in estimates):.1f} | | | | | "
              f"**{total}** |", ""]

    three, left3 = build(estimates, length=180, opening=10, closing=10, breaks=[(80, 15, "Break")],
                         priority=THREE_HOUR_PRIORITY)
    lines += ["## 3-hour workshop", "",
              f"Notebooks in the order {', '.join(THREE_HOUR_PRIORITY)} (the path to attention first), each one "
              "that still fits in the time left (every notebook stands on its own); one 15-minute break at the "
              "first notebook boundary after 80 minutes.", ""]
    lines += _table(three, start)
    lines += ["", "Take-home (does not fit): " + (", ".join(f"{e.notebook[:-6]} ({e.minutes} min)" for e in left3)
                                                  or "nothing") + ".", ""]

    day_breaks = [(90, 15, "Break"), (195, 60, "Lunch"), (345, 15, "Break")]
    day, left_day = build(estimates, length=480, opening=15, closing=15, breaks=day_breaks,
                          priority=[e.notebook[:2] for e in estimates],
                          extras=[(15, "GPU demo: `python -m attn_course bench` on the venue GPU (instructor)")])
    lines += ["## Full-day workshop", "",
              f"All notebooks in course order; breaks planned for {_clock(start, day_breaks[0][0])} and "
              f"{_clock(start, day_breaks[2][0])} and lunch for {_clock(start, day_breaks[1][0])}, each taken at the "
              "first notebook boundary after its planned time; a 15-minute GPU demo before the wrap-up.", ""]
    lines += _table(day, start)
    lines += ["", "Take-home (does not fit): " + (", ".join(f"{e.notebook[:-6]} ({e.minutes} min)"
                                                            for e in left_day) or "nothing") + ".", ""]
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--notebooks", default="solutions", help="folder of solution notebooks (default: solutions)")
    parser.add_argument("--timings", default="docs/schedule-timings.json",
                        help="bench-course --json results (seconds per notebook); measured and written if missing")
    parser.add_argument("--measure", action="store_true", help="run every notebook now and rewrite --timings")
    parser.add_argument("--wpm", type=positive(float), default=WPM, help=f"markdown words per minute (default {WPM})")
    parser.add_argument("--code-lpm", type=positive(float), default=CODE_LPM, help=f"code lines per minute (default {CODE_LPM})")
    parser.add_argument("--exercise-minutes", type=positive(float), default=EXERCISE_MINUTES,
                        help=f"minutes per exercise (default {EXERCISE_MINUTES})")
    parser.add_argument("--start", type=clock_time, default="09:00", help="the workshop's start time (default 09:00)")
    parser.add_argument("--out", default="docs/schedule.md", help="where to write the schedule (default: docs/schedule.md)")
    parser.add_argument("--json", metavar="FILE", help="also write the estimates as JSON")


def run(args: argparse.Namespace) -> int:
    paths = sorted(Path(args.notebooks).glob("*.ipynb"))
    if not paths:
        print(f"No notebooks in {args.notebooks}.", file=sys.stderr)
        return 2
    timings_path = Path(args.timings)
    timings = {} if args.measure or not timings_path.exists() else load_timings(timings_path)
    missing = [p for p in paths if p.name not in timings]
    if missing:
        timings.update(measure_run_seconds(missing))
        timings_path.parent.mkdir(parents=True, exist_ok=True)
        timings_path.write_text(json.dumps(dict(sorted(timings.items())), indent=2) + "\n", encoding="utf-8")
        print(f"wrote {timings_path}", file=sys.stderr)
    out = Path(args.out)
    # named relative to the schedule itself, so the text is the same whichever folder the command ran from
    source = f"`{Path(os.path.relpath(timings_path.resolve(), out.resolve().parent)).as_posix()}`"
    estimates = [estimate(p, timings[p.name], wpm=args.wpm, code_lpm=args.code_lpm,
                          exercise_minutes=args.exercise_minutes) for p in paths]
    text = render(estimates, wpm=args.wpm, code_lpm=args.code_lpm, exercise_minutes=args.exercise_minutes,
                  source=f"seconds from {source}", start=args.start)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(e) for e in estimates], indent=2) + "\n", encoding="utf-8")
    print(text)
    print(f"wrote {out}", file=sys.stderr)
    return 0

