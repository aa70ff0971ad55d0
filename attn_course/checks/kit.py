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
           "einsum_flops"]

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
