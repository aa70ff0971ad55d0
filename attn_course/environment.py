"""Is this machine ready for the course? Versions, compute device, widgets, and a one-line verdict.

Notebook 00 shows the report; an instructor can run the same check from a terminal before a
workshop::

    python -m attn_course.environment      # exit status 0 when ready

The verdict is one line: ``READY: ...`` or ``NOT READY: <what to fix>``.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
import sys
from dataclasses import dataclass, field

__all__ = ["MINIMUM", "Report", "versions", "device", "widget_check", "torch_check", "report", "verdict", "print_report", "in_kernel"]

#: The packages this report checks, in the order it prints them.
CHECKED = ("python", "torch", "numpy", "matplotlib", "ipywidgets", "jupyterlab")


def _minimum_versions() -> dict[str, str]:
    """Oldest versions the course works with, read from the installed package's metadata (so they are
    stated once, in pyproject.toml). Without metadata (the package not installed) no minimum is known."""
    found: dict[str, str] = {}
    try:
        meta = importlib.metadata.metadata("attn_course")
        requires = importlib.metadata.requires("attn_course") or []
    except importlib.metadata.PackageNotFoundError:
        return found
    python = re.search(r">=\s*([\d.]+)", meta.get("Requires-Python") or "")
    if python:
        found["python"] = python.group(1)
    for line in requires:
        match = re.match(r"([A-Za-z0-9_.-]+)\s*(?:\[[^]]*\])?\s*([^;]*)", line)
        if match and match.group(1).lower() in CHECKED:
            lower = re.search(r">=\s*([\w.]+)", match.group(2))
            if lower:
                found[match.group(1).lower()] = lower.group(1)
    return found


#: Oldest versions the course works with (from pyproject.toml, through the installed metadata).
MINIMUM = _minimum_versions()
#: Needed to run notebooks at all; JupyterLab is only needed to *open* them (Colab, VS Code, a
#: JupyterHub with its own front end, and the test suite do without it).
REQUIRED = ("python", "torch", "numpy", "matplotlib", "ipywidgets")
FIX = "run `python3 course.py setup` (on Windows `python course.py setup`) in the course folder"


def _version_tuple(text: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> (2, 13, 0); ``"2.4.0rc1"`` -> (2, 4, 0): leading numbers only."""
    parts = []
    for piece in text.split("+")[0].split("."):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
        if match.end() != len(piece):  # "0rc1": a pre-release tag ends the version number
            break
    return tuple(parts)


def _installed(package: str) -> str | None:
    if package == "python":
        return platform.python_version()
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Installed version of Python and of each package the course needs (None when missing)."""
    return {name: _installed(name) for name in CHECKED}


def device() -> tuple[str, str]:
    """The best available compute device: ("cuda", GPU name), ("mps", "Apple GPU") or ("cpu", processor)."""
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.cuda.get_device_name(0)
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps", "Apple GPU (Metal)"
    return "cpu", platform.processor() or platform.machine() or "CPU"


def torch_check(device_type: str) -> str | None:
    """Run a tiny softmax(Q Kᵀ) on ``device_type``; None when it works, else what went wrong."""
    try:
        import torch

        g = torch.Generator().manual_seed(0)
        q, k = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
        q, k = q.to(device_type), k.to(device_type)  # the product and the softmax both run on the device
        weights = torch.softmax(q @ k.T, dim=-1).cpu()
        if not torch.allclose(weights.sum(-1), torch.ones(4), atol=1e-5):
            return f"torch computes wrong results on {device_type}"
    except Exception as exc:  # any failure here is exactly what the learner needs to hear about
        return f"torch fails on {device_type}: {type(exc).__name__}: {exc}"
    return None


def widget_check() -> str | None:
    """Can the kernel build a widget that JupyterLab can draw? None when yes, else what is missing.

    The kernel side is checked here (ipywidgets importable, a widget produces the widget MIME type) and
    the front-end extension (jupyterlab_widgets) is installed. Whether the browser really draws it
    is what the slider in notebook 00 shows.
    """
    try:
        import ipywidgets as widgets
    except ImportError:
        return "ipywidgets is not installed"
    try:
        bundle = widgets.IntSlider(value=1, min=0, max=2)._repr_mimebundle_() or {}
    except Exception as exc:
        return f"ipywidgets cannot build a widget ({type(exc).__name__}: {exc})"
    if "application/vnd.jupyter.widget-view+json" not in bundle:
        return "ipywidgets builds widgets but not in the form JupyterLab draws"
    if _installed("jupyterlab") and not _installed("jupyterlab_widgets"):
        return "JupyterLab has no widget extension (jupyterlab_widgets)"
    return None


@dataclass
class Report:
    versions: dict[str, str | None]
    device: str
    device_name: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return not self.problems


def report() -> Report:
    """Collect versions, the device and every problem that would stop the course from working."""
    found = versions()
    problems, notes = [], []
    if not MINIMUM:
        problems.append("the course's package attn_course is not installed")
    for name, minimum in MINIMUM.items():
        have = found[name]
        if have is None:
            (problems if name in REQUIRED else notes).append(f"{name} is not installed")
        elif _version_tuple(have) < _version_tuple(minimum):
            (problems if name in REQUIRED else notes).append(f"{name} {have} is older than {minimum}")
    device_type, device_name = "cpu", "unknown"
    if found["torch"] is not None:
        device_type, device_name = device()
        for dev in dict.fromkeys(["cpu", device_type]):
            trouble = torch_check(dev)
            if trouble:
                (problems if dev == "cpu" else notes).append(trouble)
    trouble = widget_check()
    if trouble and trouble not in problems:  # "ipywidgets is not installed" is said once
        problems.append(trouble)
    if device_type == "cpu":
        notes.append("no GPU: every notebook runs on the CPU; notebook 09 shows the GPU results recorded in the "
                     "repository's docs/results/ folder, if it holds any")
    return Report(found, device_type, device_name, problems, notes)


def in_kernel() -> bool:
    """Is this code running in a Jupyter kernel (a notebook), rather than in a terminal?"""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return getattr(shell, "kernel", None) is not None


def verdict(rep: Report, *, kernel: bool | None = None) -> str:
    """One line: ``READY: ...`` or ``NOT READY: <what to fix>``. In a notebook (``kernel``; by default:
    whether this runs in a Jupyter kernel) the fix ends with restarting the kernel; in a terminal, with
    running the check again."""
    if rep.ready:
        return (f"READY: Python {rep.versions['python']}, torch {rep.versions['torch']} on "
                f"{rep.device.upper()} ({rep.device_name}), widgets OK")
    then = "then restart the kernel" if (in_kernel() if kernel is None else kernel) else "then run this check again"
    return "NOT READY: " + "; ".join(rep.problems) + f" — {FIX}, {then}"


def print_report(rep: Report | None = None) -> Report:
    """Print the versions table, the device, any notes and the verdict line; return the report."""
    rep = rep or report()
    print(f"{'package':<12} {'installed':<14} minimum")
    for name, have in rep.versions.items():
        print(f"{name:<12} {have or 'MISSING':<14} {MINIMUM.get(name, '')}")
    print(f"device       {rep.device} ({rep.device_name})")
    print(f"executable   {sys.executable}")
    for note in rep.notes:
        print(f"note: {note}")
    print(verdict(rep))
    return rep


if __name__ == "__main__":  # pragma: no cover
    sys.exit(0 if print_report().ready else 1)
