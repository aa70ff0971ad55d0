"""Position (notebook 12): attention without position is permutation-equivariant; four ways to give it
position (sinusoidal encodings, T5's relative bias buckets, ALiBi, RoPE), RoPE with a KV cache and beyond
its training length, a tiny model trained on short sequences and evaluated on longer ones, and additive
(Bahdanau) attention.

Conventions, stated once (the exercises' docstrings repeat them):

* **Positions** are t = 0, 1, … (the course's notation: docs/notation.md); a query's position is i, a
  key's j. The (sin, cos) or rotation pairs are numbered r = 0 … d/2 − 1.
* **Sinusoidal encoding** (Vaswani et al. 2017, §3.5), interleaved: column 2r is sin(t / base^(2r/d)),
  column 2r + 1 is cos(t / base^(2r/d)); with an odd d the last column is a sine.
* **Relative positions** are j − i (key position minus query position: positive = the key comes after
  the query), as in T5 (Raffel et al. 2020) and its Hugging Face implementation.
* **ALiBi** (Press, Smith and Lewis 2022): head a (0-based) of A has slope slope_a = 2^(−8(a+1)/A) (the
  paper's m, a letter this course keeps for the running maximum) and bias −slope_a·(i − j) on the keys
  j ≤ i of a causal model, the paper's form; :func:`alibi_bias` gives the symmetric −slope_a·|i − j|, a
  later extension for attention without a causal mask.
* **RoPE** (Su et al. 2021, RoFormer) pairs **interleaved** dimensions (2r, 2r + 1), as in the RoFormer
  paper and Meta's original LLaMA code (GPT-NeoX and Hugging Face's LLaMA pair r with r + d/2 instead),
  and rotates the pair at position t by the angle +t·θ_r, θ_r = base^(−2r/d).
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

from .masks import check_size
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
    "rope_decay_bound",
    "rope_decode_step",
    "rope_decode",
    "ntk_base",
    "EXTRAPOLATION_SCHEMES",
    "recency_sequences",
    "TinyPositionModel",
    "length_extrapolation",
    "additive_scores",
    "additive_attention",
    "saturation_vs_dk",
    "plot_encoding",
    "plot_bias_heads",
    "plot_rope",
    "plot_rope_decay",
    "plot_rope_extension",
    "plot_length_extrapolation",
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
    """(n, d): row t is position t's encoding. Column 2r = sin(t / base^(2r/d)), column 2r + 1 =
    cos(t / base^(2r/d)) (Vaswani et al. 2017, §3.5); with an odd d the last column is a sine."""
    n, d = check_size(n, "n"), check_size(d, "d")
    t = torch.arange(n, dtype=torch.float64)[:, None]  # (n, 1)
    two_r = torch.arange(0, d, 2, dtype=torch.float64)  # (ceil(d/2),): 0, 2, 4, …
    angles = t / base ** (two_r / d)  # (n, ceil(d/2))
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
    half = num_buckets // 2 if bidirectional else num_buckets
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, (int, np.integer)) or half < 2:
        need = 4 if bidirectional else 2
        raise ValueError(f"num_buckets must be an integer ≥ {need} (bidirectional={bidirectional}), but you passed "
                         f"{num_buckets!r}; T5 uses 32.")
    if not max_distance > half // 2:
        raise ValueError(f"max_distance must be larger than {half // 2} (the exact buckets of num_buckets = "
                         f"{num_buckets}), but you passed {max_distance!r}; T5 uses 128.")
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
    """(A, n, n) bias added to the scores: bias[a, i, j] = table[bucket(j − i), a].

    ``table`` (num_buckets, A) is the learned bias of each bucket and head (T5's ``nn.Embedding``). T5 keeps
    one such table per stack (encoder, decoder), in its first layer, and every layer of the stack adds the
    same bias."""
    n = check_size(n, "n")
    if not isinstance(table, torch.Tensor) or table.dim() != 2:
        shape = tuple(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__
        raise ValueError(f"table must be a (num_buckets, A) tensor, one bias per bucket and head, but you passed "
                         f"{shape}.")
    if table.shape[0] < (4 if bidirectional else 2):
        raise ValueError(f"table has {table.shape[0]} rows (shape {tuple(table.shape)}), but you need at least "
                         f"{4 if bidirectional else 2} buckets (bidirectional={bidirectional}); T5 uses 32.")
    positions = torch.arange(n)
    rel = positions[None, :] - positions[:, None]  # (n, n): j − i
    buckets = relative_position_bucket(rel, bidirectional, table.shape[0], max_distance)  # (n, n)
    return table[buckets].permute(2, 0, 1)  # (n, n, A) → (A, n, n)


# ============================================================================ ALiBi
def alibi_slopes(n_heads: int) -> torch.Tensor:
    """(A,) ALiBi slopes (Press et al. 2022): slope_a = 2^(−8(a+1)/A) for A a power of two. Otherwise, as in
    the authors' code, the slopes of the closest smaller power of two, then every other slope of twice that."""
    def power_of_two(heads: int) -> list[float]:
        return [2.0 ** (-8.0 * (a + 1) / heads) for a in range(heads)]

    n_heads = check_size(n_heads, "n_heads")
    if n_heads & (n_heads - 1) == 0:
        return torch.tensor(power_of_two(n_heads), dtype=torch.float64)
    closest = 2 ** int(math.floor(math.log2(n_heads)))
    extra = power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(power_of_two(closest) + extra, dtype=torch.float64)


def alibi_bias(n: int, n_heads: int) -> torch.Tensor:
    """(A, n, n) float64: bias[a, i, j] = −slope_a·|i − j| (zero on the diagonal, more negative with distance).

    The symmetric form, for attention without a causal mask; on the keys j ≤ i that a causal mask keeps it is
    the paper's −slope_a·(i − j)."""
    t = torch.arange(n, dtype=torch.float64)
    distance = (t[:, None] - t[None, :]).abs()  # (n, n)
    return -alibi_slopes(n_heads)[:, None, None] * distance  # (A, n, n)


# ============================================================================ RoPE
def rope_angles(positions: torch.Tensor, d: int, base: float = 10000.0) -> torch.Tensor:
    """(n, d/2) float64: the angle t·θ_r of pair r at each position t, θ_r = base^(−2r/d)."""
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    return torch.as_tensor(positions, dtype=torch.float64)[:, None] * theta  # (n, d/2)


def _check_rope(x, positions) -> None:
    """x (..., n, d) floating point with d even; positions None or (n,)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor of shape (..., n, d), but you passed a {type(x).__name__}; "
                        "convert it with torch.as_tensor(...).float().")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, but yours has dtype {x.dtype}; convert it with .float().")
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., n, d), but yours has shape {tuple(x.shape)}; "
                         "for one vector use x[None].")
    if x.shape[-1] % 2:
        raise ValueError(f"RoPE rotates pairs of dimensions: d must be even, got {x.shape[-1]}")
    if positions is not None and tuple(torch.as_tensor(positions).shape) != (x.shape[-2],):
        raise ValueError(f"positions must have shape (n,) = ({x.shape[-2]},), one per row of x {tuple(x.shape)}, "
                         f"but yours has shape {tuple(torch.as_tensor(positions).shape)}.")


def apply_rope(x: torch.Tensor, positions: torch.Tensor | None = None, base: float = 10000.0) -> torch.Tensor:
    """Rotate each interleaved pair (x_2r, x_2r+1) of x (..., n, d), d even, by +t·θ_r at position t:

        (x_2r, x_2r+1) → (x_2r cos − x_2r+1 sin, x_2r sin + x_2r+1 cos)

    ``positions`` (n,) defaults to 0 … n − 1. Same shape and dtype as x. Then
    rope(q, i) · rope(k, j) depends on i and j only through j − i (Su et al. 2021).
    """
    _check_rope(x, positions)
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    angles = rope_angles(positions, d, base)  # (n, d/2)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., n, d/2) each
    out = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)  # (..., n, d/2, 2)
    return out.flatten(-2)  # (..., n, d): pairs back in place


def apply_rope_halves(x: torch.Tensor, positions: torch.Tensor | None = None, base: float = 10000.0) -> torch.Tensor:
    """The GPT-NeoX / Hugging Face LLaMA convention: dimension r is paired with r + d/2. It equals
    :func:`apply_rope` on x with its dimensions reordered (the two differ only in which weights are paired)."""
    _check_rope(x, positions)
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    angles = rope_angles(positions, d, base)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    first, second = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def rope_self_score(d: int, distances: Sequence[int], base: float = 10000.0, scale: float = 1.0) -> torch.Tensor:
    """rope(u, 0) · rope(u, Δ) / d for the all-ones vector u: Σ_r 2cos(Δ·θ_r / scale) / d, one value per Δ.

    ``scale`` > 1 is position interpolation (Chen et al. 2023): positions divided by ``scale``. The score
    itself is not monotone in Δ (it oscillates, and turns negative); what RoFormer (§3.4.3) proves decays
    is an upper bound, :func:`rope_decay_bound`."""
    angles = rope_angles(torch.as_tensor(list(distances)), d, base) / scale  # (len, d/2)
    return 2 * torch.cos(angles).sum(-1) / d


def rope_decay_bound(d: int, distances: Sequence[int], base: float = 10000.0) -> torch.Tensor:
    """RoFormer's (§3.4.3) decaying quantity, one value per Δ: (2/d) Σ_{s=1}^{d/2} |S_s| with
    S_s = Σ_{r<s} exp(√−1·Δθ_r). The score of any q, k is at most max_r |h_{r+1} − h_r| times it, where h_r is
    pair r's complex product q_r k_r*."""
    angles = rope_angles(torch.as_tensor(list(distances)), d, base)  # (len, d/2)
    partial = torch.polar(torch.ones_like(angles), angles).cumsum(-1)  # (len, d/2): S_1 … S_{d/2}
    return partial.abs().mean(-1)


def ntk_base(base: float, factor: float, d: int) -> float:
    """The "NTK-aware" base change for a context ``factor`` times longer (bloc97, 2023; Peng et al. 2023,
    YaRN): base · factor^(d/(d − 2)), which slows the slowest pair by exactly ``factor`` and the fastest
    not at all."""
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 4 or d % 2:
        raise ValueError(f"d must be an even integer ≥ 4 (RoPE's head width), but you passed {d!r}.")
    return base * factor ** (d / (d - 2))


# ============================================================================ RoPE with a KV cache
def rope_decode_step(q_new: torch.Tensor, k_new: torch.Tensor, k_cache: torch.Tensor,
                     base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step with RoPE and a cache of rotated keys.

    q_new, k_new (..., n_new, d): the newest tokens' queries and keys, not rotated yet; k_cache
    (..., n_cache, d): the earlier tokens' keys, each already rotated by its own position. The new tokens
    sit at the absolute positions n_cache … n_cache + n_new − 1. Returns (q_new rotated (..., n_new, d),
    the cache with the new keys rotated and appended (..., n_cache + n_new, d))."""
    n_cache, n_new = k_cache.shape[-2], q_new.shape[-2]
    positions = torch.arange(n_cache, n_cache + n_new)  # (n_new,): cache length + offset
    q_rot = apply_rope(q_new, positions, base)
    k_rot = apply_rope(k_new, positions, base)
    return q_rot, torch.cat([k_cache, k_rot], dim=-2)


def rope_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prompt: int,
                restart_positions: bool = False) -> torch.Tensor:
    """Causal self-attention of q, k (n, d), v (n, d_v) computed the way a decoder does it: the first
    ``prompt`` tokens at once, then one token per step, keys rotated once and kept in a cache. With
    ``restart_positions`` each step's new tokens are rotated from position 0 again (the mistake). Returns
    the outputs (n, d_v), equal to causal attention over apply_rope(q), apply_rope(k) when done right."""
    n, d = q.shape
    k_cache, v_cache, outs = q.new_zeros(0, d), v.new_zeros(0, v.shape[-1]), []
    for start, stop in [(0, prompt)] + [(t, t + 1) for t in range(prompt, n)]:
        if restart_positions:
            positions = torch.arange(stop - start)  # 0, 1, … at every step: wrong
            q_rot = apply_rope(q[start:stop], positions)
            k_cache = torch.cat([k_cache, apply_rope(k[start:stop], positions)])
        else:
            q_rot, k_cache = rope_decode_step(q[start:stop], k[start:stop], k_cache)
        v_cache = torch.cat([v_cache, v[start:stop]])  # values are not rotated
        scores = q_rot @ k_cache.T / math.sqrt(d)  # (n_new, n_cache + n_new)
        keep = torch.arange(stop)[None, :] <= torch.arange(start, stop)[:, None]  # bottom-right causal
        outs.append(masked_softmax(scores, keep) @ v_cache)
    return torch.cat(outs)  # (n, d_v)


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
    """For each d_k: random queries and keys with N(0, 1) entries, and a loss ℒ = gᵀp of one query's softmax
    weights p over ``n_keys`` keys with a random upstream gradient g (N(0, 1) entries). Per kind of score
    (unscaled dot products, scaled dot products, additive scores), the means over ``trials`` of: the largest
    weight, ‖∂ℒ/∂S‖ (the gradient that leaves the softmax, toward the scores) and ‖∂ℒ/∂q‖ (the gradient that
    reaches the query). Additive scores use W_q, W_k with N(0, 1/d_k) entries (each of W_q q, W_k k has unit
    variance per hidden unit, their sum variance 2, whatever d_k; its measured variance is under
    "tanh input variance") and w with N(0, 1/d_hidden) entries."""
    g = torch.Generator().manual_seed(seed)
    kinds = ("dot, unscaled", "dot / √d_k", "additive")
    stats = {kind: {"max weight": [], "dL/dS": [], "dL/dq": []} for kind in kinds}
    stats["additive"]["tanh input variance"] = []
    for d in dims:
        q = torch.randn(trials, 1, d, generator=g, dtype=torch.float64)
        k = torch.randn(trials, n_keys, d, generator=g, dtype=torch.float64)
        W_q = torch.randn(d_hidden, d, generator=g, dtype=torch.float64) / math.sqrt(d)
        W_k = torch.randn(d_hidden, d, generator=g, dtype=torch.float64) / math.sqrt(d)
        w = torch.randn(d_hidden, generator=g, dtype=torch.float64) / math.sqrt(d_hidden)
        upstream = torch.randn(trials, n_keys, generator=g, dtype=torch.float64)  # ∂ℒ/∂p
        pre = (q @ W_q.T)[:, :, None, :] + (k @ W_k.T)[:, None, :, :]  # (trials, 1, n_keys, d_hidden)
        stats["additive"]["tanh input variance"].append(pre.var().item())
        for kind in kinds:
            q_ = q.clone().requires_grad_(True)
            if kind == "additive":
                s = additive_scores(q_, k, W_q, W_k, w)  # (trials, 1, n_keys)
            else:
                s = q_ @ k.transpose(-2, -1) / (math.sqrt(d) if kind == "dot / √d_k" else 1.0)
            s.retain_grad()
            p = torch.softmax(s, dim=-1)[:, 0]  # (trials, n_keys)
            (p * upstream).sum().backward()
            stats[kind]["max weight"].append(p.max(-1).values.mean().item())
            stats[kind]["dL/dS"].append(s.grad[:, 0].norm(dim=-1).mean().item())
            stats[kind]["dL/dq"].append(q_.grad[:, 0].norm(dim=-1).mean().item())
    return stats


# ============================================================================ length extrapolation
#: The position schemes of :class:`TinyPositionModel`.
EXTRAPOLATION_SCHEMES = ("sinusoidal", "RoPE", "ALiBi")


def recency_sequences(batch: int, n: int, generator: torch.Generator, vocab: int = 8, p_copy: float = 0.6,
                      gap_stop: float = 0.35) -> torch.Tensor:
    """(batch, n) token ids where recent tokens come back: token t copies an earlier token with probability
    ``p_copy`` (the one Δ = 1 + G back, G geometric with stopping probability ``gap_stop``: near ones more
    often), else it is drawn uniformly. Predicting the next token rewards looking at recent tokens."""
    x = torch.empty(batch, n, dtype=torch.long)
    x[:, 0] = torch.randint(0, vocab, (batch,), generator=generator)
    rows = torch.arange(batch)
    for t in range(1, n):
        fresh = torch.randint(0, vocab, (batch,), generator=generator)
        u = torch.rand(batch, generator=generator, dtype=torch.float64).clamp(min=1e-12)
        gap = torch.floor(torch.log(u) / math.log(1 - gap_stop)).long()  # (batch,): 0, 1, 2, … geometric
        copied = x[rows, (t - 1 - gap).clamp(min=0)]
        copy = torch.rand(batch, generator=generator, dtype=torch.float64) < p_copy
        x[:, t] = torch.where(copy, copied, fresh)
    return x


class TinyPositionModel(torch.nn.Module):
    """One causal attention layer that predicts the next token: embedding (+ sinusoids for "sinusoidal"),
    A heads whose queries and keys are rotated ("RoPE") or whose scores get ALiBi's −slope_a·(i − j)
    ("ALiBi"), a residual connection and a linear read-out."""

    def __init__(self, scheme: str, vocab: int = 8, d_model: int = 32, n_heads: int = 4, max_len: int = 1024):
        super().__init__()
        if scheme not in EXTRAPOLATION_SCHEMES:
            raise ValueError(f"unknown scheme {scheme!r}: one of {EXTRAPOLATION_SCHEMES}")
        self.scheme, self.n_heads = scheme, n_heads
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.readout = torch.nn.Linear(d_model, vocab)
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)
        self.register_buffer("slopes", alibi_slopes(n_heads).float(), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        B, n = ids.shape
        h = self.embed(ids)  # (B, n, d_model)
        if self.scheme == "sinusoidal":
            h = h + self.pe[:n]
        q, k, v = self.qkv(h).view(B, n, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)  # each (B, A, n, d_head)
        if self.scheme == "RoPE":
            q, k = apply_rope(q), apply_rope(k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, A, n, n)
        t = torch.arange(n)
        if self.scheme == "ALiBi":
            scores = scores - self.slopes[:, None, None] * (t[:, None] - t[None, :]).clamp(min=0)
        scores = scores.masked_fill(t[None, :] > t[:, None], float("-inf"))  # causal
        out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, n, -1)  # (B, n, d_model)
        return self.readout(h + self.proj(out))  # (B, n, vocab)


def length_extrapolation(schemes: Sequence[str] = EXTRAPOLATION_SCHEMES, *, train_len: int = 32,
                         eval_lens: Sequence[int] = (32, 64, 128, 256), steps: int = 100, batch: int = 32,
                         seed: int = 0, progress: Callable | None = None) -> dict[str, list[float]]:
    """Train one :class:`TinyPositionModel` per scheme on :func:`recency_sequences` of ``train_len`` tokens
    (Adam, the same batches for every scheme), then return each one's mean next-token loss (nats) on the
    second half of fresh sequences of each length in ``eval_lens``: the positions a short sequence never has
    once the length passes 2 × ``train_len``. Runs on one thread (its tensors are tiny: more threads only
    add overhead) and restores the thread count after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _length_extrapolation(schemes, train_len, eval_lens, steps, batch, seed, progress)
    finally:
        torch.set_num_threads(threads)


def _length_extrapolation(schemes, train_len, eval_lens, steps, batch, seed, progress) -> dict[str, list[float]]:
    g = torch.Generator().manual_seed(seed)
    train = recency_sequences(steps * batch, train_len + 1, g).view(steps, batch, train_len + 1)
    evals = {n: recency_sequences(32, n + 1, g) for n in eval_lens}
    losses: dict[str, list[float]] = {}
    for scheme in schemes:
        torch.manual_seed(seed)
        model = TinyPositionModel(scheme)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for ids in (train if progress is None else progress(train, desc=scheme, leave=False)):
            logits = model(ids[:, :-1])  # (batch, train_len, vocab)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            losses[scheme] = []
            for n, ids in evals.items():
                per_token = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten(),
                                                              reduction="none").view(len(ids), n)
                losses[scheme].append(per_token[:, n // 2:].mean().item())
    return losses


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
    """Up to four heads of an (A, n, n) bias, side by side, on one colour scale."""
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
    fig.colorbar(axes[0, -1].images[0], ax=list(axes[0]), fraction=0.05, pad=0.03, label="bias added to the score")
    fig.suptitle(title, fontsize=11)
    return fig


@styled
def plot_rope(angles: torch.Tensor, scores: torch.Tensor) -> plt.Figure:
    """Left: each pair's rotation angle (mod 2π) by position. Right: the scores rope(q, i)·rope(k, j) of one
    fixed q and k placed at every pair of positions: constant along each diagonal (they depend on j − i)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.4, 3.9))
    image = left.imshow((angles % (2 * math.pi)).numpy(), aspect="auto", cmap="twilight", vmin=0, vmax=2 * math.pi)
    left.set_xlabel(r"pair $r$ ($\theta_r$ falls from left to right)")
    left.set_ylabel("position $t$")
    left.set_title(r"rotation angle $t \cdot \theta_r$ mod $2\pi$")
    fig.colorbar(image, ax=left, fraction=0.046, pad=0.04)
    heatmap(scores, ax=right, title="rope(q, i) · rope(k, j)", annotate=False, xlabel="key position j",
            ylabel="query position i")
    fig.tight_layout()
    return fig


@styled
def plot_rope_decay(distances: Sequence[int], values: torch.Tensor, d: int,
                    bound: torch.Tensor | None = None) -> plt.Figure:
    """The all-ones score over Δ (and, when given, RoFormer's bound quantity scaled to start at 1)."""
    fig, ax = plt.subplots(figsize=(6.8, 3.6))
    ax.plot(list(distances), values.numpy(), label="score / d (all-ones q = k)")
    if bound is not None:
        ax.plot(list(distances), (bound / bound[0]).numpy(), lw=1, label="RoFormer's bound quantity, scaled")
        ax.legend(loc="lower left")
    ax.set_xscale("symlog", linthresh=10)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("distance Δ = j − i")
    ax.set_ylabel("score / d")
    ax.set_title(f"RoPE: rope(u, i) · rope(u, i + Δ) for the all-ones u, d = {d}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


@styled
def plot_rope_extension(distances: Sequence[int], curves: dict[str, torch.Tensor], train_len: int) -> plt.Figure:
    """Score-vs-distance curves of several RoPE variants, with the training length marked."""
    fig, ax = plt.subplots(figsize=(8.4, 3.6))
    for k, (name, values) in enumerate(curves.items()):  # the first curves on top: later ones oscillate over them
        ax.plot(list(distances), values.numpy(), lw=1.2, label=name, zorder=2 + len(curves) - k)
    ax.axvline(train_len, color="grey", ls="--", lw=1)
    ax.text(train_len * 1.05, 0.9, "training length", fontsize=9, color="grey")
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(0, max(distances))  # no margin below 0: there are no negative distances
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("distance Δ = j − i")
    ax.set_ylabel("score / d")
    ax.set_title("all-ones score: base 10,000, interpolated, NTK-aware, base 500,000")
    ax.legend(fontsize=9, loc="lower left")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


@styled
def plot_length_extrapolation(lengths: Sequence[int], losses: dict[str, list[float]], train_len: int) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6.8, 3.6))
    for scheme, values in losses.items():
        ax.plot(list(lengths), values, marker="o", label=scheme)
    ax.axvline(train_len, color="grey", ls="--", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluated sequence length (trained on " + str(train_len) + ")")
    ax.set_ylabel("loss on the second half (nats)")
    ax.set_title("next-token loss beyond the training length")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


@styled
def plot_saturation(dims: Sequence[int], stats: dict[str, dict[str, list[float]]]) -> plt.Figure:
    fig, axes = plt.subplots(1, 3, figsize=(9.6, 3.6))
    for ax, metric, title in zip(axes, ("max weight", "dL/dS", "dL/dq"),
                                 ("mean largest weight", "mean ‖∂ℒ/∂S‖ (to the scores)", "mean ‖∂ℒ/∂q‖ (to the query)")):
        for kind, values in stats.items():
            ax.plot(list(dims), values[metric], marker="o", label=kind)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("d_k")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=9)
    fig.tight_layout()
    return fig
