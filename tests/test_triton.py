"""The course's Triton kernels (attn_course.triton_attention): the forward (notebook 09) and the backward
(notebook 10). Triton is optional: without it these tests skip and say why.

With Triton installed and no GPU, the kernels run on the CPU through Triton's interpreter
(TRITON_INTERPRET=1, set by the ``device`` fixture) in float32, against float64
F.scaled_dot_product_attention and autograd through it: causal and not, n not a multiple of the
block, d_head = 64 and 128. CI installs Triton in a step of its own for this (.ci/run). On a CUDA GPU
the same tests run natively in float16 and bfloat16 (scripts/gpu_finale.py runs them there).
"""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from attn_course import triton_attention

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(
    not HAS_TRITON, reason="Triton is not installed (optional, ~1 GB: `pip install -e .[gpu-dev]`); only these "
                           "kernel tests need it, and CI runs them in a step of its own (.ci/run)")
GPU = torch.cuda.is_available()
#: dtype → (forward: max |error| vs float64; gradients: max |error| relative to the largest |reference|).
TOLERANCE = {torch.float32: (2e-5, 1e-4), torch.float16: (1e-2, 2e-2), torch.bfloat16: (3e-2, 6e-2)}
DTYPES = [torch.float16, torch.bfloat16] if GPU else [torch.float32]
#: (n, d_head): n is never a multiple of the blocks (16 in the interpreter, 32-128 on a GPU).
SHAPES = [(1000, 64), (1027, 128)] if GPU else [(37, 64), (50, 128)]
HEADS = (2, 4) if GPU else (1, 2)  # (B, A)


@pytest.fixture
def device():
    """'cuda' on a GPU; else 'cpu' when Triton's interpreter is on (TRITON_INTERPRET=1 set before Python
    started: Triton reads it when it is first imported, so it cannot be switched on from inside a test)."""
    if not HAS_TRITON:
        pytest.skip(needs_triton.kwargs["reason"])
    if GPU:
        return "cuda"
    if not triton_attention._interpreting():
        pytest.skip("no CUDA GPU, and Triton's CPU interpreter is off: run with TRITON_INTERPRET=1 in the "
                    "environment (as CI's Triton step does) to test the kernels on the CPU")
    return "cpu"


def _inputs(n, d, dtype, device, count=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*HEADS, n, d, generator=g).to(device=device, dtype=dtype) for _ in range(count)]


def _sdpa64(q, k, v, dout, causal):
    """Float64 output and gradients: autograd through F.scaled_dot_product_attention (the oracle)."""
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    return out.detach(), torch.autograd.grad(out, leaves, dout.double())


@pytest.mark.slow  # a fresh process, kernel or fork server: seconds
def test_nothing_else_in_the_course_imports_triton():
    code = ("import sys, attn_course, attn_course.fast, attn_course.benchmark, attn_course.timing, "
            "attn_course.results, attn_course.tools.bench, attn_course.triton_attention, attn_course.checks.fast; "
            "attn_course.triton_attention.kernel_source('backward'); print('triton' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"


def test_the_kernel_sources_are_readable_without_triton():
    forward = triton_attention.kernel_source()
    assert forward.startswith("@triton.jit\ndef flash_attention_forward(")
    assert "exp2" in forward and "tl.dot" in forward and "tl.store(Lse" in forward
    assert "@triton.jit" not in forward[1:] and "return {" not in forward
    backward = triton_attention.kernel_source("backward")
    assert backward.count("@triton.jit") == 2
    assert backward.index("def flash_attention_backward_dk_dv(") < backward.index("def flash_attention_backward_dq(")
    for name in triton_attention.KERNELS:
        assert triton_attention.kernel_source(name).splitlines()[1].startswith(f"def {name}(")
    with pytest.raises(ValueError, match="unknown kernel"):
        triton_attention.kernel_source("flash_attention_sideways")


def test_without_a_gpu_the_kernel_explains_why_it_cannot_run(monkeypatch):
    # As if TRITON_INTERPRET were unset (unsetting it here would import Triton in the wrong mode).
    monkeypatch.setattr(triton_attention, "_interpreting", lambda: False)
    reason = triton_attention.unavailable_reason("cpu")
    assert reason and ("Triton" in reason)
    q = torch.zeros(1, 1, 16, 16)
    with pytest.raises(RuntimeError, match="Triton attention unavailable"):
        triton_attention.attention(q, q, q)
    with pytest.raises(RuntimeError, match="Triton attention unavailable"):
        triton_attention.flash_attention(q, q, q)


def test_kernel_rejects_shapes_it_cannot_handle(device):
    q = torch.zeros(1, 1, 8, 24, device=device)  # head dim not a power of two
    with pytest.raises(ValueError, match="power of two"):
        triton_attention.attention(q, q, q)
    with pytest.raises(ValueError, match="same shape"):
        triton_attention.attention(*(torch.zeros(1, 1, n, 16, device=device) for n in (8, 9, 9)))
    with pytest.raises(ValueError, match="lse"):
        triton_attention.backward(q[..., :16], q[..., :16], q[..., :16], q[..., :16], torch.zeros(1, 1, 9), q[..., :16])


@pytest.mark.slow  # the interpreter runs each program in Python: seconds per case
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n, d", SHAPES)
def test_forward_matches_float64_sdpa_and_stores_the_logsumexp(device, n, d, causal, dtype):
    q, k, v = _inputs(n, d, dtype, device)
    out, lse = triton_attention.forward(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    assert (out.double() - want).abs().max().item() < TOLERANCE[dtype][0]
    scores = q.double() @ k.double().transpose(-2, -1) / d**0.5  # (B, A, n, n)
    if causal:
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=device).triu(1), float("-inf"))
    assert (lse.double() - torch.logsumexp(scores, dim=-1)).abs().max().item() < 10 * TOLERANCE[dtype][0]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n, d", SHAPES)
def test_backward_matches_autograd_through_float64_sdpa(device, n, d, causal, dtype):
    q, k, v, dout = _inputs(n, d, dtype, device, count=4, seed=1)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = triton_attention.flash_attention(*leaves, causal=causal)
    grads = torch.autograd.grad(out, leaves, dout)
    want_out, want_grads = _sdpa64(q, k, v, dout, causal)
    fwd_tol, grad_tol = TOLERANCE[dtype]
    assert (out.double() - want_out).abs().max().item() < fwd_tol
    for name, got, want in zip(("dq", "dk", "dv"), grads, want_grads):
        assert got.shape == want.shape and got.dtype == dtype, name
        error = (got.double() - want).abs().max().item()
        assert error < grad_tol * want.abs().max().item(), f"{name}: max |error| {error:.3g}"


@pytest.mark.slow
@pytest.mark.skipif(GPU, reason="block sizes the GPU choice never uses: an interpreter-only case")
def test_backward_with_unequal_blocks_starts_each_causal_loop_at_the_diagonal(device):
    # dK/dV with query blocks of 16 and key blocks of 32 (and dQ the other way round): the causal start
    # (block_n · BLOCK_N // BLOCK_M) · BLOCK_M and stop min((block_m + 1) · BLOCK_M, n) are exercised.
    n, d = 70, 64
    q, k, v, dout = _inputs(n, d, torch.float32, device, count=4, seed=2)
    o, lse = triton_attention.forward(q, k, v, causal=True, block_m=32, block_n=16)
    for blocks in ({"dk_dv": (16, 32), "dq": (32, 16)}, {"dk_dv": (32, 16), "dq": (16, 32)}):
        grads = triton_attention.backward(q, k, v, o, lse, dout, causal=True, blocks=blocks)
        _, want = _sdpa64(q, k, v, dout, True)
        for got, w in zip(grads, want):
            assert (got.double() - w).abs().max().item() < 1e-4 * w.abs().max().item()


@pytest.mark.slow
@pytest.mark.skipif(GPU, reason="float16 in the interpreter: the GPU runs float16 in the tests above")
def test_forward_in_float16_in_the_interpreter(device):
    q, k, v = _inputs(40, 64, torch.float16, device)
    out = triton_attention.attention(q, k, v, causal=True)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert out.dtype == torch.float16 and (out.double() - want).abs().max().item() < 2e-3
