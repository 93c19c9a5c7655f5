"""The conventions pyproject.toml's [tool.ruff] names (lines within 120 characters, no name shadowing a Python
builtin, no unused import, bugbear's and simplify's rules, a complexity limit for new functions), checked over the
whole project with that file's settings so that CI enforces them."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing():
    pytest.importorskip("ruff", reason="ruff is in the test extra")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", "pyproject.toml",
                           "--output-format", "concise", "."],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
