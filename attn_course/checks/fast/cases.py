"""The cases the three checks try, in order, each with the oracle's answer in float64 (``torch.softmax``,
``F.scaled_dot_product_attention``) and the tolerance of its dtype."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from .steps import Tensor, blocks


# ============================================================================ the cases
@dataclass
class Case:
    """One input: ``args`` as the learner gets them, ``expected`` from the oracle (float64), its tolerance."""

    name: str
    args: tuple
    expected: Tensor
    atol: float
    rtol: float
    block: int
    causal: bool = False


def _case(name: str, args: tuple[Tensor, ...], b: int, causal: bool = False) -> Case:
    """``args`` (x, or q, k, v) with block size ``b``, the oracle's answer in float64, the tolerance of their dtype."""
    wide = [a.double() for a in args]
    expected = torch.softmax(*wide, -1) if len(args) == 1 else F.scaled_dot_product_attention(*wide, is_causal=causal)
    return Case(name, (*args, b), expected, *((1e-5, 1e-4) if args[0].dtype == torch.float64 else (2e-5, 1e-3)),
                b, causal)


def _offsets(n: int, b: int, pattern: str, spread: float, g: torch.Generator) -> Tensor:
    """(n,) an offset per position, constant on each block: maxima that rise, fall, or both (random steps)."""
    count, f64 = len(blocks(n, b)), torch.float64
    if pattern != "mixed":
        return torch.linspace(*((0, spread) if pattern == "rising" else (spread, 0)), count, dtype=f64).repeat_interleave(b)[:n]
    steps = (torch.rand(count, generator=g, dtype=f64) + 0.5) * spread
    return torch.cumsum(steps * torch.tensor([(-1.0) ** i for i in range(count)], dtype=f64), 0).repeat_interleave(b)[:n]


def rows(shape: tuple[int, ...], b: int, seed: int, pattern: str = "mixed", dtype=torch.float64) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) + _offsets(shape[-1], b, pattern, 4.0, g)).to(dtype)


def _extreme_rows(levels: Sequence[Sequence[float]], b: int, seed: int) -> Tensor:
    """Rows whose blocks sit at the given levels (plus a little noise in [0, 5))."""
    x = torch.stack([torch.tensor(level, dtype=torch.float64).repeat_interleave(b) for level in levels])
    return x + 5 * torch.rand(x.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


#: Rows whose blocks of 4 each span 200: a reference other than the block's maximum overflows float32.
_SPREAD = torch.tensor([[-100.0, 0.0, 50.0, 100.0, -90.0, 10.0, 60.0, 95.0],
                        [30.0, -120.0, 80.0, -40.0, 85.0, -110.0, 5.0, 70.0],
                        [0.5, -1.0, 2.0, 0.0, 1.5, -0.5, 1.0, 3.0]], dtype=torch.float64)


@functools.lru_cache(maxsize=None)
def softmax_cases() -> tuple[Case, ...]:
    """The inputs ``check_online_softmax`` tries, in order."""
    f32 = torch.float32
    extreme = _extreme_rows([[800, -200, 700], [-300, 300, 900], [100, -700, 90], [750, 740, 745],
                             [-800, -790, -805]], 4, 7)
    extreme32 = _extreme_rows([[60, -60, 50], [-30, 30, 95], [20, -80, 15], [95, 90, 93], [-120, -110, -115]],
                              4, 8).to(f32)
    return tuple(_case(name, (x,), b) for name, x, b in [
        ("x (4, 10) whose block maxima rise, block_size 3", rows((4, 10), 3, 1, "rising"), 3),
        ("x (3, 12) whose block maxima fall, then rise, block_size 4", rows((3, 12), 4, 2), 4),
        ("x (4, 10) whose block maxima fall, block_size 4", rows((4, 10), 4, 3, "falling"), 4),
        ("x (3, 7), block_size 1", rows((3, 7), 1, 4), 1),
        ("a 1-D x (9,), block_size 4", rows((9,), 4, 5), 4),
        ("x (2, 3, 12) (batch × rows), block_size 5", rows((2, 3, 12), 5, 6), 5),
        ("x (2, 8), block_size 8 (one block)", rows((2, 8), 8, 9), 8),
        ("x (3, 7), block_size 16 (longer than the row)", rows((3, 7), 16, 10), 16),
        ("x (2, 1, 1) (n = 1), block_size 3", rows((2, 1, 1), 3, 11), 3),
        ("x (4, 10) in float32, block_size 3", rows((4, 10), 3, 12, dtype=f32), 3),
        ("x (5, 12) with values in the hundreds whose block maxima rise and fall by up to 1000, block_size 4",
         extreme, 4),
        ("x (5, 12) in float32 with block maxima that rise and fall by up to 125, block_size 4", extreme32, 4),
        ("x (3, 8) in float32 whose blocks span up to 200, block_size 4", _SPREAD.to(f32), 4),
    ])


def qkv(lead: tuple[int, ...], n_q: int, n_k: int, d_k: int, d_v: int, b: int, seed: int, pattern: str = "mixed",
         dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v whose scores rise and fall block by block (q leans to all-ones, each key block shifted along it)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, n_q, d_k, generator=g, dtype=torch.float64) + 1.0
    k = torch.randn(*lead, n_k, d_k, generator=g, dtype=torch.float64)
    k = k + _offsets(n_k, b, pattern, 2.0, g)[:, None]
    v = torch.randn(*lead, n_k, d_v, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _exact_qkv(scores: Tensor, d_v: int, seed: int, dtype: torch.dtype = torch.float64) -> tuple[Tensor, ...]:
    """q, k, v with q kᵀ / √d_k equal to ``scores`` (n_q, n_k): q = scores, k = √n_k · I."""
    n_k = scores.shape[-1]
    v = torch.randn(n_k, d_v, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return scores.to(dtype), (math.sqrt(n_k) * torch.eye(n_k, dtype=torch.float64)).to(dtype), v.to(dtype)


def _extreme_qkv(levels: Sequence[Sequence[float]], b: int, d_v: int, seed: int, dtype=torch.float64):
    return _exact_qkv(_extreme_rows(levels, b, seed), d_v, seed + 100, dtype)


@functools.lru_cache(maxsize=None)
def tiled_cases() -> tuple[Case, ...]:
    """The inputs ``check_tiled_attention`` tries, in order."""
    from ...dot import worked_example  # imported here: attn_course.dot imports matplotlib

    f32 = torch.float32
    extreme = _extreme_qkv([[800, -200], [-300, 300], [-700, -705], [750, 740], [100, -700], [-20, -25],
                            [-800, -790]], 4, 3, 21)
    extreme32 = _extreme_qkv([[60, -60], [-30, 30], [-100, -105], [95, 90], [20, -80], [-2, -5], [-120, -110]],
                             4, 3, 22, f32)
    return tuple(_case(name, qkv, b) for name, qkv, b in [
        ("the 4×8 worked example (n = 4, d_k = d_v = 8), block_size 2", worked_example(), 2),
        ("q (10, 4), k (10, 4), v (10, 5) with rising scores, block_size 4", qkv((), 10, 10, 4, 5, 4, 11, "rising"), 4),
        ("batch × heads (2, 3), n = 37, d_k = 8, d_v = 3, block_size 16", qkv((2, 3), 37, 37, 8, 3, 16, 12), 16),
        ("q, k (12, 4), v (12, 2), block_size 1", qkv((), 12, 12, 4, 2, 1, 13), 1),
        ("n_q = 7 queries, n_k = 13 keys, d_k = 4, d_v = 6, block_size 4", qkv((), 7, 13, 4, 6, 4, 14), 4),
        ("n_q = 13 queries, n_k = 5 keys, d_k = 3, d_v = 2, block_size 4", qkv((), 13, 5, 3, 2, 4, 15), 4),
        ("q, k (9, 4), v (9, 4), block_size 32 (longer than the sequence)", qkv((), 9, 9, 4, 4, 32, 16), 32),
        ("a batch of 2, n = 24, d_k = 8, d_v = 8 in float32, block_size 8", qkv((2,), 24, 24, 8, 8, 8, 17, dtype=f32), 8),
        ("one query over 6 keys, size-1 axes: q (1, 1, 1, 5), v (1, 1, 6, 1), block_size 4",
         qkv((1, 1), 1, 6, 5, 1, 4, 18), 4),
        ("a single key (n_k = 1), q (3, 4), block_size 2", qkv((), 3, 1, 4, 2, 2, 19), 2),
        ("scores in the hundreds whose tile maxima rise and fall by up to 1000 (7 queries, 8 keys), block_size 4",
         extreme, 4),
        ("float32 scores whose tile maxima rise and fall by up to 120 (7 queries, 8 keys), block_size 4", extreme32, 4),
        ("float32 scores whose tiles span up to 200 (3 queries, 8 keys), block_size 4", _exact_qkv(_SPREAD, 3, 23, f32), 4),
    ])


@functools.lru_cache(maxsize=None)
def causal_cases() -> tuple[Case, ...]:
    """The inputs ``check_causal_tiled_attention`` tries, in order."""
    from ...dot import worked_example

    f32 = torch.float32
    extreme = _extreme_qkv([[800, -200, 700, -100], [-300, 300, -10, 900], [750, 740, 745, 748], [100, -700, 90, -650],
                            [-20, -25, -700, -10], [-800, -790, -805, -795], [-20000, -20010, -19995, -20005],
                            [-100, 600, -200, 650]], 2, 3, 31)
    extreme32 = _extreme_qkv([[60, -60, 50, -20], [-30, 30, -10, 95], [95, 90, 93, 94], [20, -80, 15, -75],
                              [-2, -5, -100, -1], [-120, -110, -115, -112], [40, -50, 38, -60], [-10, 80, -20, 85]],
                             2, 3, 32, f32)
    return tuple(_case(name, qkv, b, causal=True) for name, qkv, b in [
        ("the 4×8 worked example (n = 4, d_k = d_v = 8), block_size 2", worked_example(), 2),
        ("q, k (10, 4), v (10, 5) with rising scores, block_size 4", qkv((), 10, 10, 4, 5, 4, 21, "rising"), 4),
        ("batch × heads (2, 3), n = 37, d_k = 8, d_v = 3, block_size 16", qkv((2, 3), 37, 37, 8, 3, 16, 22), 16),
        ("q, k (12, 4), v (12, 2), block_size 1", qkv((), 12, 12, 4, 2, 1, 23), 1),
        ("q, k (10, 4), v (10, 3), block_size 5 (n a multiple of the block)", qkv((), 10, 10, 4, 3, 5, 24), 5),
        ("q, k (11, 3), v (11, 2) with falling scores, block_size 3", qkv((), 11, 11, 3, 2, 3, 25, "falling"), 3),
        ("q, k (9, 4), v (9, 4), block_size 32 (longer than the sequence)", qkv((), 9, 9, 4, 4, 32, 26), 32),
        ("a batch of 2, n = 24, d_k = 8, d_v = 8 in float32, block_size 8", qkv((2,), 24, 24, 8, 8, 8, 27, dtype=f32), 8),
        ("a single position (n = 1) with size-1 axes: q (1, 1, 1, 5), v (1, 1, 1, 1), block_size 4",
         qkv((1, 1), 1, 1, 5, 1, 4, 28), 4),
        ("scores from −20000 to 900 whose tile maxima rise and fall by up to 1000 (n = 8), block_size 2", extreme, 2),
        ("float32 scores whose tile maxima rise and fall by up to 120 (n = 8), block_size 2", extreme32, 2),
    ])


@functools.lru_cache(maxsize=None)
def again(exercise: str) -> tuple[Case, ...]:
    """Tried after the other cases: the shapes (and block size) of an earlier case with other values,
    so a result kept from an earlier call shows; for tiled_attention, tile maxima that rise by up to 900 from the first
    tile, past what exp holds in float64 (e^709), so a reference maximum never updated shows."""
    if exercise == "online_softmax":
        return (_case("x (3, 12) whose block maxima rise, block_size 4", (rows((3, 12), 4, 13, "rising"),), 4),)
    if exercise == "tiled_attention":
        return (_case("scores whose tile maxima rise by up to 900 from the first tile (7 queries, 8 keys), block_size 4",
                      _extreme_qkv([[-400, 400], [-700, 100], [-5, 0], [-300, 600], [-900, -20], [0, 750],
                                    [-100, -100]], 4, 3, 24), 4),)
    return (_case("q, k (10, 4), v (10, 5) with falling scores, block_size 4",
                  qkv((), 10, 10, 4, 5, 4, 33, "falling"), 4, causal=True),)
