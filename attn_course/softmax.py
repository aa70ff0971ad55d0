"""Softmax, stably: the reference versions of what notebook 03 builds, plus its figures.

Every function works along any axis ``dim``; the softmax family accepts a ``torch.Tensor`` or a
NumPy array and returns the same kind it was given (shape unchanged unless stated):

* :func:`softmax` — subtract the maximum of each slice along ``dim``, exponentiate, normalise;
* :func:`naive_softmax` — the textbook formula without the shift, kept for demonstrations of
  overflow (e^1000 = inf) and underflow (e^-1000 = 0);
* :func:`logsumexp` — log Σ e^x computed as m + log Σ e^(x − m), ``dim`` removed (or kept);
* :func:`log_softmax` — x − logsumexp(x), finite even where softmax underflows to 0;
* :func:`softmax_with_temperature` — softmax(x / T);
* :func:`masked_softmax` — softmax over the allowed positions: **the course's one mask rule** (bool
  mask, True = may attend; a fully masked row gets all-zero weights), used by every reference that masks;
* :func:`entropy` — the course's one entropy, −Σ p log p with 0·log 0 = 0 (notebook 08 uses it too);
* :func:`temperature_sweep_figure` and :func:`temperature_explorer` — one score vector at several
  temperatures, as a static figure and as a slider.

(``masked_softmax`` takes tensors; ``entropy`` takes a tensor or an array and returns float64.)
"""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from .plots import MAX_WIDTH, styled

__all__ = [
    "softmax",
    "naive_softmax",
    "logsumexp",
    "log_softmax",
    "softmax_with_temperature",
    "masked_softmax",
    "entropy",
    "temperature_sweep_figure",
    "temperature_explorer",
]


def _is_numpy(x) -> bool:
    return isinstance(x, np.ndarray)


def _amax(x, dim: int):
    """Maximum along ``dim``, kept as a size-1 axis so that it broadcasts against ``x`` (the first step of every
    stable formula here, so the one place that says what ``x`` and ``dim`` must be)."""
    if not (_is_numpy(x) or isinstance(x, torch.Tensor)):
        raise TypeError(f"x must be a torch.Tensor or a NumPy array, but you passed a {type(x).__name__}; "
                        "wrap it with torch.tensor(...) first.")
    if not -x.ndim <= dim < x.ndim or x.shape[dim] == 0:
        raise ValueError(f"dim={dim} must name an axis of x with at least one entry, but x has shape {tuple(x.shape)}.")
    if _is_numpy(x):
        return x.max(axis=dim, keepdims=True)
    return x.amax(dim=dim, keepdim=True)


def _exp(x):
    return np.exp(x) if _is_numpy(x) else torch.exp(x)


def _log(x):
    return np.log(x) if _is_numpy(x) else torch.log(x)


def _sum(x, dim: int, keepdim: bool = True):
    if _is_numpy(x):
        return x.sum(axis=dim, keepdims=keepdim)
    return x.sum(dim=dim, keepdim=keepdim)


def _finite_shift(m):
    """The shift used by the stable formulas: the maximum, or 0 where a slice is all -inf.

    A fully masked slice (every entry -inf) has maximum -inf, and -inf - (-inf) is NaN; shifting by 0
    there instead leaves the slice's exponentials at 0, which is the honest answer for its sum.
    """
    if _is_numpy(m):
        return np.where(np.isfinite(m), m, 0.0)
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def softmax(x, dim: int = -1):
    """Numerically stable softmax along ``dim``.

    Args:
        x: scores, any shape (…, n, …), a tensor or a NumPy array.
        dim: the axis that is normalised (each slice along it sums to 1).
    Returns:
        weights shaped like ``x``: positive, summing to 1 along ``dim``.
    """
    shifted = x - _finite_shift(_amax(x, dim))  # largest entry of each slice becomes 0: exp ≤ 1
    e = _exp(shifted)
    return e / _sum(e, dim)


def naive_softmax(x, dim: int = -1):
    """Softmax without the max shift: e^x / Σ e^x. Overflows for x ≳ 88.7 (float32), 709.8 (float64)."""
    e = _exp(x)
    return e / _sum(e, dim)


def logsumexp(x, dim: int = -1, keepdim: bool = False):
    """log Σ_j e^{x_j} along ``dim``, computed as m + log Σ e^{x_j − m} (m the slice maximum).

    Returns the shape of ``x`` with ``dim`` removed (kept with size 1 when ``keepdim``).
    """
    m = _finite_shift(_amax(x, dim))
    out = m + _log(_sum(_exp(x - m), dim))
    if keepdim:
        return out
    return out.squeeze(axis=dim) if _is_numpy(out) else out.squeeze(dim)


def log_softmax(x, dim: int = -1):
    """log softmax(x) along ``dim`` as x − logsumexp(x): stays finite where softmax underflows to 0."""
    return x - logsumexp(x, dim, keepdim=True)


def softmax_with_temperature(x, temperature: float, dim: int = -1):
    """softmax(x / T) along ``dim``: T > 1 flattens the weights, T < 1 sharpens them (T → 0: arg-max)."""
    try:
        positive = not isinstance(temperature, bool) and bool(temperature > 0)
    except (TypeError, RuntimeError):  # None, a string, a tensor of several numbers
        positive = False
    if not positive:
        raise ValueError(f"temperature must be a positive number, but you passed {temperature!r}")
    return softmax(x / temperature, dim)


def check_mask(scores, mask, name: str = "scores"):
    """Validate ``scores`` and ``mask`` for :func:`masked_softmax`; returns the mask as a tensor (or None).

    Refuses, with a message naming the mistake, what would otherwise crash deep in PyTorch or give a
    silently wrong answer: non-tensor or integer scores, an integer mask (0/1 would be *added* to the
    scores, blocking nothing), a float mask of only 0s and 1s (a keep-mask in the wrong dtype), and a
    mask that does not broadcast to the scores' shape.
    """
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, but you passed a {type(scores).__name__}; "
                        "convert it with torch.as_tensor(...) first.")
    if not scores.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, but yours has dtype {scores.dtype}; "
                        "convert it with .float().")
    if mask is None:
        return None
    mask = torch.as_tensor(mask, device=scores.device)
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"mask must be a bool tensor (True = may attend) or an additive float tensor (0 keeps, "
                        f"-inf blocks), but yours has dtype {mask.dtype}; use mask.bool() for a 0/1 keep-mask.")
    if mask.is_floating_point() and mask.numel() and bool(((mask == 0) | (mask == 1)).all()) and bool((mask == 1).any()):
        raise ValueError("your float mask holds only 0s and 1s, which looks like a keep-mask, but a float mask is "
                         "added to the scores (0 keeps, -inf blocks); pass mask.bool() instead.")
    try:
        torch.broadcast_shapes(mask.shape, scores.shape)
    except RuntimeError:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, which does not broadcast to the {name}' shape "
                         f"{tuple(scores.shape)} (..., n_q, n_k); you need a mask of shape (n_q, n_k) or one that "
                         "broadcasts to it.") from None
    return mask


def masked_softmax(scores: torch.Tensor, mask=None, dim: int = -1) -> torch.Tensor:
    """Softmax of ``scores`` over the allowed positions along ``dim``: **the course's one mask rule**.

    ``mask`` is None, a bool tensor (True = may attend, as ``F.scaled_dot_product_attention``) or an
    additive float tensor (0 keeps, -inf blocks), broadcastable to ``scores``. Blocked positions get
    weight exactly 0. A slice with every position blocked (a *fully masked row*) gets all-zero weights,
    not the NaN that softmax over -inf everywhere gives: such a query attends to nothing, and its
    output (weights @ V) is a zero vector — what ``F.scaled_dot_product_attention`` returns for it
    from PyTorch 2.5 on. Every reference in ``attn_course`` that masks uses this function.
    """
    mask = check_mask(scores, mask)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.to(scores.dtype)
    blocked = torch.isneginf(scores).all(dim=dim, keepdim=True)  # fully masked slices
    weights = torch.softmax(scores.masked_fill(blocked, 0.0), dim=dim)
    return weights.masked_fill(blocked, 0.0)


def entropy(weights, dim: int = -1):
    """Shannon entropy −Σ p log p (nats) along ``dim``; 0·log 0 counts as 0."""
    w = torch.as_tensor(weights, dtype=torch.float64)
    terms = torch.where(w > 0, w * torch.log(torch.where(w > 0, w, torch.ones_like(w))), torch.zeros_like(w))
    return -terms.sum(dim)


def _bars(ax: plt.Axes, scores: torch.Tensor, temperature: float, labels: Sequence[str], *, narrow: bool) -> None:
    weights = softmax_with_temperature(scores, temperature)
    positions = np.arange(len(labels))
    ax.bar(positions, weights.numpy(), color="#3b75af")
    ax.set_xticks(positions, labels=list(labels), rotation=90 if narrow else 0)
    ax.set_ylim(0, 1)
    h = entropy(weights).item() / math.log(len(labels))
    sep = "\n" if narrow else " · "
    ax.set_title(f"T = {temperature:.2f}{sep}largest {weights.max().item():.2f}{sep}norm. entropy {h:.2f}",
                 fontsize=10)


@styled
def temperature_sweep_figure(
    scores,
    temperatures: Sequence[float] = (0.1, 0.5, 1.0, 2.0, 10.0),
    labels: Sequence[str] | None = None,
) -> plt.Figure:
    """One bar chart of softmax(scores / T) per temperature, side by side (at most ``MAX_WIDTH`` wide).

    ``scores`` has shape (n,); each panel's title gives the largest weight and the normalised entropy
    H / log n (0 = all weight on one key, 1 = uniform).
    """
    scores = torch.as_tensor(scores, dtype=torch.float64)
    labels = list(labels) if labels is not None else [str(i) for i in range(len(scores))]
    width = min(MAX_WIDTH, 0.8 + 1.75 * len(temperatures))
    fig, axes = plt.subplots(1, len(temperatures), figsize=(width, 3.8), sharey=True)
    for ax, t in zip(np.atleast_1d(axes), temperatures):
        _bars(ax, scores, float(t), labels, narrow=True)
    np.atleast_1d(axes)[0].set_ylabel("weight")
    fig.suptitle("softmax(scores / T): low T sharpens, high T flattens", fontsize=12)
    fig.tight_layout()
    return fig


def temperature_explorer(scores, labels: Sequence[str] | None = None, temperature: float = 1.0):
    """A temperature slider (log scale, 10^-1.3 ≈ 0.05 … 10^1.3 ≈ 19.95) over the bar chart of softmax(scores / T).

    The slider's read-out and the figure's title show T with the same two decimals. Live in a Jupyter
    kernel; a static figure at ``temperature`` elsewhere (see :mod:`attn_course.widgets`).
    """
    import ipywidgets as widgets

    from .widgets import explorer

    scores = torch.as_tensor(scores, dtype=torch.float64)
    labels = list(labels) if labels is not None else [str(i) for i in range(len(scores))]

    @styled
    def draw(temperature: float) -> plt.Figure:
        fig, ax = plt.subplots(figsize=(5.5, 3.4))
        _bars(ax, scores, temperature, labels, narrow=False)
        ax.set_ylabel("weight")
        fig.tight_layout()
        return fig

    slider = widgets.FloatLogSlider(value=temperature, base=10, min=-1.3, max=1.3, step=0.05,
                                    description="T", readout_format=".2f", continuous_update=True)
    return explorer(draw, {"temperature": slider}, title="Softmax temperature")
