"""What ``make run``, ``make test`` and ``make profile`` install on a fresh machine
(dry runs: ``make -n``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _installs(target: str, venv: Path) -> list[str]:
    """The pip installs ``make TARGET`` would run with a fresh virtual environment."""
    dry = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=REPO, text=True,
                         capture_output=True, timeout=30, check=True)
    return [line.split(" install ", 1)[1] for line in dry.stdout.splitlines()
            if " -m pip install " in line and "--upgrade pip" not in line]


def test_make_run_installs_the_relay_without_the_test_tools(tmp_path: Path) -> None:
    assert _installs("run", tmp_path / "venv") == ["--quiet -e ."]


def test_make_test_installs_the_test_tools(tmp_path: Path) -> None:
    assert _installs("test", tmp_path / "venv")[-1] == "--quiet -e '.[test]'"


def test_make_profile_installs_py_spy_beside_the_test_tools(tmp_path: Path) -> None:
    assert _installs("profile", tmp_path / "venv")[-2:] == ["--quiet -e '.[test]'",
                                                           "--quiet -e '.[profile]'"]
