"""`pyggml serve`: an OpenAI-compatible HTTP server (chat, completions, embeddings, Whisper transcription, a chat
page at /) on the batching engine. The model, its template and the Whisper models load before the port is bound:
a file that cannot load ends the command with one line naming it. Loopback by default; another address without
--api-key gets a warning."""

from __future__ import annotations

import os
import socket
import sys

from pyggml.cli.args import non_negative_int, port, positive_int
from pyggml.cli.model_options import add_model_options, open_model
from pyggml.cli.speculative import add_arguments as add_speculative_arguments
from pyggml.errors import GGMLError

DEFAULT_WHISPER = "tiny.en"
SHUTDOWN_GRACE_S = 5  # after Ctrl-C, running requests get this long to finish, then they are cancelled


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a GGUF model (and Whisper) over OpenAI's HTTP API, with a chat "
                                            "page at /")
    add_model_options(p)
    p.add_argument("--alias", help="the model's id in /v1/models and responses (default: the file's name)")
    p.add_argument("--whisper-model", action="append", default=None,
                   help="Whisper model name (tiny.en, base) or path; repeat for several, the first is the default "
                        "('whisper-1'); default tiny.en where the whisper extra is installed; 'none' for no Whisper")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (loopback only by default)")
    p.add_argument("--port", type=port, default=8080, help="port (0: any free one, printed when ready)")
    p.add_argument("--parallel", "-np", type=positive_int, default=4, help="sequences decoded together")
    p.add_argument("--context-shift", action="store_true",
                   help="generate past a request's share of the context by dropping its oldest tokens (as llama.cpp)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (not on /health)")
    p.add_argument("--cors-origin", action="append", default=None,
                   help="allowed browser origin (repeatable; '*' for any); default: any origin, echoed back with "
                        "credentials, as llama-server")
    p.add_argument("--slot-save-path", help="directory for /slots/{id}?action=save|restore files (default: off)")
    p.add_argument("--model-strict", action="store_true",
                   help="a request's 'model' must name the loaded model (else 404 model_not_found, as OpenAI); "
                        "default: any name is the loaded model, as llama-server")
    p.add_argument("--max-queue", type=non_negative_int, default=64,
                   help="sequences waiting beyond the slots before 429")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a request may take")
    p.add_argument("--log-format", choices=["text", "json"], default="text",
                   help="the access log on stderr, one line per request: text for people, json for machines")
    add_speculative_arguments(p)
    p.set_defaults(run=run)


def check_args(args) -> None:
    from pyggml.errors import ParameterError

    if args.timeout <= 0:
        raise ParameterError(f"--timeout must be > 0, got {args.timeout}")
    if args.slot_save_path is not None and not os.path.isdir(args.slot_save_path):
        raise ParameterError(f"--slot-save-path {args.slot_save_path!r} is not a directory")


def bind_warning(host: str, api_key: str | None) -> str | None:
    from pyggml.backend.rpc.limits import is_loopback

    if is_loopback(host) or api_key:
        return None
    return (f"pyggml serve: warning: listening on {host} without --api-key: anyone who reaches this address can use "
            f"the model")


def load(args):
    """The model, its engine and template, and the Whisper models; GGMLError naming what could not load."""
    from pathlib import Path

    from pyggml.cli.speculative import open_drafter
    from pyggml.models.llm.engine import Engine
    from pyggml.serve.state import Loaded

    try:
        model = open_model(args)
        if model.gguf.get("tokenizer.chat_template"):  # a file's template that does not compile fails here, not
            model.chat_template()                       # at the first request (without one, chat requests get 400s)
        drafter = open_drafter(args, model, args.parallel)
        engine = Engine(model, n_slots=args.parallel, drafter=drafter, context_shift=args.context_shift)
        loaded = Loaded(model=model, engine=engine, model_id=args.alias or Path(model.gguf.path).name)
    except (GGMLError, OSError) as e:
        raise GGMLError(f"cannot load the model: {e}") from None
    loaded.whisper, loaded.whisper_default = load_whispers(args.whisper_model, args.threads)
    return loaded


def load_whispers(names: list[str] | None, n_threads: int | None = None) -> tuple[dict, str | None]:
    """The asked Whisper models; without names the default one if its package is installed, else none."""
    from pyggml.errors import WhisperFileError
    from pyggml.models.whisper.transcribe import load_whisper

    if names == ["none"]:
        return {}, None
    if names is None:
        try:
            return {DEFAULT_WHISPER: load_whisper(DEFAULT_WHISPER, n_threads=n_threads)}, DEFAULT_WHISPER
        except (WhisperFileError, ImportError) as e:
            print(f"pyggml serve: no Whisper model ({e}); /v1/audio is off", file=sys.stderr)
            return {}, None
    models = {}
    for name in names:
        try:
            models[name] = load_whisper(name, n_threads=n_threads)
        except (GGMLError, OSError, ImportError) as e:
            raise GGMLError(f"cannot load the Whisper model: {e}") from None
    return models, names[0]


def bind(host: str, port_number: int) -> socket.socket:
    """A listening socket (so the ready line can give the port that port 0 picked); OSError if taken."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port_number, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise GGMLError(f"cannot listen on {host}:{port_number}: {e.strerror}") from None
    return sock


def url(sock: socket.socket) -> str:
    host, port_number = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port_number}"


def ready_line(address: str, loaded) -> str:
    whisper = ", ".join(loaded.whisper) or "none"
    return (f"pyggml serve: listening on {address} (OpenAI API at /v1, chat page at /; model {loaded.model_id}, "
            f"context {loaded.model.n_ctx}, {loaded.engine.n_slots} slots, Whisper: {whisper}); Ctrl-C stops")


def run(args) -> int:
    import time

    from pyggml.serve.access_log import access_logger
    from pyggml.serve.app import create_app
    from pyggml.serve.state import Limits, ServerState

    check_args(args)
    warning = bind_warning(args.host, args.api_key)
    if warning:
        print(warning, file=sys.stderr)
    print(f"pyggml serve: loading {args.model}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    loaded = load(args)
    print(f"pyggml serve: loaded in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    state = ServerState(lambda: loaded, Limits(parallel=args.parallel, max_queue=args.max_queue,
                                               timeout_s=args.timeout, model_any=not args.model_strict,
                                               slot_save_path=args.slot_save_path))
    state.load()
    sock = bind(args.host, args.port)
    app = create_app(state, api_key=args.api_key, cors_origins=args.cors_origin,
                     access_log=access_logger(args.log_format))
    make_server(app, ready_line(url(sock), loaded)).run(sockets=[sock])
    return 0


def make_server(app, ready: str):
    """uvicorn's server that prints `ready` once it accepts connections and says so when Ctrl-C stops it."""
    import uvicorn

    class _Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if not self.should_exit:
                print(ready, file=sys.stderr, flush=True)

        def handle_exit(self, sig, frame):
            if not self.should_exit:
                print(f"pyggml serve: stopping (running requests get {SHUTDOWN_GRACE_S} s, then are cancelled; "
                      f"Ctrl-C again ends at once)", file=sys.stderr, flush=True)
            super().handle_exit(sig, frame)

    return _Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_GRACE_S))
