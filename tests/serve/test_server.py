"""The server driven by the real `openai` client (sync, async, streaming, n, logprobs, json_schema, tools,
grammar) and by raw HTTP for what a client library would not send; results checked against the model run
directly (greedy text, token counts) and against OpenAI's shapes."""

import asyncio
import base64
import json

import httpx
import numpy as np
import openai
import pytest

from pyggml.models import load_model
from pyggml.models.llm.generate import SamplingParams

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
TOOLS = [{"type": "function", "function": {
    "name": "set_light", "description": "Switch a light",
    "parameters": {"type": "object", "properties": {"room": {"enum": ["hall", "den"]}, "on": {"type": "boolean"}},
                   "required": ["room", "on"], "additionalProperties": False}}}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def direct(model_path):
    """The same file loaded on its own: what greedy generation gives without the server."""
    return load_model(model_path, n_ctx=256)


def _greedy(model, ids, n):
    out = []
    for t in model.generate_tokens(ids, n, SamplingParams(temperature=0.0)):
        if model.tokenizer.is_eog(t):
            break
        out.append(t)
    return model.detokenize(out), len(ids)


def test_chat_greedy_matches_the_model(client, direct):
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, temperature=0)
    ids = direct.tokenize(direct.chat_prompt(CHAT), add_special=True, parse_special=True)
    text, n_prompt = _greedy(direct, ids, 12)
    assert r.choices[0].message.content == text and r.choices[0].message.role == "assistant"
    assert r.object == "chat.completion" and r.model == "tiny" and r.id.startswith("chatcmpl-")
    assert r.usage.prompt_tokens == n_prompt and r.usage.total_tokens == n_prompt + r.usage.completion_tokens
    assert r.choices[0].finish_reason in ("stop", "length")


def test_stream_adds_up_to_the_whole_response_and_reports_cached_usage(client):
    kw = dict(model="tiny", messages=CHAT, max_tokens=10, temperature=0)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # the same prompt again: its prefix is reused


def test_async_clients_run_together(server):
    async def main():
        aclient = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        rs = await asyncio.gather(*[aclient.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"Count to {i}"}], max_tokens=6, seed=i,
            temperature=0.9) for i in range(6)])
        stream = await aclient.completions.create(model="tiny", prompt="the sea", max_tokens=4, stream=True)
        pieces = [c.choices[0].text async for c in stream]
        await aclient.close()
        return rs, pieces
    rs, pieces = asyncio.run(main())
    assert all(r.usage.completion_tokens >= 1 and r.choices[0].finish_reason in ("stop", "length") for r in rs)
    assert len(pieces) >= 1


def test_completions_echo_logprobs_stop_and_token_prompts(client, direct):
    r = client.completions.create(model="tiny", prompt="the cat", max_tokens=6, temperature=0, logprobs=3, echo=True)
    c = r.choices[0]
    assert c.text.startswith("the cat") and r.object == "text_completion"
    assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == len(c.logprobs.top_logprobs)
    assert all(len(top) <= 3 and max(top.values()) >= lp - 1e-6
               for top, lp in zip(c.logprobs.top_logprobs, c.logprobs.token_logprobs, strict=True))
    assert c.logprobs.text_offset[0] == len("the cat")
    ids = direct.tokenize("the cat", add_special=True)
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == c.text[len("the cat"):]
    first = by_ids.choices[0].text.strip()[:2]
    if first:
        stopped = client.completions.create(model="tiny", prompt="the cat", max_tokens=6, temperature=0, stop=[first])
        assert first not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"


def test_n_choices_and_chat_logprobs(client):
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=5, n=3, seed=7, temperature=1.0,
                                       logprobs=True, top_logprobs=2)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:
        assert len(c.logprobs.content) >= 1 and all(len(e.top_logprobs) == 2 for e in c.logprobs.content)
    # every generated token has its entry, but the end-of-generation token, which usage counts (as llama.cpp does)
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) + (c.finish_reason == "stop") for c in r.choices)


def test_json_schema_response_format(client):
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green"]}, "sure": {"type": "boolean"}},
              "required": ["colour", "sure"], "additionalProperties": False}
    for seed in range(3):
        r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=40, seed=seed, temperature=1.0,
                                           response_format={"type": "json_schema", "json_schema": {
                                               "name": "answer", "strict": True, "schema": schema}})
        value = json.loads(r.choices[0].message.content)
        assert value["colour"] in ("red", "green") and isinstance(value["sure"], bool)
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=60, response_format={
        "type": "json_object"}, extra_body={"grammar": None}, temperature=0)
    assert r.choices[0].message.content.startswith("{")


def test_gbnf_grammar_field(client):
    r = client.completions.create(model="tiny", prompt="Answer:", max_tokens=8, temperature=1.0, seed=3,
                                  extra_body={"grammar": 'root ::= ("yes" | "no") "."'})
    assert r.choices[0].text in ("yes.", "no.")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "set_light"}}])
def test_forced_tool_calls(client, choice):
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=60, tools=TOOLS, tool_choice=choice,
                                       parallel_tool_calls=False, temperature=0.8, seed=1)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    assert call.function.name == "set_light" and call.type == "function" and call.id.startswith("call_")
    assert args["room"] in ("hall", "den") and isinstance(args["on"], bool)


def test_streamed_tool_calls_arrive_as_deltas(client):
    chunks = list(client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=60, tools=TOOLS,
                                                 tool_choice="required", parallel_tool_calls=False, stream=True,
                                                 temperature=0))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].index == 0 and deltas[0].function.name == "set_light" and deltas[0].id.startswith("call_")
    assert len(deltas) > 2 and all(d.index == 0 and d.id is None for d in deltas[1:])  # arguments in pieces
    json.loads("".join(d.function.arguments for d in deltas))
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)  # the call's JSON is not content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


TOOL_OUTPUTS = [  # what a model trained on each format writes (forced here with a grammar)
    'On it.<tool_call>\n{"name": "set_light", "arguments": {"room": "den", "on": true}}\n</tool_call>',
    '<tool_call>{"name": "set_light", "arguments": {"room": "hall", "on": false}}</tool_call>'
    '<tool_call>{"name": "set_light", "arguments": {"room": "den", "on": true}}</tool_call>',
    '<|python_tag|>{"name": "set_light", "parameters": {"room": "den", "on": true}}',
    '{"name": "set_light", "parameters": {"on": false, "room": "hall"}}',
    '[TOOL_CALLS][{"name": "set_light", "arguments": {"room": "den", "on": true}}]',
    '[TOOL_CALLS]set_light[ARGS]{"room": "hall", "on": true}',
    '{"tool_calls": [{"name": "set_light", "arguments": {"room": "den", "on": false}}]}',
]


@pytest.mark.parametrize("output", TOOL_OUTPUTS)
def test_streamed_tool_calls_accumulate_to_the_whole_response(client, output):
    """The openai client's own accumulation of the streamed deltas gives the calls of the whole response."""
    kw = dict(model="tiny", messages=CHAT, max_tokens=200, tools=TOOLS, temperature=0,
              extra_body={"grammar": "root ::= " + json.dumps(output)})
    whole = client.chat.completions.create(**kw).choices[0]
    with client.chat.completions.stream(**kw) as stream:
        pieces = sum(len(e.choices[0].delta.tool_calls or []) for e in (c.chunk for c in stream if c.type == "chunk")
                     if e.choices)
        streamed = stream.get_final_completion().choices[0]
    assert whole.finish_reason == streamed.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in streamed.message.tool_calls] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls]
    assert pieces > 2 * len(whole.message.tool_calls)  # the arguments came in pieces, not whole
    assert (streamed.message.content or "") == (whole.message.content or "")


def test_tool_results_go_through_the_template(client):
    messages = CHAT[1:] + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "set_light", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]
    with pytest.raises(openai.BadRequestError) as e:  # Gemma's template knows no tool turns: its own exception
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, tools=TOOLS)
    assert e.value.body["message"].startswith("the chat template refused") and e.value.body["param"] == "messages"


def test_models_tokenize_detokenize_metrics(server, client, direct):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    ids = httpx.post(server.base_url + "/tokenize", json={"content": "hello world"}).json()["tokens"]
    assert ids == direct.tokenize("hello world", add_special=False, parse_special=True)
    pieces = httpx.post(server.base_url + "/tokenize", json={"content": "hello", "with_pieces": True}).json()
    assert "".join(p["piece"] for p in pieces["tokens"]) == "hello"
    assert httpx.post(server.base_url + "/detokenize", json={"tokens": ids}).json() == {"content": "hello world"}
    text = httpx.get(server.base_url + "/metrics").text
    for name in ("llamacpp:tokens_predicted_total", "llamacpp:predicted_tokens_seconds", "llamacpp:requests_processing",
                 "llamacpp:requests_deferred", "llamacpp:kv_cache_tokens", 'pyggml:requests_total{outcome="accepted"}'):
        assert name in text


def test_embeddings(client, direct):
    if not hasattr(direct, "embed"):
        pytest.skip("Model.embed (pooled embeddings) is not in this build")
    r = client.embeddings.create(model="tiny", input=["hello world", "the cat"])  # the texts below
    texts = ["hello world", "the cat"]
    expected = direct.embed([direct.tokenize(t, add_special=True, parse_special=True) for t in texts],
                            pooling="mean", normalize=2)
    assert [d.index for d in r.data] == [0, 1] and r.usage.prompt_tokens > 0
    for d, row in zip(r.data, expected, strict=True):
        assert d.embedding == pytest.approx(row.tolist(), abs=1e-5)
    b64 = client.embeddings.create(model="tiny", input="hello world", encoding_format="base64")
    raw = np.frombuffer(base64.b64decode(b64.data[0].embedding), dtype="<f4")
    assert raw.tolist() == pytest.approx(r.data[0].embedding, abs=1e-6)


@pytest.mark.parametrize("path, body, status, param", [
    ("/v1/chat/completions", b"{not json", 400, None),
    ("/v1/chat/completions", b"[1, 2]", 400, None),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("/v1/chat/completions", {"messages": CHAT, "temperature": "hot"}, 400, "temperature"),
    ("/v1/chat/completions", {"messages": CHAT, "temperature": 9}, 400, "temperature"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 10_000}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": CHAT, "n": 100}, 400, "n"),
    ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 3}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "logit_bias": {"99999": 1}}, 400, "logit_bias"),
    ("/v1/chat/completions", {"messages": CHAT, "logit_bias": {"5": 500}}, 400, "logit_bias"),
    ("/v1/chat/completions", {"messages": CHAT, "stop": [""]}, 400, "stop"),
    ("/v1/chat/completions", {"messages": CHAT, "seed": -1}, 400, "seed"),
    ("/v1/chat/completions", {"messages": CHAT, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "xml"}}, 400, "response_format.type"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_schema"}}, 400,
     "response_format.schema"),
    ("/v1/chat/completions", {"messages": CHAT, "grammar": "root ::= ("}, 400, "grammar"),
    ("/v1/chat/completions", {"messages": CHAT, "grammar": "root ::= \"a\"", "response_format": {
        "type": "json_object"}}, 400, "grammar"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 400}]}, 400, "messages"),
    ("/v1/completions", {"prompt": 3}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 99999]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "logprobs": 50}, 400, "logprobs"),
    ("/v1/completions", {}, 400, "prompt"),
    ("/v1/embeddings", {"input": []}, 400, "input"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "hex"}, 400, "encoding_format"),
    ("/tokenize", {"content": 5}, 400, "content"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
])
def test_bad_requests_get_openai_errors_naming_the_field(server, path, body, status, param):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server.base_url + path, **kw)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]
    assert httpx.get(server.base_url + "/health").json() == {"status": "ok"}


def test_unknown_paths_and_methods_are_json_errors(server):
    r = httpx.get(server.base_url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    assert httpx.get(server.base_url + "/v1/chat/completions").status_code == 405


def test_no_whisper_model_is_a_400(server):
    r = httpx.post(server.base_url + "/v1/audio/transcriptions", files={"file": ("a.wav", b"RIFF")},
                   data={"model": "whisper-1"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
