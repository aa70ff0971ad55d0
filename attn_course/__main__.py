"""``python -m attn_course <command>``: the course's tooling (see :mod:`attn_course.tools.cli`)."""

import sys

from .tools.cli import main

sys.exit(main())
