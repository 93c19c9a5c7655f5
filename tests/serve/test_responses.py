"""OpenAI's Responses API (pyggml/serve/responses.py) driven by the real `openai` client's `responses.create`:
text against the chat endpoint's greedy answer to the same messages, streaming events in OpenAI's order adding up
to the whole response, function calls and function_call_output items, input_tokens, and errors."""

import asyncio
import json

import httpx
import openai
import pytest

from pyggml.serve.app import create_app
from pyggml.serve.deltas import CallArguments, CallStart, Finished, TextDelta
from pyggml.serve.protocol import Fields
from pyggml.serve.responses import _events, _Shell
from tests.support.serve import ServerThread, make_state, write_chat_model

INPUT = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Red."},
         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Another one?"}]}]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Red."}, {"role": "user", "content": "Another one?"}]
TOOL = {"type": "function", "name": "set_light", "description": "Switch a light",
        "parameters": {"type": "object", "properties": {"room": {"enum": ["hall", "den"]}, "on": {"type": "boolean"}},
                       "required": ["room", "on"], "additionalProperties": False}}
ONE_CALL = {"tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = write_chat_model(tmp_path_factory.mktemp("responses") / "tiny.gguf", template="hermes_tools.jinja",
                            n_ctx=1024)
    with ServerThread(create_app(make_state(path, n_ctx=1024))) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def test_text_is_the_chat_answer_to_the_same_messages(server, client):
    r = client.responses.create(model="gpt-4.1", instructions="Be brief.", input=INPUT, max_output_tokens=10,
                                temperature=0)
    chat = httpx.post(server.base_url + "/v1/chat/completions", timeout=60,
                      json={"messages": CHAT, "max_tokens": 10, "temperature": 0}).json()
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "tiny"
    assert r.output[0].type == "message" and r.output[0].id.startswith("msg_")
    assert r.output_text == chat["choices"][0]["message"]["content"]
    finish = chat["choices"][0]["finish_reason"]
    assert r.status == {"length": "incomplete", "stop": "completed"}[finish]
    assert (r.incomplete_details.reason == "max_output_tokens") == (finish == "length")
    assert r.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert r.usage.output_tokens == chat["usage"]["completion_tokens"]
    counted = httpx.post(server.base_url + "/v1/responses/input_tokens", timeout=60,
                         json={"instructions": "Be brief.", "input": INPUT}).json()
    assert counted == {"object": "response.input_tokens", "input_tokens": chat["usage"]["prompt_tokens"]}


def test_a_string_input_is_one_user_message(client):
    a = client.responses.create(model="m", input="Hello", max_output_tokens=6, temperature=0)
    b = client.responses.create(model="m", input=[{"role": "user", "content": "Hello"}], max_output_tokens=6,
                                temperature=0)
    assert a.output_text == b.output_text and a.usage.input_tokens == b.usage.input_tokens


def test_stream_events_are_openais_and_add_up_to_the_whole_response(client):
    kw = dict(model="m", input=INPUT, max_output_tokens=12, temperature=0)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response." + whole.status]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    msg_id = events[2].item.id
    assert all(e.item_id == msg_id for e in events if e.type.startswith("response.output_text"))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens


def test_function_call_then_its_output(client):
    r = client.responses.create(model="m", input="Light the den", max_output_tokens=60, **ONE_CALL)
    assert [o.type for o in r.output] == ["function_call"] and r.status == "completed"
    call = r.output[0]
    args = json.loads(call.arguments)
    assert call.name == "set_light" and call.call_id and args["room"] in ("hall", "den")
    events = list(client.responses.create(model="m", input="Light the den", max_output_tokens=60, stream=True,
                                          **ONE_CALL))
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads("".join(pieces)) == json.loads(done.arguments) and done.name == "set_light"
    assert events[-1].type == "response.completed" and events[-1].response.output[0].type == "function_call"
    answer = client.responses.create(model="m", max_output_tokens=6, tools=[TOOL], tool_choice="none", input=[
        {"role": "user", "content": "Light the den"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "done"}])
    assert answer.output[0].type == "message" and answer.usage.output_tokens >= 1


def stream_of(deltas: list) -> list[dict]:
    """The events _events makes of these deltas, parsed."""
    shell = _Shell("m", Fields({"input": "x"}))

    async def feed():
        for d in deltas:
            yield d

    async def run():
        return [json.loads(chunk.decode().split("data: ", 1)[1]) async for chunk in _events(feed(), shell)]
    return asyncio.run(run())


def test_streamed_items_open_and_close_in_turn():
    """Text then two calls: the message is done before the first call is added, each call done before the next;
    arguments go to the open call; an empty answer is one empty message."""
    end = Finished(None, "tool_calls", None, 3, 0, 5)
    events = stream_of([TextDelta("Hi"), TextDelta("!"), CallStart(0, "call_a", "f"), CallArguments(0, "{}"),
                        CallStart(1, "call_b", "g"), CallArguments(1, '{"x"'), CallArguments(1, ": 1}"), end])
    assert [(e["type"].removeprefix("response."), e.get("output_index")) for e in events] == [
        ("created", None), ("in_progress", None), ("output_item.added", 0), ("content_part.added", 0),
        ("output_text.delta", 0), ("output_text.delta", 0), ("output_text.done", 0), ("content_part.done", 0),
        ("output_item.done", 0), ("output_item.added", 1), ("function_call_arguments.delta", 1),
        ("function_call_arguments.done", 1), ("output_item.done", 1), ("output_item.added", 2),
        ("function_call_arguments.delta", 2), ("function_call_arguments.delta", 2),
        ("function_call_arguments.done", 2), ("output_item.done", 2), ("completed", None)]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    output = events[-1]["response"]["output"]
    assert [(o["type"], o.get("name"), o.get("arguments"), o["status"]) for o in output] == [
        ("message", None, None, "completed"), ("function_call", "f", "{}", "completed"),
        ("function_call", "g", '{"x": 1}', "completed")]
    assert output[0]["content"][0]["text"] == "Hi!"
    empty = stream_of([Finished(None, "length", None, 3, 0, 0)])
    assert [e["type"] for e in empty][2:] == ["response.output_item.added", "response.content_part.added",
                                              "response.output_text.done", "response.content_part.done",
                                              "response.output_item.done", "response.incomplete"]
    assert empty[-1]["response"]["output"][0]["content"][0]["text"] == ""


@pytest.mark.parametrize("body, where", [
    ({}, "'input' is required"),
    ({"input": "x", "previous_response_id": "resp_1"}, "'previous_response_id' is not supported"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input_image is not"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tool type 'web_search' is not supported"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "'input[0].type' 'item_reference' is not supported"),
])
def test_errors(server, body, where):
    r = httpx.post(server.base_url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 400 and where in r.json()["error"]["message"], r.text
