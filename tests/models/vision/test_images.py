"""Images from bytes to prompts: decoding and its refusals, the tiles of each projector, data URLs in chat content,
embedding rows fed to the language model in place of tokens, and the model-level refusals."""

import base64
import io

import numpy as np
import pytest

from pyggml.errors import ImageError
from pyggml.models import load_model
from pyggml.models.vision.content import data_url_bytes, split_image_parts
from pyggml.models.vision.mmproj import read_hparams
from pyggml.models.vision.preprocess import decode_image, preprocess
from pyggml.models.vision.prompt import MEDIA_MARKER
from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.testing.synthetic import write_gemma3, write_gpt2, write_llama
from pyggml.testing.synthetic_vision import TINY_GEMMA3, TINY_IDEFICS3, vision_vocab, write_mmproj

Image = pytest.importorskip("PIL.Image", reason="images need Pillow (the vision extra)")


def png(width: int, height: int, value: int = 200) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), value, np.uint8)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vision")
    return dict(llama=write_llama(d / "llama.gguf", vocab=vision_vocab(), n_ctx=256),
                gemma3=write_gemma3(d / "gemma3.gguf", vocab=vision_vocab(), n_ctx=256, n_layer=2),
                idefics3=write_mmproj(d / "idefics3.gguf", **TINY_IDEFICS3),
                gemma3_proj=write_mmproj(d / "gemma3_proj.gguf", **TINY_GEMMA3),
                narrow=write_mmproj(d / "narrow.gguf", **{**TINY_IDEFICS3, "projection_dim": 32}))


def hparams(path):
    with GGUFFile.open(path) as f:
        return read_hparams(f)


def test_idefics3_cuts_a_grid_of_tiles_and_a_global_image(files):
    tiles = preprocess(decode_image(png(80, 60)), hparams(files["idefics3"]))
    assert tiles.grid == (2, 2) and len(tiles.tiles) == 4 and tiles.overview.shape == (3, 32, 32)
    assert np.allclose(tiles.tiles[0], (200 / 255 - 0.5) / 0.5, atol=1e-6)  # (pixel / 255 - mean) / std


def test_gemma3_keeps_the_aspect_and_pads_with_black(files):
    tiles = preprocess(decode_image(png(40, 20)), hparams(files["gemma3_proj"]))
    (tile,) = tiles.tiles
    assert tile.shape == (3, 32, 32) and tiles.overview is None
    assert np.allclose(tile[:, 0], -1) and np.allclose(tile[:, 16], (200 / 255 - 0.5) / 0.5, atol=1e-6)


def test_undecodable_and_oversized_images_are_refused():
    with pytest.raises(ImageError, match="not a decodable image"):
        decode_image(b"GIF89a but not really")
    with pytest.raises(ImageError, match="larger than the limit"):
        decode_image(png(64, 64), max_pixels=1000)


def test_only_base64_data_urls_are_taken():
    data = png(4, 4)
    assert data_url_bytes("data:image/png;base64," + base64.b64encode(data).decode()) == data
    for url, message in (("https://example.com/cat.png", "remote URLs are not fetched"),
                         ("data:image/png,rawbytes", "base64"), ("data:image/png;base64,@@@", "not valid base64")):
        with pytest.raises(ImageError, match=message):
            data_url_bytes(url)


def test_image_parts_become_markers_in_order():
    url = "data:image/png;base64," + base64.b64encode(b"abc").decode()
    messages = [{"role": "user", "content": [{"type": "text", "text": "see"},
                                             {"type": "image_url", "image_url": {"url": url}}]}]
    out, images = split_image_parts(messages)
    assert images == [b"abc"] and out[0]["content"][1] == {"type": "text", "text": MEDIA_MARKER}


@pytest.mark.parametrize("arch, scale", [("llama", 1.0), ("gemma3", 8.0)])  # gemma3 scales token rows by sqrt(64)
def test_embedding_rows_decode_as_their_tokens_do(files, arch, scale):
    model = load_model(files[arch], n_ctx=64, kv_type="F32")
    ids = [3, 5, 7, 9]
    want = model.decode(ids, all_logits=True)
    rows = np.asarray(model.weights.file_bytes(model.arch.tok_embd).view(np.float32)).reshape(-1, 64)[ids] * scale
    model.reset()
    assert np.allclose(model.decode_embeddings(rows, all_logits=True), want, atol=1e-4)


def test_generate_with_an_image_and_through_chat_content_parts(files):
    model = load_model(files["gemma3"], n_ctx=256, mmproj=files["gemma3_proj"])
    assert len(model.generate("what", images=[png(40, 30)], n=3)) > 0
    url = "data:image/png;base64," + base64.b64encode(png(40, 30)).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "what is it"}]}]
    assert len(model.generate(messages, chat=True, n=3)) > 0
    prompt = model.image_prompt("a <__media__> b", [png(40, 30)])
    assert prompt.n_image_tokens == 4 and len(prompt) == len(prompt.text_tokens) + 4


def test_model_level_refusals(files):
    text_only = load_model(files["llama"], n_ctx=256)
    with pytest.raises(ImageError, match="this model has no vision"):
        text_only.generate("x", images=[png(8, 8)])
    with pytest.raises(ImageError, match="32 wide but the language model's are 64"):
        load_model(files["llama"], n_ctx=256, mmproj=files["narrow"])
    with pytest.raises(ImageError, match="pyggml's gpt2 does not take image embeddings"):
        load_model(write_gpt2(files["llama"].parent / "gpt2.gguf"), n_ctx=64, mmproj=files["idefics3"])
    model = load_model(files["llama"], n_ctx=256, mmproj=files["idefics3"])
    with pytest.raises(ImageError, match="2 image markers"):
        model.image_prompt("<__media__><__media__>", [png(8, 8)])
