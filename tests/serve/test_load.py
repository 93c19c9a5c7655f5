"""Load: 64 streaming clients at once for a bounded time, some hanging up mid-stream and some cancelling
before the first token, against a server with fewer slots and a short queue (so some get 429). Afterwards
every request is accounted for on both sides, no sequence holds a cell it should not, and RSS is back near
where it started. The figures are printed (pytest -s) for the notes."""

import asyncio
import json
import random
import resource
import time

import httpx
import pytest

from pyggml.serve.app import create_app
from pyggml.serve.state import Limits
from tests.support.serve import ServerThread, make_state

CLIENTS, SECONDS, PER_CLIENT = 64, 5.0, 4  # each client sends up to PER_CLIENT requests within SECONDS
WARM_UP = 8  # concurrent requests first, so that the batch shapes' kernels and graphs exist before RSS is read
RSS_GROWTH_LIMIT = 96 * 1024 * 1024  # graphs of new batch shapes and allocator pools, not per-request state


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


async def _client(base_url: str, seed: int, deadline: float, tally: dict):
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        for k in range(PER_CLIENT):
            if time.monotonic() > deadline:
                return
            body = {"messages": [{"role": "user", "content": f"client {seed} request {k} " * rng.randint(1, 6)}],
                    "max_tokens": rng.randint(4, 16), "stream": True, "temperature": 0.7, "seed": seed * 100 + k}
            mode = rng.choices(["read", "hang_up", "cancel"], [0.7, 0.2, 0.1])[0]
            tally["sent"] += 1
            try:
                async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    if r.status_code == 429:
                        tally["429"] += 1
                        assert r.headers["retry-after"]
                        await asyncio.sleep(float(r.headers["retry-after"]) * rng.random())
                        continue
                    assert r.status_code == 200, await r.aread()
                    if mode == "cancel":
                        tally["cancelled_by_client"] += 1
                        continue                 # closes before reading anything
                    lines = [line async for line in _take(r.aiter_lines(), 3 if mode == "hang_up" else None)]
                    if mode == "hang_up":
                        tally["hung_up"] += 1
                        continue
                    data = [line[6:] for line in lines if line.startswith("data: ")]
                    assert data[-1] == "[DONE]" and json.loads(data[-2])["choices"][0]["finish_reason"] in (
                        "stop", "length"), data[-3:]
                    tally["completed"] += 1
            except httpx.TransportError as e:  # the server must not drop a connection it accepted
                tally["transport_errors"] += 1
                tally["errors"].append(repr(e))


async def _warm_up(base_url: str):
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        rs = await asyncio.gather(*[http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "warm up " * (i + 1)}], "max_tokens": 16})
            for i in range(WARM_UP)])
    assert all(r.status_code == 200 for r in rs)


async def _take(lines, n):
    i = 0
    async for line in lines:
        yield line
        i += 1
        if n is not None and i >= n:
            return


@pytest.mark.timeout(300)
def test_64_streaming_clients_with_disconnects(model_path):
    state = make_state(model_path, Limits(parallel=4, max_queue=12), n_ctx=512)
    with ServerThread(create_app(state)) as srv:
        asyncio.run(_warm_up(srv.base_url))
        rss_before = _rss()
        tally = {"sent": 0, "429": 0, "completed": 0, "hung_up": 0, "cancelled_by_client": 0, "transport_errors": 0,
                 "errors": []}
        start = time.monotonic()

        async def main():
            deadline = time.monotonic() + SECONDS
            await asyncio.gather(*[_client(srv.base_url, i, deadline, tally) for i in range(CLIENTS)])
        asyncio.run(main())
        elapsed = time.monotonic() - start
        engine = state.loaded.engine
        deadline = time.monotonic() + 60  # the engine drops a cancelled sequence at its next step
        while (state.in_flight or engine.stats().slots_busy) and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = engine.stats()
        leaks = engine.call(_cells_not_explained_by_slots).result(30)
        rss_after = _rss()
        metrics = httpx.get(srv.base_url + "/metrics").text
    out = state.outcomes
    print(f"\nload: {tally['sent']} requests from {CLIENTS} clients in {elapsed:.1f} s: {tally['completed']} read to "
          f"the end, {tally['hung_up']} hung up, {tally['cancelled_by_client']} cancelled, {tally['429']} got 429; "
          f"server outcomes {dict(out)}; {stats.gen_tokens} tokens generated "
          f"({stats.gen_tokens / elapsed:.0f}/s); cells in use {stats.kv_cells_used}/{stats.kv_cells_total}; "
          f"RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB")
    assert tally["transport_errors"] == 0, tally["errors"][:3]
    assert tally["sent"] == tally["429"] + tally["completed"] + tally["hung_up"] + tally["cancelled_by_client"]
    assert out["rejected"] == tally["429"] and out["accepted"] == tally["sent"] - tally["429"] + WARM_UP
    ends = sum(n for k, n in out.items() if k not in ("accepted", "rejected"))
    assert ends == out["accepted"] and state.in_flight == 0          # every accepted request ended, once
    assert out["completed"] >= tally["completed"] + WARM_UP
    assert out.get("error", 0) == 0 and out.get("timeout", 0) == 0
    assert stats.slots_busy == 0 and stats.queued == 0
    assert leaks == 0                                               # no cell outside the slots' kept prefixes
    assert rss_after - rss_before < RSS_GROWTH_LIMIT
    assert 'llamacpp:requests_in_flight 0.0' in metrics


def _cells_not_explained_by_slots(model) -> int:
    """On the engine thread: cells in use that no slot's kept tokens account for (a leak), and slots whose
    sequence holds another number of cells than the tokens they keep."""
    engine_slots = _engine_of(model).slots
    cells = model.cells
    used = int((cells.seq.sum(axis=1) > 0).sum())
    kept = set()
    bad = 0
    for slot in engine_slots:
        mine = cells.seq[:, slot.seq_id]
        bad += int(mine.sum()) != len(slot.cached)
        kept |= set(map(int, mine.nonzero()[0]))
    return bad + used - len(kept)


def _engine_of(model):
    import gc

    from pyggml.models.llm.engine import Engine
    return next(o for o in gc.get_referrers(model) if isinstance(o, Engine))
