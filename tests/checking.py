"""Assertions shared by the pitfall tests: a check must reject a mistake *with its diagnosis*,
and accept a correct alternative with its one-line success message."""

import pytest

from attn_course.checks._core import CheckFailed, NotAttempted


def rejects(check, fn, *phrases, kind=CheckFailed, **kwargs):
    """Assert ``check(fn)`` fails with an exception of ``kind`` whose message has every phrase."""
    with pytest.raises(kind) as info:
        check(fn, **kwargs)
    message = str(info.value)
    if kind is not NotAttempted:
        assert not isinstance(info.value, NotAttempted), f"a real mistake was reported as not attempted: {message}"
    for phrase in phrases:
        assert phrase in message, f"{phrase!r} not in: {message}"
    return message


def accepts(check, fn, capsys, **kwargs):
    """Assert ``check(fn)`` passes and prints its one-line success message."""
    check(fn, **kwargs)
    out = capsys.readouterr().out
    assert out.startswith("✓") and out.count("\n") == 1, out
    return out


def unfinished(*args, **kwargs):
    """A learner's function before any work: the exercise stub."""
    raise NotImplementedError()
