"""Checks for notebook 04 (the softmax Jacobian): softmax_jacobian, softmax_vjp, SoftmaxFunction.

The oracle is PyTorch's autograd: ``torch.autograd.functional.jacobian`` of ``torch.softmax`` for
the Jacobian, the gradient of ``torch.softmax`` for the vector–Jacobian product and the custom
``torch.autograd.Function`` (plus ``torch.autograd.gradcheck``).

"O(n) backward" is checked honestly, by watching allocations rather than timing (timings on a shared
machine are noise): the learner's code runs once at n = 2048 while a PyTorch dispatch mode records
the storage size of every tensor any operation creates, and ``tracemalloc`` records NumPy's peak.
The O(n) route never holds more than a few vectors of n numbers; any single allocation of at least
n²/8 numbers means an n×n object (the Jacobian, or an outer product) was built.
"""

from __future__ import annotations

import inspect
import tracemalloc
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ._core import CheckFailed, NotAttempted, as_tensor, call, check, describe, expect_shape, fail
from .softmax import NO_MAX, _adapt, _compare, _kind, _naive_softmax, _softmax_hints

__all__ = ["check_softmax_jacobian", "check_softmax_vjp", "check_softmax_function"]

BIG_N = 2048  # the size at which the O(n) promise is checked: n² = 4,194,304 numbers

SIGN_FLIPPED = "the sign is flipped: J = diag(s) − s sᵀ (diagonal entries s_i(1 − s_i) are positive)."
INNER_PRODUCT = (
    "the outer product s sᵀ (an n×n matrix, entry s_i·s_j) was replaced by the inner product "
    "sᵀs = ⟨s, s⟩ (one number), a transposition slip. J is symmetric, so J and Jᵀ agree; the order "
    "of the factors in s sᵀ is what matters."
)
ONLY_DIAG = "the − s sᵀ term is missing: off the diagonal, ∂s_i/∂x_j = −s_i s_j, not 0."
ONLY_OUTER = "the diag(s) term is missing: the diagonal entries are s_i − s_i², not −s_i²."
DIAG_ONLY_ENTRIES = "only the diagonal s_i(1 − s_i) is there: the off-diagonal entries −s_i s_j are missing."
BATCH_SUMMED = (
    "the outer products were summed over the batch (sᵀ @ s on a (B, n) tensor): build one n×n matrix per "
    "row with s.unsqueeze(-1) * s.unsqueeze(-2)."
)
AXES_ORDER = (
    "the axes are in the wrong order: the batch axes come first and the two Jacobian axes last, "
    "J[..., i, j] = ∂s_i/∂x_j."
)
NO_BATCH = (
    "batch dimensions are not supported: it works on one vector (n,) but not on s of shape (B, n) "
    "or (B, H, n). Use torch.diag_embed(s) (torch.diag on a 2-D tensor extracts a diagonal instead "
    "of building one) and s.unsqueeze(-1) * s.unsqueeze(-2) for the outer products."
)


def _probs(generator: torch.Generator, *shape: int, dtype=torch.float64, scale: float = 1.5) -> torch.Tensor:
    return torch.softmax(scale * torch.randn(*shape, generator=generator, dtype=dtype), -1)


def _oracle_jacobian(s: torch.Tensor) -> torch.Tensor:
    """∂softmax/∂x from autograd at x = log s (softmax(log s) = s), batched by flattening."""
    x = torch.log(s.to(torch.float64))
    flat = x.reshape(-1, x.shape[-1])
    blocks = [torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), row) for row in flat]
    return torch.stack(blocks).reshape(*s.shape, s.shape[-1])


def _oracle_vjp(s: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    x = torch.log(s.to(torch.float64)).requires_grad_(True)
    (grad,) = torch.autograd.grad(torch.softmax(x, -1), x, g.to(torch.float64))
    return grad


# ---------------------------------------------------------------------------------------------
# Allocation watching: the honest way to tell O(n) from O(n²) memory.

class _Largest:
    """Keeps the largest storage (in elements) among the tensors it is shown."""

    def _init_largest(self) -> None:
        self.largest = 0
        self.largest_shape: tuple[int, ...] = ()

    def _record(self, out: Any) -> None:
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                try:
                    size = t.untyped_storage().nbytes() // max(t.element_size(), 1)
                except Exception:  # tensors without storage: count their elements
                    size = t.numel()
                if size > self.largest:
                    self.largest, self.largest_shape = size, tuple(t.shape)


class _AllocationWatch(_Largest, TorchFunctionMode):
    """Sees every torch function and tensor method called from Python (light: no extra imports)."""

    def __init__(self) -> None:
        super().__init__()
        self._init_largest()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._record(out)
        return out


class _DispatchWatch(_Largest, TorchDispatchMode):
    """Sees every operator, also those the autograd engine runs (its first use costs an import)."""

    def __init__(self) -> None:
        super().__init__()
        self._init_largest()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._record(out)
        return out


def _watch_allocations(work: Callable[[], Any], mode: type = _AllocationWatch) -> tuple[Any, int, tuple[int, ...], int]:
    """Run ``work()``; return its result, the largest tensor storage (elements) and its shape, and
    the peak of NumPy/Python allocations in bytes (tracemalloc) during the call.

    Call it after one untraced run of the same work, so that one-off costs (imports, caches) are
    not mistaken for the work's own memory. The torch side sees functions called from Python
    (the learner's code), which is why a Function's backward is run directly, not by the autograd
    engine, when it is watched (see :func:`_direct_backward`); ``mode=_DispatchWatch`` sees inside
    the engine too."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    watch = mode()
    try:
        with watch:
            result = work()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return result, watch.largest, watch.largest_shape, peak


class _Context:
    """A stand-in for autograd's ctx: stores what forward saves, accepts any attribute."""

    needs_input_grad = (True,)

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


def _direct_backward(owner: type, x: torch.Tensor, g: torch.Tensor) -> tuple[_Context, Callable[[], Any]]:
    """Run ``owner``'s forward with a stand-in ctx; return it and a call of its backward on ``g``."""
    ctx = _Context()
    with torch.no_grad():
        if owner.setup_context is not torch.autograd.Function.setup_context:  # forward(x) + setup_context style
            out = owner.forward(x)
            owner.setup_context(ctx, (x,), out)
        else:
            owner.forward(ctx, x)
    def backward():
        with torch.no_grad():
            return owner.backward(ctx, g)
    return ctx, backward


def _quadratic_message(what: str, largest: int, shape: tuple[int, ...], numpy_peak: int) -> str | None:
    limit = BIG_N * BIG_N // 8
    if largest >= limit:
        return (f"{what} is O(n²): at n = {BIG_N} it built a tensor of shape {shape} ({largest:,} numbers; "
                f"the O(n) route never needs more than a few vectors of {BIG_N}). Do not form the n×n "
                "Jacobian: use s * (g − (g * s).sum(-1, keepdim=True)).")
    if numpy_peak >= limit * 4:
        return (f"{what} is O(n²): at n = {BIG_N} it allocated {numpy_peak / 2**20:.0f} MB of NumPy arrays at once "
                "(an n×n matrix). Do not form the Jacobian: use s * (g − (g * s).sum(-1, keepdims=True)).")
    return None


# ---------------------------------------------------------------------------------------------

@check("softmax_jacobian", expects="a function softmax_jacobian(s) returning J of shape (..., n, n)")
def check_softmax_jacobian(fn):
    generator = torch.Generator().manual_seed(7)
    run = _adapt(fn, getattr(fn, "__name__", "softmax_jacobian"))
    single = [
        ("s = softmax([1, 2, 3]), float64", torch.softmax(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), -1)),
        ("s of shape (5,), float32", _probs(generator, 5, dtype=torch.float32)),
        ("a one-hot-ish s (saturated)", torch.softmax(torch.tensor([12.0, 0.0, -3.0, 1.0], dtype=torch.float64), -1)),
    ]
    batched = [
        ("s of shape (2, 5)", _probs(generator, 2, 5)),
        ("s of shape (4, 4), a square batch", _probs(generator, 4, 4, dtype=torch.float32)),
        ("s of shape (2, 3, 4), batch and heads", _probs(generator, 2, 3, 4)),
    ]
    for index, (label, s) in enumerate(single + batched):
        is_batched = index >= len(single)
        n = s.shape[-1]
        expected = _oracle_jacobian(s)
        try:
            out = run(s, what="softmax_jacobian(s)")
        except NotAttempted:
            raise
        except CheckFailed as exc:
            if is_batched:
                fail(f"softmax_jacobian(s) for {label}: {NO_BATCH} (It said: {exc})")
            raise
        if tuple(out.shape) != tuple(expected.shape):
            if is_batched and sorted(out.shape) == sorted(expected.shape):
                fail(f"softmax_jacobian(s) for {label} has shape {tuple(out.shape)}, expected {tuple(expected.shape)}: {AXES_ORDER}")
            if is_batched and tuple(out.shape[-2:]) == (n, n) and out.dim() < expected.dim():
                summed = torch.diag_embed(s).sum(0) - s.T @ s if s.dim() == 2 else None
                hint = BATCH_SUMMED if summed is not None and _close(out, summed) else NO_BATCH
                fail(f"softmax_jacobian(s) for {label} has shape {tuple(out.shape)}, expected {tuple(expected.shape)}: {hint}")
            if is_batched:
                fail(f"softmax_jacobian(s) for {label} has shape {tuple(out.shape)}, expected {tuple(expected.shape)}: {NO_BATCH}")
            expect_shape(out, expected.shape, f"softmax_jacobian(s) for {label}",
                         hint="For s of shape (n,), J has shape (n, n).")
        outer = s.unsqueeze(-1) * s.unsqueeze(-2)
        diag = torch.diag_embed(s)
        pitfalls = [
            (SIGN_FLIPPED, lambda: outer - diag),
            (INNER_PRODUCT, lambda: diag - (s * s).sum(-1)[..., None, None]),
            (INNER_PRODUCT, lambda: diag - (s * s).sum()),
            (ONLY_DIAG, lambda: diag),
            (ONLY_OUTER, lambda: -outer),
            (DIAG_ONLY_ENTRIES, lambda: torch.diag_embed(s * (1 - s))),
        ]
        if s.dim() == 3:
            pitfalls.append((AXES_ORDER, lambda: expected.transpose(0, 1)))
        if s.dim() == 2 and s.shape[0] == s.shape[1]:
            pitfalls += [(AXES_ORDER, lambda: expected.permute(1, 0, 2)), (AXES_ORDER, lambda: expected.permute(1, 2, 0))]
        _compare(out, expected, "softmax_jacobian(s)", label, pitfalls=pitfalls, atol=1e-6, rtol=1e-4)
    return (f"matches torch.autograd.functional.jacobian on {len(single + batched)} cases ({_kind(run)}), "
            "shapes (n,), (B, n), (B, H, n)")


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return tuple(a.shape) == tuple(b.shape) and torch.allclose(a.to(torch.float64), b.to(torch.float64), atol=1e-6)


# ---------------------------------------------------------------------------------------------

VJP_MISSING_DOT = (
    "the ⟨g, s⟩ term is missing (s * g is only the diagonal part of the product): the gradient is "
    "s ⊙ (g − ⟨g, s⟩), with ⟨g, s⟩ = (g * s).sum(-1, keepdim=True)."
)
VJP_SIGN = "the sign is flipped: the result is s ⊙ (g − ⟨g, s⟩), not s ⊙ (⟨g, s⟩ − g)."
VJP_PLAIN_SUM = (
    "it subtracts the plain sum or mean of g; the term to subtract is the s-weighted sum "
    "⟨g, s⟩ = Σ_j g_j s_j."
)
VJP_NO_S = "the final multiplication by s is missing: the result is s ⊙ (g − ⟨g, s⟩)."
VJP_GLOBAL_SUM = (
    "⟨g, s⟩ was summed over the whole tensor instead of per row: batch dimensions are not "
    "supported. Sum along the last axis only: (g * s).sum(-1, keepdim=True)."
)
VJP_NO_KEEPDIM = (
    "⟨g, s⟩ was reduced without keepdim, so it broadcast along the wrong axis (each row got another "
    "row's sum): use (g * s).sum(-1, keepdim=True)."
)


def _vjp_pitfalls(s: torch.Tensor, g: torch.Tensor) -> list[tuple[str, Any]]:
    dot = (g * s).sum(-1, keepdim=True)
    return [
        (VJP_MISSING_DOT, lambda: s * g),
        (VJP_SIGN, lambda: s * (dot - g)),
        (VJP_NO_S, lambda: g - dot),
        (VJP_PLAIN_SUM, lambda: s * (g - g.sum(-1, keepdim=True))),
        (VJP_PLAIN_SUM, lambda: s * (g - g.mean(-1, keepdim=True))),
        (VJP_GLOBAL_SUM, lambda: s * (g - (g * s).sum())),
        (VJP_NO_KEEPDIM, lambda: s * (g - (g * s).sum(-1))),
    ]


def _vjp_cases(generator: torch.Generator) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    s5 = _probs(generator, 5)
    return [
        ("s and g of shape (5,), float64", s5, torch.randn(5, generator=generator, dtype=torch.float64)),
        ("g = all ones (the gradient of Σ s = 1 is 0)", s5, torch.ones(5, dtype=torch.float64)),
        ("s and g of shape (6,), float32", _probs(generator, 6, dtype=torch.float32), torch.randn(6, generator=generator)),
        ("a square batch (4, 4)", _probs(generator, 4, 4), torch.randn(4, 4, generator=generator, dtype=torch.float64)),
        ("batch and heads (2, 3, 6)", _probs(generator, 2, 3, 6, dtype=torch.float32), torch.randn(2, 3, 6, generator=generator)),
    ]


@check("softmax_vjp", expects="a function softmax_vjp(s, grad) returning ∂L/∂x shaped like s")
def check_softmax_vjp(fn):
    generator = torch.Generator().manual_seed(8)
    run = _adapt(fn, getattr(fn, "__name__", "softmax_vjp"))
    cases = _vjp_cases(generator)
    for index, (label, s, g) in enumerate(cases):
        try:
            out = run(s, g, what="softmax_vjp(s, grad)")
        except NotAttempted:
            raise
        except CheckFailed as exc:
            if s.dim() > 1:
                fail(f"softmax_vjp(s, grad) for {label}: batch dimensions are not supported — "
                     f"reduce along the last axis only, with keepdim=True. (It said: {exc})")
            raise
        expect_shape(out, s.shape, f"softmax_vjp(s, grad) for {label}",
                     hint="The gradient with respect to the scores has the shape of s." if s.dim() == 1 else VJP_GLOBAL_SUM)
        _compare(out, _oracle_vjp(s, g), "softmax_vjp(s, grad)", label, pitfalls=_vjp_pitfalls(s, g),
                 atol=1e-6, rtol=1e-4)
    big_s = _probs(generator, 1, BIG_N, dtype=torch.float32)
    big_g = torch.randn(1, BIG_N, generator=generator)
    run(big_s, big_g, what="softmax_vjp(s, grad)")  # warm-up, untraced
    _, largest, shape, numpy_peak = _watch_allocations(lambda: run(big_s, big_g, what="softmax_vjp(s, grad)"))
    quadratic = _quadratic_message("softmax_vjp", largest, shape, numpy_peak)
    if quadratic:
        fail(quadratic)
    return f"matches autograd on {len(cases)} cases ({_kind(run)}), batched, O(n) memory at n = {BIG_N}"


# ---------------------------------------------------------------------------------------------

def _resolve_function(obj: Any) -> tuple[Callable, str, type]:
    """Accept the class SoftmaxFunction (or its bound ``apply``); return (apply, name, the class)."""
    owner = obj if inspect.isclass(obj) else getattr(obj, "__self__", None)
    if not (inspect.isclass(owner) and issubclass(owner, torch.autograd.Function)):
        fail(f"expected a subclass of torch.autograd.Function (the class itself, e.g. "
             f"`check_softmax_function(SoftmaxFunction)`); got {describe(obj)}.")
    apply = owner.apply

    def applied(x):
        return apply(x)

    applied.__name__ = f"{owner.__name__}.forward"
    return applied, owner.__name__, owner


def _gradient(apply: Callable, name: str, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Forward through the learner's Function, then backward with upstream gradient ``g``."""

    def forward_backward(x_in: torch.Tensor) -> Any:
        x_in = x_in.detach().requires_grad_(True)
        y = apply(x_in)
        if not isinstance(y, torch.Tensor):
            return y
        if not y.requires_grad:
            raise RuntimeError("the output does not require grad: forward must return a tensor computed from x")
        (grad,) = torch.autograd.grad(y, x_in, g, allow_unused=True)
        return grad

    forward_backward.__name__ = f"{name}.backward"
    grad = call(forward_backward, x)
    if grad is None:
        fail(f"{name}.backward returned None: it must return ∂L/∂x, a tensor shaped like x.")
    return as_tensor(grad, f"the gradient from {name}.backward")



@check("softmax_function", expects="the class SoftmaxFunction (a subclass of torch.autograd.Function)")
def check_softmax_function(cls):
    apply, name, owner = _resolve_function(cls)
    generator = torch.Generator().manual_seed(9)

    # 1. forward: a stable softmax along the last axis, batched
    forward_cases = [
        ("scores (2, 5)", 2 * torch.randn(2, 5, generator=generator)),
        ("scores (2, 3, 4), float64", torch.randn(2, 3, 4, generator=generator, dtype=torch.float64)),
        ("rows [1000, 1001, 1002] and [0, 1, 2]", torch.tensor([[1000.0, 1001, 1002], [0, 1, 2]])),
    ]
    for label, x in forward_cases:
        out = as_tensor(call(apply, x), f"{name}.apply(x)")
        expect_shape(out, x.shape, f"{name}.apply(x) for {label}")
        _compare(out, torch.softmax(x.to(torch.float64), -1), f"{name}.apply(x)", label,
                 pitfalls=[(NO_MAX, lambda: _naive_softmax(x, -1))], hints=_softmax_hints(x, -1))

    # 2. backward: the gradient autograd gets from torch.softmax
    backward_cases = [
        ("x of shape (5,), float64", torch.randn(5, generator=generator, dtype=torch.float64)),
        ("x of shape (4, 4), float32", 2 * torch.randn(4, 4, generator=generator)),
        ("x of shape (2, 3, 6), float64", torch.randn(2, 3, 6, generator=generator, dtype=torch.float64)),
    ]
    for label, x in backward_cases:
        g = torch.randn(x.shape, generator=generator, dtype=x.dtype)
        grad = _gradient(apply, name, x, g)
        s = torch.softmax(x.to(torch.float64), -1)
        g64 = g.to(torch.float64)
        expect_shape(grad, x.shape, f"the gradient from {name}.backward for {label}",
                     hint="backward returns ∂L/∂x, shaped like x." if x.dim() == 1 else VJP_GLOBAL_SUM)
        _compare(grad, _oracle_vjp(s, g64), f"the gradient from {name}.backward", label,
                 pitfalls=_vjp_pitfalls(s, g64), atol=1e-5, rtol=1e-4)

    # 3. gradcheck: finite differences agree with backward (float64)
    x = torch.randn(3, 4, generator=generator, dtype=torch.float64)

    def run_gradcheck(x_in):
        return torch.autograd.gradcheck(apply, (x_in.detach().requires_grad_(True),), raise_exception=False)

    run_gradcheck.__name__ = "torch.autograd.gradcheck"
    if not call(run_gradcheck, x):
        fail(f"torch.autograd.gradcheck({name}.apply, x) failed: backward disagrees with finite differences.")

    # 4. O(n): backward must not build the n×n Jacobian. Its forward and backward are called
    # directly (a stand-in ctx) so that every tensor the backward creates can be watched.
    x_big = torch.randn(1, BIG_N, generator=generator)
    g_big = torch.randn(1, BIG_N, generator=generator)

    def watched_backward():
        _, backward = _direct_backward(owner, x_big.clone(), g_big)
        backward()  # warm-up, untraced
        return _watch_allocations(backward)

    def watched_autograd():  # for a Function that needs autograd's real ctx
        x_in = x_big.clone().requires_grad_(True)
        y = apply(x_in)
        torch.autograd.grad(y, x_in, g_big, retain_graph=True)  # warm-up, untraced
        with _DispatchWatch():  # its first use imports modules: keep that out of the measurement
            torch.zeros(1) + 1
        return _watch_allocations(lambda: torch.autograd.grad(y, x_in, g_big), mode=_DispatchWatch)

    watched_backward.__name__ = watched_autograd.__name__ = f"{name}.backward"
    try:
        _, largest, shape, numpy_peak = call(watched_backward)
    except NotAttempted:
        raise
    except CheckFailed:
        _, largest, shape, numpy_peak = call(watched_autograd)
    quadratic = _quadratic_message(f"{name}.backward", largest, shape, numpy_peak)
    if quadratic:
        fail(quadratic)
    return f"forward stable and batched, backward matches autograd on {len(backward_cases)} cases, gradcheck passes, O(n) at n = {BIG_N}"
