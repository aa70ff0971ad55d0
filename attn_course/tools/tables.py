"""Text tables, CSV and JSON, written one way for every tool of the course (grading, bench, budgets…).

Three functions, each small and documented:

* :func:`format_table` — a plain-text table for a terminal: one header line, a rule, one line per row;
  numbers right-aligned, text left-aligned; a table wider than ``max_width`` wraps (or truncates) its
  widest text column so that it fits (a grade table fits a 100-column terminal);
* :func:`write_csv` — rows to a CSV file in UTF-8 *with a byte-order mark*, so that Excel opens names
  such as "José María Ñúñez" correctly (without the mark it assumes the system's code page);
* :func:`write_json` — data to a JSON file in UTF-8 (non-ASCII kept as is), written atomically.

Rows may be sequences (in the order of the headers or fields) or mappings (looked up by header or
field name). ``None`` is written as an empty cell in CSV and as ``missing`` ("—") in a text table.
Dataclasses, paths, enums, sets and tuples are turned into plain JSON values by :func:`to_plain`.
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..tables import Row, row_cells, format_table  # the text table lives with the learner runtime

__all__ = ["format_table", "write_csv", "write_json", "to_plain"]


def to_plain(value: Any) -> Any:
    """``value`` as plain JSON data: dataclasses → dicts, paths → strings, enums → their value,
    tuples and sets → lists, non-finite floats → None (JSON has no NaN); anything else unknown → str."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return to_plain(value.value)
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return [to_plain(v) for v in items]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def _replace(path: Path, write: Callable[[Any], None], **open_kwargs: Any) -> Path:
    """Write through a temporary file in the same folder, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", **open_kwargs) as f:
        write(f)
    os.replace(tmp, path)
    return path


def write_csv(path: str | os.PathLike, rows: Iterable[Row], fields: Sequence[str]) -> Path:
    """Write ``rows`` under the header ``fields`` to ``path`` (folders created) and return the path.

    Rows are mappings (keys not in ``fields`` are left out) or sequences in the order of ``fields``.
    The file is UTF-8 with a byte-order mark (Excel reads accents right), ``None`` is an empty cell,
    dicts and lists are written as JSON text. A text cell that a spreadsheet would run as a formula (it starts
    with =, +, -, @, a tab or a carriage return: a learner's name or message can) gets a leading ' so that it
    is shown as text; numbers are written as numbers.
    """
    fields = [str(f) for f in fields]

    def cell(value: Any) -> Any:
        if value is None:
            return ""
        if isinstance(value, (Mapping, list, tuple, set)) or dataclasses.is_dataclass(value):
            return _as_text(json.dumps(to_plain(value), ensure_ascii=False))
        plain = to_plain(value)
        return _as_text(plain) if isinstance(plain, str) else plain

    def write(f) -> None:
        writer = csv.writer(f)
        writer.writerow(fields)
        for row in rows:
            writer.writerow([cell(v) for v in row_cells(row, fields)])

    return _replace(Path(path), write, encoding="utf-8-sig", newline="")


def _as_text(text: str) -> str:
    """``text``, with a leading ' when a spreadsheet would read it as a formula (OWASP's advice on CSV injection)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def write_json(path: str | os.PathLike, data: Any, *, indent: int = 1) -> Path:
    """Write ``data`` (made plain by :func:`to_plain`) as UTF-8 JSON with a final newline; return the path."""

    def write(f) -> None:
        json.dump(to_plain(data), f, indent=indent, ensure_ascii=False, allow_nan=False)
        f.write("\n")

    return _replace(Path(path), write, encoding="utf-8")
