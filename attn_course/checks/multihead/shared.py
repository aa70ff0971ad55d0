"""What the three checks of notebook 07 share: :class:`Sized` mistakes, the exception patterns, a word list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..core import Mistake
from ..kit import Known


@dataclass(frozen=True)
class Sized(Known):
    """A :class:`~..kit.Known` whose texts name the case's sizes: ``{A}``, ``{d_head}``… from ``sizes(*case)``."""

    sizes: Callable[..., dict] = lambda *case: {}

    def on(self, case: tuple) -> Mistake:
        s = self.sizes(*case)
        return Mistake(self.summary.format(**s), self.cause.format(**s), self.fix.format(**s), lambda: self.make(*case))


#: Exceptions whose message says what the code did (type, regex, cause, fix), before the course-wide table.
PATTERNS = [("RuntimeError", r"view size is not compatible|contiguous", "`.view` needs memory laid out in the new "
              "shape, and `.transpose` gives a tensor whose memory is not (a non-contiguous one)",
              "use `.reshape(...)`, or `.contiguous().view(...)`, after the transpose")]


def and_(words: list[str]) -> str:
    return " and ".join(words) if len(words) < 3 else ", ".join(words[:-1]) + " and " + words[-1]
