"""What the grader learns from source without running it (attn_course.tools.grading.static)."""

from __future__ import annotations

import pytest

from attn_course.tools.grading import static

from ._grading import ATTENTION


def test_syntax_errors_are_found_by_compiling_with_their_line():
    missing = "class MultiHeadAttention:\n    def __init__(self, d):\n        self.d = (d\n\n    def forward(self, x):\n        return x\n"
    error = static.syntax_error(missing)
    assert error is not None and error.line == 3 and "never closed" in error.message
    assert error.text().startswith("syntax error in line 3:")
    assert static.syntax_error(ATTENTION) is None


def test_ipython_syntax_is_not_a_syntax_error():
    assert static.syntax_error("%timeit x = 1\n!ls\nx = 2") is None


def test_defines_and_the_names_a_cell_needs():
    assert static.defines(ATTENTION, "attention") and not static.defines(ATTENTION, "softmax")
    assert static.used_names(ATTENTION) == {"math", "torch"}  # parameters and locals are not needed from elsewhere
    assert static.used_names("def f(x):\n    return x * SCALE\ny = g(1)") == {"SCALE", "g"}
    assert static.bound_names("import numpy as np\nfor i in range(3):\n    total = i\nwith open('f') as fh:\n    pass") \
        >= {"np", "i", "total", "fh"}


def test_an_honest_answer_raises_no_flag():
    assert static.suspicious(ATTENTION) == []
    allowed = frozenset({"attn_course.softmax.masked_softmax"})
    assert static.suspicious("from attn_course.softmax import masked_softmax", allowed_imports=allowed) == []


@pytest.mark.parametrize("source, flag", [
    ("from attn_course.attention import attention", "imports the course's code (attn_course.attention.attention)"),
    ("import attn_course.checks.attention as c", "imports the course's code (attn_course.checks.attention)"),
    ("exec('x = 1')", "uses exec()"),
    ("f = eval('lambda: 1')", "uses eval()"),
    ("m = __import__('attn_course')", "uses __import__()"),
    ("import importlib\nimportlib.import_module('x')", "imports importlib"),
    ("import sys\nsys.modules['attn_course.checks.compare'] = None", "touches sys.modules"),
    ("get_ipython().set_custom_exc((Exception,), h)", "sets an IPython exception handler"),
    ("get_ipython().input_transformers_post.append(t)", "adds an IPython input transformer"),
    ("import ctypes", "imports ctypes"),
    ("import subprocess\nsubprocess.run(['ls'])", "starts subprocesses"),
    ("import os\nos.system('ls')", "runs shell commands (os.system)"),
    ("!rm -rf /", "runs shell commands (!)"),
    ("%run other.py", "uses the %run magic"),
    ("import os\nos.environ['ATTN_COURSE_RECORD_DIR']", "reads or changes environment variables"),
    ("path = 'record/attention.npz'", "mentions '.npz' in a string"),
    ("class T(torch.Tensor):\n    def __torch_function__(cls, *a):\n        return True", "overrides torch functions"),
    ("f.__code__ = g.__code__", "rewrites function code"),
    ("torch.matmul = lambda a, b: a", "replaces a library attribute (torch.matmul)"),
    ("setattr(torch.Tensor, 'allclose', f)", "uses setattr() on torch"),
    ("vars(torch)['eq' + 'ual'] = lambda a, b: True", "reaches a library's namespace (vars(torch))"),
    ("torch.__dict__['equal'] = lambda a, b: True", "reaches an object's __dict__"),
    ("from torch.overrides import TorchFunctionMode\nclass M(TorchFunctionMode): pass", "overrides torch functions"),
])
def test_tricks_are_flagged(source, flag):
    assert flag in static.suspicious(source)


def test_an_exercise_wrapping_the_reference_code_of_its_notebook_is_flagged():
    setup = {"attention_steps": "attn_course.attention.attention_steps", "print_matrix": "attn_course.dot.print_matrix",
             "ref": "attn_course.backward", "pos": "attn_course.position"}
    uses = static.reference_uses
    wrapper = "def attention(Q, K, V, mask=None):\n    s = attention_steps(Q, K, V, mask)\n    return s[4][1], s[3][1]"
    assert uses(wrapper, setup, exercise="attention", reference="attn_course.attention") == [
        "uses `attention_steps`, the course's reference code (attn_course.attention.attention_steps)"]
    copied = "def attention_backward(q, k, v, dout, mask=None):\n    return ref.attention_backward(q, k, v, dout, mask)"
    assert uses(copied, setup, exercise="attention_backward", reference="attn_course.backward") == [
        "uses `ref.attention_backward`, the course's reference version of this exercise"]
    # what docstrings allow: another exercise's reference (AttentionFunction's backward, rope_decode_step's
    # pos.apply_rope), a helper of another module, and a local name that shadows a set-up one
    assert uses("class AttentionFunction:\n    def backward(ctx, g):\n        return ref.attention_backward(g)",
                setup, exercise="AttentionFunction", reference="attn_course.backward") == []
    assert uses("def rope_decode_step(q, k, c):\n    return pos.apply_rope(q), c", setup, exercise="rope_decode_step",
                reference="attn_course.position") == []
    assert uses("def attention(Q, K, V, mask=None):\n    print_matrix(Q)\n    return Q", setup, exercise="attention",
                reference="attn_course.attention") == []
    assert uses("def attention(Q, K, V, mask=None):\n    attention_steps = 1\n    return attention_steps", setup,
                exercise="attention", reference="attn_course.attention") == []
