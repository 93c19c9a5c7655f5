"""llama-server's LoRA endpoints and per-request adapters: GET /lora-adapters lists the loaded adapters with their
scales, POST /lora-adapters sets the server's scales ([{"id", "scale"}]; adapters left out get 0), and a
completion's `lora` field ([{"id", "scale"}], the others 0) replaces them for that request alone.

The engine steps every running request in one graph, so requests run under one set of scales at a time, as
llama-server batches no two configurations together: a request whose scales differ from those of the requests
running waits until they are done, then the scales change (on the engine thread, between steps) and it starts.
"""

from __future__ import annotations

import asyncio

from fastapi.responses import StreamingResponse

from pyggml.serve.protocol import APIError
from pyggml.serve.state import ServerState


class LoraGate:
    """The server's scales (POST /lora-adapters), the scales the model runs with and how many requests use them."""

    def __init__(self, scales: tuple[float, ...]):
        self.default = self.current = scales
        self.running = 0
        self.cond = asyncio.Condition()

    async def enter(self, state: ServerState, scales: tuple[float, ...] | None) -> None:
        """Wait until the model may run with `scales` (None: the server's), switch to them, count this request."""
        async with self.cond:
            want = self.default if scales is None else scales
            await self.cond.wait_for(lambda: self.running == 0 or want == self.current)
            if want != self.current:
                engine = state.require().engine
                await asyncio.wrap_future(engine.call(lambda model: switch(engine, model, want)))
                self.current = want
            self.running += 1

    async def leave(self) -> None:
        async with self.cond:
            self.running -= 1
            self.cond.notify_all()


def switch(engine, model, scales: tuple[float, ...]) -> None:
    """On the engine thread, no request running: the new scales, and the idle slots' cached prefixes forgotten
    (their keys and values were computed under the old ones)."""
    model.set_lora_scales(dict(enumerate(scales)))
    for slot in engine.slots:
        if slot.handle is None and slot.cached:
            model.seq_rm(slot.seq_id)
            slot.cached = []


def gate(state: ServerState) -> LoraGate:
    """The state's gate, made on first use from the scales the model was loaded with."""
    if getattr(state, "lora_gate", None) is None:
        state.lora_gate = LoraGate(tuple(state.require().model.loras.scales))
    return state.lora_gate


def read_scales(state: ServerState, entries, param: str) -> tuple[float, ...]:
    """[{"id": i, "scale": s}, ...] as one scale per loaded adapter (0 for those not listed)."""
    n = len(state.require().model.loras.adapters)
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise APIError(f"'{param}' must be an array of objects with 'id' and 'scale' fields", param=param)
    scales = [0.0] * n
    for i, entry in enumerate(entries):
        lid, scale = entry.get("id"), entry.get("scale", 0.0)
        if isinstance(lid, bool) or not isinstance(lid, int) or not 0 <= lid < n:
            raise APIError(f"'{param}[{i}].id' must be the id of one of the {n} loaded LoRA adapters, got {lid!r}",
                           param=f"{param}[{i}].id")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale != scale:
            raise APIError(f"'{param}[{i}].scale' must be a number, got {scale!r}", param=f"{param}[{i}].scale")
        scales[lid] = float(scale)
    return tuple(scales)


def list_adapters(state: ServerState) -> list[dict]:
    """GET /lora-adapters: the server's scales (those a request without `lora` runs with)."""
    loras = state.require().model.loras
    return [{"id": i, "path": a.path, "scale": s} for i, (a, s) in enumerate(zip(loras.adapters, gate(state).default,
                                                                                  strict=True))]


def set_adapters(state: ServerState, body) -> dict:
    """POST /lora-adapters: the scales for the requests that come without `lora`."""
    gate(state).default = read_scales(state, body, "lora")
    return {"success": True}


async def gated(state: ServerState, body, generate):
    """The response of `generate()` run under the request's scales (its `lora` field, else the server's); a
    stream holds them until it ends."""
    given = isinstance(body, dict) and body.get("lora") is not None
    scales = read_scales(state, body["lora"], "lora") if given else None
    g = gate(state)
    await g.enter(state, scales)
    try:
        response = await generate()
    except BaseException:
        await g.leave()
        raise
    if not isinstance(response, StreamingResponse):
        await g.leave()
        return response
    body_iterator = response.body_iterator

    async def held():
        try:
            async for chunk in body_iterator:
                yield chunk
        finally:
            await g.leave()

    response.body_iterator = held()
    return response
