"""attn_course.jacobian (notebook 04): the reference Jacobian, VJP and autograd Function agree with
torch.autograd; the saturation sweep measures what notebook 04 says; its figure is readable."""

import matplotlib.pyplot as plt
import pytest
import torch

from attn_course import jacobian as ref
from attn_course import plots


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_jacobian_matches_autograd_batched(dtype):
    x = torch.randn(2, 3, 5, dtype=dtype, generator=torch.Generator().manual_seed(0))
    s = torch.softmax(x, -1)
    J = ref.softmax_jacobian(s)
    assert J.shape == (2, 3, 5, 5)
    for b in range(2):
        for h in range(3):
            oracle = torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), x[b, h])
            torch.testing.assert_close(J[b, h], oracle)


def test_jacobian_properties():
    s = torch.softmax(torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)), -1)
    J = ref.softmax_jacobian(s)
    torch.testing.assert_close(J.sum(-1), torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(J, J.T)
    assert torch.linalg.eigvalsh(J).min() > -1e-12
    assert torch.linalg.matrix_rank(J) == 5


def test_vjp_backward_and_function_match_autograd():
    g_ = torch.Generator().manual_seed(2)
    x = torch.randn(4, 7, dtype=torch.float64, generator=g_).requires_grad_(True)
    g = torch.randn(4, 7, dtype=torch.float64, generator=g_)
    (oracle,) = torch.autograd.grad(torch.softmax(x, -1), x, g)
    s = torch.softmax(x.detach(), -1)
    torch.testing.assert_close(ref.softmax_vjp(s, g), oracle)
    torch.testing.assert_close(ref.jacobian_backward(s, g), oracle)
    (mine,) = torch.autograd.grad(ref.softmax_fn(x), x, g)
    torch.testing.assert_close(mine, oracle)
    assert torch.autograd.gradcheck(ref.SoftmaxFunction.apply, (x,))


def test_function_forward_is_stable():
    x = torch.tensor([[1000.0, 1001.0, 1002.0], [-1000.0, -999.0, -998.0]])
    torch.testing.assert_close(ref.softmax_fn(x), torch.softmax(x, -1))


def test_saturation_sweep_tells_the_notebooks_story():
    factors = [0.25, 1, 4, 16, 64]
    stats = ref.saturation_sweep(factors)
    peak, grad, share = stats["peak"], stats["grad_scores"], stats["top2_share"]
    assert peak == sorted(peak) and peak[-1] > 0.95  # the weights saturate
    assert grad[-1] < grad[1] / 5  # the gradient with respect to the scores shrinks
    assert share == sorted(share) and share[-1] > 0.9  # and what is left goes to the top two keys
    # the means are what the docstring says they are
    g = torch.Generator().manual_seed(2)
    base = torch.randn(512, 16, generator=g, dtype=torch.float64)
    upstream = torch.randn(512, 16, generator=g, dtype=torch.float64)
    s = torch.softmax(4 * base, -1)
    x = torch.log(s).requires_grad_(True)
    (dx,) = torch.autograd.grad(torch.softmax(x, -1), x, upstream)
    assert stats["grad_scores"][2] == pytest.approx(dx.norm(dim=-1).mean().item())
    assert stats["peak"][2] == pytest.approx(s.max(-1).values.mean().item())


@pytest.mark.slow
def test_saturation_figure_is_readable():
    factors = [0.25, 1, 4, 16, 64]
    fig = ref.saturation_figure(factors, ref.saturation_sweep(factors))
    try:
        assert plots.readability_problems(fig) == []
        assert fig.axes[0].get_ylabel() == "mean largest weight"
    finally:
        plt.close(fig)
