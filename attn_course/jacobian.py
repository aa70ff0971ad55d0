"""The softmax Jacobian: the reference versions of what notebook 04 builds.

With s = softmax(x) along the last axis (shape (…, n)):

* :func:`softmax_jacobian` — J = diag(s) − s sᵀ, shape (…, n, n), J[…, i, j] = ∂s_i/∂x_j;
* :func:`softmax_vjp` — the vector–Jacobian product gᵀJ = s ⊙ (g − ⟨g, s⟩) in O(n) time and
  memory, never forming J (J is symmetric, so gᵀJ = J g);
* :class:`SoftmaxFunction` — a ``torch.autograd.Function`` whose backward is that O(n) product;
  :func:`softmax_fn` applies it;
* :func:`jacobian_backward` — the O(n²) route (build J, multiply), for timing comparisons.
"""

from __future__ import annotations

import torch

__all__ = ["softmax_jacobian", "softmax_vjp", "jacobian_backward", "SoftmaxFunction", "softmax_fn"]


def softmax_jacobian(s: torch.Tensor) -> torch.Tensor:
    """J = diag(s) − s sᵀ for each leading index.

    Args:
        s: softmax probabilities, shape (…, n) (each slice along the last axis sums to 1).
    Returns:
        J, shape (…, n, n), with J[…, i, j] = ∂s_i/∂x_j = s_i (δ_ij − s_j).
    """
    outer = s.unsqueeze(-1) * s.unsqueeze(-2)  # (…, n, 1) * (…, 1, n) → (…, n, n)
    return torch.diag_embed(s) - outer


def softmax_vjp(s: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """∂L/∂x from ∂L/∂s without forming J: s ⊙ (g − ⟨g, s⟩).

    Args:
        s: softmax probabilities, shape (…, n).
        grad: upstream gradient ∂L/∂s, shape (…, n).
    Returns:
        ∂L/∂x, shape (…, n). O(n) time and memory per slice.
    """
    dot = (grad * s).sum(dim=-1, keepdim=True)  # ⟨g, s⟩ per slice: (…, 1)
    return s * (grad - dot)  # (…, n)


def jacobian_backward(s: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The same product the O(n²) way: build J (…, n, n), then J g. For timing and demonstrations."""
    return (softmax_jacobian(s) @ grad.unsqueeze(-1)).squeeze(-1)


class SoftmaxFunction(torch.autograd.Function):
    """Softmax along the last axis with a hand-written O(n) backward.

    ``SoftmaxFunction.apply(x)``: x (…, n) → s (…, n). Backward receives ∂L/∂s (…, n) and returns
    ∂L/∂x (…, n) via :func:`softmax_vjp`, using only the saved output s.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        shifted = x - x.amax(dim=-1, keepdim=True)  # stable: the largest score becomes 0
        e = torch.exp(shifted)
        s = e / e.sum(dim=-1, keepdim=True)
        ctx.save_for_backward(s)  # the backward needs only the output
        return s

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (s,) = ctx.saved_tensors
        return softmax_vjp(s, grad)


def softmax_fn(x: torch.Tensor) -> torch.Tensor:
    """softmax(x) along the last axis through :class:`SoftmaxFunction` (differentiable)."""
    return SoftmaxFunction.apply(x)
