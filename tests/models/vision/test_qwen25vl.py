"""Qwen2.5-VL (`qwen2.5vl_merger`): the encoder against the float64 NumPy reference (reference.py) at several image
sizes, smart resizing, the M-RoPE positions of text and image rows, and images through Model.generate, chat content
parts, the batching engine and the server on a random-weight qwen2vl + mmproj pair."""

import base64
import io

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from pyggml.core import GGMLType
from pyggml.errors import GGUFError, ImageError
from pyggml.models import load_model
from pyggml.models.llm.batch import Batch
from pyggml.models.llm.engine import Engine, Request, Token
from pyggml.models.llm.kv_cells import KVCells
from pyggml.models.llm.mrope import mrope_positions
from pyggml.models.vision.encoder import VisionEncoder
from pyggml.models.vision.preprocess import smart_size
from pyggml.testing.synthetic import write_qwen2vl
from pyggml.testing.synthetic_vision import QWEN_IMAGE_TOKENS, TINY_QWEN25VL, vision_vocab, write_qwen25vl_mmproj

from tests.models.vision.reference import encode_qwen25vl, read_mmproj

Image = pytest.importorskip("PIL.Image", reason="images need Pillow (the vision extra)")


def png(width: int, height: int, seed: int = 0) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen25vl")
    return (write_qwen2vl(d / "lm.gguf", vocab=vision_vocab(QWEN_IMAGE_TOKENS), n_ctx=256),
            write_qwen25vl_mmproj(d / "mm.gguf", **TINY_QWEN25VL))


@pytest.mark.parametrize("flash_attn", [False, True], ids=["plain", "flash"])
@pytest.mark.parametrize("qtype", [None, Q.F16, Q.Q8_0], ids=["f32", "f16", "q8_0"])
def test_encoder_matches_the_numpy_reference(tmp_path, qtype, flash_attn):
    path = write_qwen25vl_mmproj(tmp_path / "mm.gguf", **TINY_QWEN25VL, qtype=qtype)
    encoder = VisionEncoder(path, flash_attn=flash_attn)
    meta, tensors = read_mmproj(path)
    # 5 x 4 tokens: two attention windows across (4 tokens wide), then a square image (one graph per size)
    for height, width in ((112, 140), (56, 56)):
        pixels = np.random.default_rng(width).normal(size=(3, height, width)).astype(np.float32)
        got = encoder.encode(pixels)
        want = encode_qwen25vl(meta, tensors, pixels.astype(np.float64))
        assert got.shape == want.shape == (height * width // 28 ** 2, 64)
        # ggml's gelu reads an F16 table, flash attention F16 keys and values, quantized weights Q8_0 activations
        bound = 3e-2 if qtype is not None else 1e-2 if flash_attn else 2e-3
        assert np.abs(got - want).max() / np.abs(want).max() < bound
    if qtype is not None:  # the matrices stay in the file's type
        assert encoder.weights.tensors["v.blk.0.ffn_gate.weight"].type == GGMLType(int(qtype))


def test_window_attention_keeps_other_windows_apart(tmp_path):
    """10 x 1 tokens are windows of 4, 4 and 2 tokens: a change in the last token's patches reaches only its own
    window while every layer attends within windows, and every token without windows."""
    pixels = np.random.default_rng(0).normal(size=(3, 28, 280)).astype(np.float32)
    changed = pixels.copy()
    changed[:, :, 252:] += 1  # the last token's patches
    for n_wa_pattern, moved in ((3, [8, 9]), (0, list(range(10)))):  # 2 layers: 3 windows both, 0 neither
        path = write_qwen25vl_mmproj(tmp_path / f"mm{n_wa_pattern}.gguf",
                                     **{**TINY_QWEN25VL, "n_wa_pattern": n_wa_pattern})
        encoder = VisionEncoder(path, flash_attn=False)
        diff = np.abs(encoder.encode(pixels) - encoder.encode(changed)).max(axis=1)
        assert np.flatnonzero(diff > 0).tolist() == moved


def test_smart_resize_and_refusals(files):
    h = VisionEncoder(files[1]).hparams
    assert smart_size(150, 100, h) == (140, 112)
    assert smart_size(10, 10, h) == (84, 84)            # up to at least 8 tokens (3 x 3)
    w, ht = smart_size(4000, 3000, h)                     # down to at most 4096 tokens
    assert w % 28 == ht % 28 == 0 and (w // 28) * (ht // 28) <= 4096 and abs(w / ht - 4 / 3) < 0.02
    with pytest.raises(ImageError, match="multiples of 28"):
        VisionEncoder(files[1]).encode(np.zeros((3, 30, 28), np.float32))
    with pytest.raises(GGUFError, match="n_wa_pattern"):
        VisionEncoder(write_qwen25vl_mmproj(files[1].parent / "bad.gguf", **TINY_QWEN25VL,
                                            drop=("clip.vision.n_wa_pattern",)))


def test_mrope_positions_of_text_and_image_rows():
    cells = KVCells(64)
    text = Batch.sequence([1, 2, 3], 0)
    pos, nxt = mrope_positions(cells, text)
    assert pos.tolist() == [[0, 1, 2]] * 4
    cells.apply(np.arange(3), [0, 1, 2], [(0,)] * 3)
    cells.rope_next[:3] = nxt
    image = Batch.embeddings(np.zeros((6, 4), np.float32), 3)
    image.grid = (3, 2)                                   # 3 columns, 2 rows
    pos, nxt = mrope_positions(cells, image)
    assert pos.tolist() == [[3] * 6, [3, 3, 3, 4, 4, 4], [3, 4, 5, 3, 4, 5], [0] * 6]
    cells.apply(np.arange(3, 9), range(3, 9), [(0,)] * 6)
    cells.rope_next[3:9] = nxt
    pos, _ = mrope_positions(cells, Batch.sequence([4, 5], 9))
    assert pos.tolist() == [[6, 7]] * 4                   # the image took max(3, 2) positions


def test_generate_with_an_image_through_chat_parts_and_the_engine(files):
    model = load_model(files[0], n_ctx=256, mmproj=files[1])
    prompt = model.image_prompt("a <__media__> b", [png(150, 100)])
    assert prompt.n_image_tokens == 20 and prompt.chunks[1].grid == (5, 4)
    assert model.tokenizer.decode(prompt.chunks[0][-1:]) == "<|vision_start|>"
    want = model.generate("what <__media__> is", images=[png(150, 100)], n=5)
    assert len(want) > 0
    split = load_model(files[0], n_ctx=256, n_batch=8, mmproj=files[1])  # the image's 20 rows in three steps
    assert split.generate("what <__media__> is", images=[png(150, 100)], n=5) == want
    url = "data:image/png;base64," + base64.b64encode(png(150, 100)).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "what is it"}]}]
    assert len(model.generate(messages, chat=True, n=3)) > 0
    with Engine(model, n_slots=2) as engine:  # what the server runs: the same M-RoPE positions per slot
        for _ in range(2):
            ids, images = model.image_prompt("what <__media__> is", [png(150, 100)]).engine_prompt()
            events = list(engine.submit(Request(ids, max_tokens=5, images=images)))
            assert "".join(e.text for e in events if isinstance(e, Token)) == want


def test_the_server_answers_an_image_url_as_generate_does(files):
    from tests.models.vision.test_server_images import chat, data_url, image_message, serve  # needs httpx

    url = data_url(150, 100)
    want = load_model(files[0], n_ctx=256, mmproj=files[1]).generate(image_message(url), chat=True, n=4)
    with serve(*files) as srv:
        r = chat(srv, image_message(url))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == want
