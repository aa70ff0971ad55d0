"""Why attention divides its scores by √d_k (notebook 02): reference code, experiments, figures, explorer.

If the entries of a query q and a key k are independent with mean 0 and variance σ², each product
q_i k_i has variance σ⁴ and the d_k of them add up: ``Var(q · k) = σ⁴ · d_k``. Dividing the score by
√d_k divides its variance by d_k, back to σ⁴ whatever the dimension.

* :func:`mc_score_variance` — Monte-Carlo estimate of Var(q · k); :func:`mc_standard_error` — how
  far such an estimate typically lands from the truth;
* :func:`scaled_scores` — ``Q Kᵀ / √d_k``;
* :func:`variance_vs_dk`, :func:`saturation_vs_dk` — the experiments behind the notebook's figures;
* :func:`explore_dk` — the d_k slider: score distribution and softmax weights with and without scaling.
"""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import torch

from .dot import score_matrix

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
    """Estimate Var(q · k) from ``n_samples`` random pairs q, k with i.i.d. N(0, σ²) entries.

    Returns a Python float; the expected value is σ⁴ · d_k.
    """
    # drawn in float32 (fast), added up in float64 (the printed digits do not depend on the CPU's summation order)
    q = sigma * torch.randn(n_samples, d_k, generator=generator).double()  # (n, d_k)
    k = sigma * torch.randn(n_samples, d_k, generator=generator).double()  # (n, d_k)
    scores = (q * k).sum(dim=-1)  # (n,): one dot product per pair
    return scores.var().item()


def mc_standard_error(d_k: int, sigma: float = 1.0, n_samples: int = 20_000) -> float:
    """Standard error of :func:`mc_score_variance`'s estimate.

    For s = q · k with Gaussian entries, E[s²] = d σ⁴ and E[s⁴] = (3d² + 6d) σ⁸, so the sample variance
    of n draws has variance (E[s⁴] − E[s²]²) / n = (2d² + 6d) σ⁸ / n.
    """
    return math.sqrt((2 * d_k**2 + 6 * d_k) / n_samples) * sigma**4


def scaled_scores(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """Scores divided by √d_k, where d_k is the size of each query/key vector (the last axis).

    Q: (..., n_q, d_k)   K: (..., n_k, d_k)   ->   (..., n_q, n_k)
    """
    d_k = Q.shape[-1]
    return score_matrix(Q, K) / math.sqrt(d_k)


def variance_vs_dk(dims: Sequence[int] = DIMS, sigma: float = 1.0, n_samples: int = 2000, seed: int = 0) -> torch.Tensor:
    """Measured Var(q · k) for each d_k in ``dims`` (one seeded generator for the whole sweep)."""
    g = torch.Generator().manual_seed(seed)
    return torch.tensor([mc_score_variance(d, sigma, n_samples, g) for d in dims], dtype=torch.float64)


def saturation_vs_dk(dims: Sequence[int] = DIMS, n_keys: int = 16, n_trials: int = 200, seed: int = 0) -> dict:
    """How softmax behaves on raw and on scaled scores as d_k grows.

    For each d_k: ``n_trials`` random queries, each against ``n_keys`` random keys (entries N(0, 1)).
    Returns tensors of shape (len(dims),):

    * ``max_weight_raw`` / ``max_weight_scaled`` — mean largest softmax weight (1/n_keys is uniform,
      1 is one-hot);
    * ``grad_norm_raw`` / ``grad_norm_scaled`` — mean norm of the gradient that reaches the scores
      through softmax, for a random unit upstream gradient (autograd). It falls to 0 as softmax
      saturates: the model stops learning which key to attend to.
    """
    g = torch.Generator().manual_seed(seed)
    result = {key: [] for key in ("max_weight_raw", "max_weight_scaled", "grad_norm_raw", "grad_norm_scaled")}
    for d in dims:
        q = torch.randn(n_trials, 1, d, generator=g).double()                   # (trials, 1, d)
        K = torch.randn(n_trials, n_keys, d, generator=g).double()              # (trials, n_keys, d)
        upstream = torch.randn(n_trials, n_keys, generator=g).double()
        upstream = upstream / upstream.norm(dim=-1, keepdim=True)               # (trials, n_keys), unit rows
        raw = score_matrix(q, K).squeeze(1)                                      # (trials, n_keys)
        for name, scores in (("raw", raw), ("scaled", raw / math.sqrt(d))):
            scores = scores.detach().requires_grad_(True)
            weights = torch.softmax(scores, dim=-1)                              # (trials, n_keys)
            (weights * upstream).sum().backward()
            result[f"max_weight_{name}"].append(weights.max(dim=-1).values.mean().item())
            result[f"grad_norm_{name}"].append(scores.grad.norm(dim=-1).mean().item())
    return {key: torch.tensor(values, dtype=torch.float64) for key, values in result.items()}


def plot_variance_vs_dk(dims: Sequence[int], measured: dict[str, torch.Tensor], sigmas: dict[str, float]) -> plt.Figure:
    """Log-log plot of measured Var(q · k) against d_k, each with its theory line σ⁴ · d_k."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    x = torch.tensor(list(dims), dtype=torch.float64)
    for (label, values), colour in zip(measured.items(), ("C0", "C1", "C2", "C3")):
        sigma = sigmas[label]
        ax.plot(x, values, "o", color=colour, label=f"measured, {label}")
        ax.plot(x, sigma**4 * x, "--", color=colour, label=f"theory σ⁴·d_k, {label}")
        ax.plot(x, values / x, "s", color=colour, alpha=0.5, markersize=4,
                label=f"measured after ÷√d_k, {label}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("d_k (size of query and key vectors)")
    ax.set_ylabel("Var(q · k)")
    ax.set_title("Score variance grows linearly with d_k; ÷√d_k flattens it")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_saturation(dims: Sequence[int], stats: dict, n_keys: int) -> plt.Figure:
    """Two panels against d_k: the largest softmax weight, and the gradient norm, raw vs scaled."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = list(dims)
    left.plot(x, stats["max_weight_raw"], "o-", label="raw scores q·k")
    left.plot(x, stats["max_weight_scaled"], "s-", label="scaled scores q·k/√d_k")
    left.axhline(1 / n_keys, color="grey", linestyle=":", label=f"uniform (1/{n_keys})")
    left.set_ylim(0, 1.05)
    left.set_ylabel("mean largest softmax weight")
    left.set_title("Softmax saturates without scaling")
    right.plot(x, stats["grad_norm_raw"], "o-", label="raw scores")
    right.plot(x, stats["grad_norm_scaled"], "s-", label="scaled scores")
    right.set_yscale("log")
    right.set_ylabel("mean gradient norm at the scores")
    right.set_title("…and the gradient through it vanishes")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("d_k")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def draw_dk(d_k: int = 64, n_keys: int = 8, seed: int = 0) -> plt.Figure:
    """One state of the d_k explorer: score histograms, and one query's softmax weights, raw vs scaled."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1000, 1, d_k, generator=g)        # (1000, 1, d_k): many queries for the histogram
    K = torch.randn(1000, n_keys, d_k, generator=g)   # (1000, n_keys, d_k)
    raw = score_matrix(q, K).squeeze(1)               # (1000, n_keys)
    scaled = raw / math.sqrt(d_k)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    bins = torch.linspace(-100, 100, 161).tolist()
    left.hist(raw.flatten().tolist(), bins=bins, alpha=0.6, density=True, label=f"raw, std {raw.std():.1f}")
    left.hist(scaled.flatten().tolist(), bins=bins, alpha=0.6, density=True, label=f"scaled, std {scaled.std():.1f}")
    left.set_xlim(-100, 100)
    left.set_ylim(0, 0.45)
    left.set_xlabel("score")
    left.set_ylabel("density")
    left.set_title(f"Score distribution, d_k = {d_k}")
    left.legend()
    positions = torch.arange(n_keys)
    width = 0.4
    right.bar(positions - width / 2, torch.softmax(raw[0], -1).tolist(), width, label="softmax(raw)")
    right.bar(positions + width / 2, torch.softmax(scaled[0], -1).tolist(), width, label="softmax(scaled)")
    right.axhline(1 / n_keys, color="grey", linestyle=":", label="uniform")
    right.set_ylim(0, 1.05)
    right.set_xticks(positions.tolist(), [f"k{j}" for j in range(n_keys)])
    right.set_xlabel("key")
    right.set_ylabel("attention weight")
    right.set_title("One query's weights over 8 keys")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def explore_dk(d_k: int = 64):
    """The d_k slider: drag it and watch raw scores spread and softmax turn one-hot; scaled ones don't."""
    import ipywidgets as widgets

    from .widgets import explorer

    slider = widgets.SelectionSlider(options=DIMS, value=d_k, description="d_k", continuous_update=False)
    return explorer(draw_dk, {"d_k": slider}, title="Scores and softmax weights as d_k grows")
