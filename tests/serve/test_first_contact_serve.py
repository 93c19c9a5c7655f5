"""`pyggml serve` as a process tells the truth: a file that cannot load ends it with one line before the port is
bound; when ready it prints its address, model, context and slots; one access-log line per request (text or
JSON); Ctrl-C while a stream runs ends it cleanly and in bounded time."""

import contextlib
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.support.serve import default_sigint, write_chat_model

ENV = {**os.environ, "PYTHONPATH": os.getcwd()}


def serve(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pyggml.cli.main", "serve", *args], stderr=subprocess.PIPE,
                            text=True, env=ENV, preexec_fn=default_sigint)


def lines_of(proc) -> queue.Queue:
    """stderr's lines as they come (a thread reads them, so the pipe never fills)."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.rstrip("\n")) for line in proc.stderr], daemon=True).start()
    return lines


def wait_for(lines: queue.Queue, fragment: str, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if fragment in line:
            return line
    raise AssertionError(f"no line with {fragment!r} in {timeout} s; stderr so far: {seen}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_chat_model(tmp_path_factory.mktemp("first") / "tiny.gguf")


@pytest.mark.parametrize("model, whisper, named", [
    ("/no/such.gguf", "none", "/no/such.gguf: cannot open: No such file or directory"),
    ("TEXT", "none", "magic at offset 0"),
    ("TINY", "small", "cannot load the Whisper model: small:"),
])
def test_a_file_that_cannot_load_ends_serve_with_one_line(tmp_path, tiny, model, whisper, named):
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    model = {"TEXT": str(text), "TINY": str(tiny)}.get(model, model)
    proc = serve("--model", model, "--whisper-model", whisper, "--port", "0", "--ctx", "64")
    err = proc.communicate(timeout=120)[1]
    errors = [line for line in err.splitlines() if "error" in line]
    assert proc.returncode != 0 and len(errors) == 1 and named in errors[0], err
    assert errors[0].startswith("pyggml serve: error: cannot load") and "listening" not in err


def test_ready_line_access_log_and_ctrl_c_during_a_stream(tiny):
    proc = serve("--model", str(tiny), "--whisper-model", "none", "--port", "0", "--ctx", "256", "--parallel", "2",
                 "--log-format", "json")
    lines = lines_of(proc)
    try:
        ready = wait_for(lines, "listening on")
        assert "context 256" in ready and "2 slots" in ready and "tiny.gguf" in ready
        base = ready.split("listening on ")[1].split()[0]
        assert base.startswith("http://127.0.0.1:")
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        assert httpx.post(base + "/v1/chat/completions", json=body, timeout=60).status_code == 200
        record = json.loads(wait_for(lines, '"path": "/v1/chat/completions"'))
        assert record["method"] == "POST" and record["status"] == 200 and record["prompt_tokens"] > 0
        assert 1 <= record["completion_tokens"] <= 4 and record["ms"] > 0
        httpx.get(base + "/v1/nothing", timeout=10)
        assert json.loads(wait_for(lines, '"path": "/v1/nothing"'))["status"] == 404

        chunks = []   # a stream that is running when Ctrl-C comes
        started = threading.Event()

        def stream():
            try:
                with httpx.stream("POST", base + "/v1/chat/completions", timeout=60,
                                  json={**body, "max_tokens": 200, "stream": True, "temperature": 1.0}) as r:
                    for line in r.iter_lines():
                        chunks.append(line)
                        started.set()
            except httpx.HTTPError:
                pass
            started.set()
        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        assert proc.wait(30) == 130
        assert time.monotonic() - start < 20
        reader.join(10)
        assert not reader.is_alive() and chunks
        wait_for(lines, "pyggml serve: interrupted", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_text_access_log_line(tiny):
    from pyggml.serve.access_log import access_logger

    record = {"client": "127.0.0.1", "method": "POST", "path": "/v1/completions", "status": 200, "prompt_tokens": 5,
              "completion_tokens": 7, "ms": 12.3}
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        access_logger("text")(record)
    assert err.getvalue() == "127.0.0.1 POST /v1/completions 200 prompt 5 generated 7 tokens 12 ms\n"
