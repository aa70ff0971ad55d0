"""What a check holds: a :class:`Learner`, the learner's exercise (or an object made from it), reached
only through operations that a session carries."""

from __future__ import annotations

from typing import Any

import torch

from .encoding import Handle, decode, describe_args
from .limits import DEFAULT_TIMEOUT, Clock, capped_timeout
from .outcomes import (LearnerChangedSettings, LearnerNotAttempted, LearnerRaised, LearnerTimedOut, MachineBusy,
                       ReplayMismatch)
from .sessions import Session


class Learner:
    """The learner's exercise (or an object made from it), as a check sees it.

    ``learner(*args)`` calls it; ``learner.method("apply")`` is one of its attributes; ``construct``
    instantiates a class and returns a Learner for the new object; ``vjp`` runs it and backpropagates;
    ``inspect`` describes it; ``observe`` runs a registered learner-side probe. Results are plain data;
    failures raise :class:`LearnerRaised`, :class:`LearnerTimedOut` or :class:`LearnerNotAttempted`
    (:class:`MachineBusy` when the machine was too busy to tell, :class:`LearnerChangedSettings` when the code left
    PyTorch's default dtype or gradient mode changed). All operations of one check share
    one :class:`Clock` (``timeout``: its limit of computing; ``clock``: the check's, when given).
    """

    def __init__(self, session: Session, name: str, *, ref: tuple = ("exercise",), method: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, clock: Clock | None = None):
        self.session, self.name, self.ref, self.attr = session, name, tuple(ref), method
        self.timeout = timeout
        self.clock = clock if clock is not None else Clock(capped_timeout(timeout))
        self.last_call = ""  # what the most recent operation was given, for "tried" lines

    # --- operations -------------------------------------------------------------------------------
    def _op(self, op: str, args: tuple = (), kwargs: dict | None = None, extra: dict | None = None,
            timeout: float | None = None) -> Any:
        kwargs = kwargs or {}
        label = f"{self.name}.{self.attr}" if self.attr else self.name
        self.last_call = describe_args(label, args, kwargs)
        outcome, arrays = self.session.run(op, list(self.ref), self.attr, tuple(args), kwargs,
                                           timeout=capped_timeout(timeout) if timeout else None, extra=extra,
                                           clock=self.clock)
        if outcome.get("changed"):  # the code ran, and left PyTorch's global settings changed (now put back)
            raise LearnerChangedSettings(list(outcome["changed"]), self.last_call)
        if "ok" in outcome:
            return decode(outcome["ok"], arrays)
        if outcome.get("not_attempted"):
            raise LearnerNotAttempted()
        if "timeout" in outcome:
            stopped = LearnerTimedOut(float(outcome["timeout"]), self.last_call, waited=outcome.get("waited"),
                                      computed=outcome.get("computed"), by=str(outcome.get("by", "cpu")),
                                      queued=outcome.get("queued"))
            if stopped.by == "wall" and not stopped.waiting and stopped.computed < stopped.seconds / 2:
                raise MachineBusy(stopped)
            raise stopped
        if isinstance(outcome.get("raised"), dict):
            raise LearnerRaised(outcome["raised"], self.last_call)
        raise ReplayMismatch("a recorded outcome is malformed")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._op("call", args, kwargs)

    def method(self, name: str) -> "Learner":
        return Learner(self.session, self.name, ref=self.ref, method=name, timeout=self.timeout, clock=self.clock)

    def construct(self, *args: Any, **kwargs: Any) -> "Learner":
        handle = self._op("construct", args, kwargs)
        if not isinstance(handle, Handle):
            raise ReplayMismatch("construct returned no object")
        return Learner(self.session, f"{self.name}(…)", ref=("handle", handle.id), timeout=self.timeout,
                       clock=self.clock)

    def vjp(self, args: tuple, upstream: Any, *, wrt: tuple[int, ...] = (0,), index: int | None = None,
            kwargs: dict | None = None) -> tuple[Any, tuple | None]:
        """Run ``self(*args)`` with the arguments at ``wrt`` requiring grad, then backpropagate ``upstream``
        from the output (its element ``index`` when it returns a tuple). Returns ``(output, grads)``;
        ``grads`` is None when the output does not depend on the inputs through autograd."""
        out, grads = self._op("vjp", args, kwargs, extra={"wrt": list(wrt), "index": index, "upstream": upstream})
        return out, grads

    def inspect(self) -> dict[str, Any]:
        return self._op("inspect")

    def set_parameters(self, values: dict[str, torch.Tensor]) -> None:
        self._op("set_parameters", extra={"values": dict(values)})

    def observe(self, name: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        return self._op("observe", args, kwargs, extra={"probe": name}, timeout=timeout)
