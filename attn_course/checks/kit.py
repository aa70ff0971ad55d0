"""The check kit: what every topic's checks are written with, beyond :mod:`.core` and :mod:`.compare`.

A topic's checks module (``checks/<topic>.py``) imports only this kit (with :mod:`.core`, :mod:`.compare`,
:mod:`.boundary`, :mod:`.result`) and the reference modules — never another topic's names: what two topics
share lives here, under a public name.

* :class:`Known` — ONE model of a known mistake, as data: a key, what it is, its cause and fix, and how to
  reproduce it on the check's case (the same arguments the oracle takes);
* :class:`Suspects` — ONE engine: tries a check's table of known mistakes on each case, rules out those an
  earlier case contradicts, names the survivor, and when several survive asks the learner's function for
  a case that tells them apart before saying "these give the same numbers here";
* :class:`Watch` / :func:`watch` — ONE watcher of the learner's torch calls (ops, tensors built, FLOPs);
* :func:`call` — ONE learner-side probe of a call that says which arguments it changed in place, and
  :func:`expect_unchanged`, the diagnosis when it did; :class:`TensorOrArray` — ONE caller of a learner's
  function written for tensors or for NumPy arrays;
* :func:`lower_precision` — a wrong (or right) answer that went through a dtype narrower than the inputs';
* :func:`explain_raise` — ONE explanation of a learner's exception: a construct of the topic that raises
  the very same message, else a pattern of the topic, else the course-wide table of
  :func:`~.compare.explain_exception`;
* :func:`reproduce` — the message a construct raises (what :func:`explain_raise` compares);
* :class:`Evidence` — mistakes that earlier cases ruled out, for checks that bind mistakes by hand;
* :func:`bool_hint` — the cause and fix for "Boolean value of Tensor … is ambiguous";
* :func:`factors` — names for constant factors that :func:`~.compare.describe_mismatch` may report;
* :func:`einsum_flops` — the FLOPs of an ``einsum`` call, for the watchers that count a learner's work.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from .boundary import LearnerNotAttempted, LearnerRaised, LearnerTimedOut, probe
from .compare import Mistake, expect_close, explain_exception, fail, same

__all__ = ["Known", "Suspects", "fits", "batch_entries", "Watch", "watch", "CALL", "call", "expect_unchanged", "TensorOrArray", "arrays",
           "lower_precision", "explain_raise", "reproduce", "Evidence", "BOOL_HINT", "bool_hint", "factors",
           "einsum_flops", "agrees", "signature_hint", "works_elsewhere", "what_is_off", "known_rows",
           "expect_signature", "TensorCase", "CALL_WITH", "call_with", "preview", "judge_cases", "tensor_answer",
           "call_explained", "exp_limits", "nan_or_inf", "explain_nonfinite",
           "reduction_hint", "unpack"]

Case = tuple  # the positional arguments of one call: what the oracle, the learner and every Known take


# ============================================================================ a known mistake, as data
@dataclass(frozen=True)
class Known:
    """A known mistake: ``key`` (a stable name for tests), ``summary`` (the short form for grade tables: "mask
    applied after the softmax"), ``cause`` (what the learner did), ``fix`` (what to change), and ``make``:
    the mistake's output on a case, called with the same arguments as the oracle (it may raise or return
    None where the mistake cannot happen: it is then simply not a suspect there)."""

    key: str
    summary: str
    cause: str
    fix: str
    make: Callable[..., Any]

    def on(self, case: Case) -> Mistake:
        """This mistake bound to one case (what :func:`~.compare.expect_close` blames)."""
        return Mistake(self.summary, self.cause, self.fix, lambda: self.make(*case))


class Suspects:
    """The engine: a check's table of :class:`Known` mistakes, tried case by case.

    For each case the check calls :meth:`expect` with the learner's output and the oracle's. A right
    answer records the case (so a later mismatch is never blamed on a mistake that this case's right
    output rules out); a wrong one is blamed on the mistakes that reproduce it and were not ruled out.
    When several survive and the check passes ``again`` (the learner's function, as ``again(*case)``) and
    ``distinguish`` (other cases), the engine runs the learner's function where the survivors' outputs
    differ and keeps only those it still agrees with (:meth:`narrow`). Mistakes that give the same numbers
    on every such case are named together, as "on this input … give the same numbers".
    With no survivor, :func:`~.compare.describe_mismatch` measures what the difference is."""

    def __init__(self, table: Iterable[Known], *, atol: float = 1e-5, rtol: float = 1e-4):
        self.table = list(table)
        keys = [k.key for k in self.table]
        if len(set(keys)) != len(keys):  # ruled-out mistakes are remembered by key
            raise ValueError(f"mistake keys repeat in one table: {sorted(k for k in set(keys) if keys.count(k) > 1)}")
        self.atol, self.rtol = atol, rtol
        self._passed: list[tuple[Case, torch.Tensor]] = []
        self._ruled: dict[str, bool] = {}

    def ruled_out(self, known: Known) -> bool:
        """True when a case the learner got right gives, under this mistake, an output that differs."""
        if known.key not in self._ruled:
            self._ruled[known.key] = any(
                (out := _output(known, case)) is not None and not same(out, expected, atol=self.atol, rtol=self.rtol)
                for case, expected in self._passed)
        return self._ruled[known.key]

    def suspects(self, actual: torch.Tensor, case: Case, expected: torch.Tensor | None = None) -> list[Known]:
        """The mistakes not ruled out whose output on ``case`` is ``actual`` — leaving out, when ``expected`` is
        given, those whose output on this case is the right one (they change nothing here, so they cannot
        explain a wrong answer; an answer merely near both is a precision problem, not that mistake)."""
        found = []
        for k in self.table:  # reproduction first: ruling out replays earlier cases, and few rows reproduce
            out = _output(k, case)
            if out is None or not same(actual, out, atol=self.atol, rtol=self.rtol):
                continue
            if expected is not None and same(out, expected, atol=self.atol, rtol=self.rtol):
                continue
            if not self.ruled_out(k):
                found.append(k)
        return found

    def passed(self, case: Case, expected: torch.Tensor) -> None:
        """Record a case the learner got right (what :meth:`expect` does on a match), for checks that compare
        by other means (a bool mask, several outputs at once)."""
        self._passed.append((case, expected))
        self._ruled = {k: v for k, v in self._ruled.items() if v}  # a new right case can only rule out more

    def narrow(self, found: list[Known], again: Callable[..., Any], distinguish: Sequence[Case] = ()) -> list[Known]:
        """Of several suspects, those the learner's function still agrees with on the cases of ``distinguish``
        where their outputs differ. When it agrees with none of them there, none explains the answer: the
        result is empty and the difference is measured instead. (One suspect alone is not re-tried: a
        row may describe what happened on this case only, e.g. "a mask of this shape ignored"; a topic
        whose rows can coincide by accident — √(d_k − 1) and a rounded √d_k agree at d_k = 10 — confirms
        them on its other cases itself.) A case where the learner's function raises tells nothing."""
        for case in distinguish:
            if len(found) < 2:
                break
            outs = [_output(k, case) for k in found]
            if any(o is None for o in outs) or all(same(o, outs[0], atol=self.atol, rtol=self.rtol) for o in outs[1:]):
                continue  # these suspects agree here (or cannot run): no help
            try:
                mine = again(*case)
            except Exception:  # noqa: BLE001 - the learner's function raised here: this case tells nothing
                continue
            if isinstance(mine, torch.Tensor):
                found = [k for k, o in zip(found, outs) if same(mine, o, atol=self.atol, rtol=self.rtol)]
        return found

    def expect(self, actual: torch.Tensor, expected: torch.Tensor, case: Case, *, tried: str,
               again: Callable[..., Any] | None = None, distinguish: Sequence[Case] = (), **compare: Any) -> None:
        """Fail unless ``actual`` (the learner's output on ``case``) matches ``expected`` (the oracle's); name
        the mistake behind it when one reproduces it. ``compare`` goes to :func:`~.compare.expect_close`
        (``what``, ``factors``, ``oracle``, ``axes``, ``fix``)."""
        atol, rtol = compare.pop("atol", self.atol), compare.pop("rtol", self.rtol)
        if tuple(actual.shape) == tuple(expected.shape) and same(actual, expected, atol=atol, rtol=rtol):
            self.passed(case, expected)
            return
        found = self.suspects(actual, case, expected)
        if len(found) > 1 and again is not None:
            table = self.narrow(found, again, distinguish)  # possibly none left: then nothing is blamed
        else:  # none reproduces the values; the others still name a wrong *shape* they would give
            table = found or [k for k in self.table if not self.ruled_out(k) and not (
                (out := _output(k, case)) is not None and same(out, expected, atol=atol, rtol=rtol))]
        expect_close(actual, expected, tried=tried, atol=atol, rtol=rtol, mistakes=[k.on(case) for k in table],
                     **compare)


def fits(known: Known, case: Case, *, raised: bool, value: torch.Tensor | None, atol: float, rtol: float = 1e-4) -> bool:
    """Does mistake ``known`` do what the learner's code did on a case it got wrong: raise where it raised
    (``raised``), give its numbers (``value``) where it returned? (:class:`Suspects` asks this of one wrong case;
    a check that runs several can require a mistake to fit them all.)"""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            made = known.make(*case)
    except Exception:  # noqa: BLE001 - the mistake raises here
        return raised
    return not raised and value is not None and isinstance(made, torch.Tensor) and same(value, made, atol=atol, rtol=rtol)


def _output(known: Known, case: Case) -> torch.Tensor | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = known.make(*case)
    except Exception:  # noqa: BLE001 - this mistake cannot happen on this case
        return None
    return out if isinstance(out, torch.Tensor) else None


# ============================================================================ watching the learner's torch calls
_PRODUCTS = {"matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "mv", "dot", "vdot", "inner", "linear", "addmm",
             "baddbmm", "addbmm", "addmv"}
_SECOND_OPERAND = {"addmm", "baddbmm", "addbmm", "addmv", "__rmatmul__"}  # the operand whose last axis is contracted
_REDUCTIONS = {"amax", "amin", "max", "min", "sum", "nansum", "mean", "logsumexp", "prod", "norm", "std", "var"}
_EXPS = {"exp", "exp_", "exp2", "exp2_"}


class Watch(TorchFunctionMode):
    """Sees every torch function that Python code calls while it is active (the autograd engine's own calls
    and C++ internals are not seen) and records:

    * ``ops`` — the functions' names; ``calls`` — how many times each ran;
    * ``largest`` / ``shape`` — the elements of the largest tensor storage returned, and that tensor's shape;
    * ``elements`` — the elements of every tensor returned, summed;
    * ``shapes`` — the shapes of the floating-point tensors (≥ 2-D) returned (at most 2000 kept);
    * ``products`` — how many matrix products (``@``, ``mm``, ``einsum``…) returned each shape, and ``flops``
      — their FLOPs, 2 per multiply–add;
    * ``exp_elements`` / ``exp_tile`` / ``zero_tiles`` — what went through ``exp``: elements, the largest
      2-D tile, and how many tiles came out all zero (every score in them masked);
    * ``reductions`` — for max/sum-like reductions, how many inputs one output combined.
    (A torch-function mode costs nothing to enter; PyTorch's FlopCounterMode imports torch._dynamo,
    seconds on a small machine.)"""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()
        self.calls: dict[str, int] = {}
        self.largest, self.shape, self.elements = 0, (), 0
        self.shapes: set[tuple[int, ...]] = set()
        self.products: dict[tuple[int, ...], int] = {}
        self.flops = 0.0
        self.exp_elements, self.exp_tile, self.zero_tiles = 0, (), 0
        self.reductions: set[int] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        self.ops.add(name)
        self.calls[name] = self.calls.get(name, 0) + 1
        outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
        if outs and (name == "einsum" or name in _PRODUCTS):
            self._product(name, args, outs[0])
        if outs and name in _REDUCTIONS and args and isinstance(args[0], torch.Tensor) and outs[0].numel():
            if len(self.reductions) < 32:
                self.reductions.add(args[0].numel() // outs[0].numel())
        for t in outs:
            self._tensor(name, t)
        return out

    def _product(self, name: str, args: tuple, out: torch.Tensor) -> None:
        if out.dim() >= 2:
            self.products[tuple(out.shape)] = self.products.get(tuple(out.shape), 0) + 1
        if name == "einsum":
            self.flops += einsum_flops(args, out)
            return
        operand = args[1] if name in _SECOND_OPERAND and len(args) > 1 else (args[0] if args else None)
        if isinstance(operand, torch.Tensor) and operand.dim():
            self.flops += 2.0 * out.numel() * operand.shape[-1]

    def _tensor(self, name: str, t: torch.Tensor) -> None:
        self.elements += t.numel()
        try:
            size = t.untyped_storage().nbytes() // max(t.element_size(), 1)
        except Exception:  # noqa: BLE001 - tensors without a storage (sparse, meta…): count their elements
            size = t.numel()
        if size > self.largest:
            self.largest, self.shape = size, tuple(t.shape)
        if t.is_floating_point() and t.dim() >= 2 and len(self.shapes) < 2000:
            self.shapes.add(tuple(t.shape))
        if name in _EXPS and t.dim() >= 2:
            self.exp_elements += t.numel()
            if t.shape[-2] * t.shape[-1] > math.prod(self.exp_tile or (0,)):
                self.exp_tile = tuple(t.shape[-2:])
            if t.shape[-2] > 1 and t.shape[-1] > 1 and not bool(t.any()):
                self.zero_tiles += 1

    def report(self) -> dict[str, Any]:
        """What was seen, as plain JSON-able data (what a probe sends back across the learner boundary)."""
        return {"ops": sorted(self.ops), "calls": dict(sorted(self.calls.items())), "largest": int(self.largest),
                "shape": [int(s) for s in self.shape], "elements": int(self.elements),
                "shapes": [list(s) for s in sorted(self.shapes)],
                "products": [[list(s), c] for s, c in sorted(self.products.items())], "flops": float(self.flops),
                "exp_elements": int(self.exp_elements), "exp_tile": [int(s) for s in self.exp_tile],
                "zero_tiles": int(self.zero_tiles), "reductions": sorted(self.reductions)}


def watch(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run ``fn(*args, **kwargs)`` once under a :class:`Watch` and return its :meth:`~Watch.report` (the result
    itself is dropped). Meant for the learner side of a probe."""
    watcher = Watch()
    with watcher:
        fn(*args, **kwargs)
    return watcher.report()


# ============================================================================ calling the learner's function
#: The probe :func:`call` is registered under this name (``learner.observe(kit.CALL, *args)``).
CALL = "attn_course.checks.kit.call"


def arrays(args: tuple) -> tuple:
    """``args`` with every tensor handed over as a NumPy array (sharing its memory)."""
    return tuple(a.numpy() if isinstance(a, torch.Tensor) else a for a in args)


def _unchanged(now: Any, before: Any) -> bool:
    if isinstance(before, np.ndarray):
        return now.shape == before.shape and now.dtype == before.dtype and bool(
            np.array_equal(now, before, equal_nan=before.dtype.kind in "fc"))
    return now.shape == before.shape and now.dtype == before.dtype and (torch.equal(now, before) or (
        now.is_floating_point() and bool(((now == before) | (now.isnan() & before.isnan())).all())))


@probe(CALL)
def call(fn: Callable, *args: Any, numpy: bool = False, apply: bool = False, result: bool = True) -> tuple[Any, list[int]]:
    """Learner side: ``fn(*args)`` and the positions of the tensor arguments it changed in place (compared with
    copies taken before the call). ``apply``: call ``fn.apply`` (an autograd Function); ``numpy``: hand the
    tensors over as NumPy arrays; ``result=False``: send back None for the result (only the positions cross)."""
    args = arrays(args) if numpy else args
    before = [a.copy() if isinstance(a, np.ndarray) else a.clone() if isinstance(a, torch.Tensor) else None
              for a in args]
    out = (fn.apply if apply else fn)(*args)
    return (out if result else None), [i for i, (a, b) in enumerate(zip(args, before))
                                       if b is not None and not _unchanged(a, b)]


def expect_unchanged(fn: Any, args: tuple, *, call: str, name: str, shown: str, numpy: bool = False,
                     apply: bool = False) -> None:
    """Fail when the learner's code changes its first argument (called ``name``; ``shown`` describes it) in place,
    measured once by the probe :func:`call` on ``args``. Raising or timing out here says nothing: the cases already
    ran this code."""
    try:
        _, changed = fn.observe(CALL, *args, numpy=numpy, apply=apply, result=False)
    except (LearnerRaised, LearnerTimedOut):
        return
    if 0 in changed:
        fail(f"{name} changed in place", tried=f"{call} on {shown}, comparing {name} with a copy taken before the call",
             got=f"after the call, {name} no longer holds the values it was given",
             expected=f"{name} left as it was: the function only reads it",
             cause="an in-place operation on the input (x -= …, x /= …, x.sub_(…), x.exp_(), or out=x) overwrites the "
                   "caller's tensor",
             fix="compute new tensors (x - m, torch.exp(…)), or start from a copy: x = x.clone()")


def batch_entries(out: torch.Tensor, expected: torch.Tensor, *, tried: str, what: str, atol: float, rtol: float,
                  along: str) -> None:
    """For 3-D and larger results: fail naming which entries along the first (batch) axis are wrong, when some are
    right and some not (``along`` names the axis a reduction should run along, for the fix)."""
    if out.ndim < 3 or out.shape[0] < 2:
        return
    right = [same(out[i], expected[i], atol=atol, rtol=rtol) for i in range(out.shape[0])]
    if all(right) or not any(right):
        return
    wrong, first = [i for i, r in enumerate(right) if not r], right.index(True)
    if all(same(out[i], out[first], atol=atol, rtol=rtol) for i in wrong):
        fail(f"batch entry {first} repeated", tried=tried, expected="each batch entry computed from its own input",
             got=f"{what} repeat batch entry {first}'s values in entries {', '.join(map(str, wrong))}",
             cause=f"your code computes batch entry {first} and reuses it for the others",
             fix=f"compute every step for all batch entries at once (reduce along {along}, not over [0])")
    fail("wrong for some batch entries", tried=tried, expected="every batch entry right",
         got=f"{what} are right for batch entr{'y' if right.count(True) == 1 else 'ies'} "
             f"{', '.join(str(i) for i, r in enumerate(right) if r)} and wrong for {', '.join(map(str, wrong))}",
         fix="make every step treat all batch entries alike: no loop over a fixed range, no indexing with a fixed number")


class TensorOrArray:
    """Calls a learner's function with tensors, or with NumPy arrays when it only handles those: the first call goes
    with tensors; if it raises, the same call is made once with arrays, and when that works every later call uses
    arrays. When both raise, the error that says more is reported: the one that got further into the learner's code,
    else the one that is not an API mismatch (TypeError, AttributeError), else the tensor one."""

    def __init__(self, fn: Any):
        self.fn, self.mode = fn, ""

    @property
    def kind(self) -> str:
        return "NumPy arrays" if self.mode == "numpy" else "tensors"

    def __call__(self, *args: Any) -> Any:
        if self.mode == "numpy":
            return self.fn(*arrays(args))
        try:
            with warnings.catch_warnings():  # NumPy functions handed tensors warn about __array_wrap__
                warnings.simplefilter("ignore", DeprecationWarning)
                out = self.fn(*args)
        except LearnerRaised as t_err:
            if self.mode:
                raise
            try:
                out = self.fn(*arrays(args))
            except LearnerRaised as a_err:
                further = t_err.line is not None and a_err.line is not None and a_err.line > t_err.line
                telling = (t_err.type_name in ("TypeError", "AttributeError") and a_err.line == t_err.line
                           and a_err.type_name not in ("TypeError", "AttributeError"))
                raise (a_err if further or telling else t_err) from None
            except (LearnerTimedOut, LearnerNotAttempted):
                raise t_err from None
            self.mode = "numpy"
            return out
        self.mode = "torch"
        return out

    def tensor(self, *args: Any) -> Any:
        """The answer on ``args`` as a tensor when it is an array (what :class:`Suspects` runs to tell mistakes apart)."""
        out = self(*args)
        return torch.from_numpy(np.asarray(out)) if isinstance(out, np.ndarray) else out


# ============================================================================ precision
_BITS = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}  # significant bits
_DIGITS = {torch.float32: 7, torch.float16: 3, torch.bfloat16: 2}


def lower_precision(got: torch.Tensor, input_dtype: torch.dtype, *, tried: str, what: str, grid: bool = True) -> None:
    """Fail, naming the dtype, when ``got`` went through a dtype narrower than the inputs': its own dtype is narrower,
    or (``grid``, for an answer already known to be wrong) every entry lies exactly on that dtype's grid (a float64
    computation lands there by chance with probability about 2⁻²⁹ per entry)."""
    bits = _BITS.get(input_dtype)
    if bits is None or not got.is_floating_point():
        return
    low = got.dtype if _BITS.get(got.dtype, 99) < bits else None
    values = got[torch.isfinite(got)]
    telling = values[(values != 0) & (values.abs() != 1) & (values.abs() != 0.5)]
    for candidate in (torch.bfloat16, torch.float16, torch.float32) if grid and low is None and telling.numel() >= 4 else ():
        if _BITS[candidate] < bits and torch.equal(telling.to(candidate).to(got.dtype), telling):
            low = candidate
            break
    if low is None:
        return
    name, inputs = str(low).replace("torch.", ""), str(input_dtype).replace("torch.", "")
    fail(f"computed in {name}, not {inputs}", tried=tried, got=f"{what}: {name} values" + (
        "" if got.dtype == low else f" (every entry exactly representable in {name})") + f", although the inputs are "
         f"{inputs}", expected=f"the results at {inputs} precision",
         cause=f"part of your computation ran in {name}{'' if got.dtype != low else ' or narrower'} (.float(), "
               f".half(), .to({name}) or dtype={name}), which keeps about {_DIGITS[low]} significant digits: too few "
               "for these inputs",
         fix="keep the inputs' dtype from start to end (a wider dtype inside is fine, a narrower one is not)")


# ============================================================================ a learner's exception
Construct = tuple[str, str, Callable[[], object]]  # (cause, fix, attempt): a known wrong construct, runnable here
Pattern = tuple[str, str, str, str]  # (exception type, regex on its message, cause, fix), as in compare's table


def explain_raise(exc: LearnerRaised, constructs: Sequence[Construct] = (), patterns: Sequence[Pattern] = ()) -> dict:
    """``dict(cause=…, fix=…)`` for a learner's exception, or ``{}`` when nothing is known of it.

    First a construct of the topic that, run here, raises the very same type and message (so it is named only
    when it surely is what the learner wrote); then a pattern of the topic; then the course-wide table
    (:func:`~.compare.explain_exception`). ``{0}``, ``{1}``… in a pattern's cause and fix are the regex's match
    and groups."""
    for cause, fix, attempt in constructs:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                attempt()
        except Exception as mine:  # noqa: BLE001
            if type(mine).__name__ == exc.type_name and str(mine) == exc.message:
                return dict(cause=cause, fix=fix)
    for kind, pattern, cause, fix in patterns:
        if kind == exc.type_name and (match := re.search(pattern, exc.message or "")):
            groups = [match.group(0), *match.groups()]
            fill = lambda text: re.sub(r"\{(\d)\}", lambda m: str(groups[int(m.group(1))] or ""), text)  # noqa: E731
            return dict(cause=fill(cause), fix=fill(fix))
    known = explain_exception(exc.type_name, exc.message)
    return dict(cause=known[0], fix=known[1]) if known else {}


# ============================================================================ small shared helpers


def reproduce(attempt: Callable[[], object]) -> str | None:
    """The message ``attempt()`` raises (None if it does not raise)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            attempt()
    except Exception as exc:  # noqa: BLE001
        return str(exc)
    return None


class Evidence:
    """Mistakes that earlier cases rule out: an answer that matched the oracle on a case where a mistake's
    output differs from it did not make that mistake, so a later mismatch is never blamed on it.
    Worked out lazily, only when a later case fails (right answers pay nothing)."""

    def __init__(self) -> None:
        self._history: list[tuple[list[Mistake], torch.Tensor, float, float]] = []
        self._ruled: dict[str, bool] = {}

    def passed(self, mistakes: list[Mistake], expected: torch.Tensor, *, atol: float, rtol: float) -> None:
        self._history.append((mistakes, expected, atol, rtol))

    def ruled_out(self, summary: str) -> bool:
        if summary not in self._ruled:
            self._ruled[summary] = False
            for mistakes, expected, atol, rtol in self._history:
                values = [m.value() for m in mistakes if m.summary == summary]
                if values and all(v is not None and not same(v, expected, atol=atol, rtol=rtol) for v in values):
                    self._ruled[summary] = True
                    break
        return self._ruled[summary]

    def possible(self, mistakes: list[Mistake]) -> list[Mistake]:
        return [Mistake(m.summary, m.cause, m.fix, lambda m=m: None if self.ruled_out(m.summary) else m.value())
                for m in mistakes]


BOOL_HINT = dict(cause="Python asked a tensor for one True/False (`x_kv or x_q`, `if mask:`, `and` / `or` between "
                       "tensors); a tensor of several values has none",
                 fix="test for None instead: `x_q if x_kv is None else x_kv`, `if mask is not None:`")


def bool_hint(exc: LearnerRaised) -> dict:
    """:data:`BOOL_HINT` when the learner's code asked a tensor for one truth value, else nothing."""
    return BOOL_HINT if "Boolean value of Tensor" in exc.message else {}


def factors(**named: float) -> dict[str, float]:
    """Names for a constant factor, keeping only values no other name (nor 2, ½ or −1) shares on this input."""
    taken = [2.0, 0.5, -1.0, 1.0, *named.values()]
    return {k: v for k, v in named.items() if sum(abs(v - t) < 1e-9 or abs(1 / v - t) < 1e-9 for t in taken) == 1}


def einsum_flops(args: tuple, out: torch.Tensor) -> float:
    """2 × (output entries) × (product of the contracted sizes) of an einsum; 0 when it cannot be read."""
    try:
        equation, operands = args[0], args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        inputs, output = equation.replace(" ", "").split("->")
        sizes: dict[str, int] = {}
        for spec, t in zip(inputs.split(","), operands):
            head, _, tail = spec.partition("...")
            sizes.update(zip(head, t.shape))
            sizes.update(zip(reversed(tail), reversed(t.shape)))
        return 2.0 * out.numel() * math.prod(s for letter, s in sizes.items() if letter not in output)
    except Exception:  # noqa: BLE001 - an equation this reader does not follow is not counted
        return 0.0


# ============================================================================ an answer no known mistake explains
from .compare import Failure, as_tensor, describe_mismatch, fmt  # noqa: E402 - the section was appended to the kit


def agrees(out: Any, expected: torch.Tensor, *, atol: float, rtol: float) -> bool:
    """Whether a learner's answer (a tensor, an array or a number) has ``expected``'s shape and values."""
    try:
        t = as_tensor(out, tried="")
    except Failure:
        return False
    return tuple(t.shape) == tuple(expected.shape) and same(t, expected, atol=atol, rtol=rtol)


def signature_hint(exc: LearnerRaised, signature: str) -> dict:
    """``cause``/``fix`` when the learner's function was called with arguments it does not take (a TypeError raised
    before its body ran), else ``{}``."""
    if exc.type_name == "TypeError" and exc.line is None and \
            re.match(r"\S+\(\) (takes|got an unexpected keyword|missing \d+ required)", exc.message):
        return dict(cause="your function does not take the arguments the docstring lists",
                    fix=f"keep the signature {signature}")
    return {}


def works_elsewhere(failed: Sequence[int], others: Iterable[tuple[Sequence[int], Callable[[], bool]]], *,
                    fix: str) -> dict:
    """After the learner's code raised on an input of shape ``failed``: ``cause``/``fix`` naming the first of ``others``
    (a shape, and a call saying whether the answer on it is right) that has another number of axes and on which the
    code works — one that raises or times out does not; else ``{}``."""
    text = lambda s: f"({s[0]},)" if len(s) == 1 else str(tuple(s))  # noqa: E731
    for shape, works in others:
        if len(shape) == len(failed):
            continue
        try:
            ok = works()
        except (LearnerRaised, LearnerTimedOut, Failure):
            ok = False
        if ok:
            return dict(cause=f"your code works on input of shape {text(shape)} but raises on {text(failed)}: it "
                              "handles one number of axes only (torch.bmm, torch.dot, torch.diag, torch.outer, math "
                              "functions or a loop over the first axis fix that number), and the docstring allows any "
                              "number of axes", fix=fix)
    return {}


def what_is_off(out: torch.Tensor, expected: torch.Tensor, *, tried: str, what: str, atol: float, rtol: float,
                fix: str, reduced: int | None = None, explain: Callable[[torch.Tensor], None] = lambda out: None,
                along: str = "-1") -> None:
    """Fail saying what is off in a floating-point answer that no known mistake reproduces, where the plain comparison
    would name no cause; return when nothing here fits.

    A wrong shape: one value per slice along axis ``reduced`` (a reduction returned where the entries belong; ``fix``
    is the advice), or the right values with the size-1 axes dropped. The right shape: NaN or inf where the truth is
    finite go to ``explain(out)`` (the topic's own measurements: where they come from); then, unless
    :func:`~.compare.describe_mismatch` names a cause, a constant factor or a shift, in order: a result that went
    through float16 or bfloat16, ``explain(out)``, some batch entries wrong (:func:`batch_entries`, ``along`` naming
    the reduced axis), values right to about 3 significant digits only."""
    got, want = tuple(out.shape), tuple(expected.shape)
    if got != want:
        if reduced is not None and want[reduced] > 1 and got == want[:reduced] + (1,) + want[reduced + 1:]:
            fail("one value per slice", tried=tried, got=f"{what} of shape {got}: one number for each slice along dim",
                 expected=f"shape {want}, one value for each entry of x", fix=fix,
                 cause="you returned a reduction along dim (the maximum, or the sum) instead of the entry-wise result")
        kept = tuple(s for s in want if s != 1)
        if got == kept and len(kept) < len(want) and same(out, expected.reshape(kept), atol=atol, rtol=rtol):
            fail("size-1 axes dropped", tried=tried, got=f"{what} of shape {got}, with the right values",
                 expected=f"shape {want}",
                 fix="keep every axis: squeeze nothing, or only the axis you added (.squeeze(-1))",
                 cause="your code removes the axes of size 1: .squeeze() without an axis drops every one of them")
        return
    a, e = out.detach().double(), expected.detach().double()
    if bool((~torch.isfinite(a) & torch.isfinite(e)).any()):
        explain(out)
    mismatch = describe_mismatch(out, expected, what=what, atol=atol, rtol=rtol)
    if mismatch[2] or mismatch[3].startswith(("off by a factor", "shifted by")):
        return
    # Rounded: within a few float16 rounding steps of the truth everywhere, yet not equal to it.
    scale, err = float(e.abs().max()), (a - e).abs()
    rounded = out.dtype not in (torch.float16, torch.bfloat16) and bool(torch.isfinite(a).all()) and bool(
        torch.isfinite(e).all()) and float(err.max()) > 2.0 ** -14 * scale and bool(
        (err <= 4 * torch.clamp(e.abs(), min=scale) * 2.0 ** -10).all())
    got = f"{what} agree with the expected values to about 3 significant digits only (largest difference " \
          f"{fmt(float(err.max()))})"
    halves = [n for n in ("float16", "bfloat16") if rounded and torch.equal(a, a.to(getattr(torch, n)).double())]
    if halves:  # only a result that went through half precision is made of half-precision numbers
        fail(f"{halves[0]} precision", tried=tried, got=got + f"; every value is a {halves[0]} number",
             expected="the input's precision", cause=f"your result went through {halves[0]}, which keeps about 3 "
             "significant digits, and was converted back afterwards",
             fix="compute in the input's dtype: leave out .half(), .to(torch.float16) or .to(torch.bfloat16)")
    explain(out)
    batch_entries(out, expected, tried=tried, what=what, atol=atol, rtol=rtol, along=along)
    if rounded:
        fail("about 3 digits right", tried=tried, got=got, expected="the input's precision",
             fix="look for a step that rounds: round(…), a conversion to a smaller dtype, or values printed "
                 "and read back")


# ============================================================================ a tensor function judged on its cases
import functools  # noqa: E402 - the section was appended to the kit
from dataclasses import field, replace  # noqa: E402

from .compare import expect_shape  # noqa: E402
from .core import learner_error  # noqa: E402


def known_rows(*rows: tuple) -> list[Known]:
    """A table from rows (key, summary, cause, fix, *ways): one :class:`Known` per way of writing that mistake (keys
    ``key``, ``key/1``…, all with the same words), each run on float64 copies of the case, so that a way that is
    right on a case is not ruled out by float32 rounding."""
    def in_float64(way):
        return lambda *a: way(*(x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in a))

    return [Known(f"{key}/{i}" if i else key, summary, cause, fix, in_float64(way))
            for key, summary, cause, fix, *ways in rows for i, way in enumerate(ways)]


def expect_signature(fn: Any, names: Sequence[str], *, call: str, signature: str) -> None:
    """Fail unless the learner's function accepts every keyword in ``names`` (or **kwargs), each with a default."""
    params = fn.inspect().get("signature")
    by_name = {p["name"]: p for p in params or ()}
    listed = f"a function with parameters ({', '.join(by_name)})"
    words = dict(tried=f"calling {call}", got=listed, expected=f"the signature {signature}",
                 fix=f"keep the exercise's signature: def {signature}:")
    for n in names if params else ():
        if n not in by_name and not any(p["kind"] == "VAR_KEYWORD" for p in params):
            fail(f"no parameter {n}", cause=f"the parameter `{n}` was removed or renamed", **words)
        if n in by_name and not by_name[n]["has_default"]:
            fail(f"{n} has no default value", cause=f"`{n}` lost its default, so a call without it fails", **words)


@dataclass
class TensorCase:
    """One call of a learner's tensor function, for :func:`judge_cases`: ``label`` ("f(…) with {label}"), ``args``
    and ``kwargs``, the ``expected`` result (float64), ``tags`` (what the case is: "batched", "float64"…, for "wrong
    only on …") and ``magnitude``: the largest Σ|products| the result adds up, which rounding errors grow with."""

    label: str
    args: tuple
    expected: torch.Tensor
    kwargs: dict = field(default_factory=dict)
    tags: frozenset = frozenset()
    magnitude: float = 1.0

    @property
    def key(self) -> tuple:
        """The case as the oracle and every Known take it: the arguments, then the keyword values."""
        return (*self.args, *self.kwargs.values())

    @property
    def atol(self) -> float:
        """Float32 rounding with a wide margin, for float64 input too (a float32 result is a correct answer)."""
        return (3e-5 if self.args[0].dtype == torch.float32 else 2e-6) * max(self.magnitude, 1e-30)


#: The probe :func:`call_with` is registered under this name.
CALL_WITH = "attn_course.checks.kit.call_with"


@probe(CALL_WITH)
def call_with(fn: Callable, *args: Any, **kwargs: Any) -> tuple[Any, list[int]]:
    """Learner side: :func:`call` of ``fn(*args, **kwargs)``: its result, and the positions in ``args`` it changed in
    place."""
    return call(functools.partial(fn, **kwargs), *args)


def preview(t: torch.Tensor, n: int = 6) -> str:
    """``shape (4,): 0.7, 0.14, -0.14, 0.51`` (at most ``n`` entries)."""
    flat = t.detach().reshape(-1).to(torch.float64)
    shown = ", ".join(fmt(float(v)) for v in flat[:n]) + (", …" if flat.numel() > n else "")
    return f"shape {tuple(t.shape)}: {shown}" if flat.numel() else f"shape {tuple(t.shape)} (empty)"


def _tensor_of(fn: Any, case: TensorCase, tried: str) -> tuple[torch.Tensor | None, LearnerRaised | None, list[int]]:
    """(result, None, inputs changed in place), or (None, the exception, []); a diagnosis when the result is no
    tensor."""
    try:
        value, changed = fn.observe(CALL_WITH, *case.args, **case.kwargs)
    except LearnerRaised as exc:
        return None, exc, []
    shape = f"a tensor of shape {tuple(case.expected.shape)}"
    if isinstance(value, np.ndarray):
        fail("returned a NumPy array, not a tensor", tried=tried, got=f"a NumPy array of shape {value.shape}",
             expected="a torch.Tensor, as the docstring says", cause="part of your computation went through NumPy "
             "(np.dot, .numpy(), np.sqrt of a tensor…), which returns an array", fix="stay with torch operations on "
             "the tensors (@, torch.matmul, .sum), or convert back with torch.from_numpy")
    if isinstance(value, (np.generic, int, float)) and not isinstance(value, bool):
        fail("returned a Python number, not a tensor", tried=tried, got=f"the number {fmt(float(value))}",
             expected=shape, cause=".item(), float(…), a sum over every entry or a constant returned turned the "
             "result into one number", fix="keep one score per pair in a tensor")
    if isinstance(value, (list, tuple)):
        kind = type(value).__name__
        fail(f"returned a Python {kind}, not a tensor", tried=tried, got=f"a {kind} of {len(value)} items",
             expected=shape, cause=f"a Python {kind} of scores is not a tensor (.tolist(), or a list built in a loop "
             "and returned as it is)", fix="turn a list of 0-d tensors into one tensor with torch.stack(scores); "
             "leave out .tolist()")
    return as_tensor(value, tried=tried, expected=shape), None, changed


def _close(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
    return tuple(a.shape) == tuple(b.shape) and \
        bool(torch.allclose(a.detach().double(), b.detach().double(), atol=atol, rtol=1e-5, equal_nan=True))


def judge_cases(fn: Any, cases: Sequence[TensorCase], table: Sequence[Known], *, call: str, arg_names: Sequence[str],
                oracle: str, factors: Callable[[TensorCase], dict[str, float]] | None = None,
                tags: dict[str, tuple[str, str]] | None = None,
                measure: Callable[[int, list, str], None] | None = None) -> None:
    """Call ``fn`` on every case; return when every result is right and no input was changed in place, else end the
    check with a diagnosis. First a row of ``table`` (taking ``case.key``) that does what the learner's code did on
    every wrong case (raises there, or gives those very numbers) and that no right result rules out; an exception is
    named by a row that raises the very same message. Else the first wrong result is measured: ``measure(i, results,
    tried)`` (the topic's own measures of ``results[i]``), then all zeros, an argument it ignores, one shape whatever
    the input, a shape or values wrong only on the cases of one of ``tags`` (tag: (short, long) words), right for the
    first batch entry only, half precision, a factor of ``factors(case)``. ``call`` shows the call ("f(q, K)"),
    ``arg_names`` names the positional arguments, ``oracle`` the right computation."""
    tries = [f"{call} with {c.label}" for c in cases]
    outs = [_tensor_of(fn, c, t) for c, t in zip(cases, tries)]
    right = [v is not None and v.is_floating_point() and _close(v, c.expected, c.atol)
             for (v, _, _), c in zip(outs, cases)]
    if all(right):
        moved = next((i for i, o in enumerate(outs) if o[2]), None)
        if moved is not None:
            names = " and ".join(arg_names[j] for j in outs[moved][2])
            fail(f"changed its input {names} in place", tried=tries[moved],
                 got=f"the right result, but afterwards the caller's {names} holds different values",
                 expected=f"{names} left as it was (the docstring: inputs are left unchanged)",
                 cause=f"your code modifies {names} in place (an operation ending in _ such as mul_, div_ or "
                       "transpose_, or +=, *=, /= on an input)",
                 fix="compute into a new tensor: write x = x * y (or x / n) instead of x *= y (x /= n)")
        return
    wrong = [i for i, ok in enumerate(right) if not ok]
    suspects = Suspects([k for k in table if all(fits(k, cases[i].key, raised=outs[i][1] is not None, value=outs[i][0],
                                                      atol=max(cases[i].atol, 1e-5)) for i in wrong)])
    for c, (v, _, _), ok in zip(cases, outs, right):
        if ok:
            suspects.expect(v, c.expected, c.key, tried="", atol=c.atol, rtol=1e-5)
    valued = [i for i in wrong if outs[i][0] is not None]

    def expect(i: int, **more: Any) -> None:
        suspects.expect(outs[i][0], cases[i].expected, cases[i].key, tried=tries[i], atol=cases[i].atol, rtol=1e-5,
                        again=lambda *key: fn.observe(CALL_WITH, *key)[0], oracle=oracle,
                        distinguish=[cases[j].key for j in wrong if j != i], **more)

    if valued and suspects.suspects(outs[valued[0]][0], cases[valued[0]].key):
        expect(valued[0])  # a known mistake gives this very result: named
    if (exc := outs[wrong[0]][1]) is not None:  # an exception: named when a mistake raises the very same message
        case = cases[wrong[0]]
        hint = explain_raise(exc, [(k.key, k.fix, lambda k=k: k.make(*case.key)) for k in suspects.table])
        d = learner_error(exc, tried=tries[wrong[0]], expected=preview(case.expected))
        k = next((k for k in suspects.table if k.key == hint.get("cause")), None)
        raise Failure(replace(d, summary=k.summary, cause=k.cause, fix=k.fix) if k else d)
    i, values = valued[0], [o[0] for o in outs]
    if measure:
        measure(i, values, tries[i])
    named = factors(cases[i]) if factors else None
    _measure(fn, cases, values, wrong, i, tries[i], arg_names, oracle, named, tags or {})
    expect(i, factors=named)


def _measure(fn: Any, cases: Sequence[TensorCase], values: list, wrong: Sequence[int], i: int, tried: str,
             arg_names: Sequence[str], oracle: str, factors: dict[str, float] | None,
             tags: dict[str, tuple[str, str]]) -> None:
    """What is wrong with a result no known mistake gives (see :func:`judge_cases`)."""
    case, t = cases[i], values[i]
    a64, e64, expected = t.detach().double(), case.expected, preview(case.expected)
    if t.numel() and bool((a64 == 0).all()) and bool((e64 != 0).any()):
        fail("all zeros", tried=tried, got=f"every entry is 0 ({preview(t)})", expected=expected, fix="make sure "
             "every score is written into the tensor you return (a loop that fills another tensor, or returns "
             "before filling, leaves zeros)")
    ignored = []  # the arguments whose values make no difference: other random numbers there give the same result
    for j, arg in enumerate(case.args if t.is_floating_point() and bool(torch.isfinite(t).all()) else ()):
        g = torch.Generator().manual_seed(7919 + j)
        other = (float(arg.abs().max()) or 1.0) * torch.randn(*arg.shape, generator=g, dtype=torch.float64)
        try:
            again = fn.observe(CALL_WITH, *(other.to(arg.dtype) if m == j else a for m, a in enumerate(case.args)),
                               **case.kwargs)[0]
        except LearnerRaised:
            continue
        if isinstance(again, torch.Tensor) and again.shape == t.shape and torch.equal(again.double(), a64):
            ignored.append(arg_names[j])
    if ignored:
        names = " and ".join(ignored)
        fail(f"the result does not depend on {names}", tried=f"{tried}, then again with other values in {names}",
             got=f"the same result both times ({preview(t)})",
             expected=f"a result that changes with {names}: {expected}",
             cause=f"your function never uses the values of {names}" if len(ignored) < len(arg_names) else
             "your function returns the same thing whatever its inputs hold (a constant, or numbers typed in)",
             fix=f"compute the result from {names} as the docstring says")
    short, where = next((texts for tag, texts in tags.items() if len(wrong) < len(cases) and
                         set(wrong) == {j for j, c in enumerate(cases) if tag in c.tags}), ("", ""))
    if tuple(t.shape) != tuple(e64.shape):
        shapes = {tuple(v.shape) for v in values if v is not None}
        if len(shapes) == 1 and len({tuple(c.expected.shape) for c, v in zip(cases, values) if v is not None}) > 1:
            fixed = next(iter(shapes))
            fail(f"shape {fixed} whatever the input", tried=tried, got=f"shape {fixed} here and on every other input",
                 expected=f"shape {tuple(e64.shape)} here: the shape follows the inputs' shapes",
                 cause="a size is fixed in your code (a loop over a fixed range, or a number typed in) instead of "
                       "read from the inputs' shapes", fix="take every size from the inputs, e.g. K.shape[0] for the "
                       "number of keys")
        if where:
            fail(f"wrong shape with {short} only", tried=tried, got=f"shape {tuple(t.shape)}",
                 expected=f"shape {tuple(e64.shape)}",
                 cause=f"your result has the right shape on the other cases, so a step of your code breaks on {where}",
                 fix="follow the shapes in the docstring for any number of leading axes; print(x.shape) after each "
                     "step helps")
        expect_shape(t, e64.shape, tried=tried, what="your result")
    if t.ndim >= 3 and t.shape[:-2].numel() > 1:
        rows = [_close(x, e, case.atol) for x, e in zip(a64.flatten(0, -3), e64.flatten(0, -3))]
        if rows[0] and not any(rows[1:]):
            fail("right for the first batch entry only", tried=tried,
                 got="the first entry of the leading axes is right, every other one is wrong",
                 expected=f"{oracle} for every entry of the leading axes: {expected}",
                 cause="your code computes the scores of the first entry of the leading axes (index 0, e.g. "
                       "Q[0] @ K[0].T) and uses them for the others, or leaves the others out",
                 fix="let the product run over all leading axes: Q @ K.transpose(-2, -1)")
    # every entry a float16 or bfloat16 number (and not all small integers): computed in that dtype
    half = "" if t.dtype not in (torch.float32, torch.float64) or not t.numel() or not torch.isfinite(t).all() or (
        bool((t == t.round()).all()) and float(t.abs().max()) < 2048) else next(
        (str(h)[6:] for h in (torch.float16, torch.bfloat16) if bool((t.to(h).to(t.dtype) == t).all())), "")
    if half and bool(((a64 - e64).abs() <= 2e-2 * max(case.magnitude, 1e-30)).all()):
        fail(f"computed in {half}", tried=tried, got=f"values close to the expected ones but every one of them a "
             f"{half} number: {preview(t)}", expected=expected, cause=f"part of your computation ran in {half} "
             "(.half(), .bfloat16()), which keeps about 3 significant digits, and the result was converted back",
             fix="keep the computation in the inputs' dtype")
    if where and not describe_mismatch(t, e64, atol=case.atol, rtol=1e-5, factors=factors)[2]:
        fail(f"wrong with {short} only", tried=tried, got=preview(t), expected=expected,
             cause=f"your results are right on the other cases, so a step of your code mishandles {where}",
             fix="run your function on such an input yourself and compare each step with the docstring")


# ============================================================================ an answer that must be a tensor
def tensor_answer(value: Any, *, tried: str, what: str = "your function") -> torch.Tensor:
    """A learner's answer as a tensor (:func:`~.compare.as_tensor`), a NumPy array named as such: the docstrings ask
    for torch tensors, and an array means the computation left torch on the way."""
    from .compare import as_tensor

    if isinstance(value, np.ndarray):
        fail("returned a NumPy array, not a tensor", tried=tried, got=f"a NumPy array of shape {value.shape} "
             f"({value.dtype})", expected="a torch tensor, as the docstring says",
             cause="you converted to NumPy along the way (.numpy(), np.asarray or a NumPy function)",
             fix="stay with torch operations (torch.from_numpy(array) turns an array back into a tensor)")
    return as_tensor(value, tried=tried, what=what)


# ============================================================================ a learner's call, its exception explained
def call_explained(fn: Callable, *args: Any, tried: str, expected: str, constructs: Sequence[Construct] = (),
                   patterns: Sequence[Pattern] = ()) -> Any:
    """The learner's ``fn(*args)``; when it raises, end the check with :func:`~.core.learner_error` and the cause and
    fix that :func:`explain_raise` finds (a construct of the topic, a pattern, or the course-wide table)."""
    try:
        return fn(*args)
    except LearnerRaised as exc:
        raise Failure(learner_error(exc, tried=tried, expected=expected,
                                    **explain_raise(exc, constructs, patterns))) from None


# ============================================================================ NaN or inf from an exponential
def exp_limits(dtype: torch.dtype) -> tuple[float, float]:
    """Above the first, e^z overflows to inf in ``dtype``; below the second (half the smallest subnormal), it rounds
    to 0."""
    exponent = {torch.float16: -24, torch.bfloat16: -133, torch.float64: -1074}.get(dtype, -149)
    return math.log(torch.finfo(dtype).max), (exponent - 1) * math.log(2.0)


def nan_or_inf(t: torch.Tensor) -> str:
    """What ``t`` holds that is not finite: "NaN", "inf" or "NaN and inf"."""
    return " and ".join(k for k, hit in (("NaN", torch.isnan(t).any()), ("inf", torch.isinf(t).any())) if hit)


def explain_nonfinite(slices: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype, *, tried: str, got: str, kinds: str,
                      expected: str, scaled: str = "x", last: bool = True) -> None:
    """Fail saying where the NaN or inf (``kinds``) of a softmax-like answer come from. ``slices`` marks (shaped like
    the float64 scores ``xs``) the slices whose answer is not finite; ``dtype`` is the one the learner computed in.
    Scores beyond e^z's range, or spread wider than it, mean that the slice's own maximum was not what was
    subtracted; -inf scores, an operation on -inf. Otherwise, when ``last``, a plain "{kinds} in the result"."""
    scores, (hi, lo), name = xs[slices & torch.isfinite(xs)], exp_limits(dtype), str(dtype).replace("torch.", "")
    shift = "subtract the maximum of each slice along `dim` before exp: x - x.amax(dim, keepdim=True)"
    top, bottom = (float(scores.max()), float(scores.min())) if scores.numel() else (-math.inf, math.inf)
    if top > hi:
        fail(f"{kinds} from an overflow", tried=tried, got=got, expected=expected, fix=shift,
             cause=f"in those slices {scaled} reaches {fmt(top)}, and in {name} e^z is inf for z > {hi:.2f}: you "
                   "exponentiated without subtracting the slice's own maximum")
    if scores.numel() and top < lo:
        fail(f"{kinds} from an underflow", tried=tried, got=got, expected=expected, fix=shift,
             cause=f"in those slices every score is below {lo:.1f}, where e^z rounds to 0 in {name}, so the sum is 0 "
                   "(0/0 is NaN, log 0 is -inf): you exponentiated without subtracting the slice's own maximum")
    if top - bottom > hi:
        fail(f"{kinds} in slices of widely spread scores", tried=tried, got=got, expected=expected, fix=shift,
             cause=f"in those slices {scaled} spans {fmt(top - bottom)} (from {fmt(bottom)} to {fmt(top)}). In {name}, "
                   f"e^(x − c) neither overflows nor underflows to all zeros only for a shift c between max − {hi:.2f} "
                   f"and max + {-lo:.1f}, and yours was outside (the mean, the minimum or the first entry of such a "
                   "slice lies far from its maximum)")
    if torch.isneginf(xs)[slices].any():
        fail(f"{kinds} where scores are -inf", tried=tried, got=got + " (in slices holding -inf scores)",
             expected=expected + " (a -inf score contributes e^-inf = 0)",
             cause="an operation on -inf gave NaN: -inf - (-inf), -inf · 0, or inf / inf",
             fix="let exp turn -inf into 0: subtract the slice maximum (finite here), then exponentiate")
    if last:
        fail(f"{kinds} in the result", tried=tried, got=got, expected=expected,
             fix="look for a division by zero or a log of 0 in your steps")


# ============================================================================ a reduction's exceptions
def reduction_hint(exc: LearnerRaised, *, dim: bool) -> dict:
    """``cause``/``fix`` for the two exceptions a reduction along the wrong axis raises, else ``{}``: a maximum or sum
    without keepdim=True that no longer broadcasts against the input, and an axis number the input does not have
    (``dim``: the function takes a `dim` argument, which the advice is to use)."""
    msg = exc.message
    if "must match the size" in msg or "could not be broadcast" in msg:
        return dict(cause="a maximum or sum reduced without keepdim=True lost the reduced axis, so it no longer lines "
                          "up with the input's axes",
                    fix="keep the reduced axis: .amax(dim, keepdim=True) and .sum(dim, keepdim=True) "
                        "(NumPy: keepdims=True)")
    if ("out of range" in msg and "imension" in msg) or "out of bounds for array" in msg:
        return dict(cause="your code uses an axis number that this input does not have",
                    fix="use the `dim` argument (or -1 for the last axis) rather than a fixed axis number" if dim else
                    "count axes from the end (-1 for the last) rather than with a fixed axis number, and keep every "
                    "axis the input has (no .squeeze() without an axis)")
    return {}


# ============================================================================ a tuple of results
def unpack(result: Any, names: Sequence[str], *, tried: str, fix: str = "") -> tuple[torch.Tensor, ...]:
    """The tensors of a returned tuple (``names``: what each element is, e.g. ``("output", "weights")``), or a
    diagnosis of what came back instead: one tensor, another number of items, None, NumPy arrays, or an element that
    is a Python list of tensors. ``fix`` says how the function should end (default: ``return <names>``)."""
    want = f"({', '.join(names)})"
    fix = fix or f"end the function with `return {', '.join(names)}`"
    expected = f"a tuple of {len(names)} tensors {want}"
    if isinstance(result, torch.Tensor):
        fail(f"returned one tensor, not {want}", tried=tried, got=f"one tensor of shape {tuple(result.shape)}",
             expected=expected, fix=fix)
    if not isinstance(result, (tuple, list)) or len(result) != len(names):
        got = f"a {type(result).__name__} of {len(result)} items" if isinstance(result, (tuple, list)) else \
            ("None" if result is None else type(result).__name__)
        fail(f"did not return {want}", tried=tried, got=got, expected=expected, fix=fix,
             cause="your function has no `return`" if result is None else "")
    if any(isinstance(r, np.ndarray) for r in result):
        fail("returned NumPy arrays, not tensors", tried=tried, expected=f"{len(names)} torch tensors {want}",
             got=", ".join(f"{n}: {'a NumPy array' if isinstance(r, np.ndarray) else type(r).__name__}"
                           for n, r in zip(names, result)),
             cause="part of your computation went through NumPy (.numpy(), np.exp, np.matmul…), which returns arrays",
             fix="stay with torch operations on the tensors")
    for name, item in zip(names, result):
        if isinstance(item, (list, tuple)) and item and all(isinstance(t, torch.Tensor) for t in item):
            shapes = ", ".join(str(tuple(t.shape)) for t in item)
            fail(f"{name} returned as a list of {len(item)} tensors", tried=tried, got=f"a list of tensors of shapes {shapes}",
                 expected="one tensor", cause=f"your {name} holds the pieces ({shapes}) side by side in a Python list "
                 "instead of one tensor made of them", fix="join them into one tensor with torch.cat or torch.stack")
    ordinals = ("first", "second", "third", "fourth", "fifth")
    return tuple(as_tensor(r, tried=tried, what=f"the {n} ({ordinals[i]} element)")
                 for i, (n, r) in enumerate(zip(names, result)))
