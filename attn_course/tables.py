"""Plain-text tables for a terminal or a notebook's output (learner runtime: notebook 09's benchmark
table, recorded results, the datasheet table). The course's tools (:mod:`attn_course.tools.tables`)
re-export :func:`format_table` next to their CSV and JSON writers, so every table is written one way.

:func:`format_table`: one header line, a rule, one line per row; numbers right-aligned, text
left-aligned; a table wider than ``max_width`` wraps (or truncates) its widest text column so that
it fits. Rows may be sequences (in the order of the headers) or mappings (looked up by header).
``None`` is written as ``missing`` ("—").
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = ["format_table", "row_cells"]

Row = Sequence[Any] | Mapping[str, Any]


def row_cells(row: Row, names: Sequence[str]) -> list[Any]:
    """A row's values in the order of ``names`` (a mapping is looked up by name; a sequence must match)."""
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
    raw = [row_cells(row, headers) for row in rows]
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
