"""Calling the learner's function: the learner-side probes that say which inputs a call changed in place
(:func:`call`, :func:`call_with`) and the diagnosis when it did (:func:`expect_unchanged`); a caller for
functions written for tensors or for NumPy arrays (:class:`TensorOrArray`); the signature an exercise fixes
(:func:`expect_signature`)."""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..boundary import LearnerNotAttempted, LearnerRaised, LearnerTimedOut, probe
from ..compare import fail

__all__ = ["CALL", "arrays", "call", "expect_unchanged", "TensorOrArray", "CALL_WITH", "call_with", "expect_signature"]


#: The probe :func:`call` is registered under this name (``learner.observe(kit.CALL, *args)``).
CALL = "attn_course.checks.kit.call"


def arrays(args: tuple) -> tuple:
    """``args`` with every tensor handed over as a NumPy array (sharing its memory)."""
    return tuple(a.numpy() if isinstance(a, torch.Tensor) else a for a in args)


def _unchanged(now: Any, before: Any) -> bool:
    if isinstance(before, np.ndarray):
        return now.shape == before.shape and now.dtype == before.dtype and bool(
            np.array_equal(now, before, equal_nan=before.dtype.kind in "fc"))
    return now.shape == before.shape and now.dtype == before.dtype and (torch.equal(now, before) or (
        now.is_floating_point() and bool(((now == before) | (now.isnan() & before.isnan())).all())))


@probe(CALL)
def call(fn: Callable, *args: Any, numpy: bool = False, apply: bool = False,
         result: bool = True) -> tuple[Any, list[int]]:
    """Learner side: ``fn(*args)`` and the positions of the tensor arguments it changed in place (compared with
    copies taken before the call). ``apply``: call ``fn.apply`` (an autograd Function); ``numpy``: hand the
    tensors over as NumPy arrays; ``result=False``: send back None for the result (only the positions cross)."""
    args = arrays(args) if numpy else args
    before = [a.copy() if isinstance(a, np.ndarray) else a.clone() if isinstance(a, torch.Tensor) else None
              for a in args]
    out = (fn.apply if apply else fn)(*args)
    return (out if result else None), [i for i, (a, b) in enumerate(zip(args, before))
                                       if b is not None and not _unchanged(a, b)]


def _in_the_other_float(args: tuple) -> tuple | None:
    """``args`` with every float32 tensor made float64 and every float64 one float32 (None when there is none): a
    conversion to the dtype a tensor already has (``x.to(torch.float64)``, ``x.double()``) returns the tensor itself,
    so an in-place step after it changes the caller's tensor for that dtype only."""
    other = {torch.float32: torch.float64, torch.float64: torch.float32}
    if not any(isinstance(a, torch.Tensor) and a.dtype in other for a in args):
        return None
    return tuple(a.to(other[a.dtype]) if isinstance(a, torch.Tensor) and a.dtype in other else a for a in args)


def expect_unchanged(fn: Any, args: tuple, *, call: str, name: str, shown: str, numpy: bool = False,
                     apply: bool = False, others: tuple[str, ...] = ()) -> None:
    """Fail when the learner's code changes its first argument (called ``name``; ``shown`` describes it) in place,
    or one of the next ones named in ``others``, measured by the probe :func:`call` on ``args`` and on the same
    values in the other floating dtype (float32 ↔ float64). Raising or timing out here says nothing: the cases
    already ran this code."""
    names = (name, *others)
    for given, where in ((args, shown), (_in_the_other_float(args), "the same values in the other floating dtype")):
        if given is None:
            continue
        try:
            _, changed = fn.observe(CALL, *given, numpy=numpy, apply=apply, result=False)
        except (LearnerRaised, LearnerTimedOut):
            continue
        if changed := [i for i in changed if i < len(names)]:
            name = names[changed[0]]
            fail(f"{name} changed in place", tried=f"{call} on {where}, comparing {name} with a copy taken before the "
                 "call", got=f"after the call, {name} no longer holds the values it was given",
                 expected=f"{name} left as it was: the function only reads it",
                 cause="an in-place operation on the input (x -= …, x /= …, x.sub_(…), x.exp_(), x[…] = … or out=x) "
                       "overwrites "
                       "the caller's tensor" + ("" if given is args else "; in this dtype a conversion such as "
                       "x.to(torch.float64) or x.float() returned x itself, so the in-place step after it reached "
                       "the caller's tensor"),
                 fix="compute new tensors (x - m, torch.exp(…)), or start from a copy: x = x.clone()")


class TensorOrArray:
    """Calls a learner's function with tensors, or with NumPy arrays when it only handles those: the first call goes
    with tensors; if it raises, the same call is made once with arrays, and when that works every later call uses
    arrays. When both raise, the error that says more is reported: the one that got further into the learner's code,
    else the one that is not an API mismatch (TypeError, AttributeError), else the tensor one."""

    def __init__(self, fn: Any):
        self.fn, self.mode = fn, ""

    @property
    def kind(self) -> str:
        return "NumPy arrays" if self.mode == "numpy" else "tensors"

    def __call__(self, *args: Any) -> Any:
        if self.mode == "numpy":
            return self.fn(*arrays(args))
        try:
            with warnings.catch_warnings():  # NumPy functions handed tensors warn about __array_wrap__
                warnings.simplefilter("ignore", DeprecationWarning)
                out = self.fn(*args)
        except LearnerRaised as t_err:
            if self.mode:
                raise
            try:
                out = self.fn(*arrays(args))
            except LearnerRaised as a_err:
                further = t_err.line is not None and a_err.line is not None and a_err.line > t_err.line
                telling = (t_err.type_name in ("TypeError", "AttributeError") and a_err.line == t_err.line
                           and a_err.type_name not in ("TypeError", "AttributeError"))
                raise (a_err if further or telling else t_err) from None
            except (LearnerTimedOut, LearnerNotAttempted):
                raise t_err from None
            self.mode = "numpy"
            return out
        self.mode = "torch"
        return out

    def tensor(self, *args: Any) -> Any:
        """The answer on ``args`` as a tensor when it is an array (what :class:`Suspects` runs to tell mistakes
        apart)."""
        out = self(*args)
        return torch.from_numpy(np.asarray(out)) if isinstance(out, np.ndarray) else out


#: The probe :func:`call_with` is registered under this name.
CALL_WITH = "attn_course.checks.kit.call_with"


@probe(CALL_WITH)
def call_with(fn: Callable, *args: Any, **kwargs: Any) -> tuple[Any, list[int]]:
    """Learner side: :func:`call` of ``fn(*args, **kwargs)``: its result, and the positions in ``args`` it changed in
    place."""
    return call(functools.partial(fn, **kwargs), *args)


def expect_signature(fn: Any, names: Sequence[str], *, call: str, signature: str) -> None:
    """Fail unless the learner's function accepts every keyword in ``names`` (or **kwargs), each with a default."""
    params = fn.inspect().get("signature")
    by_name = {p["name"]: p for p in params or ()}
    listed = f"a function with parameters ({', '.join(by_name)})"
    words = dict(tried=f"calling {call}", got=listed, expected=f"the signature {signature}",
                 fix=f"keep the exercise's signature: def {signature}:")
    for n in names if params else ():
        if n not in by_name and not any(p["kind"] == "VAR_KEYWORD" for p in params):
            fail(f"no parameter {n}", cause=f"the parameter `{n}` was removed or renamed", **words)
        if n in by_name and not by_name[n]["has_default"]:
            fail(f"{n} has no default value", cause=f"`{n}` lost its default, so a call without it fails", **words)
