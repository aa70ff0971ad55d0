"""The launch files (binder/, scripts/*_simulation / _test / _roundtrip) agree with what they drive.

These are the fast, offline halves of the launch checks; the slow halves build environments and run
in CI as scripts (scripts/binder_env_test.py, scripts/colab_simulation.py; docs/hub.md).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import _launch_env  # noqa: E402


def test_torch_for_throwaway_environments_is_binders_cpu_pin():
    pin = _launch_env.binder_pins()["torch"]
    assert pin.endswith("+cpu"), "binder/requirements.txt must pin the CPU build of PyTorch"
    assert _launch_env.torch_spec() == "torch==" + pin.removesuffix("+cpu")


def test_source_copy_holds_the_package_and_nothing_ignored(tmp_path):
    copy = _launch_env.source_copy(tmp_path / "copy")
    assert (copy / "pyproject.toml").is_file() and (copy / "attn_course" / "__init__.py").is_file()
    assert (copy / "binder" / "postBuild").is_file()
    assert not (copy / ".venv").exists() and not (copy / ".cache").exists()
    assert not list(copy.rglob("__pycache__"))


def test_quiet_says_what_failed_and_stops(capsys):
    with pytest.raises(SystemExit) as stop:
        _launch_env.quiet([sys.executable, "-c", "import sys; print('the reason'); sys.exit(3)"], what="a step")
    assert stop.value.code == 1
    out = capsys.readouterr().out
    assert "FAILED  a step" in out and "exit 3" in out and "the reason" in out


def test_postbuild_installs_the_package_non_editable_and_fails_on_error():
    text = (ROOT / "binder" / "postBuild").read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
    commands = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    installs = [line for line in commands if "pip install" in line]
    assert installs == ["python -m pip install --no-deps --no-cache-dir ."], installs
    assert not any(re.search(r"\s(-e|--editable)\b", line) for line in commands)
    assert "python binder/install_server_config.py" in commands


@pytest.mark.slow
def test_server_settings_are_real_jupyter_server_traits():
    """Every key of binder/jupyter_server_config.json is a configurable trait of the class it configures
    (a misspelt key would be ignored by Jupyter without a word)."""
    from jupyter_server.services.kernels.kernelmanager import MappingKernelManager
    from jupyter_server_terminals.terminalmanager import TerminalManager

    ResourceUseDisplay = pytest.importorskip("jupyter_resource_usage.config").ResourceUseDisplay
    config = json.loads((ROOT / "binder" / "jupyter_server_config.json").read_text())
    assert set(config) == {"MappingKernelManager", "TerminalManager", "ResourceUseDisplay"}
    for cls in (MappingKernelManager, TerminalManager, ResourceUseDisplay):
        traits = cls.class_traits(config=True)
        for key, value in config[cls.__name__].items():
            assert key in traits, f"{cls.__name__}.{key} is not a setting"
            traits[key].validate(None, value)
    assert config["MappingKernelManager"]["cull_idle_timeout"] > 0
    # the memory indicator turns red before Binder's limit is reached, not at it
    assert 0.1 <= config["ResourceUseDisplay"]["mem_warning_threshold"] < 0.5


def test_the_memory_indicator_is_installed_with_the_lab_and_on_binder():
    import tomllib

    lab = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["lab"]
    assert any(r.startswith("jupyter-resource-usage") for r in lab)
    assert "jupyter-resource-usage" in _launch_env.binder_pins()


def test_scripts_say_how_to_use_them():
    for name in ("binder_env_test", "colab_simulation", "nbgrader_roundtrip", "measure_open_notebooks", "check_hub_image"):
        result = subprocess.run([sys.executable, "-c", f"import ast, sys; m = ast.parse(open(sys.argv[1]).read()); "
                                 f"print(ast.get_docstring(m) or '')", ROOT / "scripts" / f"{name}.py"],
                                capture_output=True, text=True, check=True)
        assert f"scripts/{name}.py" in result.stdout, f"scripts/{name}.py's docstring does not show how to run it"
