"""A learner's exception explained: a construct of the topic that raises the very same message, else a
pattern of the topic, else the course-wide table of :func:`~..exceptions.explain_exception`
(:func:`explain_raise`; :func:`call_explained` calls the learner's function and ends the check with it); and
the hints several topics share (a tensor asked for one truth value, a signature not kept, a reduction along
the wrong axis)."""

from __future__ import annotations

import re
import warnings
from typing import Any, Callable, Sequence

from ..boundary import LearnerRaised
from ..compare import Failure
from ..exceptions import explain_exception
from ..core import learner_error

__all__ = ["Construct", "Pattern", "explain_raise", "call_explained", "reproduce", "BOOL_HINT", "bool_hint",
           "signature_hint", "reduction_hint", "hard_coded_hint"]


Construct = tuple[str, str, Callable[[], object]]  # (cause, fix, attempt): a known wrong construct, runnable here


Pattern = tuple[str, str, str, str]  # (exception type, regex on its message, cause, fix), as in compare's table


def explain_raise(exc: LearnerRaised, constructs: Sequence[Construct] = (), patterns: Sequence[Pattern] = ()) -> dict:
    """``dict(cause=…, fix=…)`` for a learner's exception, or ``{}`` when nothing is known of it.

    First a construct of the topic that, run here, raises the very same type and message (so it is named only
    when it surely is what the learner wrote); then a pattern of the topic; then the course-wide table
    (:func:`~..exceptions.explain_exception`). ``{0}``, ``{1}``… in a pattern's cause and fix are the regex's match
    and groups."""
    for cause, fix, attempt in constructs:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                attempt()
        except Exception as mine:  # noqa: BLE001
            if type(mine).__name__ == exc.type_name and str(mine) == exc.message:
                return dict(cause=cause, fix=fix)
    for kind, pattern, cause, fix in patterns:
        if kind == exc.type_name and (match := re.search(pattern, exc.message or "")):
            groups = [match.group(0), *match.groups()]
            fill = lambda text: re.sub(r"\{(\d)\}", lambda m: str(groups[int(m.group(1))] or ""), text)  # noqa: E731
            return dict(cause=fill(cause), fix=fill(fix))
    known = explain_exception(exc.type_name, exc.message)
    return dict(cause=known[0], fix=known[1]) if known else {}


def call_explained(fn: Callable, *args: Any, tried: str, expected: str, constructs: Sequence[Construct] = (),
                   patterns: Sequence[Pattern] = ()) -> Any:
    """The learner's ``fn(*args)``; when it raises, end the check with :func:`~.core.learner_error` and the cause and
    fix that :func:`explain_raise` finds (a construct of the topic, a pattern, or the course-wide table)."""
    try:
        return fn(*args)
    except LearnerRaised as exc:
        raise Failure(learner_error(exc, tried=tried, expected=expected,
                                    **explain_raise(exc, constructs, patterns))) from None


def reproduce(attempt: Callable[[], object]) -> str | None:
    """The message ``attempt()`` raises (None if it does not raise)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            attempt()
    except Exception as exc:  # noqa: BLE001
        return str(exc)
    return None


BOOL_HINT = dict(cause="Python asked a tensor for one True/False (`x_kv or x_q`, `if mask:`, `and` / `or` between "
                       "tensors); a tensor of several values has none",
                 fix="test for None instead: `x_q if x_kv is None else x_kv`, `if mask is not None:`")


def bool_hint(exc: LearnerRaised) -> dict:
    """:data:`BOOL_HINT` when the learner's code asked a tensor for one truth value, else nothing."""
    return BOOL_HINT if "Boolean value of Tensor" in exc.message else {}


def signature_hint(exc: LearnerRaised, signature: str) -> dict:
    """``cause``/``fix`` when the learner's function was called with arguments it does not take (a TypeError raised
    before its body ran), else ``{}``."""
    if exc.type_name == "TypeError" and exc.line is None and \
            re.match(r"\S+\(\) (takes|got an unexpected keyword|missing \d+ required)", exc.message):
        return dict(cause="your function does not take the arguments the docstring lists",
                    fix=f"keep the signature {signature}")
    return {}


def reduction_hint(exc: LearnerRaised, *, dim: bool) -> dict:
    """``cause``/``fix`` for the two exceptions a reduction along the wrong axis raises, else ``{}``: a maximum or sum
    without keepdim=True that no longer broadcasts against the input, and an axis number the input does not have
    (``dim``: the function takes a `dim` argument, which the advice is to use)."""
    msg = exc.message
    if "must match the size" in msg or "could not be broadcast" in msg:
        return dict(cause="a maximum or sum reduced without keepdim=True lost the reduced axis, so it no longer lines "
                          "up with the input's axes",
                    fix="keep the reduced axis: .amax(dim, keepdim=True) and .sum(dim, keepdim=True) "
                        "(NumPy: keepdims=True)")
    if ("out of range" in msg and "imension" in msg) or "out of bounds for array" in msg:
        return dict(cause="your code uses an axis number that this input does not have",
                    fix="use the `dim` argument (or -1 for the last axis) rather than a fixed axis number" if dim else
                    "count axes from the end (-1 for the last) rather than with a fixed axis number, and keep every "
                    "axis the input has (no .squeeze() without an axis)")
    return {}


def hard_coded_hint(exc: LearnerRaised, sizes_that_ran: set[int]) -> dict:
    """``dict(cause=…, fix=…)`` when an IndexError names an index that inputs the code ran on had (the largest of
    their axes is in ``sizes_that_ran``) but this input's axis has not: a loop bound that is not the axis's size
    (a number in the code, or another axis's size); else ``{}``."""
    found = re.search(r"index (\d+) is out of bounds for dimension \d+ with size (\d+)", exc.message or "")
    if exc.type_name != "IndexError" or not found or not sizes_that_ran:
        return {}
    index, size = int(found.group(1)), int(found.group(2))
    if not size <= index < max(sizes_that_ran):
        return {}
    return dict(cause=f"your code reached index {index}, past the end of this axis of size {size}, where earlier inputs "
                      "went through: its loop bound is not this axis's size, but a number written into the code "
                      "(such as range(6)) or the size of another axis",
                fix="loop over the size of the axis you index (range(K.shape[0]), or len(K), for K[j]); never write "
                    "a size as a number")
