"""llama.cpp's server tests run against `pyggml serve` (see utils.py); the servers they started end with the
session."""

import pytest

from tests.serve.llamacpp_ported_compat.utils import stop_all


@pytest.fixture(scope="session", autouse=True)
def stop_servers():
    yield
    stop_all()
