"""What every part of notebook 04's checks shares: the oracles (autograd), the cases of each part, what an exception
says, and one body that judges an answer on every case."""

from __future__ import annotations

from typing import Callable

import torch

from .. import kit
from ..compare import Failure
from ..core import LearnerRaised, learner_error

INF = float("inf")


# ============================================================================ oracles and cases
def oracle_jacobian(p: torch.Tensor) -> torch.Tensor:
    """∂softmax/∂z by autograd at z = log p (softmax(log p) = p), one row at a time: (..., n, n)."""
    z = torch.log(p.double())
    rows = [torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), r) for r in z.reshape(-1, z.shape[-1])]
    return torch.stack(rows).reshape(*p.shape, p.shape[-1])


def oracle_vjp(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """gᵀJ by autograd through torch.softmax at z = log p."""
    z = torch.log(p.double()).requires_grad_(True)
    return torch.autograd.grad(torch.softmax(z, -1), z, g.double())[0]


# Shorthands: random probabilities of a shape; the probabilities of given scores; an input as a case names it.
probs = lambda g, *shape, dtype=torch.float64: torch.softmax(  # noqa: E731
    1.5 * torch.randn(*shape, generator=g, dtype=dtype), -1)
_fixed = lambda scores: torch.softmax(torch.tensor(scores, dtype=torch.float64), -1)  # noqa: E731
describe = lambda x, name: f"{name} of shape {tuple(x.shape)}, {str(x.dtype).replace('torch.', '')}"  # noqa: E731


def jacobian_cases() -> list[tuple]:
    g, f32 = torch.Generator().manual_seed(7), torch.float32
    return [(p,) for p in (
        _fixed([1.0, 2.0, 3.0]), probs(g, 5, dtype=f32), _fixed([12.0, 0.0, -3.0, 1.0]),  # saturated
        _fixed([2.0, -INF, 0.0, -INF]), torch.ones(1, dtype=torch.float64),  # exact zeros; n = 1: J = [[0]]
        probs(g, 2, 5), probs(g, 4, 4, dtype=f32), probs(g, 3, 5), probs(g, 1, 5, dtype=f32),  # a square batch
        probs(g, 2, 3, 4), probs(g, 3, 1, 4, dtype=f32))]  # batch and heads; a size-1 axis in the middle


def vjp_cases() -> list[tuple]:
    g, f32 = torch.Generator().manual_seed(8), torch.float32
    grad = lambda *shape, dtype=torch.float64: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    s5 = probs(g, 5)
    return [
        (s5, grad(5)), (s5, torch.ones(5, dtype=torch.float64)),  # the gradient of Σ p = 1 is 0
        (probs(g, 6, dtype=f32), grad(6, dtype=f32)),
        (probs(g, 4, 4), grad(4, 4)),  # square: a keepdim slip broadcasts instead of failing
        (probs(g, 3, 5, dtype=f32), grad(3, 5, dtype=f32)), (probs(g, 2, 3, 6), grad(2, 3, 6)),
        (probs(g, 1, 5), grad(1, 5)), (probs(g, 3, 1, 4, dtype=f32), grad(3, 1, 4, dtype=f32)),
        (torch.ones(2, 1, dtype=torch.float64), grad(2, 1)),  # n = 1: the gradient is 0
        # saturated rows with large upstream gradients, and exact zeros in p
        (_fixed([[20.0, 0.0, -5.0, 3.0], [2.0, -INF, 0.0, -INF]]),
         torch.tensor([[1000.0, -1000.0, 500.0, 0.001], [-1000.0, 7.0, 1000.0, 3.0]], dtype=torch.float64)),
    ]


def forward_cases() -> list[tuple]:
    g, t = torch.Generator().manual_seed(9), torch.tensor
    return [(z,) for z in (
        2 * torch.randn(2, 5, generator=g), torch.randn(2, 3, 4, generator=g, dtype=torch.float64),
        torch.randn(6, generator=g), torch.randn(1, 5, generator=g, dtype=torch.float64),
        torch.randn(3, 1, 4, generator=g),
        t([[50.0, 48.0, 49.0], [-3.0, 0.0, 1.0]]),  # e^z finite in float32, e^(z + max) not
        t([[1000.0, 1001.0, 1002.0], [2.0, 1.0, 0.0]]),
        t([[-1000.0, -998.0, -999.0], [0.0, -1000.0, 5.0]], dtype=torch.float64),
        t([[0.0, -INF, 1.0], [-INF, 3.0, -INF]]))]


def backward_cases() -> list[tuple]:
    g = torch.Generator().manual_seed(10)
    rand = lambda *shape, dtype=torch.float64, scale=1.0: scale * torch.randn(  # noqa: E731
        *shape, generator=g, dtype=dtype)
    return [
        (rand(5), rand(5)), (rand(4, 4, dtype=torch.float32, scale=2.0), rand(4, 4, dtype=torch.float32)),
        (rand(3, 5), rand(3, 5)), (rand(2, 3, 6), rand(2, 3, 6)),
        (rand(1, 5, dtype=torch.float32), rand(1, 5, dtype=torch.float32)), (rand(3, 1, 4), rand(3, 1, 4)),
        (torch.tensor([[1000.0, 1001.0, 1002.0], [0.0, -1000.0, 5.0]], dtype=torch.float64),
         torch.tensor([[1000.0, -1000.0, 5.0], [-1000.0, 1000.0, 3.0]], dtype=torch.float64)),
        (torch.tensor([[0.0, -INF, 1.0], [2.0, 2.0, -INF]]), rand(2, 3, dtype=torch.float32)),
    ]


def unchanged_cases(cases: list[tuple], special: Callable[[torch.Tensor], bool]) -> list[tuple]:
    """The cases on which an answer must leave its inputs as they were: the first, and the first whose input holds
    ``special`` values (exact zeros in p, ±inf in z), where an in-place clamp or replacement changes only those
    entries and leaves the first case, and every result, as it was."""
    odd = next((c for c in cases if special(c[0])), None)
    return [cases[0]] + ([odd] if odd is not None and odd is not cases[0] else [])


def raised_hint(exc: LearnerRaised, case: tuple, passed: list, *, signature: str, reductions: bool = True,
               others: Callable[[tuple], bool] | None = None, cases: list[tuple] = ()) -> dict[str, str]:
    """``cause``/``fix`` for an exception the learner's code raised on ``case`` after passing ``passed``, judged from
    what worked before; ``others``: whether the answer on another case is right (an input where the code works)."""
    msg, x = exc.message, case[0]
    seen, ns = {c[0].ndim for c in passed}, {c[0].shape[-1] for c in passed}
    batched, n = x.ndim > max(seen, default=0) >= 1, x.shape[-1]
    broadcast = "must match the size" in msg or "could not be broadcast" in msg
    if hint := kit.signature_hint(exc, signature):
        return hint
    if n == 1 and ns and 1 not in ns:
        return dict(cause=f"your code fails when n = 1, though it worked for n = {', '.join(map(str, sorted(ns)))}: "
                          "something in it treats an axis of size 1 differently (.squeeze() without an axis removes it, "
                          "for example)",
                    fix="keep every axis: no .squeeze() without an axis, and take n from p.shape[-1]")
    if batched and (not reductions or "outer" in msg + exc.code or "diag" in msg + exc.code):
        hint = dict(cause="your function worked on inputs with fewer axes and fails once there are batch axes in front",
                    fix="write every step for any number of leading axes: torch.diag_embed rather than torch.diag, "
                        "s.unsqueeze(-1) * s.unsqueeze(-2) rather than torch.outer or np.outer")
    elif reductions or not broadcast:  # without reductions, a broadcast error is not a lost axis
        hint = kit.reduction_hint(exc, dim=False)
    if not hint and ns and n not in ns and (broadcast or "shape" in msg):
        hint = dict(cause=f"a size written into your code: your function fails for n = {n}, though it worked for n = "
                          f"{', '.join(map(str, sorted(ns)))}", fix="take every size from the input (s.shape[-1]), never "
                          "write a number for it")
    elif not hint and batched:
        hint = dict(cause="your function worked on inputs with fewer axes and fails once there are batch axes in front",
                    fix="write every step for any number of leading axes: index and reduce along negative axes (-1), "
                        "never loop over or index a fixed axis")
    if others is None or x.ndim in seen or (hint and not hint["cause"].startswith("your code uses an axis number")):
        return hint
    return kit.works_elsewhere(x.shape, [(c[0].shape, lambda c=c: others(c)) for c in cases if c[0].ndim not in seen],
                               fix="write every step for shape (..., n): torch.diag_embed, p.unsqueeze(-1) * "
                                   "p.unsqueeze(-2), sums along -1 with keepdim=True") or hint


# ============================================================================ one body for every part
def judge_cases(cases: list[tuple], answer: Callable[[tuple, str], torch.Tensor], *, oracle: Callable,
                table: list[kit.Known], tried: Callable[[tuple], str], expected: str, signature: str,
                explain: Callable, what: str = "your result", shape_fix: str | Callable[[tuple, list], str],
                reductions: bool = True, atol: Callable[[tuple], float] = lambda c: 1e-6, again: Callable | None = None,
                reduced: bool = False, factors: bool = False, hint: Callable[[LearnerRaised], dict] = lambda exc: {}
                ) -> list[tuple[tuple, torch.Tensor]]:
    """Judge ``answer(case, tried)`` against ``oracle(*case)`` on every case: a known mistake of ``table`` that
    reproduces it, else what ``kit.what_is_off`` and ``explain(out, case, tried)`` find, else the plain comparison.
    An exception is explained by ``hint(exc)``, else by :func:`raised_hint`. Returns each case with its answer."""
    suspects, passed = kit.Suspects(table, atol=1e-5, rtol=1e-4), []
    for case in cases:
        said = tried(case)
        try:
            out = answer(case, said)
        except LearnerRaised as exc:
            right_on = lambda c: kit.agrees(answer(c, said), oracle(*c), atol=atol(c), rtol=1e-4)  # noqa: E731
            raise Failure(learner_error(exc, tried=said, expected=expected, **(hint(exc) or raised_hint(
                exc, case, [c for c, _ in passed], signature=signature, reductions=reductions, cases=cases,
                others=right_on)))) from None
        right, a = oracle(*case), atol(case)
        fix = shape_fix(case, [c for c, _ in passed]) if callable(shape_fix) else shape_fix
        if out.is_floating_point() and out.dtype not in (torch.float16, torch.bfloat16) and \
                not kit.agrees(out, right, atol=a, rtol=1e-4) and not suspects.suspects(out, case, right):
            kit.what_is_off(out, right, tried=said, what=what, atol=a, rtol=1e-4, fix=fix,
                            reduced=right.ndim - 1 if reduced else None,
                            explain=lambda o, case=case: explain(o, case, said))
        suspects.expect(out, right, case, tried=said, again=again, what=what, atol=a, rtol=1e-4,
                        fix=fix if out.shape != right.shape else "",
                        factors={"n": float(case[0].shape[-1])} if factors else None)
        passed.append((case, out))
    return passed
