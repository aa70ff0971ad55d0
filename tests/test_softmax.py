"""Notebook 03: the reference softmax family agrees with PyTorch, and each check rejects its pitfalls
with the right diagnosis while accepting correct alternatives (tensors or NumPy, keepdim styles,
float32/float64)."""

import numpy as np
import pytest
import torch

from attn_course import softmax as ref
from attn_course.checks._core import CheckFailed, NotAttempted
from attn_course.checks.softmax import (
    check_log_softmax,
    check_logsumexp,
    check_softmax_temperature,
    check_stable_softmax,
)
from checking import rejects, accepts

torch.manual_seed(0)


# ---------------------------------------------------------------- reference vs PyTorch

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_reference_softmax_family_matches_torch(dtype, dim):
    x = 3 * torch.randn(4, 5, 6, dtype=dtype)
    torch.testing.assert_close(ref.softmax(x, dim), torch.softmax(x, dim))
    torch.testing.assert_close(ref.logsumexp(x, dim), torch.logsumexp(x, dim))
    torch.testing.assert_close(ref.logsumexp(x, dim, keepdim=True), torch.logsumexp(x, dim, keepdim=True))
    torch.testing.assert_close(ref.log_softmax(x, dim), torch.log_softmax(x, dim))
    torch.testing.assert_close(ref.softmax_with_temperature(x, 0.3, dim), torch.softmax(x / 0.3, dim))


def test_reference_is_stable_where_the_naive_formula_breaks():
    x = torch.tensor([[1000.0, 1001.0, 1002.0], [-1000.0, -999.0, -998.0]])
    assert torch.isnan(ref.naive_softmax(x)).all()
    torch.testing.assert_close(ref.softmax(x), torch.softmax(x, -1))
    torch.testing.assert_close(ref.logsumexp(x), torch.logsumexp(x, -1))
    tiny = torch.tensor([0.0, -1000.0, 5.0])
    assert torch.isneginf(torch.log(ref.softmax(tiny))).any()
    torch.testing.assert_close(ref.log_softmax(tiny), torch.log_softmax(tiny, -1))


def test_reference_accepts_numpy_and_returns_numpy():
    x = np.random.default_rng(0).normal(size=(3, 4))
    out = ref.softmax(x, 0)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, torch.softmax(torch.from_numpy(x), 0).numpy())
    np.testing.assert_allclose(ref.logsumexp(x, 1), torch.logsumexp(torch.from_numpy(x), 1).numpy())
    np.testing.assert_allclose(ref.log_softmax(x, -1), torch.log_softmax(torch.from_numpy(x), -1).numpy())


def test_reference_handles_masked_rows_like_torch():
    x = torch.tensor([[0.0, -float("inf"), 1.0], [-float("inf")] * 3])
    torch.testing.assert_close(ref.softmax(x), torch.softmax(x, -1), equal_nan=True)
    torch.testing.assert_close(ref.logsumexp(x), torch.logsumexp(x, -1))


def test_temperature_figures_build():
    import matplotlib.pyplot as plt

    fig = ref.temperature_sweep_figure(torch.tensor([2.0, 1.0, 0.1, -1.0]), labels=list("abcd"))
    assert len(fig.axes) == 5
    static = ref.temperature_explorer(torch.tensor([2.0, 1.0, 0.1]))  # no kernel: a static figure
    assert isinstance(static, plt.Figure)
    plt.close("all")
    with pytest.raises(ValueError):
        ref.softmax_with_temperature(torch.zeros(3), 0.0)


# ---------------------------------------------------------------- stable_softmax

def naive(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim, keepdim=True)


def global_max(x, dim=-1):
    e = torch.exp(x - x.max())
    return e / e.sum(dim, keepdim=True)


def global_max_eps(x, dim=-1):  # the same mistake, hidden behind an epsilon: rows of zeros
    e = torch.exp(x - x.max())
    return e / (e.sum(dim, keepdim=True) + 1e-9)


def wrong_axis(x, dim=-1):
    return torch.softmax(x, 0 if x.dim() > 1 else -1)


def ignores_dim(x, dim=-1):
    return torch.softmax(x, -1)


def plain_normalisation(x, dim=-1):
    return x / x.sum(dim, keepdim=True)


@pytest.mark.parametrize(
    "fn, phrase",
    [
        (naive, "maximum was not subtracted"),
        (global_max, "over the whole tensor"),
        (global_max_eps, "over the whole tensor"),
        (wrong_axis, "wrong axis"),
        (ignores_dim, "wrong axis"),
        (plain_normalisation, "without exponentiating"),
    ],
)
def test_stable_softmax_names_each_pitfall(fn, phrase):
    rejects(check_stable_softmax, fn, phrase)


def keepdim_values(x, dim=-1):
    shifted = x - x.max(dim, keepdim=True).values
    e = shifted.exp()
    return e / e.sum(dim, keepdim=True)


def unsqueeze_style(x, dim=-1):
    e = torch.exp(x - x.amax(dim).unsqueeze(dim))
    return e / e.sum(dim).unsqueeze(dim)


def numpy_only(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def in_float64(x, dim=-1):
    return torch.softmax(x.double(), dim)


def via_logsumexp(x, dim=-1):
    return torch.exp(x - torch.logsumexp(x, dim, keepdim=True))


@pytest.mark.parametrize("fn", [keepdim_values, unsqueeze_style, numpy_only, in_float64, via_logsumexp, ref.softmax])
def test_stable_softmax_accepts_correct_alternatives(fn, capsys):
    accepts(check_stable_softmax, fn, capsys)


def test_numpy_only_function_is_reported_as_numpy(capsys):
    check_stable_softmax(numpy_only)
    assert "NumPy arrays" in capsys.readouterr().out


# ---------------------------------------------------------------- logsumexp

def lse_naive(x, dim=-1):
    return torch.log(torch.exp(x).sum(dim))


def lse_no_add_back(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    return torch.log(torch.exp(x - m).sum(dim))


def lse_global_max(x, dim=-1):
    return x.max() + torch.log(torch.exp(x - x.max()).sum(dim))


def lse_wrong_axis(x, dim=-1):
    return torch.logsumexp(x, 0 if x.dim() > 1 and dim != 0 else -1)


@pytest.mark.parametrize(
    "fn, phrase",
    [
        (lse_naive, "computed directly"),
        (lse_no_add_back, "not added back"),
        (lse_global_max, "over the whole tensor"),
        (lse_wrong_axis, "wrong axis"),
    ],
)
def test_logsumexp_names_each_pitfall(fn, phrase):
    rejects(check_logsumexp, fn, phrase)


def lse_keepdim(x, dim=-1):
    return torch.logsumexp(x, dim, keepdim=True)


def lse_numpy(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.sum(np.exp(x - m), axis=axis))


@pytest.mark.parametrize("fn", [lse_keepdim, lse_numpy, lambda x, dim=-1: torch.logsumexp(x.double(), dim), ref.logsumexp])
def test_logsumexp_accepts_correct_alternatives(fn, capsys):
    accepts(check_logsumexp, fn, capsys)


# ---------------------------------------------------------------- log_softmax

def log_of_softmax(x, dim=-1):
    return torch.log(torch.softmax(x, dim))


def log_naive(x, dim=-1):
    return x - torch.log(torch.exp(x).sum(dim, keepdim=True))


def no_keepdim(x, dim=-1):
    return x - torch.logsumexp(x, dim)


def log_wrong_axis(x, dim=-1):
    return torch.log_softmax(x, 0 if x.dim() > 1 and dim != 0 else -1)


@pytest.mark.parametrize(
    "fn, phrase",
    [
        (log_of_softmax, "log(softmax(x))"),
        (log_naive, "maximum was not subtracted"),
        (no_keepdim, "without keepdim"),
        (log_wrong_axis, "wrong axis"),
    ],
)
def test_log_softmax_names_each_pitfall(fn, phrase):
    rejects(check_log_softmax, fn, phrase)


def log_of_softmax_float64_clamped(x, dim=-1):  # log of a clamped softmax: still loses the tail
    return torch.log(torch.softmax(x, dim).clamp_min(1e-30))


def test_log_softmax_rejects_clamped_log_of_softmax():
    message = rejects(check_log_softmax, log_of_softmax_float64_clamped, "does not match")
    assert "tiny probabilities" in message


def log_numpy(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))


@pytest.mark.parametrize(
    "fn",
    [log_numpy, lambda x, dim=-1: x - torch.logsumexp(x, dim, keepdim=True),
     lambda x, dim=-1: torch.log_softmax(x.double(), dim), ref.log_softmax],
)
def test_log_softmax_accepts_correct_alternatives(fn, capsys):
    accepts(check_log_softmax, fn, capsys)


# ---------------------------------------------------------------- temperature

@pytest.mark.parametrize(
    "fn, phrase",
    [
        (lambda x, t: torch.softmax(x * t, -1), "multiplied by the temperature"),
        (lambda x, t: torch.softmax(x, -1), "no effect"),
        (lambda x, t: torch.softmax(x, -1) / t, "after the softmax"),
        (lambda x, t: naive(x / t), "no maximum was subtracted"),
    ],
)
def test_temperature_names_each_pitfall(fn, phrase):
    rejects(check_softmax_temperature, fn, phrase)


def temperature_numpy(x, temperature):
    z = x / temperature
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize(
    "fn",
    [temperature_numpy, lambda x, t: torch.softmax(x.double() / t, -1), lambda x, t, dim=-1: torch.softmax(x * (1 / t), dim),
     ref.softmax_with_temperature],
)
def test_temperature_accepts_correct_alternatives(fn, capsys):
    accepts(check_softmax_temperature, fn, capsys)


# ---------------------------------------------------------------- every check: unfinished, wrong type, wrong shape, NaN

def unfinished(*args, **kwargs):
    raise NotImplementedError()


ALL_CHECKS = [check_stable_softmax, check_logsumexp, check_log_softmax, check_softmax_temperature]


@pytest.mark.parametrize("check", ALL_CHECKS)
def test_unfinished_is_not_attempted(check):
    with pytest.raises(NotAttempted, match="not attempted"):
        check(unfinished)


@pytest.mark.parametrize("check", ALL_CHECKS)
def test_non_callable_gets_a_clear_message(check):
    with pytest.raises(CheckFailed, match="Pass the function itself"):
        check(torch.zeros(3))


@pytest.mark.parametrize("check", ALL_CHECKS)
def test_list_result_gets_a_clear_message(check):
    with pytest.raises(CheckFailed, match="Python list"):
        check(lambda x, *a: x.tolist())


@pytest.mark.parametrize("check", [check_stable_softmax, check_log_softmax, check_softmax_temperature])
def test_wrong_shape_gets_a_clear_message(check):
    with pytest.raises(CheckFailed, match="has shape"):
        check(lambda x, *a: x.reshape(-1))


def test_logsumexp_wrong_shape_gets_a_clear_message():
    with pytest.raises(CheckFailed, match="has shape"):
        check_logsumexp(lambda x, dim=-1: torch.logsumexp(x, dim).reshape(1, -1, 1))


@pytest.mark.parametrize("check", ALL_CHECKS)
def test_nan_result_gets_a_clear_message(check):
    with pytest.raises(CheckFailed, match="NaN"):
        check(lambda x, *a: torch.full_like(x, float("nan")) if check is not check_logsumexp
              else torch.full_like(torch.logsumexp(x, a[0] if a else -1), float("nan")))


@pytest.mark.parametrize("check", ALL_CHECKS)
def test_exception_in_learner_code_is_reported(check):
    def broken(x, *args):
        raise ValueError("boom")

    with pytest.raises(CheckFailed, match="raised ValueError: boom"):
        check(broken)


def missing_keepdim(x, dim=-1):
    e = torch.exp(x - x.amax(dim))  # (3, 5) - (3,) cannot broadcast
    return e / e.sum(dim)


def test_missing_keepdim_that_crashes_gets_the_keepdim_hint():
    rejects(check_stable_softmax, missing_keepdim, "keepdim=True")


def test_reference_entropy():
    w = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(ref.entropy(w), torch.tensor([np.log(4.0), 0.0], dtype=torch.float64))
