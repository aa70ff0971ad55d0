"""One check per exercise, grouped by notebook topic (``attn_course.checks.<topic>``).

Every check follows the contract in :mod:`attn_course.checks._core`: one short line on success,
an ``AssertionError`` naming the likely mistake otherwise, "not attempted" for an unfinished function.
"""

from ._core import CheckFailed, NotAttempted, check  # noqa: F401
