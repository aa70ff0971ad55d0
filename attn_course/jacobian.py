"""The softmax Jacobian: the reference versions of what notebook 04 builds.

With p = softmax(z) along the last axis (scores z in, weights p out; shape (…, n)):

* :func:`softmax_jacobian` — J = diag(p) − p pᵀ, shape (…, n, n), J[…, i, j] = ∂p_i/∂z_j;
* :func:`softmax_vjp` — the vector–Jacobian product gᵀJ = p ⊙ (g − ⟨g, p⟩) in O(n) time and
  memory, never forming J (J is symmetric, so gᵀJ = J g), with g = ∂ℒ/∂p;
* :class:`SoftmaxFunction` — a ``torch.autograd.Function`` whose backward is that O(n) product;
  :func:`softmax_fn` applies it;
* :func:`jacobian_backward` — the O(n²) route (build J, multiply), for timing comparisons;
* :func:`saturation_sweep` and :func:`saturation_figure` — what happens to the weights and to the
  gradient with respect to the scores as the scores grow (the softmax saturates).
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import torch

from .plots import MAX_WIDTH, line_plot, styled

__all__ = ["softmax_jacobian", "softmax_vjp", "jacobian_backward", "SoftmaxFunction", "softmax_fn",
           "saturation_sweep", "saturation_figure"]


def softmax_jacobian(p: torch.Tensor) -> torch.Tensor:
    """J = diag(p) − p pᵀ for each leading index.

    Args:
        p: softmax probabilities, shape (…, n) (each slice along the last axis sums to 1).
    Returns:
        J, shape (…, n, n), with J[…, i, j] = ∂p_i/∂z_j = p_i (δ_ij − p_j).
    """
    outer = p.unsqueeze(-1) * p.unsqueeze(-2)  # (…, n, 1) * (…, 1, n) → (…, n, n)
    return torch.diag_embed(p) - outer


def softmax_vjp(p: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """∂ℒ/∂z from ∂ℒ/∂p without forming J: p ⊙ (g − ⟨g, p⟩).

    Args:
        p: softmax probabilities, shape (…, n).
        grad: upstream gradient g = ∂ℒ/∂p, shape (…, n).
    Returns:
        ∂ℒ/∂z, shape (…, n). O(n) time and memory per slice.
    """
    dot = (grad * p).sum(dim=-1, keepdim=True)  # ⟨g, p⟩ per slice: (…, 1)
    return p * (grad - dot)  # (…, n)


def jacobian_backward(p: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The same product the O(n²) way: build J (…, n, n), then J g. For timing and demonstrations."""
    return (softmax_jacobian(p) @ grad.unsqueeze(-1)).squeeze(-1)


class SoftmaxFunction(torch.autograd.Function):
    """Softmax along the last axis with a hand-written O(n) backward.

    ``SoftmaxFunction.apply(z)``: z (…, n) → p (…, n). Backward receives ∂ℒ/∂p (…, n) and returns
    ∂ℒ/∂z (…, n) via :func:`softmax_vjp`, using only the saved output p.
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor) -> torch.Tensor:
        shifted = z - z.amax(dim=-1, keepdim=True)  # stable: the largest score becomes 0
        e = torch.exp(shifted)
        p = e / e.sum(dim=-1, keepdim=True)
        ctx.save_for_backward(p)  # the backward needs only the output
        return p

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (p,) = ctx.saved_tensors
        return softmax_vjp(p, grad)


def softmax_fn(z: torch.Tensor) -> torch.Tensor:
    """softmax(z) along the last axis through :class:`SoftmaxFunction` (differentiable)."""
    return SoftmaxFunction.apply(z)


def saturation_sweep(factors: Sequence[float], n_rows: int = 512, n_keys: int = 16, seed: int = 2) -> dict:
    """Softmax of α·z for standard-normal scores z (``n_rows`` rows of ``n_keys``) at each α in ``factors``,
    with a random upstream gradient g = ∂ℒ/∂p (entries N(0, 1)). Returns lists, one value per α:

    * ``peak`` — the mean over rows of the largest weight;
    * ``grad_scores`` — the mean of ‖∂ℒ/∂z‖, the gradient with respect to the scores (= p ⊙ (g − ⟨g, p⟩));
    * ``jacobian_norm`` — the mean Frobenius norm ‖J‖_F;
    * ``top2_share`` — the share of Σ_j |∂ℒ/∂z_j| on the two keys with the largest weights (key j gets
      p_j (g_j − ⟨g, p⟩), in proportion to its own weight).
    """
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n_rows, n_keys, generator=g, dtype=torch.float64)  # (rows, keys)
    upstream = torch.randn(n_rows, n_keys, generator=g, dtype=torch.float64)  # dL/dp
    out: dict[str, list[float]] = {"peak": [], "grad_scores": [], "jacobian_norm": [], "top2_share": []}
    for alpha in factors:
        p = torch.softmax(alpha * base, dim=-1)  # (rows, keys)
        grad = softmax_vjp(p, upstream).abs()  # |dL/dz|: (rows, keys)
        top2 = p.topk(2, dim=-1).indices  # (rows, 2)
        out["peak"].append(p.max(dim=-1).values.mean().item())
        out["grad_scores"].append(softmax_vjp(p, upstream).norm(dim=-1).mean().item())
        out["jacobian_norm"].append(torch.linalg.matrix_norm(softmax_jacobian(p)).mean().item())
        out["top2_share"].append((grad.gather(1, top2).sum(-1) / grad.sum(-1)).mean().item())
    return out


@styled
def saturation_figure(factors: Sequence[float], stats: dict, marked: float = 1.0) -> plt.Figure:
    """Three panels against the score scale α (log axis): the mean largest weight; the gradient with
    respect to the scores and ‖J‖_F (log axis), titled with the α where the gradient peaks; the share of
    that gradient on the top two keys."""
    fig, axes = plt.subplots(1, 3, figsize=(MAX_WIDTH, 3.6))
    line_plot(factors, {"mean largest weight": stats["peak"]}, ax=axes[0], logx=True, xlabel="score scale α",
              ylabel="mean largest weight", title="Softmax saturates")
    peak = factors[max(range(len(factors)), key=lambda i: stats["grad_scores"][i])]
    line_plot(factors, {"‖∂ℒ/∂z‖": stats["grad_scores"], "‖J‖_F": stats["jacobian_norm"]}, ax=axes[1], logx=True,
              logy=True, xlabel="score scale α", ylabel="mean norm", title=f"∂ℒ/∂scores shrinks past α = {peak:g}")
    line_plot(factors, {"top-2 share": stats["top2_share"]}, ax=axes[2], logx=True, xlabel="score scale α",
              ylabel="share on the top 2 keys", title="…and goes to the top keys")
    axes[0].set_ylim(0, 1)
    axes[2].set_ylim(0, 1)
    for ax in axes:
        ax.axvline(marked, color="grey", linestyle=":")
    axes[0].text(marked * 1.1, 0.05, "α = 1", color="grey", fontsize=9)
    fig.tight_layout()
    return fig
