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
    choice = f.body.get("tool_choice", "auto" if functions else "none")
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
