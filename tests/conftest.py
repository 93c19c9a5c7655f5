"""Shared test settings: where the shared fixtures live and the hypothesis profiles."""

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PYGGML_SHARED", REPO.parent / "shared"))
GRAPHS = SHARED / "graphs"
PLANNING_BENCH = SHARED / "planning-bench"

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("long" if os.environ.get("PYGGML_LONG") else "ci")


@pytest.fixture(scope="session")
def graph_files():
    files = sorted(GRAPHS.glob("*.json"))
    if not files:
        pytest.skip(f"no graph fixtures under {GRAPHS} (set PYGGML_SHARED)")
    return files
