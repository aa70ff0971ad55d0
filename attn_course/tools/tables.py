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

__all__ = ["format_table", "write_csv", "write_json", "to_plain"]

Row = Sequence[Any] | Mapping[str, Any]


def _cells(row: Row, names: Sequence[str]) -> list[Any]:
    if isinstance(row, Mapping):
        return [row.get(name) for name in names]
    values = list(row)
    if len(values) != len(names):
        raise ValueError(f"a row has {len(values)} values for {len(names)} columns: {values!r}")
    return values


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(value: Any, fmt: str | Callable[[Any], str] | None, missing: str) -> str:
    if value is None:
        return missing
    if callable(fmt):
        return str(fmt(value))
    if fmt:
        return format(value, fmt)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return f"{value:.4g}"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken at spaces where possible."""
    lines: list[str] = []
    for paragraph in text.splitlines() or [""]:
        line = ""
        for word in paragraph.split(" "):
            while len(word) > width:  # a word longer than the column: cut it
                if line:
                    lines.append(line)
                    line = ""
                lines.append(word[:width])
                word = word[width:]
            if line and len(line) + 1 + len(word) > width:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return lines


def format_table(headers: Sequence[str], rows: Iterable[Row], *,
                 formats: Mapping[str, str | Callable[[Any], str]] | None = None,
                 align: Mapping[str, str] | None = None, missing: str = "—", sep: str = "  ",
                 max_width: int | None = None, flex: str | None = None, overflow: str = "wrap") -> str:
    """A plain-text table.

    ``headers``: the column titles; ``rows``: sequences in that order, or mappings keyed by the titles.
    ``formats``: per column, a format spec (``".2f"``) or a function of the value; by default floats
    get 4 significant digits, booleans "yes"/"no", ``None`` becomes ``missing``. ``align``: per column
    ``"<"`` or ``">"``; by default a column whose values are all numbers is right-aligned.
    ``max_width``: when the table would be wider, the column ``flex`` (default: the widest column of
    text) is narrowed to fit, its cells wrapped onto continuation lines (``overflow="wrap"``) or cut
    with "…" (``overflow="truncate"``). Returns the table without a trailing newline.
    """
    if overflow not in ("wrap", "truncate"):
        raise ValueError(f"overflow must be 'wrap' or 'truncate', got {overflow!r}")
    headers = [str(h) for h in headers]
    formats, align = dict(formats or {}), dict(align or {})
    raw = [_cells(row, headers) for row in rows]
    text = [[_text(v, formats.get(h), missing) for h, v in zip(headers, row)] for row in raw]
    sides = []
    for j, h in enumerate(headers):
        values = [row[j] for row in raw if row[j] is not None]
        sides.append(align.get(h, ">" if values and all(_is_number(v) for v in values) else "<"))
    widths = [max([len(h)] + [len(line) for row in text for line in row[j].splitlines() or [""]])
              for j, h in enumerate(headers)]
    total = sum(widths) + len(sep) * (len(headers) - 1)
    if max_width is not None and total > max_width and headers:
        if flex is None:
            text_columns = [j for j, side in enumerate(sides) if side == "<"] or list(range(len(headers)))
            j_flex = max(text_columns, key=lambda j: widths[j])
        else:
            j_flex = headers.index(flex)
        widths[j_flex] = max(len(headers[j_flex]), 8, widths[j_flex] - (total - max_width))
    lines = [sep.join(f"{h:{sides[j]}{widths[j]}}" for j, h in enumerate(headers)).rstrip()]
    lines.append("-" * min(sum(widths) + len(sep) * (len(headers) - 1), max_width or 10**9))
    for row in text:
        cells = []
        for j, cell in enumerate(row):
            if len(cell) <= widths[j] and "\n" not in cell:
                cells.append([cell])
            elif overflow == "truncate":
                first = cell.splitlines()[0] if cell else ""
                cells.append([first if len(first) <= widths[j] else first[:widths[j] - 1] + "…"])
            else:
                cells.append(_wrap(cell, widths[j]))
        for k in range(max(len(c) for c in cells) if cells else 1):
            parts = [f"{(c[k] if k < len(c) else ''):{sides[j]}{widths[j]}}" for j, c in enumerate(cells)]
            lines.append(sep.join(parts).rstrip())
    return "\n".join(lines)


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
    dicts and lists are written as JSON text.
    """
    fields = [str(f) for f in fields]

    def cell(value: Any) -> Any:
        if value is None:
            return ""
        if isinstance(value, (Mapping, list, tuple, set)) or dataclasses.is_dataclass(value):
            return json.dumps(to_plain(value), ensure_ascii=False)
        return to_plain(value)

    def write(f) -> None:
        writer = csv.writer(f)
        writer.writerow(fields)
        for row in rows:
            writer.writerow([cell(v) for v in _cells(row, fields)])

    return _replace(Path(path), write, encoding="utf-8-sig", newline="")


def write_json(path: str | os.PathLike, data: Any, *, indent: int = 1) -> Path:
    """Write ``data`` (made plain by :func:`to_plain`) as UTF-8 JSON with a final newline; return the path."""

    def write(f) -> None:
        json.dump(to_plain(data), f, indent=indent, ensure_ascii=False, allow_nan=False)
        f.write("\n")

    return _replace(Path(path), write, encoding="utf-8")
