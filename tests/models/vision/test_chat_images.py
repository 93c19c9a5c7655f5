"""Images in a conversation: `pyggml chat`'s /image PATH keeps the image in the history as an OpenAI image_url part,
the answers match a fresh run over the same history, a later turn neither encodes the image again nor reads it
again (the KV cache is reused through it), and a model without a projector says so instead of failing."""

import builtins
import io

import numpy as np
import pytest

from pyggml.cli.main import main
from pyggml.models import load_model
from pyggml.models.llm.batch import common_prefix
from pyggml.models.llm.conversation import Conversation
from pyggml.models.vision.content import data_url_bytes, image_data_url
from pyggml.testing.synthetic import write_gemma3
from pyggml.testing.synthetic_vision import TINY_GEMMA3, vision_vocab, write_mmproj
from tests.models.vision.cases import counting_encodes

Image = pytest.importorskip("PIL.Image", reason="images need Pillow (the vision extra)")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision-chat")
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 40, 3), np.uint8)).save(out, format="PNG")
    (d / "cat.png").write_bytes(out.getvalue())
    return (write_gemma3(d / "lm.gguf", vocab=vision_vocab(), n_ctx=256, n_layer=2),
            write_mmproj(d / "mm.gguf", **TINY_GEMMA3), d / "cat.png")


def test_a_conversation_with_an_image_answers_as_a_fresh_run(files, monkeypatch):
    lm, mmproj, image = files
    model = load_model(lm, n_ctx=256, mmproj=mmproj)
    encoded = counting_encodes(model, monkeypatch)
    url = image_data_url(image)
    assert url.startswith("data:image/png;base64,") and data_url_bytes(url) == image.read_bytes()
    conv = Conversation(model, reply_room=6)
    first = "".join(conv.reply("what is it", [url]))
    assert conv.turns[0]["content"][1] == {"type": "image_url", "image_url": {"url": url}}
    assert first == model.generate(conv.messages[:1], chat=True, n=6)
    model.reset()
    conv.cached = []
    "".join(conv.reply("what is it", [url]))  # from an empty cache, so the next turn can reuse a prefix
    history = [dict(t) for t in conv.turns]
    before = list(conv.cached)
    second = "".join(conv.reply("and now?"))
    assert len(encoded) == 1  # the first turn encoded the image; every later render found it in the cache
    n_prompt = len(conv.cached) - conv.last["gen_tokens"]
    kept = n_prompt - conv.last["prompt_tokens"]
    image_end = max(i for i, t in enumerate(conv.cached) if t < 0) + 1
    assert kept == common_prefix(before, conv.cached[:n_prompt]) > image_end  # through the image

    fresh = Conversation(model, reply_room=6)
    fresh.turns = history
    model.reset()
    assert "".join(fresh.reply("and now?")) == second
    assert fresh.last["prompt_tokens"] == n_prompt  # nothing cached: the whole history read


def test_the_image_command(files, monkeypatch, capsys):
    lm, mmproj, image = files
    lines = iter(["/image", f"/image {image}", "what is it", "/image missing.png", "/exit"])
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(lines))
    assert main(["chat", "-m", str(lm), "--mmproj", str(mmproj), "--ctx", "256", "-n", "4", "--temp", "0"]) == 0
    err = capsys.readouterr().err
    assert "/image needs a file" in err and f"image {image} goes with the next message" in err
    assert "missing.png: cannot read the image" in err

    lines = iter([f"/image {image}", "/exit"])
    assert main(["chat", "-m", str(lm), "--ctx", "256", "-n", "4"]) == 0
    assert "this model has no vision: start pyggml chat with --mmproj FILE" in capsys.readouterr().err
