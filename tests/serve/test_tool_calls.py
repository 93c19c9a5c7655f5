"""Tool calls parsed from each trained format, the streaming hold-back, and tools / tool_choice checking."""

import json

import pytest

from pyggml.serve.protocol import APIError, Fields
from pyggml.serve.tool_calls import ToolCallStream, ToolSpec, parse_tool_calls, read_tools, tool_call_start

SPEC = ToolSpec({"get_weather": {"type": "object"}, "get_time": {"type": "object"}})
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "get_time"}}]


def _calls(text):
    content, calls = parse_tool_calls(text, SPEC)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


FORMATS = [
    ('Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', "Sure.",
     [("get_weather", {"city": "Paris"}), ("get_time", {})]),                               # Hermes / Qwen, parallel
    ('{"name": "get_weather", "parameters": {"city": "Oslo"}}', "", [("get_weather", {"city": "Oslo"})]),  # Llama 3
    ('<|python_tag|>{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "x"}}',
     "", [("get_time", {}), ("get_weather", {"city": "x"})]),
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}, "id": "abc123xyz"}]', "",
     [("get_weather", {"city": "Rome"})]),                                                    # Mistral
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}', "", [("get_weather", {"city": "Rome"})]),
    ('{"tool_calls": [{"name": "get_time", "arguments": {"tz": "UTC"}}]}', "", [("get_time", {"tz": "UTC"})]),
    ('{"tool_call": {"name": "get_time", "arguments": {}}}', "", [("get_time", {})]),           # generic
    ('{"response": "no tool needed"}', "no tool needed", []),
    ('[{"function": {"name": "get_time", "arguments": "{}"}}]', "", [("get_time", {})]),          # OpenAI's shape
    ('<tool_call>{"arguments": {"a": [1, {"b": "}"}]}, "name": "get_time"}</tool_call>', "",    # name after arguments
     [("get_time", {"a": [1, {"b": "}"}]})]),
    ('<tool_call>{"name": "get_time"}</tool_call>', "", [("get_time", {})]),                    # no arguments
]


@pytest.mark.parametrize("text, content, calls", FORMATS)
def test_formats(text, content, calls):
    assert _calls(text) == (content, calls)


@pytest.mark.parametrize("text", [
    "Just text.", '{"name": "unknown_fn", "arguments": {}}', "<tool_call>{broken</tool_call>", '{"a": 1}',
    '[TOOL_CALLS]get_weather[ARGS]{"city"'])
def test_non_calls_stay_content(text):
    assert parse_tool_calls(text, SPEC) == (text, [])


def test_ids_are_unique_and_openai_shaped():
    _, calls = parse_tool_calls('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>' * 2, SPEC)
    assert calls[0].id != calls[1].id and calls[0].as_openai(1)["index"] == 1
    assert calls[0].as_openai()["function"] == {"name": "get_time", "arguments": "{}"}


@pytest.mark.parametrize("text, start", [
    ("Hello there", 11), ("Hello <tool_call>{", 6), ("Hello <tool_", 6), ("Hi [TOOL", 3), ("  {", 0), ("[", 0),
    ("  ", 0), ("a < b", 5), ("text<|python_tag|>", 4)])
def test_tool_call_start_holds_back_only_what_may_be_a_call(text, start):
    assert tool_call_start(text) == start


def test_read_tools():
    spec = read_tools(Fields({"tools": TOOLS}))
    assert spec.choice == "auto" and spec.active and spec.functions["get_time"]["type"] == "object"
    assert not read_tools(Fields({})).active
    assert not read_tools(Fields({"tools": TOOLS, "tool_choice": "none"})).active
    named = read_tools(Fields({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}},
                               "parallel_tool_calls": False}))
    schema = named.forcing_schema()["properties"]["tool_calls"]
    assert schema["maxItems"] == 1 and schema["items"]["properties"]["name"] == {"const": "get_time"}
    assert read_tools(Fields({"tools": TOOLS, "tool_choice": "required"})).forcing_schema() is not None
    assert read_tools(Fields({"tools": TOOLS})).forcing_schema() is None


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"name": 3}}]}, "tools[0].function.name"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": "x"}, "tools"),
])
def test_bad_tools_name_the_field(body, param):
    with pytest.raises(APIError) as e:
        read_tools(Fields(body))
    assert e.value.param == param and e.value.status == 400


def _streamed(text, step=1):
    """The deltas of `text` fed `step` characters at a time, then finished."""
    stream = ToolCallStream(SPEC)
    deltas = [d for i in range(step, len(text) + step, step) for d in stream.update(text[:i])]
    return stream, deltas + stream.update(text, final=True)


@pytest.mark.parametrize("text, content, calls", FORMATS)
@pytest.mark.parametrize("step", [1, 7])
def test_streamed_deltas_join_to_the_parsed_calls(text, content, calls, step):
    stream, deltas = _streamed(text, step)
    joined = {}
    for d in deltas:  # the openai client's accumulation: id and name once, arguments concatenated
        entry = joined.setdefault(d["index"], {"name": None, "arguments": ""})
        if "id" in d:
            assert entry["name"] is None and d["function"]["arguments"] == ""  # the header comes first, once
            entry["name"] = d["function"]["name"]
        entry["arguments"] += d["function"]["arguments"]
    assert [(e["name"], json.loads(e["arguments"])) for _, e in sorted(joined.items())] == calls
    assert stream.matches(parse_tool_calls(text, SPEC)[1])


def test_arguments_stream_in_pieces_after_the_name():
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}</tool_call>'
    _, deltas = _streamed(text)
    assert deltas[0]["function"] == {"name": "get_weather", "arguments": ""} and deltas[0]["id"].startswith("call_")
    pieces = [d["function"]["arguments"] for d in deltas[1:]]
    assert len(pieces) > 10 and "".join(pieces) == '{"city": "Paris", "days": 3}'


@pytest.mark.parametrize("text", [
    "Just text.", '{"name": "unknown_fn", "arguments": {}}', '{"a": 1}', '{"response": "no"}',
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'])
def test_no_deltas_for_what_is_no_call(text):
    assert _streamed(text)[1] == []


def test_a_call_cut_short_does_not_match_the_finished_output():
    stream, deltas = _streamed('<tool_call>{"name": "get_time", "arguments": {"tz": "UT')
    assert deltas and not stream.matches(parse_tool_calls('<tool_call>{"name": "get_time", "arguments": {"tz": "UT',
                                                          SPEC)[1])
