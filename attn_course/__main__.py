"""``python -m attn_course <command>``: the course's tooling (see :mod:`attn_course.tools.cli`)."""

import sys

from .tools.cli import main

try:
    sys.exit(main())
except ModuleNotFoundError as missing:
    if missing.name is None or missing.name.split(".")[0] == "attn_course":
        raise  # a bug in the course itself, not a missing installation
    # Typically `python -m attn_course` typed in the course's folder with a Python that has not got the
    # course installed (the system's, not .venv's): the package is found in the folder, its libraries are not.
    print(f"This Python ({sys.executable}) has not got the course's libraries installed ({missing.name} is missing).\n"
          "Use the course's own Python: `python3 course.py setup` once, then either run the command in\n"
          "JupyterLab's terminal (`python3 course.py lab`), or activate the environment first\n"
          "(`source .venv/bin/activate`; on Windows `.venv\\Scripts\\activate`). To grade your notebooks,\n"
          "`python3 course.py grade` works from any shell.", file=sys.stderr)
    sys.exit(2)
