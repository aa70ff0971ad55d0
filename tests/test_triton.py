"""The course's Triton kernel. Triton is optional: without it these tests skip and say why. With it
installed, the kernel's correctness is checked on the CPU through Triton's interpreter
(TRITON_INTERPRET=1), against F.scaled_dot_product_attention in float64; on a CUDA GPU it is also
checked natively in float16."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from attn_course import triton_attention

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (optional: `pip install triton`); "
                                                          "the kernel's tests need it, nothing else does")


@pytest.mark.slow  # a fresh process, kernel or fork server: seconds
def test_nothing_else_in_the_course_imports_triton():
    code = ("import sys, attn_course, attn_course.fast, attn_course.benchmark, attn_course.timing, "
            "attn_course.tools.bench, attn_course.triton_attention, attn_course.checks.fast; "
            "attn_course.triton_attention.kernel_source(); print('triton' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"


def test_the_kernel_source_is_readable_without_triton():
    source = triton_attention.kernel_source()
    assert source.startswith("@triton.jit\ndef flash_attention_forward(")
    assert "exp2" in source and "tl.dot" in source and "return" not in source.splitlines()[-1]


def test_without_a_gpu_the_kernel_explains_why_it_cannot_run(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reason = triton_attention.unavailable_reason("cpu")
    assert reason and ("Triton" in reason)
    q = torch.zeros(1, 1, 16, 16)
    with pytest.raises(RuntimeError, match="Triton attention unavailable"):
        triton_attention.attention(q, q, q)


def _interpreter_run(shape, causal, dtype="float32"):
    """Run the kernel under TRITON_INTERPRET=1 in a fresh process (the flag is read when the kernel
    is defined); return its maximum error against float64 SDPA."""
    code = f"""
import torch, torch.nn.functional as F
from attn_course import triton_attention
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn({shape}, generator=g).to(torch.{dtype}) for _ in range(3))
out = triton_attention.attention(q, k, v, causal={causal})
ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal={causal})
assert out.shape == q.shape and out.dtype == q.dtype
print((out.double() - ref).abs().max().item())
"""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        pytest.fail("the Triton interpreter could not run the kernel on this CPU:\n" + "\n".join(tail))
    return float(done.stdout.strip().splitlines()[-1])


@needs_triton
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 37, 16), (2, 2, 50, 32)])
def test_kernel_matches_sdpa_in_the_interpreter(shape, causal):
    # 37 and 50 are not multiples of the 16-row blocks: the masked loads and stores are exercised.
    assert _interpreter_run(shape, causal) < 1e-5


@needs_triton
def test_kernel_in_float16_in_the_interpreter():
    assert _interpreter_run((1, 2, 40, 16), True, "float16") < 2e-3


@needs_triton
def test_kernel_rejects_shapes_it_cannot_handle(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q = torch.zeros(1, 1, 8, 24)  # head dim not a power of two
    with pytest.raises(ValueError, match="power of two"):
        triton_attention.attention(q, q, q)
    with pytest.raises(ValueError, match="same shape"):
        triton_attention.attention(torch.zeros(1, 1, 8, 16), torch.zeros(1, 1, 9, 16), torch.zeros(1, 1, 9, 16))


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: the native kernel runs only on one")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_kernel_on_the_gpu(d, causal):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 1000, d, device="cuda", generator=g, dtype=torch.float16) for _ in range(3))
    out = triton_attention.attention(q, k, v, causal=causal)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    assert (out.double() - ref).abs().max().item() < 1e-2
