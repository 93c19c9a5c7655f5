"""One tiny-model server for the module's tests (the real engine, 4 slots, 127.0.0.1 at a free port)."""

import pytest

from pyggml.serve.app import create_app
from tests.support.serve import ServerThread, make_state, write_chat_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_chat_model(tmp_path_factory.mktemp("serve") / "tiny.gguf")


@pytest.fixture(scope="module")
def server(model_path):
    state = make_state(model_path)
    with ServerThread(create_app(state)) as srv:
        srv.state = state
        yield srv
