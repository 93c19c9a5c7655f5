"""OpenAI conformance defects found by a client suite written for llama-server, each kept fixed: an explicit null
is a field left out; errors name the field's path in the message and in `param`; `error.code` is a string or
null; an unknown model is 404 model_not_found when the server is strict (any name otherwise, as llama-server);
streamed legacy log-probabilities carry the offsets of the whole response; media parts are refused; a 429 costs
no template rendering or tokenizing."""

import json

import httpx
import pytest

from pyggml.serve.app import create_app
from pyggml.serve.state import Limits
from tests.support.serve import ServerThread, make_state

CHAT = [{"role": "user", "content": "Name a colour."}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
OPTIONAL = ["model", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "max_tokens",
            "max_completion_tokens", "n", "presence_penalty", "response_format", "seed", "stop", "stream",
            "stream_options", "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls", "user",
            "grammar", "json_schema", "chat_template_kwargs", "top_k", "min_p", "typical_p", "repeat_penalty",
            "repeat_last_n", "ignore_eos", "n_predict", "id_slot", "cache_prompt", "timings_per_token"]


def _post(server, path, body):
    return httpx.post(server.base_url + path, json=body, timeout=60)


def test_explicit_null_is_absent_for_every_optional_field(server):
    body = {"messages": CHAT, **{name: None for name in OPTIONAL}}
    r = _post(server, "/v1/chat/completions", {**body, "max_tokens": 3})
    assert r.status_code == 200, r.text
    r = _post(server, "/v1/chat/completions", {"messages": CHAT, "tools": TOOLS, "tool_choice": None, "max_tokens": 3})
    assert r.status_code == 200, r.text
    legacy = {"prompt": "the sea", **{name: None for name in OPTIONAL if "tool" not in name}, "echo": None,
              "suffix": None, "max_tokens": 3}
    assert _post(server, "/v1/completions", legacy).status_code == 200


@pytest.mark.parametrize("body, param", [
    ({"messages": [5]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [7]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages[0].content[0].type"),
    ({"messages": CHAT, "tools": [{"type": "function", "function": 3}]}, "tools[0].function"),
    ({"messages": CHAT, "tools": TOOLS, "tool_choice": {"function": "f"}}, "tool_choice.function"),
    ({"messages": CHAT, "stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
])
def test_nested_wrong_types_name_the_path(server, body, param):
    r = _post(server, "/v1/chat/completions", body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == param and f"'{param}'" in error["message"], error
    assert "request body" not in error["message"] and error["code"] is None


def test_any_model_name_is_the_loaded_model_by_default(server):
    r = _post(server, "/v1/chat/completions", {"messages": CHAT, "model": "gpt-4o", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "tiny"


@pytest.fixture(scope="module")
def strict(model_path):
    state = make_state(model_path, Limits(parallel=1, max_queue=0, model_any=False))
    with ServerThread(create_app(state)) as srv:
        srv.state = state
        yield srv


def test_unknown_model_is_404_model_not_found_when_strict(strict):
    for path, body in (("/v1/chat/completions", {"messages": CHAT}), ("/v1/completions", {"prompt": "x"}),
                       ("/v1/embeddings", {"input": "x"})):
        r = _post(strict, path, {**body, "model": "gpt-4o"})
        assert r.status_code == 404
        assert r.json()["error"] == {"message": r.json()["error"]["message"], "type": "invalid_request_error",
                                     "param": "model", "code": "model_not_found"}
    assert _post(strict, "/v1/completions", {"prompt": "x", "model": "tiny", "max_tokens": 1}).status_code == 200


def test_error_code_is_never_the_http_status(strict):
    answers = [_post(strict, "/v1/completions", {"prompt": 3}),                      # 400
               httpx.post(strict.base_url + "/v1/completions", content=b"{", timeout=30),  # bad JSON
               httpx.get(strict.base_url + "/nowhere", timeout=30),                    # 404 route
               httpx.put(strict.base_url + "/v1/completions", timeout=30)]            # 405
    for r in answers:
        assert r.status_code >= 400 and not isinstance(r.json()["error"]["code"], int), r.text


def test_streamed_text_offset_goes_on_as_in_the_whole_response(server):
    body = {"prompt": "the sea and", "max_tokens": 6, "temperature": 0, "logprobs": 2, "ignore_eos": True}
    whole = _post(server, "/v1/completions", body).json()["choices"][0]["logprobs"]
    offsets, tokens = [], []
    with httpx.stream("POST", server.base_url + "/v1/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                lp = json.loads(line[6:])["choices"][0]["logprobs"]
                if lp:
                    offsets += lp["text_offset"]
                    tokens += lp["tokens"]
    assert tokens == whole["tokens"] and offsets == whole["text_offset"]
    assert offsets == [sum(map(len, whole["tokens"][:i])) for i in range(len(tokens))] and len(set(offsets)) > 1


@pytest.mark.parametrize("part", [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                  {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}])
def test_media_parts_are_refused(server, part):
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]
    r = _post(server, "/v1/chat/completions", {"messages": messages})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "messages[0].content[1]" and "no vision" in error["message"]


def test_a_refused_request_renders_and_tokenizes_nothing(strict):
    """With every sequence taken, a flood of requests gets 429 before the template or the tokenizer runs (a retry
    storm once cost a running stream 94 % of its speed: benchmarks/serve_retry_storm.py measures it)."""
    model = strict.state.loaded.model
    calls = []
    tokenize, chat_prompt = model.tokenize, model.chat_prompt
    model.tokenize = lambda *a, **k: calls.append("tokenize") or tokenize(*a, **k)
    model.chat_prompt = lambda *a, **k: calls.append("chat_prompt") or chat_prompt(*a, **k)
    strict.state.in_flight += 1  # the one slot taken, as by a running request
    try:
        refused = [_post(strict, "/v1/chat/completions", {"messages": CHAT}) for _ in range(10)]
        refused += [_post(strict, "/v1/completions", {"prompt": "x " * 2000}) for _ in range(10)]
        refused += [_post(strict, "/completion", {"prompt": "x", "n_predict": 4}) for _ in range(5)]
        assert all(r.status_code == 429 and r.headers["Retry-After"] for r in refused)
        assert calls == []
    finally:
        strict.state.in_flight -= 1
        model.tokenize, model.chat_prompt = tokenize, chat_prompt
    assert _post(strict, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}).status_code == 200
