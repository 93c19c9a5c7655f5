"""Shared test settings: the graph fixtures and the hypothesis profiles."""

import os

import pytest
from hypothesis import HealthCheck, settings

from fixture_data import graph_paths

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("long" if os.environ.get("PYGGML_LONG") else "ci")


@pytest.fixture(scope="session")
def graph_files():
    """The six ggml graph files of tests/data/graphs (tests/test_fixture_data.py checks they are there)."""
    return graph_paths()
