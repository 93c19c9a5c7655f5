"""The server's chat completions with OpenAI image_url parts: base64 data URLs answered as Model.generate answers
them with the image tokens counted in usage (as cached ones when a later turn resends the image); remote URLs,
undecodable images and images sent to a server without --mmproj are 400s in OpenAI's error shape, and the server
keeps serving; /v1/models says whether the model sees images."""

import base64
import io

import numpy as np
import pytest

from pyggml.models import load_model
from pyggml.models.llm.engine import Engine
from pyggml.serve.app import create_app
from pyggml.serve.state import Limits, Loaded, ServerState
from pyggml.testing.synthetic import write_gemma3
from pyggml.testing.synthetic_vision import TINY_GEMMA3, vision_vocab, write_mmproj
from tests.support.serve import ServerThread

Image = pytest.importorskip("PIL.Image", reason="images need Pillow (the vision extra)")
httpx = pytest.importorskip("httpx")


def data_url(width=40, height=30) -> str:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (height, width, 3), np.uint8)).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def image_message(url: str) -> list:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "what is it"}]}]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision-serve")
    return write_gemma3(d / "lm.gguf", vocab=vision_vocab(), n_ctx=256, n_layer=2), write_mmproj(d / "mm.gguf",
                                                                                                 **TINY_GEMMA3)


def serve(lm, mmproj):
    def load():
        model = load_model(lm, n_ctx=256, mmproj=mmproj)
        return Loaded(model=model, engine=Engine(model, n_slots=2), model_id="tiny")
    return ServerThread(create_app(ServerState(load, Limits())))


def chat(srv, messages, **kw):
    return httpx.post(srv.base_url + "/v1/chat/completions", timeout=120,
                      json={"messages": messages, "max_tokens": 4, "temperature": 0, **kw})


def test_images_in_chat_content_and_their_refusals(files):
    lm, mmproj = files
    url = data_url()
    want = load_model(lm, n_ctx=256, mmproj=mmproj)
    text = want.generate(image_message(url), chat=True, n=4)
    prompt = want.image_prompt(want.chat_prompt("<__media__>what is it"), [base64.b64decode(url[22:])])
    n_prompt, (image_pos, image) = len(prompt), prompt.engine_prompt()[1][0]
    with serve(lm, mmproj) as srv:
        meta = httpx.get(srv.base_url + "/v1/models").json()["data"][0]["meta"]
        assert meta["modalities"] == {"vision": True}  # what the chat page shows its image button by
        ok = chat(srv, image_message(url))
        assert ok.status_code == 200, ok.text
        body = ok.json()
        assert body["choices"][0]["message"]["content"] == text
        assert body["usage"]["prompt_tokens"] == n_prompt
        # the next turn resends the image: its cells are reused, and counted as cached
        turn = image_message(url) + [{"role": "assistant", "content": text}, {"role": "user", "content": "and now?"}]
        again = chat(srv, turn)
        assert again.status_code == 200, again.text
        usage, timings = again.json()["usage"], again.json()["timings"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == timings["cache_n"] > image_pos + len(image)
        assert timings["prompt_n"] == usage["prompt_tokens"] - timings["cache_n"]
        for bad, message in (("https://example.com/cat.png", "remote URLs are not fetched"),
                             ("data:image/png;base64," + base64.b64encode(b"not an image").decode(),
                              "not a decodable image")):
            r = chat(srv, image_message(bad))
            assert r.status_code == 400 and message in r.json()["error"]["message"]
            assert r.json()["error"]["type"] == "invalid_request_error"
        assert chat(srv, [{"role": "user", "content": "hello"}]).status_code == 200


def test_a_server_without_mmproj_refuses_images(files):
    lm, _ = files
    with serve(lm, None) as srv:
        assert httpx.get(srv.base_url + "/v1/models").json()["data"][0]["meta"]["modalities"] == {"vision": False}
        r = chat(srv, image_message(data_url()))
        assert r.status_code == 400
        assert "this model has no vision (start the server with --mmproj)" in r.json()["error"]["message"]
