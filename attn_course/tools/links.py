"""``python -m attn_course links``: every link to the published course, written from one setting.

The setting is ``Repository`` under ``[project.urls]`` in ``pyproject.toml`` (a GitHub address). From it
this command writes:

* the Binder and Colab badges in README.md (between ``<!-- links -->`` and ``<!-- /links -->``);
* a first cell in every solution notebook: previous / next notebook, its exercise version, the time it
  takes and its exercises, and "open in Colab / Binder" (the exercise notebooks get the same line,
  pointing at their solution, when ``python -m attn_course exercises`` generates them);
* a Colab set-up cell before each notebook's imports: on Colab (only there) it installs the course's
  helper package from the repository — never a second PyTorch — and turns on Colab's widget manager.

``--check`` writes nothing and fails when anything is stale (the test suite runs it). ``--hub URL``
prints the nbgitpuller link that makes a JupyterHub pull the course into each learner's home.
While the address is still the placeholder ``OWNER/REPO``, badges are left out and README.md says what
to do after publishing.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
import urllib.parse
from pathlib import Path

import nbformat

from .. import registry

__all__ = ["repository", "published", "colab_url", "binder_url", "nbgitpuller_url", "header_source",
           "colab_cell_source", "apply_header", "readme_block", "configure", "run", "HEADER_ID", "COLAB_ID"]

PLACEHOLDER = "OWNER/REPO"
BRANCH = "main"
HEADER_ID = "course-links"
COLAB_ID = "colab-setup"
README_START = "<!-- links: written by `python -m attn_course links` from pyproject.toml; do not edit by hand -->"
README_END = "<!-- /links -->"
#: Overrides where the Colab cell installs the package from (the Colab simulation test points it at a checkout).
COLAB_SOURCE_ENV = "ATTN_COURSE_COLAB_SOURCE"


def repository(root: Path) -> str:
    """The repository address from ``pyproject.toml`` (``https://github.com/owner/name``)."""
    data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    return str(data["project"]["urls"]["Repository"]).rstrip("/")


def published(repo: str) -> bool:
    return PLACEHOLDER not in repo


def _slug(repo: str) -> str:
    match = re.match(r"https?://github\.com/([^/]+/[^/]+?)(?:\.git)?$", repo)
    if not match:
        raise ValueError(f"Repository must be a GitHub address like https://github.com/owner/name, not {repo!r}")
    return match.group(1)


def colab_url(repo: str, path: str, branch: str = BRANCH) -> str:
    return f"https://colab.research.google.com/github/{_slug(repo)}/blob/{branch}/{path}"


def binder_url(repo: str, path: str, branch: str = BRANCH) -> str:
    return f"https://mybinder.org/v2/gh/{_slug(repo)}/{branch}?urlpath=" + urllib.parse.quote(f"lab/tree/{path}", safe="")


def nbgitpuller_url(hub: str, repo: str, path: str = "notebooks/00_setup.ipynb", branch: str = BRANCH) -> str:
    """The link that makes a JupyterHub clone (or update) the course in a learner's home and open ``path``."""
    folder = _slug(repo).split("/")[1]
    query = urllib.parse.urlencode({"repo": repo, "branch": branch, "urlpath": f"lab/tree/{folder}/{path}"})
    return f"{hub.rstrip('/')}/hub/user-redirect/git-pull?{query}"


# ----------------------------------------------------------------------------- notebook cells
def _minutes(root: Path) -> dict[str, int]:
    """Learner minutes per notebook, from the schedule's model and its recorded run times (if any)."""
    from .schedule import estimate, load_timings

    timings_path = root / "docs" / "schedule-timings.json"
    timings = load_timings(timings_path) if timings_path.exists() else {}
    out = {}
    for nb in registry.NOTEBOOKS:
        path = root / "solutions" / nb.filename
        if path.exists():
            out[nb.slug] = estimate(path, timings.get(nb.filename, 0.0)).minutes
    return out


def header_source(nb: registry.Notebook, kind: str, repo: str, minutes: int | None) -> str:
    """The first cell's Markdown for the ``kind`` ("exercise" or "solution") version of notebook ``nb``."""
    index = registry.NOTEBOOKS.index(nb)
    parts = []
    if index > 0:
        prev = registry.NOTEBOOKS[index - 1]
        parts.append(f"← [{prev.number} · {prev.title}]({prev.filename})")
    parts.append("[all notebooks](../README.md#syllabus)")
    if index + 1 < len(registry.NOTEBOOKS):
        nxt = registry.NOTEBOOKS[index + 1]
        parts.append(f"[{nxt.number} · {nxt.title}]({nxt.filename}) →")
    if nb.exercises:
        other = "solution" if kind == "exercise" else "exercise version"
        folder = "solutions" if kind == "exercise" else "notebooks"
        parts.append(f"[{other}](../{folder}/{nb.filename})")
    about = []
    if minutes:
        about.append(f"about {minutes} min")
    if nb.exercises:
        about.append(f"{len(nb.exercises)} exercise{'s' if len(nb.exercises) > 1 else ''}")
    line = " · ".join(parts) + (f" · *{', '.join(about)}*" if about else "")
    if published(repo):
        path = f"{'notebooks' if kind == 'exercise' else 'solutions'}/{nb.filename}"
        line += (f"\n\n[![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(repo, path)}) "
                 f"[![Open on Binder](https://mybinder.org/badge_logo.svg)]({binder_url(repo, path)})")
    return line


def colab_requirements() -> list[str]:
    """What the Colab cell installs when Colab lacks it: the course's own dependencies (from its package
    metadata, i.e. pyproject.toml) without torch, because Colab's preinstalled PyTorch must stay the only one."""
    from importlib.metadata import requires

    specs = [r.split(";")[0].strip() for r in requires("attn_course") or [] if "extra ==" not in r]
    return [s for s in specs if re.split(r"[<>=!~ \[]", s, maxsplit=1)[0].lower() != "torch"]


def colab_cell_source(repo: str) -> str:
    """The code cell that sets a notebook up on Colab (it does nothing anywhere else)."""
    source = f"git+{repo}@{BRANCH}" if published(repo) else ""
    needed = colab_requirements()
    return f'''# On Google Colab only: install the course's helper package (Colab's own PyTorch is kept) and turn on
# Colab's widget manager. Anywhere else (JupyterLab, Binder, a hub) this cell does nothing.
import importlib.util, os, re, subprocess, sys
if "google.colab" in sys.modules:
    if importlib.util.find_spec("attn_course") is None:
        source = os.environ.get("{COLAB_SOURCE_ENV}", "{source}")
        if not source:
            raise RuntimeError("This copy of the course is not published yet: open it in JupyterLab instead.")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", source], check=True)
        needed = {needed!r}  # the course's dependencies but torch
        missing = [spec for spec in needed if importlib.util.find_spec(re.split(r"[<>=!~]", spec)[0]) is None]
        if missing:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)
    from google.colab import output
    output.enable_custom_widget_manager()'''


def _cell_by_id(nb: nbformat.NotebookNode, cell_id: str):
    return next((c for c in nb.cells if c.get("id") == cell_id), None)


def apply_header(notebook: nbformat.NotebookNode, nb: registry.Notebook, kind: str, repo: str,
                 minutes: int | None) -> bool:
    """Put (or refresh) the links cell first and the Colab cell before the first set-up cell; True if changed."""
    from . import nbmeta

    before = nbformat.writes(notebook)
    header = _cell_by_id(notebook, HEADER_ID)
    if header is None:
        header = nbformat.v4.new_markdown_cell(id=HEADER_ID)
        notebook.cells.insert(0, header)
    header.source = header_source(nb, kind, repo, minutes)
    header.metadata = {"tags": ["links"]}
    colab = _cell_by_id(notebook, COLAB_ID)
    if colab is None:
        colab = nbformat.v4.new_code_cell(id=COLAB_ID)
        first_setup = next((i for i, c in enumerate(notebook.cells) if nbmeta.role(c) == nbmeta.SETUP), None)
        notebook.cells.insert(first_setup if first_setup is not None else 1, colab)
    colab.source = colab_cell_source(repo)
    colab.metadata.setdefault("tags", [])
    colab.metadata["tags"] = ["setup", "colab"]
    return nbformat.writes(notebook) != before


def readme_block(repo: str) -> str:
    if published(repo):
        path = "notebooks/00_setup.ipynb"
        body = (f"[![Open on Binder](https://mybinder.org/badge_logo.svg)]({binder_url(repo, path)}) "
                f"[![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(repo, path)})")
    else:
        body = ("**Not published yet.** After publishing this repository, put its address under `[project.urls]` "
                "in `pyproject.toml` (`Repository = \"https://github.com/owner/name\"`) and run "
                "`python -m attn_course links`: it writes the Binder and Colab badges here and an \"open in "
                "Colab / Binder\" line at the top of every notebook.")
    return f"{README_START}\n{body}\n{README_END}"


def _replace_block(text: str, block: str) -> str:
    pattern = re.compile(re.escape(README_START) + r".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        raise ValueError(f"README.md has no {README_START!r} … {README_END!r} block")
    return pattern.sub(lambda _: block, text, count=1)


# ----------------------------------------------------------------------------- command
def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 and list what is stale")
    parser.add_argument("--root", default=".", help="the course folder (default: the current folder)")
    parser.add_argument("--hub", metavar="URL", help="print the nbgitpuller link for this JupyterHub and stop")


def run(args: argparse.Namespace, out=None) -> int:
    out = sys.stdout if out is None else out  # the stream of the moment, not of import time
    root = Path(args.root)
    repo = repository(root)
    if args.hub:
        if not published(repo):
            print("Set Repository under [project.urls] in pyproject.toml first (it is still OWNER/REPO).", file=out)
            return 2
        print(nbgitpuller_url(args.hub, repo), file=out)
        return 0
    stale = []
    minutes = _minutes(root)
    for nb in registry.NOTEBOOKS:
        path = root / "solutions" / nb.filename
        if not path.exists():
            continue
        notebook = nbformat.read(path, as_version=4)
        if apply_header(notebook, nb, "solution", repo, minutes.get(nb.slug)):
            stale.append(str(path))
            if not args.check:
                path.write_text(nbformat.writes(notebook) + "\n", encoding="utf-8")
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    new = _replace_block(text, readme_block(repo))
    if new != text:
        stale.append(str(readme))
        if not args.check:
            readme.write_text(new, encoding="utf-8")
    for name in stale:
        print(f"{'STALE ' if args.check else 'wrote '} {name}", file=out)
    if args.check and stale:
        print("links are stale: run `python -m attn_course links`, then `python -m attn_course run-solutions` "
              "for the solutions listed and `python -m attn_course exercises`", file=out)
        return 1
    if not args.check and stale:
        print("now re-run the solutions written (`python -m attn_course run-solutions`) and regenerate the "
              "exercises (`python -m attn_course exercises`)", file=out)
    return 0
