"""The README's example must run as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(capsys):
    block = re.search(r"## Example\n\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    exec(compile(block, "README example", "exec"), {})
    shape, size, lower_bound = capsys.readouterr().out.strip().rsplit(" ", 2)
    assert shape == "(8, 32)" and int(size) >= int(lower_bound) > 0


def test_readme_has_the_setup_commands():
    text = README.read_text()
    commands = re.findall(r"```sh\n(.*?)\n```", text, re.S)
    assert len(commands) == 3
    assert "pyggml generate" in commands[0] and "pytest" in commands[1] and "pyggml transcribe" in commands[2]
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[1] in ci
