"""The ported llama.cpp server tests share their `pyggml serve` processes; they stop when the session ends."""

import pytest

from tests.serve.llamacpp_ported.utils import stop_all


@pytest.fixture(scope="session", autouse=True)
def stop_servers_at_the_end():
    yield
    stop_all()
