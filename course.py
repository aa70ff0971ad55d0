#!/usr/bin/env python3
"""Set up and run the course with one command, the same on Linux, macOS and Windows.

    python3 course.py lab       # first time: make .venv, install the course, open JupyterLab at notebook 00
    python3 course.py grade     # grade your notebooks: one row per exercise (passed / failed: why / not attempted)
    python3 course.py update    # get the course's latest version without losing any of your work
    python3 course.py test      # install if needed, then run the whole test suite (what CI runs)
    python3 course.py setup     # only install

On Windows, type `python` instead of `python3`. `python3 course.py COMMAND --help` says more about a
command (at once: it installs nothing).

The environment lives in .venv next to this file and is reinstalled only when pyproject.toml,
requirements.txt or binder/jupyter_server_config.json change. Run from an already activated virtual environment (or conda env), the
course installs into that one instead. Only the standard library is used here, on purpose: this
script runs before anything is installed.

PyTorch: on Linux and Windows machines without an NVIDIA driver, the small CPU-only build is
installed first (the default download is a CUDA build of several GB). Set COURSE_TORCH=default to
skip that and let pip choose, e.g. to get CUDA support.

Exit status: 0 when the command did its work; `grade`: 0 when no exercise failed (passed or not
attempted yet), 1 when at least one failed or could not be graded, 2 when nothing could be graded
(no course notebook found, a wrong argument); `test`: pytest's exit status.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP_NAME = ".attn_course-installed"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
FIRST_NOTEBOOK = "notebooks/00_setup.ipynb"


def say(message: str) -> None:
    print(f"[course] {message}", flush=True)


def torch_spec() -> str:
    """The torch requirement as pyproject.toml states it (the one place versions are written)."""
    match = re.search(r'"(torch\s*[<>=!~][^"]*)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return match.group(1).replace(" ", "") if match else "torch"


def in_active_env() -> bool:
    return sys.prefix != sys.base_prefix or bool(os.environ.get("CONDA_PREFIX"))


def env_prefix() -> Path:
    return Path(sys.prefix) if in_active_env() else VENV


def env_python() -> Path:
    if in_active_env():
        return Path(sys.executable)
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def wanted_digest() -> str:
    h = hashlib.sha256()
    for name in ("requirements.txt", "pyproject.toml", "binder/jupyter_server_config.json"):
        path = ROOT / name
        if path.exists():
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def run(*cmd: object, check: bool = True, env: dict[str, str] | None = None) -> int:
    code = subprocess.call([str(c) for c in cmd], cwd=ROOT, env=env)
    if check and code != 0:
        say(f"command failed ({code}): {' '.join(map(str, cmd))}")
        sys.exit(code)
    return code


def wants_cpu_torch(python: Path) -> bool:
    if os.environ.get("COURSE_TORCH", "cpu") == "default" or platform.system() == "Darwin":
        return False  # macOS wheels on PyPI are already CPU/MPS builds
    if shutil.which("nvidia-smi"):
        return False  # an NVIDIA GPU is there: let pip take the CUDA build
    has_torch = subprocess.call([str(python), "-c", "import torch"], stderr=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL) == 0
    return not has_torch


def install_server_config(python: Path) -> None:
    """Merge the course's Jupyter server settings (idle kernels culled, the memory indicator's warning) into
    this environment's etc/jupyter/jupyter_server_config.json, as Binder does (binder/postBuild). A file
    in jupyter_server_config.d/ would not do: Jupyter Server reads only extensions to enable from there."""
    run(python, ROOT / "binder" / "install_server_config.py")


def setup() -> Path:
    python = env_python()
    if not in_active_env() and not python.exists():
        say(f"creating a virtual environment in {VENV.name}/")
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = env_prefix() / STAMP_NAME
    if stamp.exists() and stamp.read_text().strip() == wanted_digest():
        return python
    say("installing the course (a few minutes the first time)")
    if wants_cpu_torch(python):
        say("installing the CPU-only build of PyTorch (set COURSE_TORCH=default to skip)")
        code = run(python, "-m", "pip", "install", "--retries", "1", "--timeout", "30",
                   "--index-url", CPU_TORCH_INDEX, torch_spec(), check=False)
        if code != 0:
            say("the CPU-only PyTorch index could not be used; pip will choose a build instead")
    run(python, "-m", "pip", "install", "-r", "requirements.txt")
    install_server_config(python)
    stamp.write_text(wanted_digest() + "\n")
    say("installed")
    return python


def env_bin() -> Path:
    """The folder of the course environment's programs (python, jupyter, pytest)."""
    if in_active_env():
        return Path(sys.executable).parent
    return VENV / ("Scripts" if os.name == "nt" else "bin")


def env_with_venv() -> dict[str, str]:
    """This environment with the course's interpreter first on PATH (and VIRTUAL_ENV set), so that
    `python` in JupyterLab's terminal and in every subprocess is the course's Python."""
    env = dict(os.environ)
    env["PATH"] = str(env_bin()) + os.pathsep + env.get("PATH", "")
    if not in_active_env():
        env["VIRTUAL_ENV"] = str(VENV)
    return env


# A terminal's shell reads the learner's start-up files (~/.bashrc, ~/.zshrc, ~/.bash_profile...), and
# those often put a pyenv or conda `python` first on PATH again. For bash and zsh, JupyterLab's terminals
# start a shell that reads those files as usual and then puts the course's environment first once more.
_BASH_RC = """# written by course.py: JupyterLab's terminal reads your usual start-up files, then puts the course first
if [ -n "$COURSE_LOGIN_SHELL" ]; then
  [ -f /etc/profile ] && . /etc/profile
  for f in ~/.bash_profile ~/.bash_login ~/.profile; do [ -f "$f" ] && . "$f" && break; done
else
  [ -f /etc/bash.bashrc ] && . /etc/bash.bashrc
  [ -f ~/.bashrc ] && . ~/.bashrc
fi
export PATH="$COURSE_BIN:$PATH"
"""
_ZSH_FILES = {  # ZDOTDIR points here: each file reads the learner's own, the last one puts the course first
    ".zshenv": '[ -f "$HOME/.zshenv" ] && . "$HOME/.zshenv"\n',
    ".zprofile": '[ -f "$HOME/.zprofile" ] && . "$HOME/.zprofile"\n',
    ".zshrc": '[ -f "$HOME/.zshrc" ] && . "$HOME/.zshrc"\nexport PATH="$COURSE_BIN:$PATH"\n',
    ".zlogin": '[ -f "$HOME/.zlogin" ] && . "$HOME/.zlogin"\nexport PATH="$COURSE_BIN:$PATH"\nunset ZDOTDIR\n',
}


def terminal_shell(env: dict[str, str], folder: Path) -> str | None:
    """The shell command for JupyterLab's terminals (bash or zsh: the learner's start-up files, then the
    course's environment first on PATH); ``env`` gains what that shell needs. None for other shells
    (Windows, fish...): they get the server's environment, which already has the course first."""
    shell = env.get("SHELL") or ""
    name = Path(shell).name
    if os.name == "nt" or name not in ("bash", "zsh") or not Path(shell).exists():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    env["COURSE_BIN"] = str(env_bin())
    # Jupyter starts a login shell when it does not run in a terminal itself (a desktop launcher).
    if not sys.stdout.isatty():
        env["COURSE_LOGIN_SHELL"] = "1"
    if name == "bash":
        rc = folder / "bashrc"
        rc.write_text(_BASH_RC, encoding="utf-8")
        return f"{shlex.quote(shell)} --rcfile {shlex.quote(str(rc))} -i"
    for file, text in _ZSH_FILES.items():
        (folder / file).write_text(text, encoding="utf-8")
    env["ZDOTDIR"] = str(folder)
    return f"{shlex.quote(shell)} -i" + (" -l" if env.get("COURSE_LOGIN_SHELL") else "")


def _opens(rest: list[str]) -> list[str]:
    """The notebooks or folders named among ``rest`` (JupyterLab opens those instead of notebook 00)."""
    return [a for a in rest if not a.startswith("-") and (a.endswith(".ipynb") or (ROOT / a).exists() or Path(a).exists())]


def lab_args(rest: list[str], env: dict[str, str]) -> tuple[list[str], str]:
    """JupyterLab's arguments for ``lab`` with the learner's ``rest``, and the line that says what happens.
    Notebook 00 is opened (and is the address JupyterLab prints) unless ``rest`` names another notebook or
    a default URL of its own; every other argument (``--no-browser``, ``--port=...``) is passed on."""
    args = [f"--ServerApp.root_dir={ROOT}"]
    opens = _opens(rest)
    target = FIRST_NOTEBOOK
    if opens:
        named = Path(opens[0])
        try:
            target = (named if named.is_absolute() else (Path.cwd() / named)).resolve().relative_to(ROOT).as_posix()
        except ValueError:
            target = opens[0]
    if not any("default_url" in a for a in rest):
        args.append(f"--LabApp.default_url=/lab/tree/{target}")
    args += rest
    if not opens:
        args.append(FIRST_NOTEBOOK)
    where = "notebook 00" if target == FIRST_NOTEBOOK else target
    if any(a == "--no-browser" or a.startswith("--ServerApp.open_browser=False") for a in rest):
        line = f"starting JupyterLab at {where}: open the address it prints below (stop it with Ctrl+C)"
    else:
        line = f"opening JupyterLab at {where} (stop it with Ctrl+C)"
    if not any("terminado_settings" in a for a in rest):
        shell = terminal_shell(env, env_prefix() / "etc" / "attn-course-shell")
        if shell:
            args.append(f"--ServerApp.terminado_settings=shell_command={shell}")
    return args, line


def lab(python: Path, rest: list[str]) -> int:
    env = env_with_venv()
    args, line = lab_args(rest, env)
    say(line)
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in rest:
        say("running as root (a container?): passing --allow-root to JupyterLab")  # JupyterLab refuses root without it
        args.append("--allow-root")
    return run(python, "-m", "jupyterlab", *args, check=False, env=env)


def test(python: Path, rest: list[str]) -> int:
    parallel = []
    if subprocess.call([str(python), "-c", "import xdist"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0:
        # One worker more than cores: part of the suite waits (kernels starting, a browser, a grader's
        # subprocesses) and a spare worker fills those waits (2 quiet cores, whole suite with 3 workers:
        # 209-253 s on one day's virtual machine, 291-324 s on a day it ran ×1.4 slower; up to 520 s when
        # other work shares the machine).
        # --dist loadfile: a notebook's cells stay on one worker, in order. --no-loadscope-reorder: files are
        # handed out in collection order, longest first (conftest.py), not by their number of tests.
        parallel = ["-n", str((os.cpu_count() or 1) + 1), "--dist", "loadfile", "--no-loadscope-reorder"]
    return run(python, "-m", "pytest", *parallel, *rest, check=False, env=env_with_venv())


# ----------------------------------------------------------------------------- update
def git(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def update() -> int:
    """Bring in the course's new version. Your work is never overwritten: a notebook you changed that
    the course also changed keeps your version, and the new one is saved beside it as
    ``NN_topic.updated.ipynb``."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        say("this folder is not a git clone (or git is missing): download the course again into a new folder "
            "and copy your notebooks over")
        return 2
    try:
        branch = git("rev-parse", "--abbrev-ref", "HEAD").stdout.strip()
        upstream = git("rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{u}", check=False).stdout.strip()
        if not upstream:
            say(f"branch {branch!r} follows no remote branch; nothing to update from")
            return 2
        say(f"fetching {upstream}")
        git("fetch", "--quiet")
        ahead = int(git("rev-list", "--count", f"{upstream}..HEAD").stdout.strip())
        if ahead:
            say(f"you have {ahead} commit(s) of your own; merge the course's version yourself: git merge {upstream}")
            return 2
        incoming = set(filter(None, git("diff", "--name-only", "HEAD", upstream).stdout.splitlines()))
        if not incoming:
            say("already up to date")
            return 0
        mine = set()
        for line in git("status", "--porcelain", "--untracked-files=no").stdout.splitlines():
            mine.add(line[3:].split(" -> ")[-1].strip('"'))
        both = sorted(incoming & mine)
        kept = {path: (ROOT / path).read_bytes() for path in both if (ROOT / path).exists()}
        for path in kept:  # set your version aside (in memory) so the fast-forward can go through
            git("checkout", "HEAD", "--", path)
        try:
            git("merge", "--ff-only", "--quiet", upstream)
        finally:
            for path, content in kept.items():
                new = ROOT / path
                if new.exists() and new.read_bytes() != content:
                    beside = new.with_name(new.stem + ".updated" + new.suffix)
                    shutil.copyfile(new, beside)
                    say(f"{path}: you changed it and so did the course; yours is kept, the new version is {beside.relative_to(ROOT)}")
                new.write_bytes(content)
        say(f"updated to {git('rev-parse', '--short', 'HEAD').stdout.strip()}; {len(incoming)} file(s) changed upstream")
    except RuntimeError as exc:
        say(str(exc))
        return 1
    return 0


COMMANDS = ("setup", "lab", "test", "grade", "update")
#: What `python3 course.py COMMAND --help` prints (at once: nothing is installed to answer).
HELP = {
    "setup": """python3 course.py setup

Create .venv (unless a virtual environment or conda env is active: then it installs into that one) and
install the course into it. Done again only when pyproject.toml, requirements.txt or
binder/jupyter_server_config.json change.""",
    "lab": f"""python3 course.py lab [JUPYTERLAB ARGUMENTS...]

Install the course if needed, then start JupyterLab in the course's folder with {FIRST_NOTEBOOK} open
(and as the address it prints). JupyterLab's terminals get the course's Python first on PATH.
Every argument is passed on to JupyterLab, e.g. --no-browser (open the printed address yourself) or
--port=8890; name a notebook (notebooks/05_attention.ipynb) to open that one instead of notebook 00.
JupyterLab's own options: `.venv/bin/jupyter lab --help` (Windows: `.venv\\Scripts\\jupyter lab --help`).""",
    "grade": """python3 course.py grade [NOTEBOOK|FOLDER ...] [--csv FILE] [--json FILE]

Install the course if needed, then grade your notebooks (default: notebooks/): one row per exercise,
passed / failed: why / not attempted. Each notebook runs in a fresh process; nothing is changed.

Exit status: 0 when no exercise failed (every one passed or is not attempted yet), 1 when at least one
failed or could not be graded, 2 when nothing could be graded (no course notebook found, a wrong
argument). Every option of `python -m attn_course grade` works here too; their list:
`.venv/bin/python -m attn_course grade --help` (Windows: `.venv\\Scripts\\python -m attn_course grade --help`).""",
    "update": """python3 course.py update

Bring in the course's latest version (git). Your work is never overwritten: a notebook you changed
that the course also changed keeps your version, and the new one is saved beside it as
NN_topic.updated.ipynb. Exit status 0 when updated (or already up to date), 1 when git failed, 2 when
there is nothing to update from or you have commits of your own (merge those yourself).""",
    "test": """python3 course.py test [PYTEST ARGUMENTS...]

Install the course if needed, then run the whole test suite (what CI runs), in parallel when
pytest-xdist is installed; arguments are passed on to pytest (e.g. -m "not slow" for the quick loop).
Exit status: pytest's.""",
}


def wants_help(rest: list[str]) -> bool:
    return any(a in ("-h", "--help", "help") for a in rest[:1]) or any(a in ("-h", "--help") for a in rest)


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command in ("help", "-h", "--help"):
        if rest and rest[0] in HELP:
            print(HELP[rest[0]])
            return 0
        if rest:
            say(f"no help on {rest[0]!r}: it is not a command; use one of: {', '.join(COMMANDS)}")
            return 2
        print(__doc__)
        return 0
    if command not in COMMANDS:
        say(f"unknown command {command!r}; use one of: {', '.join(COMMANDS)}")
        return 2
    if wants_help(rest):
        print(HELP[command])
        return 0
    if command == "update":
        return update()
    python = setup()
    if command == "lab":
        return lab(python, rest)
    if command == "test":
        return test(python, rest)
    if command == "grade":
        return run(python, "-m", "attn_course", "grade", *rest, check=False, env=env_with_venv())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
