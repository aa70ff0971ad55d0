"""Learner-side operations: what runs on the learner's live objects (call, construct, vjp, inspect,
set_parameters, observe) under the check's time limit, every outcome turned into data; and the
registry of learner-side probes (:func:`probe`)."""

from __future__ import annotations

import inspect
import time
from typing import Any, Callable

import numpy as np
import torch

from .encoding import Encoder, Handle, safe_repr, type_name
from .limits import Clock, TimeUp, queued_seconds, time_limit
from .outcomes import is_stub, raised_info

#: Named learner-side measurements (``Learner.observe``): ``name -> function(obj, *args, **kwargs)``.
PROBES: dict[str, Callable[..., Any]] = {}


def probe(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a learner-side measurement a check can ask for with ``learner.observe(name, ...)``.

    A probe runs in the learner's process, so in grading its answer is trusted as far as that process
    is: use probes only for what cannot be seen from outputs (memory or work of the learner's code).
    """

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        PROBES[name] = fn
        return fn

    return register


def _signature(obj: Any) -> list[dict[str, Any]] | None:
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return None
    return [{"name": p.name, "kind": p.kind.name, "default": None if p.default is p.empty else safe_repr(p.default),
             "has_default": p.default is not p.empty} for p in params]


def _inspect(obj: Any) -> dict[str, Any]:
    is_class = isinstance(obj, type)
    info: dict[str, Any] = {
        "kind": "class" if is_class else ("function" if inspect.isroutine(obj) else
                                          ("module" if isinstance(obj, torch.nn.Module) else "other")),
        "type": obj.__qualname__ if is_class else type_name(obj),
        "callable": callable(obj),
        "defined_in": str(getattr(obj, "__module__", "") or ""),
        "signature": _signature(obj.__init__ if is_class else obj) if callable(obj) else None,
    }
    if is_class:
        info["module_class"] = issubclass(obj, torch.nn.Module)
        info["autograd_function"] = issubclass(obj, torch.autograd.Function)
        info["bases"] = [b.__qualname__ for b in obj.__mro__[1:4]]
    if isinstance(obj, torch.nn.Module):
        info["forward_signature"] = _signature(obj.forward)
        info["parameters"] = [[n, list(p.shape), str(p.dtype).replace("torch.", "")] for n, p in obj.named_parameters()]
        info["modules"] = [[n, type(m).__name__,
                            [m.in_features, m.out_features, m.bias is not None] if isinstance(m, torch.nn.Linear) else None]
                           for n, m in obj.named_modules() if n]
        info["training"] = bool(obj.training)
    return info


def _settings() -> tuple[torch.dtype, bool]:
    """PyTorch's global settings that a function's result depends on and that stay changed after it returns."""
    return torch.get_default_dtype(), torch.is_grad_enabled()


def _put_back(settings: tuple[torch.dtype, bool]) -> list[str]:
    """Restore ``settings`` where the learner's code changed them; what each had become, in words."""
    dtype, grad = settings
    changed = []
    if torch.get_default_dtype() != dtype:
        changed.append(f"torch.get_default_dtype() is {torch.get_default_dtype()} (it was {dtype})")
        torch.set_default_dtype(dtype)
    if torch.is_grad_enabled() != grad:
        changed.append(f"torch.is_grad_enabled() is {not grad} (it was {grad})")
        torch.set_grad_enabled(grad)
    return changed


class Runner:
    """Runs operations on live objects (shared by the local and the recording session)."""

    def __init__(self, resolve: Callable[[], Any]):
        self._resolve = resolve
        self._handles: dict[int, Any] = {}

    def target(self, ref: list) -> Any:
        if ref[0] == "exercise":
            return self._resolve()
        return self._handles[int(ref[1])]

    def run(self, op: str, ref: list, method: str | None, args: tuple, kwargs: dict, timeout: float,
            extra: dict[str, Any], clock: Clock | None = None) -> tuple[dict, dict[str, np.ndarray]]:
        clock = clock if clock is not None else Clock(timeout)  # no check's clock: this call alone
        cpu_left, wall_left = clock.allow(timeout)
        if cpu_left <= 1e-3 or wall_left <= 1e-3:  # the check's time is used up: the code is not run again
            return {"timeout": True, **clock.outcome("cpu" if cpu_left <= 1e-3 else "wall")}, {}
        started, queued = time.process_time(), queued_seconds()
        settings = _settings()
        try:
            outcome, arrays = self._run(op, ref, method, args, kwargs, extra, cpu_left, wall_left)
        finally:
            changed = _put_back(settings)
            clock.computed += time.process_time() - started
            now = queued_seconds()
            clock.queued = None if queued is None or now is None or clock.queued is None else \
                clock.queued + now - queued
        if "_by" in outcome:  # stopped: the numbers the learner reads (waited, computed) go into the outcome
            outcome = {"timeout": True, **clock.outcome(outcome["_by"])}
        if changed and "ok" in outcome:  # (an exception or a time-out is the verdict; the settings are put back)
            outcome = {**outcome, "changed": changed}
        return outcome, arrays

    def _run(self, op, ref, method, args, kwargs, extra, cpu_left: float,
             wall_left: float) -> tuple[dict, dict[str, np.ndarray]]:
        enc = Encoder()
        phase = "call"
        limit: dict[str, Any] = {"fired": False}
        try:
            with time_limit(cpu_left, wall_left) as limit:
                try:
                    obj = self.target(ref)
                    if method:
                        obj = getattr(obj, method)
                    if op == "call":
                        return {"ok": enc.encode(obj(*args, **kwargs))}, enc.arrays
                    if op == "construct":
                        made = obj(*args, **kwargs)
                        handle = Handle(len(self._handles) + 1, type_name(made))
                        self._handles[handle.id] = made
                        return {"ok": enc.encode(handle)}, enc.arrays
                    if op == "vjp":
                        # Gradients on, whatever the caller's mode (a vjp may be asked for inside a backward pass).
                        with torch.enable_grad():
                            args = tuple(a.detach().requires_grad_(True) if i in extra["wrt"] else a
                                         for i, a in enumerate(args))
                            out = obj(*args, **kwargs)
                            picked = out[extra["index"]] if extra.get("index") is not None and isinstance(out, (tuple, list)) else out
                            encoded_out = enc.encode(out)
                            if not isinstance(picked, torch.Tensor) or not picked.requires_grad:
                                return {"ok": {"t": "tuple", "items": [encoded_out, {"t": "py", "v": None}]}}, enc.arrays
                            phase = "backward"
                            grads = torch.autograd.grad(picked, [args[i] for i in extra["wrt"]], extra["upstream"],
                                                        allow_unused=True)
                        return {"ok": {"t": "tuple", "items": [encoded_out, enc.encode(tuple(grads))]}}, enc.arrays
                    if op == "inspect":
                        return {"ok": enc.encode(_inspect(obj))}, enc.arrays
                    if op == "set_parameters":
                        with torch.no_grad():
                            for name, value in extra["values"].items():
                                param = obj.get_parameter(name)
                                if tuple(param.shape) != tuple(value.shape):
                                    raise ValueError(f"parameter {name} has shape {tuple(param.shape)}, "
                                                     f"expected {tuple(value.shape)}")
                                param.copy_(value)
                        return {"ok": {"t": "py", "v": None}}, enc.arrays
                    if op == "observe":
                        return {"ok": enc.encode(PROBES[extra["probe"]](obj, *args, **kwargs))}, enc.arrays
                    raise ValueError(f"unknown operation {op!r}")
                except TimeUp:
                    raise
                except KeyboardInterrupt:
                    if limit["fired"]:
                        raise TimeUp() from None
                    raise
                except NotImplementedError as exc:
                    if phase == "call" and is_stub(exc):
                        return {"not_attempted": True}, {}
                    return {"raised": raised_info(exc, phase)}, {}
                except BaseException as exc:  # noqa: BLE001 - SystemExit and custom BaseExceptions too
                    return {"raised": raised_info(exc, phase)}, {}
        except TimeUp:
            return {"_by": limit["fired"] or "wall"}, {}
