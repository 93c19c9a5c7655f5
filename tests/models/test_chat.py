"""Chat templates: family detection from the Jinja text and the formatted prompts."""

import pytest

from pyggml.errors import GGUFError
from pyggml.models.text.chat import detect_template, format_chat

GEMMA_JINJA = "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ role }}\n{{ message['content'] }}"


def test_detects_families_from_template_text_and_architecture():
    assert detect_template(GEMMA_JINJA) == "gemma"
    assert detect_template("{% for m in messages %}<|im_start|>{{ m.role }}") == "chatml"
    assert detect_template("<|start_header_id|>{{ role }}<|end_header_id|>") == "llama3"
    assert detect_template(None, "gemma3") == "gemma"


def test_unknown_templates_are_refused():
    with pytest.raises(GGUFError, match="not recognised"):
        detect_template("{{ messages }}")
    with pytest.raises(GGUFError, match="no default chat format"):
        detect_template(None, "gpt2")


def test_gemma_format_merges_the_system_prompt_into_the_first_user_turn():
    text = format_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Why?"}], "gemma")
    assert text == ("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
                    "<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n")


def test_chatml_format():
    assert format_chat([{"role": "user", "content": "Hi"}], "chatml") == \
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
