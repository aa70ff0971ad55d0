"""What every check shares: calling the learner's code safely, turning its answer into a tensor,
comparing it with an oracle, naming the likely mistake, and reporting in one line.

A check is an ordinary function decorated with :func:`check`. Inside it, call the learner's code
through :func:`call`, convert what comes back with :func:`as_tensor`, and fail with :func:`fail`
(or the helpers built on it). The decorator guarantees the contract the notebooks rely on:

* success prints one short line that starts with a tick;
* a wrong answer raises :class:`CheckFailed` (an ``AssertionError``) whose message names the mistake;
* a function that still raises ``NotImplementedError`` raises :class:`NotAttempted`, whose message
  contains "not attempted";
* anything unexpected (a list instead of a tensor, a wrong shape, NaN, an exception in the learner's
  code, even a bug in the check itself) becomes a message saying what was expected, never a raw
  traceback from inside the check.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

__all__ = [
    "CheckFailed",
    "NotAttempted",
    "check",
    "call",
    "fail",
    "as_tensor",
    "expect_shape",
    "expect_finite",
    "expect_close",
    "same",
    "diagnose",
    "describe",
]


class CheckFailed(AssertionError):
    """The learner's answer is wrong; the message says how and, where it can, why."""


class NotAttempted(CheckFailed):
    """The learner's function still raises NotImplementedError."""


def fail(message: str) -> None:
    """Stop the check with ``message`` (no traceback from the check itself)."""
    raise CheckFailed(message)


def describe(value: Any) -> str:
    """A short human description of a value: ``tensor (2, 5) float32`` / ``ndarray (3,) float64``."""
    if isinstance(value, torch.Tensor):
        return f"tensor {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"
    if isinstance(value, np.ndarray):
        return f"ndarray {value.shape} {value.dtype}"
    if value is None:
        return "None"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of length {len(value)}"
    if isinstance(value, (int, float, bool, str)):
        return f"{type(value).__name__} {value!r}"
    return type(value).__name__


def _function_name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def call(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call the learner's ``fn`` and translate what can go wrong into a clear message.

    Tensor and array arguments are cloned so that a function that writes into its input cannot
    corrupt the check's own data.
    """
    name = _function_name(fn)

    def fresh(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return a.detach().clone().requires_grad_(a.requires_grad)
        if isinstance(a, np.ndarray):
            return a.copy()
        return a

    args = tuple(fresh(a) for a in args)
    kwargs = {k: fresh(v) for k, v in kwargs.items()}
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise NotAttempted(
            f"not attempted yet: `{name}` still raises NotImplementedError. "
            "Replace the `raise NotImplementedError()` line with your code, run that cell, then this one."
        ) from None
    except CheckFailed:
        raise
    except Exception as exc:  # the learner's code raised: report it with the inputs it was given
        shown = ", ".join([describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()])
        raise CheckFailed(
            f"`{name}({shown})` raised {type(exc).__name__}: {exc}"
        ) from None


def as_tensor(value: Any, what: str = "your function's result", *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Turn a tensor, a NumPy array or a NumPy/Python scalar into a tensor, or explain what was expected."""
    if isinstance(value, torch.Tensor):
        out = value.detach()
    elif isinstance(value, np.ndarray):
        if value.dtype == object:
            fail(f"{what} is a NumPy array of Python objects; expected numbers (a float array or a tensor).")
        out = torch.from_numpy(np.ascontiguousarray(value))
    elif isinstance(value, (np.floating, np.integer, float, int)) and not isinstance(value, bool):
        out = torch.tensor(float(value), dtype=torch.float64)
    elif value is None:
        fail(f"{what} is None: did the function forget to `return` its result?")
    elif isinstance(value, (list, tuple)):
        fail(
            f"{what} is a Python {type(value).__name__}; expected a torch.Tensor (or a NumPy array). "
            "Build it with tensor operations, or wrap it with torch.stack / torch.tensor."
        )
    else:
        fail(f"{what} is a {type(value).__name__}; expected a torch.Tensor (or a NumPy array).")
    if dtype is not None:
        out = out.to(dtype)
    return out


def expect_shape(t: torch.Tensor, shape: Sequence[int], what: str = "your result", hint: str = "") -> None:
    """Fail unless ``t`` has exactly ``shape``."""
    if tuple(t.shape) != tuple(shape):
        msg = f"{what} has shape {tuple(t.shape)}, expected {tuple(shape)}."
        if hint:
            msg += " " + hint
        fail(msg)


def expect_finite(t: torch.Tensor, what: str = "your result", hint: str = "") -> None:
    """Fail if ``t`` holds NaN or ±inf, saying how many and where the first one is."""
    bad = ~torch.isfinite(t)
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        kinds = []
        if torch.isnan(t).any():
            kinds.append("NaN")
        if torch.isinf(t).any():
            kinds.append("inf")
        msg = f"{what} contains {' and '.join(kinds)} ({int(bad.sum())} entries, first at index {first})."
        if hint:
            msg += " " + hint
        fail(msg)


def same(a: torch.Tensor, b: torch.Tensor, *, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    """True when two tensors have the same shape and agree within tolerance (compared in float64)."""
    if tuple(a.shape) != tuple(b.shape):
        return False
    a64, b64 = a.detach().to(torch.float64), b.detach().to(torch.float64)
    return bool(torch.allclose(a64, b64, atol=atol, rtol=rtol, equal_nan=True))


def diagnose(actual: torch.Tensor, pitfalls: Iterable[tuple[str, Any]], *, atol: float = 1e-5, rtol: float = 1e-4) -> str | None:
    """Return the message of the first known mistake whose output ``actual`` reproduces.

    ``pitfalls`` holds ``(message, wrong_output)`` pairs: what a learner who made that mistake would
    have returned. ``wrong_output`` may be a tensor or a zero-argument function producing one (so a
    pitfall that cannot be computed for this input is simply skipped).
    """
    for message, wrong in pitfalls:
        try:
            wrong_t = wrong() if callable(wrong) else wrong
        except Exception:
            continue
        if isinstance(wrong_t, torch.Tensor) and same(actual, wrong_t, atol=atol, rtol=rtol):
            return message
    return None


def expect_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    what: str = "your result",
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    pitfalls: Iterable[tuple[str, Any]] = (),
    case: str = "",
) -> None:
    """Fail unless ``actual`` matches ``expected``; name the mistake when a pitfall explains it."""
    where = f" ({case})" if case else ""
    if tuple(actual.shape) != tuple(expected.shape):
        hint = diagnose(actual, pitfalls, atol=atol, rtol=rtol)
        fail(f"{what}{where} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}." + (f" {hint}" if hint else ""))
    if same(actual, expected, atol=atol, rtol=rtol):
        return
    hint = diagnose(actual, pitfalls, atol=atol, rtol=rtol)
    a64, e64 = actual.to(torch.float64), expected.to(torch.float64)
    diff = (a64 - e64).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    worst = tuple(int(i) for i in torch.nonzero(diff == diff.max())[0]) if diff.numel() else ()
    detail = (
        f"largest difference {diff.max().item():.3g} at index {worst}: "
        f"got {a64[worst].item():.4g}, expected {e64[worst].item():.4g}"
        if diff.numel()
        else ""
    )
    msg = f"{what}{where} does not match the expected values"
    msg += f" — {hint}" if hint else "."
    if detail:
        msg += f" ({detail})"
    fail(msg)


def _require_callable(fn: Any, name: str, expects: str) -> None:
    if not callable(fn):
        fail(f"expected {expects}; got {describe(fn)}. Pass the function itself, e.g. `{name}(my_function)`, without calling it.")


def check(exercise: str, *, expects: str = "a function") -> Callable[[Callable[..., Any]], Callable[..., None]]:
    """Decorate a check: report success in one line and every failure as a clear message.

    ``exercise`` names the exercise in messages and in the grading table; ``expects`` says what the
    check's first argument should be, for the message shown when it is something else.
    The decorated check should return a short summary of what it verified (or ``None``).
    """

    def decorate(body: Callable[..., Any]) -> Callable[..., None]:
        params = list(inspect.signature(body).parameters.values())
        wants_callable = bool(params) and params[0].name in {"fn", "func", "function", "module_cls", "cls"}

        @functools.wraps(body)
        def run(*args: Any, **kwargs: Any) -> None:
            try:
                if wants_callable:
                    if not args:
                        fail(f"expected {expects} as the first argument, e.g. `{body.__name__}(my_function)`.")
                    _require_callable(args[0], body.__name__, expects)
                summary = body(*args, **kwargs)
            except NotAttempted as exc:
                raise NotAttempted(f"{exercise}: {exc}") from None
            except CheckFailed as exc:
                raise CheckFailed(f"{exercise}: {exc}") from None
            except Exception as exc:  # a case nobody foresaw: still a message, not the check's traceback
                raise CheckFailed(
                    f"{exercise}: could not check the answer ({type(exc).__name__}: {exc}). "
                    f"Expected {expects}."
                ) from None
            print(f"✓ {exercise}: " + (summary or "passed"))

        run.exercise = exercise  # read by the grader and the tests
        return run

    return decorate
