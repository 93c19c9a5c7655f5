"""llama-server's LoRA endpoints on pyggml serve: GET/POST /lora-adapters and a completion's `lora` field give the
greedy text of the model loaded with the adapter at those scales."""

import asyncio

import httpx
import pytest

from pyggml.models import load_model
from pyggml.models.llm.engine import Engine
from pyggml.serve.app import create_app
from pyggml.serve.state import Limits, Loaded, ServerState
from pyggml.testing.synthetic import write_lora

from tests.support.serve import ServerThread, write_chat_model

PROMPT = [2, 651, 1037, 576, 1081, 603]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lora")
    base = write_chat_model(tmp / "tiny.gguf")
    return base, write_lora(tmp / "lora.gguf", base, rank=4, alpha=4.0, std=2.0, seed=5)


@pytest.fixture(scope="module")
def server(files):
    base, adapter = files

    def load():
        model = load_model(base, n_ctx=64, lora=[(adapter, 1.0)])
        return Loaded(model=model, engine=Engine(model, n_slots=2), model_id="tiny")

    with ServerThread(create_app(ServerState(load, Limits(parallel=2)))) as srv:
        yield srv


@pytest.fixture(scope="module")
def expected(files):
    """The greedy continuation of PROMPT by the model loaded with the adapter at each scale."""
    base, adapter = files
    out = {}
    for scale in (0.0, 1.0, 0.5):
        model = load_model(base, n_ctx=64, lora=[(adapter, scale)])
        out[scale] = model.detokenize(list(model.generate_tokens(PROMPT, 6)))
    assert len(set(out.values())) == 3, out   # the scales give different texts
    return out


def _complete(server, **extra):
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                                                              **extra}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_the_loaded_scales_list_and_apply(server, files, expected):
    r = httpx.get(server.base_url + "/lora-adapters")
    assert r.json() == [{"id": 0, "path": str(files[1]), "scale": 1.0}]
    assert _complete(server) == expected[1.0]


def test_post_sets_the_scales_and_a_request_field_overrides_them(server, expected):
    try:
        r = httpx.post(server.base_url + "/lora-adapters", json=[])   # left out: scale 0
        assert r.status_code == 200 and r.json() == {"success": True}
        assert httpx.get(server.base_url + "/lora-adapters").json()[0]["scale"] == 0.0
        assert _complete(server) == expected[0.0]
        assert _complete(server, lora=[{"id": 0, "scale": 0.5}]) == expected[0.5]
        assert _complete(server) == expected[0.0]
    finally:
        httpx.post(server.base_url + "/lora-adapters", json=[{"id": 0, "scale": 1.0}])


def test_concurrent_requests_with_different_scales_each_get_their_own(server, expected):
    async def run():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            bodies = [{"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "lora": [{"id": 0, "scale": scale}]}
                      for scale in (0.0, 1.0, 0.5, 1.0)]
            return await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))

    texts = [r.json()["choices"][0]["text"] for r in asyncio.run(run())]
    assert texts == [expected[0.0], expected[1.0], expected[0.5], expected[1.0]]


def test_a_stream_holds_its_scales_to_the_end(server, expected):
    with httpx.stream("POST", server.base_url + "/v1/completions", timeout=60,
                      json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": True,
                            "lora": [{"id": 0, "scale": 0.5}]}) as r:
        text = "".join(line for line in r.iter_lines() if line)
    assert r.status_code == 200 and "[DONE]" in text
    assert _complete(server) == expected[1.0]


@pytest.mark.parametrize("lora, param", [
    ([{"id": 1, "scale": 1.0}], "lora[0].id"),
    ([{"id": 0, "scale": "big"}], "lora[0].scale"),
    ({"id": 0}, "lora"),
])
def test_bad_lora_fields_are_400_naming_them(server, lora, param):
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "lora": lora})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    r = httpx.post(server.base_url + "/lora-adapters", json=lora)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
