"""OpenAI's Responses API (`POST /v1/responses`, `POST /v1/responses/input_tokens`), stateless as llama.cpp's
server offers it: `instructions` and `input` (a string, or items: messages, function_call and
function_call_output) become a chat request, run on the engine like any chat, and are answered as a `response`
whose output items are a message (output_text) and function calls, or as its server-sent events
(response.created, response.in_progress, response.output_item.added, response.content_part.added,
response.output_text.delta / done, response.function_call_arguments.delta / done, response.output_item.done,
response.completed or response.incomplete). Nothing is stored: `previous_response_id` is refused. The request's
`model` is not checked: one model is served."""

from __future__ import annotations

import json
import time
import uuid

from fastapi.responses import StreamingResponse

from pyggml.serve.completions import read_chat
from pyggml.serve.deltas import CallArguments, CallStart, Finished, TextDelta, collect, open_deltas
from pyggml.serve.protocol import APIError, Fields
from pyggml.serve.state import ServerState

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "presence_penalty",
            "frequency_penalty")  # OpenAI's two, then llama.cpp's own


def to_chat(body, stream_allowed: bool = True) -> dict:
    """The chat request a Responses request stands for."""
    f = Fields(body)
    if f.has("previous_response_id"):
        raise APIError("'previous_response_id' is not supported: this server stores no responses; send the "
                       "conversation in 'input'", param="previous_response_id")
    messages = [{"role": "system", "content": f.get("instructions", str)}] if f.has("instructions") else []
    raw = f.get("input", (str, list), required=True)
    messages += [{"role": "user", "content": raw}] if isinstance(raw, str) else _items(raw)
    chat = {"messages": messages, "stream": f.get("stream", bool, False) and stream_allowed,
            "max_tokens": f.get("max_output_tokens", int, None, low=1)}
    for name in SAMPLING:
        if f.has(name):
            chat[name] = f.body[name]
    tools = [_tool(Fields(t, f"tools[{i}]")) for i, t in enumerate(f.get("tools", list, []))]
    if tools:
        chat["tools"] = tools
    choice = f.get("tool_choice", (str, dict))
    if isinstance(choice, dict):
        c = Fields(choice, "tool_choice")
        c.get("type", str, required=True, choices=("function",))
        choice = {"type": "function", "function": {"name": c.get("name", str, required=True)}}
    if choice is not None:
        chat["tool_choice"] = choice
    if f.has("parallel_tool_calls"):
        chat["parallel_tool_calls"] = f.get("parallel_tool_calls", bool)
    text = f.obj("text")
    fmt = text.obj("format") if text else None
    if fmt is not None:
        kind = fmt.get("type", str, required=True, choices=("text", "json_object", "json_schema"))
        if kind == "json_schema":
            chat["response_format"] = {"type": "json_schema", "json_schema": {
                "name": fmt.get("name", str, "schema"), "schema": fmt.get("schema", dict, required=True)}}
        elif kind == "json_object":
            chat["response_format"] = {"type": "json_object"}
    return chat


def _items(items: list) -> list[dict]:
    out = []
    for i, raw in enumerate(items):
        item = Fields(raw, f"input[{i}]")
        kind = item.get("type", str, "message")
        if kind == "message":
            role = item.get("role", str, required=True, choices=ROLES)
            out.append({"role": role, "content": _text(item.get("content", (str, list), required=True),
                                                       f"input[{i}].content")})
        elif kind == "function_call":
            call = {"id": item.get("call_id", str, required=True), "type": "function",
                    "function": {"name": item.get("name", str, required=True),
                                 "arguments": item.get("arguments", str, "{}")}}
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", (str, list), required=True)
            out.append({"role": "tool", "tool_call_id": item.get("call_id", str, required=True),
                        "content": _text(output, f"input[{i}].output")})
        elif kind != "reasoning":  # reasoning items of earlier turns carry nothing a template reads
            raise APIError(f"'input[{i}].type' {kind!r} is not supported (message, function_call, "
                           f"function_call_output)", param=f"input[{i}].type")
    return out


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for k, part in enumerate(content):
        p = Fields(part, f"{where}[{k}]")
        kind = p.get("type", str, required=True)
        if kind not in TEXT_PARTS:
            raise APIError(f"'{where}[{k}]': {kind} is not supported by this server (only text)",
                           param=f"{where}[{k}].type")
        texts.append(p.get("text", str, required=True))
    return "".join(texts)


def _tool(t: Fields) -> dict:
    kind = t.get("type", str, required=True)
    if kind != "function":
        raise APIError(f"tool type '{kind}' is not supported (only function tools)", param=f"{t.where}.type")
    function = {"name": t.get("name", str, required=True),
                "parameters": t.get("parameters", dict, {"type": "object", "properties": {}})}
    if t.has("description"):
        function["description"] = t.get("description", str)
    return {"type": "function", "function": function}


# ----- answers ------------------------------------------------------------------------------------------
async def create(state: ServerState, body, disconnected):
    chat = to_chat(body)
    job = await read_chat(state, chat)
    shell = _Shell(state.require().model_id, Fields(body))
    if job.gen.stream:
        return StreamingResponse(_events(await open_deltas(state, job), shell), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        end = await collect(state, job, disconnected)
    except TimeoutError:
        raise APIError(f"the request ran past its {state.limits.timeout_s:g} s limit", status=504,
                       kind="timeout_error") from None
    items = [] if end.output.calls and not end.output.text else [_message(shell.message_id, end.output.text)]
    items += [_call_item(c.id, c.name, c.arguments) for c in end.output.calls]
    return shell.response(items, end)


async def input_tokens(state: ServerState, body) -> dict:
    job = await read_chat(state, to_chat(body, stream_allowed=False))
    return {"object": "response.input_tokens", "input_tokens": len(job.prompts[0])}


class _Shell:
    """The parts of a response that do not depend on the output: ids, time, the request's settings echoed."""

    def __init__(self, model_id: str, f: Fields):
        self.id, self.message_id, self.created = "resp_" + uuid.uuid4().hex, "msg_" + uuid.uuid4().hex, int(time.time())
        self.model_id = model_id
        self.echo = {"instructions": f.body.get("instructions"), "max_output_tokens": f.body.get("max_output_tokens"),
                     "temperature": f.body.get("temperature"), "top_p": f.body.get("top_p"),
                     "tools": f.body.get("tools", []), "tool_choice": f.body.get("tool_choice", "auto"),
                     "parallel_tool_calls": f.body.get("parallel_tool_calls", True),
                     "text": f.body.get("text", {"format": {"type": "text"}}), "metadata": f.body.get("metadata", {}),
                     "previous_response_id": None, "store": False, "truncation": "disabled"}

    def response(self, items: list[dict], end: Finished | None) -> dict:
        status = "in_progress" if end is None else "incomplete" if end.reason == "length" else "completed"
        usage = None if end is None else {
            "input_tokens": end.prompt_tokens, "input_tokens_details": {"cached_tokens": end.cached_tokens},
            "output_tokens": end.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": end.prompt_tokens + end.completion_tokens}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model_id, "output": items, "usage": usage, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                **self.echo}


def _message(item_id: str, text: str, status: str = "completed") -> dict:
    content = [_part(text)] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"type": "function_call", "id": "fc_" + call_id.removeprefix("call_"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


async def _events(deltas, shell: _Shell):
    """The response's events: a message item while text comes, a function_call item per call, each closed
    before the next opens; then response.completed (response.incomplete when cut by max_output_tokens)."""
    stream = _EventStream(shell)
    yield stream.event("response.created", response=shell.response([], None))
    yield stream.event("response.in_progress", response=shell.response([], None))
    try:
        async for d in deltas:
            for chunk in stream.take(d):
                yield chunk
    except APIError as e:
        yield stream.event("error", code=e.kind, message=e.message, param=e.param)
    except TimeoutError:
        yield stream.event("error", code="timeout_error", message="the request ran past its time limit", param=None)


class _EventStream:
    """The output items as the events have built them so far, and the one item still open (a message taking
    text or a call taking arguments), which the next item's start closes."""

    def __init__(self, shell: _Shell):
        self.shell = shell
        self.number = 0                  # the next event's sequence_number
        self.items: list[dict] = []      # the output items so far, as the final response lists them
        self.text: str | None = None     # the open message's text (None: no message open)
        self.call: dict | None = None    # the open call's item

    def event(self, kind: str, **fields) -> bytes:
        data = {"type": kind, "sequence_number": self.number, **fields}
        self.number += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

    def take(self, d) -> list[bytes]:
        """The events one delta of the answer makes."""
        if isinstance(d, TextDelta):
            return self.add_text(d.text)
        if isinstance(d, CallStart):
            return self.open_call(d)
        if isinstance(d, CallArguments) and self.call is not None:
            return self.add_arguments(d.text)
        if isinstance(d, Finished):
            return self.finish(d)
        return []

    def add_text(self, text: str) -> list[bytes]:
        out = self.open_message() if self.text is None else []
        self.text += text
        return out + [self.event("response.output_text.delta", item_id=self.shell.message_id,
                                 output_index=len(self.items) - 1, content_index=0, delta=text, logprobs=[])]

    def open_call(self, d: CallStart) -> list[bytes]:
        out = self.close()
        self.call = _call_item(d.id, d.name, "", "in_progress")
        self.items.append(self.call)
        return out + [self.event("response.output_item.added", output_index=len(self.items) - 1, item=self.call)]

    def add_arguments(self, text: str) -> list[bytes]:
        self.call["arguments"] += text
        return [self.event("response.function_call_arguments.delta", item_id=self.call["id"],
                           output_index=len(self.items) - 1, delta=text)]

    def finish(self, end: Finished) -> list[bytes]:
        """The last item closed, then response.completed or response.incomplete; an empty answer is an empty
        message, as it is unstreamed."""
        out = self.open_message() if not self.items else []
        out += self.close()
        final = self.shell.response(self.items, end)
        return out + [self.event("response." + final["status"], response=final)]

    def open_message(self) -> list[bytes]:
        out = self.close()
        self.items.append(_message(self.shell.message_id, "", "in_progress"))
        self.text, at = "", len(self.items) - 1
        return out + [self.event("response.output_item.added", output_index=at, item=self.items[at]),
                      self.event("response.content_part.added", item_id=self.shell.message_id, output_index=at,
                                 content_index=0, part=_part(""))]

    def close(self) -> list[bytes]:
        """The open item's done events, its final form in place of its in-progress one."""
        out, at = [], len(self.items) - 1
        if self.text is not None:
            self.items[at] = _message(self.shell.message_id, self.text)
            ids = {"item_id": self.shell.message_id, "output_index": at, "content_index": 0}
            out += [self.event("response.output_text.done", **ids, text=self.text, logprobs=[]),
                    self.event("response.content_part.done", **ids, part=_part(self.text)),
                    self.event("response.output_item.done", output_index=at, item=self.items[at])]
        elif self.call is not None:
            self.items[at] = {**self.call, "status": "completed"}
            out += [self.event("response.function_call_arguments.done", item_id=self.call["id"], output_index=at,
                               name=self.call["name"], arguments=self.call["arguments"]),
                    self.event("response.output_item.done", output_index=at, item=self.items[at])]
        self.text = self.call = None
        return out
