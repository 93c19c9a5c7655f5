"""Images through the batching engine (what the server runs) and the generate command: the same text as
Model.generate, image cells never reused for another image nor drafted from, and --image refusals."""

import io

import numpy as np
import pytest

from pyggml.cli.main import main
from pyggml.models import load_model
from pyggml.models.llm.engine import Engine, Request, Token
from pyggml.models.llm.speculative import NgramDrafter
from pyggml.testing.synthetic import write_gemma3
from pyggml.testing.synthetic_vision import TINY_GEMMA3, vision_vocab, write_mmproj

Image = pytest.importorskip("PIL.Image", reason="images need Pillow (the vision extra)")


def png(seed: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (30, 40, 3), np.uint8)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision-engine")
    return write_gemma3(d / "lm.gguf", vocab=vision_vocab(), n_ctx=256, n_layer=2), write_mmproj(d / "mm.gguf",
                                                                                                 **TINY_GEMMA3)


def test_engine_requests_with_images_give_generate_s_text(files):
    model = load_model(files[0], n_ctx=256, mmproj=files[1])
    wants = [model.generate("what <__media__> is", images=[png(seed)], n=5) for seed in (0, 1)]
    with Engine(model, n_slots=2) as engine:
        for seed, want in [(0, wants[0]), (1, wants[1]), (0, wants[0])]:  # the second image follows the first
            ids, images = model.image_prompt("what <__media__> is", [png(seed)]).engine_prompt()
            events = list(engine.submit(Request(ids, max_tokens=5, images=images,
                                                causal_images=model.vision.causal)))
            assert "".join(e.text for e in events if isinstance(e, Token)) == want
            assert events[-1].cached_tokens <= images[0][0]  # its slot last held another image: not past it
    with Engine(model, n_slots=1, drafter=NgramDrafter()) as engine:  # image cells hold nothing to draft from
        ids, images = model.image_prompt("what <__media__> is", [png(0)]).engine_prompt()
        events = list(engine.submit(Request(ids, max_tokens=5, images=images, causal_images=model.vision.causal)))
        assert "".join(e.text for e in events if isinstance(e, Token)) == wants[0]
        assert engine.stats().draft_tokens == 0


def test_generate_command_with_an_image(files, tmp_path, capsys):
    (tmp_path / "cat.png").write_bytes(png(0))
    lm, mmproj = map(str, files)
    assert main(["generate", "what", "-m", lm, "--mmproj", mmproj, "--image", str(tmp_path / "cat.png"), "-n", "3",
                 "--ctx", "256"]) == 0
    assert main(["generate", "what", "-m", lm, "--image", str(tmp_path / "cat.png")]) == 2
    assert "--image needs the model's vision projector" in capsys.readouterr().err
    assert main(["generate", "what", "-m", lm, "--mmproj", mmproj, "--image", str(tmp_path / "cat.png"),
                 "--spec-type", "ngram"]) == 2
    assert "--image does not combine with speculative decoding" in capsys.readouterr().err
    (tmp_path / "bad.png").write_bytes(b"not a png")
    assert main(["generate", "what", "-m", lm, "--mmproj", mmproj, "--image", str(tmp_path / "bad.png"),
                 "--ctx", "256"]) == 2
    assert "not a decodable image" in capsys.readouterr().err
