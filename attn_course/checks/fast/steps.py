"""The online softmax and the tiled attention loop, each step a parameter: the defaults are the right
algorithm, a known mistake (:mod:`.mistakes`) changes one step."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

Tensor = torch.Tensor
Blocks = Callable[[int, int], list[tuple[int, int]]]  # (n, block_size) -> the (start, end) of each block


# ============================================================================ the algorithms, step by step
def blocks(n: int, b: int) -> list[tuple[int, int]]:
    """(start, end) of each block of ``b`` among ``n`` positions; the last may be shorter."""
    return [(s, min(s + b, n)) for s in range(0, n, b)]


def ends(end: Callable[[int, int], int]) -> Blocks:
    """Blocks whose end is ``end(start, b)`` instead of start + b (a slice off by one)."""
    return lambda n, b: [(s, min(end(s, b), n)) for s in range(0, n, b) if min(end(s, b), n) > s]


def keys(blocks: Blocks) -> Callable[..., list[tuple[int, int]]]:
    """Key blocks from ``blocks(n_k, b)``, those before the query block's end when causal."""
    return lambda n, b, qs, qe, causal: [t for t in blocks(n, b) if not causal or t[0] < qe]


no_tail = lambda n, b: [(s, s + b) for s in range(0, n - n % b, b)]  # noqa: E731 - the partial block never read
drop_last = lambda n, b: blocks(n, b)[:-1] if n > b else []  # noqa: E731 - range(0, n - b, b)
_shrink = lambda m_old, m_new: torch.exp(m_old - m_new)  # noqa: E731 - the right rescaling
grow = lambda m_old, m_new: torch.where(m_old.isinf(), 1.0, torch.exp(m_new - m_old))  # noqa: E731 - sign (guarded)
one = lambda m_old, m_new: torch.ones_like(m_new)  # noqa: E731 - no rescaling
zero = lambda m, block_max: torch.zeros_like(block_max)  # noqa: E731 - no maximum at all


@dataclass(frozen=True)
class Pass:
    """The online softmax, each step a parameter (the defaults are right; a known mistake changes one):
    ``blocks(n, b)`` read; ``block_max(block)``; ``new_max(m, block max)``; ``factor(m_old, m_new)`` on the
    running sum; ``finish(x, m, l)``; ``start`` the first running max."""

    blocks: Blocks = blocks
    block_max: Callable[[Tensor], Tensor] = lambda block: block.amax(-1, keepdim=True)
    new_max: Callable[[Tensor, Tensor], Tensor] = torch.maximum
    factor: Callable[[Tensor, Tensor], Tensor] = _shrink
    finish: Callable[[Tensor, Tensor, Tensor], Tensor] = lambda x, m, l: torch.exp(x - m) / l
    start: float = -math.inf

    def __call__(self, x: Tensor, b: int) -> Tensor:
        m = torch.full(x.shape[:-1] + (1,), self.start, dtype=x.dtype)  # (..., 1)
        l = torch.zeros_like(m)
        for s, e in self.blocks(x.shape[-1], b):
            m_new = self.new_max(m, self.block_max(x[..., s:e]))
            l, m = l * self.factor(m, m_new) + torch.exp(x[..., s:e] - m_new).sum(-1, keepdim=True), m_new
        return self.finish(x, m, l)


@dataclass(frozen=True)
class Loop:
    """The tiled attention loop (FlashAttention-2's forward), each step a parameter (the defaults are right; steps
    named as in :class:`Pass`). A tile's causal mask ``hide(rows, cols, q_start, k_start)`` takes global positions
    and applies where ``masked(qs, qe, ks, ke)``; ``acc_update(acc, correction, p, v_block, l_old, l_new)``;
    ``update_max``: m = m_new after each tile; ``short``: rows never computed are left out."""

    scale: Callable[[Tensor, Tensor, Tensor, int], float] = lambda q, k, v, b: q.shape[-1] ** -0.5
    q_blocks: Blocks = blocks
    k_blocks: Callable[..., list[tuple[int, int]]] = keys(blocks)
    hide: Callable[[Tensor, Tensor, int, int], Tensor] = lambda rows, cols, qs, ks: cols > rows
    masked: Callable[[int, int, int, int], bool] = lambda qs, qe, ks, ke: ke - 1 > qs
    fill: float = -math.inf
    tile_max: Callable[[Tensor], Tensor] = lambda s: s.amax(-1, keepdim=True)
    new_max: Callable[[Tensor, Tensor], Tensor] = torch.maximum
    sum_factor: Callable[[Tensor, Tensor], Tensor] = _shrink
    acc_factor: Callable[[Tensor, Tensor], Tensor] = _shrink
    prob: Callable[[Tensor, Tensor], Tensor] = lambda s, m: torch.exp(s - m)
    acc_update: Callable[..., Tensor] = lambda acc, c, p, v_blk, l_old, l_new: acc * c + p @ v_blk
    finish: Callable[[Tensor, Tensor], Tensor] = lambda acc, l: acc / l
    start: float = -math.inf
    update_max: bool = True
    short: bool = False
    causal: bool = False

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, b: int) -> Tensor:
        n_q, n_k, scale = q.shape[-2], k.shape[-2], self.scale(q, k, v, b)
        out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)  # (..., n_q, d_v)
        done = 0
        for qs, qe in self.q_blocks(n_q, b):
            q_blk = q[..., qs:qe, :]
            m = torch.full(q_blk.shape[:-1] + (1,), self.start, dtype=q.dtype)
            l, acc = torch.zeros_like(m), torch.zeros(q_blk.shape[:-1] + (v.shape[-1],), dtype=q.dtype)
            for ks, ke in self.k_blocks(n_k, b, qs, qe, self.causal):
                s = q_blk @ k[..., ks:ke, :].transpose(-2, -1) * scale  # (..., b_q, b_k)
                if self.causal and self.masked(qs, qe, ks, ke):
                    hidden = self.hide(torch.arange(qs, qe)[:, None], torch.arange(ks, min(ke, n_k))[None, :], qs, ks)
                    s = s.masked_fill(hidden, self.fill)
                m_new = self.new_max(m, self.tile_max(s))
                p = self.prob(s, m_new)
                l_new = l * self.sum_factor(m, m_new) + p.sum(-1, keepdim=True)
                acc = self.acc_update(acc, self.acc_factor(m, m_new), p, v[..., ks:ke, :], l, l_new)
                l, m = l_new, (m_new if self.update_max else m)
            out[..., qs:qe, :] = self.finish(acc, l)
            done = max(done, qe)
        return out[..., :done, :] if self.short else out
