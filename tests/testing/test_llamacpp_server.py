"""llama-cpp-python's server as the serving benchmark starts it answers a completion (with --no-extra-bufts: the
llama-cpp-python a test finds may be a native build with AMX, whose kernels crash where the tile state is not
granted)."""

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.serve import write_chat_model


@pytest.mark.peer
def test_the_peer_server_serves(tmp_path):
    pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] is not installed")
    model = write_chat_model(tmp_path / "tiny.gguf")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "pyggml.testing.llamacpp_server", "--model", str(model),
                             "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "256", "--n_threads", "1",
                             "--n_batch", "64", "--model_alias", "tiny", "--no-extra-bufts"],
                            env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            assert proc.poll() is None, "the server exited"
            try:
                httpx.get(url + "/v1/models", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.25)
        r = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4, "temperature": 0},
                       timeout=60).json()
        assert r["usage"]["completion_tokens"] >= 1 and r["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        proc.terminate()
        proc.wait(30)
