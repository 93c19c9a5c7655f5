"""`pyggml serve` as a user starts it: a process on 127.0.0.1 that loads the file, answers the openai client and
stops on SIGTERM; argument checks before anything loads; the warning for a non-loopback address without a key;
`pyggml generate --chat` through the file's own template."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
from pyggml.cli.main import main
from pyggml.cli.serve import bind_warning
from tests.support.serve import write_chat_model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_process_answers_and_stops(tmp_path):
    path = write_chat_model(tmp_path / "tiny.gguf")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pyggml.cli.main", "serve", "--model", str(path),
                             "--port", str(port), "--ctx", "256", "--parallel", "2", "--whisper-model", "none",
                             "--alias", "tiny"],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
        assert r.model == "tiny" and r.usage.completion_tokens >= 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn shuts down, then re-raises the signal
    assert f"listening on http://127.0.0.1:{port} " in proc.stderr.read()


def test_bad_arguments_fail_before_loading(capsys):
    assert main(["serve", "--timeout", "0"]) == 2
    assert "--timeout" in capsys.readouterr().err


def test_warns_only_off_loopback_without_a_key():
    assert bind_warning("127.0.0.1", None) is None and bind_warning("localhost", None) is None
    assert bind_warning("::1", None) is None and bind_warning("0.0.0.0", "key") is None
    assert "without --api-key" in bind_warning("0.0.0.0", None)


def test_generate_chat_uses_the_file_template(tmp_path, capsys):
    path = write_chat_model(tmp_path / "tiny.gguf")
    assert main(["generate", "Hi", "--model", str(path), "--chat", "-n", "3", "--ctx", "64"]) == 0
    assert capsys.readouterr().out.startswith("Hi")
