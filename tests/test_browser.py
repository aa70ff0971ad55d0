"""The course as a learner meets it: JupyterLab 4 in headless Chromium at 1366×768, driven by Playwright.

Starts JupyterLab on 127.0.0.1 with a token in a temporary folder, then:

* opens an unfilled exercise notebook and runs *Run All*: every cell runs to the last one, and each
  check shows its "not attempted" verdict without stopping the notebook;
* then, in that kernel (the stub defined), types a syntax error into an exercise cell and runs it and
  its check cell (Shift+Enter on each): the check names the syntax error with its line and caret, never
  "not attempted" for the stub that is still defined (a check never grades a definition older than its
  cell's last run);
* opens the same notebook, cut to its set-up, exercise and check cells, with a wrong answer in one
  exercise and a syntax error in another: the wrong
  answer's output shows the diagnosis (tried / got / expected / cause / to do) in a box with a red edge,
  and no frame of the course's code; the syntax error is named with its line; Run All still reaches the
  end (checks do not raise in a notebook);
* opens a notebook showing every explorer (the d_k slider, the temperature slider, the five-step
  stepper, the mask builder, the head explorer), uses each control the way a person would and asserts
  that the figure drawn below the controls changed.

Screenshots of each go to test-artifacts/browser/ (look at them).

Skipped, with the reason, when Chromium (Debian's ``chromium`` package) or Playwright is missing:
``.ci/run`` installs both. No browser is ever downloaded.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from tests.tools._grading import graded_cells_only

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM_CANDIDATES = [os.environ.get("CHROMIUM", ""), "/usr/bin/chromium", "/usr/bin/chromium-browser",
                       shutil.which("chromium") or "", shutil.which("chromium-browser") or ""]
CHROMIUM = next((c for c in CHROMIUM_CANDIDATES if c and Path(c).exists()), None)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,  # a JupyterLab server, Chromium and two kernels: about a minute
    pytest.mark.skipif(sync_playwright is None,
                       reason="Playwright is not installed (pip install -r requirements-browser.txt)"),
    pytest.mark.skipif(CHROMIUM is None,
                       reason="Chromium not found (Debian/Ubuntu: apt-get install chromium; or set CHROMIUM=path)"),
]

# Each explorer the course may have: (module, function, code that shows it, how to use its control).
SETUP = """\
import torch
torch.manual_seed(0)
"""
EXPLORERS = [
    ("scaling", "explore_dk", "scaling.explore_dk()", "slider"),
    ("softmax", "temperature_explorer",
     "softmax.temperature_explorer(torch.tensor([2.0, 1.0, 0.5, -1.0]), labels=['cat', 'sat', 'on', 'mat'])",
     "slider"),
    ("attention", "attention_stepper",
     "attention.attention_stepper(torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8),\n"
     "                            query_labels=list('abcd'), key_labels=list('abcd'))", "next"),
    ("masks", "mask_builder", "masks.mask_builder()", "dropdown"),
    ("patterns", "head_explorer",
     "patterns.head_explorer([torch.softmax(torch.randn(4, 6, 6), -1), torch.softmax(torch.randn(4, 6, 6), -1)],\n"
     "                       ['the', 'cat', 'sat', 'on', 'the', 'mat'])", "dropdown"),
]


def available_explorers():
    found = []
    for module, function, code, action in EXPLORERS:
        try:
            mod = importlib.import_module(f"attn_course.{module}")
        except Exception:
            continue
        if hasattr(mod, function):
            found.append((module, function, code, action))
    return found


def explorer_notebook(explorers) -> nbformat.NotebookNode:
    cells = [nbformat.v4.new_markdown_cell("# Every explorer of the course (browser test)"),
             nbformat.v4.new_code_cell(SETUP + "".join(f"from attn_course import {m}\n" for m, *_ in explorers))]
    for module, function, code, _ in explorers:
        cells.append(nbformat.v4.new_markdown_cell(f"`{module}.{function}`"))
        cells.append(nbformat.v4.new_code_cell(code))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 with a token, serving a temporary folder."""
    home = tmp_path_factory.mktemp("lab")
    work = home / "work"
    work.mkdir()
    settings = home / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    # No "news" toast over the notebook, no update check: the machine may be offline.
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false",
                                                                            "checkForUpdates": False}))
    notebook_settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    notebook_settings.mkdir(parents=True)
    # Start the notebook's own kernel (python3) without asking, as a learner's second visit does; keep every
    # cell in the page (no windowing), so the test can read cells far below the fold.
    (notebook_settings / "tracker.jupyterlab-settings").write_text(json.dumps({"autoStartDefaultKernel": True,
                                                                               "windowingMode": "none"}))
    port, token = _free_port(), "attn-course-browser-test"
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               IPYTHONDIR=str(home / "ipython"), MPLBACKEND="module://matplotlib_inline.backend_inline")
    log = (home / "lab.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}", "--ServerApp.open_browser=False",
         "--LabApp.news_url=", "--allow-root"],
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except Exception:
            if server.poll() is not None or time.time() > deadline:
                server.kill()
                pytest.fail("JupyterLab did not start:\n" + (home / "lab.log").read_text()[-3000:])
            time.sleep(0.5)
    yield {"url": url, "token": token, "work": work, "log": home / "lab.log"}
    server.terminate()
    try:
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


def _image_src(explorer) -> str | None:
    image = explorer.locator("img")  # an ipywidgets Image, or an image in an Output widget
    return image.first.get_attribute("src") if image.count() else None


def _wait_for_change(page, explorer, before: str, seconds: float = 30) -> str | None:
    """The image's new src once it differs from ``before`` and has settled (the last redraw arrived)."""
    deadline = time.time() + seconds
    changed, last, since = None, before, time.time()
    while time.time() < deadline:
        now = _image_src(explorer)
        if now != last:
            last, since = now, time.time()
        if now and now != before:
            changed = now
            if time.time() - since > 1.5:
                break
        page.wait_for_timeout(250)
    return changed


VIEWPORT = {"width": 1366, "height": 768}


def _open_and_run_all(page, lab, name: str) -> None:
    # `reset`: a fresh workspace, so only this notebook is open (not the tabs of an earlier page).
    page.goto(f"{lab['url']}/lab/tree/{name}?reset&token={lab['token']}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    page.wait_for_timeout(1500)
    dialog = page.locator(".jp-Dialog button", has_text="Select")
    if dialog.count():
        dialog.first.click()
    page.wait_for_function("document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Toolbar-kernelName')"
                           "?.textContent.includes('Python')", timeout=90_000)
    page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator[data-status='idle']",
                           timeout=90_000)
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").first.click()  # focus this notebook
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()


def _prompts(page) -> list[str]:
    return page.eval_on_selector_all(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt",
                                     "els => els.map(e => e.textContent.trim())")


def _wait_until_every_cell_ran(page, seconds: float = 240) -> list[str]:
    deadline = time.time() + seconds
    prompts = _prompts(page)
    while time.time() < deadline:
        prompts = _prompts(page)
        if prompts and all(p.strip("[]: ").isdigit() for p in prompts):
            break
        page.wait_for_timeout(500)
    return prompts


def _cell_output(page, cell_text: str):
    """The output area of the code cell whose source contains ``cell_text``."""
    cell = page.locator(".jp-CodeCell", has=page.locator(".jp-InputArea", has_text=cell_text)).first
    cell.scroll_into_view_if_needed()
    return cell


def test_run_all_reaches_the_end_and_failures_read_like_a_tutor(lab):
    source = ROOT / "notebooks" / "05_attention.ipynb"
    unfilled = nbformat.read(source, as_version=4)
    nbformat.write(unfilled, lab["work"] / "unfilled.ipynb")
    wrong = nbformat.read(source, as_version=4)
    graded_cells_only(wrong)  # the demonstrations ran in the first Run All
    for cell in wrong.cells:
        if cell.cell_type == "code" and cell.source.startswith("def attention("):
            cell.source = cell.source.replace(
                "    # YOUR CODE HERE\n    raise NotImplementedError()",
                "    weights = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-2)\n"
                "    return weights @ V, weights")
        if cell.cell_type == "code" and cell.source.startswith("def score_matrix_bytes("):
            cell.source = cell.source.replace("    # YOUR CODE HERE\n    raise NotImplementedError()",
                                              "    return batch * heads * (n * n")
    nbformat.write(wrong, lab["work"] / "answered.ipynb")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    code_cells = sum(c.cell_type == "code" for c in unfilled.cells)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
        page.set_default_timeout(60_000)

        _open_and_run_all(page, lab, "unfilled.ipynb")
        prompts = _wait_until_every_cell_ran(page)
        page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").last.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "run-all-unfilled-end.png"))
        check = _cell_output(page, "check_attention()")
        check.screenshot(path=str(ARTIFACTS / "run-all-unfilled-check.png"))
        print(f"\nRun All on an unfilled notebook: {sum(p.strip('[]: ').isdigit() for p in prompts)} of {code_cells} "
              "code cells ran")
        assert len(prompts) == code_cells and all(p.strip("[]: ").isdigit() for p in prompts), prompts
        text = check.locator(".jp-OutputArea").inner_text()
        assert "○ attention: not attempted yet" in text and "to do" in text
        assert check.locator(".attn-course-check").count() == 1  # the box with the red edge

        # The stub is defined in this kernel. A syntax error typed into the exercise cell, then Run All again:
        # the check must name the syntax error, not grade the stub that is still defined.
        exercise = _cell_output(page, "def attention(")
        exercise.locator(".cm-content").first.click()
        page.keyboard.press("Control+a")
        stub_source = next(c.source for c in unfilled.cells if c.source.startswith("def attention("))
        page.keyboard.insert_text(stub_source.replace(
            "    # YOUR CODE HERE\n    raise NotImplementedError()",
            "    scores = (Q @ K.transpose(-2, -1)\n    return scores @ V"))
        # As a learner does after an edit: Shift+Enter on the exercise cell, then on its check cell.
        page.keyboard.press("Shift+Enter")
        stale = _cell_output(page, "check_attention()")
        prompt = stale.locator(".jp-InputPrompt")
        before = prompt.inner_text()
        stale.locator(".cm-content").first.click()
        page.keyboard.press("Shift+Enter")
        deadline = time.time() + 120
        while time.time() < deadline and (prompt.inner_text() == before
                                          or not prompt.inner_text().strip("[]: ").isdigit()):
            page.wait_for_timeout(250)  # "[*]" while it runs, then its new count
        assert prompt.inner_text() != before, "the check cell did not run again"
        stale.screenshot(path=str(ARTIFACTS / "stale-definition-syntax-error-check.png"))
        text = stale.locator(".jp-OutputArea").inner_text()
        line = 1 + stub_source.split("\n").index("    # YOUR CODE HERE")
        assert f"✗ attention: syntax error in your exercise cell (line {line})" in text, text
        assert "not attempted" not in text and "^" in text and "earlier run" in text, text

        page.close()
        page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
        page.set_default_timeout(60_000)
        _open_and_run_all(page, lab, "answered.ipynb")
        prompts = _wait_until_every_cell_ran(page)
        assert all(p.strip("[]: ").isdigit() for p in prompts), f"Run All stopped: {prompts}"
        wrong_check = _cell_output(page, "check_attention()")
        wrong_check.screenshot(path=str(ARTIFACTS / "wrong-answer-diagnosis.png"))
        text = wrong_check.locator(".jp-OutputArea").inner_text()  # what the learner reads under the cell
        assert "✗ attention" in text and "softmax over axis -2" in text and "dim=-1" in text
        for part in ("tried", "got", "cause", "to do"):
            assert part in text, f"{part!r} missing from the diagnosis:\n{text}"
        assert "attn_course" not in text and "Traceback" not in text and 'File "' not in text, text
        syntax = _cell_output(page, "def score_matrix_bytes(")
        syntax.screenshot(path=str(ARTIFACTS / "syntax-error-exercise.png"))
        assert "SyntaxError" in syntax.locator(".jp-OutputArea").inner_text()
        syntax_check = _cell_output(page, "check_score_matrix_bytes()")
        syntax_check.screenshot(path=str(ARTIFACTS / "syntax-error-check.png"))
        assert "syntax error in your exercise cell (line" in syntax_check.locator(".jp-OutputArea").inner_text()
        browser.close()


def test_every_explorer_responds_in_jupyterlab(lab):
    explorers = available_explorers()
    if not explorers:
        pytest.skip("no explorer in attn_course yet")
    nbformat.write(explorer_notebook(explorers), lab["work"] / "explorers.ipynb")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
        page.set_default_timeout(60_000)
        page.goto(f"{lab['url']}/lab/tree/explorers.ipynb?reset&token={lab['token']}")  # no tabs left by other tests
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
        page.wait_for_timeout(2000)
        dialog = page.locator(".jp-Dialog button", has_text="Select")
        if dialog.count():  # older JupyterLab ignores autoStartDefaultKernel: choose the kernel by hand
            dialog.first.click()
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
        page.wait_for_function("document.querySelector('.jp-Toolbar-kernelName')?.textContent.includes('Python')")
        # The kernel must be idle before "Run All", or the first cells may be sent to no kernel.
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
        page.locator(".lm-MenuBar-item", has_text="Run").first.click()
        page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
        print(f"\nJupyterLab open, kernel idle: {time.perf_counter() - started:.0f} s")
        explorers_dom = page.locator(".attn-course-explorer")
        deadline = time.time() + 180
        while time.time() < deadline:
            count = explorers_dom.count()
            if count == len(explorers) and all(_image_src(explorers_dom.nth(i)) for i in range(count)):
                break
            page.wait_for_timeout(500)
        print(f"all cells run, {explorers_dom.count()} explorers drawn: {time.perf_counter() - started:.0f} s")
        page.screenshot(path=str(ARTIFACTS / "00-notebook-after-run-all.png"), full_page=False)
        assert explorers_dom.count() == len(explorers), (
            f"{explorers_dom.count()} of {len(explorers)} explorers rendered as live widgets")

        problems = []
        for i, (module, function, _, action) in enumerate(explorers):
            explorer = explorers_dom.nth(i)
            explorer.scroll_into_view_if_needed()
            before = _image_src(explorer)
            explorer.screenshot(path=str(ARTIFACTS / f"{i + 1:02d}-{function}-before.png"))
            if action == "slider":
                handle = explorer.locator(".noUi-handle").first
                handle.click()  # focus the handle, then move it the way a keyboard user does
                for _ in range(2):
                    handle.press("ArrowRight")
            elif action == "next":
                explorer.locator("button", has_text="next").first.click()
            elif action == "dropdown":
                select = explorer.locator("select").first
                options = select.locator("option")
                current = select.input_value()
                values = [options.nth(k).get_attribute("value") for k in range(options.count())]
                select.select_option(next(v for v in values if v != current))
            after = _wait_for_change(page, explorer, before)
            explorer.screenshot(path=str(ARTIFACTS / f"{i + 1:02d}-{function}-after.png"))
            if after is None:
                problems.append(f"{module}.{function}: the figure did not change after using its {action}")
        page.screenshot(path=str(ARTIFACTS / "99-notebook-end.png"), full_page=False)
        browser.close()
    print(f"\nbrowser test: {len(explorers)} explorers in {time.perf_counter() - started:.0f} s; "
          f"screenshots in {ARTIFACTS.relative_to(ROOT)}/")
    assert not problems, "\n".join(problems)
