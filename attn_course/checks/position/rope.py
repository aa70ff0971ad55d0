"""Rotary embeddings: apply_rope (RoFormer's interleaved pairs, measured on unit pairs when wrong) and
rope_decode_step (RoPE with a KV cache: new tokens at the cache length plus their offset)."""

from __future__ import annotations

import torch

from ... import position as ref
from .. import kit
from ..compare import Failure, as_tensor, call_or_skip, expect_shape, fail, fail_again, fmt, same
from ..core import Learner, check
from ..kit import Suspects, variants
from .judge import call, frequency_cause, judge


# ================================================================================== RoPE
def _rope(x: torch.Tensor, positions=None, base: float = 10000.0, mistake: str = "") -> torch.Tensor:
    x = x.double()
    n, d = x.shape[-2:]
    if mistake == "none":
        return x
    pos = torch.arange(n) if positions is None or mistake == "positions" else torch.as_tensor(positions)
    pos = pos.double() + (1 if mistake == "from1" else 0)
    base = 10000.0 if mistake == "base" else base
    exponent = (torch.arange(d // 2) if mistake == "half" else torch.arange(0, d, 2)).double() / d  # (d/2,)
    angles = {"divide": pos[:, None] / base ** (-exponent), "intdiv": pos[:, None].expand(-1, d // 2)}.get(
        mistake, pos[:, None] * base ** (-exponent)) * (-1 if mistake == "sign" else 1)
    cos, sin = (torch.sin(angles), torch.cos(angles)) if mistake == "swap" else (torch.cos(angles), torch.sin(angles))
    if mistake == "halves":
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    if mistake in ("repeat", "mixed"):  # GPT-J's layout c0 c1 … c0 c1 …, or rotate_half with c0 c0 c1 c1 …
        c2, s2 = (t.repeat(1, 2) if mistake == "repeat" else t.repeat_interleave(2, dim=-1) for t in (cos, sin))
        turned = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2) if mistake == "repeat" else \
            torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)
        return x * c2 + turned * s2
    a, b = x[..., 0::2], x[..., 1::2]
    first = a * cos - b * sin
    second = (first if mistake == "inplace" else a) * sin + b * cos
    return torch.cat([first, second], dim=-1) if mistake == "unpaired" else \
        torch.stack([first, second], dim=-1).flatten(-2)


_ROPE_FIX = ("pair dimensions (2r, 2r + 1) and rotate the pair at position t by +t·θ_r, θ_r = base^(−2r/d): "
             "(x_2r cos − x_2r+1 sin, x_2r sin + x_2r+1 cos)")
_ROPE_TABLE = variants(_rope, [
    ("halves", "rotated pairs (r, r + d/2) instead of (2r, 2r + 1)", "you paired each dimension with the one d/2 "
     "away (GPT-NeoX / LLaMA's rotate_half); the docstring pairs neighbours, as RoFormer does",
     "rotate x[..., 0::2] with x[..., 1::2]"),
    ("sign", "rotated by −θ instead of +θ", "your rotation goes the other way: (x_2r cos + x_2r+1 sin, "
     "−x_2r sin + x_2r+1 cos)", _ROPE_FIX),
    ("half", "frequencies base^(−r/d) instead of base^(−2r/d)", "your exponent uses the pair index r over d",
     "θ_r = base ** (-2 * r / d) for r = 0 … d/2 − 1 (torch.arange(0, d, 2) / d)"),
    ("swap", "cos and sin swapped", "you multiplied by sin where cos belongs and the other way round", _ROPE_FIX),
    ("unpaired", "rotated pairs written back as halves", "you returned all the rotated first members, then all the "
     "second ones, instead of putting each pair back in place", "torch.stack([first, second], dim=-1).flatten(-2)"),
    ("positions", "positions ignored", "you rotated by 0 … n − 1 whatever `positions` is passed",
     "use the positions argument when it is given (a KV cache passes the new tokens' positions)"),
    ("from1", "positions off by one", "you counted positions from 1", "position 0 is not rotated at all"),
    ("base", "base ignored", "your angles use 10000 whatever `base` is passed", "use the base argument"),
    ("divide", "angles t / θ_r instead of t · θ_r", "you divided the position by θ_r = base^(−2r/d): the angles "
     "grow with r", "angle = t * base ** (-2 * r / d)"),
    ("intdiv", "every pair turns by the same angle t", "your θ_r came out 1 for every pair: integer division (or "
     "integer tensors) in the exponent 2r/d", "compute the exponent in floating point: torch.arange(0, d, 2) / d"),
    ("none", "x returned unrotated", "your result is x itself: nothing was rotated", _ROPE_FIX),
    ("inplace", "the second line used the already rotated x_2r", "you overwrote x_2r (in place, or by reusing a "
     "variable) before computing x_2r+1 from it", "compute both from the originals: even, odd = x[..., 0::2], "
     "x[..., 1::2]"),
    ("repeat", "cos and sin laid out with .repeat, not .repeat_interleave", "neighbouring pairs need cos and sin "
     "as c0 c0 c1 c1 … (repeat_interleave); .repeat gives c0 c1 … c0 c1 …, mixing two frequencies in most pairs",
     "cos.repeat_interleave(2, dim=-1)"),
    ("mixed", "rotate_half with interleaved cos and sin", "you mixed two conventions: rotate_half pairs i with "
     "i + d/2, but your cos and sin are laid out for neighbouring pairs", "turn each pair as (−x_2r+1, x_2r): "
     "torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)"),
])


def _rope_measured(fn: Learner, failure: Failure, out: torch.Tensor, x, given, base) -> None:
    """What the learner's rotation does, measured on extra calls with unit pairs (1, 0) and (0, 1): whether each pair
    turns within itself, by which angles, from which positions and base; else which 2 × 2 coefficients are off."""
    n, d = x.shape[-2:]
    if failure.diagnosis.cause or tuple(out.shape) != tuple(x.shape):
        return
    want = _rope(x, given, base)
    half = kit.measure.made_of_half(out.detach()) if out.is_floating_point() else None
    if half is not None:  # a grid of float16's own, relative steps: not a fixed grid (round(v * 256) / 256)
        pair = x.double().unflatten(-1, (-1, 2)).norm(dim=-1).repeat_interleave(2, dim=-1)  # each value's pair length
        got = out.detach().double()  # rounded to the nearest: within a few steps, and some values up (not cut off)
        if bool(((got - want).abs() <= 4 * _step(pair, half)).all()) and bool((got.abs() > want.abs()).any()):
            kit.half_rounded(out, want, tried=failure.diagnosis.tried, what="your rotated values", fix=_ROPE_FIX)
    unit = torch.zeros(n, d, dtype=torch.float64)
    unit[:, 0::2] = 1.0  # every pair (1, 0): rotated by a, it becomes (cos a, sin a)
    ask = lambda *args: call_or_skip(lambda: as_tensor(fn(*args), tried=failure.diagnosis.tried).double())  # noqa: E731
    turned = ask(unit, given, base)
    if turned is None or tuple(turned.shape) != (n, d):
        return
    positions = (torch.arange(n) if given is None else torch.as_tensor(given)).double()
    angles = (positions[:, None] * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)).repeat_interleave(2, -1)
    _half_coefficients(failure, turned, _rope(unit, given, base), angles)
    first, second = turned[:, 0::2], turned[:, 1::2]  # (n, d/2)
    positions = (torch.arange(n) if given is None else torch.as_tensor(given)).double()
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    if not torch.allclose(first ** 2 + second ** 2, torch.ones_like(first), atol=1e-4):
        _pair_lengths(failure, ask, turned, x, out, given, base, positions[:, None] * theta)
        return  # nothing proven: the generic measurement speaks
    angles = torch.atan2(second, first)  # (n, d/2)
    sin = torch.sin(positions[:, None] * theta)  # the right sines: where negative, |sin| turns the other way
    if torch.allclose(first, torch.cos(positions[:, None] * theta), atol=1e-4) and bool((sin < -1e-3).any()) and \
            torch.allclose(second, sin.abs(), atol=1e-4):
        fail_again(failure, "sin's sign lost", "given pairs (1, 0), your function returns (cos t·θ_r, |sin t·θ_r|): "
                   "your sine is never negative, as sqrt(1 − cos²) or .abs() make it, so pairs whose angle t·θ_r lies "
                   "between π and 2π (mod 2π) turn the wrong way", "use torch.sin(angles): sqrt(1 − cos²) loses the "
                   "sign of the sine")
    turns = lambda t, a: torch.allclose(t[:, 0::2], torch.cos(a), atol=1e-4) and \
        torch.allclose(t[:, 1::2], torch.sin(a), atol=1e-4)  # noqa: E731
    if given is not None and not turns(turned, positions[:, None] * theta):
        default = ask(unit, None, base)
        if default is not None and default.shape == (n, d) and turns(default, torch.arange(n)[:, None] * theta):
            fail_again(failure, "positions mishandled", "your rotation is right with positions=None but not with the "
                   "positions passed: the angles are t·θ_r with t the given position itself",
                   "angles = positions[:, None] * θ, with positions = torch.arange(n) only when None is passed")
    other_base = 500.0 if base != 500.0 else 10000.0
    if bool((angles.abs() > 1e-6).any()) and d >= 4 and (other := ask(x, given, other_base)) is not None and \
            same(other, out.double(), atol=0, rtol=0):
        fail_again(failure, "base ignored", f"your result is the same for base = {base:g} and base = {other_base:g}: a "
               "fixed base sits in your code", "use the base argument: θ_r = base ** (-2 * r / d)")
    moving = positions != 0
    if moving.any():
        per_position = angles[moving] / positions[moving, None]  # (moving, d/2): the angle per unit of position
        if not turns(turned, positions[:, None] * per_position[:1]):
            fail_again(failure, "angles not proportional to the positions", f"given pairs (1, 0) at positions "
                   f"{', '.join(str(int(p)) for p in positions[:6])}, your rotation angles are not t·θ_r for one "
                   "θ_r per pair: check how the positions enter the angles", _ROPE_FIX)
        omega = per_position[0]
        if not (torch.allclose(torch.cos(omega), torch.cos(theta), atol=1e-4) and
                torch.allclose(torch.sin(omega), torch.sin(theta), atol=1e-4)):
            fail_again(failure, "wrong rotation frequencies", "given pairs (1, 0), your function turns each pair "
                   "within itself by t·ω_r, as it should, but with the " + frequency_cause(omega, theta, base, d),
                   _ROPE_FIX)
    coef = _pair_map(ask, turned, x, out, given, base)
    if coef is not None:  # else not a map of each pair alone: the other measurements say more
        _name_coefficients(failure, coef, positions[:, None] * theta)


def _pair_map(ask, turned: torch.Tensor, x: torch.Tensor, out: torch.Tensor, given, base) -> list | None:
    """Each pair mapped from itself alone? The 2 × 2 coefficients read off the pairs (1, 0) (``turned``) and (0, 1),
    [[new x_2r from x_2r, from x_2r+1], [new x_2r+1 from …]], each (n, d/2); None unless they reproduce ``out`` on x."""
    other = ask(1.0 - _unit_pairs(turned), given, base)
    if other is None or other.shape != turned.shape:
        return None
    coef = [[turned[:, 0::2], other[:, 0::2]], [turned[:, 1::2], other[:, 1::2]]]  # new (even, odd) from (x_2r, x_2r+1)
    xe, xo = x.double()[..., 0::2], x.double()[..., 1::2]
    mine = torch.stack([coef[0][0] * xe + coef[0][1] * xo, coef[1][0] * xe + coef[1][1] * xo], -1).flatten(-2)
    return coef if same(mine, out.double(), atol=1e-4, rtol=1e-4) else None


def _unit_pairs(like: torch.Tensor) -> torch.Tensor:
    """Every pair (1, 0), shaped like ``like`` (n, d), in float64."""
    unit = torch.zeros(like.shape, dtype=torch.float64)
    unit[..., 0::2] = 1.0
    return unit


def _pair_lengths(failure: Failure, ask, turned: torch.Tensor, x: torch.Tensor, out: torch.Tensor, given, base,
                  angles: torch.Tensor) -> None:
    """The pairs (1, 0) come back with lengths ≠ 1: name why, only what a measurement proves. A map of each pair
    alone whose 2 × 2 coefficients are one factor times the rotation's is a scaled rotation; within 1e-2 of the
    rotation's (right angles, lengths near 1), it has inexact cos and sin (rounded to a grid, cut); other coefficients are named one by one; a result whose other pairs move when
    one pair of x changes mixes dimensions of different pairs."""
    coef = _pair_map(ask, turned, x, out, given, base)
    if coef is None:
        d = turned.shape[-1]
        for r in range(d // 2 if d >= 4 else 0):  # pair r changed, every other pair kept: do the others move?
            nudged = x.double().clone()
            nudged[..., 2 * r: 2 * r + 2] += 1.0
            moved = ask(nudged.to(x.dtype), given, base)
            if moved is None or moved.shape != out.shape:
                return
            others = [c for c in range(d) if c // 2 != r]
            if not same(moved[..., others], out.double()[..., others], atol=1e-6, rtol=1e-6):
                fail_again(failure, "not a rotation of each pair", "your function does not turn each pair within "
                           f"itself: changing only pair {r} (x_{2 * r}, x_{2 * r + 1}) of x changes other pairs of "
                           "your result, so it mixes dimensions of different pairs", _ROPE_FIX)
        return
    c, s = torch.cos(angles), torch.sin(angles)
    off = max(float((coef[i][j] - t).abs().max()) for i, j, t in ((0, 0, c), (0, 1, -s), (1, 0, s), (1, 1, c)))
    lengths = coef[0][0] ** 2 + coef[1][0] ** 2
    turn = torch.atan2(coef[1][0], coef[0][0]) - angles
    turn = torch.atan2(torch.sin(turn), torch.cos(turn))  # each pair's angle error, in (−π, π]
    stretch = lengths.sqrt()  # (n, d/2): each pair's length once turned
    scaled = float(stretch.max() - stretch.min()) <= 1e-6 and all(  # one factor times the rotation's coefficients
        torch.allclose(coef[i][j], stretch * t, atol=1e-6) for i, j, t in ((0, 0, c), (0, 1, -s), (1, 0, s), (1, 1, c)))
    if scaled:
        fail_again(failure, "each pair rotated, then scaled", "given pairs (1, 0) and (0, 1), your function turns "
                   "each pair within itself by the right angle t·θ_r, but every pair comes back "
                   f"{fmt(float(stretch.flatten()[0]))} times as long: a rotation keeps each pair's length",
                   "multiply by cos and sin alone: nothing scales the result")
    if off <= 1e-2 and bool(((stretch - 1).abs() <= 1e-2).all()) and bool((turn.abs() <= 1e-2).all()):
        fail_again(failure, "cos and sin not exact", "given pairs (1, 0) and (0, 1), your function turns each pair "
                   f"within itself by the right angle t·θ_r, but the cos and sin it multiplies by are off by up "
                   f"to {fmt(off)}: the rotation does not keep each pair's length (off from 1 by up to "
                   f"{fmt(float((stretch - 1).abs().max()))})", "use torch.cos(angles) and "
                   "torch.sin(angles) as they come, in float32 or float64: nothing rounded, truncated or added")
    _name_coefficients(failure, coef, angles)


def _name_coefficients(failure: Failure, coef: list, angles: torch.Tensor) -> None:
    """Name each 2 × 2 coefficient (of a map of each pair alone) that is not the rotation's by t·θ_r (``angles``)."""
    c, s = torch.cos(angles), torch.sin(angles)
    names = {"cos(t·θ_r)": c, "−cos(t·θ_r)": -c, "sin(t·θ_r)": s, "−sin(t·θ_r)": -s, "0": 0 * c, "1": 1 + 0 * c}
    right = [["cos(t·θ_r)", "−sin(t·θ_r)"], ["sin(t·θ_r)", "cos(t·θ_r)"]]
    said = [f"the new {new} takes {old} × "
            f"{next((k for k, v in names.items() if torch.allclose(coef[i][j], v, atol=1e-4)), 'another factor')} "
            f"(a rotation: × {right[i][j]})" for i, new in enumerate(("x_2r", "x_2r+1"))
            for j, old in enumerate(("x_2r", "x_2r+1"))
            if not torch.allclose(coef[i][j], names[right[i][j]], atol=1e-4)]
    if said:
        fail_again(failure, "not the rotation's coefficients", "your function maps each pair (x_2r, x_2r+1) to a "
               "combination of that pair, as a rotation does, but " + "; ".join(said), _ROPE_FIX)


def _step(t: torch.Tensor, half: torch.dtype) -> torch.Tensor:
    """The spacing of ``half``'s numbers at each |t| (float64): relative to the value, down to the smallest step."""
    info = torch.finfo(half)
    return torch.exp2(torch.floor(torch.log2(t.double().abs().clamp(min=info.smallest_normal)))) * info.eps


def _half_coefficients(failure: Failure, turned: torch.Tensor, right: torch.Tensor, angles: torch.Tensor) -> None:
    """Name cos and sin that went through float16 or bfloat16: the pairs (1, 0) come back as (cos t·θ_r, sin t·θ_r),
    each on that dtype's grid and within a few of its rounding steps of the truth (a float32 or float64 cos lands on
    the grid by chance with probability about 2⁻¹³ per value). Its steps are relative: each value is off by a few
    steps at its own size and its angle's (the angle may be the rounded one), not by a fixed grid's step
    (round(cos * 256) / 256), and rounded to the nearest, some values up, not all towards 0 (bits cut off)."""
    telling = turned[(turned != 0) & (turned.abs() != 1)]  # pairs at position 0 come back (1, 0) whatever the dtype
    half = kit.measure.made_of_half(turned) if telling.numel() >= 4 else None
    err = float((turned - right).abs().max())
    if half is None or not 2.0 ** -14 < err <= 4 * 2.0 ** -10:
        return
    off = turned - right
    if not bool((off.abs() <= 2 * (_step(right, half) + _step(angles, half))).all()) or \
            not bool((turned.abs() > right.abs()).any()):
        return
    name = str(half).replace("torch.", "")
    fail_again(failure, f"cos and sin in {name}",
               f"given pairs (x_2r, x_2r+1) = (1, 0), your function returns (cos t·θ_r, sin t·θ_r) rounded to {name} "
               f"numbers (off by up to {fmt(err)}): your cos and sin, or the angles, went through {name}, which keeps "
               f"about {kit.measure.DIGITS[half]} significant digits, before meeting x",
               "compute the angles, cos and sin in float32 or float64 and convert them to x.dtype: leave out .half() "
               "and .bfloat16()")


@check("apply_rope", expects="a function apply_rope(x, positions=None, base=10000.0) returning a tensor shaped like x")
def check_apply_rope(fn: Learner) -> str:
    g = torch.Generator().manual_seed(12)
    x = lambda *shape, dtype=torch.float64: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)  # noqa
    cases = [("x (6, 8), default positions", (x(6, 8),)),
             ("x (2, 3, 5, 16): batch × heads, default positions", (x(2, 3, 5, 16),)),
             ("x (3, 8) at positions [0, 5, 2]", (x(3, 8), torch.tensor([0, 5, 2]))),
             ("x (1, 4): one new token at position 7", (x(1, 4), torch.tensor([7]))),
             ("x (4, 2): d = 2", (x(4, 2), torch.arange(4))),
             ("x (2, 6, 8) at positions 10 … 15", (x(2, 6, 8), torch.arange(10, 16))),
             ("x (5, 8), base 500", (x(5, 8), torch.arange(5), 500.0)),
             ("x (2, 7, 12) float32, default positions", (x(2, 7, 12, dtype=torch.float32),)),
             ("x (3, 8) at positions [1000, 2501, 4097]", (x(3, 8), torch.tensor([1000, 2501, 4097])))]
    suspects = Suspects(_ROPE_TABLE, atol=1e-4, rtol=1e-4)
    signature = [("TypeError", "argument", "your function does not take positions and base",
                  "keep the signature apply_rope(x, positions=None, base=10000.0)")]
    for name, args in cases:
        case = (*args, *(None, 10000.0)[len(args) - 1:])  # (x, positions, base)
        shown = ["x", "None" if case[1] is None else "positions", "base=500"][:len(args)]
        tried = f"apply_rope({', '.join(shown)}) on {name}"
        out = call(fn, args, tried, "a tensor shaped like x", patterns=signature)
        expect_shape(out, case[0].shape, tried=tried, what="your result", fix="the result has x's shape (..., n, d)")
        if out.dtype != case[0].dtype and out.is_floating_point():
            fail(f"dtype changed from {str(case[0].dtype)[6:]} to {str(out.dtype)[6:]}", tried=tried,
                 got=str(out.dtype), expected=str(case[0].dtype), cause="your cos and sin are in another dtype, "
                 "which promoted the product", fix="convert cos and sin to x.dtype before multiplying")
        atol = 3e-3 if "4097" in name else 1e-5 if case[0].dtype == torch.float64 else 1e-4
        judge(suspects, fn, out, _rope(*case), case, tried, lambda f: _rope_measured(fn, f, out, *case),
              what="your rotated x", atol=atol, rtol=1e-4, fix=_ROPE_FIX)
    # The relative property, on the learner's own rotations: q·k depends only on the distance.
    q, k = x(1, 16), x(1, 16)
    scores = []
    for i, j in [(0, 3), (5, 8), (40, 43), (200, 203)]:
        tried = f"apply_rope(q, tensor([{i}])) · apply_rope(k, tensor([{j}]))"
        rq, rk = (as_tensor(fn(t, torch.tensor([p])), tried=tried).double() for t, p in ((q, i), (k, j)))
        scores.append(float((rq * rk).sum()))
    if max(scores) - min(scores) > 1e-3 * max(1.0, abs(scores[0])):  # float32 angles at position 200: ~1e-5
        fail("scores depend on absolute positions", tried="q at position t, k at t + 3, for t = 0, 5, 40, 200",
             got="scores " + ", ".join(fmt(s) for s in scores), expected="the same score for every t", fix=_ROPE_FIX)
    kit.expect_unchanged(fn, (x(3, 8), torch.tensor([4, 0, 9])), call="apply_rope(x, positions)", name="x",
                         others=("positions",), shown="x (3, 8) float64 at positions [4, 0, 9]")
    return (f"matches RoFormer's interleaved rotation on {len(cases)} cases, and q·k depends only on j − i "
            f"(checked at distance 3 from positions 0 to 200)")


# ================================================================================== RoPE with a KV cache
def _decode(q_new, k_new, k_cache, mistake: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """The right step (``mistake`` empty) or one classic mistake, in float64: (q rotated, keys)."""
    q_new, k_new, k_cache = q_new.double(), k_new.double(), k_cache.double()
    n_cache, n_new = k_cache.shape[-2], q_new.shape[-2]
    start = {"restart": 0, "plus1": n_cache + 1, "minus1": n_cache - 1}.get(mistake, n_cache)
    positions = {"same": torch.full((n_new,), n_cache), "end": torch.full((n_new,), n_cache + n_new - 1)}.get(
        mistake, torch.arange(start, start + n_new))
    q_rot = q_new if mistake == "q_plain" else ref.apply_rope(q_new, positions)
    k_rot = k_new if mistake == "k_plain" else ref.apply_rope(k_new, positions)
    cache = ref.apply_rope(k_cache, torch.arange(n_cache)) if mistake == "rerotate" else k_cache
    if mistake == "all_again":  # the whole cache with the new keys rotated from 0 … again
        return q_rot, ref.apply_rope(torch.cat([k_cache, k_rot], dim=-2), torch.arange(n_cache + n_new))
    return q_rot, torch.cat([k_rot, cache] if mistake == "prepend" else [cache, k_rot], dim=-2)


_DECODE_FIX = ("positions = torch.arange(n_cache, n_cache + n_new) (n_cache = k_cache.shape[-2]); rotate q_new and "
               "k_new with pos.apply_rope(x, positions); return (q_rotated, torch.cat([k_cache, k_rotated], dim=-2))")
_ONLY_NEW = "leave k_cache alone; rotate only the new keys, then append them"
_DECODE_ROWS = [
    ("restart", "positions restart at 0", "you rotated the new tokens by 0 … n_new − 1; each new position is the "
     "absolute one: the cache length plus the offset", _DECODE_FIX),
    ("rerotate", "cached keys rotated again", "you rotated the cached keys by 0 … n_cache − 1: they were stored "
     "rotated, each by its own position", _ONLY_NEW),
    ("all_again", "cache rotated again with the new keys", "you rotated the whole extended cache by 0 … n_cache + "
     "n_new − 1: the cached keys were already rotated, so they turn twice", _ONLY_NEW),
    ("k_plain", "new keys stored unrotated", "you appended the new keys without rotating them: later queries meet "
     "them as if at position 0", "rotate k_new by the new positions before appending it"),
    ("q_plain", "queries not rotated", "you returned q_new unrotated", "rotate q_new by the new positions too"),
    ("plus1", "positions off by one (one too far)", "you started the new positions at n_cache + 1; the first new "
     "token sits at position n_cache (positions count from 0)", _DECODE_FIX),
    ("minus1", "positions off by one (one too early)", "you started the new positions at n_cache − 1, the last "
     "cached token's position", _DECODE_FIX),
    ("same", "every new token at the same position", "you rotated every new token by n_cache; they sit at "
     "n_cache, n_cache + 1, …", _DECODE_FIX),
    ("end", "every new token at the last position", "you rotated every new token by the new length minus 1",
     _DECODE_FIX),
    ("prepend", "new keys put before the cache", "you put the new keys first; old keys come first, new ones are "
     "appended", "torch.cat([k_cache, k_rotated], dim=-2)"),
]
_DECODE_Q, _DECODE_K = (variants(lambda *c, part=part: _decode(*c)[part], _DECODE_ROWS) for part in (0, 1))


@check("rope_decode_step",
       expects="a function rope_decode_step(q_new, k_new, k_cache) returning (q_rotated, extended k_cache)")
def check_rope_decode_step(fn: Learner) -> str:
    g = torch.Generator().manual_seed(31)
    r = lambda *shape, dtype=torch.float64: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)  # noqa
    cached = lambda x: ref.apply_rope(x, torch.arange(x.shape[-2]))  # noqa: E731 - stored rotated, as caches hold them
    cases = [("a prompt of 4 tokens, empty cache (0, 8)", (r(4, 8), r(4, 8), r(0, 8))),
             ("one new token after 5 cached ones, d = 8", (r(1, 8), r(1, 8), cached(r(5, 8)))),
             ("3 new tokens after 6 cached ones", (r(3, 8), r(3, 8), cached(r(6, 8)))),
             ("batch × heads (2, 4): one new token after 7 cached ones, d = 16",
              (r(2, 4, 1, 16), r(2, 4, 1, 16), cached(r(2, 4, 7, 16)))),
             ("float32: 2 new tokens after 3 cached ones", (r(2, 4, dtype=torch.float32), r(2, 4, dtype=torch.float32),
                                                            cached(r(3, 4, dtype=torch.float32)))),
             ("one new token after 1000 cached ones, d = 4", (r(1, 4), r(1, 4), cached(r(1000, 4))))]
    on_q, on_k = Suspects(_DECODE_Q, atol=1e-4, rtol=1e-4), Suspects(_DECODE_K, atol=1e-4, rtol=1e-4)
    for name, case in cases:
        tried = f"rope_decode_step(q_new, k_new, k_cache) with {name}"
        q_out, k_out = kit.unpack(call(fn, case, tried, "(q_rotated, k_cache extended)", tensor=False),
                                  ("q_rotated", "k_cache"), tried=tried)
        exp_q, exp_k = _decode(*case)
        tol = dict(atol=1e-6, rtol=1e-5) if case[0].dtype == torch.float64 else dict(atol=1e-4, rtol=1e-4)
        expect_shape(k_out, exp_k.shape, tried=tried, what="the extended cache",
                     fix="append the new keys along the positions: torch.cat([k_cache, k_rotated], dim=-2)")
        expect_shape(q_out, exp_q.shape, tried=tried, what="the rotated queries", fix="keep q_new's shape")
        for part, (on, got, exp, what) in enumerate([(on_k, k_out, exp_k, "the extended cache"),
                                                     (on_q, q_out, exp_q, "the rotated queries")]):
            # an empty cache makes "every token at n_cache" the same as a part left unrotated: the other cases tell
            on.expect(got, exp, case, tried=tried, what=what, fix=_DECODE_FIX, again=lambda *c, i=1 - part: as_tensor(
                fn(*c)[i], tried=tried), distinguish=[c for _, c in cases], **tol)
        for got, what in ((q_out, "the rotated queries"), (k_out, "the extended cache")):
            kit.lower_precision(got, case[0].dtype, tried=tried, what=what, grid=False)
        kept = k_out[..., :case[2].shape[-2], :]  # within the tolerance: now the cached keys, exactly as given
        if not torch.equal(kept.to(case[2].dtype), case[2]):
            fail("cached keys not kept exactly", tried=tried, got="the first n_cache keys of your extended cache are "
                 f"off from k_cache by up to {fmt(float((kept.double() - case[2].double()).abs().max()))}",
                 expected="k_cache's own values, exactly", cause="you recomputed or converted the cached keys (a trip "
                 "through another dtype, a rotation undone and redone) instead of leaving them as they are", fix=_ONLY_NEW)
    kit.expect_unchanged(fn, (r(2, 8), r(2, 8), cached(r(3, 8))), call="rope_decode_step(q_new, k_new, k_cache)",
                         name="q_new", others=("k_new", "k_cache"), shown="2 new tokens after 3 cached ones, d = 8, "
                         "float64")
    return (f"matches cache length + offset on {len(cases)} cases (a prompt, single tokens, batch × heads, "
            "1000 cached keys); cached keys kept as they were")
