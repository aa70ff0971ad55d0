"""Instructor and maintainer tooling behind ``python -m attn_course`` (never imported by the notebooks).

* :mod:`.cli` — the command line: one parser, one sub-command per tool;
* :mod:`.layout` — where a course checkout keeps its notebooks, found from a documented root;
* :mod:`.nbmeta` — exercise identity in cell metadata (nbgrader's convention);
* :mod:`.exercises` — generate the exercise notebooks from the solutions (one source);
* :mod:`.runner` — execute a notebook in a fresh kernel (the one place notebooks are run);
* :mod:`.grading` — grade notebooks: run them, replay every check on its record, tabulate;
* :mod:`.tables` — text tables, CSV and JSON, written one way;
* :mod:`.budgets` — time and memory of each solution notebook against the budgets;
* :mod:`.solutions` — re-execute solution notebooks in place;
* :mod:`.schedule` — learner minutes per notebook and workshop schedules.
"""

import sys

# nbformat imports jsonschema, and jsonschema imports rfc3987_syntax whenever it is installed (Jupyter's own
# packages install it: jupyter-events needs jsonschema[format-nongpl]). That module builds its IRI parsers
# when imported — 1.2-1.5 s of every grading or course command on a 2-core machine — for a format check
# nbformat never makes (it validates without a format checker). Blocked here, in the course's tool processes
# only: the import then fails, and jsonschema goes on without its "iri" formats (python-jsonschema/jsonschema
# issue 1428). Never done where rfc3987_syntax is already imported.
sys.modules.setdefault("rfc3987_syntax", None)
