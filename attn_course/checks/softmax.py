"""Checks for notebook 03 (softmax, stably): stable_softmax, logsumexp, log_softmax, temperature.

Each check compares the learner's function with PyTorch's own (``torch.softmax``,
``torch.logsumexp``, ``torch.log_softmax``) on ordinary scores, along several axes, and on the
edge cases that break careless versions: scores near ±1000 (overflow / underflow of e^x), rows far
apart (a maximum taken over the whole tensor), ``-inf`` entries (masked scores), tiny
probabilities (log of 0). Functions written for tensors or for NumPy arrays are both accepted: the
check tries tensors first and switches to arrays when the function only handles those.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable

import torch

from ._core import CheckFailed, NotAttempted, as_tensor, call, check, diagnose, expect_close, expect_shape, same

__all__ = ["check_stable_softmax", "check_logsumexp", "check_log_softmax", "check_softmax_temperature"]

INF = float("inf")

# ---------------------------------------------------------------------------------------------
# Messages naming the mistakes (shared by the checks; the tests assert on their key phrases).

NO_MAX = (
    "the maximum was not subtracted before exponentiating: e^x overflows to inf for scores near "
    "1000 (and underflows to 0 near -1000), giving NaN. Subtract the maximum along `dim` first "
    "(softmax is unchanged by a shift)."
)
GLOBAL_MAX = (
    "the maximum was taken over the whole tensor instead of along `dim`: a row whose scores lie "
    "far below the overall maximum underflows to all zeros (then 0/0 = NaN). Use the maximum of "
    "each slice, e.g. x.amax(dim, keepdim=True)."
)
WRONG_AXIS = (
    "it normalises along the wrong axis (the slices along another axis sum to 1, e.g. columns "
    "instead of rows): reduce along `dim` in both the max and the sum, with keepdim=True."
)
PLAIN_NORMALISATION = (
    "it divides the scores by their sum without exponentiating: weights can be negative or blow "
    "up. Softmax exponentiates first: e^x / Σ e^x."
)


BROADCAST_HINT = (
    " A reduction without keepdim=True loses the reduced axis, so the result no longer broadcasts "
    "against x: keep it (keepdim=True / keepdims=True)."
)


def _with_broadcast_hint(error: CheckFailed) -> CheckFailed:
    text = str(error)
    if "must match the size" in text or "could not be broadcast" in text:
        return CheckFailed(text + BROADCAST_HINT)
    return error


def _adapt(fn: Callable, name: str) -> Callable[..., torch.Tensor]:
    """Call ``fn`` with tensors, or with NumPy arrays when it only works on those; return a tensor.

    Tensors are tried first. When the tensor call fails (raises, or returns something that is not
    an array), the same inputs are tried as NumPy arrays; if that works, the rest of the check uses
    arrays. When neither works, the tensor call's message is reported.
    """
    mode: dict[str, str] = {}

    def numpyfy(a: Any) -> Any:
        return a.detach().numpy() if isinstance(a, torch.Tensor) else a

    def attempt(kind: str, args: tuple, what: str) -> torch.Tensor:
        args = tuple(numpyfy(a) for a in args) if kind == "numpy" else args
        with warnings.catch_warnings():  # NumPy functions applied to tensors warn about __array_wrap__
            warnings.simplefilter("ignore", DeprecationWarning)
            return as_tensor(call(fn, *args), what)

    def run(*args: Any, what: str = "") -> torch.Tensor:
        what = what or f"{name}(…)"
        if mode.get("kind") == "numpy":
            return attempt("numpy", args, what)
        try:
            out = attempt("torch", args, what)
            mode["kind"] = "torch"
            return out
        except NotAttempted:
            raise
        except CheckFailed as torch_error:
            try:
                out = attempt("numpy", args, what)
            except NotAttempted:
                raise
            except CheckFailed:
                raise _with_broadcast_hint(torch_error) from None
            mode["kind"] = "numpy"
            return out

    run.mode = mode  # type: ignore[attr-defined]
    return run


def _kind(run) -> str:
    return "NumPy arrays" if run.mode.get("kind") == "numpy" else "tensors"


def _compare(
    actual: torch.Tensor,
    expected: torch.Tensor,
    what: str,
    case: str,
    pitfalls: Iterable[tuple[str, Any]] = (),
    hints: Iterable[Callable[[torch.Tensor], str | None]] = (),
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> None:
    """Like ``expect_close``, but when no pitfall reproduces the answer, ask property ``hints``."""
    pitfalls = list(pitfalls)
    if tuple(actual.shape) == tuple(expected.shape) and same(actual, expected, atol=atol, rtol=rtol):
        return
    message = diagnose(actual, pitfalls, atol=atol, rtol=rtol)
    if message is None:
        for hint in hints:
            try:
                message = hint(actual)
            except Exception:
                message = None
            if message:
                break
    if message is None and not torch.isfinite(actual).all():
        kinds = " and ".join(k for k, bad in (("NaN", torch.isnan(actual)), ("inf", torch.isinf(actual))) if bad.any())
        message = f"it contains {kinds} where the expected values are finite."
    expect_close(actual, expected, what, atol=atol, rtol=rtol, case=case,
                 pitfalls=[(message, actual)] if message else [])


def _dim_index(dim: int, ndim: int) -> int:
    return dim % ndim


def _softmax_hints(x: torch.Tensor, dim: int, *, log: bool = False) -> list[Callable[[torch.Tensor], str | None]]:
    """Property diagnoses for a softmax-like answer (``log``: the answer is log-probabilities)."""
    d = _dim_index(dim, x.dim())

    def nonfinite(out: torch.Tensor) -> str | None:
        if torch.isfinite(out).all():
            return None
        big = x[torch.isfinite(x)].abs().max().item() if torch.isfinite(x).any() else 0.0
        if log and torch.isneginf(out).any() and not torch.isnan(out).any():
            return None  # handled by the log(softmax) hint
        if big >= 80:
            return NO_MAX
        return ("it contains NaN or inf even for moderate scores: check for a division by zero or a "
                "log of 0, and subtract the maximum along `dim`.")

    def zero_rows(out: torch.Tensor) -> str | None:
        if log or x.dim() < 2 or out.shape != x.shape:
            return None
        sums = torch.nan_to_num(out.to(torch.float64), nan=0.0).sum(d)
        return GLOBAL_MAX if (sums.abs() < 1e-6).any() else None

    def wrong_axis(out: torch.Tensor) -> str | None:
        if out.shape != x.shape or x.dim() < 2:
            return None
        weights = (out.exp() if log else out).to(torch.float64)
        if torch.allclose(weights.sum(d), torch.ones(()), atol=1e-4):
            return None
        for other in range(x.dim()):
            if other != d and torch.allclose(weights.sum(other), torch.ones((), dtype=torch.float64), atol=1e-4):
                return WRONG_AXIS
        return None

    return [nonfinite, zero_rows, wrong_axis]


def _global_max_softmax(x: torch.Tensor, dim: int, eps: float = 0.0) -> torch.Tensor:
    e = torch.exp(x - x.max())
    return e / (e.sum(dim, keepdim=True) + eps)


def _naive_softmax(x: torch.Tensor, dim: int, eps: float = 0.0) -> torch.Tensor:
    e = torch.exp(x)
    return e / (e.sum(dim, keepdim=True) + eps)


def _softmax_pitfalls(x: torch.Tensor, dim: int) -> list[tuple[str, Any]]:
    others = [o for o in range(x.dim()) if o != _dim_index(dim, x.dim())]
    return (
        [(NO_MAX, lambda: _naive_softmax(x, dim)), (NO_MAX, lambda: _naive_softmax(x, dim, 1e-30))]
        + [(GLOBAL_MAX, lambda: _global_max_softmax(x, dim)), (GLOBAL_MAX, lambda: _global_max_softmax(x, dim, 1e-30))]
        + [(WRONG_AXIS, (lambda o=o: torch.softmax(x, o))) for o in others]
        + [(PLAIN_NORMALISATION, lambda: x / x.sum(dim, keepdim=True))]
    )


# Cases shared by the softmax-family checks: (label, scores, dim).
def _cases(generator: torch.Generator) -> list[tuple[str, torch.Tensor, int]]:
    return [
        ("random scores (3, 5), dim=-1", 2 * torch.randn(3, 5, generator=generator), -1),
        ("scores (4, 3), dim=0", 2 * torch.randn(4, 3, generator=generator), 0),
        ("scores (2, 3, 4), dim=1", 2 * torch.randn(2, 3, 4, generator=generator), 1),
        ("a single vector (6,), dim=-1", torch.randn(6, generator=generator), -1),
        ("rows [1000, 1001, 1002] and [0, 1, 2], dim=-1", torch.tensor([[1000.0, 1001, 1002], [0, 1, 2]]), -1),
        ("rows [-1000, -999, -998] and [0, 1, 2], float64", torch.tensor([[-1000.0, -999, -998], [0, 1, 2]], dtype=torch.float64), -1),
        ("masked scores with -inf entries", torch.tensor([[0.0, -INF, 1.0], [2.0, 2.0, -INF]]), -1),
        ("random scores (3, 7), float64, dim=-1", 3 * torch.randn(3, 7, generator=generator, dtype=torch.float64), -1),
    ]


@check("stable_softmax", expects="a function stable_softmax(x, dim=-1) returning weights shaped like x")
def check_stable_softmax(fn):
    generator = torch.Generator().manual_seed(3)
    run = _adapt(fn, getattr(fn, "__name__", "stable_softmax"))
    cases = _cases(generator)
    for label, x, dim in cases:
        out = run(x, dim, what=f"stable_softmax(x, {dim})")
        expect_shape(out, x.shape, f"stable_softmax(x, {dim}) for {label}",
                     hint="The weights must have the shape of the scores (keep the reduced axis with keepdim=True before dividing).")
        expected = torch.softmax(x.to(torch.float64), dim)
        _compare(out, expected, f"stable_softmax(x, {dim})", label,
                 pitfalls=_softmax_pitfalls(x, dim), hints=_softmax_hints(x, dim))
    return f"matches torch.softmax on {len(cases)} cases ({_kind(run)}): any axis, float32/float64, stable at ±1000, -inf entries"


# ---------------------------------------------------------------------------------------------

LSE_NO_MAX = (
    "log Σ e^x was computed directly: e^x overflows to inf near 1000 (and the sum underflows to 0 "
    "near -1000, log 0 = -inf). Use m + log Σ e^(x − m) with m the maximum along `dim`."
)
LSE_NO_ADD_BACK = "the maximum was subtracted but not added back: logsumexp(x) = m + log Σ e^(x − m)."


@check("logsumexp", expects="a function logsumexp(x, dim=-1) returning log Σ e^x along dim")
def check_logsumexp(fn):
    generator = torch.Generator().manual_seed(4)
    run = _adapt(fn, getattr(fn, "__name__", "logsumexp"))
    cases = _cases(generator)
    for label, x, dim in cases:
        out = run(x, dim, what=f"logsumexp(x, {dim})")
        expected = torch.logsumexp(x.to(torch.float64), dim)
        kept = torch.logsumexp(x.to(torch.float64), dim, keepdim=True)
        if tuple(out.shape) == tuple(kept.shape) and kept.shape != expected.shape:
            out = out.squeeze(dim)  # keepdim style: accepted
        d = _dim_index(dim, x.dim())
        m = x.amax(dim, keepdim=True)
        pitfalls = [
            (LSE_NO_MAX, lambda: torch.log(torch.exp(x).sum(dim))),
            (GLOBAL_MAX, lambda: x.max() + torch.log(torch.exp(x - x.max()).sum(dim))),
            (LSE_NO_ADD_BACK, lambda: torch.log(torch.exp(x - m).sum(dim))),
        ] + [(WRONG_AXIS, (lambda o=o: torch.logsumexp(x, o))) for o in range(x.dim()) if o != d]

        def nonfinite(a: torch.Tensor) -> str | None:
            return LSE_NO_MAX if not torch.isfinite(a).all() and x[torch.isfinite(x)].abs().max() >= 80 else None

        _compare(out, expected, f"logsumexp(x, {dim})", label, pitfalls=pitfalls, hints=[nonfinite],
                 atol=1e-4, rtol=1e-5)
    return f"matches torch.logsumexp on {len(cases)} cases ({_kind(run)}): any axis, keepdim or not, finite at ±1000"


# ---------------------------------------------------------------------------------------------

LOG_OF_SOFTMAX = (
    "it computes log(softmax(x)): probabilities smaller than the smallest float (e.g. e^-1000) "
    "underflow to 0 and log 0 = -inf, although the true log-probability is finite. Compute "
    "x − logsumexp(x) instead."
)
NO_KEEPDIM = (
    "logsumexp was reduced without keepdim, so subtracting it broadcast along the wrong axis "
    "(each row got another row's normaliser). Keep the axis: logsumexp(x, dim, keepdim=True)."
)


def _log_softmax_cases(generator: torch.Generator) -> list[tuple[str, torch.Tensor, int]]:
    tiny = [[0.0, -1000.0, 5.0], [3.0, 2.0, -200.0]]
    return [
        ("square scores (4, 4), dim=-1", 2 * torch.randn(4, 4, generator=generator), -1),
        ("random scores (3, 5), dim=-1", 2 * torch.randn(3, 5, generator=generator), -1),
        ("scores (4, 3), dim=0", 2 * torch.randn(4, 3, generator=generator), 0),
        ("scores (2, 3, 4), dim=1", 2 * torch.randn(2, 3, 4, generator=generator), 1),
        ("tiny probabilities (scores 0, -1000, 5), float32", torch.tensor(tiny), -1),
        ("tiny probabilities (scores 0, -1000, 5), float64", torch.tensor(tiny, dtype=torch.float64), -1),
        ("rows [1000, 1001, 1002] and [0, 1, 2], dim=-1", torch.tensor([[1000.0, 1001, 1002], [0, 1, 2]]), -1),
        ("masked scores with -inf entries", torch.tensor([[0.0, -INF, 1.0], [2.0, 2.0, -INF]]), -1),
    ]


@check("log_softmax", expects="a function log_softmax(x, dim=-1) returning log-probabilities shaped like x")
def check_log_softmax(fn):
    generator = torch.Generator().manual_seed(5)
    run = _adapt(fn, getattr(fn, "__name__", "log_softmax"))
    cases = _log_softmax_cases(generator)
    for label, x, dim in cases:
        out = run(x, dim, what=f"log_softmax(x, {dim})")
        expect_shape(out, x.shape, f"log_softmax(x, {dim}) for {label}",
                     hint="Log-probabilities have the shape of the scores (subtract logsumexp with keepdim=True).")
        expected = torch.log_softmax(x.to(torch.float64), dim)
        pitfalls = [
            (LOG_OF_SOFTMAX, lambda: torch.log(torch.softmax(x, dim))),
            (NO_MAX, lambda: torch.log(_naive_softmax(x, dim))),
            (NO_MAX, lambda: x - torch.log(torch.exp(x).sum(dim, keepdim=True))),
            (GLOBAL_MAX, lambda: torch.log(_global_max_softmax(x, dim))),
            (NO_KEEPDIM, lambda: x - torch.logsumexp(x, dim)),
        ] + [(WRONG_AXIS, (lambda o=o: torch.log_softmax(x, o))) for o in range(x.dim()) if o != _dim_index(dim, x.dim())]

        def neg_inf(a: torch.Tensor) -> str | None:
            return LOG_OF_SOFTMAX if (torch.isneginf(a) & torch.isfinite(expected)).any() else None

        _compare(out, expected, f"log_softmax(x, {dim})", label, pitfalls=pitfalls,
                 hints=[neg_inf] + _softmax_hints(x, dim, log=True), atol=1e-4, rtol=1e-5)
    return f"matches torch.log_softmax on {len(cases)} cases ({_kind(run)}): any axis, finite for probabilities below 1e-400"


# ---------------------------------------------------------------------------------------------

TEMPERATURE_MULTIPLIED = (
    "the scores were multiplied by the temperature instead of divided: softmax(x / T), so a high "
    "T flattens the weights and a low T sharpens them."
)
TEMPERATURE_IGNORED = "the temperature has no effect: divide the scores by T before the softmax."
TEMPERATURE_AFTER = (
    "the temperature was applied after the softmax, so the weights no longer sum to 1: divide the "
    "scores by T, then take the softmax."
)
TEMPERATURE_NO_MAX = (
    "no maximum was subtracted: at a low temperature x / T is large (scores of 3 at T = 0.01 "
    "give 300, and e^300 overflows float32), giving NaN. Subtract the maximum of x / T first."
)


@check("softmax_temperature", expects="a function softmax_temperature(x, temperature) returning weights shaped like x")
def check_softmax_temperature(fn):
    generator = torch.Generator().manual_seed(6)
    run = _adapt(fn, getattr(fn, "__name__", "softmax_temperature"))
    x = 2 * torch.randn(3, 6, generator=generator)
    x64 = x.to(torch.float64)
    cases = [
        (0.5, x, "T = 0.5"),
        (2.0, x, "T = 2"),
        (1.0, x, "T = 1 (plain softmax)"),
        (0.01, torch.tensor([[3.0, 1.0, -2.0, 2.9], [0.5, 0.4, 0.3, 0.2]]), "T = 0.01 (sharp)"),
        (100.0, x64, "T = 100 (nearly uniform), float64"),
        (3.0, torch.randn(2, 2, 5, generator=generator), "T = 3, scores (2, 2, 5)"),
    ]
    for temperature, scores, label in cases:
        out = run(scores, temperature, what=f"softmax_temperature(x, {temperature:g})")
        expect_shape(out, scores.shape, f"softmax_temperature(x, {temperature:g})")
        expected = torch.softmax(scores.to(torch.float64) / temperature, -1)
        pitfalls = [
            (TEMPERATURE_NO_MAX, lambda: _naive_softmax(scores / temperature, -1)),
            (TEMPERATURE_MULTIPLIED, lambda: torch.softmax(scores * temperature, -1)),
            (TEMPERATURE_IGNORED, lambda: torch.softmax(scores, -1)),
            (TEMPERATURE_AFTER, lambda: torch.softmax(scores, -1) / temperature),
            (TEMPERATURE_AFTER, lambda: torch.softmax(scores, -1) ** (1 / temperature)),
        ]

        def nonfinite(a: torch.Tensor) -> str | None:
            return TEMPERATURE_NO_MAX if not torch.isfinite(a).all() else None

        _compare(out, expected, f"softmax_temperature(x, {temperature:g})", label, pitfalls=pitfalls,
                 hints=[nonfinite] + _softmax_hints(scores, -1)[1:])
    return f"matches torch.softmax(x / T) for T from 0.01 to 100 ({_kind(run)})"

