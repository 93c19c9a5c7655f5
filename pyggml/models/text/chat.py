"""Chat prompts: the template family is recognised from the GGUF's `tokenizer.chat_template` text
(as llama.cpp's llm_chat_detect_template does) and messages are formatted in it."""

from __future__ import annotations

from pyggml.errors import GGUFError

# Marker found in the Jinja text -> family, checked in order.
_MARKERS = [("<start_of_turn>", "gemma"), ("<|start_header_id|>", "llama3"), ("<|im_start|>", "chatml"),
            ("[INST]", "llama2")]
_DEFAULT_FOR_ARCH = {"gemma3": "gemma", "gemma2": "gemma", "gemma": "gemma", "qwen2": "chatml", "qwen2vl": "chatml"}


def detect_template(template: str | None, architecture: str = "") -> str:
    """The template family; without a template text, the family the architecture is trained with."""
    if template:
        for marker, family in _MARKERS:
            if marker in template:
                return family
        raise GGUFError(f"chat template not recognised (known: {', '.join(f for _, f in _MARKERS)})")
    try:
        return _DEFAULT_FOR_ARCH[architecture]
    except KeyError:
        raise GGUFError(f"the file has no tokenizer.chat_template and architecture '{architecture}' "
                        f"has no default chat format") from None


def format_chat(messages: list[dict], family: str, add_generation_prompt: bool = True) -> str:
    """messages: [{"role": "system"|"user"|"assistant", "content": str}]; BOS is left to the tokenizer."""
    if family == "gemma":
        return _gemma(messages, add_generation_prompt)
    if family == "chatml":
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")
    if family == "llama3":
        text = "".join(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content'].strip()}<|eot_id|>"
                       for m in messages)
        return text + ("<|start_header_id|>assistant<|end_header_id|>\n\n" if add_generation_prompt else "")
    if family == "llama2":
        return _llama2(messages)
    raise GGUFError(f"unknown chat template family '{family}'")


def _gemma(messages: list[dict], add_generation_prompt: bool) -> str:
    """Gemma has no system role: a system message is put before the first user turn's text."""
    system, out = "", []
    for m in messages:
        if m["role"] == "system":
            system += m["content"] + "\n\n"
            continue
        role = "model" if m["role"] == "assistant" else m["role"]
        content = (system + m["content"]) if role == "user" else m["content"]
        system = "" if role == "user" else system
        out.append(f"<start_of_turn>{role}\n{content.strip()}<end_of_turn>\n")
    return "".join(out) + ("<start_of_turn>model\n" if add_generation_prompt else "")


def _llama2(messages: list[dict]) -> str:
    system, out = "", []
    for m in messages:
        if m["role"] == "system":
            system = f"<<SYS>>\n{m['content']}\n<</SYS>>\n\n"
        elif m["role"] == "user":
            out.append(f"[INST] {system}{m['content'].strip()} [/INST]")
            system = ""
        else:
            out.append(f" {m['content'].strip()} </s><s>")
    return "".join(out)
