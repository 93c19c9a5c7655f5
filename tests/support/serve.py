"""A `pyggml serve` application on 127.0.0.1 at a free port, in a thread of the test process, stopped on exit;
the tiny random-weight model the server tests load (Gemma 3's first tokens, the file's own Jinja template) and
the server state that loads it."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from gguf import GGUFValueType

from pyggml.serve.state import Limits, Loaded, ServerState
from tests.support.tiny_models import gemma3_vocab, write_llama

TEMPLATES = Path(__file__).resolve().parents[1] / "models" / "data" / "chat_templates"
# The `pyggml serve` processes the ported llama-server tests start take one thread: the suite's two workers hold
# both cores, and a server's parallel loops on two more threads waited on each other's time slices (a ported test
# that takes 1 s alone took 20-64 s in the suite).
SERVER_THREADS = 1


def write_chat_model(path, template: str | None = "gemma3.jinja", n_ctx: int = 256, seed: int = 0):
    """A 2-layer llama with Gemma 3's first 2048 tokens and (unless None) a chat template named from
    tests/models/data/chat_templates."""
    vocab = gemma3_vocab()
    if template is not None:
        vocab.keys["tokenizer.chat_template"] = ((TEMPLATES / template).read_text(), GGUFValueType.STRING, None)
    return write_llama(path, vocab=vocab, n_vocab=vocab.n_tokens, n_embd=64, n_ctx=n_ctx, seed=seed)


class ServerThread:
    """uvicorn serving `app` on a socket bound here (127.0.0.1, a free port) until the with-block ends; entering
    waits until /health answers (and, with wait_ready, until it is no longer 503)."""

    def __init__(self, app, ready_timeout: float = 120.0, wait_ready: bool = True):
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.ready_timeout, self.wait_ready = ready_timeout, wait_ready

    def __enter__(self) -> "ServerThread":
        import httpx

        self.thread.start()
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.base_url + "/health", timeout=5).status_code != 503 or not self.wait_ready:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.__exit__()
        raise TimeoutError(f"the test server did not come up in {self.ready_timeout} s")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def make_state(path, limits: Limits | None = None, n_ctx: int = 256, whisper=None, drafter=None) -> ServerState:
    """A server's state that loads the file with the real engine (and serves `whisper` as tiny.en; `drafter`:
    speculative decoding)."""
    from pyggml.models import load_model
    from pyggml.models.llm.engine import Engine

    limits = limits or Limits()

    def load():
        model = load_model(path, n_ctx=n_ctx)
        loaded = Loaded(model=model, engine=Engine(model, n_slots=limits.parallel, drafter=drafter),
                        model_id="tiny")
        if whisper is not None:
            loaded.whisper, loaded.whisper_default = {"tiny.en": whisper}, "tiny.en"
        return loaded
    return ServerState(load, limits)


FIM_TOKEN_IDS = {"fim_pre": 7, "fim_suf": 8, "fim_mid": 9, "fim_rep": 10, "fim_sep": 11}  # Gemma 3's <unused1..5>


def write_infill_model(path, n_ctx: int = 512):
    """The chat model's vocabulary with fill-in-the-middle tokens named in the metadata
    (tokenizer.ggml.fim_*_token_id), as a coder model's file names them."""
    vocab = gemma3_vocab()
    for kind, token_id in FIM_TOKEN_IDS.items():
        vocab.keys[f"tokenizer.ggml.{kind}_token_id"] = (token_id, GGUFValueType.UINT32, None)
    return write_llama(path, vocab=vocab, n_vocab=vocab.n_tokens, n_embd=64, n_ctx=n_ctx, seed=1)


def default_sigint() -> None:
    """A child's preexec_fn: SIGINT as a terminal delivers it, so that a test's Ctrl-C reaches the command even when
    the suite itself runs as a background job (a shell starts those with SIGINT ignored, the child inherits that,
    and Python then installs no KeyboardInterrupt)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
