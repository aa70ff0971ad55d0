"""The check kit: what every topic's checks are written with, beyond :mod:`..core` and :mod:`..compare`.

A topic's checks (``checks/<topic>.py``, or the package ``checks/<topic>/``) import only this kit (with
:mod:`..core`, :mod:`..compare`, :mod:`..boundary`, :mod:`..result`), their own package and the reference
modules — never another topic's checks (``tests/test_layers.py``): what two topics
share lives here, under a public name, in the module that has its job:

* :mod:`.mistakes` — ONE model of a known mistake, as data (:class:`Known`: key, summary, cause, fix, and how to
  reproduce it on the check's case), and ONE engine that judges a check's cases against a table of them
  (:class:`Suspects`); :class:`AlongDim` (a Known whose texts name the case's ``dim``), :func:`fits` (a mistake
  that explains every wrong case), :func:`known_rows` (a table from rows), :func:`variants` (a table of
  one function with a switch per mistake), :func:`factors` (names for a constant factor);
* :mod:`.raises` — ONE explanation of a learner's exception (:func:`explain_raise`: a construct of the topic that
  raises the very same message, a pattern of the topic, the course-wide table), :func:`call_explained` (the
  learner's call, its exception explained), and shared hints (:func:`bool_hint`, :func:`signature_hint`,
  :func:`reduction_hint`);
* :mod:`.answers` — what came back, as tensors: :func:`tensor_answer`, :func:`unpack` (a tuple), :func:`preview`,
  :func:`expect_not_kept` (a result an earlier call returned);
* :mod:`.measure` — what is off when no known mistake fits: :func:`epsilon_in_the_sum`, :func:`clamp_cause`,
  :func:`what_is_off`, :func:`batch_entries`,
  :func:`lower_precision`, :func:`half_rounded`, :func:`explain_nonfinite`, :func:`works_elsewhere`;
* :mod:`.calls` — the learner-side probes :func:`call` / :func:`call_with` (which inputs a call changed in place),
  :func:`expect_unchanged`, :class:`TensorOrArray` (tensors or NumPy arrays), :func:`expect_signature`;
* :mod:`.watch` — ONE watcher of the learner's torch calls (:class:`Watch` / :func:`watch`: ops, tensors, FLOPs);
* :mod:`.cases` — a tensor function judged on its cases (:func:`judge_cases`, :class:`TensorCase`), and again on
  new values of a case's shapes (:func:`fresh_values`: a result kept between calls);
* :mod:`.families` — the mistakes several topics judge, each written once: :data:`SOFTMAX_MISTAKES` (the stable
  softmax; :func:`along_last_axis` for a function without ``dim``), :data:`PRODUCT_MISTAKES` (Q Kᵀ;
  :func:`product_rows`), with their hints (:data:`SHIFT_FIX`, :data:`WEIGHTS_FIX`) and helpers.

Topics write ``from . import kit`` and ``kit.Known``, ``kit.unpack``…: every public name is here.
"""

from __future__ import annotations

from .answers import KEPT_FIX, expect_not_kept, kept_cause, preview, tensor_answer, unpack
from .calls import CALL, CALL_WITH, TensorOrArray, arrays, call, call_with, expect_signature, expect_unchanged
from .cases import TensorCase, fresh_values, judge_cases
from .families import (PRODUCT_MISTAKES, SHIFT_FIX, SOFTMAX_MISTAKES, WEIGHTS_FIX, along_last_axis, exp_shifted,
                       normalised, other_axis, product_rows)
from .measure import (agrees, batch_entries, clamp_cause, epsilon_in_the_sum, exp_limits, expect_dtype, expect_float64_precision, explain_nonfinite,
                      half_rounded, lower_precision, nan_or_inf, narrowing_calls, what_is_off, works_elsewhere)
from .mistakes import AlongDim, Case, Known, Suspects, factors, fits, known_rows, variants
from .raises import (BOOL_HINT, Construct, Pattern, bool_hint, call_explained, explain_raise, reduction_hint,
                     reproduce, signature_hint)
from .watch import Watch, einsum_flops, watch

__all__ = ["Known", "AlongDim", "Suspects", "Case", "fits", "known_rows", "variants", "factors",
           "explain_raise", "call_explained", "reproduce", "Construct", "Pattern", "BOOL_HINT", "bool_hint",
           "signature_hint", "reduction_hint",
           "tensor_answer", "unpack", "preview", "expect_not_kept", "kept_cause", "KEPT_FIX",
           "epsilon_in_the_sum", "clamp_cause", "what_is_off", "batch_entries", "half_rounded", "lower_precision", "narrowing_calls", "expect_dtype",
           "expect_float64_precision", "agrees", "works_elsewhere", "exp_limits", "nan_or_inf",
           "explain_nonfinite",
           "CALL", "call", "CALL_WITH", "call_with", "expect_unchanged", "TensorOrArray", "arrays", "expect_signature",
           "Watch", "watch", "einsum_flops",
           "TensorCase", "judge_cases", "fresh_values",
           "SOFTMAX_MISTAKES", "along_last_axis", "SHIFT_FIX", "WEIGHTS_FIX", "normalised", "exp_shifted", "other_axis",
           "PRODUCT_MISTAKES", "product_rows"]
