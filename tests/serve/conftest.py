"""One tiny-model server for the module's tests (the real engine, 4 slots, 127.0.0.1 at a free port)."""

import pytest

from pyggml.models import load_model
from pyggml.models.engine import Engine
from pyggml.serve.app import create_app
from pyggml.serve.state import Limits, Loaded, ServerState
from tests.support.serve import ServerThread, write_chat_model


def make_state(path, limits: Limits = Limits(), n_ctx: int = 256, whisper=None) -> ServerState:
    def load():
        model = load_model(path, n_ctx=n_ctx)
        loaded = Loaded(model=model, engine=Engine(model, n_slots=limits.parallel), model_id="tiny")
        if whisper is not None:
            loaded.whisper, loaded.whisper_default = {"tiny.en": whisper}, "tiny.en"
        return loaded
    return ServerState(load, limits)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_chat_model(tmp_path_factory.mktemp("serve") / "tiny.gguf")


@pytest.fixture(scope="module")
def server(model_path):
    state = make_state(model_path)
    with ServerThread(create_app(state)) as srv:
        srv.state = state
        yield srv
