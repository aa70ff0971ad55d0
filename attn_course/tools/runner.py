"""Execute a notebook in a fresh kernel and measure it: the one place the course tooling runs notebooks.

Used by ``bench-course`` (time and memory budgets), ``schedule --measure`` and ``run-solutions``
(maintainers re-executing the instructor notebooks in place). Grading does not start kernels: it
runs only a notebook's exercise and check cells, in a forked process (:mod:`.grading`).
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

# Appended to a copy of the notebook when memory is measured; prints the kernel's peak RSS in bytes.
_PEAK_RSS_PROBE = """\
import json as _j, sys as _s
try:
    import resource as _r
    _peak = _r.getrusage(_r.RUSAGE_SELF).ru_maxrss * (1 if _s.platform == "darwin" else 1024)
except ImportError:  # Windows has no resource module
    _peak = None
print("ATTN_COURSE_PEAK_RSS=" + _j.dumps(_peak))
"""


@dataclass
class Execution:
    """What happened when a notebook ran."""

    notebook: nbformat.NotebookNode
    seconds: float
    peak_rss_bytes: int | None = None
    problem: str | None = None  # set when the run stopped early: kernel died, timeout, ...
    errors: list[int] = field(default_factory=list)  # indices of cells that raised


def run_client(client: NotebookClient, env: dict[str, str], cell_timeout: int) -> str | None:
    """Run ``client`` to the end; ``None`` when it got there, else why the run stopped early."""
    try:
        client.execute(env=env)
    except DeadKernelError as exc:
        return f"the kernel died ({exc}); often a crash or running out of memory"
    except CellTimeoutError as exc:
        return f"a cell ran past {cell_timeout} s and could not be interrupted ({_last_line(str(exc))})"
    except Exception as exc:  # allow_errors=False: the first failing cell stops the run
        return f"{type(exc).__name__}: {_last_line(str(exc))}"
    return None


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1][:200] if lines else ""


def execute(
    nb: nbformat.NotebookNode,
    *,
    cwd: Path,
    cell_timeout: int = 120,
    allow_errors: bool = True,
    measure_memory: bool = False,
    env: dict[str, str] | None = None,
) -> Execution:
    """Run every cell of a copy of ``nb`` in a new kernel whose working directory is ``cwd``.

    A cell that runs past ``cell_timeout`` seconds is interrupted and the run goes on with the next
    cell (its error output says so). A kernel that dies ends the run with ``problem`` set.
    """
    nb = copy.deepcopy(nb)
    if measure_memory:
        nb.cells.append(nbformat.v4.new_code_cell(_PEAK_RSS_PROBE))
    kernel_env = dict(os.environ)
    kernel_env.setdefault("PYTHONHASHSEED", "0")
    kernel_env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    if env:
        kernel_env.update(env)
    def client() -> NotebookClient:
        return NotebookClient(
            nb,
            timeout=cell_timeout,
            interrupt_on_timeout=True,
            allow_errors=allow_errors,
            kernel_name="python3",
            resources={"metadata": {"path": str(cwd)}},
            record_timing=False,
            # The kernel's own warnings (e.g. "Kernel is running over TCP without encryption": it only ever
            # talks to this process on localhost) are noise in every command's output.
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
        )

    start = time.perf_counter()
    problem = run_client(client(), kernel_env, cell_timeout)
    if problem and "Kernel didn't respond" in problem and not any(c.get("execution_count") for c in nb.cells):
        # The kernel never answered its first message (several kernels starting at once can leave one waiting):
        # nothing ran, so the notebook runs once more, in a new kernel.
        problem = run_client(client(), kernel_env, cell_timeout)
    seconds = time.perf_counter() - start

    peak = None
    if measure_memory:
        probe = nb.cells.pop()
        for output in probe.get("outputs", []):
            text = output.get("text", "")
            if "ATTN_COURSE_PEAK_RSS=" in text:
                peak = json.loads(text.split("ATTN_COURSE_PEAK_RSS=")[1].split()[0])
    errors = [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and any(o.get("output_type") == "error" for o in cell.get("outputs", []))
    ]
    return Execution(notebook=nb, seconds=seconds, peak_rss_bytes=peak, problem=problem, errors=errors)
