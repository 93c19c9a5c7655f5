"""Jinja chat templates rendered as Hugging Face renders them: against llama-cpp-python's renderer (committed
references), the hand-written Gemma format, HF's extras (tojson without escaping, raise_exception, strftime_now,
loop controls, generation blocks) and the sandbox; the Model picks the file's template or its named variant."""

import json
from datetime import datetime
from pathlib import Path

import pytest

from pyggml.errors import GGUFError, ParameterError
from pyggml.models import load_model
from pyggml.models.text.chat import format_chat
from pyggml.models.text.chat_template import ChatTemplate
from tests.support.serve import write_chat_model
from tests.support.tiny_models import gemma3_vocab, write_gemma3

TEMPLATES = Path(__file__).resolve().parent / "data" / "chat_templates"
REFS = json.loads((TEMPLATES / "chat_refs.json").read_text())


@pytest.mark.parametrize("ref", REFS, ids=lambda r: r["template"])
def test_renders_as_the_peer_renderer(ref):
    template = ChatTemplate((TEMPLATES / ref["template"]).read_text(), bos_token="<bos>", eos_token="<eos>")
    assert template.render(**ref["kwargs"]) == ref["prompt"]


def test_gemma_jinja_matches_the_hand_written_gemma_format():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Why?"}]
    jinja = ChatTemplate((TEMPLATES / "gemma3.jinja").read_text(), bos_token="<bos>")
    assert jinja.render(messages) == "<bos>" + format_chat(messages, "gemma")
    assert jinja.strip_bos(jinja.render(messages), tokenizer_adds_bos=True) == format_chat(messages, "gemma")
    assert jinja.render(messages, add_generation_prompt=False).endswith("Why?<end_of_turn>\n")


def test_hugging_face_extras():
    t = ChatTemplate("{{ tools | tojson }}|{{ strftime_now('%Y') }}|{% for m in messages %}{% if loop.index > 1 %}"
                     "{% break %}{% endif %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}|{{ extra }}")
    out = t.render([{"role": "user", "content": "a<b>"}, {"role": "user", "content": "never"}],
                   tools=[{"name": "é<&>"}], extra="kw")
    assert out == f'[{{"name": "é<&>"}}]|{datetime.now().year}|a<b>|kw'


def test_trim_and_lstrip_blocks():
    t = ChatTemplate("{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}")
    assert t.render([{"role": "user", "content": "x"}]) == "x\n"


def test_template_errors():
    t = ChatTemplate((TEMPLATES / "gemma3.jinja").read_text())
    with pytest.raises(ParameterError, match="roles must alternate"):
        t.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(GGUFError, match="does not compile"):
        ChatTemplate("{% for %}")
    with pytest.raises(ParameterError):  # the sandbox: no attribute escapes, no mutation of the messages
        ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}").render("x")
    with pytest.raises(ParameterError):
        ChatTemplate("{% set _ = messages.append(1) %}").render("x")


def test_model_uses_the_file_template_its_tool_variant_and_the_fallback(tmp_path):
    model = load_model(write_chat_model(tmp_path / "g.gguf"), n_ctx=64)
    assert model.chat_prompt("Hi") == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"  # no 2nd BOS
    assert model.tokenize(model.chat_prompt("Hi"), parse_special=True)[:2] == [2, 105]  # <bos> <start_of_turn>
    plain = load_model(write_gemma3(tmp_path / "p.gguf", vocab=gemma3_vocab(), n_vocab=2048, n_layer=1), n_ctx=64)
    assert plain.chat_template().source is None and plain.chat_template().family == "gemma"
    assert plain.chat_prompt("Hi") == model.chat_prompt("Hi")
    tool = ChatTemplate.from_gguf(_WithVariant(model.gguf), model.tokenizer, "tool_use")
    assert tool.source == "TOOLS {{ tools | length }}"
    assert tool.render("x", tools=[1, 2]) == "TOOLS 2"


class _WithVariant:
    """The model's file with a `tokenizer.chat_template.tool_use` variant added."""

    def __init__(self, gguf):
        self.gguf, self.architecture = gguf, gguf.architecture

    def get(self, key, default=None):
        if key == "tokenizer.chat_template.tool_use":
            return "TOOLS {{ tools | length }}"
        return self.gguf.get(key, default)
