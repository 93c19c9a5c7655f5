"""Regenerates chat_refs.json: the templates here rendered by llama-cpp-python's Jinja2ChatFormatter (the peer,
which follows Hugging Face's rendering), for the conversations in CASES. Run from the repository root:
    python -m tests.models.data.chat_templates.make_refs"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & \"today\"",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CASES = [
    ("gemma3.jinja", {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
                                   {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Why?"}]}),
    ("gemma3.jinja", {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]}),
    ("hermes_tools.jinja", {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS}),
    ("hermes_tools.jinja", {"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "c1"}], "tools": TOOLS}),
    ("hermes_tools.jinja", {"messages": [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi"}]}),
    ("llama3_date.jinja", {"messages": [{"role": "system", "content": " S "}, {"role": "user", "content": "Hi"}],
                           "date_string": "04 Dec 2026"}),
]


def main():
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    refs = []
    for name, kwargs in CASES:
        formatter = Jinja2ChatFormatter((HERE / name).read_text(), eos_token="<eos>", bos_token="<bos>")
        refs.append({"template": name, "kwargs": kwargs, "prompt": formatter(**kwargs).prompt})
    (HERE / "chat_refs.json").write_text(json.dumps(refs, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
