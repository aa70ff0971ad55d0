"""FlashAttention-2 from scratch in Triton, for CUDA GPUs: the forward kernel (notebook 09) and the
backward kernels (notebook 10), paired as one ``torch.autograd.Function``.

**Forward** (:func:`forward`, kernel ``flash_attention_forward``): the tiled loop of
:func:`attn_course.fast.tiled_attention`, written for a GPU.

* one *program* (a block of GPU threads) owns ``BLOCK_M`` query rows of one (batch, head); the grid is
  (number of query blocks, B·A), so all of them run in parallel;
* it loads its query tile once, then streams key/value tiles of ``BLOCK_N`` rows, keeping the running
  row max ``m``, the running row sum ``l`` and the unnormalised output ``acc`` in registers (float32,
  whatever the input dtype);
* scores use ``exp2`` with log2(e) folded into the scale (the GPU's fast exponential is base 2);
* causal: the key loop stops at the diagonal block, and key > query is masked to -inf;
* the output is divided by ``l`` once and written back in the input dtype, and the row's logsumexp
  L = m + log l (natural-log units, as in notebook 10) is stored for the backward.

**Backward** (:func:`backward`, FlashAttention-2's Algorithm 2 as notebook 10 teaches it, see
:func:`attn_course.backward.tiled_attention_backward`): only O and L were saved.

* D = rowsum(dO ∘ O), one number per query row, is computed first (in PyTorch: it is one
  element-wise product and a sum, O(n·d_head) work);
* kernel ``flash_attention_backward_dk_dv``: one program per *key* block j. It keeps Kⱼ, Vⱼ and the
  accumulators dKⱼ, dVⱼ in registers and loops over the query blocks i (causal: from the diagonal
  on); each tile P = exp(S − L) is recomputed from the stored L, then
  dVⱼ += Pᵀ dOᵢ, dP = dOᵢ Vⱼᵀ, dS = P ∘ (dP − Dᵢ), dKⱼ += dSᵀ Qᵢ · scale;
* kernel ``flash_attention_backward_dq``: one program per *query* block i, looping over key blocks j
  to accumulate dQᵢ += dS Kⱼ · scale.

Why dQ gets a pass of its own: in notebook 10's loop, dQᵢ collects one term from every key block.
On a GPU the key blocks run in parallel programs, so every program would add into the same rows of
dQ. FlashAttention-2 (§3.2) does that with atomic adds; here a second kernel owns each dQ block
instead. It recomputes S and dP once more (two extra matrix products per tile: 7 instead of 5), but
needs no atomics, gives the same bits on every run (atomic float additions land in a varying order)
and keeps each kernel as short as the loop it mirrors.

Names: the kernels use Triton's conventional ``HEAD_DIM`` (= d_head) and ``n_ctx`` (= n, the
sequence length) and ``BLOCK_M``/``BLOCK_N`` (= B_r/B_c, the query and key block rows of notebook
10's notation).

Triton is optional in this course: it is imported only when a kernel is first needed, and nothing
else in ``attn_course`` imports it; :func:`kernel_source` shows the kernels' code without it. With
``TRITON_INTERPRET=1`` in the environment when a kernel is first built, Triton's interpreter runs the
same kernels on CPU tensors (slowly, with NumPy) — that is how the tests prove them on a machine
without a GPU (``tests/test_triton.py``; CI runs them in a step of its own).
"""

from __future__ import annotations

import inspect
import math
import os
import textwrap
from typing import Any

import torch

__all__ = ["available", "unavailable_reason", "attention", "forward", "backward", "FlashAttentionFunction",
           "flash_attention", "kernel_source", "KERNELS"]

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x · log2(e))
#: The kernels' names, in the order :func:`kernel_source` knows them.
KERNELS = ("flash_attention_forward", "flash_attention_backward_dk_dv", "flash_attention_backward_dq")

_BUILT: dict[bool, dict[str, Any]] = {}  # interpreter or not → the kernels


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def unavailable_reason(device: str | torch.device = "cuda") -> str | None:
    """Why the kernels cannot run on ``device`` here (None when they can)."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install
        return f"Triton is not installed ({type(exc).__name__}); `pip install triton` on a CUDA machine"
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA GPU is available"
        return None
    if device.type == "cpu" and _interpreting():
        return None
    return f"Triton kernels need a CUDA GPU (or TRITON_INTERPRET=1 for the slow CPU interpreter), not {device.type}"


def available(device: str | torch.device = "cuda") -> bool:
    """True when the kernels can run on ``device``."""
    return unavailable_reason(device) is None


def _build() -> dict[str, Any]:
    """Define the kernels (imports Triton). Called once per mode (GPU or interpreter), on first use."""
    import triton
    import triton.language as tl

    @triton.jit
    def flash_attention_forward(
        Q, K, V, Out, Lse,  # pointers: q, k, v, out (B·A, n, d_head); Lse (B·A, n) float32
        stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_on,
        n_ctx,  # sequence length n (any value, not only multiples of the blocks)
        scale_log2,  # softmax scale · log2(e), so that exp(x·scale) = exp2(x·scale_log2)
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    ):
        block_m = tl.program_id(0)  # which block of query rows
        head = tl.program_id(1)  # which (sequence, head) pair
        rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
        dims = tl.arange(0, HEAD_DIM)  # (HEAD_DIM,)
        row_ok = rows < n_ctx  # the last block may stick out past n

        # Load this program's query tile once: (BLOCK_M, HEAD_DIM). Rows past n read zeros.
        q = tl.load(Q + head * stride_qh + rows[:, None] * stride_qn + dims[None, :],
                    mask=row_ok[:, None], other=0.0)

        m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)  # running row max (base-2 units)
        l = tl.zeros((BLOCK_M,), dtype=tl.float32)  # running row sum
        acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)  # unnormalised output

        # Causal: key blocks that start after this query block's last row are never visited.
        if CAUSAL:
            k_stop = tl.minimum((block_m + 1) * BLOCK_M, n_ctx)
        else:
            k_stop = n_ctx
        for k_start in range(0, k_stop, BLOCK_N):
            cols = k_start + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
            col_ok = cols < n_ctx
            # Kᵀ tile (HEAD_DIM, BLOCK_N) and V tile (BLOCK_N, HEAD_DIM); keys past n read zeros.
            k_t = tl.load(K + head * stride_kh + cols[None, :] * stride_kn + dims[:, None],
                          mask=col_ok[None, :], other=0.0)
            v = tl.load(V + head * stride_vh + cols[:, None] * stride_vn + dims[None, :],
                        mask=col_ok[:, None], other=0.0)

            s = tl.dot(q, k_t) * scale_log2  # (BLOCK_M, BLOCK_N) scores, float32
            visible = col_ok[None, :]  # keys past n do not exist
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])  # key > query is the future
            s = tl.where(visible, s, float("-inf"))

            m_new = tl.maximum(m, tl.max(s, axis=1))
            correction = tl.math.exp2(m - m_new)  # rescales what was accumulated under the old max
            p = tl.math.exp2(s - m_new[:, None])  # (BLOCK_M, BLOCK_N), unnormalised probabilities
            l = l * correction + tl.sum(p, axis=1)
            acc = acc * correction[:, None]
            acc = tl.dot(p.to(v.dtype), v, acc)  # acc += p @ v, on the tensor cores
            m = m_new

        out = acc / l[:, None]  # the one division, at the end
        tl.store(Out + head * stride_oh + rows[:, None] * stride_on + dims[None, :],
                 out.to(Out.dtype.element_ty), mask=row_ok[:, None])
        # L = m + log l, back from base 2 to natural-log units: the one number per row the backward needs.
        lse = (m + tl.math.log2(l)) / 1.4426950408889634
        tl.store(Lse + head * n_ctx + rows, lse, mask=row_ok)

    @triton.jit
    def flash_attention_backward_dk_dv(
        Q, K, V, dO, Lse, Delta, dK, dV,  # q, k, v, dO, dK, dV: (B·A, n, d_head); Lse, Delta: (B·A, n) float32
        stride_h, stride_n,  # the same strides for every (B·A, n, d_head) tensor (all contiguous)
        n_ctx, scale, scale_log2,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    ):
        block_n = tl.program_id(0)  # which block of keys: this program owns dKⱼ and dVⱼ
        head = tl.program_id(1)
        base = head * stride_h
        cols = block_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
        dims = tl.arange(0, HEAD_DIM)
        col_ok = cols < n_ctx

        # Kⱼ and Vⱼ stay in registers for the whole loop: (BLOCK_N, HEAD_DIM) each.
        k = tl.load(K + base + cols[:, None] * stride_n + dims[None, :], mask=col_ok[:, None], other=0.0)
        v = tl.load(V + base + cols[:, None] * stride_n + dims[None, :], mask=col_ok[:, None], other=0.0)
        dk = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
        dv = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)

        # Causal: query blocks that end before this key block starts see none of its keys.
        if CAUSAL:
            q_first = (block_n * BLOCK_N // BLOCK_M) * BLOCK_M
        else:
            q_first = 0
        for q_start in range(q_first, n_ctx, BLOCK_M):
            rows = q_start + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
            row_ok = rows < n_ctx
            q = tl.load(Q + base + rows[:, None] * stride_n + dims[None, :], mask=row_ok[:, None], other=0.0)
            do = tl.load(dO + base + rows[:, None] * stride_n + dims[None, :], mask=row_ok[:, None], other=0.0)
            lse = tl.load(Lse + head * n_ctx + rows, mask=row_ok, other=0.0)  # (BLOCK_M,) L
            delta = tl.load(Delta + head * n_ctx + rows, mask=row_ok, other=0.0)  # (BLOCK_M,) D

            # The forward's P, recomputed from the stored L: no max, no sum (L already normalises it).
            s = tl.dot(q, tl.trans(k)) * scale_log2  # (BLOCK_M, BLOCK_N), base-2 units
            p = tl.math.exp2(s - lse[:, None] * 1.4426950408889634)
            visible = row_ok[:, None] & col_ok[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            p = tl.where(visible, p, 0.0)

            dv = tl.dot(tl.trans(p).to(do.dtype), do, dv)  # dVⱼ += Pᵀ dOᵢ
            dp = tl.dot(do, tl.trans(v))  # (BLOCK_M, BLOCK_N): dP = dOᵢ Vⱼᵀ
            ds = p * (dp - delta[:, None])  # dS = P ∘ (dP − Dᵢ)
            dk = tl.dot(tl.trans(ds).to(q.dtype), q, dk)  # dKⱼ += dSᵀ Qᵢ (scaled once, below)

        tl.store(dK + base + cols[:, None] * stride_n + dims[None, :], (dk * scale).to(dK.dtype.element_ty),
                 mask=col_ok[:, None])
        tl.store(dV + base + cols[:, None] * stride_n + dims[None, :], dv.to(dV.dtype.element_ty),
                 mask=col_ok[:, None])

    @triton.jit
    def flash_attention_backward_dq(
        Q, K, V, dO, Lse, Delta, dQ,  # as above; this program owns dQᵢ
        stride_h, stride_n,
        n_ctx, scale, scale_log2,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    ):
        block_m = tl.program_id(0)  # which block of queries
        head = tl.program_id(1)
        base = head * stride_h
        rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, HEAD_DIM)
        row_ok = rows < n_ctx

        q = tl.load(Q + base + rows[:, None] * stride_n + dims[None, :], mask=row_ok[:, None], other=0.0)
        do = tl.load(dO + base + rows[:, None] * stride_n + dims[None, :], mask=row_ok[:, None], other=0.0)
        lse = tl.load(Lse + head * n_ctx + rows, mask=row_ok, other=0.0)
        delta = tl.load(Delta + head * n_ctx + rows, mask=row_ok, other=0.0)
        dq = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)

        if CAUSAL:
            k_stop = tl.minimum((block_m + 1) * BLOCK_M, n_ctx)
        else:
            k_stop = n_ctx
        for k_start in range(0, k_stop, BLOCK_N):
            cols = k_start + tl.arange(0, BLOCK_N)
            col_ok = cols < n_ctx
            k = tl.load(K + base + cols[:, None] * stride_n + dims[None, :], mask=col_ok[:, None], other=0.0)
            v = tl.load(V + base + cols[:, None] * stride_n + dims[None, :], mask=col_ok[:, None], other=0.0)

            s = tl.dot(q, tl.trans(k)) * scale_log2
            p = tl.math.exp2(s - lse[:, None] * 1.4426950408889634)  # P recomputed, as in dK/dV
            visible = row_ok[:, None] & col_ok[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            p = tl.where(visible, p, 0.0)
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            dq = tl.dot(ds.to(k.dtype), k, dq)  # dQᵢ += dS Kⱼ (scaled once, below)

        tl.store(dQ + base + rows[:, None] * stride_n + dims[None, :], (dq * scale).to(dQ.dtype.element_ty),
                 mask=row_ok[:, None])

    return {"flash_attention_forward": flash_attention_forward,
            "flash_attention_backward_dk_dv": flash_attention_backward_dk_dv,
            "flash_attention_backward_dq": flash_attention_backward_dq}


def kernel_source(name: str = "flash_attention_forward") -> str:
    """One kernel's source (its ``@triton.jit`` function, from :data:`KERNELS`) as text: readable
    without Triton. ``"backward"`` gives both backward kernels, dK/dV first."""
    if name == "backward":
        return kernel_source(KERNELS[1]) + "\n\n" + kernel_source(KERNELS[2])
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r}: one of {', '.join(KERNELS)} or 'backward'")
    lines = inspect.getsource(_build).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"def {name}(") - 1  # its @triton.jit
    end = next(i for i in range(start + 2, len(lines))
               if lines[i].strip() == "@triton.jit" or lines[i].strip().startswith("return {"))
    return textwrap.dedent("\n".join(lines[start:end])).rstrip() + "\n"


def _kernels() -> dict[str, Any]:
    mode = _interpreting()
    if mode not in _BUILT:
        _BUILT[mode] = _build()
    return _BUILT[mode]


def _pick_blocks(head_dim: int, device: torch.device) -> tuple[int, int, int, int]:
    """Forward BLOCK_M, BLOCK_N, num_warps, num_stages: a simple choice that suits Ampere/Hopper GPUs."""
    if device.type != "cuda":  # the interpreter: small tiles, fast enough for tests
        return 16, 16, 1, 1
    major, _ = torch.cuda.get_device_capability(device)
    if major >= 8:
        return (128, 64, 4, 3) if head_dim <= 64 else (128, 64, 8, 2)
    return 64, 64, 4, 2


def _pick_backward_blocks(device: torch.device) -> dict[str, tuple[int, int]]:
    """Backward (BLOCK_M, BLOCK_N) per kernel: dK/dV holds a key block and streams small query blocks;
    dQ holds a query block and streams small key blocks (the accumulators take the registers)."""
    if device.type != "cuda":
        return {"dk_dv": (16, 16), "dq": (16, 16)}
    return {"dk_dv": (32, 64), "dq": (64, 32)}


def _pick_backward_warps(head_dim: int) -> tuple[int, int]:
    """Backward num_warps, num_stages. With d_head = 128 and the (32, 64) tiles of :func:`_pick_backward_blocks`,
    Triton 3.6 on an H100 built, for 4 warps and 2 stages, a dK/dV kernel whose dK was wrong (a quarter off, in
    every key block; dQ and dV right), and with 8 warps, or 1 stage, a right one: the tests of
    scripts/gpu_finale.py caught it (docs/results/nvidia-h100-80gb-hbm3/, docs/gpu-results.md). 8 warps there."""
    return (4, 2) if head_dim <= 64 else (8, 2)


def _validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    reason = unavailable_reason(q.device)
    if reason:
        raise RuntimeError(f"Triton attention unavailable: {reason}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v must have the same shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    d = q.shape[-1]
    if d < 16 or d & (d - 1):
        raise ValueError(f"head dim must be a power of two ≥ 16 for tl.dot, got {d}")


def _as_heads(t: torch.Tensor) -> torch.Tensor:
    """(..., n, d_head) → a contiguous (B·A, n, d_head) view of the same numbers."""
    n, d = t.shape[-2:]
    return t.reshape(-1, n, d).contiguous()


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
            scale: float | None = None, block_m: int | None = None, block_n: int | None = None,
            num_warps: int | None = None, num_stages: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward kernel: (o, lse) with o = softmax(q kᵀ · scale) v and lse the row logsumexp L.

    q, k, v: (..., n, d_head) on a CUDA GPU (or the CPU under ``TRITON_INTERPRET=1``), same shape and
    dtype; d_head a power of two ≥ 16 (16, 32, 64, 128, 256). Returns o (..., n, d_head) in q's dtype and
    lse (..., n) in float32 (natural-log units: L = m + log l of the scaled scores).
    """
    _validate(q, k, v)
    *lead, n, d = q.shape
    q3, k3, v3 = _as_heads(q), _as_heads(k), _as_heads(v)  # (B·A, n, d_head)
    out = torch.empty_like(q3)
    lse = torch.empty(q3.shape[:2], dtype=torch.float32, device=q.device)  # (B·A, n)
    bm, bn, warps, stages = _pick_blocks(d, q.device)
    bm, bn = block_m or bm, block_n or bn
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    extra = {} if q.device.type != "cuda" else {"num_warps": num_warps or warps, "num_stages": num_stages or stages}
    _kernels()["flash_attention_forward"][(triton_cdiv(n, bm), q3.shape[0])](
        q3, k3, v3, out, lse,
        q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
        v3.stride(0), v3.stride(1), out.stride(0), out.stride(1),
        n, scale * LOG2E,
        HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, **extra,
    )
    return out.reshape(q.shape), lse.reshape(*lead, n)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, block_m: int | None = None, block_n: int | None = None,
              num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scale) v with the forward kernel, no autograd (:func:`flash_attention` has one).

    q, k, v: (..., n, d_head), as for :func:`forward`. Returns (..., n, d_head) in q's dtype.
    """
    return forward(q, k, v, causal=causal, scale=scale, block_m=block_m, block_n=block_n,
                   num_warps=num_warps, num_stages=num_stages)[0]


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
             dout: torch.Tensor, *, causal: bool = False, scale: float | None = None,
             blocks: dict[str, tuple[int, int]] | None = None, num_warps: int | None = None,
             num_stages: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward kernels: (dq, dk, dv) shaped like (q, k, v), from what the forward saved.

    q, k, v, o, dout = ∂ℒ/∂O: (..., n, d_head); lse: (..., n) from :func:`forward`. ``blocks`` overrides
    the (BLOCK_M, BLOCK_N) of the ``"dk_dv"`` and ``"dq"`` kernels, ``num_warps``/``num_stages`` those of
    :func:`_pick_backward_warps`. D = rowsum(dO ∘ O) is computed
    here in float32, then the two kernels run (module docstring: why dQ has a pass of its own).
    """
    _validate(q, k, v)
    if o.shape != q.shape or dout.shape != q.shape or lse.shape != q.shape[:-1]:
        raise ValueError(f"o and dout must have shape {tuple(q.shape)} and lse {tuple(q.shape[:-1])}, got "
                         f"{tuple(o.shape)}, {tuple(dout.shape)}, {tuple(lse.shape)}")
    *_, n, d = q.shape
    q3, k3, v3, o3, do3 = (_as_heads(t) for t in (q, k, v, o, dout))  # (B·A, n, d_head)
    lse2 = lse.reshape(-1, n).float().contiguous()  # (B·A, n)
    delta = (do3.float() * o3.float()).sum(-1).contiguous()  # D = rowsum(dO ∘ O): (B·A, n)
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    chosen = {**_pick_backward_blocks(q.device), **(blocks or {})}
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    warps, stages = _pick_backward_warps(d)
    extra = {} if q.device.type != "cuda" else {"num_warps": num_warps or warps, "num_stages": num_stages or stages}
    kernels = _kernels()
    heads = q3.shape[0]
    bm, bn = chosen["dk_dv"]
    kernels["flash_attention_backward_dk_dv"][(triton_cdiv(n, bn), heads)](
        q3, k3, v3, do3, lse2, delta, dk, dv, q3.stride(0), q3.stride(1), n, scale, scale * LOG2E,
        HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, **extra)
    bm, bn = chosen["dq"]
    kernels["flash_attention_backward_dq"][(triton_cdiv(n, bm), heads)](
        q3, k3, v3, do3, lse2, delta, dq, q3.stride(0), q3.stride(1), n, scale, scale * LOG2E,
        HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, **extra)
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


class FlashAttentionFunction(torch.autograd.Function):
    """The forward kernel and the backward kernels as one differentiable operation.

    ``FlashAttentionFunction.apply(q, k, v, causal, scale)``: q, k, v (..., n, d_head) → o (..., n, d_head).
    The forward saves (q, k, v, o, L) — O(n·d_head) per head, never an n × n matrix — and the
    backward returns (dq, dk, dv, None, None).
    """

    @staticmethod
    def forward(ctx, q, k, v, causal=False, scale=None):
        o, lse = forward(q, k, v, causal=causal, scale=scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, dout):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, o, lse, dout.contiguous(), causal=ctx.causal, scale=ctx.scale)
        return dq, dk, dv, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scale) v through :class:`FlashAttentionFunction`: ``.backward()`` runs the
    backward kernels. q, k, v: (..., n, d_head) → (..., n, d_head)."""
    return FlashAttentionFunction.apply(q, k, v, causal, scale)


def triton_cdiv(a: int, b: int) -> int:
    """Ceiling division: the number of blocks of ``b`` that cover ``a``."""
    return -(-a // b)
