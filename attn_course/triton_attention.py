"""A from-scratch FlashAttention-2 forward kernel in Triton (non-causal and causal), for CUDA GPUs (notebook 09).

The kernel is the tiled loop of :func:`attn_course.fast.tiled_attention`, written for a GPU:

* one *program* (a block of GPU threads) owns ``BLOCK_M`` query rows of one (batch, head);
  the grid is (number of query blocks, batch · heads), so all of them run in parallel;
* it loads its query tile once, then streams key/value tiles of ``BLOCK_N`` rows from global memory,
  keeping the running row max ``m``, the running row sum ``l`` and the unnormalised output ``acc`` in
  registers (float32, whatever the input dtype);
* scores use ``exp2`` with log2(e) folded into the scale (the GPU's fast exponential is base 2);
* causal: the key loop stops at the diagonal block, and key > query is masked to -inf;
* the output is divided by ``l`` once and written back in the input dtype.

Triton is optional in this course: it is imported only when :func:`attention` is first called, and
nothing else in ``attn_course`` needs it; :func:`kernel_source` shows the kernel's code without it. With ``TRITON_INTERPRET=1`` set before the first call,
Triton's interpreter runs the same kernel on CPU tensors (slowly) — that is how the tests check it on
a machine without a GPU.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

__all__ = ["available", "unavailable_reason", "attention", "kernel_source"]

_KERNEL: Any = None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def unavailable_reason(device: str | torch.device = "cuda") -> str | None:
    """Why the kernel cannot run on ``device`` here (None when it can)."""
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
    """True when :func:`attention` can run on ``device``."""
    return unavailable_reason(device) is None


def _build() -> Any:
    """Define the kernel (imports Triton). Called once, on first use."""
    import triton
    import triton.language as tl

    @triton.jit
    def flash_attention_forward(
        Q, K, V, Out,  # pointers to (B·A, n, d) tensors
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

    return flash_attention_forward


def kernel_source() -> str:
    """The Triton kernel's source code (the ``@triton.jit`` function), as text: readable without Triton."""
    import inspect
    import textwrap

    lines = inspect.getsource(_build).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "@triton.jit")
    end = next(i for i, line in enumerate(lines) if line.strip().startswith("return flash_attention_forward"))
    return textwrap.dedent("\n".join(lines[start:end])).rstrip() + "\n"


def _pick_blocks(head_dim: int, device: torch.device) -> tuple[int, int, int, int]:
    """BLOCK_M, BLOCK_N, num_warps, num_stages: a simple choice that suits Ampere/Hopper GPUs."""
    if device.type != "cuda":  # the interpreter: small tiles, fast enough for tests
        return 16, 16, 1, 1
    major, _ = torch.cuda.get_device_capability(device)
    if major >= 8:
        return (128, 64, 4, 3) if head_dim <= 64 else (128, 64, 8, 2)
    return 64, 64, 4, 2


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, block_m: int | None = None, block_n: int | None = None,
              num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scale) v with the Triton kernel, forward only (no autograd).

    q, k, v: (..., n, d) on a CUDA GPU (or the CPU under ``TRITON_INTERPRET=1``), same shape and
    dtype; d a power of two ≥ 16 (16, 32, 64, 128, 256). Returns (..., n, d) in q's dtype.
    """
    global _KERNEL
    reason = unavailable_reason(q.device)
    if reason:
        raise RuntimeError(f"Triton attention unavailable: {reason}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v must have the same shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    *lead, n, d = q.shape
    if d < 16 or d & (d - 1):
        raise ValueError(f"head dim must be a power of two ≥ 16 for tl.dot, got {d}")
    if _KERNEL is None:
        _KERNEL = _build()
    heads = math.prod(lead) if lead else 1
    q3, k3, v3 = (t.reshape(heads, n, d).contiguous() for t in (q, k, v))  # (B·A, n, d)
    out = torch.empty_like(q3)
    bm, bn, warps, stages = _pick_blocks(d, q.device)
    bm, bn = block_m or bm, block_n or bn
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    grid = (triton_cdiv(n, bm), heads)
    extra = {} if q.device.type != "cuda" else {"num_warps": num_warps or warps, "num_stages": num_stages or stages}
    _KERNEL[grid](
        q3, k3, v3, out,
        q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
        v3.stride(0), v3.stride(1), out.stride(0), out.stride(1),
        n, scale * 1.4426950408889634,
        HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, **extra,
    )
    return out.reshape(q.shape)


def triton_cdiv(a: int, b: int) -> int:
    """Ceiling division: the number of blocks of ``b`` that cover ``a``."""
    return -(-a // b)
