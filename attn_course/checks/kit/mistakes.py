"""Known mistakes as data, and the one engine that judges a check's cases against them.

:class:`Known` is a mistake: a key, what it is, its cause and fix, and how to reproduce it on the check's case
(the same arguments the oracle takes). :class:`Suspects` tries a check's table of them on each case: it rules
out those an earlier right case contradicts, never blames one whose output is right on this case, names the
survivor, and when several survive runs the learner's function on a case that tells them apart before saying
"these give the same numbers here"."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from ..compare import Mistake, expect_close, same

__all__ = ["Case", "Known", "AlongDim", "Suspects", "fits", "known_rows", "variants", "factors"]


Case = tuple  # the positional arguments of one call: what the oracle, the learner and every Known take


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


class AlongDim(Known):
    """A known mistake whose texts may name the case's ``dim`` (``{dim}``): its second argument, else -1."""

    def on(self, case: Case) -> Mistake:
        dim = str(case[1]) if len(case) > 1 else "-1"
        return Mistake(*(t.replace("{dim}", dim) for t in (self.summary, self.cause, self.fix)),
                       lambda: self.make(*case))


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
        them on its other cases: :meth:`confirm`.) A case where the learner's function raises tells nothing."""
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


    def confirm(self, fn: Callable[..., Any], actual: torch.Tensor, case: Case, expected: torch.Tensor,
                others: Sequence[Case], oracle: Callable[..., torch.Tensor], tol: dict,
                convert: Callable[[Any], Any] = lambda x: x) -> None:
        """Before a wrong ``actual`` is named: drop from the table every known mistake that reproduces it on ``case``
        but none of the learner's other wrong answers on ``others`` (``oracle(*other)`` the right one; cases where
        the row or the learner gives no tensor, or the learner is right, say nothing), so that a row which
        coincides with another mistake on one case only (a window of 3 with blocks of 4: window + 1, or block_size
        where window belongs) is not named — the check of a single suspect :meth:`narrow` leaves to the topic. A
        row that fits some of them stays: the rows' loops need not match the learner's in every edge case. The
        learner's function runs once per other case, only when a row reproduces ``actual``."""
        found = self.suspects(actual, case, expected)
        if not found:
            return
        mine: dict[int, Any] = {}

        def learner(i: int) -> Any:
            if i not in mine:
                try:
                    got = convert(fn(*others[i]))
                except Exception:  # noqa: BLE001 - raising (or an answer of another kind) tells nothing here
                    got = None
                right = oracle(*others[i]) if isinstance(got, torch.Tensor) else None
                mine[i] = None if right is None or (tuple(got.shape) == tuple(right.shape) and same(got, right, **tol)) \
                    else got
            return mine[i]

        drop = set()
        for known in found:
            fits = []
            for i, other in enumerate(others):
                out = _output(known, other) if other is not case else None
                if out is not None and isinstance(got := learner(i), torch.Tensor):
                    fits.append(tuple(out.shape) == tuple(got.shape) and same(got, out, **tol))
            if fits and not any(fits):
                drop.add(known.key)
        self.table = [k for k in self.table if k.key not in drop]

def fits(known: Known, case: Case, *, raised: bool, value: torch.Tensor | None, atol: float,
         rtol: float = 1e-4) -> bool:
    """Does mistake ``known`` do what the learner's code did on a case it got wrong: raise where it raised
    (``raised``), give its numbers (``value``) where it returned? (:class:`Suspects` asks this of one wrong case;
    a check that runs several can require a mistake to fit them all.)"""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            made = known.make(*case)
    except Exception:  # noqa: BLE001 - the mistake raises here
        return raised
    return not raised and value is not None and isinstance(made, torch.Tensor) and \
        same(value, made, atol=atol, rtol=rtol)


def _output(known: Known, case: Case) -> torch.Tensor | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = known.make(*case)
    except Exception:  # noqa: BLE001 - this mistake cannot happen on this case
        return None
    return out if isinstance(out, torch.Tensor) else None


def known_rows(*rows: tuple) -> list[Known]:
    """A table from rows (key, summary, cause, fix, *ways): one :class:`Known` per way of writing that mistake (keys
    ``key``, ``key/1``…, all with the same words), each run on float64 copies of the case, so that a way that is
    right on a case is not ruled out by float32 rounding."""
    def in_float64(way):
        return lambda *a: way(*(x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in a))

    return [Known(f"{key}/{i}" if i else key, summary, cause, fix, in_float64(way))
            for key, summary, cause, fix, *ways in rows for i, way in enumerate(ways)]


def variants(variant: Callable[..., Any], rows: Iterable[tuple[str, str, str, str]]) -> list[Known]:
    """A table from rows (key, summary, cause, fix) of one function written with a switch per mistake: each
    mistake's output is ``variant(*case, key)``."""
    return [Known(key, summary, cause, fix, lambda *case, key=key: variant(*case, key))
            for key, summary, cause, fix in rows]


def factors(**named: float) -> dict[str, float]:
    """Names for a constant factor, keeping only values no other name (nor 2, ½ or −1) shares on this input."""
    taken = [2.0, 0.5, -1.0, 1.0, *named.values()]
    return {k: v for k, v in named.items() if sum(abs(v - t) < 1e-9 or abs(1 / v - t) < 1e-9 for t in taken) == 1}
