"""The FastAPI application: routes that parse, check and stream; the engine does the work. Every failure is
OpenAI's error shape with the right status; an unexpected one is a 500 and the server keeps serving."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from contextlib import asynccontextmanager
from importlib import resources
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from pyggml.serve import anthropic, audio, completions, lora, metrics, native, rerank, responses
from pyggml.serve.access_log import AccessLog
from pyggml.serve.cors import CORS
from pyggml.serve.protocol import APIError, Fields, error_body
from pyggml.serve.state import ServerState, run_blocking

log = logging.getLogger("pyggml.serve")
PUBLIC_PATHS = ("/", "/health", "/v1/health")  # answered without an API key, as llama.cpp's server does (the
                                               # page asks for the key itself)
CHAT_PAGE = resources.files("pyggml.serve") / "static" / "chat.html"


def create_app(state: ServerState, api_key: str | None = None, cors_origins: list[str] | None = None,
               access_log: Callable[[dict], None] | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        if state.loaded is None and state.load_error is None:
            state.start_loading()
        yield
        state.close()

    app = FastAPI(title="pyggml", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    if api_key is not None:
        app.add_middleware(KeyCheck, api_key=api_key)
    app.add_middleware(CORS, origins=cors_origins)  # outside the key check: 401s carry its headers too
    if access_log is not None:  # outermost: refused requests get their line too
        app.add_middleware(AccessLog, write=access_log)
    _add_error_handlers(app, state)
    _add_status_routes(app, state)
    _add_text_routes(app, state)
    _add_other_api_routes(app, state)
    app.include_router(native.routes(state, _json, _disconnect))
    _add_audio_routes(app, state)
    return app


def _add_error_handlers(app: FastAPI, state: ServerState) -> None:
    """Every failure as OpenAI's error shape with its status; an unexpected one a logged 500."""

    @app.exception_handler(APIError)
    async def api_error(request, e: APIError):
        if e.status == 429:  # a client retrying at once waits here (a sleeping coroutine costs nothing)
            await asyncio.sleep(state.limits.refusal_delay_s)
        return _error(e)

    @app.exception_handler(completions.ClientGone)
    async def client_gone(request, e):
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):
        return JSONResponse(error_body(str(e.detail), "invalid_request_error"), e.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, e: RequestValidationError):
        return JSONResponse(error_body(str(e), "invalid_request_error"), 400)

    @app.exception_handler(Exception)
    async def unexpected(request, e: Exception):
        log.exception("unexpected error on %s", request.url.path)
        return JSONResponse(error_body(f"internal error: {type(e).__name__}: {e}", "server_error"), 500)


def _add_status_routes(app: FastAPI, state: ServerState) -> None:
    """The chat page, health, metrics and the model list."""

    @app.get("/")
    async def chat_page():
        return HTMLResponse(CHAT_PAGE.read_text(encoding="utf-8"))

    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        if state.load_error is not None:
            return _error(APIError(f"the model failed to load: {state.load_error}", 500, kind="server_error"))
        if not state.ready:
            return _error(APIError("Loading model", 503, kind="unavailable_error"))
        return {"status": "ok"}

    @app.get("/metrics")
    async def get_metrics():
        return Response(metrics.render(state), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    @app.get("/models")
    async def list_models():
        loaded = state.require("any")
        created = int(time.time())
        data = []
        if loaded.engine is not None:
            data.append({"id": loaded.model_id, "object": "model", "created": created, "owned_by": "pyggml",
                         "meta": {"n_ctx": loaded.model.n_ctx, "n_vocab": loaded.model.n_vocab,
                                  "architecture": loaded.model.architecture,
                                  "modalities": {"vision": loaded.model.vision is not None}}})
        for name in loaded.whisper:
            data.append({"id": name, "object": "model", "created": created, "owned_by": "pyggml",
                         "meta": {"kind": "whisper", "default": name == loaded.whisper_default}})
        return {"object": "list", "data": data}


def _add_text_routes(app: FastAPI, state: ServerState) -> None:
    """OpenAI's chat and text completions, LoRA adapters, embeddings, tokenize and detokenize."""

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat(request: Request):
        state.check_room()  # before the body is even parsed: refusals must cost nothing
        body = await _json(request)
        job = await completions.read_chat(state, body)
        return await lora.gated(state, body, lambda: _generate(state, job, request))

    @app.post("/v1/completions")  # /completions is llama-server's own (pyggml.serve.native)
    async def complete(request: Request):
        state.check_room()  # before the body is even parsed: refusals must cost nothing
        body = await _json(request)
        job = await completions.read_completion(state, body)
        return await lora.gated(state, body, lambda: _generate(state, job, request))

    @app.get("/lora-adapters")
    async def get_lora_adapters():
        return lora.list_adapters(state)

    @app.post("/lora-adapters")
    async def post_lora_adapters(request: Request):
        return lora.set_adapters(state, await _json(request))

    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    async def embeddings(request: Request):
        from pyggml.serve.embeddings import embed

        return await embed(state, await _json(request))

    @app.post("/tokenize")
    async def tokenize(request: Request):
        f = Fields(await _json(request))
        model = state.require().model
        content = f.get("content", str, required=True)
        ids = await run_blocking(lambda: model.tokenize(content, add_special=f.get("add_special", bool, False),
                                                        parse_special=f.get("parse_special", bool, True)))
        if f.get("with_pieces", bool, False):
            return {"tokens": [{"id": i, "piece": _piece(model, i)} for i in ids]}
        return {"tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        f = Fields(await _json(request))
        model = state.require().model
        ids = f.get("tokens", list, required=True)
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < model.n_vocab for t in ids):
            raise APIError(f"'tokens' must be token ids in [0, {model.n_vocab})", param="tokens")
        return {"content": model.detokenize(ids)}


def _add_other_api_routes(app: FastAPI, state: ServerState) -> None:
    """Anthropic's messages (answering in Anthropic's error shape), OpenAI's responses, reranking."""

    @app.post("/v1/messages")
    async def anthropic_messages(request: Request):
        try:
            return await anthropic.messages(state, await _json(request), lambda: _disconnect(request))
        except APIError as e:
            return anthropic.error_response(e)

    @app.post("/v1/messages/count_tokens")
    async def anthropic_count_tokens(request: Request):
        try:
            return await anthropic.count_tokens(state, await _json(request))
        except APIError as e:
            return anthropic.error_response(e)

    @app.post("/v1/responses")
    @app.post("/responses")
    async def openai_responses(request: Request):
        return await responses.create(state, await _json(request), lambda: _disconnect(request))

    @app.post("/v1/responses/input_tokens")
    @app.post("/responses/input_tokens")
    async def openai_responses_input_tokens(request: Request):
        return await responses.input_tokens(state, await _json(request))

    @app.post("/v1/rerank")
    @app.post("/rerank")
    @app.post("/v1/reranking")
    @app.post("/reranking")
    async def rerank_documents(request: Request):
        return await rerank.rerank(state, await _json(request))


def _add_audio_routes(app: FastAPI, state: ServerState) -> None:
    """OpenAI's transcriptions and translations (whisper)."""

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request):
        return await _audio(state, request, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(request: Request):
        return await _audio(state, request, "translate")


class KeyCheck:
    """`Authorization: Bearer KEY` (or `X-Api-Key: KEY`, as llama-server takes too) on every path but /health
    (plain ASGI: a BaseHTTPMiddleware would stand between the routes and the client's disconnect)."""

    def __init__(self, app, api_key: str):
        self.app, self.expected, self.key = app, f"Bearer {api_key}".encode(), api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and scope["path"] not in PUBLIC_PATHS:
            headers = dict(scope["headers"])
            given = headers.get(b"authorization", b"")
            if not (secrets.compare_digest(given, self.expected)
                    or secrets.compare_digest(headers.get(b"x-api-key", b""), self.key)):  # Anthropic's header
                response = _error(APIError("Invalid API key", status=401, kind="authentication_error"))
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def _piece(model, token_id: int):
    """The token's text, or its bytes as a list where they are not whole UTF-8 (as llama.cpp's with_pieces)."""
    raw = model.tokenizer.token_to_piece(token_id, special=True)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


async def _json(request: Request):
    raw = await request.body()
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(f"the request body is not valid JSON: {e}") from None


async def _generate(state: ServerState, job, request: Request):
    model_id = state.require().model_id
    if job.gen.stream:
        return StreamingResponse(await completions.start_stream(state, job, model_id), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        return await completions.complete(state, job, model_id, lambda: _disconnect(request))
    except TimeoutError:
        raise APIError(f"the request ran past its {state.limits.timeout_s:g} s limit", status=504,
                       kind="timeout_error") from None


async def _disconnect(request: Request) -> None:
    """Returns when the client has gone away (the body is read, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0)


async def _audio(state: ServerState, request: Request, task: str):
    try:
        form = await request.form(max_part_size=audio.MAX_UPLOAD)
    except Exception as e:  # a body that is no multipart form (or a broken one)
        raise APIError(f"the request must be multipart/form-data with a 'file': {e}") from None
    try:
        body, media = await audio.transcribe(state, form, task)
    finally:
        await form.close()
    if isinstance(body, dict):
        return JSONResponse(body)
    return PlainTextResponse(body, media_type=media)
