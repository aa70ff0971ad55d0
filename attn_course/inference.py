"""Attention at inference (notebook 11): the K/V cache, causal masks when n_q ≠ n_k, merging partial
results of key/value chunks (split-K, FlashDecoding), sliding windows, and what decoding costs.

Shapes (any number of leading batch/head dimensions ``...``)::

    q        (..., n_q, d_k)      the new tokens' queries (n_q = 1 when generating one token)
    k, v     (..., n_k, d_k), (..., n_k, d_v)   every cached token, the new ones last
    partial  (m, l, acc): m (..., n_q, 1) running max of the scaled scores,
             l (..., n_q, 1) Σ exp(s − m), acc (..., n_q, d_v) Σ exp(s − m) v (unnormalised)

**Positions.** The queries are the *last* n_q of the n_k positions: query i sits at position
``i + n_k − n_q``. The causal mask is therefore aligned to the **bottom-right** corner of the
(n_q, n_k) score matrix (what ``torch.nn.attention.bias.causal_lower_right`` and FlashAttention's
``causal=True`` do, from flash-attn 2.1 on), not to the top-left corner (what ``F.scaled_dot_product_attention(is_causal=True)``
does: right only when n_q = n_k).

**Sliding window.** ``window`` counts the keys a query sees, itself included: query at position p sees
keys j with ``p − window < j ≤ p``. (FlashAttention's ``window_size=(left, 0)``, flash-attn 2.3 and later, counts only the keys to
the left: left = window − 1.)

Masks are boolean, True = may attend (the course's convention); a query whose keys are all blocked gets
a zero output (:func:`attn_course.softmax.masked_softmax`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from .datasheet import peak_tflops
from .plots import MAX_WIDTH, heatmap, styled
from .attention import check_qkv
from .softmax import check_mask, masked_softmax

__all__ = [
    "KVCache",
    "bottom_right_causal_mask",
    "top_left_causal_mask",
    "sliding_window_mask",
    "masked_attention",
    "partial_attention",
    "merge_partials",
    "finish_partial",
    "split_k_attention",
    "sliding_window_attention",
    "visited_key_blocks",
    "ModelConfig",
    "MISTRAL_7B",
    "GPU",
    "H100_SXM",
    "kv_cache_bytes",
    "decode_step_flops",
    "decode_attention_traffic",
    "CachedLayer",
    "sink_head",
    "plot_alignment",
    "plot_window_tiles",
    "plot_cost_per_token",
    "plot_sink",
]


def _check_count(value, name: str, low: int = 1) -> int:
    """An integer ≥ ``low`` (a block size, a window, a number of chunks), or a clear error."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer ≥ {low}, but you passed {value!r}.")
    return int(value)


# ============================================================================ the K/V cache
class KVCache:
    """The keys and values of every token seen so far, for one attention layer.

    ``append(k, v)`` adds the new tokens after the cached ones along the sequence axis (-2) and
    returns the whole cache ``(K, V)``, shapes (..., t, d_k) and (..., t, d_v) for t tokens so far.
    ``attend(q)`` runs the newest n_q tokens' queries (..., n_q, d_k) over every cached key, causally
    (bottom-right aligned: query i sees keys 0 … t − n_q + i), and returns (..., n_q, d_v).
    Append a token's k and v *before* its query attends: a token attends to itself.
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None  # (..., t, d_k)
        self.v: torch.Tensor | None = None  # (..., t, d_v)

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        check_qkv(k, k, v, "k, k, v", arrays=False)  # k and v: one row per new token
        if self.k is not None and (k.shape[:-2] != self.k.shape[:-2] or k.shape[-1] != self.k.shape[-1]
                                   or v.shape[-1] != self.v.shape[-1] or k.dtype != self.k.dtype):
            raise ValueError(f"the cache holds k {tuple(self.k.shape)} and v {tuple(self.v.shape)} of dtype "
                             f"{self.k.dtype}, but you appended k {tuple(k.shape)} and v {tuple(v.shape)} of dtype "
                             f"{k.dtype}; new tokens need the same leading axes, widths and dtype.")
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=-2)  # (..., t + n_new, d_k): new tokens last
            self.v = torch.cat([self.v, v], dim=-2)  # (..., t + n_new, d_v)
        return self.k, self.v

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        if self.k is None:
            raise ValueError("the cache is empty: append the new token's k and v before its query attends")
        mask = bottom_right_causal_mask(q.shape[-2], self.k.shape[-2], device=q.device)  # (n_q, t)
        return masked_attention(q, self.k, self.v, mask)


# ============================================================================ masks when n_q ≠ n_k
def bottom_right_causal_mask(n_q: int, n_k: int, device=None) -> torch.Tensor:
    """(n_q, n_k) bool for n_q new queries over n_k keys (1 ≤ n_q ≤ n_k), the queries being the last
    n_q positions: query i (at position i + n_k − n_q) may attend to key j iff j ≤ i + n_k − n_q."""
    if not 1 <= n_q <= n_k:
        raise ValueError(f"need 1 ≤ n_q ≤ n_k (the queries are the last n_q of the n_k positions), got {n_q}, {n_k}")
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(diagonal=n_k - n_q)


def top_left_causal_mask(n_q: int, n_k: int, device=None) -> torch.Tensor:
    """(n_q, n_k) bool aligned at the top-left corner: query i may attend to key j iff j ≤ i. This is what
    ``F.scaled_dot_product_attention(..., is_causal=True)`` uses; it is right only when n_q = n_k."""
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril()


def sliding_window_mask(n_q: int, n_k: int, window: int, device=None) -> torch.Tensor:
    """(n_q, n_k) bool: causal, bottom-right aligned, and at most ``window`` keys per query, itself included.

    Query i sits at position p = i + n_k − n_q and may attend to key j iff p − window < j ≤ p.
    Needs 1 ≤ n_q ≤ n_k and window ≥ 1.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1 (a query always sees itself), got {window}")
    pos = torch.arange(n_k - n_q, n_k, device=device)[:, None]  # (n_q, 1): the queries' positions
    keys = torch.arange(n_k, device=device)[None, :]  # (1, n_k)
    return bottom_right_causal_mask(n_q, n_k, device) & (keys > pos - window)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None) -> torch.Tensor:
    """softmax(q kᵀ / √d_k, masked) v with the course's mask rule: (..., n_q, d_k) → (..., n_q, d_v)."""
    check_qkv(q, k, v, "q, k, v", arrays=False)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., n_q, n_k)
    return masked_softmax(scores, mask) @ v


# ============================================================================ split-K: partials and their merge
def partial_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None):
    """Attention of q over one chunk of keys, left unnormalised: ``(m, l, acc)``.

    q (..., n_q, d_k), k (..., c, d_k), v (..., c, d_v), mask broadcastable to (..., n_q, c) or None.
    m (..., n_q, 1) is the largest visible scaled score, l (..., n_q, 1) = Σ exp(s − m) and
    acc (..., n_q, d_v) = Σ exp(s − m) v. A row that sees no key of this chunk has m = −inf, l = 0, acc = 0.
    """
    check_qkv(q, k, v, "q, k, v", arrays=False)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., n_q, c)
    mask = check_mask(scores, mask)
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = may attend), but yours has dtype {mask.dtype}.")
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)  # (..., n_q, 1), -inf where nothing is visible
    shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(scores - shift)  # (..., n_q, c), 0 where blocked
    return m, p.sum(dim=-1, keepdim=True), p @ v


def merge_partials(part_a, part_b):
    """Merge two partial results (m, l, acc) of disjoint key chunks into the partial of their union.

    With m = max(m_a, m_b): l = l_a·e^(m_a − m) + l_b·e^(m_b − m), acc = acc_a·e^(m_a − m) + acc_b·e^(m_b − m).
    A side with m = −inf (no visible key) contributes nothing; if both are −inf the result is
    (−inf, 0, 0), never NaN.
    """
    m_a, l_a, acc_a = part_a
    m_b, l_b, acc_b = part_b
    m = torch.maximum(m_a, m_b)  # (..., n_q, 1)
    shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # −inf − (−inf) would be NaN
    alpha, beta = torch.exp(m_a - shift), torch.exp(m_b - shift)  # each ≤ 1
    return m, l_a * alpha + l_b * beta, acc_a * alpha + acc_b * beta


def finish_partial(part) -> torch.Tensor:
    """The attention output acc / l of a partial (m, l, acc): (..., n_q, d_v); 0 where l = 0."""
    _, l, acc = part
    return torch.where(l > 0, acc / torch.where(l > 0, l, torch.ones_like(l)), torch.zeros_like(acc))


def split_k_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_chunks: int, mask=None) -> torch.Tensor:
    """Split-K (FlashDecoding) attention: the keys are cut into ``n_chunks`` chunks, each chunk's partial is
    computed independently (on a GPU: in parallel), then the partials are merged. Same result as
    :func:`masked_attention`. q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v) → (..., n_q, d_v)."""
    check_qkv(q, k, v, "q, k, v", arrays=False)
    n_k = k.shape[-2]
    n_chunks = _check_count(n_chunks, "n_chunks")
    if n_chunks > n_k:
        raise ValueError(f"n_chunks={n_chunks} is more than the {n_k} keys; every chunk needs at least one key, "
                         f"so you need 1 ≤ n_chunks ≤ {n_k}.")
    bounds = np.linspace(0, n_k, n_chunks + 1).round().astype(int)
    total = None
    for start, stop in zip(bounds[:-1], bounds[1:]):
        chunk_mask = None if mask is None else torch.as_tensor(mask)[..., start:stop]
        part = partial_attention(q, k[..., start:stop, :], v[..., start:stop, :], chunk_mask)
        total = part if total is None else merge_partials(total, part)
    return finish_partial(total)


# ============================================================================ sliding window, tile by tile
def visited_key_blocks(q_start: int, q_end: int, window: int, block_size: int) -> range:
    """Key blocks (their start positions) a query block [q_start, q_end) must visit under a causal sliding
    window: the blocks that hold keys q_start − window + 1 … q_end − 1. Every other block is skipped."""
    first_key = max(0, q_start - window + 1)
    return range(first_key // block_size * block_size, q_end, block_size)


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, block_size: int = 64,
                             *, scale: float | None = None) -> torch.Tensor:
    """Causal sliding-window attention, tile by tile (09's FlashAttention loop), skipping every key block
    that lies wholly outside the window.

    q, k (..., n, d_k), v (..., n, d_v) → (..., n, d_v); query i sees keys i − window < j ≤ i. For each query
    block only the key blocks of :func:`visited_key_blocks` are computed (about window / block_size + 1 of
    them, however long n is); tiles cut by the band's edges are masked element by element.
    """
    window, block_size = _check_count(window, "window"), _check_count(block_size, "block_size")
    check_qkv(q, k, v, "q, k, v", arrays=False)
    if q.dim() < 2 or q.shape[-2] != k.shape[-2]:
        raise ValueError(f"sliding-window self-attention needs as many queries as keys, (..., n, d), but you "
                         f"passed q {tuple(q.shape)} and k {tuple(k.shape)}.")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    n = q.shape[-2]
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)  # (..., n, d_v)
    for q_start in range(0, n, block_size):
        q_end = min(q_start + block_size, n)
        q_blk = q[..., q_start:q_end, :] * scale  # (..., bq, d_k)
        row_max = torch.full(q_blk.shape[:-1] + (1,), float("-inf"), dtype=q.dtype, device=q.device)
        row_sum = torch.zeros_like(row_max)  # (..., bq, 1)
        acc = torch.zeros(q_blk.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)  # (..., bq, d_v)
        rows = torch.arange(q_start, q_end, device=q.device)[:, None]  # (bq, 1) global query positions
        for k_start in visited_key_blocks(q_start, q_end, window, block_size):
            k_end = min(k_start + block_size, n)
            scores = q_blk @ k[..., k_start:k_end, :].transpose(-2, -1)  # (..., bq, bk)
            cols = torch.arange(k_start, k_end, device=q.device)[None, :]  # (1, bk) global key positions
            outside = (cols > rows) | (cols <= rows - window)  # future, or too far back
            scores = scores.masked_fill(outside, float("-inf"))
            new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
            shift = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))
            correction = torch.exp(row_max - shift)
            probs = torch.exp(scores - shift)  # (..., bq, bk)
            row_sum = row_sum * correction + probs.sum(dim=-1, keepdim=True)
            acc = acc * correction + probs @ v[..., k_start:k_end, :]
            row_max = new_max
        out[..., q_start:q_end, :] = acc / row_sum  # every query sees at least itself: row_sum > 0
    return out


# ============================================================================ what decoding costs
@dataclass(frozen=True)
class ModelConfig:
    """The attention shapes of a model: what its K/V cache and its decoding cost depend on."""

    name: str
    n_layers: int
    n_heads: int  # query heads A
    n_kv_heads: int  # key/value heads G
    d_head: int
    context: int  # the longest context it was trained for
    window: int | None  # sliding-window size, or None
    source: str


#: Jiang et al. 2023, "Mistral 7B", Table 1 (dim 4096 = 32 heads × 128; grouped-query attention with 8
#: K/V heads; sliding window 4096; context length 8192).
MISTRAL_7B = ModelConfig("Mistral 7B", n_layers=32, n_heads=32, n_kv_heads=8, d_head=128, context=8192, window=4096,
                         source="Jiang et al. 2023, Mistral 7B, Table 1")


@dataclass(frozen=True)
class GPU:
    name: str
    tflops: float  # dense 16-bit tensor-core peak, TFLOP/s
    bandwidth: float  # memory bandwidth, TB/s
    source: str
    sms: int = 0  # streaming multiprocessors: how many programs (thread blocks) run side by side, at least

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which a kernel is limited by compute, below which by memory (roofline)."""
        return self.tflops / self.bandwidth


#: NVIDIA H100 SXM5: the dense BF16 peak of attn_course.datasheet
#: (989.4 TFLOP/s) and 3.35 TB/s of HBM3 bandwidth; 132 SMs (NVIDIA H100 Tensor Core GPU Architecture
#: whitepaper, the SXM5 product).
H100_SXM = GPU("NVIDIA H100 SXM5", tflops=float(peak_tflops("NVIDIA H100 SXM5", "bfloat16")[0] or 989.4),
               bandwidth=3.35, source="NVIDIA H100 datasheet (dense, no sparsity)", sms=132)


def kv_cache_bytes(config: ModelConfig, seq_len: int, *, n_kv_heads: int | None = None, batch: int = 1,
                   bytes_per_value: int = 2, use_window: bool = False) -> int:
    """Bytes of the K/V cache of ``config`` for ``seq_len`` tokens: 2 (K and V) × layers × K/V heads ×
    d_head × tokens × batch × bytes. ``n_kv_heads`` overrides the model's (to compare MHA/GQA/MQA);
    with ``use_window`` a sliding-window model keeps only its last ``window`` tokens (a rolling buffer)."""
    from .multihead import kv_cache_bytes as cache_bytes  # notebook 07's formula, one place

    kept = min(seq_len, config.window) if use_window and config.window else seq_len
    return cache_bytes(n_layers=config.n_layers, n_kv_heads=config.n_kv_heads if n_kv_heads is None else n_kv_heads,
                       d_head=config.d_head, seq_len=kept, batch=batch, bytes_per_value=bytes_per_value)


def decode_step_flops(position: int, d_model: int, *, cache: bool) -> float:
    """Multiply-add FLOPs (2 per multiply-add) of one attention layer to produce the token at ``position``
    (0-based: ``position`` tokens come before it), as :class:`CachedLayer` computes them.

    With a cache: project the new token (q, k, v and the output: 4 · 2·d²) and attend one query over
    t = position + 1 keys (2·t·d for q·kᵀ, 2·t·d for the weighted sum). Without: rerun the layer on all
    t tokens (4 · 2·t·d² for the projections, 4·t²·d for the full t × t attention, as naive code
    computes it)."""
    t = position + 1
    if cache:
        return 8.0 * d_model**2 + 4.0 * t * d_model
    return 8.0 * t * d_model**2 + 4.0 * t * t * d_model


def decode_attention_traffic(config: ModelConfig, seq_len: int, *, n_kv_heads: int | None = None,
                             bytes_per_value: int = 2) -> tuple[float, float]:
    """(FLOPs, bytes) of the attention of one decode step over ``seq_len`` cached tokens, all layers,
    batch 1: every query head does 4·t·d_head FLOPs (q·Kᵀ and the weighted sum of V), and the whole
    cache is read once. Their ratio is the arithmetic intensity: A / G FLOPs per byte at 16 bits."""
    g = config.n_kv_heads if n_kv_heads is None else n_kv_heads
    flops = 4.0 * config.n_layers * config.n_heads * seq_len * config.d_head
    return flops, float(kv_cache_bytes(config, seq_len, n_kv_heads=g, bytes_per_value=bytes_per_value))


class CachedLayer:
    """One attention layer (random W^Q, W^K, W^V, W^O of width ``d_model``, one head) that generates a token
    with or without a K/V cache, to count and time the two.

    ``step_with_cache(x_new, K, V)``: x_new (1, d_model) is the new token, K and V (t, d_model) the cache of
    the tokens before it; projects only the new token, attends over the t + 1 keys and returns
    ``(out (1, d_model), K', V')`` with the new token's key and value appended.
    ``step_without_cache(x_all)``: x_all (t + 1, d_model) is the whole prefix; recomputes every key and value
    and the full (t + 1, t + 1) attention, and keeps the last row (1, d_model).
    """

    def __init__(self, d_model: int, seed: int = 0, dtype: torch.dtype = torch.float32):
        g = torch.Generator().manual_seed(seed)
        self.w = [torch.randn(d_model, d_model, generator=g, dtype=dtype) / math.sqrt(d_model) for _ in range(4)]

    def prefill(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cache of a prompt x (t, d_model): its keys and values, (t, d_model) each."""
        return x @ self.w[1], x @ self.w[2]

    def step_with_cache(self, x_new: torch.Tensor, K: torch.Tensor, V: torch.Tensor):
        wq, wk, wv, wo = self.w
        K = torch.cat([K, x_new @ wk], dim=-2)  # (t + 1, d_model): one new row
        V = torch.cat([V, x_new @ wv], dim=-2)
        return masked_attention(x_new @ wq, K, V) @ wo, K, V  # one query sees every key: no mask needed

    def step_without_cache(self, x_all: torch.Tensor) -> torch.Tensor:
        wq, wk, wv, wo = self.w
        q, k, v = x_all @ wq, x_all @ wk, x_all @ wv  # (t + 1, d_model) each, recomputed every step
        n = x_all.shape[0]
        out = masked_attention(q, k, v, bottom_right_causal_mask(n, n))  # the full (t + 1, t + 1) matrix
        return out[-1:] @ wo  # (1, d_model): only the newest row is needed


# ============================================================================ attention sinks
def sink_head(n: int = 48, d_v: int = 8, *, sink: float = 5.0, local: float = 3.0, width: int = 3,
              seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores (n, n) and values (n, d_v), float64, of a constructed head that behaves like many heads of trained
    language models (Xiao et al. 2023): it looks at the ``width`` tokens before the query (score ``local``), and
    parks the rest of its weight on token 0 (score ``sink``), whose value is zero, so that weight adds nothing.
    Every other score is about −1 (noise 0.5). Causal masking is left to the caller."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, n, generator=g, dtype=torch.float64) * 0.5 - 1.0
    distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # i − j
    scores = torch.where((distance >= 1) & (distance <= width), torch.full_like(scores, local), scores)
    scores[:, 0] = sink
    values = torch.randn(n, d_v, generator=g, dtype=torch.float64)
    values[0] = 0.0  # the sink carries no information
    return scores, values


# ============================================================================ figures
@styled
def plot_alignment(n_q: int, n_k: int) -> plt.Figure:
    """Top-left (is_causal) and bottom-right causal masks for n_q queries over n_k keys, side by side."""
    fig, axes = plt.subplots(1, 2, figsize=(min(MAX_WIDTH, 2.0 + 0.75 * n_k), 1.9 + 0.45 * n_q))
    rows = [f"q{i} @ {i + n_k - n_q}" for i in range(n_q)]
    cols = [str(j) for j in range(n_k)]
    for ax, (title, mask) in zip(axes, [("top-left (is_causal=True)", top_left_causal_mask(n_q, n_k)),
                                        ("bottom-right (decode)", bottom_right_causal_mask(n_q, n_k))]):
        heatmap(mask.to(torch.float32), row_labels=rows, col_labels=cols, ax=ax, title=title, fmt="{:.0f}",
                signed=False, vmin=0, vmax=1, colorbar=False, xlabel="key position", ylabel="query @ position")
    fig.tight_layout()
    return fig


def _tile_grid(n: int, block: int, window: int | None) -> np.ndarray:
    """(n, n): 2 = computed and visible, 1 = computed but masked, 0 = skipped tile."""
    grid = np.zeros((n, n))
    for qs in range(0, n, block):
        qe = min(qs + block, n)
        starts = range(0, qe, block) if window is None else visited_key_blocks(qs, qe, window, block)
        for ks in starts:
            grid[qs:qe, ks:ks + block] = 1
    visible = (bottom_right_causal_mask(n, n) if window is None else sliding_window_mask(n, n, window)).numpy()
    return grid + (visible & (grid > 0))


@styled
def plot_window_tiles(n: int, block: int, window: int) -> plt.Figure:
    """Which (block × block) tiles causal attention and causal sliding-window attention compute."""
    fig, axes = plt.subplots(1, 2, figsize=(8.6, 4.3))
    for ax, (label, w) in zip(axes, [("causal", None), (f"sliding window {window}", window)]):
        grid = _tile_grid(n, block, w)
        ax.imshow(grid, cmap="Blues", vmin=0, vmax=2)
        for edge in range(block, n, block):
            ax.axhline(edge - 0.5, color="black", lw=1.2)
            ax.axvline(edge - 0.5, color="black", lw=1.2)
        tiles = sum(len(range(0, min(qs + block, n), block)) if w is None else
                    len(visited_key_blocks(qs, min(qs + block, n), w, block)) for qs in range(0, n, block))
        ax.set_title(f"{label}: {tiles} tiles computed")
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
    fig.suptitle(f"n = {n}, block {block}: dark = visible, light = masked in a computed tile, white = skipped",
                 fontsize=10)
    fig.tight_layout()
    return fig


@styled
def plot_cost_per_token(positions: Sequence[int], flops: dict[str, Sequence[float]],
                        times_ms: dict[str, Sequence[float]] | None = None) -> plt.Figure:
    """FLOPs (left) and, when given, measured milliseconds (right) per generated token vs its position."""
    panels = 2 if times_ms else 1
    fig, axes = plt.subplots(1, panels, figsize=(4.6 * panels, 3.8), squeeze=False)
    for ax, (series, ylabel, title) in zip(axes[0], [(flops, "FLOPs per token", "counted"),
                                                    (times_ms, "ms per token", "measured")]):
        for name, ys in series.items():
            ax.plot(positions, ys, marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("position of the generated token")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


@styled
def plot_sink(weights: torch.Tensor, errors: dict[str, Sequence[float]], window: int) -> plt.Figure:
    """The head's causal weights (n, n) as a heatmap, and each token's output error under two windows."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.4, 4.0), gridspec_kw={"width_ratios": [1, 1.25]})
    heatmap(weights, ax=left, title="weights: a vertical stripe on token 0", annotate=False, signed=False,
            vmin=0, vmax=1, xlabel="key position", ylabel="query position")
    for name, ys in errors.items():
        right.plot(range(len(ys)), ys, label=name)
    right.axvline(window - 0.5, color="grey", ls=":")
    right.set_yscale("symlog", linthresh=1e-3)
    right.set_ylim(bottom=0)
    right.set_xlabel("query position")
    right.set_ylabel("‖output − full attention‖")
    right.set_title(f"window of {window} keys")
    right.legend()
    fig.tight_layout()
    return fig
