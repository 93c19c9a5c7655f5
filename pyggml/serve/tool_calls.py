"""Tool calls in a model's output, in the formats models are trained with: Hermes / Qwen `<tool_call>{json}
</tool_call>`, Llama 3.x JSON (`{"name", "parameters"}`, after `<|python_tag|>` or alone), Mistral
`[TOOL_CALLS][{...}]` (or `[TOOL_CALLS]name[ARGS]{...}`), and llama.cpp's generic JSON (`{"tool_calls": [...]}`,
`{"tool_call": {...}}`, `{"response": "..."}`), which `tool_choice` required / named forces with a schema.
Only calls of declared functions count; anything else stays content."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from pyggml.serve.protocol import APIError, Fields

# Text that opens a tool call anywhere in the output; JSON calls count only at its start.
MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>")
_JSON_STARTS = ("{", "[")
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_MISTRAL_ARGS = re.compile(r"\[TOOL_CALLS\]\s*([A-Za-z0-9_.-]+)\s*\[ARGS\]\s*", re.S)


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def as_openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


@dataclass
class ToolSpec:
    """The request's tools and tool_choice: which functions exist, and whether (and which) one must be called."""

    functions: dict[str, dict]          # name -> JSON schema of its parameters
    choice: str = "auto"                # auto | none | required | function
    forced: str | None = None           # the named function when choice == "function"
    parallel: bool = True

    @property
    def active(self) -> bool:
        return bool(self.functions) and self.choice != "none"

    def forcing_schema(self) -> dict | None:
        """The generic-format schema that `required` or a named function imposes (None for auto / none)."""
        if self.choice not in ("required", "function"):
            return None
        names = [self.forced] if self.forced else list(self.functions)
        calls = [{"type": "object", "properties": {"name": {"const": n}, "arguments": self.functions[n]},
                  "required": ["name", "arguments"], "additionalProperties": False} for n in names]
        items = {"anyOf": calls} if len(calls) > 1 else calls[0]
        array = {"type": "array", "items": items, "minItems": 1}
        if not self.parallel:
            array["maxItems"] = 1
        return {"type": "object", "properties": {"tool_calls": array}, "required": ["tool_calls"],
                "additionalProperties": False}


def read_tools(f: Fields) -> ToolSpec:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a chat request, checked."""
    functions = {}
    for i, tool in enumerate(f.get("tools", list, [])):
        t = Fields(tool, f"tools[{i}]")
        t.get("type", str, "function", choices=("function",))
        fn = t.obj("function", required=True)
        name = fn.get("name", str, required=True)
        functions[name] = fn.get("parameters", dict, {"type": "object", "properties": {}})
    choice = f.get("tool_choice", (str, dict), "auto" if functions else "none")
    spec = ToolSpec(functions, parallel=f.get("parallel_tool_calls", bool, True))
    if isinstance(choice, str):
        f.get("tool_choice", str, choices=("auto", "none", "required"))
        spec.choice = choice
    else:
        fn = Fields(choice, "tool_choice").obj("function", required=True)
        spec.choice, spec.forced = "function", fn.get("name", str, required=True)
        if spec.forced not in functions:
            raise APIError(f"tool_choice names '{spec.forced}', which is not among the tools", param="tool_choice")
    if spec.choice in ("required", "function") and not functions:
        raise APIError(f"tool_choice '{spec.choice}' needs tools", param="tool_choice")
    return spec


def tool_call_start(text: str) -> int:
    """Where in `text` a tool call begins or may begin (a marker, or one cut at the end; JSON at the start);
    len(text) when nowhere: what comes before can be streamed as content."""
    stripped = text.lstrip()
    if stripped.startswith(_JSON_STARTS) or (not stripped and text):
        return 0
    best = len(text)
    for marker in MARKERS:
        at = text.find(marker)
        if at >= 0:
            best = min(best, at)
        for k in range(min(len(marker) - 1, len(text)), 0, -1):  # a marker cut by the end of the text so far
            if text.endswith(marker[:k]):
                best = min(best, len(text) - k)
                break
    return best


def parse_tool_calls(text: str, spec: ToolSpec) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a finished output; calls of unknown functions or broken JSON leave it all content."""
    for parse in (_hermes, _mistral_args, _json_calls):
        found = parse(text)
        if found is None:
            continue
        content, raw = found
        if not raw:  # the generic format's {"response": ...}: an answer without a call
            return content, []
        calls = [_call(c) for c in raw]
        if all(c is not None and c.name in spec.functions for c in calls):
            return content, calls
    return text, []


def _call(raw) -> ToolCall | None:
    if not isinstance(raw, dict):
        return None
    if isinstance(raw.get("function"), dict):  # OpenAI's own shape, as some models echo it
        raw = raw["function"]
    name, args = raw.get("name"), raw.get("arguments", raw.get("parameters", {}))
    if not isinstance(name, str):
        return None
    return ToolCall(name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


def _hermes(text: str):
    if "<tool_call>" not in text:
        return None
    raw = []
    for body in _HERMES.findall(text):
        value = _loads(body)
        if value is None:
            return None
        raw.append(value)
    return text[:text.index("<tool_call>")].strip(), raw


def _mistral_args(text: str):
    matches = list(_MISTRAL_ARGS.finditer(text))
    if not matches:
        return None
    raw = []
    for m in matches:
        value, _ = _first_json(text[m.end():])
        if value is None:
            return None
        raw.append({"name": m.group(1), "arguments": value})
    return text[:matches[0].start()].strip(), raw


def _json_calls(text: str):
    """Mistral's `[TOOL_CALLS][...]`, Llama's `<|python_tag|>{...}` (several joined by ';') or bare JSON."""
    content, body = "", text
    for marker in ("[TOOL_CALLS]", "<|python_tag|>"):
        if marker in text:
            content, body = text[:text.index(marker)].strip(), text[text.index(marker) + len(marker):]
            break
    raw = []
    rest = body.strip()
    while rest:
        value, rest = _first_json(rest)
        if value is None:
            return None
        if isinstance(value, dict) and "tool_calls" in value:
            value = value["tool_calls"]
        elif isinstance(value, dict) and "tool_call" in value:
            value = [value["tool_call"]]
        elif isinstance(value, dict) and "response" in value and len(value) == 1:
            return str(value["response"]), []
        raw.extend(value if isinstance(value, list) else [value])
        rest = rest.lstrip().lstrip(";").lstrip()
    return (content, raw) if raw else None


def _first_json(text: str):
    """The JSON value at the start of text and what follows it, or (None, text)."""
    try:
        value, end = json.JSONDecoder().raw_decode(text.lstrip())
    except ValueError:
        return None, text
    return value, text.lstrip()[end:]


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


# ----- streaming: a call's id and name first, then its arguments in pieces -------------------------------
@dataclass
class PartialCall:
    """A call read so far from an unfinished output: its name once whole, and where its arguments' JSON text
    starts and (once complete) ends."""

    name: str | None
    args_start: int | None = None
    args_end: int | None = None
    complete: bool = False          # the call's text is whole (its object closed, or its arguments complete)


def partial_calls(text: str) -> list[PartialCall]:
    """The calls in an output that may still grow, in the order and formats parse_tool_calls reads them."""
    if "<tool_call>" in text:
        return [_object_call(text, m.end()) for m in re.finditer(r"<tool_call>\s*", text)
                if text.startswith("{", m.end())]
    if _MISTRAL_ARGS.search(text):
        calls = []
        for m in _MISTRAL_ARGS.finditer(text):
            end = _value_end(text, m.end()) if m.end() < len(text) else None
            calls.append(PartialCall(m.group(1), m.end() if m.end() < len(text) else None, end, end is not None))
        return calls
    at = next((text.index(m) + len(m) for m in ("[TOOL_CALLS]", "<|python_tag|>") if m in text), None)
    if at is None and not text.lstrip().startswith(_JSON_STARTS):
        return []
    calls, j = [], _skip_space(text, at or 0)
    while j < len(text) and text[j] in _JSON_STARTS:
        if text[j] == "[":
            calls += _array_calls(text, j)
        else:
            members, _ = _members(text, j)
            if "tool_calls" in members and text.startswith("[", members["tool_calls"][0]):
                calls += _array_calls(text, members["tool_calls"][0])
            elif "tool_call" in members and text.startswith("{", members["tool_call"][0]):
                calls.append(_object_call(text, members["tool_call"][0]))
            elif "response" in members:
                return []
            else:
                calls.append(_object_call(text, j))
        end = _value_end(text, j)
        if end is None:
            break
        j = _skip_space(text, end)
        j = _skip_space(text, j + 1) if text.startswith(";", j) else j
    return calls


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


_SCALAR = re.compile(r"-?[0-9][0-9.eE+-]*|true|false|null")


def _value_end(text: str, i: int) -> int | None:
    """The end of the JSON value that starts at text[i], or None while it is not complete."""
    if i >= len(text):
        return None
    if text[i] not in '{["':
        m = _SCALAR.match(text, i)
        return m.end() if m and m.end() < len(text) else None  # a number may still grow
    return _nested_end(text, i)


def _nested_end(text: str, i: int) -> int | None:
    """The end of the string, array or object at text[i]: brackets are counted outside strings only."""
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == '"':
            j = _string_end(text, j)
            if j is None or depth == 0:
                return j
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None


def _string_end(text: str, i: int) -> int | None:
    """The end of the JSON string at text[i] (after its closing quote), None while it is open."""
    j = i + 1
    while j < len(text):
        if text[j] == '"':
            return j + 1
        j += 2 if text[j] == "\\" else 1
    return None


def _members(text: str, i: int) -> tuple[dict[str, tuple[int, int | None]], int | None]:
    """The members read so far of the object at text[i]: key -> (value start, value end or None), and the
    object's end (None while open, or where the text is no JSON object)."""
    out, j = {}, _skip_space(text, i + 1)
    while j < len(text):
        if text[j] == "}":
            return out, j + 1
        if text[j] == ",":
            j = _skip_space(text, j + 1)
            continue
        key_end = _value_end(text, j) if text[j] == '"' else None
        if key_end is None:
            break
        colon = _skip_space(text, key_end)
        if not text.startswith(":", colon):
            break
        start = _skip_space(text, colon + 1)
        if start >= len(text):
            break
        end = _value_end(text, start)
        out[json.loads(text[j:key_end])] = (start, end)
        if end is None:
            break
        j = _skip_space(text, end)
    return out, None


def _array_calls(text: str, i: int) -> list[PartialCall]:
    """The call objects among the elements of the array at text[i] read so far."""
    calls, j = [], _skip_space(text, i + 1)
    while j < len(text) and text[j] == "{":
        calls.append(_object_call(text, j))
        end = _value_end(text, j)
        if end is None:
            break
        j = _skip_space(text, end)
        j = _skip_space(text, j + 1) if text.startswith(",", j) else len(text)
    return calls


def _object_call(text: str, i: int) -> PartialCall:
    members, end = _members(text, i)
    if "function" in members and text.startswith("{", members["function"][0]):  # OpenAI's shape
        inner = _object_call(text, members["function"][0])
        inner.complete = end is not None
        return inner
    name = members.get("name")
    name = json.loads(text[name[0]:name[1]]) if name and name[1] is not None and text[name[0]] == '"' else None
    args = members.get("arguments", members.get("parameters"))
    return PartialCall(name if isinstance(name, str) else None, args[0] if args else None, args[1] if args else None,
                       end is not None)


class ToolCallStream:
    """OpenAI's streamed `tool_calls` deltas of one choice: each call's index, id and name as soon as its name is
    whole (and names a declared function), then its arguments' JSON text in pieces as the model writes it. The
    pieces are the model's own text of the arguments, so they join to JSON that parses to the arguments
    parse_tool_calls reads from the finished output (a string-valued `arguments` is sent whole once complete)."""

    def __init__(self, spec: ToolSpec):
        self.spec = spec
        self.calls: list[ToolCall] = []   # the calls streamed, their arguments as sent so far

    @property
    def started(self) -> bool:
        return bool(self.calls)

    def update(self, text: str, final: bool = False) -> list[dict]:
        """The deltas that the output `text` adds to what was sent (final: the output is finished)."""
        deltas = []
        for k, call in enumerate(partial_calls(text)):
            if k == len(self.calls):
                if call.name not in self.spec.functions:
                    break
                self.calls.append(ToolCall(call.name, ""))
                deltas.append({"index": k, "id": self.calls[k].id, "type": "function",
                               "function": {"name": call.name, "arguments": ""}})
            piece = self._arguments(text, call, final)[len(self.calls[k].arguments):]
            if piece:
                self.calls[k].arguments += piece
                deltas.append({"index": k, "function": {"arguments": piece}})
        return deltas

    @staticmethod
    def _arguments(text: str, call: PartialCall, final: bool) -> str:
        """The arguments' text that may be sent: all of an open object or array is theirs."""
        if call.args_start is None:
            return "{}" if call.complete or final else ""  # a call without arguments: parse_tool_calls' {}
        if call.args_end is not None:
            raw = text[call.args_start:call.args_end]
            return json.loads(raw) if raw.startswith('"') else raw
        return text[call.args_start:] if text[call.args_start] in "{[" else ""

    def matches(self, calls: list[ToolCall]) -> bool:
        """Whether what was streamed is the finished output's calls (same names, arguments that parse alike)."""
        return len(calls) == len(self.calls) and all(
            a.name == b.name and _loads(a.arguments) == _loads(b.arguments) is not None
            for a, b in zip(self.calls, calls, strict=True))
