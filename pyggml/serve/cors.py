"""CORS as llama-server does it: every response names the request's Origin as allowed (with credentials) when
the origin is allowed (any, by default), and an OPTIONS request is answered here with the methods and headers
allowed, before any key check (browsers send no Authorization with a preflight)."""

from __future__ import annotations

METHODS = b"GET, POST, DELETE, OPTIONS"


class CORS:
    """Plain ASGI, outermost, so that errors (401 included) carry the headers too; `origins` None allows any."""

    def __init__(self, app, origins: list[str] | None = None):
        self.app = app
        self.any = origins is None or "*" in origins
        self.origins = {o.encode() for o in origins or ()}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        origin = dict(scope["headers"]).get(b"origin")
        allowed = [(b"access-control-allow-origin", origin)] if origin and (self.any or origin in self.origins) else []
        if scope["method"] == "OPTIONS":
            headers = allowed + [(b"access-control-allow-credentials", b"true"),
                                 (b"access-control-allow-methods", METHODS), (b"access-control-allow-headers", b"*"),
                                 (b"content-length", b"0")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            return await send({"type": "http.response.body", "body": b""})

        async def send_with_headers(message):
            if message["type"] == "http.response.start" and allowed:
                message = {**message, "headers": [*message.get("headers", []), *allowed,
                                                  (b"access-control-allow-credentials", b"true")]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
