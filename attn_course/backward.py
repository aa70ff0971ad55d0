"""Attention's backward pass (notebook 10): the reference versions of what the notebook builds, the
experiments behind its figures, and the functions the benchmark uses.

Forward, per leading index (batch, heads), with scale = 1/√d_k:

    S = Q Kᵀ · scale  (n_q, n_k),   P = softmax(S) row by row  (n_q, n_k),   O = P V  (n_q, d_v).

Backward, from the chain rule, given dO = ∂ℒ/∂O (n_q, d_v):

    dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ⊙ (dP − rowsum(dP ⊙ P)),   dQ = dS K · scale,   dK = dSᵀ Q · scale.

dS is notebook 04's O(n) softmax vector–Jacobian product, one row per query.

* :func:`attention_backward` — those five lines, with the course's mask rule
  (:func:`attn_course.softmax.masked_softmax`: a fully masked row has zero weights, so zero gradients);
* :func:`attention_backward_stored` — the same lines from a P the forward stored (no S, no softmax):
  what autograd runs through naive attention;
* :class:`AttentionFunction` / :func:`attention_fn` — a ``torch.autograd.Function`` using it;
* :func:`tiled_attention_forward` — notebook 09's tiled loop, which also returns the row logsumexp
  L = m + log l, the one number per row the backward needs;
* :func:`tiled_attention_backward` — the FlashAttention-2 backward (Dao 2023, Algorithm 2): only O and
  L were saved; D = rowsum(dO ⊙ O); each tile of P is recomputed as exp(S − L); dK, dV accumulate over
  query blocks (inner loop), dQ over key blocks (outer loop); causal skips the tiles above the diagonal.
  It never holds more than one (block, block) tile of scores: O(n·d) extra memory instead of O(n²);
* :class:`FlashAttentionFunction` / :func:`flash_attention` — both tiled passes as one differentiable
  operation (what ``python -m attn_course bench`` times in its backward mode);
* the backward in practice: :func:`lowp_tiled_attention_backward` (bf16 operands; the statistics L and D and
  the accumulators each in float32 or in bf16), ``key_order`` of :func:`tiled_attention_backward` (the order
  the key blocks add into dQ), :func:`two_pass_attention_backward` (dQ in a pass of its own: no atomic
  adds) and :func:`dropout_keep_tile` (a dropout mask replayed from a seed and an offset);
* :func:`output_query_jacobian` — ∂oᵢ/∂qᵢ = scale · Cov_p(v, k), the Jacobian as a covariance;
* :func:`saturation_study`, :func:`backward_flops`, figures.
"""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch

from . import plots
from .attention import check_qkv
from .jacobian import softmax_vjp
from .masks import check_size
from .softmax import masked_softmax

__all__ = [
    "attention_backward",
    "attention_backward_stored",
    "AttentionFunction",
    "attention_fn",
    "tiled_attention_forward",
    "tiled_attention_backward",
    "FlashAttentionFunction",
    "flash_attention",
    "lowp_tiled_attention_backward",
    "two_pass_attention_backward",
    "dropout_keep_tile",
    "output_query_jacobian",
    "backward_flops",
    "saturation_study",
    "visit_order",
    "plot_visit_order",
    "plot_memory",
    "plot_saturation",
]


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


# ============================================================================ the chain rule
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, mask=None, *,
                       scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of O = softmax(Q Kᵀ / √d_k) V with respect to Q, K and V, from the chain rule.

    q: (..., n_q, d_k), k: (..., n_k, d_k), v: (..., n_k, d_v), dout = ∂ℒ/∂O: (..., n_q, d_v); ``mask``: None or a
    bool tensor broadcastable to (..., n_q, n_k), True = may attend. Returns (dq, dk, dv) shaped like
    (q, k, v). Holds the whole (..., n_q, n_k) matrices P, dP and dS: O(n_q·n_k) memory.
    """
    check_qkv(q, k, v, "q, k, v", arrays=False)
    if q.dim() < 2:
        raise ValueError(f"q must have at least 2 axes, (..., n_q, d_k), but you passed shape {tuple(q.shape)}.")
    try:
        lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} have leading axes that "
                         "do not broadcast; you need the same (..., ) batch and head axes.") from None
    want = tuple(lead) + (q.shape[-2], v.shape[-1])
    if not isinstance(dout, torch.Tensor) or tuple(dout.shape) != want:
        got = tuple(dout.shape) if isinstance(dout, torch.Tensor) else type(dout).__name__
        raise ValueError(f"dout must have the output's shape (..., n_q, d_v) = {want}, but you passed {got}.")
    scale = _scale(q, scale)
    p = masked_softmax(q @ k.transpose(-2, -1) * scale, mask)  # (..., n_q, n_k); a fully masked row is 0
    return attention_backward_stored(q, k, v, p, dout, scale=scale)


def attention_backward_stored(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: torch.Tensor, dout: torch.Tensor,
                              *, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chain rule from the weights P the forward stored: S and the softmax are not recomputed.

    q: (..., n_q, d_k), k: (..., n_k, d_k), v: (..., n_k, d_v); p: (..., n_q, n_k), the forward's softmax(S)
    (masked entries 0, a fully masked row all 0); dout = ∂ℒ/∂O: (..., n_q, d_v). Returns (dq, dk, dv) shaped like
    (q, k, v): dV = Pᵀ dO, dP = dO Vᵀ, dS = P ⊙ (dP − rowsum(dP ⊙ P)), dQ = dS K·scale, dK = dSᵀ Q·scale — four
    matrix products, what autograd runs through naive attention (which keeps P).
    """
    scale = _scale(q, scale)
    dv = p.transpose(-2, -1) @ dout  # (..., n_k, d_v)
    dp = dout @ v.transpose(-2, -1)  # (..., n_q, n_k)
    ds = softmax_vjp(p, dp)  # P ⊙ (dP − rowsum(dP ⊙ P)): (..., n_q, n_k)
    dq = ds @ k * scale  # (..., n_q, d_k)
    dk = ds.transpose(-2, -1) @ q * scale  # (..., n_k, d_k)
    return dq, dk, dv


class AttentionFunction(torch.autograd.Function):
    """Scaled dot-product attention with the hand-written backward :func:`attention_backward`.

    ``AttentionFunction.apply(q, k, v, mask=None)``: q (..., n_q, d_k), k (..., n_k, d_k), v (..., n_k, d_v), mask
    None or bool broadcastable to (..., n_q, n_k) → O (..., n_q, d_v). Forward saves q, k, v and the mask;
    backward recomputes P from them and returns (dq, dk, dv, None): no gradient for the mask.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask=None):
        p = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)  # (..., n_q, n_k)
        ctx.save_for_backward(q, k, v, mask)
        return p @ v  # (..., n_q, d_v)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, mask = ctx.saved_tensors
        dq, dk, dv = attention_backward(q, k, v, dout, mask)
        return dq, dk, dv, None


def attention_fn(q, k, v, mask=None) -> torch.Tensor:
    """O = softmax(q kᵀ/√d_k) v through :class:`AttentionFunction` (differentiable)."""
    return AttentionFunction.apply(q, k, v, mask)


# ============================================================================ FlashAttention-2, tiled
_SHAPES = "q, k, v must be (..., n_q, d_k), (..., n_k, d_k), (..., n_k, d_v) with the same leading axes"


def _check_tiled(q, k, v, block_size, causal):
    check_size(block_size, "block_size", positive=True)
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(f"{_SHAPES}; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{_SHAPES}; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal attention needs as many queries as keys, got {q.shape[-2]} and {k.shape[-2]}")


def _causal_tile(s: torch.Tensor, q_start: int, k_start: int) -> torch.Tensor:
    """Mask key > query in a tile whose first query is ``q_start`` and first key ``k_start`` (global positions)."""
    bq, bk = s.shape[-2:]
    rows = torch.arange(q_start, q_start + bq, device=s.device)[:, None]  # (bq, 1)
    cols = torch.arange(k_start, k_start + bk, device=s.device)[None, :]  # (1, bk)
    return s.masked_fill(cols > rows, float("-inf"))


def tiled_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int = 64, *,
                            causal: bool = False, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The FlashAttention-2 forward (notebook 09's tiled loop) returning what its backward needs.

    q: (..., n_q, d_k), k: (..., n_k, d_k), v: (..., n_k, d_v); ``causal`` needs n_q == n_k (query i sees keys 0..i).
    Returns (o, lse): o (..., n_q, d_v) = softmax(q kᵀ·scale) v and lse (..., n_q) = log Σⱼ exp(sᵢⱼ), the row
    logsumexp of the scaled scores, kept as m + log l from the running max m and running sum l.
    Memory: one (block, block) tile of scores at a time.
    """
    _check_tiled(q, k, v, block_size, causal)
    scale = _scale(q, scale)
    n, m_keys = q.shape[-2], k.shape[-2]
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)  # (..., n_q, d_v)
    lse = torch.empty(q.shape[:-1], dtype=q.dtype, device=q.device)  # (..., n_q)
    for q_start in range(0, n, block_size):
        q_end = min(q_start + block_size, n)
        q_blk = q[..., q_start:q_end, :] * scale  # (..., bq, d_k)
        row_max = torch.full(q_blk.shape[:-1] + (1,), float("-inf"), dtype=q.dtype, device=q.device)  # (..., bq, 1)
        row_sum = torch.zeros_like(row_max)  # (..., bq, 1)
        acc = torch.zeros(q_blk.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)  # (..., bq, d_v)
        for k_start in range(0, q_end if causal else m_keys, block_size):
            k_end = min(k_start + block_size, m_keys)
            s = q_blk @ k[..., k_start:k_end, :].transpose(-2, -1)  # (..., bq, bk)
            if causal and k_end - 1 > q_start:  # the tile reaches above the diagonal
                s = _causal_tile(s, q_start, k_start)
            new_max = torch.maximum(row_max, s.amax(dim=-1, keepdim=True))
            correction = torch.exp(row_max - new_max)
            p = torch.exp(s - new_max)  # (..., bq, bk), unnormalised
            row_sum = row_sum * correction + p.sum(dim=-1, keepdim=True)
            acc = acc * correction + p @ v[..., k_start:k_end, :]
            row_max = new_max
        out[..., q_start:q_end, :] = acc / row_sum
        lse[..., q_start:q_end] = (row_max + torch.log(row_sum)).squeeze(-1)  # L = m + log l
    return out, lse


def tiled_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                             lse: torch.Tensor, dout: torch.Tensor, block_size: int = 64, *, causal: bool = False,
                             scale: float | None = None,
                             key_order: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The FlashAttention-2 backward pass (Dao 2023, Algorithm 2) in PyTorch.

    q: (..., n_q, d_k), k: (..., n_k, d_k), v: (..., n_k, d_v); o: (..., n_q, d_v) and lse: (..., n_q) from
    :func:`tiled_attention_forward`; dout = ∂ℒ/∂O: (..., n_q, d_v). Returns (dq, dk, dv) shaped like (q, k, v).

    First D = rowsum(dO ⊙ O) (..., n_q) — equal to rowsum(dP ⊙ P), without P. Then the outer loop walks
    key/value blocks j and the inner loop query blocks i: each tile P = exp(S − L) is recomputed from
    the saved L (no max: L already normalises it), and

        dVⱼ += Pᵀ dOᵢ,  dP = dOᵢ Vⱼᵀ,  dS = P ⊙ (dP − Dᵢ),  dQᵢ += dS Kⱼ·scale,  dKⱼ += dSᵀ Qᵢ·scale.

    dKⱼ, dVⱼ are complete when the inner loop ends; dQᵢ collects one term per key block. With
    ``causal`` (n_q == n_k), query blocks that end before key block j starts are skipped and the tiles on
    the diagonal are masked. Any block size works, including n_q, n_k not multiples of it.

    ``key_order``: the order in which the outer loop visits the key blocks (a permutation of 0 … n_blocks − 1;
    None = ascending). On a GPU each key block is a program of its own and they finish in any order, each
    adding its terms into dQ as it goes: dK and dV come out the same whatever the order, dQ only up to
    rounding, because floating-point addition is not associative.
    """
    _check_tiled(q, k, v, block_size, causal)
    n, m_keys = q.shape[-2], k.shape[-2]
    starts = list(range(0, m_keys, block_size))
    if key_order is not None:
        if sorted(key_order) != list(range(len(starts))):
            raise ValueError(f"key_order must be a permutation of the {len(starts)} key blocks 0 … {len(starts) - 1}, "
                             f"got {list(key_order)}")
        starts = [starts[j] for j in key_order]
    if o.shape != q.shape[:-1] + (v.shape[-1],) or dout.shape != o.shape:
        raise ValueError(f"o and dout must have shape {tuple(q.shape[:-1] + (v.shape[-1],))}, "
                         f"got {tuple(o.shape)} and {tuple(dout.shape)}")
    if lse.shape != q.shape[:-1]:
        raise ValueError(f"lse must have shape {tuple(q.shape[:-1])} (one number per query), got {tuple(lse.shape)}")
    scale = _scale(q, scale)
    delta = (dout * o).sum(dim=-1, keepdim=True)  # D = rowsum(dO ⊙ O): (..., n_q, 1)
    lse = lse.unsqueeze(-1)  # (..., n_q, 1)
    dq = torch.zeros_like(q)  # (..., n_q, d_k): one term added per key block
    dk = torch.empty_like(k)  # (..., n_k, d_k)
    dv = torch.empty_like(v)  # (..., n_k, d_v)
    for k_start in starts:
        k_end = min(k_start + block_size, m_keys)
        k_blk, v_blk = k[..., k_start:k_end, :], v[..., k_start:k_end, :]  # (..., bk, d_k), (..., bk, d_v)
        dk_blk = torch.zeros_like(k_blk)  # (..., bk, d_k), complete after the inner loop
        dv_blk = torch.zeros_like(v_blk)  # (..., bk, d_v)
        # Causal: a query block ending before k_start sees none of these keys: start at the diagonal.
        for q_start in range(k_start if causal else 0, n, block_size):
            q_end = min(q_start + block_size, n)
            q_blk, do_blk = q[..., q_start:q_end, :], dout[..., q_start:q_end, :]  # (..., bq, d_k), (..., bq, d_v)
            s = q_blk @ k_blk.transpose(-2, -1) * scale  # (..., bq, bk)
            if causal and k_end - 1 > q_start:
                s = _causal_tile(s, q_start, k_start)
            p = torch.exp(s - lse[..., q_start:q_end, :])  # (..., bq, bk): the forward's P, recomputed
            dv_blk += p.transpose(-2, -1) @ do_blk  # (..., bk, d_v)
            dp = do_blk @ v_blk.transpose(-2, -1)  # (..., bq, bk)
            ds = p * (dp - delta[..., q_start:q_end, :])  # (..., bq, bk)
            dq[..., q_start:q_end, :] += ds @ k_blk * scale  # (..., bq, d_k)
            dk_blk += ds.transpose(-2, -1) @ q_blk  # (..., bk, d_k); scaled once below
        dk[..., k_start:k_end, :] = dk_blk * scale
        dv[..., k_start:k_end, :] = dv_blk
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """Tiled attention as one differentiable operation: the forward saves only (q, k, v, o, lse), the
    backward recomputes P tile by tile. ``apply(q, k, v, block_size, causal)`` → o (..., n_q, d_v)."""

    @staticmethod
    def forward(ctx, q, k, v, block_size=64, causal=False):
        o, lse = tiled_attention_forward(q, k, v, block_size, causal=causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.block_size, ctx.causal = block_size, causal
        return o

    @staticmethod
    def backward(ctx, dout):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = tiled_attention_backward(q, k, v, o, lse, dout.contiguous(), ctx.block_size, causal=ctx.causal)
        return dq, dk, dv, None, None


def flash_attention(q, k, v, block_size: int = 64, causal: bool = False) -> torch.Tensor:
    """softmax(q kᵀ/√d_k) v (causal: query i sees keys 0..i) with tiled forward and backward passes.

    q: (..., n_q, d_k), k: (..., n_k, d_k), v: (..., n_k, d_v) → (..., n_q, d_v). Differentiable: ``.backward()`` runs
    :func:`tiled_attention_backward`, so neither pass holds an n_q × n_k matrix.
    """
    return FlashAttentionFunction.apply(q, k, v, block_size, causal)


# ============================================================================ the backward in practice
def two_pass_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                                lse: torch.Tensor, dout: torch.Tensor, block_size: int = 64, *, causal: bool = False,
                                scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tiled backward with dQ in a pass of its own: deterministic, for two more matrix products per tile.

    Same arguments and result as :func:`tiled_attention_backward`. Pass 1 walks key blocks (outer) and query
    blocks (inner) and computes only dK, dV. Pass 2 walks query blocks (outer) and key blocks (inner, always in
    the same order): each dQᵢ is summed by one program, so no two programs ever add into the same rows and no
    atomic add is needed. Pass 2 recomputes S = Qᵢ Kⱼᵀ and dP = dOᵢ Vⱼᵀ, so the backward does 7 matrix products
    per tile instead of 5.
    """
    _check_tiled(q, k, v, block_size, causal)
    n, m_keys = q.shape[-2], k.shape[-2]
    scale = _scale(q, scale)
    delta = (dout * o).sum(dim=-1, keepdim=True)  # D = rowsum(dO ⊙ O): (..., n_q, 1)
    lse = lse.unsqueeze(-1)  # (..., n_q, 1)

    def tile(q_start, q_end, k_start, k_end):
        """P and dS of one tile: (..., bq, bk) each."""
        s = q[..., q_start:q_end, :] @ k[..., k_start:k_end, :].transpose(-2, -1) * scale  # (..., bq, bk)
        if causal and k_end - 1 > q_start:
            s = _causal_tile(s, q_start, k_start)
        p = torch.exp(s - lse[..., q_start:q_end, :])  # (..., bq, bk)
        dp = dout[..., q_start:q_end, :] @ v[..., k_start:k_end, :].transpose(-2, -1)  # (..., bq, bk)
        return p, p * (dp - delta[..., q_start:q_end, :])

    dk, dv = torch.empty_like(k), torch.empty_like(v)  # (..., n_k, d_k), (..., n_k, d_v)
    for k_start in range(0, m_keys, block_size):  # pass 1: dK, dV
        k_end = min(k_start + block_size, m_keys)
        dk_blk = torch.zeros_like(k[..., k_start:k_end, :])  # (..., bk, d_k)
        dv_blk = torch.zeros_like(v[..., k_start:k_end, :])  # (..., bk, d_v)
        for q_start in range(k_start if causal else 0, n, block_size):
            q_end = min(q_start + block_size, n)
            p, ds = tile(q_start, q_end, k_start, k_end)
            dv_blk += p.transpose(-2, -1) @ dout[..., q_start:q_end, :]
            dk_blk += ds.transpose(-2, -1) @ q[..., q_start:q_end, :]
        dk[..., k_start:k_end, :], dv[..., k_start:k_end, :] = dk_blk * scale, dv_blk
    dq = torch.empty_like(q)  # (..., n_q, d_k)
    for q_start in range(0, n, block_size):  # pass 2: dQ, one query block at a time
        q_end = min(q_start + block_size, n)
        dq_blk = torch.zeros_like(q[..., q_start:q_end, :])  # (..., bq, d_k): one program's own accumulator
        for k_start in range(0, q_end if causal else m_keys, block_size):
            k_end = min(k_start + block_size, m_keys)
            _, ds = tile(q_start, q_end, k_start, k_end)
            dq_blk += ds @ k[..., k_start:k_end, :]
        dq[..., q_start:q_end, :] = dq_blk * scale
    return dq, dk, dv


def _round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x rounded to ``dtype`` and held in float32 again (float32: unchanged)."""
    return x.to(dtype).to(torch.float32)


def lowp_tiled_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                                  lse: torch.Tensor, dout: torch.Tensor, block_size: int = 64, *,
                                  lse_dtype: torch.dtype = torch.float32, delta_dtype: torch.dtype = torch.float32,
                                  acc_dtype: torch.dtype = torch.float32, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tiled backward as a bf16 GPU kernel computes it, emulated on the CPU in float32.

    Same arguments as :func:`tiled_attention_backward` (no causal mask); returns float32 (dq, dk, dv). What a
    16-bit kernel holds in bf16 is rounded to bf16: the inputs q, k, v, o, dout, and the tiles P and dS before
    they enter a matrix product. Every product multiplies those bf16 numbers and sums in float32 (what tensor
    cores do: the product of two bf16 numbers is exact in float32). ``lse_dtype`` holds the row logsumexp L
    (``lse``), ``delta_dtype`` the row term D = rowsum(dO ⊙ O), ``acc_dtype`` the accumulators dQ, dK, dV, rounded
    after every addition. FlashAttention keeps all three in float32 (the defaults); bf16 shows what that
    protects.
    """
    _check_tiled(q, k, v, block_size, False)
    scale = _scale(q, scale)
    bf16 = torch.bfloat16
    q, k, v, o, dout = (_round_to(t, bf16) for t in (q, k, v, o, dout))  # the kernel's 16-bit inputs
    n, m_keys = q.shape[-2], k.shape[-2]
    lse = _round_to(lse.to(torch.float32), lse_dtype).unsqueeze(-1)  # L: (..., n_q, 1)
    delta = _round_to((dout * o).sum(dim=-1, keepdim=True), delta_dtype)  # D: (..., n_q, 1)
    dq = torch.zeros_like(q)  # (..., n_q, d_k)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    for k_start in range(0, m_keys, block_size):
        k_blk, v_blk = k[..., k_start:k_start + block_size, :], v[..., k_start:k_start + block_size, :]
        dk_blk, dv_blk = torch.zeros_like(k_blk), torch.zeros_like(v_blk)  # (..., bk, d_k), (..., bk, d_v)
        for q_start in range(0, n, block_size):
            rows = slice(q_start, q_start + block_size)
            q_blk, do_blk = q[..., rows, :], dout[..., rows, :]  # (..., bq, d_k), (..., bq, d_v)
            p = torch.exp(q_blk @ k_blk.transpose(-2, -1) * scale - lse[..., rows, :])  # (..., bq, bk), float32
            dv_blk = _round_to(dv_blk + _round_to(p, bf16).transpose(-2, -1) @ do_blk, acc_dtype)
            ds = p * (do_blk @ v_blk.transpose(-2, -1) - delta[..., rows, :])  # (..., bq, bk), float32
            ds16 = _round_to(ds, bf16)  # dS enters two products as bf16
            dq[..., rows, :] = _round_to(dq[..., rows, :] + ds16 @ k_blk * scale, acc_dtype)
            dk_blk = _round_to(dk_blk + ds16.transpose(-2, -1) @ q_blk, acc_dtype)
        dk[..., k_start:k_start + block_size, :] = dk_blk * scale
        dv[..., k_start:k_start + block_size, :] = dv_blk
    return dq, dk, dv


def dropout_keep_tile(seed: int, offset: int, shape: Sequence[int], p_drop: float) -> torch.Tensor:
    """The dropout mask of one tile, regenerated from (seed, offset): a bool tensor of ``shape``, True = kept
    (probability 1 − ``p_drop``).

    A GPU kernel draws its dropout mask from a counter-based generator (Philox), whose whole state is a seed
    and an offset: given the same two numbers it returns the same bits, so the backward regenerates the mask
    the forward used instead of storing it. Here a CPU generator seeded from (seed, offset) stands in for it;
    ``offset`` numbers the tile (for example query block × number of key blocks + key block).
    """
    if not 0.0 <= p_drop < 1.0:
        raise ValueError(f"p_drop must be in [0, 1), got {p_drop}")
    g = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(offset)) % 2**63)
    return torch.rand(tuple(shape), generator=g) >= p_drop


# ============================================================================ what the notebook shows
def output_query_jacobian(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                          scale: float | None = None) -> torch.Tensor:
    """∂o/∂q for one query, as a covariance under the attention weights.

    q: (d_k,), k: (n_k, d_k), v: (n_k, d_v). With p = softmax(k q · scale) (n_k,) and o = Σⱼ pⱼ vⱼ (d_v,):
    ∂o/∂q = scale · Σⱼ pⱼ (vⱼ − v̄)(kⱼ − k̄)ᵀ = scale · Cov_p(v, k), shape (d_v, d_k), where
    v̄ = Σⱼ pⱼ vⱼ and k̄ = Σⱼ pⱼ kⱼ are the averages under p.
    """
    scale = _scale(q, scale)
    p = torch.softmax(k @ q * scale, dim=-1)  # (n_k,)
    v_centred = v - p @ v  # (n_k, d_v)
    k_centred = k - p @ k  # (n_k, d_k)
    return scale * (v_centred.transpose(0, 1) * p) @ k_centred  # (d_v, d_k)


def backward_flops(n_q: int, n_k: int, d_k: int, d_v: int | None = None, *,
                   recompute: bool = True) -> dict[str, int]:
    """Matrix-multiply FLOPs (2 per multiply-add) of one head's forward and backward.

    Forward: S = Q Kᵀ (2·n_q·n_k·d_k) and O = P V (2·n_q·n_k·d_v). Backward: dV = Pᵀ dO and dP = dO Vᵀ
    (2·n_q·n_k·d_v each), dQ = dS K and dK = dSᵀ Q (2·n_q·n_k·d_k each), plus S = Q Kᵀ again when P is
    recomputed (FlashAttention).
    """
    d_v = d_k if d_v is None else d_v
    qk, pv = 2 * n_q * n_k * d_k, 2 * n_q * n_k * d_v
    backward = 2 * pv + 2 * qk + (qk if recompute else 0)
    return {"forward": qk + pv, "backward": backward}


def saturation_study(dims: Sequence[int], *, n_keys: int = 16, n_trials: int = 200, seed: int = 0) -> dict:
    """What saturation does to each gradient, with and without the 1/√d scale.

    For each d in ``dims``: ``n_trials`` queries, each against ``n_keys`` keys and values (entries N(0, 1)),
    and a random unit upstream gradient dO on the output. For "scaled" (scale 1/√d) and "raw" (scale 1)
    returns lists (one value per d) of the means of: ``max_weight`` (largest weight), ``dS`` (‖∂ℒ/∂S‖),
    ``dq`` (‖∂ℒ/∂q‖) and ``winner_dv`` (the winning key's share of ‖∂ℒ/∂V‖²).
    Computed in float64 from the formulas of :func:`attention_backward`.
    """
    g = torch.Generator().manual_seed(seed)
    out = {mode: {key: [] for key in ("max_weight", "dS", "dq", "winner_dv")} for mode in ("scaled", "raw")}
    for d in dims:
        q = torch.randn(n_trials, 1, d, generator=g, dtype=torch.float64)  # (T, 1, d)
        k = torch.randn(n_trials, n_keys, d, generator=g, dtype=torch.float64)  # (T, n_k, d)
        v = torch.randn(n_trials, n_keys, d, generator=g, dtype=torch.float64)  # (T, n_k, d)
        up = torch.randn(n_trials, 1, d, generator=g, dtype=torch.float64)
        up = up / up.norm(dim=-1, keepdim=True)  # (T, 1, d), unit rows
        for mode, scale in (("scaled", 1 / math.sqrt(d)), ("raw", 1.0)):
            p = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)  # (T, 1, n_k)
            dq, _, dv = attention_backward(q, k, v, up, scale=scale)
            ds = softmax_vjp(p, up @ v.transpose(-2, -1))  # (T, 1, n_k)
            winner = p.argmax(dim=-1).squeeze(-1)  # (T,)
            dv_sq = dv.pow(2).sum(-1)  # (T, n_k)
            stats = out[mode]
            stats["max_weight"].append(p.amax(dim=-1).mean().item())
            stats["dS"].append(ds.norm(dim=(-2, -1)).mean().item())
            stats["dq"].append(dq.norm(dim=(-2, -1)).mean().item())
            stats["winner_dv"].append((dv_sq[torch.arange(n_trials), winner] / dv_sq.sum(-1)).mean().item())
    return out


# ============================================================================ figures
def visit_order(n: int, block_size: int, causal: bool) -> np.ndarray:
    """(n_blocks, n_blocks) array: the step at which the backward visits tile (query block i, key block j),
    counting from 1, or 0 for a tile it skips. Key blocks are the outer loop, query blocks the inner."""
    blocks = len(range(0, n, block_size))
    order = np.zeros((blocks, blocks), dtype=int)
    step = 0
    for j in range(blocks):
        for i in range(j if causal else 0, blocks):
            step += 1
            order[i, j] = step
    return order


@plots.styled
def plot_visit_order(n: int, block_size: int) -> plt.Figure:
    """The order in which the tiled backward visits tiles, without and with a causal mask."""
    fig, axes = plt.subplots(1, 2, figsize=(8.6, 4.0))
    for ax, causal in zip(axes, (False, True)):
        order = visit_order(n, block_size, causal)
        shown = np.ma.masked_equal(order, 0)
        ax.imshow(shown, cmap=plt.get_cmap("Blues").with_extremes(bad="white"), vmin=-order.max() * 0.3,
                  vmax=order.max())
        for (i, j), step in np.ndenumerate(order):
            ax.text(j, i, str(step) if step else "skip", ha="center", va="center", fontsize=plots.MIN_FONT + 2,
                    color="grey" if not step else ("white" if step > 0.5 * order.max() else "black"))
        blocks = order.shape[0]
        ax.set_xticks(range(blocks), labels=[f"K,V {j}" for j in range(blocks)])
        ax.set_yticks(range(blocks), labels=[f"Q {i}" for i in range(blocks)])
        ax.set_xlabel("key block j (outer loop)")
        ax.set_ylabel("query block i (inner loop)")
        ax.set_title(f"{'causal' if causal else 'no mask'}: {int((order > 0).sum())} of {blocks * blocks} tiles")
        for edge in np.arange(0.5, blocks - 1):
            ax.axhline(edge, color="white", lw=2)
            ax.axvline(edge, color="white", lw=2)
    short = f" (the last block has {n % block_size} rows)" if n % block_size else ""
    fig.suptitle(f"Order of the tiles in the backward pass, n = {n}, block {block_size}{short}\n"
                 "dKⱼ, dVⱼ are complete at the bottom of column j; dQᵢ collects one term per tile of row i",
                 fontsize=plots.MIN_FONT + 2)
    fig.tight_layout()
    return fig


@plots.styled
def plot_memory(ns: Sequence[int], measured: dict[str, Sequence[float]], *, extrapolate_to: int | None = None,
                fit: dict[str, tuple[float, float]] | None = None,
                limit: tuple[str, float] | None = None) -> plt.Figure:
    """Peak extra memory (bytes, measured) against n on log axes, one line per method; ``fit`` maps a method to the
    (coefficient, power) of a fitted a·n^p drawn dashed up to ``extrapolate_to``; ``limit`` is a
    (label, bytes) horizontal line."""
    fig, ax = plt.subplots(figsize=(6.8, 4.2))
    for (name, values), colour in zip(measured.items(), ("C3", "C0", "C2")):
        ax.plot(ns, np.asarray(values, dtype=float) / 2**20, "o-", color=colour, label=name)
        if fit and name in fit and extrapolate_to:
            a, power = fit[name]
            xs = np.geomspace(ns[0], extrapolate_to, 30)
            ax.plot(xs, a * xs**power / 2**20, "--", color=colour, label=f"fit ∝ $n^{{{power:.1f}}}$, extrapolated")
    if limit:
        ax.axhline(limit[1] / 2**20, color="grey", ls=":")
        ax.text(ns[0], limit[1] / 2**20 * 1.2, limit[0], color="grey", fontsize=plots.MIN_FONT + 1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("peak extra memory (MiB)")
    ax.set_title("Backward pass: store P or recompute it (one head, d = 64, float32)")
    ax.legend(fontsize=plots.MIN_FONT + 0.5, loc="upper left", bbox_to_anchor=(0.0, 0.86))
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


@plots.styled
def plot_saturation(dims: Sequence[int], study: dict) -> plt.Figure:
    """Three panels from :func:`saturation_study`: ‖∂ℒ/∂S‖, ‖∂ℒ/∂q‖, the winning key's share of ∂ℒ/∂V."""
    fig, axes = plt.subplots(1, 3, figsize=(9.6, 3.6))
    panels = (("dS", "mean ‖∂ℒ/∂S‖ (scores)"), ("dq", "mean ‖∂ℒ/∂q‖ (query)"),
              ("winner_dv", "winning key's mean share of ‖∂ℒ/∂V‖²"))
    for ax, (key, title) in zip(axes, panels):
        for mode, style in (("scaled", "o-"), ("raw", "s--")):
            ax.plot(dims, study[mode][key], style, label="÷√d_k" if mode == "scaled" else "not scaled")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("d_k")
        ax.set_title(title, fontsize=plots.MIN_FONT + 1)
        ax.grid(True, alpha=0.3)
    axes[0].legend()
    for ax in axes:
        ax.set_ylim(bottom=0)
    axes[2].set_ylim(0, 1.02)
    fig.tight_layout()
    return fig
