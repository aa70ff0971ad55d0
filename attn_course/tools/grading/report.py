"""The grades as people read them: a terminal table for one learner, three files for a class.

One learner (:func:`learner_table`): one line per exercise under its notebook, a subtotal per
notebook and a total, at most 100 columns wide; the message is the check's one-line summary (the
diagnosis in full is in the notebook, where the check cell shows it).

A class (:func:`write_class`), from the journal entries of one or more shards:

* ``grades.csv`` — one row per learner and exercise: status, message, flags, what happened, the file;
* ``table.csv`` — learners × exercises of the assigned notebooks, with "passed" and "of" counts;
* ``summary.md`` — per learner, per exercise, the exercises most often failed with their most
  common diagnosis, what is flagged for review, and every warning.

Every learner found in the class folder is in all three, with "not submitted" for each assigned
exercise of a notebook they did not hand in. Identical answers of different learners are flagged
here (they are only visible once every shard is in). CSV files are UTF-8 with a byte-order mark,
so spreadsheet programs read accented names right (:mod:`attn_course.tools.tables`).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from ..tables import format_table, write_csv, write_json
from .journal import ClassInfo
from .model import ERROR, FAILED, NOT_ATTEMPTED, NOT_SUBMITTED, PASSED, Row

__all__ = ["WIDTH", "learner_table", "result_text", "class_rows", "write_class", "class_summary", "write_rows",
           "GRADE_FIELDS"]

WIDTH = 100
GRADE_FIELDS = ["learner", "notebook", "exercise", "status", "message", "flags", "note", "source", "seconds",
                "cpu_seconds", "peak_mb"]


def result_text(row: Row) -> str:
    """``failed: syntax error in line 3: …`` — the status, then the message unless it only repeats it."""
    message = row.message.strip()
    if not message or row.status == PASSED or message.lower().startswith(row.status):
        return row.status if row.status != PASSED or not message else PASSED
    return f"{row.status}: {message}"


def _counts(rows: list[Row]) -> Counter:
    return Counter(r.status for r in rows)


def _total_line(rows: list[Row], what: str = "exercises") -> str:
    c = _counts(rows)
    errors = f"{c[ERROR]} error" + ("s" if c[ERROR] != 1 else "")
    extra = [f"{c[FAILED]} {FAILED}", f"{c[NOT_ATTEMPTED]} {NOT_ATTEMPTED}", errors]
    if c[NOT_SUBMITTED]:
        extra.append(f"{c[NOT_SUBMITTED]} {NOT_SUBMITTED}")
    return f"{c[PASSED]} of {len(rows)} {what} passed ({', '.join(extra)})"


def learner_table(rows: list[Row], *, width: int = WIDTH) -> str:
    """The one-learner table (see the module docstring), rows in the order given."""
    body: list[list[str]] = []
    notebooks = list(dict.fromkeys(r.notebook for r in rows))
    for slug in notebooks:
        mine = [r for r in rows if r.notebook == slug]
        for i, row in enumerate(mine):
            body.append([slug if i == 0 else "", row.exercise, result_text(row)])
        c = _counts(mine)
        body.append(["", "", f"── {c[PASSED]} of {len(mine)} passed"])
    table = format_table(["notebook", "exercise", "result"], body, max_width=width, flex="result",
                         overflow="truncate")
    lines = [table, "", "Total: " + _total_line(rows)]
    notes = []
    for slug in notebooks:
        mine = [r for r in rows if r.notebook == slug]
        for flag in dict.fromkeys(f for r in mine for f in r.flags):
            notes.append(f"{slug}: {flag}")
        if mine[0].note:
            notes.append(f"{slug}: {mine[0].note}")
    if notes:
        lines += ["", "Notes:"] + [_cut(f"- {n}", width) for n in notes]
    return "\n".join(lines)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def write_rows(rows: list[Row], path: Path) -> Path:
    """One learner's rows as JSON (``.json``) or CSV (anything else)."""
    if Path(path).suffix.lower() == ".json":
        return write_json(path, [r.to_json() for r in rows])
    return write_csv(path, [_csv_row(r) for r in rows], GRADE_FIELDS)


def _csv_row(row: Row) -> dict[str, Any]:
    data = row.to_json()
    data["flags"] = "; ".join(row.flags)
    return data


# ============================================================================ a class
def class_rows(info: ClassInfo, entries: list[dict[str, Any]]) -> list[Row]:
    """Every learner × every assigned exercise (not submitted where nothing was graded), plus the rows
    of any other graded notebook, with identical answers across learners flagged."""
    graded: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in entries:
        rows = entry.get("rows") or []
        if rows:
            graded[(rows[0].get("learner", ""), rows[0].get("notebook", ""))] = entry
    _flag_identical(graded)
    learners = sorted(set(info.learners) | {learner for learner, _ in graded})
    out: list[Row] = []
    for learner in learners:
        for slug in info.assigned:
            entry = graded.get((learner, slug))
            if entry is not None:
                out += [Row.from_json(r) for r in entry["rows"]]
            else:
                out += [Row(learner, slug, ex, NOT_SUBMITTED) for ex in info.exercises.get(slug, [])]
    return out


def _flag_identical(graded: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Flag answers shared by several learners (same file bytes, or the same exercise code)."""
    for digest, what in (("sha", "byte-identical file to"), ("code", "the same exercise code as")):
        groups: dict[tuple[str, str], list[str]] = {}
        for (learner, slug), entry in graded.items():
            if entry.get(digest) and entry.get("attempted", 0) > 0 and not entry.get("solution_copy"):
                groups.setdefault((slug, entry[digest]), []).append(learner)
        for (slug, _), learners in groups.items():
            if len(learners) < 2:
                continue
            for learner in learners:
                others = ", ".join(sorted(set(learners) - {learner}))
                flag = f"{what} {others}'s {slug}"
                for row in graded[(learner, slug)]["rows"]:
                    if not any(f.startswith("byte-identical") and digest == "code" for f in row.get("flags", [])):
                        row.setdefault("flags", []).append(flag)


def _key(message: str) -> str:
    """Messages that differ only in numbers count as the same diagnosis."""
    return re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "#", message)[:160]


_MD_SPECIAL = re.compile(r"([\\|<>\[\]])")


def _md(text: str) -> str:
    """``text`` on one line, as literal Markdown text: messages, flags and warnings hold what a learner wrote
    (an exception's message, a file name), and ``<!--`` there would hide the rest of the summary, a ``|`` or a
    trailing backslash add a column, ``[text](link)`` or ``<img …>`` show what the grader never said."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def class_summary(rows: list[Row], info: ClassInfo, *, top: int = 5) -> str:
    learners = list(dict.fromkeys(r.learner for r in rows)) or info.learners
    exercises = list(dict.fromkeys((r.notebook, r.exercise) for r in rows))
    lines = ["# Class grades", "",
             f"{len(learners)} learners, {len(info.assigned)} notebooks assigned ({', '.join(info.assigned)}), "
             f"{len(exercises)} exercises; {_total_line(rows, 'rows')}.", ""]
    if info.shards and info.shards != ["1/1"]:
        lines += [f"Merged from shards {', '.join(sorted(info.shards))}.", ""]
    lines += ["## Per learner", "", "| learner | passed | failed | not attempted | error | not submitted | flagged |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for learner in learners:
        mine = [r for r in rows if r.learner == learner]
        c = _counts(mine)
        flagged = len({r.notebook for r in mine if r.flags})
        lines.append(f"| {_md(learner)} | {c[PASSED]} of {len(mine)} | {c[FAILED]} | {c[NOT_ATTEMPTED]} | {c[ERROR]} | "
                     f"{c[NOT_SUBMITTED]} | {flagged or ''} |")
    lines += ["", "## Per exercise", "",
              "| notebook | exercise | passed | failed | not attempted | error | not submitted |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    failing = []
    for slug, ex in exercises:
        these = [r for r in rows if r.notebook == slug and r.exercise == ex]
        c = _counts(these)
        lines.append(f"| {slug} | {ex} | {c[PASSED]} | {c[FAILED]} | {c[NOT_ATTEMPTED]} | {c[ERROR]} | "
                     f"{c[NOT_SUBMITTED]} |")
        wrong = [r for r in these if r.status in (FAILED, ERROR)]
        if wrong:
            keys = Counter(_key(r.message) for r in wrong)
            key, count = keys.most_common(1)[0]
            example = next(r.message for r in wrong if _key(r.message) == key)
            failing.append((len(wrong), slug, ex, count, example))
    lines += ["", "## Most often failed", ""]
    if failing:
        lines += ["| exercise | failed or error | most common diagnosis (how many) |", "| --- | ---: | --- |"]
        for n, slug, ex, count, example in sorted(failing, key=lambda t: (-t[0], t[1], t[2]))[:top]:
            lines.append(f"| {ex} ({slug}) | {n} | {_md(example)} ({count}) |")
    else:
        lines.append("No exercise failed.")
    review: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        for flag in r.flags:
            items = review.setdefault((r.learner, r.notebook), [])
            if flag not in items:
                items.append(flag)
    lines += ["", "## For review", ""]
    if review:
        lines += ["Flags do not change a grade: they point at what a person should look at.", "",
                  "| learner | notebook | flags |", "| --- | --- | --- |"]
        lines += [f"| {_md(learner)} | {slug} | {_md('; '.join(flags))} |"
                  for (learner, slug), flags in sorted(review.items())]
    else:
        lines.append("Nothing flagged.")
    lines += ["", "## Warnings", ""]
    lines += [f"- {_md(w)}" for w in info.warnings] if info.warnings else ["None."]
    return "\n".join(lines) + "\n"


def write_class(rows: list[Row], info: ClassInfo, out: Path) -> dict[str, Path]:
    """Write grades.csv, table.csv and summary.md into ``out``; returns their paths."""
    out = Path(out)
    paths = {"grades": out / "grades.csv", "table": out / "table.csv", "summary": out / "summary.md"}
    write_csv(paths["grades"], [_csv_row(r) for r in rows], GRADE_FIELDS)
    columns = [f"{slug}:{ex}" for slug in info.assigned for ex in info.exercises.get(slug, [])]
    table = []
    for learner in dict.fromkeys(r.learner for r in rows):
        mine = {f"{r.notebook}:{r.exercise}": r for r in rows if r.learner == learner}
        flagged = sorted({r.notebook for r in mine.values() if r.flags})
        table.append([learner, sum(mine[c].status == PASSED for c in columns if c in mine), len(columns),
                      *(mine[c].status if c in mine else NOT_SUBMITTED for c in columns), "; ".join(flagged)])
    write_csv(paths["table"], table, ["learner", "passed", "of", *columns, "flagged"])
    text = class_summary(rows, info)
    tmp = paths["summary"].with_name(".summary.md.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(paths["summary"])
    return paths

