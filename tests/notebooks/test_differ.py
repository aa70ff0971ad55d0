"""The cells an unfilled notebook's run keeps (tests/notebooks/differ.py): every cell that can reach an
answer, directly or through a name, and nothing that provably cannot."""

from __future__ import annotations

import nbformat

from tests.notebooks.differ import cells_that_can_differ

SOLVED = "def f(t):\n    return _double(t)\n\ndef _double(t):\n    return 2 * t\n"
STUB = "def f(t):\n    raise NotImplementedError()\n"

CELLS = [  # (source, tags, kept?)
    ("import torch", ["setup"], True),
    ("x = torch.ones(3)  # read by a kept cell below", [], True),
    (SOLVED, ["exercise"], True),
    ("from attn_course.checks.dot import check_f\ncheck_f()", ["check"], True),
    ("y = torch.zeros(2)\nprint(y)", [], False),
    ("z = f(x)", [], True),  # reads the answer
    ("print(z.sum())", [], True),  # reads what the answer made
    ("results = []", [], True),  # bound here, filled from the answer below
    ("results.append(f(x))", [], True),
    ("print(len(results))", [], True),  # results was mutated by the answer
    ("%timeit y + 1", [], True),  # a magic: names hide in its string
    ("print(sorted(globals()))", [], True),
    ("_double(1)", [], True),  # a name only the solution's version binds
    ("w = 3\nprint(w)", [], False),
    ("torch.manual_seed(0)\nprint(torch.rand(1))", [], False),  # a module's state is not the answer's
    ("1 / 0", ["raises-exception"], True),
    ("from attn_course.checks import dot", [], True),  # a check reads the learner's namespace
    ("def g(t):\n    return f(t)", [], True),  # reads the answer when called
    ("print(w + 1)", [], False),
    ("def broken(:\n    pass", [], True),  # does not parse: nothing is known of it
]


def test_the_kept_cells_are_those_that_can_reach_an_answer():
    solution = nbformat.v4.new_notebook()
    solution.cells = [nbformat.v4.new_markdown_cell("# title")]
    solution.cells += [nbformat.v4.new_code_cell(source, metadata={"tags": tags}) for source, tags, _ in CELLS]
    exercise = nbformat.v4.new_notebook(cells=[nbformat.from_dict(dict(c)) for c in solution.cells])
    exercise.cells[3].source = STUB
    expected = [index + 1 for index, (_, _, kept) in enumerate(CELLS) if kept]
    assert cells_that_can_differ(solution, exercise) == expected
