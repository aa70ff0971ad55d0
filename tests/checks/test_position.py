"""Checks of notebook 12 (attn_course.checks.position): each pitfall rejected with its diagnosis, correct
alternatives accepted, and the same verdict when the grader replays the log."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_course import position as ref
from attn_course.checks.position import (check_additive_attention, check_alibi_bias, check_apply_rope,
                                         check_is_permutation_equivariant, check_relative_position_bias,
                                         check_rope_decode_step, check_sinusoidal_encoding)
from attn_course.checks.result import Status


# ================================================================================== is_permutation_equivariant
def perm_test(make_x=None, make_perm=None, compare=None, n=6, d=8, seed=0):
    """A learner's test with switches: right with the defaults."""

    def test(attn):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, d, generator=g) if make_x is None else make_x(g)
        perm = torch.randperm(x.shape[-2], generator=g) if make_perm is None else make_perm(x.shape[-2], g)
        a, b = attn(x[..., perm, :]), attn(x)
        return torch.allclose(a, b[..., perm, :], atol=1e-5) if compare is None else compare(a, b, perm)

    return test


def perm_test_pytest_style(attn):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 4, generator=g, dtype=torch.float64)
    perm = torch.randperm(5, generator=g)
    assert torch.allclose(attn(x[perm]), attn(x)[perm]), "not equivariant"


def perm_test_several(attn):
    g = torch.Generator().manual_seed(2)
    for _ in range(3):
        x = torch.randn(2, 7, 6, generator=g)  # a batch
        perm = torch.randperm(7, generator=g)
        if not torch.allclose(attn(x[:, perm]), attn(x)[:, perm], atol=1e-5):
            return False
    return True


def perm_test_numpy(attn):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 4, generator=g)
    perm = torch.randperm(6, generator=g)
    return np.allclose(attn(x[perm]).numpy(), attn(x)[perm].numpy(), atol=1e-5)


def perm_test_tensor_result(attn):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(8, 6, generator=g)
    perm = torch.randperm(8, generator=g)
    return (attn(x[perm]) - attn(x).index_select(0, perm)).abs().max() < 1e-4


def keep_first(n, g):
    return torch.cat([torch.zeros(1, dtype=torch.long), 1 + torch.randperm(n - 1, generator=g)])


@pytest.mark.parametrize("fn", [perm_test(), perm_test_pytest_style, perm_test_several, perm_test_numpy,
                                perm_test_tensor_result, perm_test(n=4, d=2, seed=5), perm_test(make_perm=keep_first)])
def test_check_equivariance_test_accepts(fn, accepts):
    accepts(check_is_permutation_equivariant, fn)


def no_redraw_of_3(attn):
    x = torch.randn(3, 8)
    perm = torch.randperm(3)
    return torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5)


def no_return(attn):
    x = torch.randn(5, 4)
    perm = torch.randperm(5)
    torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5)


@pytest.mark.parametrize("fn,phrases", [
    (perm_test(compare=lambda a, b, perm: torch.allclose(b, b)), ["calls everything equivariant",
                                                                  "comparison lets that through"]),
    (perm_test(compare=lambda a, b, perm: torch.equal(a, b[perm])), ["rejects attention without positions",
                                                                      "tolerance"]),
    # allclose's default atol (1e-8) is below float32 rounding on outputs near 0 (centred attention)
    (perm_test(compare=lambda a, b, perm: torch.allclose(a, b[perm])), ["rejects attention without positions",
                                                                         "tolerance"]),
    (perm_test(compare=lambda a, b, perm: torch.allclose(a, b[perm.argsort()], atol=1e-5)),
     ["rejects functions that ignore positions", "attn(x)[perm]"]),
    (perm_test(compare=lambda a, b, perm: torch.allclose(a, b, atol=1e-5)), ["rejects functions that ignore"]),
    (perm_test(make_perm=lambda n, g: torch.arange(n).flip(0)), ["misses symmetric distance bias", "reversal"]),
    (perm_test(make_perm=lambda n, g: torch.tensor([1, 0]), n=2), ["misses symmetric distance bias", "sequence of 2"]),
    (perm_test(make_perm=lambda n, g: torch.arange(n)), ["calls everything equivariant",
                                                         "never runs attn on a reordering"]),
    (perm_test(compare=lambda a, b, perm: not torch.allclose(a, b[perm], atol=1e-5)), ["wrong way round"]),
    (perm_test(compare=lambda a, b, perm: torch.allclose(a, b[perm], atol=10.0)),
     ["calls everything equivariant", "tolerance far too loose"]),
    (perm_test(make_x=lambda g: torch.ones(6, 8)), ["same vector"]),
    (perm_test(n=1), ["calls everything equivariant", "single token"]),
    (perm_test(make_x=lambda g: 1e-3 * torch.randn(6, 8, generator=g)), ["misses RoPE", "tiny"]),
    (no_return, ["calls everything equivariant", "returns None"]),
    (lambda attn: "yes", ["did not return True or False"]),
    (lambda attn: attn(torch.randn(3, 4), torch.randn(3, 4)), ["raised TypeError"]),
    (lambda attn: attn(torch.randn(4)), ["raised ValueError", "shape (n, d)"]),
    (lambda attn: True, ["never calls attn"]),
    (lambda attn: False, ["never calls attn"]),
    (perm_test(make_x=lambda g: torch.randn(8, 8, generator=g),
               compare=lambda a, b, perm: True), ["calls everything equivariant"]),
    # comparisons blind to where the rows go: every variant above changes values, not only their places
    (perm_test(compare=lambda a, b, perm: torch.allclose(a.sort(0).values, b[perm].sort(0).values, atol=1e-5)),
     ["the test ignores where the rows go", "sorted rows"]),
    (perm_test(compare=lambda a, b, perm: torch.allclose(a.mean(0), b[perm].mean(0), atol=1e-5)),
     ["the test ignores where the rows go"]),
    # no second draw when randperm(3) is the identity or the reversal: right on the first seed by luck
    (no_redraw_of_3, ["misses symmetric distance bias on other random draws", "the identity or the reversal"]),
])
def test_check_equivariance_test_names_each_pitfall(fn, phrases, rejects):
    rejects(check_is_permutation_equivariant, fn, *phrases)


def feature_axis_test(attn):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 6, generator=g)
    perm = torch.randperm(6, generator=g)
    return torch.allclose(attn(x[:, perm]), attn(x)[:, perm], atol=1e-5)


def test_check_equivariance_test_feature_axis(rejects):
    rejects(check_is_permutation_equivariant, feature_axis_test, "features (the last axis)")


def test_check_equivariance_test_not_attempted(rejects, unfinished):
    rejects(check_is_permutation_equivariant, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)


# ================================================================================== sinusoidal_encoding
def sin_loops(n, d, base=10000.0):
    pe = torch.zeros(n, d)
    for p in range(n):
        for j in range(d):
            angle = p / base ** (2 * (j // 2) / d)
            pe[p, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return pe


def sin_exp_log(n, d, base=10000.0):
    position = torch.arange(n).unsqueeze(1).double()
    div = torch.exp(torch.arange(0, d, 2).double() * (-math.log(base) / d))
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(position * div)
    pe[:, 1::2] = torch.cos(position * div)[:, : d // 2]
    return pe


def sin_numpy(n, d, base=10000.0):
    return ref.sinusoidal_encoding(n, d, base).numpy()


@pytest.mark.parametrize("fn", [ref.sinusoidal_encoding, sin_loops, sin_exp_log, sin_numpy])
def test_check_sinusoid_accepts(fn, accepts):
    accepts(check_sinusoidal_encoding, fn)


def sin_rule(angle_fn=None, layout="interleaved", start=0, base_used=None, d_extra=0):
    def fn(n, d, base=10000.0):
        b = base if base_used is None else base_used
        dd = d + d_extra
        p = torch.arange(start, n + start, dtype=torch.float64)[:, None]
        i = torch.arange(0, dd, 2, dtype=torch.float64)
        angles = p / b ** (i / dd) if angle_fn is None else angle_fn(p, b, dd)
        pe = torch.zeros(n, dd, dtype=torch.float64)
        if layout == "interleaved":
            pe[:, 0::2] = torch.sin(angles)
            pe[:, 1::2] = torch.cos(angles)[:, : dd // 2]
        elif layout == "swapped":
            pe[:, 0::2] = torch.cos(angles)
            pe[:, 1::2] = torch.sin(angles)[:, : dd // 2]
        else:
            half = (dd + 1) // 2
            pe = torch.cat([torch.sin(angles), torch.cos(angles)[:, : dd - half]], dim=-1)
        return pe
    return fn


def sin_cos_own_exponent(n, d, base=10000.0):
    p = torch.arange(n, dtype=torch.float64)[:, None]
    div = base ** (torch.arange(d, dtype=torch.float64) / d)
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(p / div[0::2])
    pe[:, 1::2] = torch.cos(p / div[1::2])
    return pe


def sin_even_d_only(n, d, base=10000.0):
    p = torch.arange(n, dtype=torch.float64)[:, None]
    div = base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(p / div)
    pe[:, 1::2] = torch.cos(p / div)
    return pe


def sin_all_sines(n, d, base=10000.0):
    p = torch.arange(n, dtype=torch.float64)[:, None]
    return torch.sin(p / base ** (2 * (torch.arange(d, dtype=torch.float64) // 2) / d))


def sin_odd_last_cosine(n, d, base=10000.0):
    """Right for an even d; for an odd d the last column (a sine) holds the cosine of the last pair."""
    pe = ref.sinusoidal_encoding(n, d, base, dtype=torch.float64)
    if d % 2:
        pe[:, -1] = torch.cos(torch.arange(n, dtype=torch.float64) / base ** ((d - 1) / d))
    return pe


@pytest.mark.parametrize("fn,phrases", [
    (sin_rule(layout="swapped"), ["sin and cos swapped"]),
    (sin_rule(layout="halves"), ["in halves, not interleaved"]),
    (sin_cos_own_exponent, ["(2r + 1)/d"]),
    (sin_rule(angle_fn=lambda p, b, d: p / b ** (torch.arange(0, d, 2, dtype=torch.float64) / 2 / d)),
     ["r/d instead of 2r/d"]),
    (sin_rule(angle_fn=lambda p, b, d: p * b ** (torch.arange(0, d, 2, dtype=torch.float64) / d)), ["instead of dividing"]),
    (sin_rule(start=1), ["positions start at 1"]),
    (sin_rule(base_used=10000.0), ["base ignored"]),
    (sin_rule(d_extra=1), ["wrong shape"]),
    (lambda n, d, base=10000.0: ref.sinusoidal_encoding(n, d, base).T, ["rows and columns swapped"]),
    (sin_even_d_only, ["raised RuntimeError", "odd d"]),
    (lambda n, d, base=10000.0: torch.zeros(n, d, dtype=torch.long), ["integer result"]),
    (lambda n, d, base=10000.0: ref.sinusoidal_encoding(n, d, base) * 2, ["factor of 2"]),
    (sin_rule(angle_fn=lambda p, b, d: p / b ** (torch.arange(0, d, 2) // d).double()), ["every pair has frequency 1"]),
    (sin_rule(angle_fn=lambda p, b, d: p / b ** (torch.arange(0, d, 2, dtype=torch.float64) / 512)), ["d' = 512"]),
    (sin_rule(angle_fn=lambda p, b, d: torch.deg2rad(p / b ** (torch.arange(0, d, 2, dtype=torch.float64) / d))),
     ["wrong frequencies", "π/180"]),
    (sin_odd_last_cosine, ["the last column is a cosine"]),
    (sin_all_sines, ["sines in every column"]),
])
def test_check_sinusoid_names_each_pitfall(fn, phrases, rejects):
    rejects(check_sinusoidal_encoding, fn, *phrases)


# ================================================================================== relative_position_bias
def t5_hf(n, table, bidirectional=True, max_distance=128):
    """Hugging Face's T5 bucket function (float32 logarithm), then an nn.Embedding-style lookup."""
    num_buckets = table.shape[0]
    ctx = torch.arange(n)[:, None]
    mem = torch.arange(n)[None, :]
    rel = mem - ctx
    buckets = 0
    nb = num_buckets
    if bidirectional:
        nb //= 2
        buckets += (rel > 0).to(torch.long) * nb
        rel = torch.abs(rel)
    else:
        rel = -torch.min(rel, torch.zeros_like(rel))
    max_exact = nb // 2
    is_small = rel < max_exact
    large = max_exact + (torch.log(rel.float() / max_exact) / math.log(max_distance / max_exact)
                         * (nb - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, nb - 1))
    buckets = buckets + torch.where(is_small, rel, large)
    return F.embedding(buckets, table).permute([2, 0, 1])


def t5_loops(n, table, bidirectional=True, max_distance=128):
    nb, heads = table.shape
    out = torch.zeros(heads, n, n, dtype=table.dtype)
    for i in range(n):
        for j in range(n):
            r = j - i
            half = nb // 2 if bidirectional else nb
            bucket = half if bidirectional and r > 0 else 0
            dist = abs(r) if bidirectional else max(-r, 0)
            exact = half // 2
            if dist < exact:
                bucket += dist
            else:
                bucket += min(half - 1, int(exact + math.log(dist / exact) / math.log(max_distance / exact)
                                            * (half - exact)))
            out[:, i, j] = table[bucket]
    return out


@pytest.mark.parametrize("fn", [ref.relative_position_bias, t5_hf, t5_loops])
def test_check_t5_accepts(fn, accepts):
    accepts(check_relative_position_bias, fn)


def t5_switch(sign=1, halve=True, exact_from_total=False, rounding="floor", linear=False, md_fixed=None,
              clamp=True, heads_last=False, ignore_direction=None, offset_after=True, uni_sign=-1):
    def fn(n, table, bidirectional=True, max_distance=128):
        if ignore_direction is not None:
            bidirectional = ignore_direction
        md = max_distance if md_fixed is None else md_fixed
        nb = table.shape[0]
        pos = torch.arange(n)
        rel = sign * (pos[None, :] - pos[:, None])
        half = nb // 2 if bidirectional and halve else nb
        offset = (rel > 0).long() * half * offset_after if bidirectional else torch.zeros_like(rel)
        dist = rel.abs() if bidirectional else (uni_sign * rel).clamp(min=0)
        exact = (nb // 2) if exact_from_total else half // 2
        val = exact + torch.log(dist.double().clamp(min=1) / exact) / math.log(md / exact) * (half - exact)
        if linear:
            val = dist.double()
        large = {"round": val.round(), "ceil": val.ceil(), "floor": val.floor()}[rounding].long()
        if clamp:
            large = large.clamp(max=half - 1)
        buckets = offset + torch.where(dist < exact, dist, large)
        out = table[buckets]
        return out if heads_last else out.permute(2, 0, 1)
    return fn


@pytest.mark.parametrize("fn,phrases", [
    (t5_switch(sign=-1), ["i − j instead of j − i"]),
    (t5_switch(ignore_direction=True), ["`bidirectional` ignored"]),
    (t5_switch(ignore_direction=False), ["`bidirectional` ignored"]),
    (t5_switch(offset_after=False), ["no offset for keys after the query"]),
    (t5_switch(uni_sign=1), ["distance of the keys after the query"]),
    (t5_switch(rounding="ceil"), ["rounded up"]),
    (t5_switch(exact_from_total=True), ["max_exact"]),
    (t5_switch(rounding="round"), ["rounded instead of floored"]),
    (t5_switch(linear=True), ["no logarithmic buckets"]),
    (t5_switch(md_fixed=128), ["max_distance ignored"]),
    (t5_switch(clamp=False), ["IndexError", "clamp"]),
    (t5_switch(halve=False), ["IndexError", "num_buckets // 2"]),
    (t5_switch(heads_last=True), ["heads last"]),
    (lambda n, table, bidirectional=True, max_distance=128: table[torch.zeros(n, n, dtype=torch.long)].permute(2, 0, 1),
     []),
])
def test_check_t5_names_each_pitfall(fn, phrases, rejects):
    rejects(check_relative_position_bias, fn, *phrases)


# ================================================================================== alibi_bias
def alibi_loops(n, n_heads):
    out = torch.zeros(n_heads, n, n)
    for h in range(n_heads):
        m = 2 ** (-8 * (h + 1) / n_heads)
        for i in range(n):
            for j in range(n):
                out[h, i, j] = -m * abs(i - j)
    return out


def alibi_logspace(n, n_heads):
    slopes = torch.logspace(-8 / n_heads, -8, n_heads, base=2, dtype=torch.float64)
    i = torch.arange(n)
    return -slopes[:, None, None] * (i[None, :] - i[:, None]).abs()


def alibi_ratio(n, n_heads):
    start = 2 ** (-8 / n_heads)
    slopes = torch.tensor([start * start ** h for h in range(n_heads)])
    d = torch.cdist(torch.arange(n).float()[:, None], torch.arange(n).float()[:, None], p=1)
    return -(slopes.view(-1, 1, 1) * d)


@pytest.mark.parametrize("fn", [ref.alibi_bias, alibi_loops, alibi_logspace, alibi_ratio])
def test_check_alibi_accepts(fn, accepts):
    accepts(check_alibi_bias, fn)


def alibi_slopes_rule(slopes_fn, form=lambda d: -d.abs()):
    def fn(n, n_heads):
        m = slopes_fn(n_heads)
        i = torch.arange(n, dtype=torch.float64)
        return m[:, None, None] * form(i[:, None] - i[None, :])
    return fn


H = lambda heads: torch.arange(1, heads + 1, dtype=torch.float64)  # noqa: E731


@pytest.mark.parametrize("fn,phrases", [
    (alibi_slopes_rule(lambda heads: 0.5 ** H(heads)), ["halve from head to head"]),
    (alibi_slopes_rule(lambda heads: 2.0 ** (-8 * (H(heads) - 1) / heads)), ["slopes start at 1"]),
    (alibi_slopes_rule(lambda heads: 2.0 ** (-(8 // heads) * H(heads))), ["slopes with 8 // A", "integer division"]),
    (alibi_slopes_rule(lambda heads: ref.alibi_slopes(heads).flip(0)), ["reverse order"]),
    (alibi_slopes_rule(lambda heads: H(heads) / heads), ["not geometric"]),
    (alibi_slopes_rule(lambda heads: 1 / H(heads)), ["not geometric"]),
    (alibi_slopes_rule(lambda heads: 1 / H(heads) ** 2), ["not geometric", "ratios"]),
    (alibi_slopes_rule(lambda heads: 2.0 ** (-4 * H(heads) / heads)), ["wrong slopes", "ratio"]),
    (alibi_slopes_rule(ref.alibi_slopes, form=lambda d: d.abs()), ["bias positive"]),
    (alibi_slopes_rule(ref.alibi_slopes, form=lambda d: -d), ["without the absolute value"]),
    (lambda n, n_heads: ref.alibi_bias(n, n_heads).permute(1, 2, 0), ["heads last"]),
    (alibi_slopes_rule(ref.alibi_slopes, form=lambda d: -d.clamp(min=0)), ["zero for keys after the query"]),
    (lambda n, n_heads: torch.zeros(n, n, dtype=torch.long), ["integer result"]),
    (lambda n, n_heads: ref.alibi_bias(n, n_heads)[0], ["(axis 0 dropped)", "an index [0] on axis 0"]),
])
def test_check_alibi_names_each_pitfall(fn, phrases, rejects):
    rejects(check_alibi_bias, fn, *phrases)


# ================================================================================== apply_rope
def rope_complex(x, positions=None, base=10000.0):
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rot = torch.polar(torch.ones(n, d // 2, dtype=torch.float64), positions.double()[:, None] * theta)
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)


def rope_matrices(x, positions=None, base=10000.0):
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    out = torch.empty_like(x)
    for i in range(d // 2):
        angle = positions.to(torch.float64) * base ** (-2 * i / d)
        c, s = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
        out[..., 2 * i] = c * x[..., 2 * i] - s * x[..., 2 * i + 1]
        out[..., 2 * i + 1] = s * x[..., 2 * i] + c * x[..., 2 * i + 1]
    return out


def rope_rotate_every_two(x, positions=None, base=10000.0):
    n, d = x.shape[-2:]
    positions = torch.arange(n, dtype=x.dtype) if positions is None else positions.to(x.dtype)
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=x.dtype) / d))
    ang = positions[:, None] * inv  # (n, d/2)
    cos, sin = ang.cos().repeat_interleave(2, -1), ang.sin().repeat_interleave(2, -1)
    rot = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
    return x * cos + rot * sin


@pytest.mark.parametrize("fn", [ref.apply_rope, rope_complex, rope_matrices, rope_rotate_every_two])
def test_check_rope_accepts(fn, accepts):
    accepts(check_apply_rope, fn)


def rope_in_place(x, positions=None, base=10000.0):
    """Overwrites the even members first, then computes the odd ones from the already rotated values."""
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    angles = positions[:, None].double() * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x = x.clone()
    x[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    x[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
    return x


def rope_gptj_repeat(x, positions=None, base=10000.0):
    """GPT-J's rotate_every_two with cos and sin laid out by .repeat (c0 c1 … c0 c1 …)."""
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    angles = positions[:, None].double() * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = angles.cos().repeat(1, 2).to(x.dtype), angles.sin().repeat(1, 2).to(x.dtype)
    return x * cos + torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2) * sin


def rope_rule(pairing="interleaved", sign=1, exp_scale=2, swap=False, unpaired=False, pos_mode="given",
              base_fixed=None, promote=False):
    def fn(x, positions=None, base=10000.0):
        n, d = x.shape[-2:]
        b = base if base_fixed is None else base_fixed
        pos = torch.arange(n) if positions is None or pos_mode == "ignore" else positions
        pos = pos.double() + (1 if pos_mode == "from1" else 0)
        theta = b ** (-exp_scale * torch.arange(d // 2, dtype=torch.float64) / d)
        ang = sign * pos[:, None] * theta
        cos, sin = torch.cos(ang), torch.sin(ang)
        if swap:
            cos, sin = sin, cos
        if not promote:
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        if pairing == "halves":
            a, c = x[..., : d // 2], x[..., d // 2:]
            return torch.cat([a * cos - c * sin, a * sin + c * cos], -1)
        a, c = x[..., 0::2], x[..., 1::2]
        first, second = a * cos - c * sin, a * sin + c * cos
        if unpaired:
            return torch.cat([first, second], -1)
        return torch.stack([first, second], -1).flatten(-2)
    return fn


@pytest.mark.parametrize("fn,phrases", [
    (rope_rule(pairing="halves"), ["(r, r + d/2) instead of (2r, 2r + 1)"]),
    (ref.apply_rope_halves, ["(r, r + d/2) instead of (2r, 2r + 1)"]),
    (rope_rule(sign=-1), ["−θ instead of +θ"]),
    (rope_rule(exp_scale=1), ["base^(−r/d)"]),
    (rope_rule(swap=True), ["cos and sin swapped"]),
    (rope_rule(unpaired=True), ["written back as halves"]),
    (rope_rule(pos_mode="ignore"), ["positions ignored"]),
    (rope_rule(pos_mode="from1"), ["positions off by one"]),
    (rope_rule(base_fixed=10000.0), ["base ignored"]),
    (rope_rule(promote=True), ["dtype changed"]),
    (lambda x, positions=None, base=10000.0: x, ["x returned unrotated"]),
    (rope_in_place, ["already rotated x_2r"]),
    (rope_gptj_repeat, [".repeat, not .repeat_interleave"]),
    (lambda x, positions=None, base=10000.0: ref.apply_rope(x, positions, 1000.0), ["base ignored", "fixed base"]),
    (lambda x, positions=None, base=10000.0: ref.apply_rope(
        x, torch.arange(x.shape[-2]) + (0 if positions is None else positions), base), ["positions mishandled"]),
    (lambda x, positions=None, base=10000.0: ref.apply_rope(x, positions, base) if x.shape[-1] < 8 else torch.cat(
        [ref.apply_rope(x[..., :4], positions, base ** (4 / x.shape[-1])), x[..., 4:]], -1),
     ["wrong rotation frequencies", "0, 0"]),
    (lambda x: ref.apply_rope(x), ["raised TypeError", "apply_rope(x, positions=None, base=10000.0)"]),
    (lambda x, positions=None, base=10000.0: ref.apply_rope(x, positions, base)[..., :-1], ["wrong shape"]),
])
def test_check_rope_names_each_pitfall(fn, phrases, rejects):
    rejects(check_apply_rope, fn, *phrases)



def rope_through(dtype):
    """RoPE computed in ``dtype`` (float16 or bfloat16) and converted back to x's dtype."""
    def rope(x, positions=None, base=10000.0):
        return ref.apply_rope(x.to(dtype), positions, base).to(x.dtype)
    return rope


def rope_result_rounded_to_half(x, positions=None, base=10000.0):
    return ref.apply_rope(x, positions, base).half().to(x.dtype)


def rope_cos_sin_in_half(x, positions=None, base=10000.0):
    """Right but for cos and sin, stored in float16 "to save memory"."""
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    angles = positions[:, None] * base ** (-torch.arange(0, d, 2) / d)
    cos, sin = torch.cos(angles).half().to(x.dtype), torch.sin(angles).half().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def rope_angles_in_half(x, positions=None, base=10000.0):
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    angles = (positions[:, None] * base ** (-torch.arange(0, d, 2) / d)).half()
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


@pytest.mark.parametrize("fn,phrases", [
    (rope_through(torch.float16), ["float16 precision", "every value is a float16 number", "went through float16"]),
    (rope_through(torch.bfloat16), ["bfloat16 precision", "went through bfloat16"]),
    (rope_result_rounded_to_half, ["float16 precision"]),
    (rope_cos_sin_in_half, ["cos and sin in float16", "rounded to float16 numbers", "leave out .half()"]),
    (rope_angles_in_half, ["cos and sin in float16"]),
])
def test_check_rope_names_half_precision(fn, phrases, rejects):
    result = rejects(check_apply_rope, fn, *phrases)
    assert "not a rotation of each pair" not in result.text()  # what it said before: the lengths are 1 ± 1e-3


def rope_unflattened_pairs(x, positions=None, base=10000.0):
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    angles = positions[:, None].double() * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    a, b = x.unflatten(-1, (d // 2, 2)).unbind(-1)
    return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2)


def rope_copy_then_assign(x, positions=None, base=10000.0):
    """In-place writes, into a copy: x itself is untouched."""
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    theta = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(positions.double(), theta)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    out = x.clone()
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
    return out


def rope_rotation_matrix(x, positions=None, base=10000.0):
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    angles = positions[:, None].double() * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (n, d/2)
    c, s = angles.cos(), angles.sin()
    rot = torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2).to(x.dtype)  # (n, d/2, 2, 2)
    pairs = x.reshape(*x.shape[:-1], d // 2, 2, 1)
    return (rot @ pairs).reshape(x.shape)


def rope_float32_angles(x, positions=None, base=10000.0):
    n, d = x.shape[-2:]
    positions = torch.arange(n, dtype=torch.float32) if positions is None else positions.float()
    angles = positions[:, None] / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    return torch.stack([x[..., ::2] * cos - x[..., 1::2] * sin, x[..., ::2] * sin + x[..., 1::2] * cos], -1).flatten(-2)


def rope_complex_float64(x, positions=None, base=10000.0):
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    freqs = torch.exp(1j * positions[:, None].double() * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d))
    z = torch.complex(x[..., 0::2].double(), x[..., 1::2].double()) * freqs
    return torch.stack([z.real, z.imag], -1).flatten(-2).to(x.dtype)


@pytest.mark.parametrize("fn", [rope_unflattened_pairs, rope_copy_then_assign, rope_rotation_matrix,
                                rope_float32_angles, rope_complex_float64])
def test_check_rope_accepts_more_styles(fn, accepts):
    accepts(check_apply_rope, fn)


# ================================================================================== additive_attention
def additive_loops(q, k, v, W_q, W_k, w, mask=None):
    scores = torch.empty(*q.shape[:-1], k.shape[-2], dtype=q.dtype)
    for i in range(q.shape[-2]):
        for j in range(k.shape[-2]):
            scores[..., i, j] = torch.tanh(q[..., i, :] @ W_q.T + k[..., j, :] @ W_k.T) @ w
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    weights = torch.softmax(scores, -1)
    return weights @ v, weights


def additive_linear(q, k, v, W_q, W_k, w, mask=None):
    hidden = torch.tanh(F.linear(q, W_q).unsqueeze(-2) + F.linear(k, W_k).unsqueeze(-3))
    scores = torch.einsum("...qkh,h->...qk", hidden, w)
    if mask is not None:
        scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    return [weights @ v, weights]


@pytest.mark.parametrize("fn", [ref.additive_attention, additive_loops, additive_linear])
def test_check_additive_accepts(fn, accepts):
    accepts(check_additive_attention, fn)


def additive_rule(project=lambda x, W: x @ W.T, combine=lambda a, b: torch.tanh(a + b), use_w=True, scale=1.0,
                  dim=-1, mask_mode="before", out_mode="weights", transpose_w=False, naive=False):
    def fn(q, k, v, W_q, W_k, w, mask=None):
        hq, hk = project(q, W_q), project(k, W_k)
        hidden = combine(hq[..., :, None, :], hk[..., None, :, :])
        scores = (hidden @ w if use_w else hidden.sum(-1)) * scale
        if mask is not None and mask_mode == "before":
            scores = scores.masked_fill(~mask, float("-inf"))
        if mask is not None and mask_mode == "inverted":
            scores = scores.masked_fill(mask, float("-inf"))
        if naive:
            e = torch.exp(scores)
            weights = e / e.sum(-1, keepdim=True)
        else:
            weights = torch.softmax(scores, dim=dim)
        if mask is not None and mask_mode == "after":
            weights = weights * mask
        out = weights @ v if out_mode == "weights" else scores @ v
        return out, (weights.transpose(-2, -1) if transpose_w else weights)
    return fn


def additive_unsqueeze_2d(q, k, v, W_q, W_k, w, mask=None):
    """Pairs queries and keys with unsqueeze(1) / unsqueeze(0): right for 2-D input, not with batch axes."""
    hidden = torch.tanh((q @ W_q.T).unsqueeze(1) + (k @ W_k.T).unsqueeze(0))
    scores = hidden @ w
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, -1)
    return weights @ v, weights


def additive_w_first(q, k, v, W_q, W_k, w, mask=None):
    scores = torch.tanh(((q @ W_q.T)[..., :, None, :] + (k @ W_k.T)[..., None, :, :]) @ w)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, -1)
    return weights @ v, weights


def additive_exp_only(q, k, v, W_q, W_k, w, mask=None):
    scores = ref.additive_scores(q, k, W_q, W_k, w)
    weights = scores.exp() if mask is None else scores.exp() * mask
    return weights @ v, weights


def additive_pairwise(q, k, v, W_q, W_k, w, mask=None):
    scores = torch.tanh(q @ W_q.T + k @ W_k.T) @ w  # query i with key i only
    weights = torch.softmax(scores, -1)
    return weights @ v, weights


@pytest.mark.parametrize("fn,phrases", [
    (additive_rule(project=lambda x, W: x @ W), ["you computed q @ W_q", "W_q q_i is q @ W_q.T"]),
    (additive_rule(combine=lambda a, b: a + b), ["tanh missing"]),
    (additive_rule(combine=lambda a, b: torch.tanh(a) + torch.tanh(b)), ["tanh applied to each projection"]),
    (additive_rule(use_w=False), ["w ignored"]),
    (additive_rule(dim=-2), ["softmax over the queries"]),
    (additive_rule(mask_mode="inverted"), ["mask polarity inverted"]),
    (additive_rule(mask_mode="after"), ["mask applied after the softmax"]),
    (additive_rule(mask_mode="ignore"), ["mask ignored"]),
    (additive_rule(transpose_w=True), ["weights transposed"]),
    (additive_rule(out_mode="scores"), ["output from the scores"]),
    (additive_rule(naive=True), ["no maximum subtracted"]),
    (additive_pairwise, ["raised RuntimeError", "position by position"]),
    (additive_rule(combine=lambda a, b: torch.sigmoid(a + b)), ["sigmoid instead of tanh"]),
    (additive_unsqueeze_2d, ["raised RuntimeError", "you paired queries and keys with unsqueeze(1)"]),
    (lambda q, k, v, W_q, W_k, w, mask=None: ref.additive_attention(q, k, v, W_q, W_k, w, mask)[::-1],
     ["returned (weights, output)"]),
    (additive_w_first, ["w applied before the tanh"]),
    (additive_exp_only, ["rows do not sum to 1"]),
    (lambda q, k, v, W_q, W_k, w, mask=None: tuple(t.float() for t in ref.additive_attention(q, k, v, W_q, W_k, w, mask)),
     ["computed in float32"]),
    (lambda q, k, v, W_q, W_k, w, mask=None: ref.additive_attention(q, k, v, W_q, W_k, w, mask)[1],
     ["one tensor, not (output, weights)"]),
    (lambda q, k, v, W_q, W_k, w: ref.additive_attention(q, k, v, W_q, W_k, w), ["raised TypeError", "mask"]),
])
def test_check_additive_names_each_pitfall(fn, phrases, rejects):
    rejects(check_additive_attention, fn, *phrases)


def test_check_additive_scaled(rejects):
    rejects(check_additive_attention, additive_rule(scale=1 / math.sqrt(7)), "scaled by √d_h")


# ================================================================================== ports of common code
def test_ported_right_answers_are_accepted(accepts):
    def assert_close_style(attn):
        g = torch.Generator().manual_seed(6)
        x = torch.randn(7, 5, generator=g)
        perm = torch.randperm(7, generator=g)
        torch.testing.assert_close(attn(x[perm]), attn(x)[perm])

    def numpy_test(attn):
        rng = np.random.default_rng(0)
        x, perm = rng.standard_normal((6, 8)), rng.permutation(6)
        return np.allclose(attn(x[perm]), attn(x)[perm])

    def roll_test(attn):
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(7))
        perm = torch.roll(torch.arange(6), 1)
        return torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5)

    for fn in (assert_close_style, numpy_test, roll_test):
        accepts(check_is_permutation_equivariant, fn)

    def slopes_fairseq(n):  # the ALiBi authors' get_slopes
        def power_of_2(n):
            start = 2 ** (-2 ** -(math.log2(n) - 3))
            return [start * start ** i for i in range(n)]
        if math.log2(n).is_integer():
            return power_of_2(n)
        c = 2 ** math.floor(math.log2(n))
        return power_of_2(c) + slopes_fairseq(2 * c)[0::2][: n - c]

    def alibi_fairseq(n, n_heads):
        i = torch.arange(n)
        return -torch.tensor(slopes_fairseq(n_heads))[:, None, None] * (i[None, :] - i[:, None]).abs()

    accepts(check_alibi_bias, alibi_fairseq)

    def rope_meta_llama(x, positions=None, base=10000.0):  # float32 internals, as Meta's code
        n, d = x.shape[-2:]
        positions = torch.arange(n) if positions is None else positions
        freqs = 1.0 / (base ** (torch.arange(0, d, 2)[: d // 2].float() / d))
        angles = torch.outer(positions.float(), freqs)
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * torch.polar(torch.ones_like(angles), angles)).flatten(-2).type_as(x)

    accepts(check_apply_rope, rope_meta_llama)

    def additive_d2l(q, k, v, W_q, W_k, w, mask=None):
        features = torch.tanh((q @ W_q.T).unsqueeze(-2) + (k @ W_k.T).unsqueeze(-3))
        scores = (features * w).sum(-1)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e6)
        weights = F.softmax(scores, dim=-1)
        return torch.matmul(weights, v), weights

    accepts(check_additive_attention, additive_d2l)


def test_hugging_face_rotate_half_is_named(rejects):
    def rope_hf(x, positions=None, base=10000.0):
        n, d = x.shape[-2:]
        positions = torch.arange(n) if positions is None else positions
        inv = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))
        f = positions.float()[:, None] * inv
        emb = torch.cat((f, f), -1)
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * emb.cos().to(x.dtype) + torch.cat((-x2, x1), -1) * emb.sin().to(x.dtype)

    rejects(check_apply_rope, rope_hf, "(r, r + d/2) instead of (2r, 2r + 1)", "rotate_half")


# ================================================================================== exercise 1 never fails by chance
def perm_test_with(perm, x_seed=0):
    """The exercise's answer with one fixed permutation of 6 tokens (x drawn from ``x_seed``)."""

    def test(attn):
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(x_seed))
        return torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5)

    return test


def _every_permutation_of_6():
    import itertools
    return [torch.tensor(p) for p in itertools.permutations(range(6))]


def test_every_permutation_of_6_decides_the_same_way():
    """What the exercise's answer returns for each of the check's functions, for all 720 permutations of its
    6 tokens (all at once, as a batch) and three draws of x: torch.allclose(attn(x[perm]), attn(x)[perm],
    atol=1e-5) holds for every equivariant function, and fails with a wide margin (a gap above 1e-3, a hundred
    times the tolerance) for every position-aware attention — except under the identity, and, for the
    symmetric distance bias, under the reversal: exactly the two permutations the docstring excludes. Those
    answers are all the check judges (with the right ones it passes, below), so no draw can change its verdict."""
    perms = torch.stack(_every_permutation_of_6())  # (720, 6)
    identity = (perms == torch.arange(6)).all(-1)  # (720,)
    reversal = (perms == torch.arange(5, -1, -1)).all(-1)
    for x_seed in (0, 1, 2):
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(x_seed))  # (n, d), float32 as in the exercise
        for name in ref.EQUIVARIANT + ref.POSITION_AWARE:
            attn = ref.attention_variant(name)
            a, b = attn(x[perms]), attn(x)[perms]  # (720, 6, 8) each
            agrees = ((a - b).abs() <= 1e-5 + 1e-5 * b.abs()).flatten(1).all(-1)  # torch.allclose, per permutation
            gap = (a - b).abs().amax(dim=(-2, -1))  # (720,)
            if name in ref.EQUIVARIANT:
                assert bool(agrees.all()), name
                continue
            blind = identity | (reversal if name == "symmetric distance bias" else torch.zeros_like(reversal))
            assert torch.equal(agrees, blind), (name, perms[agrees != blind][:3].tolist())
            assert bool((gap[~blind] > 1e-3).all()), (name, float(gap[~blind].min()))


def test_check_verdict_on_sampled_permutations(accepts):
    """The check itself on the exercise's answer, for a sample of the 718 allowed permutations (the enumeration
    above covers them all)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        perm = torch.randperm(6, generator=g)
        if not (torch.equal(perm, torch.arange(6)) or torch.equal(perm, torch.arange(5, -1, -1))):
            accepts(check_is_permutation_equivariant, perm_test_with(perm))


def unseeded_solution(attn):
    """The exercise's answer without a seed of its own: its draws come from torch's global generator."""
    x = torch.randn(6, 8)
    perm = torch.randperm(6)
    while torch.equal(perm, torch.arange(6)) or torch.equal(perm, torch.arange(5, -1, -1)):
        perm = torch.randperm(6)
    return torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5)


def unseeded_randperm(attn):
    """Without excluding anything: the check's seeds decide the draw, the same draw on every run."""
    x = torch.randn(6, 8)
    perm = torch.randperm(6)
    return torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5)


def test_check_controls_the_learners_randomness(accepts):
    """Unseeded draws see the check's seeds: the same verdict whatever the global generator held before, and
    the global generator is left as it was."""
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        before = torch.get_rng_state()
        accepts(check_is_permutation_equivariant, unseeded_solution)
        verdicts = {check_is_permutation_equivariant.evaluate(unseeded_randperm).status for _ in range(2)}
        assert len(verdicts) == 1
        assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("perm", [torch.tensor([1, 0, 2, 3, 4, 5]), torch.tensor([5, 4, 3, 2, 0, 1]),
                                  torch.tensor([0, 1, 2, 3, 5, 4])])
def test_check_accepts_permutations_that_move_little(perm, accepts):
    accepts(check_is_permutation_equivariant, perm_test_with(perm))


def test_check_rejects_the_identity_and_the_reversal(rejects):
    rejects(check_is_permutation_equivariant, perm_test_with(torch.arange(6)), "never runs attn on a reordering")
    rejects(check_is_permutation_equivariant, perm_test_with(torch.arange(5, -1, -1)), "reversal",
            "drawn again")


# ================================================================================== rope_decode_step
def decode_ref(q_new, k_new, k_cache):
    return ref.rope_decode_step(q_new, k_new, k_cache)


def decode_complex(q_new, k_new, k_cache):
    """An alternative: rotation as complex multiplication, positions from the cache length."""
    n_cache, n_new, d = k_cache.shape[-2], q_new.shape[-2], q_new.shape[-1]
    t = torch.arange(n_cache, n_cache + n_new, dtype=torch.float64)
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    turn = torch.polar(torch.ones(n_new, d // 2, dtype=torch.float64), t[:, None] * theta)

    def rot(x):
        z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
        return torch.view_as_real(z * turn).flatten(-2).to(x.dtype)

    return rot(q_new), torch.cat([k_cache, rot(k_new)], dim=-2)


def decode_list(q_new, k_new, k_cache):
    n = k_cache.shape[-2]
    positions = torch.tensor(list(range(n, n + q_new.shape[-2])))
    return [ref.apply_rope(q_new, positions), torch.cat((k_cache, ref.apply_rope(k_new, positions)), -2)]


@pytest.mark.parametrize("fn", [decode_ref, decode_complex, decode_list])
def test_check_decode_accepts(fn, accepts):
    accepts(check_rope_decode_step, fn)


def decode_rule(start=lambda n_cache: n_cache, rotate_q=True, rotate_k=True, rerotate=False, prepend=False):
    def fn(q_new, k_new, k_cache):
        n_cache, n_new = k_cache.shape[-2], q_new.shape[-2]
        positions = torch.arange(start(n_cache), start(n_cache) + n_new)
        q = ref.apply_rope(q_new, positions) if rotate_q else q_new
        k = ref.apply_rope(k_new, positions) if rotate_k else k_new
        cache = ref.apply_rope(k_cache, torch.arange(n_cache)) if rerotate else k_cache
        return q, (torch.cat([k, cache], -2) if prepend else torch.cat([cache, k], -2))
    return fn


def decode_rotate_all(q_new, k_new, k_cache):
    n_cache, n_new = k_cache.shape[-2], q_new.shape[-2]
    keys = torch.cat([k_cache, k_new], -2)
    return ref.apply_rope(q_new, torch.arange(n_cache, n_cache + n_new)), ref.apply_rope(keys)


@pytest.mark.parametrize("fn,phrases", [
    (decode_rule(start=lambda n_cache: 0), ["positions restart at 0", "absolute one"]),
    (decode_rule(start=lambda n_cache: n_cache + 1), ["off by one (one too far)"]),
    (decode_rule(start=lambda n_cache: n_cache - 1), ["off by one (one too early)"]),
    (decode_rule(rotate_k=False), ["new keys stored unrotated"]),
    (decode_rule(rotate_q=False), ["queries not rotated"]),
    (decode_rule(rerotate=True), ["cached keys rotated again"]),
    (decode_rotate_all, ["rotated again"]),
    (decode_rule(prepend=True), ["new keys put before the cache"]),
    (lambda q_new, k_new, k_cache: ref.apply_rope(q_new), ["returned one tensor, not (q_rotated, k_cache)"]),
    (lambda q_new, k_new, k_cache: (ref.apply_rope(q_new), k_cache), ["wrong shape"]),
])
def test_check_decode_names_each_pitfall(fn, phrases, rejects):
    rejects(check_rope_decode_step, fn, *phrases)


def test_check_decode_not_attempted(rejects, unfinished):
    rejects(check_rope_decode_step, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)


# ================================================================================== causes measured when no known mistake fits
def t5_from(rel_of):
    """The right buckets of another relative position than j − i (``rel_of(i, j)``)."""
    def fn(n, table, bidirectional=True, max_distance=128):
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        buckets = ref.relative_position_bucket(rel_of(i, j), bidirectional, table.shape[0], max_distance)
        return table[buckets].permute(2, 0, 1)
    return fn


def t5_exact_plus_one(n, table, bidirectional=True, max_distance=128):
    buckets = ref.relative_position_bucket(torch.arange(n)[None, :] - torch.arange(n)[:, None], bidirectional,
                                           table.shape[0], max_distance)
    half = table.shape[0] // 2 if bidirectional else table.shape[0]
    small = (buckets % half if bidirectional else buckets) < half // 2
    return table[torch.where(small & (buckets % half > 0), buckets + 1, buckets).clamp(max=table.shape[0] - 1)
                 ].permute(2, 0, 1)


@pytest.mark.parametrize("fn,phrases", [
    (t5_from(lambda i, j: j + i), ["buckets that depend on i and j, not on j − i"]),
    (t5_exact_plus_one, ["wrong buckets", "j − i = "]),
    (lambda n, table, bidirectional=True, max_distance=128: ref.relative_position_bias(
        n, table, bidirectional, max_distance) * 1.5, ["entries that are not table values"]),
    (lambda n, table, bidirectional=True, max_distance=128: ref.relative_position_bias(
        n, table, bidirectional, max_distance)[:, :1], ["only query 0 computed", "axis 1"]),
])
def test_check_t5_measures_the_buckets(fn, phrases, rejects):
    rejects(check_relative_position_bias, fn, *phrases)


def test_check_alibi_names_the_one_column_kept(rejects):
    def one_key(n, n_heads):
        slopes = 2 ** (-8 * (torch.arange(n_heads) + 1) / n_heads)
        t = torch.arange(n)
        return -slopes[:, None, None] * t[:, None].abs()  # (A, n, 1): the distance to key 0 only
    rejects(check_alibi_bias, one_key, "only key 0 computed", "axis 2 (5 keys)")


def test_check_rope_names_the_coefficients(rejects):
    rejects(check_apply_rope, _rope_plus_sin, "not the rotation's coefficients", "takes x_2r+1 × sin(t·θ_r)")


def _rope_plus_sin(x, positions=None, base=10000.0):
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    angles = positions[:, None].double() * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos + odd * sin, even * sin + odd * cos], -1).flatten(-2)  # + where − belongs


def test_check_sinusoid_names_the_wrong_columns(rejects):
    def one_bad_column(n, d, base=10000.0):
        pe = ref.sinusoidal_encoding(n, d, base, dtype=torch.float64)
        pe[:, 1] = torch.cos(2 * torch.arange(n, dtype=torch.float64))
        return pe
    rejects(check_sinusoidal_encoding, one_bad_column, "wrong values in 1 of 8 columns", "the cosine column 1")


@pytest.mark.parametrize("fn,phrases", [
    (lambda attn: attn(torch.randn(6, 8)) == attn(torch.randn(6, 8)), ["a tensor of shape (6, 8)"]),
    (lambda attn: attn(torch.randn(6, 8))[torch.arange(5, 0)], ["step leads away from end"]),
    (lambda attn: torch.allclose(attn(torch.randn(6, 8)), attn(torch.randn(6, 8)), atol=-1.0), ["negative tolerance"]),
])
def test_check_equivariance_test_explains_more(fn, phrases, rejects):
    rejects(check_is_permutation_equivariant, fn, *phrases)


@pytest.mark.parametrize("check,fn,phrases", [
    (check_sinusoidal_encoding, lambda n, d, base=10000.0: ref.sinusoidal_encoding(n, d, base)[:, :2],
     ["2 columns for d = 8 and 2 for d = 12"]),
    (check_sinusoidal_encoding, lambda n, d, base=10000.0: ref.sinusoidal_encoding(2, d, base),
     ["2 rows for n = 6 and 2 for n = 9"]),
    (check_additive_attention, lambda q, k, v, W_q, W_k, w, mask=None: ref.additive_attention(
        q, k, v, W_q, W_k, w, mask)[1:] * 2, ["the output is the right weights"]),
    (check_rope_decode_step, lambda q_new, k_new, k_cache: (ref.rope_decode_step(q_new, k_new, k_cache)[0], [
        k_cache, ref.apply_rope(k_new, torch.arange(k_cache.shape[-2], k_cache.shape[-2] + k_new.shape[-2]))]),
     ["k_cache returned as a list of 2 tensors"]),
])
def test_wrong_shapes_are_measured(check, fn, phrases, rejects):
    rejects(check, fn, *phrases)


# ================================================================================== branches the tests above leave out
def perm_test_batch_axis(attn):  # a batch of sequences, permuted with x[perm] as in the 2-D version
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 8, generator=g)
    perm = torch.randperm(x.shape[0], generator=g)
    return torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5)


def perm_test_invariance_of_ones(attn):  # x of ones, and invariance (attn(x[perm]) == attn(x)) for equivariance
    x = torch.ones(6, 8)
    perm = torch.randperm(6)
    return torch.allclose(attn(x[perm]), attn(x), atol=1e-5)


def perm_test_large_and_loose(attn):  # inputs too large for the check to keep, and a tolerance far too loose
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 128, generator=g)
    perm = torch.randperm(64, generator=g)
    return torch.allclose(attn(x[perm]), attn(x)[perm], atol=10.0)


@pytest.mark.parametrize("fn,phrases", [
    (perm_test_batch_axis, ["calls everything equivariant", "reorders the batch axis (axis 0 of x, shape (4, 6, 8))"]),
    (perm_test_invariance_of_ones, ["calls everything equivariant", "every row of your x is the same vector"]),
    (perm_test_large_and_loose, ["calls everything equivariant", "a tolerance far too loose", "over 4096 numbers"]),
    (perm_test(n=2, d=1), ["misses symmetric distance bias, RoPE", "only 2 tokens",
                           "single feature (d = 1)", "and features (d ≥ 2)"]),
    (perm_test(n=6, d=1), ["misses RoPE", "a single feature (d = 1): RoPE rotates pairs of features"]),
], ids=["batch axis", "ones, invariance", "large and loose", "n = 2, d = 1", "n = 6, d = 1"])
def test_check_equivariance_test_names_what_its_inputs_hide(fn, phrases, rejects):
    result = rejects(check_is_permutation_equivariant, fn, *phrases)
    assert "never permutes the input" not in result.text()  # the check cannot tell that from inputs it did not keep


def test_relative_bias_tables_have_distinct_rows():
    """_t5_measured reads each entry's bucket back from the table: the cases' tables have no two rows alike."""
    from attn_course.checks.position.relative_bias import _T5_CASES

    g = torch.Generator().manual_seed(7)  # as check_relative_position_bias draws them
    for n, nb, heads, bi, md, *dtype in _T5_CASES:
        table = torch.randn(nb, heads, generator=g, dtype=torch.float64).to(*dtype or [torch.float64]).double()
        alike = torch.isclose(table[:, None], table[None], atol=1e-6, rtol=1e-5).all(-1)
        assert int(alike.sum()) == nb, (n, nb, heads)


@pytest.mark.parametrize("fn,phrase", [(decode_rule(rotate_q=False), "queries not rotated"),
                                       (decode_rule(rotate_k=False), "new keys stored unrotated")])
def test_check_decode_tells_an_unrotated_part_from_every_token_at_n_cache(fn, phrase, rejects):
    # on an empty cache both give the same numbers: a case with cached keys tells them apart
    result = rejects(check_rope_decode_step, fn, phrase)
    assert "give the same numbers" not in result.text() and "n_cache, n_cache + 1" not in result.text()


# ================================================================================== inputs changed in place
def t5_heads_first_in_place(n, table, bidirectional=True, max_distance=128):
    rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    buckets = ref.relative_position_bucket(rel, bidirectional, table.shape[0], max_distance)
    table.t_()  # heads first, transposed in place: the caller's table becomes (A, num_buckets)
    return table[:, buckets]


def rope_writes_into_x(x, positions=None, base=10000.0):
    """Right values, rotated into x itself: each pair from copies of the originals, written back in place."""
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    angles = positions[:, None] * base ** (-torch.arange(0, d, 2) / d)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    even, odd = x[..., 0::2].clone(), x[..., 1::2].clone()
    x[..., 0::2] = even * cos - odd * sin
    x[..., 1::2] = even * sin + odd * cos
    return x


def rope_positions_as_column(x, positions=None, base=10000.0):
    n, d = x.shape[-2:]
    positions = torch.arange(n) if positions is None else positions
    positions.unsqueeze_(-1)  # (n, 1), in place: the caller's positions change shape
    return ref.apply_rope(x, positions[:, 0], base)


def decode_rotates_in_place(q_new, k_new, k_cache):
    n_cache = k_cache.shape[-2]
    positions = torch.arange(n_cache, n_cache + q_new.shape[-2])
    q_new[:] = ref.apply_rope(q_new, positions)  # rotated where they lie: the caller's q_new and k_new change
    k_new[:] = ref.apply_rope(k_new, positions)
    return q_new, torch.cat([k_cache, k_new], dim=-2)


def additive_inverts_mask_in_place(q, k, v, W_q, W_k, w, mask=None):
    scores = torch.tanh((q @ W_q.T)[..., :, None, :] + (k @ W_k.T)[..., None, :, :]) @ w
    if mask is not None:
        scores.masked_fill_(mask.logical_not_(), float("-inf"))  # logical_not_ flips the caller's mask
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def additive_w_as_column(q, k, v, W_q, W_k, w, mask=None):
    w.unsqueeze_(-1)  # (d_h, 1), in place: the caller's w changes shape
    scores = (torch.tanh((q @ W_q.T)[..., :, None, :] + (k @ W_k.T)[..., None, :, :]) @ w).squeeze(-1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


@pytest.mark.parametrize("check,fn,phrases", [
    (check_relative_position_bias, t5_heads_first_in_place, ["table changed in place"]),
    (check_apply_rope, rope_writes_into_x, ["x changed in place"]),
    (check_apply_rope, rope_positions_as_column, ["positions changed in place"]),
    (check_rope_decode_step, decode_rotates_in_place, ["q_new changed in place"]),
    (check_additive_attention, additive_inverts_mask_in_place, ["mask changed in place"]),
    (check_additive_attention, additive_w_as_column, ["w changed in place"]),
])
def test_checks_reject_an_input_changed_in_place(check, fn, phrases, rejects):
    """The docstrings say the inputs are left unchanged: right values that overwrite an input are rejected."""
    rejects(check, fn, "changed in place", *phrases)


# ============================================================================ audit: additive_attention
def additive_in_float64(q, k, v, W_q, W_k, w, mask=None):  # computed in float64, never converted back
    q, k, v, W_q, W_k, w = (t.double() for t in (q, k, v, W_q, W_k, w))
    return ref.additive_attention(q, k, v, W_q, W_k, w, mask)


def additive_dot_product(q, k, v, W_q, W_k, w, mask=None):  # the projections multiplied, not added
    scores = (q @ W_q.T) @ (k @ W_k.T).transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def additive_float64_then_back(q, k, v, W_q, W_k, w, mask=None):  # float64 inside, q's dtype out: right
    out, weights = additive_in_float64(q, k, v, W_q, W_k, w, mask)
    return out.to(q.dtype), weights.to(q.dtype)


def test_check_additive_wants_q_dtype(rejects, accepts):
    rejects(check_additive_attention, additive_in_float64, "in float64, not q's float32", ".to(q.dtype)")
    accepts(check_additive_attention, additive_float64_then_back)


def test_check_additive_names_dot_product_scores(rejects):
    rejects(check_additive_attention, additive_dot_product, "dot-product scores, not additive ones")


# Red team: cos, sin or the result cut to a fixed grid (round(v * 256) / 256) or with bits cut off lie on a half
# grid without a trip through it: neither "cos and sin in …" nor "… precision" is said.
def _rope_coefficients(cut, result=False):
    def rope(x, positions=None, base=10000.0):
        n, d = x.shape[-2:]
        positions = torch.arange(n) if positions is None else positions
        angles = positions[:, None] * base ** (-torch.arange(0, d, 2) / d)
        cos, sin = (t.to(x.dtype) if result else cut(t).to(x.dtype) for t in (torch.cos(angles), torch.sin(angles)))
        even, odd = x[..., 0::2], x[..., 1::2]
        out = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
        return cut(out).to(x.dtype) if result else out
    return rope


def _bits_cut(t):
    return (t.float().view(torch.int32) & ~8191).view(torch.float32).double()


@pytest.mark.parametrize("fn", [_rope_coefficients(lambda t: torch.round(t * 256) / 256),
                                _rope_coefficients(lambda t: torch.round(t * 1024) / 1024),
                                _rope_coefficients(_bits_cut),
                                _rope_coefficients(lambda t: torch.round(t * 256) / 256, result=True),
                                _rope_coefficients(_bits_cut, result=True)])
def test_check_rope_does_not_call_a_fixed_grid_half_precision(fn, rejects):
    text = rejects(check_apply_rope, fn).text()
    assert "float16" not in text and "bfloat16" not in text, text


def _rope_pairs_changed(change):
    """The right rotation, but ``change(cos, sin, x, out)`` -> (cos, sin, out) alters its coefficients or result."""
    def rope(x, positions=None, base=10000.0):
        n, d = x.shape[-2:]
        positions = torch.arange(n) if positions is None else positions
        angles = positions[:, None] * base ** (-torch.arange(0, d, 2) / d)
        cos, sin, _ = change(torch.cos(angles), torch.sin(angles), x, None)
        even, odd = x[..., 0::2], x[..., 1::2]
        out = torch.stack([even * cos.to(x.dtype) - odd * sin.to(x.dtype),
                           even * sin.to(x.dtype) + odd * cos.to(x.dtype)], -1).flatten(-2)
        return change(cos, sin, x, out)[2]
    return rope


@pytest.mark.parametrize("fn,phrases", [
    # each pair turned by the right angle, cos and sin merely rounded: lengths 1 ± 2e-3, no dimensions mixed
    (_rope_pairs_changed(lambda c, s, x, o: (torch.round(c * 256) / 256, torch.round(s * 256) / 256, o)),
     ["cos and sin not exact", "right angle t·θ_r", "does not keep each pair's length"]),
    (_rope_pairs_changed(lambda c, s, x, o: (torch.round(c, decimals=2), torch.round(s, decimals=2), o)),
     ["cos and sin not exact"]),
    (_rope_pairs_changed(lambda c, s, x, o: (c, torch.round(s * 256) / 256, o)), ["cos and sin not exact"]),
    (_rope_pairs_changed(lambda c, s, x, o: (c, s, None if o is None else 1.005 * o)),
     ["each pair rotated, then scaled", "1.005 times as long"]),
    # a real mix of pairs: pair r's result draws on pair r − 1
    (_rope_pairs_changed(lambda c, s, x, o: (c, s, None if o is None else o + 0.01 * x.roll(2, -1))),
     ["not a rotation of each pair", "mixes dimensions"]),
])
def test_check_rope_tells_inexact_cos_sin_from_mixed_pairs(fn, phrases, rejects):
    text = rejects(check_apply_rope, fn, *phrases).text()
    if "mixes" not in phrases[-1]:
        assert "mixes dimensions" not in text and "not a rotation of each pair" not in text, text


def test_check_rope_result_rounded_is_not_called_a_mix(rejects):
    text = rejects(check_apply_rope, _rope_pairs_changed(
        lambda c, s, x, o: (c, s, None if o is None else torch.round(o * 256) / 256))).text()
    assert "mixes dimensions" not in text and "cos and sin not exact" not in text, text


# ================================================================================== round 3
def _rope_with_sine(sine):
    """The right rotation, its sine computed as ``sine(angles, cos)``."""
    def rope(x, positions=None, base=10000.0):
        n, d = x.shape[-2:]
        positions = torch.arange(n) if positions is None else positions
        angles = positions[:, None] * base ** (-torch.arange(0, d, 2) / d)
        cos = torch.cos(angles)
        cos, sin = cos.to(x.dtype), sine(angles, cos).to(x.dtype)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
    return rope


@pytest.mark.parametrize("sine", [lambda a, c: torch.sqrt(1 - c ** 2), lambda a, c: torch.sqrt((1 - c ** 2).clamp(min=0)),
                                  lambda a, c: torch.sin(a).abs()])
def test_check_rope_names_a_sine_that_lost_its_sign(sine, rejects):
    rejects(check_apply_rope, _rope_with_sine(sine), "sin's sign lost", "|sin t·θ_r|")


def test_check_rope_positions_rounded_to_float16_are_rejected(rejects):
    def rope(x, positions=None, base=10000.0):  # exact up to position 2048 only
        positions = torch.arange(x.shape[-2]) if positions is None else positions
        return ref.apply_rope(x, positions.half().float(), base)
    rejects(check_apply_rope, rope, "2501")


def test_check_decode_step_wants_the_cached_keys_exactly(rejects):
    def step(q_new, k_new, k_cache):
        n_cache = k_cache.shape[-2]
        positions = torch.arange(n_cache, n_cache + q_new.shape[-2])
        keys = torch.cat([k_cache.float(), ref.apply_rope(k_new, positions).float()], dim=-2)
        return ref.apply_rope(q_new, positions), keys.to(k_cache.dtype)
    rejects(check_rope_decode_step, step, "cached keys not kept exactly")


def test_check_alibi_probes_a_long_sequence(rejects):
    rejects(check_alibi_bias, lambda n, n_heads: ref.alibi_bias(n, n_heads).clamp(min=-8.0), "alibi_bias(24, 16)")


def test_check_perm_test_names_a_tolerance_far_too_loose(rejects):
    rejects(check_is_permutation_equivariant, perm_test(compare=lambda a, b, perm: torch.allclose(
        a, b[..., perm, :], atol=0.1)), "misses small positional effects", "a tolerance far too loose")


def test_check_perm_test_with_large_inputs_is_not_said_to_keep_distances(rejects):
    def test(attn):
        x = 10 * torch.randn(6, 8)
        perm = torch.tensor([3, 1, 4, 0, 5, 2])
        return torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5)
    text = rejects(check_is_permutation_equivariant, test, "your inputs, up to", "hardly moves the weights").text()
    assert "torch.randperm can give the identity" not in text, text


def _perm_test_scatter(attn):
    x = torch.randn(6, 8)
    perm = torch.tensor([2, 5, 0, 4, 1, 3])
    back = torch.empty_like(x)
    back[perm] = attn(x[perm])  # attn(x[perm]) put back in x's order
    return torch.allclose(back, attn(x), atol=1e-5)


class _PermTestObject:
    def __call__(self, attn, n=6, d=8, **options):
        x = torch.randn(n, d, dtype=torch.float64)
        perm = torch.tensor([1, 0, 2, 3, 4, 5])
        with torch.no_grad():
            return torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5)


def _rope_element_by_element(x, positions=None, base=10000.0):
    n, d = x.shape[-2:]
    ts = list(range(n)) if positions is None else [int(t) for t in positions]
    out = x.clone()
    flat, new = x.reshape(-1, n, d), out.view(-1, n, d)
    for b in range(flat.shape[0]):
        for i, t in enumerate(ts):
            for r in range(d // 2):
                c, s = math.cos(t * base ** (-2 * r / d)), math.sin(t * base ** (-2 * r / d))
                e, o = float(flat[b, i, 2 * r]), float(flat[b, i, 2 * r + 1])
                new[b, i, 2 * r], new[b, i, 2 * r + 1] = e * c - o * s, e * s + o * c
    return out


@pytest.mark.parametrize("check,fn", [
    (check_is_permutation_equivariant, _perm_test_scatter),
    (check_is_permutation_equivariant, _PermTestObject()),
    (check_apply_rope, _rope_element_by_element),
    (check_apply_rope, torch.inference_mode()(lambda x, *args, **kwargs: ref.apply_rope(x, *args, **kwargs).clone())),
    (check_alibi_bias, lambda n, n_heads: torch.tensor([[[-(2 ** (-8 * (a + 1) / n_heads)) * abs(i - j) for j in range(n)]
                                                          for i in range(n)] for a in range(n_heads)]).view(n_heads, n, n)),
])
def test_position_checks_accept_slow_and_decorated_answers(check, fn, accepts):
    accepts(check, fn)


@pytest.mark.parametrize("check,fn", [
    (check_sinusoidal_encoding, lambda n, d, base=10000.0: ref.sinusoidal_encoding(n, d, base).half().float()),
    (check_alibi_bias, lambda n, n_heads: ref.alibi_bias(n, n_heads).half().float()),
])
def test_position_tables_name_a_trip_through_float16(check, fn, rejects):
    text = rejects(check, fn, "float16 precision").text()
    assert "slopes not geometric" not in text and "look at the formula" not in text, text


def perm_test_large_inputs(attn):  # right permutation (neither identity nor reversal), but x 30 times randn's size
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 8, generator=g) * 30
    perm = torch.tensor([2, 0, 1, 3, 5, 4])
    return torch.allclose(attn(x[perm]), attn(x)[perm], atol=1e-5)


def test_check_equivariance_test_names_large_inputs_not_a_distance_keeping_permutation(rejects):
    """A permutation that moves distances |i − j| is not called one that keeps them: the outputs barely differ
    because the inputs are so large that the scores swamp the bias."""
    text = rejects(check_is_permutation_equivariant, perm_test_large_inputs, "misses symmetric distance bias",
                   "your permutation moves distances |i − j|, yet the outputs differ by only",
                   "make the scores so large").text()
    assert "keeps every distance" not in text and "a reversal does" not in text, text
