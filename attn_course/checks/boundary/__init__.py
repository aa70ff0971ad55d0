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

One module a job: :mod:`.limits` (time and size), :mod:`.outcomes` (what the learner's code did),
:mod:`.encoding` (values as data), :mod:`.operations` (what runs on the learner's side, probes),
:mod:`.sessions` (the three sessions) and :mod:`.learner` (what a check holds).
"""

from .encoding import Handle, Opaque, describe_args, describe_value
from .learner import Learner
from .limits import CALL_TIMEOUT_ENV, DEFAULT_TIMEOUT, MAX_LOG_BYTES, WALL_FACTOR, Clock, capped_timeout
from .operations import PROBES, probe
from .outcomes import (LearnerChangedSettings, LearnerNotAttempted, LearnerRaised, LearnerTimedOut, MachineBusy,
                       ReplayMismatch)
from .sessions import RECORD_ENV, LocalSession, RecordingSession, ReplaySession, Session

__all__ = [
    "DEFAULT_TIMEOUT",
    "RECORD_ENV",
    "CALL_TIMEOUT_ENV",
    "capped_timeout",
    "Learner",
    "LearnerRaised",
    "LearnerTimedOut",
    "LearnerChangedSettings",
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
    "describe_value",
    "WALL_FACTOR",
    "MAX_LOG_BYTES",
    "PROBES",
]
