"""Position (notebook 12): attention without position is permutation-equivariant; five ways to give it
position (sinusoidal encodings, T5's relative bias buckets, ALiBi, RoPE) and additive (Bahdanau) attention.

Conventions, stated once (the exercises' docstrings repeat them):

* **Sinusoidal encoding** (Vaswani et al. 2017, §3.5), interleaved: column 2i is sin(p / base^(2i/d)),
  column 2i + 1 is cos(p / base^(2i/d)); with an odd d the last column is a sine.
* **Relative positions** are j − i (key position minus query position: positive = the key comes after
  the query), as in T5 (Raffel et al. 2020) and its Hugging Face implementation.
* **ALiBi** (Press, Smith and Lewis 2022): head h (0-based) of H has slope m_h = 2^(−8(h+1)/H) and bias
  −m_h·|i − j| (for a causal model only j ≤ i matters, where it is the paper's −m_h·(i − j)).
* **RoPE** (Su et al. 2021, RoFormer) pairs **interleaved** dimensions (2i, 2i + 1), as in the RoFormer
  paper and Meta's original LLaMA code (GPT-NeoX and Hugging Face's LLaMA pair i with i + d/2 instead),
  and rotates the pair at position p by the angle +p·θ_i, θ_i = base^(−2i/d).
* **Additive attention** (Bahdanau, Cho and Bengio 2015): score(q, k) = wᵀ tanh(W_q q + W_k k).

Masks are boolean, True = may attend (the course's convention).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.ticker import MaxNLocator

from .plots import MAX_WIDTH, heatmap, styled
from .softmax import masked_softmax

__all__ = [
    "EQUIVARIANT",
    "POSITION_AWARE",
    "attention_variant",
    "permutation_gap",
    "sinusoidal_encoding",
    "relative_position_bucket",
    "relative_position_bias",
    "alibi_slopes",
    "alibi_bias",
    "apply_rope",
    "apply_rope_halves",
    "rope_angles",
    "rope_self_score",
    "additive_scores",
    "additive_attention",
    "saturation_vs_dk",
    "plot_encoding",
    "plot_bias_heads",
    "plot_rope",
    "plot_rope_decay",
    "plot_saturation",
]


# ============================================================================ attention with and without position
#: Functions x (..., n, d) → (..., n, d) that treat every position alike (a test must call them equivariant).
EQUIVARIANT = ("plain attention", "two heads", "sharp attention", "centred attention", "elementwise tanh",
               "feature mixing")
#: Attentions that see positions (a test must call them not equivariant).
POSITION_AWARE = ("sinusoidal positions", "learned positions", "causal mask", "symmetric distance bias", "RoPE")


def _weights(d: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * seed + d)
    return [(torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d)).to(dtype) for _ in range(3)]


def attention_variant(name: str, seed: int = 0) -> Callable[[torch.Tensor], torch.Tensor]:
    """A self-attention-like function x (..., n, d) → (..., n, d), any n ≥ 1 and d ≥ 1, float32 or float64
    (a tensor, or a NumPy array, which gets a NumPy array back).

    Its weights W^Q, W^K, W^V (d × d) are fixed by ``seed`` and d. ``name`` is one of :data:`EQUIVARIANT`
    (no position: permuting the rows of x permutes the rows of the output the same way) or
    :data:`POSITION_AWARE` (each breaks that in its own way).
    """
    if name not in EQUIVARIANT + POSITION_AWARE:
        raise ValueError(f"unknown attention variant {name!r}")

    def attn(x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, np.ndarray) and x.dtype.kind == "f":  # NumPy in, NumPy out
            return attn(torch.from_numpy(x)).numpy()
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or not x.is_floating_point():
            raise ValueError("attn takes a floating-point tensor x of shape (n, d) (or (..., n, d)), "
                             f"got {type(x).__name__} {tuple(getattr(x, 'shape', ()))}")
        if name == "elementwise tanh":
            return torch.tanh(x)
        if name == "feature mixing":  # each token alone, its features moved and combined exactly
            return 2 * x.roll(1, dims=-1) + x.flip(-1)
        n, d = x.shape[-2:]
        wq, wk, wv = _weights(d, x.dtype, seed)
        if name == "sinusoidal positions":
            x = x + sinusoidal_encoding(n, d).to(x.dtype)
        if name == "learned positions":  # one vector per position, as BERT's and GPT-2's embeddings
            g = torch.Generator().manual_seed(1000 * seed + 7 * d + n)
            x = x + torch.randn(n, d, generator=g, dtype=torch.float64).to(x.dtype)
        q, k, v = x @ wq, x @ wk, x @ wv  # (..., n, d) each
        if name == "RoPE":  # rotate the first 2⌊d/2⌋ dimensions
            even = d - d % 2
            q = torch.cat([apply_rope(q[..., :even]), q[..., even:]], dim=-1)
            k = torch.cat([apply_rope(k[..., :even]), k[..., even:]], dim=-1)
        heads = 2 if name == "two heads" and d >= 2 else 1
        bounds = [0, d // heads, d] if heads == 2 else [0, d]
        outs = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            scores = q[..., a:b] @ k[..., a:b].transpose(-2, -1) / math.sqrt(b - a)  # (..., n, n)
            if name == "sharp attention":
                scores = scores * 8.0
            if name == "centred attention":  # nearly uniform weights: each output row is close to the mean of v
                scores = scores * 1e-6
            if name == "symmetric distance bias":
                i = torch.arange(n)
                scores = scores - 0.5 * (i[:, None] - i[None, :]).abs().to(x.dtype)
            mask = torch.ones(n, n, dtype=torch.bool).tril() if name == "causal mask" else None
            outs.append(masked_softmax(scores, mask) @ v[..., a:b])
        out = torch.cat(outs, dim=-1)  # (..., n, d)
        if name == "centred attention":  # minus the mean over the tokens (itself order-free): outputs near 0,
            out = out - v.mean(dim=-2, keepdim=True)  # where only an absolute tolerance absorbs rounding
        return out

    attn.__name__ = attn.__qualname__ = name.replace(" ", "_").replace("-", "_")
    return attn


def permutation_gap(attn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, perm: torch.Tensor) -> float:
    """max |attn(x[perm]) − attn(x)[perm]| over the rows of x (..., n, d): 0 (up to rounding) when attn is
    permutation-equivariant."""
    return float((attn(x[..., perm, :]) - attn(x)[..., perm, :]).abs().max())


# ============================================================================ sinusoidal encodings
def sinusoidal_encoding(n: int, d: int, base: float = 10000.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(n, d): row p is position p's encoding. Column 2i = sin(p / base^(2i/d)), column 2i + 1 =
    cos(p / base^(2i/d)) (Vaswani et al. 2017, §3.5); with an odd d the last column is a sine."""
    p = torch.arange(n, dtype=torch.float64)[:, None]  # (n, 1)
    two_i = torch.arange(0, d, 2, dtype=torch.float64)  # (ceil(d/2),): 0, 2, 4, …
    angles = p / base ** (two_i / d)  # (n, ceil(d/2))
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d // 2])
    return pe.to(dtype)


# ============================================================================ T5 relative position bias
def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool = True, num_buckets: int = 32,
                             max_distance: int = 128) -> torch.Tensor:
    """T5's bucket (0 … num_buckets − 1) of each relative position j − i (Raffel et al. 2020).

    Bidirectional: half of the buckets are for keys after the query (j − i > 0), offset by num_buckets/2.
    Unidirectional: keys after the query all share bucket 0. Within a half of B buckets, distances below
    B/2 get a bucket each; larger ones share logarithmically wider buckets up to max_distance, beyond which
    everything falls in the last bucket. The logarithm is taken in float64 (T5 uses float32: the two can
    differ where the real value is a whole number).
    """
    rel = torch.as_tensor(relative_position).long()
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (rel > 0).long() * num_buckets
        distance = rel.abs()
    else:
        distance = (-rel).clamp(min=0)  # only keys before the query have a distance
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    scaled = torch.log(distance.double().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (scaled * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


def relative_position_bias(n: int, table: torch.Tensor, bidirectional: bool = True,
                           max_distance: int = 128) -> torch.Tensor:
    """(H, n, n) bias added to the scores: bias[h, i, j] = table[bucket(j − i), h].

    ``table`` (num_buckets, H) is the learned bias of each bucket and head (T5's ``nn.Embedding``)."""
    positions = torch.arange(n)
    rel = positions[None, :] - positions[:, None]  # (n, n): j − i
    buckets = relative_position_bucket(rel, bidirectional, table.shape[0], max_distance)  # (n, n)
    return table[buckets].permute(2, 0, 1)  # (n, n, H) → (H, n, n)


# ============================================================================ ALiBi
def alibi_slopes(n_heads: int) -> torch.Tensor:
    """(H,) ALiBi slopes (Press et al. 2022): 2^(−8(h+1)/H) for H a power of two. Otherwise, as in the
    authors' code, the slopes of the closest smaller power of two, then every other slope of twice that."""
    def power_of_two(h: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / h) for i in range(h)]

    if n_heads & (n_heads - 1) == 0:
        return torch.tensor(power_of_two(n_heads), dtype=torch.float64)
    closest = 2 ** int(math.floor(math.log2(n_heads)))
    extra = power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(power_of_two(closest) + extra, dtype=torch.float64)


def alibi_bias(n: int, n_heads: int) -> torch.Tensor:
    """(H, n, n) float64: bias[h, i, j] = −m_h·|i − j| (zero on the diagonal, more negative with distance)."""
    i = torch.arange(n, dtype=torch.float64)
    distance = (i[:, None] - i[None, :]).abs()  # (n, n)
    return -alibi_slopes(n_heads)[:, None, None] * distance  # (H, n, n)


# ============================================================================ RoPE
def rope_angles(positions: torch.Tensor, d: int, base: float = 10000.0) -> torch.Tensor:
    """(n, d/2) float64: the angle p·θ_i of pair i at each position p, θ_i = base^(−2i/d)."""
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    return torch.as_tensor(positions, dtype=torch.float64)[:, None] * theta  # (n, d/2)


def apply_rope(x: torch.Tensor, positions: torch.Tensor | None = None, base: float = 10000.0) -> torch.Tensor:
    """Rotate each interleaved pair (x_2i, x_2i+1) of x (..., n, d), d even, by +p·θ_i at position p:

        (x_2i, x_2i+1) → (x_2i cos − x_2i+1 sin, x_2i sin + x_2i+1 cos)

    ``positions`` (n,) defaults to 0 … n − 1. Same shape and dtype as x. Then
    rope(q, m) · rope(k, n) depends on m and n only through n − m (Su et al. 2021).
    """
    n, d = x.shape[-2:]
    if d % 2:
        raise ValueError(f"RoPE rotates pairs of dimensions: d must be even, got {d}")
    positions = torch.arange(n) if positions is None else positions
    angles = rope_angles(positions, d, base)  # (n, d/2)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., n, d/2) each
    out = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)  # (..., n, d/2, 2)
    return out.flatten(-2)  # (..., n, d): pairs back in place


def apply_rope_halves(x: torch.Tensor, positions: torch.Tensor | None = None, base: float = 10000.0) -> torch.Tensor:
    """The GPT-NeoX / Hugging Face LLaMA convention: dimension i is paired with i + d/2. It equals
    :func:`apply_rope` on x with its dimensions reordered (the two differ only in which weights are paired)."""
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    angles = rope_angles(positions, d, base)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    first, second = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def rope_self_score(d: int, distances: Sequence[int], base: float = 10000.0) -> torch.Tensor:
    """rope(u, 0) · rope(u, Δ) / d for the all-ones vector u: Σ_i 2cos(Δ·θ_i) / d, one value per Δ.
    The upper bound of the RoFormer paper (§3.4.3) has the same shape: it shrinks, oscillating, with Δ."""
    angles = rope_angles(torch.as_tensor(list(distances)), d, base)  # (len, d/2)
    return 2 * torch.cos(angles).sum(-1) / d


# ============================================================================ additive attention
def additive_scores(q: torch.Tensor, k: torch.Tensor, W_q: torch.Tensor, W_k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """scores[..., i, j] = wᵀ tanh(W_q q_i + W_k k_j): q (..., n_q, d_q), k (..., n_k, d_k), W_q (d_h, d_q),
    W_k (d_h, d_k), w (d_h,) → (..., n_q, n_k)."""
    hq = q @ W_q.T  # (..., n_q, d_h)
    hk = k @ W_k.T  # (..., n_k, d_h)
    hidden = torch.tanh(hq[..., :, None, :] + hk[..., None, :, :])  # (..., n_q, n_k, d_h)
    return hidden @ w  # (..., n_q, n_k)


def additive_attention(q, k, v, W_q, W_k, w, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive (Bahdanau) attention: weights = softmax over the keys of :func:`additive_scores` (no scale),
    output = weights @ v. Returns (output (..., n_q, d_v), weights (..., n_q, n_k))."""
    weights = masked_softmax(additive_scores(q, k, W_q, W_k, w), mask)
    return weights @ v, weights


def saturation_vs_dk(dims: Sequence[int], *, n_keys: int = 16, d_hidden: int = 64, trials: int = 200,
                     seed: int = 0) -> dict[str, dict[str, list[float]]]:
    """For each d_k: random queries and keys with N(0, 1) entries; the mean largest softmax weight and the
    mean norm of the softmax Jacobian (diag(s) − s sᵀ, notebook 04) of one query's scores over ``n_keys`` keys,
    for unscaled dot products, scaled dot products and additive scores (W_q, W_k with N(0, 1/d_k) entries,
    w with N(0, 1/d_hidden): the pre-activations have unit variance whatever d_k)."""
    g = torch.Generator().manual_seed(seed)
    kinds = ("dot, unscaled", "dot / √d_k", "additive")
    stats = {kind: {"max weight": [], "gradient": []} for kind in kinds}
    for d in dims:
        q = torch.randn(trials, 1, d, generator=g, dtype=torch.float64)
        k = torch.randn(trials, n_keys, d, generator=g, dtype=torch.float64)
        W_q = torch.randn(d_hidden, d, generator=g, dtype=torch.float64) / math.sqrt(d)
        W_k = torch.randn(d_hidden, d, generator=g, dtype=torch.float64) / math.sqrt(d)
        w = torch.randn(d_hidden, generator=g, dtype=torch.float64) / math.sqrt(d_hidden)
        dot = q @ k.transpose(-2, -1)  # (trials, 1, n_keys)
        scores = {"dot, unscaled": dot, "dot / √d_k": dot / math.sqrt(d),
                  "additive": additive_scores(q, k, W_q, W_k, w)}
        for kind, s in scores.items():
            p = torch.softmax(s, dim=-1)[:, 0]  # (trials, n_keys)
            sq = (p * p).sum(-1)  # ‖diag(p) − p pᵀ‖²_F = Σp² − 2Σp³ + (Σp²)², without building the matrix
            jac_norm = (sq - 2 * (p ** 3).sum(-1) + sq * sq).clamp(min=0).sqrt()
            stats[kind]["max weight"].append(p.max(-1).values.mean().item())
            stats[kind]["gradient"].append(jac_norm.mean().item())
    return stats


# ============================================================================ figures
@styled
def plot_encoding(pe: torch.Tensor, title: str = "sinusoidal encoding") -> plt.Figure:
    """An (n, d) encoding as a heatmap: rows are positions, columns dimensions."""
    fig, ax = plt.subplots(figsize=(8.0, 3.8))
    heatmap(pe, ax=ax, title=title, annotate=False, signed=True, vmin=-1, vmax=1, xlabel="dimension",
            ylabel="position")
    fig.tight_layout()
    return fig


@styled
def plot_bias_heads(bias: torch.Tensor, title: str, heads: Sequence[int] | None = None,
                    titles: Sequence[str] | None = None) -> plt.Figure:
    """Up to four heads of an (H, n, n) bias, side by side, on one colour scale."""
    heads = list(range(min(4, bias.shape[0]))) if heads is None else list(heads)
    titles = [f"head {h}" for h in heads] if titles is None else list(titles)
    fig, axes = plt.subplots(1, len(heads), figsize=(min(MAX_WIDTH, 2.1 * len(heads) + 1.3), 3.3), squeeze=False)
    lo, hi = float(bias[heads].min()), float(bias[heads].max())
    for ax, h, head_title in zip(axes[0], heads, titles):
        heatmap(bias[h], ax=ax, title=head_title, annotate=False, colorbar=False, signed=False, vmin=lo,
                vmax=hi, xlabel="key j", ylabel="query i" if h == heads[0] else "")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.subplots_adjust(top=0.8)  # room for the title above the heads' titles
    fig.colorbar(axes[0, -1].images[0], ax=list(axes[0]), fraction=0.05, pad=0.03)
    fig.suptitle(title, fontsize=11)
    return fig


@styled
def plot_rope(angles: torch.Tensor, scores: torch.Tensor) -> plt.Figure:
    """Left: each pair's rotation angle (mod 2π) by position. Right: the scores rope(q, i)·rope(k, j) of one
    fixed q and k placed at every pair of positions: constant along each diagonal (they depend on j − i)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.4, 3.9))
    image = left.imshow((angles % (2 * math.pi)).numpy(), aspect="auto", cmap="twilight", vmin=0, vmax=2 * math.pi)
    left.set_xlabel("pair i (θ_i falls from left to right)")
    left.set_ylabel("position p")
    left.set_title("rotation angle p·θ_i mod 2π")
    fig.colorbar(image, ax=left, fraction=0.046, pad=0.04)
    heatmap(scores, ax=right, title="rope(q, i) · rope(k, j)", annotate=False, xlabel="key position j",
            ylabel="query position i")
    fig.tight_layout()
    return fig


@styled
def plot_rope_decay(distances: Sequence[int], values: torch.Tensor, d: int) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6.8, 3.6))
    ax.plot(list(distances), values.numpy())
    ax.set_xscale("symlog", linthresh=10)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("distance Δ = j − i")
    ax.set_ylabel("score / d")
    ax.set_title(f"RoPE: rope(u, i) · rope(u, i + Δ) for the all-ones u, d = {d}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


@styled
def plot_saturation(dims: Sequence[int], stats: dict[str, dict[str, list[float]]]) -> plt.Figure:
    fig, axes = plt.subplots(1, 2, figsize=(9.4, 3.8))
    for ax, metric, ylabel in zip(axes, ("max weight", "gradient"),
                                  ("mean largest weight", "mean ‖softmax Jacobian‖")):
        for kind, values in stats.items():
            ax.plot(list(dims), values[metric], marker="o", label=kind)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("d_k")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[0].set_title("saturation")
    axes[1].set_title("gradient through the softmax")
    axes[0].legend()
    fig.tight_layout()
    return fig

