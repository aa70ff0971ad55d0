"""Why attention divides its scores by √d_k (notebook 02): reference code, experiments, figures, explorer.

If the entries of a query q and a key k are independent with mean 0 and variance σ², each product
q_i k_i has variance σ⁴ and the d_k of them add up: ``Var(q · k) = σ⁴ · d_k``. Dividing the score by
√d_k divides its variance by d_k, back to σ⁴ whatever the dimension.

* :func:`mc_score_variance` — Monte-Carlo estimate of Var(q · k); :func:`mc_standard_error` — how
  far such an estimate typically lands from the truth;
* :func:`scaled_scores` — ``Q Kᵀ / √d_k``;
* :func:`variance_vs_dk`, :func:`saturation_vs_dk` — the experiments behind the notebook's figures
  (saturation: the largest softmax weight and the gradients at the scores and at the query, for
  unscaled and scaled scores);
* :func:`plot_variance_vs_dk`, :func:`plot_saturation` and :func:`explore_dk` (the d_k slider, drawn by
  :func:`draw_dk`): the figures.

"Unscaled" scores are ``q · k``; "scaled" ones ``q · k / √d_k``.
"""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import torch

from .dot import check_qk, score_matrix
from .plots import styled

__all__ = [
    "mc_score_variance",
    "mc_standard_error",
    "scaled_scores",
    "variance_vs_dk",
    "saturation_vs_dk",
    "plot_variance_vs_dk",
    "plot_saturation",
    "draw_dk",
    "explore_dk",
    "DIMS",
]

#: The key sizes the notebook sweeps: 4, 8, …, 1024.
DIMS = [2**p for p in range(2, 11)]


def mc_score_variance(d_k: int, sigma: float = 1.0, n_samples: int = 20_000,
                      generator: torch.Generator | None = None) -> float:
    """Estimate Var(q · k) from ``n_samples`` random pairs q, k with i.i.d. N(0, σ²) entries, every draw
    taken from ``generator`` (the global random state when it is None).

    Returns a Python float, the sample variance of the ``n_samples`` dot products; its expected value is
    σ⁴ · d_k.
    """
    # drawn in float32 (fast), added up in float64 (the printed digits do not depend on the CPU's summation order)
    q = sigma * torch.randn(n_samples, d_k, generator=generator).double()  # (n, d_k)
    k = sigma * torch.randn(n_samples, d_k, generator=generator).double()  # (n, d_k)
    scores = (q * k).sum(dim=-1)  # (n,): one dot product per pair
    return scores.var().item()


def mc_standard_error(d_k: int, sigma: float = 1.0, n_samples: int = 20_000) -> float:
    """Standard error of :func:`mc_score_variance`'s estimate.

    For s = q · k with Gaussian entries, E[s²] = d σ⁴ and E[s⁴] = (3d² + 6d) σ⁸, so the sample variance
    of n draws has variance (E[s⁴] − E[s²]²) / n = (2d² + 6d) σ⁸ / n (to leading order in 1/n). Relative
    to the true value σ⁴ d, that is √((2 + 6/d) / n).
    """
    return math.sqrt((2 * d_k**2 + 6 * d_k) / n_samples) * sigma**4


def scaled_scores(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Scores divided by √d_k, where d_k is the size of each query/key vector (the last axis).

    Q: (..., n_q, d_k)   K: (..., n_k, d_k)   ->   (..., n_q, n_k)
    """
    check_qk(Q, K, "Q", "K")
    d_k = Q.shape[-1]
    return score_matrix(Q, K) / math.sqrt(d_k)


def variance_vs_dk(dims: Sequence[int] = DIMS, sigma: float = 1.0, n_samples: int = 2000, seed: int = 0) -> torch.Tensor:
    """Measured Var(q · k) for each d_k in ``dims`` (one seeded generator for the whole sweep)."""
    g = torch.Generator().manual_seed(seed)
    return torch.tensor([mc_score_variance(d, sigma, n_samples, g) for d in dims], dtype=torch.float64)


def saturation_vs_dk(dims: Sequence[int] = DIMS, n_keys: int = 16, n_trials: int = 1000, seed: int = 0) -> dict:
    """What softmax and its gradients do with unscaled and with scaled scores as d_k grows.

    For each d_k: ``n_trials`` random queries q, each against ``n_keys`` random keys K (entries N(0, 1)),
    scores s = K q (unscaled) or K q / √d_k (scaled), weights p = softmax(s) and a loss ℒ = u · p with a
    random unit upstream gradient u (one per trial). Returns tensors of shape (len(dims),), each a mean
    over the trials, for ``name`` in ("unscaled", "scaled"):

    * ``max_weight_<name>`` — the largest weight (1/n_keys is uniform, 1 is one-hot);
    * ``grad_scores_<name>`` — ‖∂ℒ/∂s‖, the gradient that reaches the scores through softmax;
    * ``top2_share_<name>`` — the share of that gradient (sum of absolute values) on the two keys with
      the largest weights: softmax passes key j a gradient proportional to its weight p_j;
    * ``grad_q_<name>`` — ‖∂ℒ/∂q‖, the gradient that reaches the query (in a model, what would update W^Q);
    * ``score_step_<name>`` — ‖Δs‖ after one gradient-descent step on q with learning rate 1: how far
      one step moves the scores.
    """
    g = torch.Generator().manual_seed(seed)
    names = ("max_weight", "grad_scores", "top2_share", "grad_q", "score_step")
    result = {f"{key}_{kind}": [] for key in names for kind in ("unscaled", "scaled")}
    for d in dims:
        q = torch.randn(n_trials, 1, d, generator=g).double()                   # (trials, 1, d)
        K = torch.randn(n_trials, n_keys, d, generator=g).double()              # (trials, n_keys, d)
        upstream = torch.randn(n_trials, n_keys, generator=g).double()
        upstream = upstream / upstream.norm(dim=-1, keepdim=True)               # (trials, n_keys), unit rows
        for kind, divisor in (("unscaled", 1.0), ("scaled", math.sqrt(d))):
            q_leaf = q.detach().requires_grad_(True)
            scores = score_matrix(q_leaf, K).squeeze(1) / divisor                # (trials, n_keys)
            scores.retain_grad()
            weights = torch.softmax(scores, dim=-1)                              # (trials, n_keys)
            (weights * upstream).sum().backward()
            grad_s, grad_q = scores.grad, q_leaf.grad.squeeze(1)                 # (trials, n_keys), (trials, d)
            top2 = weights.topk(2, dim=-1).indices                               # (trials, 2)
            step = (K @ -grad_q.unsqueeze(-1)).squeeze(-1) / divisor             # (trials, n_keys): Δs for Δq = -∂ℒ/∂q
            result[f"max_weight_{kind}"].append(weights.max(dim=-1).values.mean().item())
            result[f"grad_scores_{kind}"].append(grad_s.norm(dim=-1).mean().item())
            result[f"top2_share_{kind}"].append((grad_s.abs().gather(1, top2).sum(-1) / grad_s.abs().sum(-1)).mean().item())
            result[f"grad_q_{kind}"].append(grad_q.norm(dim=-1).mean().item())
            result[f"score_step_{kind}"].append(step.norm(dim=-1).mean().item())
    return {key: torch.tensor(values, dtype=torch.float64) for key, values in result.items()}


@styled
def plot_variance_vs_dk(dims: Sequence[int], measured: dict[str, torch.Tensor], sigmas: dict[str, float]) -> plt.Figure:
    """Log-log plot of measured Var(q · k) against d_k, each with its theory line σ⁴ · d_k, and the
    variance after dividing the scores by √d_k."""
    fig, ax = plt.subplots(figsize=(9.6, 4.6))
    x = torch.tensor(list(dims), dtype=torch.float64)
    for (label, values), colour in zip(measured.items(), ("C0", "C1", "C2", "C3")):
        sigma = sigmas[label]
        ax.plot(x, values, "o", color=colour, label=f"measured, {label}")
        ax.plot(x, sigma**4 * x, "--", color=colour, label=f"theory σ⁴·d_k, {label}")
        ax.plot(x, values / x, "s", color=colour, alpha=0.5, markersize=5, label=f"after ÷√d_k, {label}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("d_k (size of query and key vectors)")
    ax.set_ylabel("Var(q · k)")
    ax.set_title("Score variance grows like d_k; ÷√d_k keeps it at σ⁴")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=9)
    fig.tight_layout()
    return fig


@styled
def plot_saturation(dims: Sequence[int], stats: dict, n_keys: int) -> plt.Figure:
    """Four panels against d_k, unscaled vs scaled: the largest softmax weight, ‖∂ℒ/∂scores‖, the share of
    that gradient on the top two keys, and ‖∂ℒ/∂q‖."""
    fig, axes = plt.subplots(2, 2, figsize=(9.6, 6.6), sharex=True)
    x = list(dims)
    panels = [
        ("max_weight", "mean largest weight", "Softmax saturates without the scale", False),
        ("grad_scores", "mean ‖∂ℒ/∂scores‖", "The gradient at the scores shrinks…", True),
        ("top2_share", "share on the top 2 keys", "…and reaches only the top keys", False),
        ("grad_q", "mean ‖∂ℒ/∂q‖", "The gradient at the query does not shrink", True),
    ]
    for ax, (key, ylabel, title, log) in zip(axes.flat, panels):
        ax.plot(x, stats[f"{key}_unscaled"], "o-", color="C3", label="unscaled q·k")
        ax.plot(x, stats[f"{key}_scaled"], "s-", color="C0", label="scaled q·k/√d_k")
        ax.set_xscale("log", base=2)
        if log:
            ax.set_yscale("log")
            # start the axis at a round number (1, 2, 3 or 5 × 10^k) below the lowest point, so that a tick
            # label sits under every point
            lowest = min(float(stats[f"{key}_unscaled"].min()), float(stats[f"{key}_scaled"].min()))
            decade = 10.0 ** math.floor(math.log10(lowest))
            ax.set_ylim(bottom=max(c * decade for c in (1, 2, 3, 5) if c * decade <= lowest))
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].axhline(1 / n_keys, color="grey", linestyle=":", label=f"uniform (1/{n_keys})")
    axes[0][0].set_ylim(0, 1.05)
    axes[1][0].set_ylim(0, 1.05)
    axes[0][0].legend(loc="center right", fontsize=9)
    for ax in axes[1]:
        ax.set_xlabel("d_k")
    fig.tight_layout()
    return fig


@styled
def draw_dk(d_k: int = 64, n_keys: int = 8, seed: int = 0) -> plt.Figure:
    """One state of the d_k explorer: histograms of unscaled and scaled scores, and one query's softmax
    weights over ``n_keys`` keys with each."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1000, 1, d_k, generator=g)        # (1000, 1, d_k): many queries for the histogram
    K = torch.randn(1000, n_keys, d_k, generator=g)   # (1000, n_keys, d_k)
    unscaled = score_matrix(q, K).squeeze(1)          # (1000, n_keys)
    scaled = unscaled / math.sqrt(d_k)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.9))
    reach = max(4.0, 4.0 * math.sqrt(d_k))            # ±4 standard deviations of the unscaled scores
    # each histogram gets bins of its own (80 over ±4 of its standard deviations), so that the scaled one keeps
    # its shape, a bell of height ≈ 0.4, however wide the unscaled one has become
    left.hist(unscaled.flatten().tolist(), bins=torch.linspace(-reach, reach, 81).tolist(), alpha=0.6, density=True,
              color="C3", label=f"unscaled, std {unscaled.std():.1f}")
    left.hist(scaled.flatten().tolist(), bins=torch.linspace(-4.0, 4.0, 81).tolist(), alpha=0.6, density=True,
              color="C0", label=f"scaled, std {scaled.std():.1f}")
    left.set_xlim(-reach, reach)
    left.set_ylim(0, 0.45)
    left.set_xlabel("score")
    left.set_ylabel("density")
    left.set_title(f"Score distribution, d_k = {d_k}")
    left.legend(loc="upper left", fontsize=9)
    positions = torch.arange(n_keys)
    width = 0.4
    right.bar(positions - width / 2, torch.softmax(unscaled[0], -1).tolist(), width, color="C3", label="unscaled")
    right.bar(positions + width / 2, torch.softmax(scaled[0], -1).tolist(), width, color="C0", label="scaled")
    right.axhline(1 / n_keys, color="grey", linestyle=":", label="uniform")
    right.set_ylim(0, 1.05)
    right.set_xticks(positions.tolist(), [f"k{j}" for j in range(n_keys)])
    right.set_xlabel("key")
    right.set_ylabel("softmax weight")
    right.set_title(f"One query's weights over {n_keys} keys")
    right.legend(loc="upper right", fontsize=9)
    fig.tight_layout()
    return fig


def explore_dk(d_k: int = 64):
    """The d_k slider: drag it and watch unscaled scores spread and softmax turn nearly one-hot; scaled ones do not."""
    import ipywidgets as widgets

    from .widgets import explorer

    slider = widgets.SelectionSlider(options=DIMS, value=d_k, description="d_k", continuous_update=False)
    return explorer(draw_dk, {"d_k": slider}, title="Scores and softmax weights as d_k grows")
