"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), as llama.cpp's server offers
it: the request becomes a chat request (system prompt, text, tool_use and tool_result blocks as OpenAI's
messages, tool calls and tool results), runs on the engine like any chat, and is answered in Anthropic's shapes:
a `message` with text and tool_use blocks, or its server-sent events (message_start, content_block_start /
delta / stop, ping, message_delta with the stop reason and usage, message_stop). Errors are Anthropic's
`{"type": "error", "error": {"type", "message"}}`. The request's `model` is not checked: Anthropic's clients
name hosted models, and one model is served."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from fastapi.responses import JSONResponse, StreamingResponse

from pyggml.serve.completions import read_chat
from pyggml.serve.deltas import CallArguments, CallStart, Finished, TextDelta, collect, open_deltas
from pyggml.serve.protocol import APIError, Fields
from pyggml.serve.state import ServerState

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
               504: "timeout_error"}
BLOCKS = ("text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking")
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty")  # top_k is Anthropic's too


def error_response(e: APIError) -> JSONResponse:
    body = {"type": "error", "error": {"type": ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}
    return JSONResponse(body, status_code=e.status, headers=e.headers)


def to_chat(body, stream_allowed: bool = True) -> dict:
    """The chat request an Anthropic request stands for (OpenAI's field names)."""
    f = Fields(body)
    chat = {"messages": _messages(f), "stream": f.get("stream", bool, False) and stream_allowed}
    chat["max_tokens"] = f.get("max_tokens", int, None, low=1)
    stops = f.get("stop_sequences", list, None)
    if stops is not None:
        chat["stop"] = stops
    for name in SAMPLING:
        if f.has(name):
            chat[name] = f.body[name]
    tools = [_tool(Fields(t, f"tools[{i}]")) for i, t in enumerate(f.get("tools", list, []))]
    if tools:
        chat["tools"] = tools
    choice = f.obj("tool_choice")
    if choice is not None:
        kind = choice.get("type", str, required=True, choices=("auto", "any", "tool", "none"))
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or {
            "type": "function", "function": {"name": choice.get("name", str, required=True)}}
        if choice.get("disable_parallel_tool_use", bool, False):
            chat["parallel_tool_calls"] = False
    return chat


def _tool(t: Fields) -> dict:
    kind = t.get("type", str, "custom")
    if kind != "custom":
        raise APIError(f"tool type '{kind}' is not supported (only client tools with an input_schema)",
                       param=t.where)
    function = {"name": t.get("name", str, required=True),
                "parameters": t.get("input_schema", dict, required=True)}
    if t.has("description"):
        function["description"] = t.get("description", str)
    return {"type": "function", "function": function}


def _messages(f: Fields) -> list[dict]:
    """OpenAI's messages for the request: the system prompt, then each message's."""
    out = []
    system = f.get("system", (str, list))
    if system:
        out.append({"role": "system", "content": _text(system, "system")})
    for i, raw in enumerate(f.get("messages", list, required=True)):
        out.extend(_message(Fields(raw, f"messages[{i}]")))
    return out


def _message(m: Fields) -> list[dict]:
    """One Anthropic message as OpenAI's: its tool results first, as tool messages (they answer the calls
    before), then its text, tool calls and thinking as one message of its role."""
    role = m.get("role", str, required=True, choices=("user", "assistant"))
    content = m.get("content", (str, list), required=True)
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    blocks = _Blocks()
    for j, raw_block in enumerate(content):
        blocks.add(Fields(raw_block, f"{m.where}.content[{j}]"))
    if (blocks.calls and role != "assistant") or (blocks.results and role != "user"):
        raise APIError(f"'{m.where}': tool_use blocks belong to assistant messages and tool_result "
                       f"blocks to user messages", param=f"{m.where}.content")
    if blocks.texts or blocks.calls or blocks.thinking or not blocks.results:
        return blocks.results + [blocks.message(role)]
    return blocks.results


@dataclass
class _Blocks:
    """A message's content blocks sorted by what OpenAI's messages carry apart: text, tool calls, tool results
    and thinking."""

    texts: list[str] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)
    results: list[dict] = field(default_factory=list)
    thinking: str = ""

    def add(self, b: Fields) -> None:
        kind = b.get("type", str, required=True, choices=BLOCKS)
        if kind == "text":
            self.texts.append(b.get("text", str, required=True))
        elif kind in ("image", "document"):
            raise APIError(f"'{b.where}': {kind} input is not supported by this server (no vision model)",
                           param=b.where)
        elif kind == "tool_use":
            self.calls.append({"id": b.get("id", str, required=True), "type": "function",
                               "function": {"name": b.get("name", str, required=True),
                                            "arguments": json.dumps(b.get("input", dict, {}), ensure_ascii=False)}})
        elif kind == "tool_result":
            self.results.append({"role": "tool", "tool_call_id": b.get("tool_use_id", str, required=True),
                                 "content": _text(b.get("content", (str, list), ""), f"{b.where}.content")})
        elif kind == "thinking":
            self.thinking += b.get("thinking", str, "")

    def message(self, role: str) -> dict:
        """The text (its blocks joined as OpenAI's text parts are), tool calls and thinking as one message."""
        message = {"role": role, "content": "".join(self.texts)}
        if self.calls:
            message["tool_calls"] = self.calls
        if self.thinking:
            message["reasoning_content"] = self.thinking
        return message


def _text(value, where: str) -> str:
    """A string, or the text of an array of blocks (only text blocks)."""
    if isinstance(value, str):
        return value
    texts = []
    for k, block in enumerate(value):
        b = Fields(block, f"{where}[{k}]")
        kind = b.get("type", str, required=True)
        if kind != "text":
            raise APIError(f"'{where}[{k}]': {kind} input is not supported by this server (only text)",
                           param=f"{where}[{k}]")
        texts.append(b.get("text", str, required=True))
    return "\n".join(texts)


# ----- answers ------------------------------------------------------------------------------------------
async def messages(state: ServerState, body, disconnected):
    job = await read_chat(state, to_chat(body))
    model_id = state.require().model_id
    if job.gen.stream:
        return StreamingResponse(_events(await open_deltas(state, job), job, model_id),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        end = await collect(state, job, disconnected)
    except TimeoutError:
        raise APIError(f"the request ran past its {state.limits.timeout_s:g} s limit", status=504) from None
    content = [{"type": "text", "text": end.output.text}] if end.output.text or not end.output.calls else []
    content += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)}
                for c in end.output.calls]
    return {**_head(model_id), "content": content, "stop_reason": _stop_reason(end),
            "stop_sequence": end.stop_sequence, "usage": _usage(end)}


async def count_tokens(state: ServerState, body) -> dict:
    job = await read_chat(state, to_chat(body, stream_allowed=False))
    return {"input_tokens": len(job.prompts[0])}


def _head(model_id: str) -> dict:
    return {"id": "msg_" + uuid.uuid4().hex, "type": "message", "role": "assistant", "model": model_id}


def _input(arguments: str) -> dict:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _stop_reason(end: Finished) -> str:
    return "stop_sequence" if end.stop_sequence is not None else STOP_REASONS[end.reason]


def _usage(end: Finished) -> dict:
    return {"input_tokens": end.prompt_tokens - end.cached_tokens, "output_tokens": end.completion_tokens,
            "cache_read_input_tokens": end.cached_tokens, "cache_creation_input_tokens": 0}


def _event(data: dict) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def _events(deltas, job, model_id: str):
    """Anthropic's events: a text block while text comes, a tool_use block per call (its input as JSON pieces),
    each closed before the next opens."""
    start = {**_head(model_id), "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": len(job.prompts[0]), "output_tokens": 0}}
    yield _event({"type": "message_start", "message": start})
    yield _event({"type": "ping"})
    blocks, open_kind = -1, None   # the last block's index and kind ("text" or a call's number)

    def close():
        return [_event({"type": "content_block_stop", "index": blocks})] if open_kind is not None else []

    try:
        async for d in deltas:
            out = []
            if isinstance(d, TextDelta) and open_kind != "text":
                out, blocks, open_kind = close(), blocks + 1, "text"
                out.append(_event({"type": "content_block_start", "index": blocks,
                                   "content_block": {"type": "text", "text": ""}}))
            elif isinstance(d, CallStart):
                out, blocks, open_kind = close(), blocks + 1, d.index
                out.append(_event({"type": "content_block_start", "index": blocks,
                                   "content_block": {"type": "tool_use", "id": d.id, "name": d.name, "input": {}}}))
            if isinstance(d, TextDelta):
                out.append(_event({"type": "content_block_delta", "index": blocks,
                                   "delta": {"type": "text_delta", "text": d.text}}))
            elif isinstance(d, CallArguments) and open_kind == d.index:
                out.append(_event({"type": "content_block_delta", "index": blocks,
                                   "delta": {"type": "input_json_delta", "partial_json": d.text}}))
            elif isinstance(d, Finished):
                if blocks < 0:  # an empty answer is one empty text block, as unstreamed
                    blocks, open_kind = 0, "text"
                    out.append(_event({"type": "content_block_start", "index": 0,
                                       "content_block": {"type": "text", "text": ""}}))
                out += close()
                open_kind = None
                out.append(_event({"type": "message_delta",
                                   "delta": {"stop_reason": _stop_reason(d), "stop_sequence": d.stop_sequence},
                                   "usage": _usage(d)}))
                out.append(_event({"type": "message_stop"}))
            for chunk in out:
                yield chunk
    except APIError as e:
        yield _event({"type": "error", "error": {"type": ERROR_TYPES.get(e.status, "api_error"),
                                                 "message": e.message}})
    except TimeoutError:
        yield _event({"type": "error", "error": {"type": "timeout_error", "message": "the request ran past its "
                                                                                    "time limit"}})
