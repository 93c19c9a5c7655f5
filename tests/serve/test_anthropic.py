"""Anthropic's Messages API (pyggml/serve/anthropic.py) driven by the real `anthropic` client: text against the
chat endpoint's greedy answer to the same messages, streaming events in Anthropic's order adding up to the whole
answer, stop_sequences, max_tokens, tool_use / tool_result blocks, count_tokens, x-api-key, and errors in
Anthropic's shape."""

import json

import anthropic
import httpx
import pytest

from pyggml.serve.anthropic import to_chat
from pyggml.serve.app import create_app
from pyggml.serve.protocol import APIError
from tests.support.serve import ServerThread, make_state, write_chat_model

SYSTEM = "Be brief."
TURNS = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Red."},
         {"role": "user", "content": [{"type": "text", "text": "Another"}, {"type": "text", "text": " one?"}]}]
OPENAI_TURNS = [{"role": "system", "content": SYSTEM}, *TURNS[:2], {"role": "user", "content": "Another one?"}]
GREEDY = {"temperature": 0}   # the client takes sampling fields only as extra_body
TOOL = {"name": "set_light", "description": "Switch a light",
        "input_schema": {"type": "object", "properties": {"room": {"enum": ["hall", "den"]}, "on": {"type": "boolean"}},
                         "required": ["room", "on"], "additionalProperties": False}}

ONE_CALL = {"type": "any", "disable_parallel_tool_use": True}   # forced: one call, in the generic JSON form


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """The tiny model with a template that renders tools, tool calls and tool results (Hermes')."""
    return write_chat_model(tmp_path_factory.mktemp("anthropic") / "tiny.gguf", template="hermes_tools.jinja",
                            n_ctx=1024)


@pytest.fixture(scope="module")
def server(model_path):
    with ServerThread(create_app(make_state(model_path, n_ctx=1024))) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def chat_text(server, max_tokens: int) -> dict:
    r = httpx.post(server.base_url + "/v1/chat/completions", timeout=60,
                   json={"messages": OPENAI_TURNS, "max_tokens": max_tokens, "temperature": 0}).json()
    return r


def test_text_is_the_chat_answer_to_the_same_messages(server, client):
    r = client.messages.create(model="claude-any-name", max_tokens=10, system=SYSTEM, messages=TURNS,
                               extra_body=GREEDY)
    chat = chat_text(server, 10)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_") and r.model == "tiny"
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == chat["choices"][0]["message"]["content"]
    assert r.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[chat["choices"][0]["finish_reason"]]
    assert r.usage.output_tokens == chat["usage"]["completion_tokens"]
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == chat["usage"]["prompt_tokens"]
    count = client.messages.count_tokens(model="x", system=SYSTEM, messages=TURNS)
    assert count.input_tokens == chat["usage"]["prompt_tokens"]


def test_stream_events_are_anthropics_and_add_up_to_the_whole_answer(client):
    whole = client.messages.create(model="m", max_tokens=12, system=SYSTEM, messages=TURNS, extra_body=GREEDY)
    with client.messages.stream(model="m", max_tokens=12, system=SYSTEM, messages=TURNS, extra_body=GREEDY) as s:
        events = [e.type for e in s if e.type in ("message_start", "content_block_start", "content_block_delta",
                                                   "content_block_stop", "message_delta", "message_stop")]
        final = s.get_final_message()
    assert events[:2] == ["message_start", "content_block_start"] and events[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert set(events[2:-3]) == {"content_block_delta"}
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_raw_stream_carries_event_names_and_a_ping(server):
    body = {"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}], "stream": True, "temperature": 0}
    with httpx.stream("POST", server.base_url + "/v1/messages", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert names == [d["type"] for d in data] and names[:2] == ["message_start", "ping"]
    start = data[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    assert data[-2]["delta"]["stop_reason"] == "max_tokens" and data[-2]["usage"]["output_tokens"] == 4


def test_stop_sequence_ends_the_answer_and_is_named(client):
    free = client.messages.create(model="m", max_tokens=16, messages=TURNS, extra_body=GREEDY).content[0].text
    assert len(free.split()) > 1, f"the greedy answer {free!r} has no second word to stop at"
    stop = free.split()[1][:2]
    r = client.messages.create(model="m", max_tokens=16, messages=TURNS, stop_sequences=[stop, "\x00never"],
                               extra_body=GREEDY)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert r.content[0].text == free[:free.index(stop)]


def test_an_empty_answer_is_one_empty_text_block_streamed_or_not(client):
    free = client.messages.create(model="m", max_tokens=4, messages=TURNS, extra_body=GREEDY).content[0].text
    kw = dict(model="m", max_tokens=4, messages=TURNS, stop_sequences=[free[:2]], extra_body=GREEDY)
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as s:
        starts = [e.content_block.type for e in s if e.type == "content_block_start"]
        final = s.get_final_message()
    assert [(b.type, b.text) for b in whole.content] == [("text", "")] == [(b.type, b.text) for b in final.content]
    assert starts == ["text"] and whole.stop_reason == final.stop_reason == "stop_sequence"


def test_tool_use_then_tool_result(client):
    r = client.messages.create(model="m", max_tokens=60, tools=[TOOL], tool_choice=ONE_CALL,
                               messages=[{"role": "user", "content": "Light the den"}])
    assert r.stop_reason == "tool_use" and [b.type for b in r.content] == ["tool_use"]
    use = r.content[0]
    assert use.name == "set_light" and set(use.input) == {"room", "on"} and use.input["room"] in ("hall", "den")
    with client.messages.stream(model="m", max_tokens=60, tools=[TOOL], tool_choice=ONE_CALL,
                                messages=[{"role": "user", "content": "Light the den"}]) as s:
        pieces = [e.delta.partial_json for e in s if e.type == "content_block_delta"
                  and e.delta.type == "input_json_delta"]
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and json.loads("".join(pieces)) == final.content[0].input
    answer = client.messages.create(model="m", max_tokens=6, tools=[TOOL], messages=[
        {"role": "user", "content": "Light the den"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "done"},
                                     {"type": "text", "text": "Thanks"}]}], tool_choice={"type": "none"})
    assert answer.content[0].type == "text" and answer.usage.output_tokens >= 1


def test_content_blocks_become_openais_messages():
    """Tool results come first as tool messages, then the rest of the message; text blocks join; thinking is
    the reasoning; a message of tool results alone gives no empty message after them."""
    call = {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": "é"}}
    body = {"system": [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}], "max_tokens": 4, "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"},
                                          {"type": "text", "text": "A"}, {"type": "text", "text": "B"}, call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "R"}]}, {"type": "text", "text": "ok"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "R2"}]}]}
    assert to_chat(body)["messages"] == [
        {"role": "system", "content": "S1\nS2"}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "AB", "reasoning_content": "hm", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": "é"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "R"}, {"role": "user", "content": "ok"},
        {"role": "tool", "tool_call_id": "t1", "content": "R2"}]
    with pytest.raises(APIError, match="'messages\\[0\\]': tool_use blocks belong to assistant messages"):
        to_chat({"messages": [{"role": "user", "content": [call]}]})


@pytest.mark.parametrize("body, where", [
    ({"max_tokens": 5}, "'messages' is required"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "image input is not supported"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "'messages[0].role' must be one of"),
    ({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "'max_tokens' must be in"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]}, "'tools[0].input_schema'"),
])
def test_errors_are_anthropics_shape(server, body, where):
    r = httpx.post(server.base_url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert where in r.json()["error"]["message"]


def test_the_client_raises_its_own_errors(client):
    with pytest.raises(anthropic.BadRequestError, match="image input is not supported"):
        client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])


def test_x_api_key_is_accepted(model_path):
    with ServerThread(create_app(make_state(model_path), api_key="sesame")) as keyed:
        ok = anthropic.Anthropic(base_url=keyed.base_url, api_key="sesame", max_retries=0)
        assert ok.messages.count_tokens(model="m", messages=[{"role": "user", "content": "Hi"}]).input_tokens > 0
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=keyed.base_url, api_key="wrong", max_retries=0).messages.count_tokens(
                model="m", messages=[{"role": "user", "content": "Hi"}])
