"""A resent image, as OpenAI clients resend a conversation's images every turn: the engine reuses its KV cells when
the cached sequence holds the same image at the same position after the same tokens (llama-server's common prefix
over image chunks by id), answering as a fresh run does; the encoder runs once per image while it stays in the
bounded cache of encoded images; a different image, or rows of no known image, are read afresh."""

import io

import numpy as np
import pytest

from pyggml.errors import ParameterError
from pyggml.models import load_model
from pyggml.models.llm.batch import common_prefix
from pyggml.models.llm.cached_prefix import prompt_cells
from pyggml.models.llm.engine import Engine, Request, Token
from pyggml.models.vision.image_cache import EncodedImage, ImageCache, image_identity
from tests.models.vision.cases import CASES, TEXT, counting_encodes

Image = pytest.importorskip("PIL.Image", reason="images need Pillow (the vision extra)")

REUSE_CASES = [c for c in CASES if c.name in ("gemma3-f32", "idefics3-f32", "qwen25vl-f32")]


GEMMA3 = next(c for c in REUSE_CASES if c.name == "gemma3-f32")


def written(case, tmp_path_factory):
    return case, case.write(tmp_path_factory.mktemp(case.name))


@pytest.fixture(scope="module", params=REUSE_CASES, ids=lambda c: c.name)
def case_files(request, tmp_path_factory):
    return written(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=[c for c in REUSE_CASES if not c.name.startswith("qwen")], ids=lambda c: c.name)
def gridless_case_files(request, tmp_path_factory):
    """The projectors whose rows can go to the engine as bare arrays (Qwen's M-RoPE rows need their grid)."""
    return written(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def gemma3_files(tmp_path_factory):
    """One projector, for what is the same for all (the slot file, an option)."""
    return written(GEMMA3, tmp_path_factory)


def other_image(size: tuple) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(7).integers(0, 256, (size[1], size[0], 3), np.uint8)).save(out, "PNG")
    return out.getvalue()


def run(engine, model, text: str, image: bytes, **kw):
    ids, images = model.image_prompt(text, [image]).engine_prompt()
    events = list(engine.submit(Request(ids, max_tokens=4, images=images, causal_images=model.vision.causal,
                                        n_probs=3, **kw)))
    return ids, images, [e for e in events if isinstance(e, Token)], events[-1]


def assert_same_answer(got: list, want: list) -> None:
    assert [t.id for t in got] == [t.id for t in want]
    np.testing.assert_allclose([t.logprob for t in got], [t.logprob for t in want], atol=1e-4)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose([lp for _, lp in g.top], [lp for _, lp in w.top], atol=1e-4)


def test_a_resent_image_reuses_its_cells_and_is_not_encoded_again(case_files, monkeypatch):
    case, (lm, mmproj) = case_files
    model = load_model(lm, n_ctx=256, mmproj=mmproj)
    image, follow_up = case.image(), TEXT + " again"
    runs = counting_encodes(model, monkeypatch)
    want = model.generate(follow_up, images=[image], n=4)
    n_tiles = len(runs)
    with Engine(model, n_slots=1) as engine:
        _, _, fresh, _ = run(engine, model, follow_up, image, cache_prompt=False)
        first_ids, first_images, _, _ = run(engine, model, TEXT, image)
        read_before = engine.stats().prompt_tokens
        ids, images, tokens, done = run(engine, model, follow_up, image)
        read = engine.stats().prompt_tokens - read_before
    assert len(runs) == n_tiles  # encoded once, by the first prompt that held it
    image_end = max(pos + len(rows) for pos, rows in images)
    shared = common_prefix(prompt_cells(ids, images), prompt_cells(first_ids, first_images))
    assert done.cached_tokens >= shared > image_end  # through the image (and maybe an answer's token or two)
    assert done.prompt_tokens == len(ids) and read == len(ids) - done.cached_tokens  # only the rest decoded
    assert "".join(t.text for t in tokens) == want
    assert_same_answer(tokens, fresh)


def test_a_different_image_at_the_same_position_is_read_afresh(case_files, monkeypatch):
    case, (lm, mmproj) = case_files
    model = load_model(lm, n_ctx=256, mmproj=mmproj)
    first, second = case.image(), other_image(case.image_size)
    want = model.generate(TEXT, images=[second], n=4)
    model.vision.cache = ImageCache()  # forgotten: the engine's request encodes it again
    runs = counting_encodes(model, monkeypatch)
    with Engine(model, n_slots=1) as engine:
        run(engine, model, TEXT, first)
        n_first = len(runs)
        _, images, tokens, done = run(engine, model, TEXT, second)
        _, _, fresh, _ = run(engine, model, TEXT, second, cache_prompt=False)
    assert len(runs) == 2 * n_first  # the second image is encoded (same size: as many tiles)
    assert done.cached_tokens == images[0][0]  # the tokens before the image, not its cells
    assert "".join(t.text for t in tokens) == want
    assert_same_answer(tokens, fresh)


def test_rows_of_no_known_image_are_never_reused(gridless_case_files):
    case, (lm, mmproj) = gridless_case_files
    model = load_model(lm, n_ctx=256, mmproj=mmproj)
    ids, images = model.image_prompt(TEXT, [case.image()]).engine_prompt()
    plain = [(pos, np.asarray(rows)) for pos, rows in images]  # bare arrays: no identity
    with Engine(model, n_slots=1) as engine:
        for _ in range(2):  # the second finds the first's cells
            events = list(engine.submit(Request(ids, max_tokens=2, images=plain, causal_images=model.vision.causal)))
        assert events[-1].cached_tokens == plain[0][0]
        bad = images[0][1].copy()
        bad.identity = 5  # a token's id
        with pytest.raises(ParameterError, match="identity 5"):
            engine.submit(Request(ids, max_tokens=2, images=[(images[0][0], bad)] + images[1:]))


def test_the_cache_of_encoded_images_is_bounded(case_files, monkeypatch):
    case, (lm, mmproj) = case_files
    model = load_model(lm, n_ctx=256, mmproj=mmproj, image_cache=0)  # keeps none
    a, b = case.image(), other_image(case.image_size)
    runs = counting_encodes(model, monkeypatch)
    size = model.vision.encode_image(a).nbytes
    model.vision.encode_image(a)
    n = len(runs) // 2
    assert n > 0 and len(runs) == 2 * n and len(model.vision.cache) == 0
    model.vision.cache = ImageCache(max_bytes=size)  # room for one image
    model.vision.encode_image(a)
    model.vision.encode_image(a)
    model.vision.encode_image(b)  # drops a
    model.vision.encode_image(a)
    assert len(runs) == 5 * n and len(model.vision.cache) == 1 and model.vision.cache.nbytes == size


def test_image_cache_drops_the_least_recently_used():
    def image(n: int) -> EncodedImage:
        return EncodedImage([np.zeros((n, 4), np.float32)], (0, 0))

    with pytest.raises(ParameterError, match="image cache's size"):
        ImageCache(-1)
    cache = ImageCache(max_bytes=3 * 16)
    for key in (b"a", b"b", b"c"):
        cache.put(key, image(1))
    assert cache.get(b"a") is not None  # a is now the most recent
    cache.put(b"d", image(1))
    assert cache.get(b"b") is None and all(cache.get(k) is not None for k in (b"a", b"c", b"d"))
    cache.put(b"e", image(2))  # needs two images' room
    assert len(cache) == 2 and cache.nbytes == 3 * 16 and cache.get(b"e") is not None
    cache.put(b"big", image(4))  # larger than the whole cache: not kept, nothing dropped
    assert cache.get(b"big") is None and len(cache) == 2
    kept = cache.get(b"e").chunks[0]
    with pytest.raises(ValueError):
        kept[0, 0] = 1.0  # shared by every prompt that holds the image


def test_image_identity_is_the_sha256_of_the_bytes():
    import hashlib

    data = b"\x89PNG..."
    assert image_identity(data) == hashlib.sha256(data).digest()
    pixels = Image.fromarray(np.zeros((2, 3, 3), np.uint8))
    assert image_identity(pixels) == image_identity(pixels.copy()) != image_identity(pixels.convert("L"))


def test_a_restored_slot_s_image_cells_match_no_prompt(gemma3_files, tmp_path):
    case, (lm, mmproj) = gemma3_files
    model = load_model(lm, n_ctx=256, mmproj=mmproj)
    with Engine(model, n_slots=1) as engine:
        _, images, _, _ = run(engine, model, TEXT, case.image())
        n = engine.save_slot(0, tmp_path / "s.npz").result()
        assert engine.restore_slot(0, tmp_path / "s.npz").result() == n
        _, _, _, done = run(engine, model, TEXT, case.image())
    assert done.cached_tokens == images[0][0]  # the saved file keeps no identity: the image is read afresh


def test_the_image_cache_option_and_each_encoder_s_own_identities(gemma3_files, capsys):
    import argparse

    from pyggml.cli.model_options import add_model_options, open_model

    case, (lm, mmproj) = gemma3_files
    p = argparse.ArgumentParser()
    add_model_options(p)
    model = open_model(p.parse_args(["-m", str(lm), "--ctx", "256", "--mmproj", str(mmproj), "--image-cache", "3"]))
    assert model.vision.cache.max_bytes == 3 << 20
    again = load_model(lm, n_ctx=256, mmproj=mmproj)  # another encoder: its cells are its own
    assert (model.vision.encode_image(case.image()).chunks[0].identity
            != again.vision.encode_image(case.image()).chunks[0].identity)
    with pytest.raises(SystemExit):
        p.parse_args(["--image-cache", "-1"])
    assert "must be an integer >= 0" in capsys.readouterr().err
