"""The sessions that carry a check's operations: :class:`LocalSession` (live objects),
:class:`RecordingSession` (live, and a log of every operation for the grader) and :class:`ReplaySession`
(answers from such a log; runs no learner code)."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .encoding import Encoder, Handle, decode, digest
from .limits import MAX_LOG_BYTES, Clock
from .operations import Runner
from .outcomes import ReplayMismatch

#: Set in a kernel's environment, checks also write their operation log into this folder (grading).
RECORD_ENV = "ATTN_COURSE_RECORD_DIR"


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
    enc = Encoder()
    shown_extra = {k: v for k, v in extra.items()}
    tree = {"op": op, "target": list(ref), "method": method, "args": enc.encode(tuple(args)),
            "kwargs": enc.encode(dict(kwargs)), "extra": enc.encode(shown_extra)}
    return tree, enc.arrays


class LocalSession(Session):
    """Runs each operation on the live object that ``resolve()`` returns (arguments passed as fresh copies)."""

    def __init__(self, resolve: Callable[[], Any]):
        self._runner = Runner(resolve)

    def run(self, op, ref, method, args, kwargs, *, timeout, extra=None, clock=None):
        extra = extra or {}
        tree, arrays = _request(op, ref, method, args, kwargs, extra)
        # The learner's code gets copies decoded from the request: it can neither see the check's own
        # tensors nor change them.
        fresh_args = decode(tree["args"], arrays)
        fresh_kwargs = decode(tree["kwargs"], arrays)
        fresh_extra = decode(tree["extra"], arrays)
        fresh_args = tuple(self._runner.target(["handle", a.id]) if isinstance(a, Handle) else a for a in fresh_args)
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
        self.events.append({"request": digest(tree, req_arrays), "op": op, "outcome": outcome, "prefix": prefix})
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
        key = digest(tree, arrays)
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
