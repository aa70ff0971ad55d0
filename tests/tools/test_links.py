"""Links to the published course come from one setting ([project.urls] Repository in pyproject.toml):
README badges, each notebook's first line (previous / next / solution / Colab / Binder) and the
Colab set-up cell; `links --check` fails when any is stale."""

from __future__ import annotations

import argparse
import io
import shutil
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import nbformat
import pytest

from attn_course import registry
from attn_course.tools import links
from attn_course.tools.exercises import generate

ROOT = Path(__file__).resolve().parents[2]
REPO = "https://github.com/someone/attention-course"


@pytest.fixture
def course(tmp_path):
    (tmp_path / "solutions").mkdir()
    shutil.copy(ROOT / "solutions" / "05_attention.ipynb", tmp_path / "solutions")
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text(pyproject.replace(links.repository(ROOT), REPO), encoding="utf-8")
    (tmp_path / "README.md").write_text(f"# Course\n\n{links.README_START}\nold\n{links.README_END}\n\nrest\n")
    return tmp_path


def _links(root: Path, *extra: str) -> tuple[int, str]:
    out = io.StringIO()
    args = argparse.Namespace(check="--check" in extra, root=str(root), hub=None)
    return links.run(args, out=out), out.getvalue()


def test_links_are_written_from_the_one_setting_and_checked(course):
    code, text = _links(course, "--check")
    assert code == 1 and "STALE" in text
    assert _links(course)[0] == 0
    assert _links(course, "--check")[0] == 0  # idempotent

    readme = (course / "README.md").read_text()
    assert "colab.research.google.com/github/someone/attention-course/blob/main/notebooks/00_setup.ipynb" in readme
    assert "mybinder.org/v2/gh/someone/attention-course/main?urlpath=lab%2Ftree%2Fnotebooks%2F00_setup.ipynb" in readme
    assert readme.endswith("rest\n")

    nb = nbformat.read(course / "solutions" / "05_attention.ipynb", as_version=4)
    header, colab = nb.cells[0], next(c for c in nb.cells if c.get("id") == links.COLAB_ID)
    assert header.id == links.HEADER_ID
    assert "[04 · The softmax Jacobian](04_softmax_jacobian.ipynb)" in header.source
    assert "(06_masks.ipynb) →" in header.source and "[exercise version](../notebooks/05_attention.ipynb)" in header.source
    assert "blob/main/solutions/05_attention.ipynb" in header.source and "2 exercises" in header.source
    setup = next(i for i, c in enumerate(nb.cells) if "setup" in c.metadata.get("tags", []) and c.id != links.COLAB_ID)
    assert nb.cells.index(colab) == setup - 1, "the Colab cell must run before the imports"
    assert f"git+{REPO}@main" in colab.source and "--no-deps" in colab.source

    # The exercise version points at its solution.
    (course / "notebooks").mkdir()
    assert generate(course / "solutions", course / "notebooks", out=io.StringIO()) == 0
    exercise = nbformat.read(course / "notebooks" / "05_attention.ipynb", as_version=4)
    assert "[solution](../solutions/05_attention.ipynb)" in exercise.cells[0].source
    assert "blob/main/notebooks/05_attention.ipynb" in exercise.cells[0].source

    # Changing the address makes everything stale.
    (course / "pyproject.toml").write_text((course / "pyproject.toml").read_text().replace(REPO, REPO + "2"))
    assert _links(course, "--check")[0] == 1


def test_before_publishing_no_badges_and_readme_says_what_to_do(course):
    (course / "pyproject.toml").write_text((course / "pyproject.toml").read_text().replace(REPO, "https://github.com/OWNER/REPO"))
    assert _links(course)[0] == 0
    readme = (course / "README.md").read_text()
    assert "Not published yet" in readme and "python -m attn_course links" in readme and "badge" not in readme.split("Not")[0]
    header = nbformat.read(course / "solutions" / "05_attention.ipynb", as_version=4).cells[0].source
    assert "colab" not in header.lower() and "binder" not in header.lower()
    args = argparse.Namespace(check=False, root=str(course), hub="https://hub.example.org")
    out = io.StringIO()
    assert links.run(args, out=out) == 2 and "OWNER/REPO" in out.getvalue()


def test_nbgitpuller_link():
    url = links.nbgitpuller_url("https://hub.example.org/", REPO)
    parsed = urlparse(url)
    assert parsed.netloc == "hub.example.org" and parsed.path == "/hub/user-redirect/git-pull"
    query = parse_qs(parsed.query)
    assert query == {"repo": [REPO], "branch": ["main"], "urlpath": ["lab/tree/attention-course/notebooks/00_setup.ipynb"]}


def test_colab_cell_does_nothing_off_colab():
    namespace = {}
    exec(links.colab_cell_source(REPO), namespace)  # no google.colab here: no install, no error
    assert "output" not in namespace


def test_every_notebook_has_a_first_and_last_neighbour():
    first = links.header_source(registry.NOTEBOOKS[0], "solution", REPO, 8)
    last = links.header_source(registry.NOTEBOOKS[-1], "exercise", REPO, 40)
    assert "←" not in first and "→" in first and "about 8 min" in first
    assert "→" not in last and "←" in last


@pytest.mark.slow
def test_the_course_itself_is_up_to_date():
    code, text = _links(ROOT, "--check")
    assert code == 0, text


def test_the_colab_cell_installs_the_courses_dependencies_but_never_torch():
    from importlib.metadata import requires

    needed = links.colab_requirements()
    assert needed and not any(spec.lower().startswith("torch") for spec in needed)
    base = [r for r in requires("attn_course") if "extra ==" not in r and not r.lower().startswith("torch")]
    assert needed == base
    assert repr(needed) in links.colab_cell_source("https://github.com/owner/name")
