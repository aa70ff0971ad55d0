"""Where a course checkout keeps its parts. The package never computes repository paths from its own
location: tools take folders as arguments, and their defaults are found from the **course root**,
the nearest folder at or above the current directory that holds both ``solutions/`` and
``notebooks/`` (or the folder named by ``--root`` / the ``ATTN_COURSE_ROOT`` environment variable).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Layout", "find_root"]

ROOT_ENV = "ATTN_COURSE_ROOT"


def find_root(start: Path | None = None) -> Path | None:
    """The course root at or above ``start`` (default: the current directory), or None."""
    if os.environ.get(ROOT_ENV):
        return Path(os.environ[ROOT_ENV]).resolve()
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "solutions").is_dir() and (folder / "notebooks").is_dir():
            return folder
    return None


@dataclass(frozen=True)
class Layout:
    """The folders of one course checkout."""

    root: Path

    @classmethod
    def find(cls, start: Path | None = None) -> "Layout":
        root = find_root(start)
        if root is None:
            raise FileNotFoundError("not inside the course's folder (no solutions/ and notebooks/ here or above); "
                                    f"run from the course folder, or set {ROOT_ENV}")
        return cls(root)

    @property
    def solutions(self) -> Path:
        return self.root / "solutions"

    @property
    def notebooks(self) -> Path:
        return self.root / "notebooks"

    @property
    def docs(self) -> Path:
        return self.root / "docs"
