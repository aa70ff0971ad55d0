"""What the learner's function returned, as the tensors a check compares: one tensor (:func:`tensor_answer`),
a tuple of them (:func:`unpack`), or a diagnosis of what came back instead; :func:`preview` shows one;
:func:`expect_not_kept`, a result that an earlier call returned."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..compare import as_tensor, fail, fmt

__all__ = ["tensor_answer", "unpack", "preview", "expect_not_kept", "kept_cause", "KEPT_FIX"]


def tensor_answer(value: Any, *, tried: str, what: str = "your function") -> torch.Tensor:
    """A learner's answer as a tensor (:func:`~.compare.as_tensor`), a NumPy array named as such: the docstrings ask
    for torch tensors, and an array means the computation left torch on the way."""
    if isinstance(value, np.ndarray):
        fail("returned a NumPy array, not a tensor", tried=tried, got=f"a NumPy array of shape {value.shape} "
             f"({value.dtype})", expected="a torch tensor, as the docstring says",
             cause="you converted to NumPy along the way (.numpy(), np.asarray or a NumPy function)",
             fix="stay with torch operations (torch.from_numpy(array) turns an array back into a tensor)")
    return as_tensor(value, tried=tried, what=what)


def unpack(result: Any, names: Sequence[str], *, tried: str, fix: str = "") -> tuple[torch.Tensor, ...]:
    """The tensors of a returned tuple (``names``: what each element is, e.g. ``("output", "weights")``), or a
    diagnosis of what came back instead: one tensor, another number of items, None, NumPy arrays, or an element that
    is a Python list of tensors. ``fix`` says how the function should end (default: ``return <names>``)."""
    want = f"({', '.join(names)})"
    fix = fix or f"end the function with `return {', '.join(names)}`"
    expected = f"a tuple of {len(names)} tensors {want}"
    if isinstance(result, torch.Tensor):
        fail(f"returned one tensor, not {want}", tried=tried, got=f"one tensor of shape {tuple(result.shape)}",
             expected=expected, fix=fix)
    if not isinstance(result, (tuple, list)) or len(result) != len(names):
        got = f"a {type(result).__name__} of {len(result)} items" if isinstance(result, (tuple, list)) else \
            ("None" if result is None else type(result).__name__)
        fail(f"did not return {want}", tried=tried, got=got, expected=expected, fix=fix,
             cause="your function has no `return`" if result is None else "")
    if any(isinstance(r, np.ndarray) for r in result):
        fail("returned NumPy arrays, not tensors", tried=tried, expected=f"{len(names)} torch tensors {want}",
             got=", ".join(f"{n}: {'a NumPy array' if isinstance(r, np.ndarray) else type(r).__name__}"
                           for n, r in zip(names, result)),
             cause="part of your computation went through NumPy (.numpy(), np.exp, np.matmul…), which returns arrays",
             fix="stay with torch operations on the tensors")
    for name, item in zip(names, result):
        if isinstance(item, (list, tuple)) and item and all(isinstance(t, torch.Tensor) for t in item):
            shapes = ", ".join(str(tuple(t.shape)) for t in item)
            fail(f"{name} returned as a list of {len(item)} tensors", tried=tried,
                 got=f"a list of tensors of shapes {shapes}",
                 expected="one tensor", cause=f"your {name} holds the pieces ({shapes}) side by side in a Python list "
                 "instead of one tensor made of them", fix="join them into one tensor with torch.cat or torch.stack")
    ordinals = ("first", "second", "third", "fourth", "fifth")
    return tuple(as_tensor(r, tried=tried, what=f"the {n} ({ordinals[i]} element)")
                 for i, (n, r) in enumerate(zip(names, result)))


def preview(t: torch.Tensor, n: int = 6) -> str:
    """``shape (4,): 0.7, 0.14, -0.14, 0.51`` (at most ``n`` entries)."""
    flat = t.detach().reshape(-1).to(torch.float64)
    shown = ", ".join(fmt(float(v)) for v in flat[:n]) + (", …" if flat.numel() > n else "")
    return f"shape {tuple(t.shape)}: {shown}" if flat.numel() else f"shape {tuple(t.shape)} (empty)"


def kept_cause(keyed_by: str = "the shapes") -> str:
    """The cause for a result kept between calls, whose cache is keyed by ``keyed_by`` (what it was found to ignore)."""
    return (f"your function returns a result kept from an earlier call (a cache keyed by {keyed_by}, or a value stored "
            "in a global or a default argument) instead of computing it from the values it is given")
KEPT_FIX = "compute the result from the arguments on every call, and keep nothing from one call to the next"


def expect_not_kept(got: Any, expected: Any, earlier: Sequence[tuple[str, Any, Any]], *, tried: str, what: str,
                    close: Callable[[Any, Any], bool]) -> None:
    """Fail when ``got`` (a tensor, or a tuple of them) is exactly what the learner's function returned on an earlier
    call with inputs of the same shapes whose right result differs from ``expected`` (``close(right, expected)`` is
    False): a result kept between calls. ``earlier``: (that call's inputs in words, its result, its right result)."""
    items = lambda x: tuple(x) if isinstance(x, (tuple, list)) else (x,)  # noqa: E731
    for name, old, right in earlier:
        if len(items(got)) == len(items(old)) and all(
                isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and
                torch.equal(a.double(), b.double()) for a, b in zip(items(got), items(old))) and not close(right, expected):
            fail("an earlier result returned again", tried=tried,
                 got=f"{what}: exactly what your function returned on {name}, inputs of the same shapes with other "
                     "values", expected="a result computed from these inputs' values", cause=kept_cause(), fix=KEPT_FIX)
