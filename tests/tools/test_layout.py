"""The course root is found from the current directory (or ATTN_COURSE_ROOT), never from the package's own location."""

from __future__ import annotations

import pytest

from attn_course.tools.layout import ROOT_ENV, Layout, find_root


def test_root_is_the_nearest_folder_with_solutions_and_notebooks(tmp_path, monkeypatch):
    monkeypatch.delenv(ROOT_ENV, raising=False)
    (tmp_path / "solutions").mkdir()
    (tmp_path / "notebooks").mkdir()
    deep = tmp_path / "notebooks" / "a" / "b"
    deep.mkdir(parents=True)
    assert find_root(deep) == tmp_path
    layout = Layout.find(deep)
    assert layout.solutions == tmp_path / "solutions" and layout.notebooks == tmp_path / "notebooks"


def test_no_root_is_a_clear_error_and_the_environment_can_name_it(tmp_path, monkeypatch):
    monkeypatch.delenv(ROOT_ENV, raising=False)
    assert find_root(tmp_path) is None
    with pytest.raises(FileNotFoundError, match="course's folder"):
        Layout.find(tmp_path)
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    assert find_root() == tmp_path.resolve()
