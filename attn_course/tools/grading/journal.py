"""What has been graded, written as it happens: resume after a crash, shard a class, merge the shards.

``OUT/journal.jsonl`` gets one JSON line per graded notebook (its rows, the digests that identify the
file and its answers) the moment its verdicts are reached, flushed and synced to disk. A grader that
is killed leaves every notebook it finished in the journal; running the same command again skips
those whose file, course and limits are unchanged (the *key*). Each grading run also writes a
``class`` line: the learners of its shard, the notebooks assigned, their exercises and the warnings
— everything the class table needs, so that :func:`merge` builds one table from the journals of any
number of shards without the course or the submissions at hand.

A line that was cut off when the grader died is ignored. The grader keeps its own copy of what the
file must hold (what it held at the start, then every line this grader appended) and checks it before
reading the journal back and at the end (:meth:`Journal.verify`): anything else written there — by a
submission's process, where Landlock does not keep them out of ``--out`` — is removed and named.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .files import plain
from .model import Row

__all__ = ["JOURNAL", "Journal", "ClassInfo", "key_for", "shard_of", "read_journals"]

JOURNAL = "journal.jsonl"


def key_for(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def shard_of(spec: str | None) -> tuple[int, int]:
    """``"2/3"`` → (2, 3); None → (1, 1). Raises ValueError with a readable message."""
    if not spec:
        return 1, 1
    try:
        index, count = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard {spec}: write it as I/N, e.g. 2/3") from None
    if not 1 <= index <= count:
        raise ValueError(f"--shard {spec}: I must be between 1 and N")
    return index, count


@dataclass
class ClassInfo:
    """What a class table needs besides the graded rows (merged over shards)."""

    learners: list[str] = field(default_factory=list)
    assigned: list[str] = field(default_factory=list)
    exercises: dict[str, list[str]] = field(default_factory=dict)  # notebook slug -> exercise ids
    titles: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)


class Journal:
    def __init__(self, out: Path, *, fresh: bool = False):
        self.path = Path(out) / JOURNAL
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fresh and self.path.exists():
            self.path.unlink()
        # What the file must hold when this grader is done: what it held at the start, then every line
        # this grader appended. Anything else found at the end was written by someone else.
        self._expected = bytearray(self.path.read_bytes() if self.path.is_file() else b"")
        if self._expected and not self._expected.endswith(b"\n"):
            self._expected += b"\n"  # a line cut off when an earlier grader died: end it, so ours starts clean
            self.path.write_bytes(bytes(self._expected))
        self.entries = _read(self.path)
        self._graded = {e["key"]: e for e in self.entries if e.get("kind") == "graded" and "key" in e}
        self._fh = self.path.open("a", encoding="utf-8")

    def close(self) -> str | None:
        """Close the journal, and make sure it holds exactly what it held at the start plus what this
        grader wrote. Where something else changed it while grading ran (a submission's process, where
        Landlock does not keep them out of ``--out``), it is rewritten and a warning returned."""
        self._fh.close()
        return self.verify()

    def verify(self) -> str | None:
        """None when the file holds exactly what it should; else restore it and say so."""
        try:
            found = self.path.read_bytes()
        except OSError:
            found = None
        if found == bytes(self._expected):
            return None
        reopen = not self._fh.closed
        self._fh.close()
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(bytes(self._expected))
        os.replace(tmp, self.path)
        if reopen:
            self._fh = self.path.open("a", encoding="utf-8")
        return (f"{self.path} was changed by something other than the grader while grading ran; "
                "it was restored from the grader's own copy (the grades hold only the grader's rows)")

    def _append(self, entry: dict[str, Any]) -> None:
        entry = plain(entry)  # a lone surrogate (an odd file name, a learner's message) cannot be written as UTF-8
        line = json.dumps(entry, ensure_ascii=False) + "\n"
        self._fh.write(line)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._expected += line.encode("utf-8")
        self.entries.append(entry)

    def done(self, key: str) -> list[Row] | None:
        entry = self._graded.get(key)
        return [Row.from_json(r) for r in entry["rows"]] if entry else None

    def graded(self, key: str, rows: list[Row], **facts: Any) -> None:
        entry = {"kind": "graded", "key": key, "rows": [r.to_json() for r in rows], **facts}
        self._append(entry)
        self._graded[key] = entry

    def warn(self, text: str) -> None:
        self._append({"kind": "warning", "text": text})

    def describe_class(self, info: ClassInfo, **facts: Any) -> None:
        self._append({"kind": "class", **info.__dict__, **facts})


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    entries = []
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # cut off when the grader died
            if isinstance(entry, dict):
                entries.append(entry)
    return entries


def read_journals(folders: list[Path]) -> tuple[ClassInfo, list[dict[str, Any]]]:
    """The merged class description and the latest graded entry per (learner, notebook)."""
    info = ClassInfo()
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for folder in folders:
        entries = _read(Path(folder) / JOURNAL)
        classes = [e for e in entries if e.get("kind") == "class"]
        if classes:
            last = classes[-1]
            info.learners = sorted(set(info.learners) | set(last.get("learners", [])))
            for slug in last.get("assigned", []):
                if slug not in info.assigned:
                    info.assigned.append(slug)
            info.exercises.update(last.get("exercises", {}))
            info.titles.update(last.get("titles", {}))
            info.shards += [s for s in last.get("shards", []) if s not in info.shards]
            info.warnings += [w for w in last.get("warnings", []) if w not in info.warnings]
        info.warnings += [e["text"] for e in entries
                          if e.get("kind") == "warning" and e.get("text") not in info.warnings]
        for entry in entries:
            if entry.get("kind") == "graded" and entry.get("rows"):
                first = entry["rows"][0]
                latest[(first.get("learner", ""), first.get("notebook", ""))] = entry
    return info, list(latest.values())
