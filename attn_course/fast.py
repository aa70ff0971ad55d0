"""Fast attention in plain PyTorch (notebook 09): the online softmax, the tiled (FlashAttention-2)
forward pass and its causal version with block skipping, a naive reference, the cost model used to
judge them, and the notebook's figures.

Notation (as in notebooks 05 and 07): B sequences, A heads, n positions (n_q queries, n_k keys), d_k
the width of queries and keys, d_v the width of values. Tensors are shaped ``(..., n, d)`` with any
leading batch/head axes::

    q  (..., n_q, d_k)      k  (..., n_k, d_k)      v  (..., n_k, d_v)      output  (..., n_q, d_v)

The tiled functions work for any block size, including lengths that are not a multiple of the block
and blocks longer than the sequence. They never hold more than one ``(block, block)`` tile of scores
per leading index, so their extra memory grows like n·d instead of n² (Dao et al. 2022, *FlashAttention:
Fast and Memory-Efficient Exact Attention with IO-Awareness*; Dao 2023, *FlashAttention-2*).
:func:`tile_steps` is that loop, one tile at a time, with its running state (m, l, acc) visible.

``tests/test_fast.py`` checks everything here against ``torch.softmax`` and
``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from .attention import check_qkv, score_matrix_bytes
from .masks import check_size
from .plots import line_plot, styled
from .softmax import masked_softmax

__all__ = [
    "naive_attention",
    "online_softmax",
    "Tile",
    "tile_steps",
    "tiled_attention",
    "causal_tiled_attention",
    "attention_flops",
    "max_naive_length",
    "memory_traffic",
    "tiles_computed",
    "plot_naive_memory",
    "plot_tile_map",
    "plot_traffic",
]


# ============================================================================ the algorithms
def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scale) v, materialising the whole score matrix (..., n_q, n_k).

    q: (..., n_q, d_k), k: (..., n_k, d_k), v: (..., n_k, d_v) → (..., n_q, d_v); ``scale`` defaults
    to 1/√d_k. With ``causal=True`` query i sees keys 0..i (queries and keys aligned at the start).
    The score matrix is what runs out of memory for long sequences.
    """
    _check_inputs(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., n_q, n_k)
    if not causal:
        return torch.softmax(scores, dim=-1) @ v  # (..., n_q, d_v)
    n_q, n_k = scores.shape[-2:]
    allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()  # key ≤ query
    return masked_softmax(scores, allowed) @ v


def online_softmax(x: torch.Tensor, block_size: int = 1) -> torch.Tensor:
    """Softmax along the last axis, reading ``x`` once in blocks while keeping a running max and sum.

    x: (..., n) → (..., n). The normaliser — the max m and the sum l = Σ exp(x − m), both (..., 1) —
    is built in one pass over blocks of ``block_size`` columns (the last block may be shorter);
    whenever the max grows from m to m', the sum so far is rescaled by exp(m − m'). The probabilities
    are then exp(x − m) / l.
    """
    check_size(block_size, "block_size", positive=True)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        kind = f"a tensor of dtype {x.dtype}" if isinstance(x, torch.Tensor) else f"a {type(x).__name__}"
        raise TypeError(f"x must be a floating-point torch.Tensor, but you passed {kind}; "
                        "convert it with torch.as_tensor(x).float().")
    n = x.shape[-1]
    m = torch.full(x.shape[:-1] + (1,), float("-inf"), dtype=x.dtype, device=x.device)  # (..., 1)
    l = torch.zeros_like(m)  # (..., 1)
    for start in range(0, n, block_size):
        block = x[..., start:start + block_size]  # (..., b)
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum(dim=-1, keepdim=True)
        m = m_new
    return torch.exp(x - m) / l


@dataclass
class Tile:
    """The running state of one query block after one key/value tile (see :func:`tile_steps`).

    Rows ``q_start:q_end`` against keys ``k_start:k_end``; ``m`` (..., b_q, 1) the running row max,
    ``l`` (..., b_q, 1) the running row sum, ``acc`` (..., b_q, d_v) the unnormalised output; ``last``
    is True after the query block's last tile, when ``acc / l`` is its output rows.
    """

    q_start: int
    q_end: int
    k_start: int
    k_end: int
    m: torch.Tensor
    l: torch.Tensor
    acc: torch.Tensor
    last: bool


def _check_inputs(q, k, v) -> None:
    """q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v): floating-point tensors of one dtype."""
    check_qkv(q, k, v, "q, k, v", arrays=False)
    if q.dim() < 2:
        raise ValueError(f"q must have at least 2 axes, (..., n_q, d_k), but you passed shape {tuple(q.shape)}; "
                         "use q[None] for a single query.")


def tile_steps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int = 64, *,
               causal: bool = False, scale: float | None = None) -> Iterator[Tile]:
    """The tiled loop of FlashAttention-2's forward pass, one tile at a time.

    q: (..., n_q, d_k), k: (..., n_k, d_k), v: (..., n_k, d_v). For each block of ``block_size``
    queries, key/value blocks stream past while three running quantities are updated:

        S = q_blk k_blkᵀ · scale,  m' = max(m, rowmax S),  P = exp(S − m'),
        l' = exp(m − m') · l + rowsum P,   acc' = exp(m − m') · acc + P v_blk.

    Yields a :class:`Tile` after every tile. Causal (n_q == n_k): key blocks that start after the
    query block's last row are skipped, and the tile on the diagonal is masked element by element
    (key position > query position → −inf).
    """
    check_size(block_size, "block_size", positive=True)
    _check_inputs(q, k, v)
    n_q, n_k = q.shape[-2], k.shape[-2]
    if causal and n_q != n_k:
        raise ValueError(f"causal attention needs as many queries as keys, got {n_q} and {n_k}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    for q_start in range(0, n_q, block_size):
        q_end = min(q_start + block_size, n_q)
        q_blk = q[..., q_start:q_end, :] * scale  # (..., b_q, d_k): scaling q once is cheaper than every tile
        m = torch.full(q_blk.shape[:-1] + (1,), float("-inf"), dtype=q.dtype, device=q.device)  # (..., b_q, 1)
        l = torch.zeros_like(m)  # (..., b_q, 1)
        acc = torch.zeros(q_blk.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)  # (..., b_q, d_v)
        k_stop = q_end if causal else n_k  # causal: blocks starting after this block's last query are all future
        for k_start in range(0, k_stop, block_size):
            k_end = min(k_start + block_size, n_k)
            s = q_blk @ k[..., k_start:k_end, :].transpose(-2, -1)  # (..., b_q, b_k)
            if causal and k_end - 1 > q_start:  # the tile reaches above the diagonal: hide key > query
                rows = torch.arange(q_start, q_end, device=q.device)[:, None]  # (b_q, 1) global positions
                cols = torch.arange(k_start, k_end, device=q.device)[None, :]  # (1, b_k)
                s = s.masked_fill(cols > rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (..., b_q, 1)
            correction = torch.exp(m - m_new)  # ≤ 1: re-expresses what was summed under the old max
            p = torch.exp(s - m_new)  # (..., b_q, b_k), unnormalised probabilities
            l = l * correction + p.sum(dim=-1, keepdim=True)
            acc = acc * correction + p @ v[..., k_start:k_end, :]  # (..., b_q, d_v)
            m = m_new
            yield Tile(q_start, q_end, k_start, k_end, m, l, acc, last=k_start + block_size >= k_stop)


def _tiled(q, k, v, block_size, causal, scale) -> torch.Tensor:
    _check_inputs(q, k, v)
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)  # (..., n_q, d_v)
    if k.shape[-2] == 0:
        out.zero_()  # no keys: no tile is visited, and the output is 0 (as naive_attention gives)
    for tile in tile_steps(q, k, v, block_size, causal=causal, scale=scale):
        if tile.last:
            out[..., tile.q_start:tile.q_end, :] = tile.acc / tile.l  # one division per row, at the very end
    return out


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int = 64, *,
                    scale: float | None = None) -> torch.Tensor:
    """The FlashAttention-2 forward pass in PyTorch: the same result as :func:`naive_attention`.

    q: (..., n_q, d_k), k: (..., n_k, d_k), v: (..., n_k, d_v) → (..., n_q, d_v). Queries are processed
    in blocks of ``block_size`` rows; for each, key/value blocks stream past while a running row max,
    a running row sum and an unnormalised output accumulator are updated (both rescaled by
    exp(m_old − m_new) whenever the max grows). The output is divided by the row sum once, at the end.
    """
    return _tiled(q, k, v, block_size, False, scale)


def causal_tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int = 64, *,
                           scale: float | None = None) -> torch.Tensor:
    """Causal tiled attention: query i sees keys 0..i; key blocks above the diagonal are never computed.

    q, k: (..., n, d_k), v: (..., n, d_v) → (..., n, d_v). For query block i only key blocks 0..i are
    visited (about half the tiles); the diagonal tile is masked element by element.
    """
    return _tiled(q, k, v, block_size, True, scale)


# ============================================================================ the cost model
def attention_flops(batch: int, heads: int, n: int, d_k: int, *, causal: bool = False,
                    backward: bool = False) -> float:
    """Floating-point operations of attention's two matrix products, the FlashAttention papers' way.

    Forward: Q Kᵀ and P V each cost 2·n²·d_k (a multiply and an add per term, d_v = d_k) per head →
    4·B·A·n²·d_k (half when causal: half of the score matrix is never needed). With
    ``backward=True``: forward + backward, counted as 3.5× the forward (the backward does 2.5× the
    forward's matrix-multiply work). The softmax's exponentials are not counted (O(n²), not O(n²·d)).
    """
    flops = 4.0 * batch * heads * n * n * d_k
    if causal:
        flops /= 2
    return flops * 3.5 if backward else flops


def max_naive_length(memory_bytes: float, *, batch: int = 1, heads: int = 1, dtype: torch.dtype = torch.float32,
                     copies: int = 2) -> int:
    """Longest n whose ``copies`` score matrices (scores and their softmax) fit in ``memory_bytes``.

    One (B, A, n, n) matrix takes :func:`attn_course.attention.score_matrix_bytes` bytes."""
    per_entry = copies * score_matrix_bytes(1, batch=batch, heads=heads, dtype=dtype)  # bytes per (i, j)
    n = math.isqrt(int(memory_bytes // per_entry))
    return n


def memory_traffic(n: int, d: int, block_size: int, *, batch: int = 1, heads: int = 1,
                   dtype: torch.dtype = torch.float32) -> dict[str, int]:
    """Bytes read from and written to memory outside the cache, naive vs tiled (an estimate).

    The model of the FlashAttention paper's IO analysis (Dao et al. 2022, section 3.2), with n_q =
    n_k = n and d_k = d_v = d, assuming a few (block, block) tiles fit in the cache and an n × n
    matrix does not:

    * ``naive`` (:func:`naive_attention` as written, eager PyTorch): q, k, v read and the output
      written (4·n·d numbers), and six passes over an n × n matrix — the product writes S, the scaling
      reads S and writes it again, the softmax reads it and writes P, P @ v reads P: 6·n² numbers;
    * ``tiled``: q read and the output written once (2·n·d), but k and v read once per query block:
      2·n·d·⌈n / block⌉. Each tile's scores are made, used and dropped while still in the cache.

    Returns ``{"naive": bytes, "tiled": bytes, "score_matrix": bytes of one n × n matrix}``, all for
    B·A heads.
    """
    check_size(block_size, "block_size", positive=True)
    element = torch.empty((), dtype=dtype).element_size()
    heads_total = batch * heads
    blocks = -(-n // block_size)
    naive = heads_total * (4 * n * d + 6 * n * n) * element
    tiled = heads_total * (2 * n * d + 2 * n * d * blocks) * element
    return {"naive": naive, "tiled": tiled,
            "score_matrix": score_matrix_bytes(n, batch=batch, heads=heads, dtype=dtype)}


def tiles_computed(n: int, block_size: int, causal: bool) -> np.ndarray:
    """(n, n) map of which scores the tiled loop computes: 2 = computed, 1 = computed then masked
    (causal diagonal tiles), 0 = never computed (tiles skipped above the diagonal)."""
    grid = np.zeros((n, n))
    for tile in tile_steps(torch.zeros(n, 1), torch.zeros(n, 1), torch.zeros(n, 1), block_size, causal=causal):
        grid[tile.q_start:tile.q_end, tile.k_start:tile.k_end] = 2
    if causal:
        above = np.triu_indices(n, 1)
        grid[above] = np.minimum(grid[above], 1)
    return grid


# ============================================================================ figures
@styled
def plot_naive_memory(ns: Sequence[int], limits: Mapping[str, float], *, batch: int = 1, heads: int = 1,
                      dtype: torch.dtype = torch.float16) -> plt.Figure:
    """Memory of naive attention's two score matrices vs n (log–log, GiB), with a dotted line for each
    memory size in ``limits`` (label → bytes)."""
    gib = [2 * score_matrix_bytes(int(n), batch=batch, heads=heads, dtype=dtype) / 2**30 for n in ns]
    fig = line_plot(ns, {"scores + softmax (naive)": gib}, logx=True, logy=True, xlabel="sequence length n",
                    ylabel="memory (GiB = 2³⁰ bytes)",
                    title=f"Naive attention, B={batch}, A={heads}, {str(dtype).replace('torch.', '')}")
    ax = fig.axes[0]
    for label, size in limits.items():
        ax.axhline(size / 2**30, ls=":", color="grey")
        ax.text(ns[0], size / 2**30 * 1.15, label, fontsize=9, color="dimgrey")
    fig.tight_layout()
    return fig


@styled
def plot_tile_map(n: int, block_size: int) -> plt.Figure:
    """Which tiles the loop computes for ``n`` positions and blocks of ``block_size``: non-causal
    (every tile) beside causal (tiles above the diagonal skipped, diagonal tiles masked inside)."""
    fig, axes = plt.subplots(1, 2, figsize=(8.8, 4.6))
    n_blocks = -(-n // block_size)
    for ax, causal in zip(axes, [False, True]):
        grid = tiles_computed(n, block_size, causal)
        ax.imshow(grid, cmap="Blues", vmin=0, vmax=2)
        for edge in range(block_size, n, block_size):
            ax.axhline(edge - 0.5, color="black", lw=1.5)
            ax.axvline(edge - 0.5, color="black", lw=1.5)
        computed = sum(1 for _ in tile_steps(torch.zeros(n, 1), torch.zeros(n, 1), torch.zeros(n, 1), block_size,
                                             causal=causal))
        ax.set_title(f"{'causal' if causal else 'non-causal'}: {computed} of {n_blocks ** 2} tiles")
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
    fig.suptitle(f"n = {n}, block {block_size}: dark = computed, light = masked inside a computed tile, "
                 "white = skipped", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return fig


@styled
def plot_traffic(ns: Sequence[int], d: int, block_size: int, *, batch: int = 1, heads: int = 1,
                 dtype: torch.dtype = torch.float32) -> plt.Figure:
    """:func:`memory_traffic` of naive and tiled attention vs n (log–log, MiB)."""
    rows = [memory_traffic(int(n), d, block_size, batch=batch, heads=heads, dtype=dtype) for n in ns]
    series = {"naive: 6 passes over n × n": [r["naive"] / 2**20 for r in rows],
              f"tiled, block {block_size}: k, v read n / {block_size} times": [r["tiled"] / 2**20 for r in rows]}
    return line_plot(ns, series, logx=True, logy=True, xlabel="sequence length n", ylabel="MiB moved",
                     title=f"Bytes moved outside the cache (estimate), d = {d}, {str(dtype).replace('torch.', '')}")
