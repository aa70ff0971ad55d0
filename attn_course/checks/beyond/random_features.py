"""Check of notebook 13's exercise 4, ``positive_random_features``: its cases, the feature map with its known
mistakes, and the float32 case whose exponents overflow when taken separately."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..compare import Failure, as_tensor, fail, fail_again, same
from ..core import Learner, check
from ..kit import Suspects, expect_unchanged, variants
from .judge import dtype_of, expect_close_at_dtype, tolerance


_RF_FIX = "φ(x) = torch.exp(x @ omega.T − (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(n_f), with n_f = omega.shape[0]"


def _features(x: Tensor, omega: Tensor, mistake: str = "") -> Tensor:
    x, omega = x.double(), omega.double()
    r = omega.shape[0]
    proj = x if mistake == "no_proj" else x @ (omega if mistake == "transposed" else omega.T)
    sq = {"mean": (x * x).mean(-1, keepdim=True), "col": (x * x).sum(-2, keepdim=True),
          "unsquared": x.sum(-1, keepdim=True)}.get(mistake, (x * x).sum(-1, keepdim=True))
    half = {"no_half": sq, "norm": sq.sqrt() / 2, "none": 0 * sq, "plus": -sq / 2}.get(mistake, sq / 2)
    scale = {"no_scale": 1.0, "r": 1 / r, "sqrt_d": 1 / math.sqrt(x.shape[-1])}.get(mistake, 1 / math.sqrt(r))
    if mistake == "no_exp":
        return (proj - half) * scale
    if mistake == "trig":
        return torch.cat([torch.sin(proj), torch.cos(proj)], -1) * torch.exp(sq / 2) / math.sqrt(r)
    return torch.exp(proj - half) * scale


_RF_TABLE = variants(_features, [
    ("no_scale", "features not rescaled: 1/√n_f missing", "you left out the division by √n_f, so φ(x)·φ(y) sums n_f "
     "terms instead of averaging them", "divide by math.sqrt(omega.shape[0])"),
    ("r", "features divided by n_f instead of √n_f", "you divided each feature by n_f; φ(x)·φ(y) multiplies two "
     "features, so each gets 1/√n_f", "divide by math.sqrt(omega.shape[0])"),
    ("sqrt_d", "features divided by √d instead of √n_f", "you divided by the square root of the input width d, not "
     "of the number of features n_f = omega.shape[0]", "divide by math.sqrt(omega.shape[0])"),
    ("none", "features not rescaled: exp(−|x|²/2) missing", "you computed exp(ω·x) without the factor exp(−|x|²/2), "
     "so φ(x)·φ(y) estimates exp(x·y + |x|²/2 + |y|²/2), not exp(x·y)", _RF_FIX),
    ("no_half", "|x|² not halved", "you subtracted |x|² instead of |x|²/2", _RF_FIX),
    ("norm", "|x| instead of |x|²", "you subtracted the norm |x| (halved), not the squared norm |x|²/2", _RF_FIX),
    ("plus", "sign of |x|²/2 reversed", "you added |x|²/2 instead of subtracting it", _RF_FIX),
    ("no_proj", "random projection missing: x instead of ω·x", "you used x itself in the exponent instead of its "
     "projections x Ωᵀ; with n_f = d the shapes still fit", _RF_FIX),
    ("mean", "|x|² as a mean", "you took the mean of the squares (.mean) instead of their sum, which is |x|²/d",
     "(x * x).sum(dim=-1, keepdim=True)"),
    ("col", "|x|² summed over the rows", "you summed x * x over dim=-2 (over the n vectors) instead of over each "
     "vector's d entries (dim=-1)", "(x * x).sum(dim=-1, keepdim=True)"),
    ("unsquared", "|x|² without the squares", "you summed the entries of x, not their squares: Σ x_i instead of |x|² "
     "= Σ x_i²", "(x * x).sum(dim=-1, keepdim=True)"),
    ("transposed", "projection transposed", "you multiplied by omega instead of omega.T; with n_f = d the shapes "
     "still fit, but feature i must be ω_i·x, the dot product with row i of omega", "x @ omega.T"),
    ("no_exp", "exp missing: features not positive", "you returned the exponent ω·x − |x|²/2 (divided by √n_f) "
     "without taking exp, so features are negative", _RF_FIX),
    ("trig", "trigonometric features instead of positive ones", "you returned sin and cos features (the random "
     "Fourier features of the Gaussian kernel): they take negative values, and the docstring asks for n_f positive "
     "features", _RF_FIX),
])
_RF_CASES = [("x (4, 3), Ω (3, 3) (as many features as inputs)", ((4, 3), 3), 1.0),
             ("x (5, 4), Ω (16, 4)", ((5, 4), 16), 1.0),
             ("x (2, 3, 6, 4) (batch × heads), Ω (8, 4)", ((2, 3, 6, 4), 8), 1.0),
             ("x (3, 5), Ω (1, 5) (one feature)", ((3, 5), 1), 1.0),
             ("x (6, 8) of norm ≈ 4, Ω (32, 8)", ((6, 8), 32), 1.5),
             ("x (4, 5) in float32, Ω (10, 5)", ((4, 5), 10), 1.0)]


def _rf_cases() -> list[tuple[str, Tensor, Tensor]]:
    """``_RF_CASES`` drawn, then float32 x with |x|²/2 ≈ 98 and rows of Ω nearly parallel to x, so ω·x ≈ 90:
    exp(ω·x) overflows and exp(−|x|²/2) underflows in float32, while exp(ω·x − |x|²/2) is an ordinary number."""
    cases = []
    for i, (label, (shape, r), scale) in enumerate(_RF_CASES):
        g = torch.Generator().manual_seed(400 + i)
        x = scale * torch.randn(*shape, generator=g, dtype=torch.float64)
        omega = torch.randn(r, shape[-1], generator=g, dtype=torch.float64)
        cases.append((label, x.to(dtype_of(label)), omega.to(dtype_of(label))))
    g = torch.Generator().manual_seed(406)
    x = torch.randn(3, 6, generator=g, dtype=torch.float64)
    x = 14 * x / x.norm(dim=-1, keepdim=True)  # |x| = 14
    omega = torch.randn(8, 6, generator=g, dtype=torch.float64)
    omega[:3] = 6.6 * x / 14 + 0.05 * omega[:3]  # ω·x ≈ 92 for row i = x_i
    cases.append(("float32 x (3, 6) with |x|²/2 ≈ 98 and ω·x up to ≈ 92, Ω (8, 6)", x.float(), omega.float()))
    g = torch.Generator().manual_seed(408)  # then float64 features far above 1: the combined exponent up to ≈ 38
    x = torch.randn(3, 4, generator=g, dtype=torch.float64)
    x = 5 * x / x.norm(dim=-1, keepdim=True)  # |x|²/2 = 12.5
    omega = torch.randn(6, 4, generator=g, dtype=torch.float64)
    omega[:3] = 2 * x + 0.05 * omega[:3]  # ω·x ≈ 50 for row i = x_i
    return cases + [("x (3, 4) of norm 5, Ω (6, 4) with rows near 2x: exponents ω·x − |x|²/2 up to ≈ 38", x, omega)]


def _clamped(failure: Failure, out: Tensor, expected: Tensor, omega: Tensor) -> None:
    """Name a clamped exponent: the features right wherever they are below one value, and that value wherever the
    right ones are above it (the cap, exp(c)/√n_f, taken from the answer itself)."""
    if tuple(out.shape) != tuple(expected.shape) or not bool(torch.isfinite(out).all()):
        return
    a, e = out.double(), expected.double()
    cap = float(a.max())
    close = torch.isclose(a, e, rtol=1e-5, atol=0.0)
    if cap <= 0 or bool(close.all()) or not bool((close | (torch.isclose(a, torch.full_like(a, cap), rtol=1e-5)
                                                          & (e > cap))).all()):
        return
    c = math.log(cap * math.sqrt(omega.shape[0]))
    fail_again(failure, f"exponent clamped at about {c:.3g}", f"your features are right wherever the exponent ω·x − "
               f"|x|²/2 is below about {c:.3g} and stop at exp({c:.3g})/√n_f above it: a clamp (torch.clamp(…, "
               f"max={c:.3g}), or a min with a constant) cuts the large features the docstring asks for",
               "take exp of the combined exponent as it is: it is small where it matters, and float64 holds exp up to "
               "709 (no clamp needed)")


@check("positive_random_features",
       expects="a function positive_random_features(x, omega) returning a tensor (..., n, n_f)")
def check_positive_random_features(fn: Learner) -> str:
    suspects, cases = Suspects(_RF_TABLE), _rf_cases()
    for label, x, omega in cases:
        tried = f"positive_random_features(x, omega) on {label}"
        out, expected = as_tensor(fn(x, omega), tried=tried), _features(x, omega)
        split = (torch.exp(x @ omega.T) * torch.exp(-(x * x).sum(-1, keepdim=True) / 2)) / math.sqrt(omega.shape[0])
        if "98" in label and not same(out, expected, **tolerance(x.dtype)) and same(out, split, atol=0, rtol=0):
            fail("exp(ω·x) and exp(−|x|²/2) taken separately: overflow", tried=tried,
                 got="inf, NaN or 0 where the right features are ordinary numbers",
                 expected="finite features (the combined exponent ω·x − |x|²/2 is small)",
                 cause="you exponentiated ω·x (≈ 90: exp overflows float32 to inf) and −|x|²/2 (≈ −98: exp "
                       "gives about 3·10⁻⁴³, a subnormal, or 0 where those are flushed) separately, then "
                       "multiplied: inf times that is inf, or NaN",
                 fix="subtract inside one exp: torch.exp(x @ omega.T − |x|²/2)")
        expect_close_at_dtype(suspects, out, expected, (x, omega), tried=tried, again=fn, fix=_RF_FIX,
                              measured=lambda failure: _clamped(failure, out, expected, omega),
                              oracle="exp(x Ωᵀ − |x|²/2) / √n_f in float64",
                              factors={"√n_f": math.sqrt(omega.shape[0]), "n_f": float(omega.shape[0])})
    g = torch.Generator().manual_seed(407)
    x, omega = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((5, 4), (6, 4)))
    expect_unchanged(fn, (x, omega), call="positive_random_features(x, omega)", name="x", others=("omega",),
                     shown="x (5, 4), Ω (6, 4), float64")
    return (f"matches exp(ω·x − |x|²/2)/√n_f on {len(cases)} cases (batch × heads, n_f = d, one feature, float32, "
            "exponents that overflow when split, exponents up to 38)")
