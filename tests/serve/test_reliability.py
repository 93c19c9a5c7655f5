"""What a server must survive: loading (503), a failed load, keys, CORS, a full queue (429 + Retry-After),
clients that go away mid-stream or mid-request (their sequences cancelled, their cells freed), and requests
past their time limit; every accepted request is accounted for."""

import threading
import time
from contextlib import contextmanager

import httpx
import pytest

from pyggml.serve.app import create_app
from pyggml.serve.state import Limits, ServerState
from tests.support.serve import ServerThread, make_state

SHORT = {"messages": [{"role": "user", "content": "Tell a story."}], "max_tokens": 8}


@contextmanager
def stalled(state):
    """The engine thread held in a call until the block ends: admitted requests stay in flight meanwhile."""
    gate = threading.Event()
    state.loaded.engine.call(lambda model: gate.wait(60))
    try:
        yield
    finally:
        gate.set()


def _wait(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def _settle(state):
    """Wait until nothing is in flight and the engine has no busy slot."""
    _wait(lambda: state.in_flight == 0 and state.loaded.engine.stats().slots_busy == 0)


def _accounted(state):
    ends = sum(n for k, n in state.outcomes.items() if k not in ("accepted", "rejected"))
    return state.outcomes["accepted"] == ends


def test_health_is_503_while_loading_then_200(model_path):
    gate = threading.Event()
    inner = make_state(model_path)

    def slow_load():
        gate.wait(30)
        return inner._load()
    state = ServerState(slow_load)
    with ServerThread(create_app(state), wait_ready=False) as srv:
        r = httpx.get(srv.base_url + "/health")
        assert r.status_code == 503 and r.json()["error"]["type"] == "unavailable_error"
        chat = httpx.post(srv.base_url + "/v1/chat/completions", json=SHORT)
        assert chat.status_code == 503
        gate.set()
        assert state.wait_loaded(60)
        assert httpx.get(srv.base_url + "/health").json() == {"status": "ok"}


def test_a_failed_load_is_reported_not_fatal():
    def broken():
        raise FileNotFoundError("no such model: x.gguf")
    state = ServerState(broken)
    with ServerThread(create_app(state), wait_ready=False) as srv:
        state.wait_loaded(10)
        r = httpx.get(srv.base_url + "/health")
        assert r.status_code == 500 and "x.gguf" in r.json()["error"]["message"]
        assert httpx.post(srv.base_url + "/v1/completions", json={"prompt": "x"}).status_code == 500


def test_api_key_and_cors(model_path):
    app = create_app(make_state(model_path), api_key="sesame", cors_origins=["http://app.example"])
    with ServerThread(app) as srv:
        assert httpx.get(srv.base_url + "/health").status_code == 200  # public
        r = httpx.get(srv.base_url + "/v1/models")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert httpx.get(srv.base_url + "/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        ok = httpx.get(srv.base_url + "/v1/models", headers={"Authorization": "Bearer sesame",
                                                             "Origin": "http://app.example"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://app.example"
        pre = httpx.options(srv.base_url + "/v1/chat/completions", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST"})
        assert pre.status_code == 200


def test_full_queue_is_429_with_retry_after(model_path):
    state = make_state(model_path, Limits(parallel=1, max_queue=1))
    with (ServerThread(create_app(state)) as srv, stalled(state),
          httpx.stream("POST", srv.base_url + "/v1/chat/completions", json={**SHORT, "stream": True}) as first):
        lines = first.iter_lines()  # kept: a dropped iterator closes the connection
        next(lines)  # admitted: the engine holds it
        r = httpx.post(srv.base_url + "/v1/chat/completions", json={**SHORT, "n": 2})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        too_big = httpx.post(srv.base_url + "/v1/chat/completions", json={**SHORT, "n": 3})
        assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "n"
    _settle(state)
    assert state.outcomes["rejected"] == 1 and _accounted(state)


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_cancels_the_sequence(model_path, stream):
    state = make_state(model_path)
    with ServerThread(create_app(state)) as srv:
        with stalled(state):
            if stream:
                with httpx.stream("POST", srv.base_url + "/v1/chat/completions", json={**SHORT, "stream": True}) as r:
                    next(r.iter_lines())
            else:
                with pytest.raises(httpx.ReadTimeout):
                    httpx.post(srv.base_url + "/v1/chat/completions", json=SHORT, timeout=0.5)
            _wait(lambda: state.outcomes["cancelled"] == 1)
        _settle(state)
        assert _accounted(state) and state.outcomes["completed"] == 0
        stats = state.loaded.engine.stats()
        assert stats.slots_busy == 0 and stats.kv_cells_used == 0  # a cancelled sequence keeps no cell


def test_requests_past_their_time_limit(model_path):
    state = make_state(model_path, Limits(timeout_s=0.3))
    with ServerThread(create_app(state)) as srv, stalled(state):
        r = httpx.post(srv.base_url + "/v1/chat/completions", json=SHORT)
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
        with httpx.stream("POST", srv.base_url + "/v1/chat/completions", json={**SHORT, "stream": True}) as s:
            lines = [line for line in s.iter_lines() if line]
        assert '"timeout_error"' in lines[-2] and lines[-1] == "data: [DONE]"
    _settle(state)
    assert state.outcomes["timeout"] == 2 and _accounted(state)
