"""Checks of notebook 03 (attn_course.checks.softmax): every wrong answer rejected with the mistake named,
every correct alternative accepted (tensors or NumPy, keepdim styles, float64 inside…), anything odd
returned or raised handled, and the same verdict when the grader replays the log."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attn_course import softmax as ref
from attn_course.checks.result import Status
from attn_course.checks.softmax import (check_log_softmax, check_logsumexp, check_softmax_temperature,
                                        check_stable_softmax)

INF = float("inf")
ALL = [check_stable_softmax, check_logsumexp, check_log_softmax, check_softmax_temperature]


# =============================================================================== stable_softmax
def sm_naive(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim, keepdim=True)


def sm_naive_eps(x, dim=-1):
    e = torch.exp(x)
    return e / (e.sum(dim, keepdim=True) + 1e-12)


def sm_global_max(x, dim=-1):
    e = torch.exp(x - x.max())
    return e / e.sum(dim, keepdim=True)


def sm_global_max_eps(x, dim=-1):  # the same mistake behind an epsilon: slices of zeros
    e = torch.exp(x - x.max())
    return e / (e.sum(dim, keepdim=True) + 1e-9)


def sm_global_max_clamp(x, dim=-1):
    e = torch.exp(x - x.max())
    return e / e.sum(dim, keepdim=True).clamp_min(1e-30)


def sm_numpy_global_max(x, axis=-1):
    with np.errstate(all="ignore"):
        e = np.exp(x - np.max(x))
        return e / np.sum(e, axis=axis, keepdims=True)


def sm_max_wrong_axis(x, dim=-1):
    e = torch.exp(x - x.amax(0 if dim % x.ndim != 0 else -1, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def sm_max_last_axis(x, dim=-1):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def sm_sum_last_axis(x, dim=-1):
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def sm_ignores_dim(x, dim=-1):
    return torch.softmax(x, -1)


def sm_dim1_hardcoded(x, dim=-1):
    e = torch.exp(x - x.amax(1, keepdim=True))
    return e / e.sum(1, keepdim=True)


def sm_row_loop(x, dim=-1):  # one row at a time along axis 0, ignoring dim
    out = torch.empty_like(x)
    for i in range(x.shape[0]):
        e = torch.exp(x[i] - x[i].max())
        out[i] = e / e.sum(-1, keepdim=True)
    return out


def sm_no_keepdim_max(x, dim=-1):
    e = torch.exp(x - x.amax(dim))
    return e / e.sum(dim, keepdim=True)


def sm_no_keepdim_sum(x, dim=-1):
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / e.sum(dim)


def sm_numpy_no_keepdims(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis))
    return e / np.sum(e, axis=axis)


def sm_plain(x, dim=-1):
    return x / x.sum(dim, keepdim=True)


def sm_not_normalised(x, dim=-1):
    return torch.exp(x - x.amax(dim, keepdim=True))


def sm_divide_by_max(x, dim=-1):
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / e.amax(dim, keepdim=True)


def sm_log_softmax(x, dim=-1):
    return torch.log_softmax(x, dim)


def sm_minus_x(x, dim=-1):
    return torch.softmax(-x, dim)


def sm_min_shift(x, dim=-1):
    e = torch.exp(x - x.amin(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def sm_mean_shift(x, dim=-1):
    e = torch.exp(x - x.mean(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def sm_abs_max_shift(x, dim=-1):
    e = torch.exp(x - x.abs().amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def sm_flatten(x, dim=-1):
    return torch.softmax(x.flatten(), 0).reshape(x.shape)


def sm_vector_only(x, dim=-1):
    e = torch.exp(x - x.max())
    return e / e.sum()


def sm_argmax(x, dim=-1):
    return (x == x.amax(dim, keepdim=True)).to(x.dtype)


def sm_times_half(x, dim=-1):
    return torch.softmax(x / 2, dim)


def sm_exp2(x, dim=-1):
    e = torch.exp2(x - x.amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def sm_wrong_default(x, dim=0):
    return torch.softmax(x, dim)


def sm_clamped(x, dim=-1):
    e = torch.exp(x.clamp(-80, 80))
    return e / e.sum(dim, keepdim=True)


def sm_nan_to_num(x, dim=-1):
    e = torch.exp(x)
    return torch.nan_to_num(e / e.sum(dim, keepdim=True))


def sm_inf_to_zero(x, dim=-1):
    x = torch.where(torch.isinf(x), torch.zeros_like(x), x)
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def sm_inf_times_zero(x, dim=-1):
    e = torch.exp(x - x.amax(dim, keepdim=True)) * (x * 0 + 1)
    return e / e.sum(dim, keepdim=True)


def sm_transposed(x, dim=-1):
    w = torch.softmax(x, dim)
    return w.transpose(0, -1) if x.ndim > 1 else w


def sm_first_batch_only(x, dim=-1):
    w = torch.softmax(x, dim)
    return w[0].expand(x.shape).clone() if x.ndim == 3 else w


def sm_half_result(x, dim=-1):
    return torch.softmax(x.float(), dim).half()


def sm_half_inside(x, dim=-1):
    h = x.half()
    e = torch.exp(h - h.amax(dim, keepdim=True))
    return (e / e.sum(dim, keepdim=True)).to(x.dtype)


def sm_eps_denominator(x, dim=-1):
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / (e.sum(dim, keepdim=True) + 1e-3)


def sm_divide_by_n(x, dim=-1):
    return torch.exp(x - x.amax(dim, keepdim=True)) / x.shape[dim]


STABLE_SOFTMAX_WRONG = [
    (sm_naive, ["maximum not subtracted", "1000"]),
    (sm_naive_eps, ["maximum not subtracted"]),
    (sm_global_max, ["maximum taken over the whole tensor"]),
    (sm_global_max_eps, ["maximum taken over the whole tensor"]),
    (sm_global_max_clamp, ["maximum taken over the whole tensor"]),
    (sm_numpy_global_max, ["maximum taken over the whole tensor"]),
    (sm_max_wrong_axis, ["maximum taken along the wrong axis"]),
    (sm_max_last_axis, ["maximum taken along the wrong axis", "dim=0"]),
    (sm_sum_last_axis, ["sum taken along the wrong axis"]),
    (sm_ignores_dim, ["softmax along axis 1, not dim=0"]),
    (sm_dim1_hardcoded, ["softmax along axis 1, not dim=0"]),
    (sm_row_loop, ["softmax along axis 1, not dim=0"]),
    (sm_no_keepdim_max, ["keepdim=True", "RuntimeError"]),
    (sm_no_keepdim_sum, ["keepdim=True"]),
    (sm_numpy_no_keepdims, ["keepdim", "ValueError"]),  # the NumPy error, not the tensor one
    (sm_plain, ["no exponential"]),
    (sm_not_normalised, ["not normalised"]),
    (sm_divide_by_max, ["not normalised"]),
    (sm_log_softmax, ["log-softmax returned"]),
    (sm_minus_x, ["sign flipped"]),
    (sm_min_shift, ["minimum subtracted instead of the maximum"]),
    (sm_mean_shift, ["mean subtracted instead of the maximum"]),
    (sm_abs_max_shift, ["underflow", "own maximum"]),
    (sm_flatten, ["softmax over the whole tensor"]),
    (sm_vector_only, ["softmax over the whole tensor"]),
    (sm_argmax, ["arg-max instead of softmax"]),
    (sm_times_half, ["temperature 2, not 1"]),
    (sm_exp2, ["temperature 1.443, not 1"]),
    (sm_wrong_default, ["default dim is not -1"]),
    (sm_clamped, ["different scores, equal weights", "clamp"]),
    (sm_nan_to_num, ["slices of zeros", "overflows to inf", "nan_to_num"]),
    (sm_inf_to_zero, ["weight on -inf scores"]),
    (sm_inf_times_zero, ["NaN where scores are -inf"]),
    (sm_transposed, ["transpose"]),
    (sm_first_batch_only, ["batch entry 0 repeated"]),
    (sm_half_result, ["result in float16"]),
    (sm_half_inside, ["float16 precision"]),
    (sm_eps_denominator, ["epsilon in the denominator", "sum plus 0.001"]),
    (sm_divide_by_n, ["slices do not sum to 1"]),
]


@pytest.mark.parametrize("fn,phrases", STABLE_SOFTMAX_WRONG, ids=[f.__name__ for f, _ in STABLE_SOFTMAX_WRONG])
def test_stable_softmax_names_each_mistake(fn, phrases, rejects):
    rejects(check_stable_softmax, fn, *phrases)


def sm_values(x, dim=-1):
    e = (x - x.max(dim, keepdim=True).values).exp()
    return e / e.sum(dim, keepdim=True)


def sm_unsqueeze(x, dim=-1):
    e = torch.exp(x - x.amax(dim).unsqueeze(dim))
    return e / e.sum(dim).unsqueeze(dim)


def sm_numpy(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def sm_float64(x, dim=-1):
    return torch.softmax(x.double(), dim)


def sm_float32(x, dim=-1):
    y = x.float()
    e = torch.exp(y - y.amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def sm_via_logsumexp(x, dim=-1):
    return torch.exp(x - torch.logsumexp(x, dim, keepdim=True))


def sm_functional(x, dim=-1):
    return torch.nn.functional.softmax(x, dim=dim)


def sm_movedim(x, dim=-1):
    y = x.movedim(dim, -1)
    e = torch.exp(y - y.max(-1, keepdim=True)[0])
    return (e / e.sum(-1, keepdim=True)).movedim(-1, dim)


def sm_returns_numpy(x, dim=-1):
    return torch.softmax(x, dim).numpy()


def sm_safe_shift(x, dim=-1):
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(x - m)
    return e / torch.sum(e, dim=dim, keepdim=True)


def sm_in_place(x, dim=-1):
    x = x.clone()
    x -= x.amax(dim, keepdim=True)
    x.exp_()
    x /= x.sum(dim, keepdim=True)
    return x


@pytest.mark.parametrize("fn", [sm_values, sm_unsqueeze, sm_numpy, sm_float64, sm_float32, sm_via_logsumexp,
                                sm_functional, sm_movedim, sm_returns_numpy, sm_safe_shift, sm_in_place, ref.softmax])
def test_stable_softmax_accepts_correct_alternatives(fn, accepts):
    accepts(check_stable_softmax, fn)


def test_stable_softmax_says_which_kind_it_was_given(accepts):
    assert "(NumPy arrays)" in accepts(check_stable_softmax, sm_numpy).summary
    assert "(tensors)" in accepts(check_stable_softmax, ref.softmax).summary


# =============================================================================== logsumexp
def lse_naive(x, dim=-1):
    return torch.log(torch.exp(x).sum(dim))


def lse_numpy_naive(x, axis=-1):
    with np.errstate(all="ignore"):
        return np.log(np.sum(np.exp(x), axis=axis))


def lse_no_add_back(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    return torch.log(torch.exp(x - m).sum(dim))


def lse_subtracts_max(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    return (torch.log(torch.exp(x - m).sum(dim, keepdim=True)) - m).squeeze(dim)


def lse_global_max(x, dim=-1):
    return x.max() + torch.log(torch.exp(x - x.max()).sum(dim))


def lse_wrong_axis(x, dim=-1):
    return torch.logsumexp(x, 0 if x.ndim > 1 and dim % x.ndim != 0 else -1)


def lse_ignores_dim(x, dim=-1):
    return torch.logsumexp(x, -1)


def lse_keepdim(x, dim=-1):
    return torch.logsumexp(x, dim, keepdim=True)


def lse_squeeze_all(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    return (m + torch.log(torch.exp(x - m).sum(dim, keepdim=True))).squeeze()


def lse_max_only(x, dim=-1):
    return x.amax(dim)


def lse_mean(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    return (m + torch.log(torch.exp(x - m).mean(dim, keepdim=True))).squeeze(dim)


def lse_log2(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    return (m + torch.log2(torch.exp(x - m).sum(dim, keepdim=True))).squeeze(dim)


def lse_m_no_keepdim(x, dim=-1):
    m = x.amax(dim)
    return m + torch.log(torch.exp(x - m).sum(dim))


def lse_log_softmax(x, dim=-1):
    return torch.log_softmax(x, dim)


def lse_sum_of_scores(x, dim=-1):
    return x.sum(dim)


def lse_max_plus_log_n(x, dim=-1):
    return x.amax(dim) + math.log(x.shape[dim])


def lse_mean_shift(x, dim=-1):
    m = x.mean(dim, keepdim=True)
    return (m + torch.log(torch.exp(x - m).sum(dim, keepdim=True))).squeeze(dim)


def lse_inf_times_zero(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    return (m + torch.log((torch.exp(x - m) * (x * 0 + 1)).sum(dim, keepdim=True))).squeeze(dim)


def lse_default_zero(x, dim=0):
    return torch.logsumexp(x, dim)


def lse_integer(x, dim=-1):
    return torch.logsumexp(x, dim).long()


def lse_half(x, dim=-1):
    return torch.logsumexp(x.half(), dim)


LSE_WRONG = [
    (lse_naive, ["maximum not subtracted"]),
    (lse_numpy_naive, ["maximum not subtracted"]),
    (lse_no_add_back, ["maximum not added back"]),
    (lse_subtracts_max, ["maximum subtracted outside the log"]),
    (lse_global_max, ["maximum taken over the whole tensor"]),
    (lse_wrong_axis, ["reduced along axis 0"]),
    (lse_ignores_dim, ["reduced along axis 1"]),
    (lse_keepdim, ["reduced axis kept"]),
    (lse_squeeze_all, ["squeeze() removed every size-1 axis"]),
    (lse_max_only, ["maximum only"]),
    (lse_mean, ["mean instead of sum"]),
    (lse_log2, ["log base 2 or 10"]),
    (lse_m_no_keepdim, ["keepdim=True", "RuntimeError"]),
    (lse_log_softmax, ["log-softmax returned"]),
    (lse_sum_of_scores, ["sum of the scores"]),
    (lse_max_plus_log_n, ["maximum plus log n"]),
    (lse_mean_shift, ["widely spread", "spans 1005"]),
    (lse_inf_times_zero, ["where scores are -inf"]),
    (lse_default_zero, ["default dim is not -1"]),
    (lse_integer, ["integer result (int64)"]),
    (lse_half, ["result in float16"]),
]


@pytest.mark.parametrize("fn,phrases", LSE_WRONG, ids=[f.__name__ for f, _ in LSE_WRONG])
def test_logsumexp_names_each_mistake(fn, phrases, rejects):
    rejects(check_logsumexp, fn, *phrases)


def lse_numpy(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.sum(np.exp(x - m), axis=axis))


def lse_max_values(x, dim=-1):
    m = x.max(dim).values
    return m + (x - m.unsqueeze(dim)).exp().sum(dim).log()


def lse_item_for_a_vector(x, dim=-1):
    r = torch.logsumexp(x, dim)
    return r.item() if r.ndim == 0 else r


@pytest.mark.parametrize("fn", [lambda x, dim=-1: torch.logsumexp(x, dim), lse_numpy, lse_max_values,
                                lse_item_for_a_vector, lambda x, dim=-1: torch.logsumexp(x.double(), dim),
                                ref.logsumexp])
def test_logsumexp_accepts_correct_alternatives(fn, accepts):
    accepts(check_logsumexp, fn)


# =============================================================================== log_softmax
def ls_log_of_softmax(x, dim=-1):
    return torch.log(torch.softmax(x, dim))


def ls_numpy_log_of_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    with np.errstate(divide="ignore"):
        return np.log(e / e.sum(axis=axis, keepdims=True))


def ls_clamped(x, dim=-1):
    return torch.log(torch.softmax(x, dim).clamp_min(1e-30))


def ls_eps(x, dim=-1):
    return torch.log(torch.softmax(x, dim) + 1e-12)


def ls_naive(x, dim=-1):
    return x - torch.log(torch.exp(x).sum(dim, keepdim=True))


def ls_no_keepdim(x, dim=-1):
    return x - torch.logsumexp(x, dim)


def ls_wrong_axis(x, dim=-1):
    return torch.log_softmax(x, 0 if x.ndim > 1 and dim % x.ndim != 0 else -1)


def ls_softmax(x, dim=-1):
    return torch.softmax(x, dim)


def ls_sign(x, dim=-1):
    return torch.logsumexp(x, dim, keepdim=True) - x


def ls_minus_max(x, dim=-1):
    return x - x.amax(dim, keepdim=True)


def ls_no_add_back(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    return x - torch.log(torch.exp(x - m).sum(dim, keepdim=True))


def ls_global_max(x, dim=-1):
    m = x.max()
    return x - m - torch.log(torch.exp(x - m).sum(dim, keepdim=True))


def ls_half_inside(x, dim=-1):
    return torch.log_softmax(x.half(), dim).to(x.dtype)


def ls_log10(x, dim=-1):
    return torch.log10(torch.softmax(x, dim))


def ls_default_zero(x, dim=0):
    return torch.log_softmax(x, dim)


def ls_mean_shift(x, dim=-1):
    m = x.mean(dim, keepdim=True)
    return x - m - torch.log(torch.exp(x - m).sum(dim, keepdim=True))


LOG_SOFTMAX_WRONG = [
    (ls_log_of_softmax, ["log of the softmax", "log 0 = -inf"]),
    (ls_numpy_log_of_softmax, ["log of the softmax"]),
    (ls_clamped, ["wrong for very unlikely entries", "log of a probability"]),
    (ls_eps, ["wrong for very unlikely entries"]),
    (ls_naive, ["maximum not subtracted"]),
    (ls_no_keepdim, ["keepdim=True", "RuntimeError"]),
    (ls_wrong_axis, ["log-softmax along axis 0"]),
    (ls_softmax, ["softmax returned"]),
    (ls_sign, ["sign flipped"]),
    (ls_minus_max, ["maximum subtracted instead of logsumexp"]),
    (ls_no_add_back, ["maximum not added back"]),
    (ls_global_max, ["maximum taken over the whole tensor"]),
    (ls_half_inside, ["float16 precision"]),
    (ls_log10, ["log base 10"]),
    (ls_default_zero, ["default dim is not -1"]),
    (ls_mean_shift, ["overflow", "spans 1005"]),
]


@pytest.mark.parametrize("fn,phrases", LOG_SOFTMAX_WRONG, ids=[f.__name__ for f, _ in LOG_SOFTMAX_WRONG])
def test_log_softmax_names_each_mistake(fn, phrases, rejects):
    rejects(check_log_softmax, fn, *phrases)


def ls_numpy(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))


def ls_shift_first(x, dim=-1):
    z = x - x.amax(dim, keepdim=True)
    return z - z.exp().sum(dim, keepdim=True).log()


@pytest.mark.parametrize("fn", [lambda x, dim=-1: x - torch.logsumexp(x, dim, keepdim=True), ls_numpy, ls_shift_first,
                                lambda x, dim=-1: torch.log_softmax(x.double(), dim),
                                lambda x, dim=-1: torch.nn.functional.log_softmax(x, dim=dim), ref.log_softmax])
def test_log_softmax_accepts_correct_alternatives(fn, accepts):
    accepts(check_log_softmax, fn)


# =============================================================================== softmax_temperature
def t_multiplied(x, t):
    return torch.softmax(x * t, -1)


def t_ignored(x, t):
    return torch.softmax(x, -1)


def t_after(x, t):
    return torch.softmax(x, -1) / t


def t_power(x, t):
    return torch.softmax(x, -1) ** (1 / t)


def t_power_renormalised(x, t):
    p = torch.softmax(x, -1) ** (1 / t)
    return p / p.sum(-1, keepdim=True)


def t_naive(x, t):
    e = torch.exp(x / t)
    return e / e.sum(-1, keepdim=True)


def t_twice(x, t):
    return torch.softmax(x / t / t, -1)


def t_sqrt(x, t):
    return torch.softmax(x / math.sqrt(t), -1)


def t_hardcoded(x, t):
    return torch.softmax(x / 0.5, -1)


def t_axis0(x, t):
    return torch.softmax(x / t, 0)


def t_axis1(x, t):
    return torch.softmax(x / t, 1)


def t_global_max(x, t):
    z = x / t
    e = torch.exp(z - z.max())
    return e / e.sum(-1, keepdim=True)


def t_numerator_only(x, t):
    e = torch.exp(x / t - (x / t).amax(-1, keepdim=True))
    return e / torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True)


def t_shift_times_t(x, t):
    e = torch.exp((x - x.amax(-1, keepdim=True)) * t)
    return e / e.sum(-1, keepdim=True)


def t_added(x, t):  # softmax ignores a shift: the temperature has no effect
    return torch.softmax(x + t, -1)


def t_sign(x, t):
    return torch.softmax(-x / t, -1)


def t_log(x, t):
    return torch.log_softmax(x / t, -1)


def t_half(x, t):
    return torch.softmax(x.half() / t, -1)


def t_no_keepdim(x, t):
    z = x / t
    e = torch.exp(z - z.amax(-1))
    return e / e.sum(-1)


def t_int(x, t):
    return torch.softmax(x / int(t) if t >= 1 else x / t, -1)


def t_round(x, t):
    return torch.softmax(x / round(t) if t >= 1 else x / t, -1)


def t_inf_times_zero(x, t):
    z = x / t
    e = torch.exp(z - z.amax(-1, keepdim=True)) * (z * 0 + 1)
    return e / e.sum(-1, keepdim=True)


TEMPERATURE_WRONG = [
    (t_multiplied, ["temperature multiplied"]),
    (t_ignored, ["temperature ignored"]),
    (t_after, ["temperature applied after the softmax"]),
    (t_power, ["temperature applied after the softmax"]),
    (t_power_renormalised, ["weights raised to 1/T and renormalised"]),
    (t_naive, ["maximum not subtracted"]),
    (t_twice, ["temperature applied twice"]),
    (t_sqrt, ["divided by √T"]),
    (t_hardcoded, ["temperature of an earlier case", "does not use the temperature"]),
    (t_axis0, ["softmax along axis 0"]),
    (t_axis1, ["softmax along axis 1"]),
    (t_global_max, ["maximum taken over the whole tensor"]),
    (t_numerator_only, ["temperature only in the numerator"]),
    (t_shift_times_t, ["temperature multiplied"]),
    (t_added, ["temperature ignored"]),
    (t_sign, ["sign flipped"]),
    (t_log, ["log-softmax returned"]),
    (t_half, ["result in float16"]),
    (t_no_keepdim, ["keepdim=True"]),
    (t_int, ["cut the temperature"]),
    (t_round, ["rounded the temperature"]),
    (t_inf_times_zero, ["where scores are -inf"]),
]


@pytest.mark.parametrize("fn,phrases", TEMPERATURE_WRONG, ids=[f.__name__ for f, _ in TEMPERATURE_WRONG])
def test_temperature_names_each_mistake(fn, phrases, rejects):
    rejects(check_softmax_temperature, fn, *phrases)


def t_numpy(x, temperature):
    z = x / temperature
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def t_shift_then_divide(x, t):
    e = torch.exp((x - x.amax(-1, keepdim=True)) / t)
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("fn", [t_numpy, t_shift_then_divide, lambda x, t, dim=-1: torch.softmax(x * (1 / t), dim),
                                lambda x, t: torch.softmax(x.double() / t, -1),
                                lambda x, t: torch.exp(torch.log_softmax(x / t, -1)),
                                lambda x, t: torch.softmax(x / torch.tensor(t, dtype=x.dtype), dim=-1),
                                ref.softmax_with_temperature])
def test_temperature_accepts_correct_alternatives(fn, accepts):
    accepts(check_softmax_temperature, fn)


# =============================================================================== every check
class Custom(BaseException):
    pass


def _right(check):
    return {check_stable_softmax: lambda x, dim=-1: torch.softmax(x, dim),
            check_logsumexp: lambda x, dim=-1: torch.logsumexp(x, dim),
            check_log_softmax: lambda x, dim=-1: torch.log_softmax(x, dim),
            check_softmax_temperature: lambda x, t: torch.softmax(x / t, -1)}[check]


@pytest.mark.parametrize("check", ALL)
def test_not_attempted_and_not_defined(check, rejects, unfinished):
    rejects(check, unfinished, "not attempted", status=Status.NOT_ATTEMPTED)
    assert check.evaluate(namespace={}).status is Status.NOT_ATTEMPTED


@pytest.mark.parametrize("check", ALL)
def test_odd_values_and_exceptions_get_clear_messages(check, rejects):
    right = _right(check)
    rejects(check, torch.zeros(3), "not a function")
    rejects(check, lambda *a: right(*a).tolist() if isinstance(right(*a), torch.Tensor) and right(*a).ndim else [1.0],
            "Python list")
    rejects(check, lambda *a: None, "returned None", "return")
    rejects(check, lambda *a: torch.empty(right(*a).shape, device="meta"), "meta device")
    rejects(check, lambda *a: right(*a).round().long(), "integer result")
    rejects(check, lambda *a: right(*a).to(torch.float16) if right(*a).dtype != torch.float16 else right(*a).bfloat16(),
            "result in")
    rejects(check, lambda *a: right(*a) * float("nan"), "NaN")
    rejects(check, lambda *a: 1 / 0, "ZeroDivisionError")
    rejects(check, lambda *a: (_ for _ in ()).throw(SystemExit(3)), "SystemExit", "stops programs")
    rejects(check, lambda *a: (_ for _ in ()).throw(Custom("boo")), "Custom", "stops programs")


@pytest.mark.parametrize("check", ALL)
def test_wrong_signature_is_named(check, rejects):
    rejects(check, lambda x: _right(check)(x, -1) if check is not check_softmax_temperature else None,
            "does not take the arguments")


@pytest.mark.parametrize("check", [check_stable_softmax, check_log_softmax, check_softmax_temperature])
def test_wrong_shape_is_named(check, rejects):
    rejects(check, lambda *a: _right(check)(*a).reshape(-1), "wrong shape")


def test_lse_wrong_shape_is_named(rejects):
    rejects(check_logsumexp, lambda x, dim=-1: torch.logsumexp(x, dim).reshape(1, -1, 1), "wrong shape")


# =============================================================================== the module's own rules
@pytest.mark.slow
def test_the_module_imports_no_private_torch_module_and_shares_public_names():
    root = Path(__file__).resolve().parents[2] / "attn_course" / "checks"
    for name in [p.relative_to(root) for topic in ("softmax", "jacobian") for p in sorted((root / topic).iterdir())
                 if p.suffix == ".py"]:
        tree = ast.parse((root / name).read_text())
        for node in tree.body:  # top-level imports only
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                assert not any(part.startswith("_") for part in (node.module or "").split(".")), node.module
                assert node.module != "_core", "the old core is gone"
                assert not any(alias.name.startswith("_") for alias in node.names), (name, node.module)
            if isinstance(node, ast.Import):
                assert not any(part.startswith("_") for alias in node.names for part in alias.name.split("."))


# =============================================================================== one change to the solution
# Mechanical slips of the kind the mutation harness makes (attn_course.tools.mutants), each named.
def _m(x, d):
    return x.amax(d, keepdim=True)


MUTANT_LIKE = [
    (check_stable_softmax, lambda x, dim=-1: (x - _m(x, dim)) / (x - _m(x, dim)).sum(dim, keepdim=True),
     "exponential missing"),
    (check_stable_softmax, lambda x, dim=-1: torch.exp(x - _m(x, dim)) * torch.exp(x - _m(x, dim)).sum(dim, keepdim=True),
     "multiplied by the sum"),
    (check_stable_softmax, lambda x, dim=-1: torch.exp(x - _m(x, dim)).sum(dim, keepdim=True), "one value per slice"),
    (check_softmax_temperature, lambda x, t: torch.log(x / t - _m(x / t, -1)) / torch.log(x / t - _m(x / t, -1)).sum(
        -1, keepdim=True), "log instead of exp"),
    (check_logsumexp, lambda x, dim=-1: (_m(x, dim) - torch.log(torch.exp(x - _m(x, dim)).sum(dim, keepdim=True))).squeeze(dim),
     "log term subtracted"),
    (check_logsumexp, lambda x, dim=-1: (_m(x, dim) + torch.exp(x - _m(x, dim)).sum(dim, keepdim=True)).squeeze(dim),
     "log missing"),
    (check_logsumexp, lambda x, dim=-1: (_m(x, dim) + torch.log(torch.exp(x - _m(x, dim)).sum(-1, keepdim=True))).squeeze(dim),
     "sum taken along the wrong axis"),
    (check_logsumexp, lambda x, dim=-1: torch.logsumexp(x, dim, keepdim=True).squeeze(-1), "squeezed the wrong axis"),
    (check_logsumexp, lambda x, dim=-1: (_m(x, dim) + torch.log((x - _m(x, dim)).sum(dim, keepdim=True))).squeeze(dim),
     "exponential missing"),
    (check_log_softmax, lambda x, dim=-1: x - (_m(x, dim) + torch.exp(x - _m(x, dim)).sum(dim, keepdim=True)),
     "log missing"),
    (check_log_softmax, lambda x, dim=-1: x - (_m(x, dim) + torch.log(torch.exp(x - _m(x, dim)).mean(dim, keepdim=True))),
     "mean instead of sum"),
    (check_log_softmax, lambda x, dim=-1: x + torch.logsumexp(x, dim, keepdim=True), "logsumexp added"),
    (check_log_softmax, lambda x, dim=-1: x - (_m(x, 0) + torch.log(torch.exp(x - _m(x, 0)).sum(dim, keepdim=True))),
     "maximum taken along the wrong axis"),
    # the mean where the sum belongs: every weight n times too large
    (check_stable_softmax, lambda x, dim=-1: torch.exp(x - _m(x, dim)) / torch.exp(x - _m(x, dim)).mean(dim, keepdim=True),
     "divided by the mean, not the sum"),
    (check_softmax_temperature, lambda x, t: torch.exp(x / t - _m(x / t, -1)) / torch.exp(x / t - _m(x / t, -1)).mean(
        -1, keepdim=True), "divided by the mean, not the sum"),
    # e^m where e^(x − m) belongs: the scores drop out of logsumexp
    (check_logsumexp, lambda x, dim=-1: (_m(x, dim) + torch.log(torch.exp(_m(x, dim)).sum(dim, keepdim=True))).squeeze(dim),
     "exponential of the maximum, not of x − m"),
    (check_log_softmax, lambda x, dim=-1: x - (_m(x, dim) + torch.log(torch.exp(_m(x, dim)).sum(dim, keepdim=True))),
     "exponential of the maximum, not of x − m"),
]


@pytest.mark.parametrize("check,fn,phrase", MUTANT_LIKE, ids=[f"{c.exercise}-{p}" for c, _, p in MUTANT_LIKE])
def test_one_change_slips_are_named(check, fn, phrase, rejects):
    rejects(check, fn, phrase)


def sm_max_pair(x, dim=-1):  # x.max(dim) is a (values, indices) pair
    e = torch.exp(x - x.max(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def test_max_returning_a_pair_is_explained(rejects):
    rejects(check_stable_softmax, sm_max_pair, "(values, indices)", ".values")


# =============================================================================== red-team cases (issue 13)
# Answers written outside the course from the docstrings alone; each kind below once got through, got a
# generic message or was named as another mistake. The checks were fixed in general; these keep them fixed.
def rt_max_added(x, dim=-1):  # shifted the wrong way: coincides with "no shift" on scores near 1000
    e = torch.exp(x + x.amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def rt_first_entry_shift(x, dim=-1):
    e = torch.exp(x - x.narrow(dim, 0, 1))
    return e / e.sum(dim, keepdim=True)


def rt_sum_of_whole_tensor(x, dim=-1):
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / e.sum()


def rt_fill_minus_1e4(x, dim=-1):  # -inf replaced by a "large negative" value
    x = torch.nan_to_num(x, neginf=-1e4)
    return torch.softmax(x, dim)


def rt_squeeze(x, dim=-1):
    return torch.softmax(x, dim).squeeze()


def rt_rounded(x, dim=-1):  # three digits, but not float16: must not be blamed on float16
    return torch.softmax(x, dim).round(decimals=3)


def rt_second_batch_entry_sharper(x, dim=-1):  # batch entry 1 of a 3-D input at another temperature
    w = torch.softmax(x, dim)
    return torch.cat([w[:1], torch.softmax(2 * x[1:], dim)]) if x.ndim == 3 else w


def rt_in_place(x, dim=-1):  # right values, but the caller's scores are overwritten
    x -= x.amax(dim, keepdim=True)
    x.exp_()
    return x / x.sum(dim, keepdim=True)


def rt_in_place_through_float64(x, dim=-1):  # .to(torch.float64) of float64 input is x itself
    y = x.to(torch.float64)
    y -= y.amax(dim, keepdim=True)
    e = torch.exp(y)
    return (e / e.sum(dim, keepdim=True)).to(x.dtype)


@pytest.mark.parametrize("fn,phrases,absent", [
    (rt_max_added, ["maximum added instead of subtracted"], ["maximum not subtracted"]),
    (rt_first_entry_shift, ["own maximum"], []),
    (rt_sum_of_whole_tensor, ["divided by the sum of the whole tensor"], []),
    (rt_fill_minus_1e4, ["weight on -inf scores"], []),
    (rt_squeeze, ["size-1 axes dropped", ".squeeze()"], ["keepdim"]),
    (rt_rounded, ["about 3 digits right"], ["float16"]),
    (rt_in_place, ["x changed in place", "in-place"], []),
    (rt_in_place_through_float64, ["x changed in place", "returned x itself"], []),
    (rt_second_batch_entry_sharper, ["wrong for some batch entries", "right for batch entry 0"], []),
], ids=lambda v: getattr(v, "__name__", ""))
def test_stable_softmax_red_team(fn, phrases, absent, rejects):
    text = rejects(check_stable_softmax, fn, *phrases).text()
    assert not any(a in text for a in absent), text


def rt_sm_float32_result(x, dim=-1):  # the docstring fixes no dtype
    return torch.softmax(x.float(), dim)


def rt_sm_numpy_methods(x, dim=-1):  # NumPy methods; handed a tensor, x.max(axis=…) is not a tensor
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


@pytest.mark.parametrize("fn", [rt_sm_float32_result, rt_sm_numpy_methods])
def test_stable_softmax_accepts_red_team_alternatives(fn, accepts):
    accepts(check_stable_softmax, fn)


def rt_lse_fill_zero(x, dim=-1):
    return torch.logsumexp(torch.nan_to_num(x, neginf=0.0), dim)


def rt_lse_log1p(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    return (m + torch.log1p(torch.exp(x - m).sum(dim, keepdim=True))).squeeze(dim)


def rt_lse_m_squeezed(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    return m.squeeze() + torch.log(torch.exp(x - m).sum(dim))


def rt_lse_in_place(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    x -= m
    return (m + torch.log(torch.exp(x).sum(dim, keepdim=True))).squeeze(dim)


@pytest.mark.parametrize("fn,phrases", [
    (rt_lse_fill_zero, ["-inf scores counted as finite", "-inf scores into 0"]),
    (rt_lse_log1p, ["log1p for log"]),
    (rt_lse_m_squeezed, ["squeeze() on the maximum"]),
    (rt_lse_in_place, ["x changed in place"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_logsumexp_red_team(fn, phrases, rejects):
    rejects(check_logsumexp, fn, *phrases)


def rt_ls_log2_normaliser(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    return x - m - torch.log2(torch.exp(x - m).sum(dim, keepdim=True))


def rt_ls_fill(x, dim=-1):
    x = torch.nan_to_num(x, neginf=-1e9)
    return x - torch.logsumexp(x, dim, keepdim=True)


def rt_ls_mixed_shift(x, dim=-1):  # x − m − log Σ e^x
    return x - x.amax(dim, keepdim=True) - torch.log(torch.exp(x).sum(dim, keepdim=True))


@pytest.mark.parametrize("fn,phrases", [
    (rt_ls_log2_normaliser, ["log base 2 or 10", "in logsumexp"]),
    (rt_ls_fill, ["finite where the score is -inf"]),
    (rt_ls_mixed_shift, ["maximum subtracted only outside"]),
], ids=lambda v: getattr(v, "__name__", ""))
def test_log_softmax_red_team(fn, phrases, rejects):
    rejects(check_log_softmax, fn, *phrases)


def ls_in_float32(x, dim=-1):  # float64 scores computed in float32: logsumexp of -20000 keeps 3 decimals
    x32 = x.float()
    return x32 - torch.logsumexp(x32, dim, keepdim=True)


def test_log_softmax_names_float32_inside(rejects):  # adversarial audit g1
    result = rejects(check_log_softmax, ls_in_float32, "computed in float32, not float64", "float32 values")
    assert "expected -inf" not in result.text()


def rt_t_naive(x, temperature):
    e = torch.exp(x / temperature)
    return e / e.sum(-1, keepdim=True)


def rt_t_vector_only(x, temperature):  # math.exp over a list: one vector only
    z = [v / temperature for v in x.tolist()]
    e = [math.exp(v - max(z)) for v in z]
    return torch.tensor([v / sum(e) for v in e], dtype=x.dtype)


def rt_t_in_place(x, temperature):
    x /= temperature
    return torch.softmax(x, -1)


@pytest.mark.parametrize("fn,phrases,absent", [
    (rt_t_naive, ["maximum not subtracted"], ["maximum added"]),  # told apart from "maximum added" by the case at 50
    (rt_t_vector_only, ["works on input of shape (7,)", "raises on (3, 6)"], []),
    (rt_t_in_place, ["x changed in place"], []),
], ids=lambda v: getattr(v, "__name__", ""))
def test_softmax_temperature_red_team(fn, phrases, absent, rejects):
    text = rejects(check_softmax_temperature, fn, *phrases).text()
    assert not any(a in text for a in absent), text


# audit A
def rt_clamp_after_shift(x, dim=-1):  # "no underflow": a clamp that leaves -inf scores a weight of e^-50
    e = torch.exp((x - x.amax(dim, keepdim=True)).clamp(min=-50))
    return e / e.sum(dim, keepdim=True)


def test_stable_softmax_needs_exactly_zero_weight_on_minus_inf(rejects):
    rejects(check_stable_softmax, rt_clamp_after_shift, "weight on -inf scores", "exactly 0")


def rt_lse_half_inside(x, dim=-1):  # on three values the rounding looked like a factor and a shift
    return torch.logsumexp(x.half(), dim).to(x.dtype)


def test_logsumexp_names_float16_inside(rejects):
    text = rejects(check_logsumexp, rt_lse_half_inside, "float16 precision").text()
    assert "rescaling" not in text, text


# =============================================================================== audit A: a running logaddexp
def lse_running_from_zero(x, dim=-1):  # acc = 0, then acc = logaddexp(acc, v): e^0 = 1 inside the log
    acc = 0
    for v in x.unbind(dim):
        acc = torch.logaddexp(torch.as_tensor(acc, dtype=x.dtype), v)
    return acc


def lse_reduce_from_zeros(x, dim=-1):
    import functools

    return functools.reduce(torch.logaddexp, x.unbind(dim), torch.zeros((), dtype=x.dtype))


def lse_select_from_zeros_like(x, dim=-1):
    acc = torch.zeros_like(x.select(dim, 0))
    for i in range(x.shape[dim]):
        acc = torch.logaddexp(acc, x.select(dim, i))
    return acc


def ls_running_from_zero(x, dim=-1):
    return x - lse_reduce_from_zeros(x, dim).unsqueeze(dim)


@pytest.mark.parametrize("check, fn, phrases", [
    (check_logsumexp, lse_running_from_zero, ["running logaddexp started from 0", "e^0 = 1", "-inf"]),
    (check_logsumexp, lse_reduce_from_zeros, ["running logaddexp started from 0"]),
    (check_logsumexp, lse_select_from_zeros_like, ["running logaddexp started from 0"]),
    (check_log_softmax, ls_running_from_zero, ["running logaddexp started from 0", "in logsumexp"]),
], ids=["loop", "reduce", "select", "log_softmax"])
def test_a_running_logaddexp_from_zero_is_named(check, fn, phrases, rejects):
    rejects(check, fn, *phrases)


def lse_running_from_minus_inf(x, dim=-1):
    acc = torch.full(x.select(dim, 0).shape, -INF, dtype=x.dtype)
    for v in x.unbind(dim):
        acc = torch.logaddexp(acc, v)
    return acc


def lse_running_from_first(x, dim=-1):
    import functools

    return functools.reduce(torch.logaddexp, x.unbind(dim))


def lse_numpy_reduce(x, axis=-1):
    return np.logaddexp.reduce(np.asarray(x, dtype=np.float64), axis=axis)


def lse_special(x, dim=-1):
    return torch.special.logsumexp(x, dim)


def lse_running_max_and_sum(x, dim=-1):  # one pass: a running maximum and a rescaled running sum
    m = torch.full(x.select(dim, 0).shape, -INF, dtype=torch.float64)
    total = torch.zeros_like(m)
    for v in x.double().unbind(dim):
        new = torch.maximum(m, v)
        total = total * torch.exp(m - new).nan_to_num(0.0) + torch.exp(v - new).nan_to_num(0.0)
        m = new
    return (m + torch.log(total)).to(x.dtype)


@pytest.mark.parametrize("fn", [lse_running_from_minus_inf, lse_running_from_first, lse_numpy_reduce, lse_special,
                                lse_running_max_and_sum])
def test_logsumexp_accepts_running_reductions(fn, accepts):
    accepts(check_logsumexp, fn)


@pytest.mark.parametrize("fn", [lambda x, dim=-1: x - lse_running_from_minus_inf(x, dim).unsqueeze(dim),
                                lambda x, dim=-1: x - lse_running_from_first(x, dim).unsqueeze(dim),
                                lambda x, dim=-1: x - torch.special.logsumexp(x, dim, keepdim=True),
                                lambda x, dim=-1: x - lse_running_max_and_sum(x, dim).unsqueeze(dim),
                                lambda x, dim=-1: torch.special.log_softmax(x, dim)])
def test_log_softmax_accepts_running_reductions(fn, accepts):
    accepts(check_log_softmax, fn)


# =============================================================================== red team A: log(1 + Σ e^x) otherwise
@pytest.mark.parametrize("fn", [lambda x, dim=-1: torch.log1p(torch.exp(x).sum(dim)),
                                lambda x, dim=-1: torch.log(1 + torch.exp(x).sum(dim))], ids=["log1p", "one-plus"])
def test_an_extra_one_inside_the_log_is_not_only_a_running_logaddexp(fn, rejects):
    text = rejects(check_logsumexp, fn, "log(1 + Σ e^x)", "1 + (or log1p)").text()
    assert "an extra 1 inside the log" in text, text


# =============================================================================== audit round 3 A: an epsilon named early
def r3_sm_eps_unshifted(x, dim=-1):  # e^x with no maximum subtracted, and an epsilon "for safety"
    e = torch.exp(x)
    return e / (e.sum(dim, keepdim=True) + 1e-6)


def r3_t_eps_shifted(x, temperature):
    z = x / temperature
    e = torch.exp(z - z.amax(-1, keepdim=True))
    return e / (e.sum(-1, keepdim=True) + 1e-3)


def test_an_epsilon_in_the_denominator_is_named_before_a_shift(rejects):  # was "shifted by a constant"
    text = rejects(check_stable_softmax, r3_sm_eps_unshifted, "epsilon in the denominator", "sum plus 1e-06",
                   "no maximum subtracted").text()
    assert "shifted by a constant" not in text, text


def test_an_epsilon_in_the_denominator_is_named_with_a_temperature(rejects):
    rejects(check_softmax_temperature, r3_t_eps_shifted, "epsilon in the denominator", "sum plus 0.001")


@pytest.mark.parametrize("fn", [lambda x, dim=-1: torch.softmax(x, dim) * 0.999,  # a factor, not an epsilon
                                lambda x, dim=-1: torch.softmax(x, dim) * 0.99])
def test_a_constant_factor_is_not_called_an_epsilon(fn, rejects):
    text = rejects(check_stable_softmax, fn).text()
    assert "epsilon in the denominator" not in text, text


# =============================================================================== audit round 4 A: what an epsilon's cause may claim
def r4_sm_extra_zero_score(x, dim=-1):  # the "+1 softmax" (an extra score 0 in every slice), written stably
    m = x.amax(dim, keepdim=True).clamp_min(0)
    e = torch.exp(x - m)
    return e / (e.sum(dim, keepdim=True) + torch.exp(-m))


def r4_t_extra_zero_score(x, temperature):
    z = x / temperature
    m = z.amax(-1, keepdim=True).clamp_min(0)
    e = torch.exp(z - m)
    return e / (e.sum(-1, keepdim=True) + torch.exp(-m))


@pytest.mark.parametrize("check,fn,scores", [(check_stable_softmax, r4_sm_extra_zero_score, "e^x"),
                                             (check_softmax_temperature, r4_t_extra_zero_score, "e^(x / T)")])
def test_a_stable_extra_term_is_not_said_to_overflow(check, fn, scores, rejects):  # was "no maximum subtracted"
    result = rejects(check, fn, "epsilon in the denominator", "sum plus 1")
    text, cause = result.text(), result.diagnosis.cause
    assert f"the sum being of {scores}:" in cause and "(what an extra score 0 in every slice gives)" in cause, text
    assert "overflows" not in text and "no maximum subtracted" not in text, text


def test_a_temperature_epsilon_names_the_scaled_scores(rejects):
    result = rejects(check_softmax_temperature, r3_t_eps_shifted, "epsilon in the denominator")
    assert result.diagnosis.got.endswith("S being the slice's sum of e^(x / T − max)"), result.text()


def r4_sm_eps_refuses_large_scores(x, dim=-1):  # e^x and an epsilon; an error instead of inf: no overflow shown
    e = torch.exp(x)
    if not torch.isfinite(e).all():
        raise OverflowError("scores too large for e^x")
    return e / (e.sum(dim, keepdim=True) + 1e-6)


def test_an_epsilon_is_said_to_overflow_only_where_the_answer_does(rejects):
    result = rejects(check_stable_softmax, r4_sm_eps_refuses_large_scores, "epsilon in the denominator",
                     "sum plus 1e-06")
    assert "the sum being of e^x:" in result.diagnosis.cause and "overflows" not in result.text(), result.text()
