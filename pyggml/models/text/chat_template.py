"""Chat prompts from the file's own Jinja template (`tokenizer.chat_template`, or a named variant such as
`tokenizer.chat_template.tool_use`), rendered as Hugging Face transformers renders them: a sandboxed,
immutable jinja2 environment with trim_blocks and lstrip_blocks, loop controls, `{% generation %}` blocks,
`tojson` without HTML escaping, `raise_exception`, `strftime_now`, the special tokens, `add_generation_prompt`,
`tools` and any extra keyword. A file without a template falls back to the hand-written families of
pyggml.models.text.chat (the architecture's default format)."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

from pyggml.errors import GGUFError, ParameterError
from pyggml.models.text.chat import detect_template, format_chat

TEMPLATE_KEY = "tokenizer.chat_template"


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson: plain json.dumps (no HTML escaping, unlike jinja2's own filter)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str):
    """The compiled template (templates are looked up once per file and kept)."""
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlocks(Extension):
        """`{% generation %}...{% endgeneration %}` (assistant masks for training): rendered as its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlocks, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except Exception as e:  # a template the sandbox cannot compile is the file's fault
        raise GGUFError(f"chat template does not compile: {e}") from None


class ChatTemplate:
    """Renders messages into a prompt; `source` None means the hand-written `family` format."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "", family: str | None = None):
        if source is None and family is None:
            raise ParameterError("ChatTemplate needs a Jinja source or a fallback family")
        self.source, self.family = source, family
        self.bos_token, self.eos_token = bos_token, eos_token
        if source is not None:
            _compile(source)  # refuse a broken template at load, not at the first request

    @classmethod
    def from_gguf(cls, gguf, tokenizer, name: str | None = None) -> "ChatTemplate":
        """The file's template (`name` picks `tokenizer.chat_template.<name>`, falling back to the default
        one when the file has no such variant), else the architecture's hand-written format."""
        source = gguf.get(f"{TEMPLATE_KEY}.{name}") if name else None
        source = source or gguf.get(TEMPLATE_KEY)
        bos = tokenizer.tokens[tokenizer.bos_id] if tokenizer.bos_id is not None else ""
        eos = tokenizer.tokens[tokenizer.eos_id] if tokenizer.eos_id is not None else ""
        if isinstance(source, str) and source:
            return cls(source, bos, eos)
        return cls(None, bos, eos, family=detect_template(None, gguf.architecture))

    def render(self, messages: list[dict] | str, add_generation_prompt: bool = True, tools: list | None = None,
               **kwargs) -> str:
        """The prompt text for `messages` (a string is one user message). Extra keywords reach the template
        (e.g. enable_thinking); a template that raises (wrong role order, ...) gives ParameterError."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if self.source is None:
            return format_chat([{"role": m["role"], "content": _text_of(m.get("content"))} for m in messages],
                               self.family, add_generation_prompt)
        from jinja2.exceptions import TemplateError

        try:
            return _compile(self.source).render(messages=messages, tools=tools, bos_token=self.bos_token,
                                                eos_token=self.eos_token, add_generation_prompt=add_generation_prompt,
                                                **kwargs)
        except TemplateError as e:
            raise ParameterError(f"the chat template refused the messages: {e}") from None

    def strip_bos(self, text: str, tokenizer_adds_bos: bool) -> str:
        """The rendered text without its leading BOS when the tokenizer adds one itself (no double BOS)."""
        if tokenizer_adds_bos and self.bos_token and text.startswith(self.bos_token):
            return text[len(self.bos_token):]
        return text


def _text_of(content) -> str:
    """A message's content as text: a string, or OpenAI's list of parts of which the text parts count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))
