"""One access-log line per request, as llama-server and nginx print them: method, path, status, the prompt and
generated tokens, milliseconds. The tokens are counted by the generation routes into a per-request context
variable (plain ASGI middleware: the route runs in the request's context, a stream's body in a copy of it that
shares the same counter)."""

from __future__ import annotations

import json
import sys
import time
from contextvars import ContextVar
from typing import Callable

_tokens: ContextVar[list | None] = ContextVar("pyggml_serve_tokens", default=None)


def count_tokens(prompt: int, generated: int) -> None:
    """Add a finished sequence's tokens to the current request's line (no-op outside a logged request)."""
    counter = _tokens.get()
    if counter is not None:
        counter[0] += prompt
        counter[1] += generated


class AccessLog:
    """Calls `write(record)` once per HTTP request when its response has been sent (or the request failed)."""

    def __init__(self, app, write: Callable[[dict], None]):
        self.app, self.write = app, write

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status, counter = time.perf_counter(), [500], [0, 0]
        _tokens.set(counter)

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            client = scope.get("client") or ("-", 0)
            self.write({"client": client[0], "method": scope["method"], "path": scope["path"], "status": status[0],
                        "prompt_tokens": counter[0], "completion_tokens": counter[1],
                        "ms": round((time.perf_counter() - start) * 1000, 1)})


def access_logger(log_format: str) -> Callable[[dict], None]:
    """A writer of records to stderr: "text" for people, "json" (one object a line) for machines."""
    def text(r: dict) -> None:
        print(f"{r['client']} {r['method']} {r['path']} {r['status']} prompt {r['prompt_tokens']} generated "
              f"{r['completion_tokens']} tokens {r['ms']:.0f} ms", file=sys.stderr, flush=True)

    def as_json(r: dict) -> None:
        print(json.dumps(r), file=sys.stderr, flush=True)

    return as_json if log_format == "json" else text
