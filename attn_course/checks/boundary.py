"""The learner boundary: the only way a check touches the learner's code.

A check never holds the learner's function itself. It holds a :class:`Learner`, and everything it does
with it (call it, take a gradient through it, build a module from a class, look at its signature)
is an *operation* that crosses this boundary as plain data: tensors, arrays, numbers, strings, tuples,
lists and dicts go in; the same kinds come back, decoded afresh (a tensor subclass, a lazy object or
a value with a custom ``__eq__`` arrives as a plain tensor or a described opaque value). Each
operation runs under a time limit and turns whatever the learner's code raises, BaseException
subclasses included, into data too.

Three sessions carry the operations:

* :class:`LocalSession` runs them on the live objects (a notebook, the tests);
* :class:`RecordingSession` does the same and keeps a log of every operation and its outcome, which
  the grader reads back (``ATTN_COURSE_RECORD_DIR`` set in the kernel's environment);
* :class:`ReplaySession` runs no learner code at all: it answers each operation from such a log. The
  grader replays every check in its own process, so the verdict is computed by the course's own,
  untouched code from nothing but the learner's outputs — however the learner's process was patched.

Because a check behaves the same in all three (it only ever sees decoded plain data), a replay
reaches the same verdict as the live run, operation for operation.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import json
import linecache
import os
import signal
import sys
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

__all__ = [
    "DEFAULT_TIMEOUT",
    "RECORD_ENV",
    "CALL_TIMEOUT_ENV",
    "capped_timeout",
    "Learner",
    "LearnerRaised",
    "LearnerTimedOut",
    "MachineBusy",
    "Clock",
    "LearnerNotAttempted",
    "ReplayMismatch",
    "Opaque",
    "Handle",
    "Session",
    "LocalSession",
    "RecordingSession",
    "ReplaySession",
    "probe",
    "describe_args",
]

#: Seconds of computing (CPU time) the learner's code may use in one check, in all its calls; the check
#: also stops it once the learner has waited ``WALL_FACTOR`` times that long (see :class:`Clock`).
DEFAULT_TIMEOUT = 10.0
#: Set in a kernel's environment, checks also write their operation log into this folder (grading).
RECORD_ENV = "ATTN_COURSE_RECORD_DIR"
#: Set in a kernel's environment (seconds), no call of the learner's code may compute longer than this,
#: whatever its check allows (an instructor's limit for a whole class: ``grade --call-timeout``).
CALL_TIMEOUT_ENV = "ATTN_COURSE_CALL_TIMEOUT"
#: The largest tensor or array a learner's result may hold (elements); larger ones are refused.
MAX_ELEMENTS = 1 << 24
#: The largest log the grader reads back, in bytes (its arrays, uncompressed).
MAX_LOG_BYTES = 256 * 2**20
_MAX_ITEMS, _MAX_DEPTH, _MAX_TEXT = 10_000, 16, 2_000


# ============================================================================ what crosses, as data
class Opaque:
    """A learner's value that is not plain data (a custom object): only its type and a short repr cross."""

    def __init__(self, type_name: str, text: str):
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return f"<{self.type_name}: {self.text}>"


@dataclass(frozen=True)
class Handle:
    """A learner-side object the check keeps working with (e.g. a module built from the learner's class)."""

    id: int
    type_name: str


_DTYPES = {str(d).replace("torch.", ""): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}


class _Encoder:
    """Turns values into a JSON-able tree plus named arrays (``a0``, ``a1``, …)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def _array(self, array: np.ndarray) -> str:
        key = f"a{len(self.arrays)}"
        self.arrays[key] = np.array(array, order="C", copy=True)  # (ascontiguousarray turns 0-d into 1-d)
        return key

    def encode(self, value: Any, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            return {"t": "object", "type": type(value).__name__, "repr": "(nested too deeply)"}
        if value is None or isinstance(value, (bool, int, float, str)) and type(value) in (bool, int, float, str):
            if isinstance(value, str) and len(value) > _MAX_TEXT:
                value = value[:_MAX_TEXT] + "…"
            return {"t": "py", "v": value}
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biufc":
                return {"t": "object", "type": f"ndarray[{value.dtype}]", "repr": f"shape {value.shape}"}
            if value.size > MAX_ELEMENTS:
                return {"t": "too_large", "type": "ndarray", "shape": list(value.shape)}
            return {"t": "ndarray", "a": self._array(value), "dtype": str(value.dtype), "shape": list(value.shape)}
        if isinstance(value, np.generic) and value.dtype.kind in "biufc":
            return {"t": "npscalar", "dtype": str(value.dtype), "v": value.item()}
        if isinstance(value, torch.dtype):
            return {"t": "dtype", "v": str(value).replace("torch.", "")}
        if isinstance(value, torch.device):
            return {"t": "device", "v": str(value)}
        if isinstance(value, Handle):
            return {"t": "handle", "id": value.id, "type": value.type_name}
        if type(value) in (tuple, list, torch.Size):
            if len(value) > _MAX_ITEMS:
                return {"t": "too_large", "type": type(value).__name__, "shape": [len(value)]}
            kind = "list" if type(value) is list else "tuple"
            return {"t": kind, "items": [self.encode(v, depth + 1) for v in value]}
        if type(value) is dict:
            if len(value) > _MAX_ITEMS:
                return {"t": "too_large", "type": "dict", "shape": [len(value)]}
            return {"t": "dict", "items": [[self.encode(k, depth + 1), self.encode(v, depth + 1)] for k, v in value.items()]}
        return {"t": "object", "type": _type_name(value), "repr": _safe_repr(value)}

    def _tensor(self, t: torch.Tensor) -> dict:
        node: dict[str, Any] = {"t": "tensor", "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                                "device": t.device.type, "grad": bool(t.requires_grad)}
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            node["sub"] = _type_name(t)
        if t.numel() > MAX_ELEMENTS:
            return {**node, "t": "too_large", "type": "tensor"}
        if t.layout != torch.strided or t.dtype not in _DTYPES.values() or t.device.type == "meta":
            return node  # no data: the check says what it expected
        data = torch.Tensor.detach(t)
        data = torch.Tensor.cpu(data).resolve_conj().resolve_neg()
        if isinstance(data, torch.Tensor) and type(data) is not torch.Tensor:
            data = data.as_subclass(torch.Tensor)
        array = data.view(torch.int16).numpy() if data.dtype == torch.bfloat16 else data.numpy()
        node["a"] = self._array(array)
        return node


def _type_name(value: Any) -> str:
    cls = type(value)
    module = getattr(cls, "__module__", "") or ""
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def _safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except _TimeUp:
        raise
    except BaseException:  # noqa: BLE001 - a learner's __repr__ may do anything (it runs under the time limit)
        text = "(no repr)"
    return text if len(text) <= 200 else text[:199] + "…"


def decode(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    """Rebuild a value from :class:`_Encoder`'s tree; tensors and arrays come back as fresh copies."""
    kind = node.get("t") if isinstance(node, dict) else None
    if kind == "py":
        return node["v"]
    if kind == "tensor":
        dtype = _DTYPES.get(node["dtype"])
        if "a" not in node or dtype is None:
            return torch.empty(node["shape"], device="meta") if node.get("device") == "meta" else \
                Opaque(f"tensor ({node.get('device')}, {node['dtype']})", "without readable data")
        array = np.array(arrays[node["a"]], copy=True)
        t = torch.from_numpy(array)
        if dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        if list(t.shape) != list(node["shape"]) or t.dtype != dtype:
            raise ReplayMismatch("a recorded tensor does not match its description")
        return t
    if kind == "ndarray":
        array = np.array(arrays[node["a"]], copy=True)
        if str(array.dtype) != node["dtype"] or list(array.shape) != list(node["shape"]):
            raise ReplayMismatch("a recorded array does not match its description")
        return array
    if kind == "npscalar":
        return np.dtype(node["dtype"]).type(node["v"])
    if kind == "dtype":
        return _DTYPES.get(node["v"], node["v"])
    if kind == "device":
        return torch.device(node["v"])
    if kind == "handle":
        return Handle(int(node["id"]), str(node["type"]))
    if kind in ("tuple", "list"):
        items = [decode(v, arrays) for v in node["items"]]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        out = {}
        for k, v in node["items"]:
            key = decode(k, arrays)
            out[key if isinstance(key, (str, int, float, bool, type(None), tuple)) else repr(key)] = decode(v, arrays)
        return out
    if kind == "too_large":
        return Opaque(f"{node['type']} of shape {tuple(node['shape'])}", "too large to check")
    if kind == "object":
        return Opaque(str(node.get("type")), str(node.get("repr", "")))
    raise ReplayMismatch(f"unknown recorded value {kind!r}")


def _digest(tree: Any, arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(json.dumps(tree, sort_keys=True, default=str).encode())
    for key in sorted(arrays):
        a = arrays[key]
        h.update(f"{key}:{a.dtype}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:32]


def describe_value(value: Any) -> str:
    """A short description: ``(2, 5) float32``, ``bool (4, 4)``, ``3``, ``None``."""
    if isinstance(value, torch.Tensor):
        kind = str(value.dtype).replace("torch.", "")
        return f"{kind} {tuple(value.shape)}" if value.dtype == torch.bool else f"{tuple(value.shape)} {kind}"
    if isinstance(value, np.ndarray):
        return f"ndarray {value.shape} {value.dtype}"
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, (list, tuple)) and len(value) <= 6 and all(isinstance(v, (int, float, bool)) for v in value):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, Handle):
        return f"your {value.type_name} object"
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def describe_args(name: str, args: tuple, kwargs: dict) -> str:
    """``attention(Q (2, 3, 4) float32, K …, mask=bool (3, 5))``: what a call was given."""
    shown = [describe_value(a) for a in args] + [f"{k}={describe_value(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(shown)})"


# ============================================================================ outcomes of learner code
class LearnerRaised(Exception):
    """The learner's code raised. ``type_name``, ``message``; ``line``/``code`` locate it in their cell."""

    def __init__(self, info: dict[str, Any], call: str):
        self.type_name = str(info.get("type", "Exception"))
        self.message = str(info.get("message", ""))
        self.line = info.get("line")
        self.code = str(info.get("code", ""))
        self.function = str(info.get("function", ""))
        self.phase = str(info.get("phase", "call"))
        self.call = call
        super().__init__(f"{self.type_name}: {self.message}")

    def where(self) -> str:
        """``line 7 of your cell: scores = Q @ K.T`` (empty when the error came from inside a library)."""
        if self.line is None:
            return ""
        function = f", in {self.function}()" if self.function and not self.function.startswith("<") else ""
        return f"line {self.line} of your cell{function}: {self.code.strip()}" if self.code else \
            f"line {self.line} of your cell{function}"


class LearnerTimedOut(Exception):
    """The learner's code ran past its time limit and was stopped. ``seconds`` is the check's limit (of
    computing); ``waited`` the seconds the learner had waited since the check started; ``computed`` the
    seconds the learner's code computed in that time; ``by`` which limit struck (``"cpu"`` or ``"wall"``)."""

    def __init__(self, seconds: float, call: str, *, waited: float | None = None, computed: float | None = None,
                 by: str = "cpu", queued: float | None = None):
        self.seconds, self.call, self.by = seconds, call, by
        self.waited = float(waited) if waited is not None else float(seconds)
        self.computed = float(computed) if computed is not None else float(seconds)
        self.queued = float(queued) if queued is not None else None  # runnable, waiting for a processor
        super().__init__(f"{call} was stopped after {self.waited:.1f} s")

    @property
    def waiting(self) -> bool:
        """The code neither computed nor wanted to while the learner waited: it sleeps or waits for
        something: it was neither running nor ready to run for most of the wait. (Where the time spent
        ready to run is unknown, computing for less than a tenth of the wait counts.)"""
        if self.by != "wall":
            return False
        if self.queued is None:
            return self.computed < 0.1 * self.waited
        return self.computed + self.queued < 0.5 * self.waited


class MachineBusy(BaseException):
    """The wall-clock limit struck while the learner's code had computed for less than half its limit:
    the processor was busy with other work, so nothing is known about the code. A BaseException, so
    that a check's ``except Exception`` (or ``except LearnerTimedOut``) never turns it into a verdict on
    the learner: :class:`~.core.Check` reports it as an error verdict ("not checked")."""

    def __init__(self, timeout: LearnerTimedOut):
        self.timeout = timeout
        super().__init__(str(timeout))


class LearnerNotAttempted(Exception):
    """The learner's code still raises NotImplementedError, or the exercise is not defined yet."""

    def __init__(self, reason: str = "stub"):
        self.reason = reason
        super().__init__(reason)


class ReplayMismatch(Exception):
    """A replayed check asked for something the log does not hold (or the log is malformed)."""


class _TimeUp(BaseException):
    """Raised inside the learner's code when its time is up (a BaseException: ``except Exception`` in the
    learner's code does not swallow it)."""


#: The longest a learner waits for one check, as a multiple of its limit of computing: on a machine busy
#: with other work, the check stops the learner's code after this much waiting even if it computed less.
WALL_FACTOR = 2


class Clock:
    """One check's time. The learner's code may compute (CPU time, all its calls together) for ``limit``
    seconds, and the learner waits at most ``WALL_FACTOR × limit`` seconds from the check's start.

    CPU time is what says "endless": a first call that imports a library pays only for the import's own
    work, and on a busy machine a correct answer is not stopped early. The wall-clock limit is what the
    learner lives through: however busy the machine, no check keeps them waiting longer. An operation
    that asks for a longer limit (``observe(..., timeout=60)``: a slow probe) raises the check's limit
    to that from then on."""

    def __init__(self, limit: float):
        self.limit = float(limit)
        self.start = time.monotonic()
        self.computed = 0.0
        self.queued: float | None = 0.0  # seconds the learner's code was ready to run but had no processor

    def waited(self) -> float:
        return time.monotonic() - self.start

    def allow(self, timeout: float | None = None) -> tuple[float, float]:
        """Seconds of computing and of waiting left for the next call (raising the limit to ``timeout``)."""
        if timeout is not None and timeout > self.limit:
            self.limit = float(timeout)
        return self.limit - self.computed, WALL_FACTOR * self.limit - self.waited()

    def outcome(self, by: str) -> dict[str, Any]:
        """A time-out, as the data a log keeps (the grader's replay shows the very same numbers)."""
        outcome = {"timeout": self.limit, "waited": round(self.waited(), 2), "computed": round(self.computed, 2),
                   "by": by}
        if self.queued is not None:
            outcome["queued"] = round(self.queued, 2)
        return outcome


def _queued() -> float | None:
    """Seconds this thread has spent ready to run but waiting for a processor (Linux); None elsewhere."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def _time_limit(seconds: float, wall: float | None = None) -> Iterator[dict]:
    """Stop the code inside after ``seconds`` of CPU time, or after ``wall`` seconds of wall-clock time
    (default ``WALL_FACTOR × seconds``).

    On POSIX (main thread) SIGPROF and SIGALRM timers raise inside the learner's code; elsewhere a timer
    thread interrupts the main thread after the wall-clock limit. Yields a dict whose ``"fired"`` says
    which limit struck (``"cpu"`` or ``"wall"``; False while none has)."""
    state: dict[str, Any] = {"fired": False}
    wall = seconds * WALL_FACTOR if wall is None else wall
    main = threading.current_thread() is threading.main_thread()
    if main and hasattr(signal, "setitimer") and hasattr(signal, "SIGPROF"):
        def on_limit(signum, frame):
            state["fired"] = "cpu" if signum == signal.SIGPROF else "wall"
            raise _TimeUp()

        previous = {sig: signal.signal(sig, on_limit) for sig in (signal.SIGPROF, signal.SIGALRM)}
        signal.setitimer(signal.ITIMER_PROF, max(seconds, 1e-3))
        signal.setitimer(signal.ITIMER_REAL, max(wall, 1e-3))
        try:
            yield state
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.setitimer(signal.ITIMER_REAL, 0)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return
    if not main:  # no way to interrupt another thread's Python code: run without a limit
        yield state
        return
    import _thread

    def fire():
        state["fired"] = "wall"
        _thread.interrupt_main()

    timer = threading.Timer(wall, fire)
    timer.daemon = True
    timer.start()
    try:
        yield state
    finally:
        timer.cancel()


_COURSE_DIR = str(Path(__file__).resolve().parents[1])
_LIBRARY_DIRS = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})


def _is_learner_frame(filename: str) -> bool:
    if not filename or filename.startswith("<frozen") or filename == "<string>":
        return False
    real = os.path.realpath(filename) if not filename.startswith("<") else filename
    return not real.startswith(_COURSE_DIR) and not real.startswith(_LIBRARY_DIRS)


def _raised_info(exc: BaseException, phase: str) -> dict[str, Any]:
    """What the learner needs to see of an exception: its type, message and the last line of *their* code."""
    info: dict[str, Any] = {"type": type(exc).__name__, "message": _safe_str(exc)[:_MAX_TEXT], "phase": phase}
    frame_info = None
    tb = exc.__traceback__
    while tb is not None:
        if _is_learner_frame(tb.tb_frame.f_code.co_filename):
            frame_info = (tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    if isinstance(exc, SyntaxError) and exc.lineno:
        frame_info = (exc.filename or "", exc.lineno, "")
    if frame_info:
        filename, line, function = frame_info
        info.update(line=line, function=function, code=linecache.getline(filename, line).rstrip()[:300])
    return info


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except _TimeUp:
        raise
    except BaseException:  # noqa: BLE001
        return f"({type(exc).__name__} with an unprintable message)"


def _is_stub(exc: BaseException) -> bool:
    """True for the exercise stub's ``raise NotImplementedError()``: raised by a ``raise`` statement in the
    learner's own code, not by a library call on their line (torch raises NotImplementedError for an
    operation a dtype lacks, e.g. softmax of a bool tensor: that is a mistake to diagnose)."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None or not _is_learner_frame(last.tb_frame.f_code.co_filename):
        return False
    line = linecache.getline(last.tb_frame.f_code.co_filename, last.tb_lineno).strip()
    return line.startswith("raise") and "NotImplementedError" in line or not line


# ============================================================================ learner-side operations
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
    return [{"name": p.name, "kind": p.kind.name, "default": None if p.default is p.empty else _safe_repr(p.default),
             "has_default": p.default is not p.empty} for p in params]


def _inspect(obj: Any) -> dict[str, Any]:
    is_class = isinstance(obj, type)
    info: dict[str, Any] = {
        "kind": "class" if is_class else ("function" if inspect.isroutine(obj) else
                                          ("module" if isinstance(obj, torch.nn.Module) else "other")),
        "type": obj.__qualname__ if is_class else _type_name(obj),
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


class _Runner:
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
        started, queued = time.process_time(), _queued()
        try:
            outcome, arrays = self._run(op, ref, method, args, kwargs, extra, cpu_left, wall_left)
        finally:
            clock.computed += time.process_time() - started
            now = _queued()
            clock.queued = None if queued is None or now is None or clock.queued is None else \
                clock.queued + now - queued
        if "_by" in outcome:  # stopped: the numbers the learner reads (waited, computed) go into the outcome
            outcome = {"timeout": True, **clock.outcome(outcome["_by"])}
        return outcome, arrays

    def _run(self, op, ref, method, args, kwargs, extra, cpu_left: float,
             wall_left: float) -> tuple[dict, dict[str, np.ndarray]]:
        enc = _Encoder()
        phase = "call"
        limit: dict[str, Any] = {"fired": False}
        try:
            with _time_limit(cpu_left, wall_left) as limit:
                try:
                    obj = self.target(ref)
                    if method:
                        obj = getattr(obj, method)
                    if op == "call":
                        return {"ok": enc.encode(obj(*args, **kwargs))}, enc.arrays
                    if op == "construct":
                        made = obj(*args, **kwargs)
                        handle = Handle(len(self._handles) + 1, _type_name(made))
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
                except _TimeUp:
                    raise
                except KeyboardInterrupt:
                    if limit["fired"]:
                        raise _TimeUp() from None
                    raise
                except NotImplementedError as exc:
                    if phase == "call" and _is_stub(exc):
                        return {"not_attempted": True}, {}
                    return {"raised": _raised_info(exc, phase)}, {}
                except BaseException as exc:  # noqa: BLE001 - SystemExit and custom BaseExceptions too
                    return {"raised": _raised_info(exc, phase)}, {}
        except _TimeUp:
            return {"_by": limit["fired"] or "wall"}, {}


# ============================================================================ sessions
class Session:
    """Carries a check's operations to the learner's code (or to a log of them) and back."""

    def run(self, op: str, ref: list, method: str | None, args: tuple, kwargs: dict, *, timeout: float | None,
            extra: dict[str, Any] | None = None, clock: Clock | None = None) -> tuple[dict, dict[str, np.ndarray]]:
        """Run one operation. ``clock`` is the check's time (shared by its operations); ``timeout``, when
        given, raises its limit (see :class:`Clock`)."""
        raise NotImplementedError

    def finish(self) -> None:
        """Called once the check is over (the recording session writes its log here)."""


def _request(op: str, ref: list, method: str | None, args: tuple, kwargs: dict, extra: dict[str, Any]) -> tuple[dict, dict]:
    enc = _Encoder()
    shown_extra = {k: v for k, v in extra.items()}
    tree = {"op": op, "target": list(ref), "method": method, "args": enc.encode(tuple(args)),
            "kwargs": enc.encode(dict(kwargs)), "extra": enc.encode(shown_extra)}
    return tree, enc.arrays


class LocalSession(Session):
    """Runs each operation on the live object that ``resolve()`` returns (arguments passed as fresh copies)."""

    def __init__(self, resolve: Callable[[], Any]):
        self._runner = _Runner(resolve)

    def run(self, op, ref, method, args, kwargs, *, timeout, extra=None, clock=None):
        extra = extra or {}
        tree, arrays = _request(op, ref, method, args, kwargs, extra)
        # The learner's code gets copies decoded from the request: it can neither see the check's own
        # tensors nor change them.
        fresh_args = decode(tree["args"], arrays)
        fresh_kwargs = decode(tree["kwargs"], arrays)
        fresh_extra = decode(tree["extra"], arrays)
        fresh_args = tuple(self._runner._handles[a.id] if isinstance(a, Handle) else a for a in fresh_args)
        return self._runner.run(op, ref, method, fresh_args, fresh_kwargs, timeout, fresh_extra, clock)


class RecordingSession(LocalSession):
    """A local session that also logs every request (by digest) with its outcome, for a later replay."""

    def __init__(self, resolve: Callable[[], Any], path: Path):
        super().__init__(resolve)
        self.path = Path(path)
        self.events: list[dict[str, Any]] = []
        self.arrays: dict[str, np.ndarray] = {}

    def run(self, op, ref, method, args, kwargs, *, timeout, extra=None, clock=None):
        tree, req_arrays = _request(op, ref, method, args, kwargs, extra or {})
        outcome, arrays = super().run(op, ref, method, args, kwargs, timeout=timeout, extra=extra, clock=clock)
        prefix = f"e{len(self.events)}_"
        self.arrays.update({prefix + k: v for k, v in arrays.items()})
        self.events.append({"request": _digest(tree, req_arrays), "op": op, "outcome": outcome, "prefix": prefix})
        return outcome, arrays

    def finish(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.savez(buffer, __events__=np.frombuffer(json.dumps(self.events).encode(), dtype=np.uint8), **self.arrays)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(buffer.getvalue())
        os.replace(tmp, self.path)


class ReplaySession(Session):
    """Answers each operation from a recorded log; runs no learner code. Requests are matched by their
    digest (operation, target, arguments), so a replay needs the same requests, not the same order."""

    def __init__(self, path: Path, *, max_bytes: int = MAX_LOG_BYTES):
        self.events, self.arrays = _read_log(Path(path), max_bytes)
        self._used: set[int] = set()

    def run(self, op, ref, method, args, kwargs, *, timeout, extra=None, clock=None):
        tree, arrays = _request(op, ref, method, args, kwargs, extra or {})  # (no code runs: no clock)
        key = _digest(tree, arrays)
        for i, event in enumerate(self.events):
            if i not in self._used and event.get("request") == key:
                self._used.add(i)
                outcome = event.get("outcome")
                if not isinstance(outcome, dict):
                    raise ReplayMismatch("a recorded outcome is malformed")
                return outcome, self._arrays_of(event)
        raise ReplayMismatch(f"the log holds no record of this {op} (the check's run in the notebook did not get here)")

    def _arrays_of(self, event: dict) -> dict[str, np.ndarray]:
        prefix = str(event.get("prefix", ""))
        return {k[len(prefix):]: v for k, v in self.arrays.items() if k.startswith(prefix)}

    def recorded(self, op: str) -> Iterator[Any]:
        """The values that the logged operations ``op`` returned, decoded, in the order they ran (what the
        log says by itself, without replaying a check: the grader's evidence). Outcomes that are not a
        value (raised, timed out) or cannot be decoded are skipped."""
        for event in self.events:
            outcome = event.get("outcome")
            if event.get("op") != op or not isinstance(outcome, dict) or "ok" not in outcome:
                continue
            try:
                yield decode(outcome["ok"], self._arrays_of(event))
            except (ReplayMismatch, KeyError, TypeError, ValueError):
                continue


def _read_log(path: Path, max_bytes: int) -> tuple[list[dict], dict[str, np.ndarray]]:
    try:
        if not path.is_file() or path.is_symlink():
            raise ReplayMismatch("no log was written (the check cell did not run to its end)")
        with zipfile.ZipFile(path) as zf:
            if sum(i.file_size for i in zf.infolist()) > max_bytes:
                raise ReplayMismatch("the log is too large")
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        events = json.loads(arrays.pop("__events__").tobytes().decode())
    except ReplayMismatch:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged or forged file
        raise ReplayMismatch(f"the log cannot be read ({type(exc).__name__})") from None
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise ReplayMismatch("the log is malformed")
    return events, arrays


# ============================================================================ what a check holds
def capped_timeout(seconds: float) -> float:
    """``seconds``, or the limit :data:`CALL_TIMEOUT_ENV` sets when that is lower."""
    try:
        return min(seconds, float(os.environ.get(CALL_TIMEOUT_ENV) or "inf"))
    except ValueError:
        return seconds


class Learner:
    """The learner's exercise (or an object made from it), as a check sees it.

    ``learner(*args)`` calls it; ``learner.method("apply")`` is one of its attributes; ``construct``
    instantiates a class and returns a Learner for the new object; ``vjp`` runs it and backpropagates;
    ``inspect`` describes it; ``observe`` runs a registered learner-side probe. Results are plain data;
    failures raise :class:`LearnerRaised`, :class:`LearnerTimedOut` or :class:`LearnerNotAttempted`
    (:class:`MachineBusy` when the machine was too busy to tell). All operations of one check share
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
