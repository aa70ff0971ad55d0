"""Which course notebook a file is and which copy is graded (attn_course.tools.grading.collect)."""

from __future__ import annotations

import nbformat
import pytest

from attn_course.tools.grading import collect, files

from ._grading import ATTENTION, BYTES, NOTEBOOK_03, NOTEBOOK_05, correct, course, course_dir, learner_notebook, write


@pytest.mark.parametrize("name, slug", [
    ("05_attention.ipynb", "05_attention"), ("ada/05_attention (1).ipynb", "05_attention"),
    ("05_attention-Copy1.ipynb", "05_attention"), ("05_attention-checkpoint.ipynb", "05_attention"),
    ("05_attention.updated.ipynb", "05_attention"), ("backups/05_attention-20250101-120000.ipynb", "05_attention"),
    ("05_attention.IPYNB", "05_attention"),
])
def test_file_slug_strips_copy_marks(name, slug):
    assert collect.file_slug(name) == slug


def _found(path, tmp_path, learner="ada", where="notebook"):
    return files.Found(learner, path, str(path.relative_to(tmp_path)), where)


def test_identity_comes_from_exercise_ids_not_the_file_name(tmp_path):
    path = write(correct(), tmp_path / "ada" / f"{NOTEBOOK_03}.ipynb")
    sub = collect.read_submission(_found(path, tmp_path), course())
    assert sub.notebook.slug == NOTEBOOK_05
    assert any(f"saved as {NOTEBOOK_03}.ipynb but holds {NOTEBOOK_05}" in f for f in sub.flags), sub.flags


def test_an_unreadable_notebook_is_a_problem_not_a_crash(tmp_path):
    for name, data, phrase in [("a.ipynb", b"", "empty"), ("b.ipynb", b"{not json", "not valid JSON"),
                               ("c.ipynb", b"\xff\xfe\x00", "not UTF-8"), ("d.ipynb", b"[" * 100000, "not")]:
        (tmp_path / name).write_bytes(data)
        sub = collect.read_submission(_found(tmp_path / name, tmp_path), course())
        assert phrase in sub.problem, (name, sub.problem)


def test_of_several_copies_the_one_with_most_work_is_graded_and_the_others_named(tmp_path):
    one = write(learner_notebook(answers={"attention": ATTENTION}), tmp_path / "ada" / f"{NOTEBOOK_05}.ipynb")
    two = write(learner_notebook(answers={"attention": ATTENTION, "score_matrix_bytes": BYTES}),
                tmp_path / "ada" / "notebooks" / "backups" / f"{NOTEBOOK_05}-20250101-1200.ipynb")
    three = write(learner_notebook(answers={"attention": ATTENTION}), tmp_path / "ada" / f"{NOTEBOOK_05} (1).ipynb")
    found = [_found(one, tmp_path), _found(two, tmp_path, where="backup"), _found(three, tmp_path)]
    for order in (found, found[::-1]):
        chosen, _, warnings = collect.collect("ada", order, course())
        assert [s.rel for s in chosen] == ["ada/notebooks/backups/05_attention-20250101-1200.ipynb"], warnings
        assert "3 copies: graded ada/notebooks/backups" in chosen[0].flags[-1]
    chosen, _, _ = collect.collect("ada", [_found(three, tmp_path), _found(one, tmp_path)], course())
    assert chosen[0].rel == "ada/05_attention.ipynb"  # a tie: the plain name wins


def test_a_course_clone_inside_a_learners_folder_is_not_their_work(tmp_path):
    clone = tmp_path / "ada" / "attention-course"
    for slug in (NOTEBOOK_05, NOTEBOOK_03):
        write(nbformat.read(course_dir() / "solutions" / f"{slug}.ipynb", as_version=4),
              clone / "solutions" / f"{slug}.ipynb")
        write(nbformat.read(course_dir() / "notebooks" / f"{slug}.ipynb", as_version=4),
              clone / "notebooks" / f"{slug}.ipynb")
    scan = files.scan_class(tmp_path)
    chosen, _, warnings = collect.collect("ada", scan.learners["ada"], course())
    assert sorted(s.rel for s in chosen) == [f"ada/attention-course/notebooks/{NOTEBOOK_03}.ipynb",
                                             f"ada/attention-course/notebooks/{NOTEBOOK_05}.ipynb"]
    assert sum("the course's own solution notebook" in w for w in warnings) == 2, warnings


def test_a_copy_of_the_solution_is_graded_but_flagged(tmp_path):
    path = write(nbformat.read(course_dir() / "solutions" / f"{NOTEBOOK_05}.ipynb", as_version=4),
                 tmp_path / "ada" / f"{NOTEBOOK_05}.ipynb")
    chosen, _, _ = collect.collect("ada", [_found(path, tmp_path)], course())
    assert chosen[0].solution_copy and any("course's solution, character for character" in f for f in chosen[0].flags)


def test_a_notebook_that_is_no_course_notebook_is_named(tmp_path):
    other = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('my own project')")])
    path = write(other, tmp_path / "ada" / "project.ipynb")
    setup = write(nbformat.read(course_dir() / "solutions" / "00_setup.ipynb", as_version=4),
                  tmp_path / "ada" / "00_setup.ipynb")
    chosen, _, warnings = collect.collect("ada", [_found(path, tmp_path), _found(setup, tmp_path)], course())
    assert chosen == [] and warnings == ["ada/project.ipynb: not one of the course's notebooks (none of its "
                                         "exercises is in it); not graded"]


def test_a_checkpoint_copy_is_mentioned_only_when_it_is_what_was_graded(tmp_path):
    mine = write(learner_notebook(answers={"attention": ATTENTION, "score_matrix_bytes": BYTES}),
                 tmp_path / "ada" / f"{NOTEBOOK_05}.ipynb")
    saved = write(learner_notebook(answers={"attention": ATTENTION}),
                  tmp_path / "ada" / ".ipynb_checkpoints" / f"{NOTEBOOK_05}-checkpoint.ipynb")
    chosen, _, _ = collect.collect("ada", [_found(mine, tmp_path), _found(saved, tmp_path, where="checkpoint")], course())
    assert chosen[0].rel == f"ada/{NOTEBOOK_05}.ipynb"
    assert not any("checkpoint" in f or "copies" in f for f in chosen[0].flags), chosen[0].flags
    # the learner's notebook holds less work than Jupyter's checkpoint: the checkpoint is graded, and said so
    write(learner_notebook(), mine)
    chosen, _, _ = collect.collect("ada", [_found(mine, tmp_path), _found(saved, tmp_path, where="checkpoint")], course())
    assert chosen[0].where == "checkpoint"
    assert "graded from a Jupyter checkpoint copy" in chosen[0].flags
    assert any(f.startswith("2 copies: graded ada/.ipynb_checkpoints/") and f"ada/{NOTEBOOK_05}.ipynb" in f
               for f in chosen[0].flags), chosen[0].flags

