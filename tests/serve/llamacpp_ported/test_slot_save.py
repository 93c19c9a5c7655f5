# Ported from llama.cpp (https://github.com/ggml-org/llama.cpp): tools/server/tests/unit/test_slot_save.py,
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
"""Adapted: the preset's server keeps one slot save directory for the session (the originals start a server per
test on a fresh directory); token counts come from the responses (another tokenizer); stories260K's words are
left out. The slot file is pyggml's own (an .npz of the cells' keys and values and the tokens), so
test_slot_restore_legacy_token_list (llama.cpp's state file layout) and the multimodal tests are not ported."""

import pytest

from tests.serve.llamacpp_ported.utils import ServerPreset

server = ServerPreset.tinyllama2()


@pytest.fixture(autouse=True)
def create_server():
    global server
    server = ServerPreset.tinyllama2()
    server.temperature = 0.0


def test_slot_save_restore():
    global server
    server.start()

    # First prompt in slot 1 should be fully processed
    res = server.make_request("POST", "/completion", data={
        "prompt": "What is the capital of France?",
        "id_slot": 1,
        "cache_prompt": True,
        "n_predict": 8,
        "temperature": 0.0,
    })
    assert res.status_code == 200
    n_prompt = res.body["tokens_evaluated"]

    # Save state of slot 1
    res = server.make_request("POST", "/slots/1?action=save", data={
        "filename": "slot1.bin",
    })
    assert res.status_code == 200
    n_saved = res.body["n_saved"]
    assert n_saved >= n_prompt

    # Since we have cache, this should only process the last tokens
    res = server.make_request("POST", "/completion", data={
        "prompt": "What is the capital of Germany?",
        "id_slot": 1,
        "cache_prompt": True,
        "n_predict": 8,
        "temperature": 0.0,
    })
    assert res.status_code == 200
    n_changed = res.body["timings"]["prompt_n"]
    assert 0 < n_changed < n_prompt  # only different part is processed
    germany = res.body["content"]

    # Loading the saved cache into slot 0
    res = server.make_request("POST", "/slots/0?action=restore", data={
        "filename": "slot1.bin",
    })
    assert res.status_code == 200
    assert res.body["n_restored"] == n_saved

    # For verification that slot 1 was not corrupted during slot 0 load, same thing should work
    res = server.make_request("POST", "/completion", data={
        "prompt": "What is the capital of Germany?",
        "id_slot": 1,
        "cache_prompt": True,
        "n_predict": 8,
        "temperature": 0.0,
    })
    assert res.status_code == 200
    assert res.body["content"] == germany
    assert res.body["timings"]["prompt_n"] == 1

    # adapted: a request reuses the longest cached prefix of any slot, so slot 1 is erased before slot 0 is
    # checked to serve from the restored file alone
    assert server.make_request("POST", "/slots/1?action=erase").status_code == 200

    # Since we have cache, slot 0 should only process the last tokens
    res = server.make_request("POST", "/completion", data={
        "prompt": "What is the capital of Germany?",
        "id_slot": 0,
        "cache_prompt": True,
        "n_predict": 8,
        "temperature": 0.0,
    })
    assert res.status_code == 200
    assert res.body["content"] == germany
    assert res.body["timings"]["prompt_n"] == n_changed  # only different part is processed


def test_slot_erase():
    # adapted: a prompt no other test starts with (a request reuses the cached prefix of any slot)
    global server
    server.start()

    res = server.make_request("POST", "/completion", data={
        "prompt": "Name the capital city of Italy.",
        "id_slot": 1,
        "cache_prompt": True,
        "n_predict": 8,
    })
    assert res.status_code == 200
    n_prompt = res.body["tokens_evaluated"]

    # erase slot 1
    res = server.make_request("POST", "/slots/1?action=erase")
    assert res.status_code == 200

    # re-run the same prompt, it should process all tokens again
    res = server.make_request("POST", "/completion", data={
        "prompt": "Name the capital city of Italy.",
        "id_slot": 1,
        "cache_prompt": True,
        "n_predict": 8,
    })
    assert res.status_code == 200
    assert res.body["timings"]["prompt_n"] == n_prompt  # all tokens are processed
