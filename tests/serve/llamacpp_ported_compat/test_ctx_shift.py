# Ported from llama.cpp, tools/server/tests/unit/test_ctx_shift.py (the version vendored in
# llama-cpp-python 0.3.36), to run against `pyggml serve` through ./utils.py.
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
#
# Changes for pyggml: the model is SmolLM2-135M-Instruct, whose tokens differ from tinyllama's, so the counts
# are derived from the prompt's token count instead of llama.cpp's 226 and 8: n_ctx 256 over 2 slots (a share of
# 128; llama.cpp: 512 and 256) so that SHORT_TEXT plus 96 tokens passes the share; requests go to
# /v1/completions (llama.cpp's /completion with its `timings` and `truncated` is not in this port; usage and
# finish_reason say the same here) with ignore_eos, since an instruct model may end early where tinyllama did
# not; a prompt longer than the whole context is the refused one (pyggml's unified cache lets a prompt use more
# than its share), with n_ctx 64.

import pytest

from tests.serve.llamacpp_ported_compat.utils import ServerPreset

server = ServerPreset.tinyllama2()


LINES = [
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore "
    "magna aliqua.",
    "Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat.",
    "Duis aute irure dolor in reprehenderit in voluptate velit esse cillum dolore eu fugiat nulla pariatur.",
    "Excepteur sint occaecat cupidatat non proident, sunt in culpa qui officia deserunt mollit anim id est laborum.",
]
SHORT_TEXT = "\n".join(LINES[:3])
LONG_TEXT = "\n".join(LINES)

@pytest.fixture(autouse=True)
def create_server():
    global server
    server = ServerPreset.tinyllama2()
    server.n_ctx = 256
    server.n_slots = 2
    server.n_predict = 128


def n_prompt(text: str) -> int:
    res = server.make_request("POST", "/tokenize", data={"content": text, "add_special": True})
    return len(res.body["tokens"])


def test_ctx_shift_enabled():
    # the slot context is 256/2 = 128 tokens; the prompt and 96 more do not fit it
    # 96 tokens are generated thanks to shifting the context when it gets full
    global server
    server.enable_ctx_shift = True
    server.start()
    assert n_prompt(SHORT_TEXT) + 96 > 128
    res = server.make_request("POST", "/v1/completions", data={
        "n_predict": 96,
        "prompt": SHORT_TEXT,
        "ignore_eos": True,
    })
    assert res.status_code == 200
    assert res.body["usage"]["prompt_tokens"] == n_prompt(SHORT_TEXT)
    assert res.body["usage"]["completion_tokens"] == 96


@pytest.mark.parametrize("n_predict,n_token_output", [
    (64, 64),
    (-1, None),  # llama.cpp: 8 tokens prompt + 248 tokens generated = 256 tokens total; here the share, 128
])
def test_ctx_shift_disabled_short_prompt(n_predict: int, n_token_output: int):
    global server
    server.n_predict = -1
    server.start()
    res = server.make_request("POST", "/v1/completions", data={
        "n_predict": n_predict,
        "prompt": "Hi how are you",
        "ignore_eos": True,
    })
    assert res.status_code == 200
    expected = n_token_output if n_token_output is not None else 128 - n_prompt("Hi how are you")
    assert res.body["usage"]["completion_tokens"] == expected
    assert res.body["choices"][0]["finish_reason"] == "length"


def test_ctx_shift_disabled_long_prompt():
    global server
    server.n_ctx = 64
    server.start()
    res = server.make_request("POST", "/v1/completions", data={
        "n_predict": 64,
        "prompt": LONG_TEXT,
    })
    assert res.status_code != 200
    assert "error" in res.body
    assert "the context holds 64" in res.body["error"]["message"]  # llama.cpp: "exceeds the available context size"


def test_ctx_shift_disabled_stream():
    global server
    server.start()
    res = server.make_stream_request("POST", "/v1/completions", data={
        "n_predict": 64,  # llama.cpp: 256, past the context, which pyggml refuses without a context shift
        "prompt": "Once",
        "stream": True,
        "ignore_eos": True,
    })
    content = ""
    for data in res:
        choice = data["choices"][0]
        if choice["finish_reason"] == "length":
            assert len(content) > 0
        else:
            assert choice["finish_reason"] is None
            content += choice["text"]
