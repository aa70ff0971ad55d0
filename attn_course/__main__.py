"""``python -m attn_course <command>``: the course's tooling (see :mod:`attn_course.tools.cli`)."""

import os
import sys

from .tools.cli import main


def _missing_libraries_message(missing: str) -> str:
    """What to say when ``python`` is not the course's Python (the system's, or a pyenv/conda shim that a
    shell's start-up files put first on PATH, also in JupyterLab's terminal): which Python answered, and
    the commands that work from any shell."""
    windows = os.name == "nt"
    launcher = "python" if windows else "python3"
    venv_python = r".venv\Scripts\python" if windows else ".venv/bin/python"
    args = sys.argv[1:]
    lines = [f"This Python, {sys.executable}, has not got the course's libraries ({missing} is missing)."]
    if os.environ.get("JUPYTER_SERVER_ROOT"):  # set by Jupyter Server in its terminals
        lines.append("In JupyterLab's terminal too, `python` can be another Python: a pyenv or conda one that "
                     "your shell's start-up files put first on PATH.")
    lines.append("These work as typed, from any shell in the course's folder:")
    if args[:1] == ["grade"]:
        lines.append(f"  {launcher} course.py {' '.join(args)}")
    lines.append(f"  {venv_python} -m attn_course {' '.join(args)}".rstrip())
    if args[:1] != ["grade"]:
        lines.append(f"  {launcher} course.py grade     (grades your notebooks)")
    lines.append(f"(If .venv does not exist yet: `{launcher} course.py setup` creates it and installs the course.)")
    return "\n".join(lines)


try:
    sys.exit(main())
except ModuleNotFoundError as missing:
    if missing.name is None or missing.name.split(".")[0] == "attn_course":
        raise  # a bug in the course itself, not a missing installation
    # Typically `python -m attn_course` typed in the course's folder with a Python that has not got the
    # course installed: the package is found in the folder, its libraries are not.
    print(_missing_libraries_message(missing.name), file=sys.stderr)
    sys.exit(2)
