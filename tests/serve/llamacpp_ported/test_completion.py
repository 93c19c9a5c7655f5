# Ported from llama.cpp (https://github.com/ggml-org/llama.cpp): tools/server/tests/unit/test_completion.py,
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
"""Adapted: the expected words of stories260K are left out; prompt token counts come from /tokenize (another
tokenizer), and a server shared by the tests has the prompts cached, so `prompt_n + cache_n` is what the
originals' `prompt_n` counts. The seed and batch-size tests run on the preset's server only (2 slots, batch 32).
Not ported: test_nocache_long_input_prompt (the cache is unified here: a prompt may take the whole context,
not only a slot's share), test_completion_unified (llama-server's --kv-unified over-commit: here a request
waits for its cells instead), response_fields, post-sampling probabilities, the backend-sampling tests, and
test_completion_stream_with_openai_library_stops (a chat model's words)."""

import contextlib
import re
import time

import pytest
import requests
from openai import OpenAI

from tests.serve.llamacpp_ported.utils import ServerPreset, parallel_function_calls

server = ServerPreset.tinyllama2()

JSON_MULTIMODAL_KEY = "multimodal_data"
JSON_PROMPT_STRING_KEY = "prompt_string"
PNG_1X1 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNk+A8AAQUBAScY42YAAAAASUVORK5CYII="


@pytest.fixture(autouse=True)
def create_server():
    global server
    server = ServerPreset.tinyllama2()


def n_tokens(prompt: str) -> int:
    return len(server.make_request("POST", "/tokenize", data={"content": prompt, "add_special": True}).body["tokens"])


@pytest.mark.parametrize("prompt,n_predict,truncated,return_tokens", [
    ("I believe the meaning of life is", 8, False, False),
    ("Write a joke about AI from a very long prompt which will not be truncated", 16, False, True),
])
def test_completion(prompt: str, n_predict: int, truncated: bool, return_tokens: bool):
    global server
    server.start()
    res = server.make_request("POST", "/completion", data={
        "n_predict": n_predict,
        "prompt": prompt,
        "return_tokens": return_tokens,
        "ignore_eos": True,  # adapted: a chat model may end early; the count is the point here
    })
    assert res.status_code == 200
    assert res.body["timings"]["prompt_n"] + res.body["timings"]["cache_n"] == n_tokens(prompt)
    assert res.body["timings"]["predicted_n"] == n_predict
    assert res.body["truncated"] == truncated
    assert type(res.body["has_new_line"]) == bool
    if return_tokens:
        assert len(res.body["tokens"]) > 0
        assert all(type(tok) == int for tok in res.body["tokens"])
    else:
        assert res.body["tokens"] == []


@pytest.mark.parametrize("prompt,n_predict,truncated", [
    ("I believe the meaning of life is", 8, False),
    ("Write a joke about AI from a very long prompt which will not be truncated", 16, False),
])
def test_completion_stream(prompt: str, n_predict: int, truncated: bool):
    global server
    server.start()
    res = server.make_stream_request("POST", "/completion", data={
        "n_predict": n_predict,
        "prompt": prompt,
        "stream": True,
        "ignore_eos": True,
        "return_tokens": True,  # adapted: llama-server sends the tokens of a streamed result without being asked
    })
    content = ""
    for data in res:
        assert "stop" in data and type(data["stop"]) == bool
        if data["stop"]:
            assert data["timings"]["prompt_n"] + data["timings"]["cache_n"] == n_tokens(prompt)
            assert data["timings"]["predicted_n"] == n_predict
            assert data["truncated"] == truncated
            assert data["stop_type"] == "limit"
            assert type(data["has_new_line"]) == bool
            assert "generation_settings" in data
            assert server.n_predict is not None
            assert data["generation_settings"]["n_predict"] == min(n_predict, server.n_predict)
            assert content
        else:
            assert len(data["tokens"]) > 0
            assert all(type(tok) == int for tok in data["tokens"])
            content += data["content"]


def test_completion_stream_vs_non_stream():
    global server
    server.start()
    res_stream = server.make_stream_request("POST", "/completion", data={
        "n_predict": 8,
        "prompt": "I believe the meaning of life is",
        "stream": True,
        "temperature": 0.0,  # adapted: no server-level --temp / --seed here
    })
    res_non_stream = server.make_request("POST", "/completion", data={
        "n_predict": 8,
        "prompt": "I believe the meaning of life is",
        "temperature": 0.0,
    })
    content_stream = ""
    for data in res_stream:
        content_stream += data["content"]
    assert content_stream == res_non_stream.body["content"]


def test_completion_with_openai_library():
    global server
    server.start()
    client = OpenAI(api_key="dummy", base_url=f"http://{server.server_host}:{server.server_port}/v1")
    res = client.completions.create(
        model="davinci-002",
        prompt="I believe the meaning of life is",
        max_tokens=8,
        extra_body={"ignore_eos": True},
    )
    # adapted: llama-server's fingerprint is its build ("b1234-..."), pyggml's its version
    assert res.system_fingerprint is not None and res.system_fingerprint.startswith("pyggml-")
    assert res.choices[0].finish_reason == "length"
    assert res.choices[0].text is not None


def test_completion_stream_with_openai_library():
    global server
    server.start()
    client = OpenAI(api_key="dummy", base_url=f"http://{server.server_host}:{server.server_port}/v1")
    res = client.completions.create(
        model="davinci-002",
        prompt="I believe the meaning of life is",
        max_tokens=8,
        stream=True,
    )
    output_text = ''
    for data in res:
        choice = data.choices[0]
        if choice.finish_reason is None:
            assert choice.text is not None
            output_text += choice.text
    assert output_text


def test_consistent_result_same_seed():
    global server
    server.start()
    last_res = None
    for _ in range(4):
        res = server.make_request("POST", "/completion", data={
            "prompt": "I believe the meaning of life is",
            "seed": 42,
            "temperature": 0.0,
            "n_predict": 8,
            "cache_prompt": False,
        })
        if last_res is not None:
            assert res.body["content"] == last_res.body["content"]
        last_res = res


def test_different_result_different_seed():
    global server
    server.start()
    last_res = None
    for seed in range(4):
        res = server.make_request("POST", "/completion", data={
            "prompt": "I believe the meaning of life is",
            "seed": seed,
            "temperature": 1.0,
            "n_predict": 8,
            "ignore_eos": True,
            "cache_prompt": False,
        })
        if last_res is not None:
            assert res.body["content"] != last_res.body["content"]
        last_res = res


def test_json_prompt_no_mtmd():
    global server
    server.start()
    res = server.make_request("POST", "/completion", data={
        "prompt": {JSON_PROMPT_STRING_KEY: "I believe the meaning of life is"},
        "seed": 42,
        "temperature": 1.0,
        "n_predict": 4,
        "cache_prompt": False,
    })
    assert res.status_code == 200


def test_json_prompt_mtm_error_when_not_supported():
    global server
    server.start()
    res = server.make_request("POST", "/completion", data={
        "prompt": {JSON_PROMPT_STRING_KEY: "I believe the meaning of life is <__media__>",
                   JSON_MULTIMODAL_KEY: PNG_1X1},
        "seed": 42,
        "temperature": 1.0,
        "cache_prompt": False,
    })
    # MTMD is disabled on this model, so this should fail.
    assert res.status_code != 200


def test_completion_with_tokens_input():
    global server
    server.temperature = 0.0
    server.start()
    prompt_str = "I believe the meaning of life is"
    res = server.make_request("POST", "/tokenize", data={
        "content": prompt_str,
        "add_special": True,
    })
    assert res.status_code == 200
    tokens = res.body["tokens"]

    # single completion
    res = server.make_request("POST", "/completion", data={
        "prompt": tokens,
        "n_predict": 8,
    })
    assert res.status_code == 200
    assert type(res.body["content"]) == str

    # batch completion (adapted: temperature 0 per request, there is no server-level --temp)
    res = server.make_request("POST", "/completion", data={
        "prompt": [tokens, tokens],
        "n_predict": 8,
        "temperature": 0.0,
    })
    assert res.status_code == 200
    assert type(res.body) == list
    assert len(res.body) == 2
    assert res.body[0]["content"] == res.body[1]["content"]

    # mixed string and tokens
    res = server.make_request("POST", "/completion", data={
        "prompt": [tokens, prompt_str],
        "n_predict": 8,
        "temperature": 0.0,
    })
    assert res.status_code == 200
    assert type(res.body) == list
    assert len(res.body) == 2
    assert res.body[0]["content"] == res.body[1]["content"]

    # mixed JSON and tokens
    res = server.make_request("POST", "/completion", data={
        "prompt": [
            tokens,
            {
                JSON_PROMPT_STRING_KEY: "I believe the meaning of life is",
            },
        ],
        "n_predict": 8,
        "temperature": 0.0,
    })
    assert res.status_code == 200
    assert type(res.body) == list
    assert len(res.body) == 2
    assert res.body[0]["content"] == res.body[1]["content"]

    # mixed string and tokens in one sequence
    res = server.make_request("POST", "/completion", data={
        "prompt": [1, 2, 3, 4, 5, 6, prompt_str, 7, 8, 9, 10, prompt_str],
        "n_predict": 8,
    })
    assert res.status_code == 200
    assert type(res.body["content"]) == str


@pytest.mark.parametrize("n_requests", [2, 4])
def test_completion_parallel_slots(n_requests: int):
    global server
    server.temperature = 0.0
    server.start()
    n_slots = server.n_slots

    PROMPTS = [
        "Write a very long book.",
        "Write another a poem.",
        "What is LLM?",
        "The sky is blue and I love it.",
    ]

    def check_slots_status():
        # adapted: the slots are watched while the requests run (the most busy at once), where the original looked
        # once after a fixed 0.1 s, which a busy host's scheduling (or a quick answer) could miss
        should_all_slots_busy = n_requests >= n_slots
        most, deadline = 0, time.monotonic() + 30
        while time.monotonic() < deadline and most < n_slots:
            res = server.make_request("GET", "/slots")
            n_busy = sum([1 for slot in res.body if slot["is_processing"]])
            if most and not n_busy:
                break  # the requests are done
            most = max(most, n_busy)
            time.sleep(0.01)
        if should_all_slots_busy:
            assert most == n_slots
        else:
            assert most <= n_slots

    tasks = []
    for i in range(n_requests):
        tasks.append((server.make_request, ("POST", "/completion", {
            "prompt": PROMPTS[i % len(PROMPTS)],
            "seed": 42,
            "temperature": 1.0,
            "n_predict": 8,
            "ignore_eos": True,
        })))
    tasks.append((check_slots_status, ()))
    results = parallel_function_calls(tasks)

    # check results
    for i in range(n_requests):
        res = results[i]
        assert res.status_code == 200
        assert type(res.body["content"]) == str
        assert len(res.body["content"]) > 10


def test_n_probs():
    global server
    server.start()
    res = server.make_request("POST", "/completion", data={
        "prompt": "I believe the meaning of life is",
        "n_probs": 10,
        "temperature": 0.0,
        "n_predict": 5,
        "ignore_eos": True,
    })
    assert res.status_code == 200
    assert "completion_probabilities" in res.body
    assert len(res.body["completion_probabilities"]) == 5
    for tok in res.body["completion_probabilities"]:
        assert "id" in tok and tok["id"] > 0
        assert "token" in tok and type(tok["token"]) == str
        assert "logprob" in tok and tok["logprob"] <= 0.0
        assert "bytes" in tok and type(tok["bytes"]) == list
        assert len(tok["top_logprobs"]) == 10
        for prob in tok["top_logprobs"]:
            assert "id" in prob and prob["id"] > 0
            assert "token" in prob and type(prob["token"]) == str
            assert "logprob" in prob and prob["logprob"] <= 0.0
            assert "bytes" in prob and type(prob["bytes"]) == list


def test_n_probs_stream():
    global server
    server.start()
    res = server.make_stream_request("POST", "/completion", data={
        "prompt": "I believe the meaning of life is",
        "n_probs": 10,
        "temperature": 0.0,
        "n_predict": 5,
        "ignore_eos": True,
        "stream": True,
    })
    for data in res:
        if data["stop"] is False:
            assert "completion_probabilities" in data
            assert len(data["completion_probabilities"]) == 1
            for tok in data["completion_probabilities"]:
                assert "id" in tok and tok["id"] > 0
                assert "token" in tok and type(tok["token"]) == str
                assert "logprob" in tok and tok["logprob"] <= 0.0
                assert "bytes" in tok and type(tok["bytes"]) == list
                assert len(tok["top_logprobs"]) == 10
                for prob in tok["top_logprobs"]:
                    assert "id" in prob and prob["id"] > 0
                    assert "token" in prob and type(prob["token"]) == str
                    assert "logprob" in prob and prob["logprob"] <= 0.0
                    assert "bytes" in prob and type(prob["bytes"]) == list


@pytest.mark.parametrize("tokenize,openai_style", [(False, False), (False, True), (True, False), (True, True)])
def test_logit_bias(tokenize, openai_style):
    global server
    server.start()

    exclude = ["i", "I", "the", "The", "to", "a", "an", "be", "is", "was", "but", "But", "and", "And", "so", "So",
               "you", "You", "he", "He", "she", "She", "we", "We", "they", "They", "it", "It", "his", "His", "her",
               "Her", "book", "Book"]

    logit_bias = []
    if tokenize:
        res = server.make_request("POST", "/tokenize", data={
            "content": " " + " ".join(exclude) + " ",
        })
        assert res.status_code == 200
        tokens = res.body["tokens"]
        logit_bias = [[tok, -100] for tok in tokens]

    else:
        logit_bias = [[" " + tok + " ", -100] for tok in exclude]

    if openai_style:
        logit_bias = {el[0]: -100 for el in logit_bias}

    res = server.make_request("POST", "/completion", data={
        "n_predict": 32,
        "prompt": "What is the best book",
        "logit_bias": logit_bias,
        "temperature": 0.0
    })
    assert res.status_code == 200
    output_text = res.body["content"]
    assert all(output_text.find(" " + tok + " ") == -1 for tok in exclude)


def test_cancel_request():
    # adapted: on the preset's server (2 slots, 512 cells) rather than a server of its own; the slot is awaited
    # (up to 30 s: a busy host once kept it past the original's fixed 2 s sleep) and the request must have ended
    # cancelled by the server's own count, so a request that ran to its end does not pass either
    global server
    server.n_predict = -1
    server.server_slots = True
    server.start()
    cancelled_before = _cancelled_count()
    # send a request that will take a long time, but cancel it before it finishes
    with contextlib.suppress(requests.exceptions.ReadTimeout):  # expected
        server.make_request("POST", "/completion", data={
            "prompt": "I believe the meaning of life is",
            "ignore_eos": True,
        }, timeout=0.1)
    # make sure the slot is free
    deadline = time.monotonic() + 30
    while any(slot["is_processing"] for slot in server.make_request("GET", "/slots").body):
        assert time.monotonic() < deadline, "the cancelled request still holds its slot after 30 s"
        time.sleep(0.05)
    assert _cancelled_count() == cancelled_before + 1


def _cancelled_count() -> int:
    text = requests.get(server.make_url("/metrics"), timeout=10).text
    found = re.search(r'^pyggml:requests_total\{outcome="cancelled"\} (\S+)$', text, flags=re.MULTILINE)
    return int(float(found.group(1))) if found else 0
