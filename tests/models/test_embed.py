"""Model.embed (pyggml.models.llm.embed) and the bert / nomic-bert encoders: agreement with llama.cpp's embeddings
(committed references, and the live library as `peer`), pooling and normalization semantics, inputs, errors,
and that embedding leaves a decoder's generation state alone."""

import json
from pathlib import Path

import numpy as np
import pytest

from pyggml.backend import tensor_get
from pyggml.errors import GGMLError, GGUFError, ParameterError
from pyggml.models import load_model
from pyggml.models.llm.embed import batches, normalize
from pyggml.testing.synthetic import write_bert, write_nomic_bert

from tests.support.embedding_cases import BY_NAME, CASES, N_CTX, TEXTS, bge_vocab, write_case
from tests.support.gguf_rewrite import rewrite
from tests.support.parity_cases import sha256
from tests.support.tiny_models import write_llama

DATA = Path(__file__).parent / "data"
SUMMARY = json.loads((DATA / "llamacpp_embeddings.json").read_text())


@pytest.fixture(scope="module")
def refs():
    with np.load(DATA / "llamacpp_embeddings.npz") as f:
        return dict(f)


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def pyggml_embeddings(case, path, texts) -> np.ndarray:
    model = load_model(path, n_ctx=N_CTX)
    rows = model.embed(texts, pooling=None if case.from_file else case.pooling, normalize=-1)
    return np.concatenate(rows) if case.pooling == "none" else rows


def check_rows(case, reference, got) -> None:
    assert got.shape == reference.shape and got.dtype == np.float32
    if case.pooling == "rank":  # scores: compared as numbers, not as directions
        worst = np.abs(got - reference).max() / np.abs(reference).max()
        assert worst <= case.score_tolerance, f"{case.name}: scores {got.tolist()}, llama.cpp's {reference.tolist()}"
        return
    worst = cosines(reference, got).min()
    assert worst >= case.min_cosine, f"{case.name}: least cosine similarity {worst:.8f}"


def test_cases_cover_encoders_decoders_poolings_and_quantized_weights():
    names = " ".join(c.name for c in CASES)
    for part in ("bert", "nomic-bert", "llama", "qwen2", "qwen3", "gemma3", "gpt2", "mean", "cls", "last", "none",
                 "rank", "q8_0"):
        assert part in names
    assert SUMMARY["texts"] == TEXTS and sorted(SUMMARY["cases"]) == sorted(c.name for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_embeddings_agree_with_committed_llamacpp_embeddings(tmp_path, refs, case):
    path = write_case(case, tmp_path)
    assert sha256(path) == SUMMARY["cases"][case.name]["sha256"], (
        f"{case.name}: the file differs from the one llama.cpp ran on; rerun make_embedding_refs.py")
    model = load_model(path, n_ctx=N_CTX)
    assert np.concatenate([model.tokenize(t) for t in TEXTS]).tolist() == refs[f"{case.name}/tokens"].tolist()
    check_rows(case, refs[f"{case.name}/embeddings"], pyggml_embeddings(case, path, TEXTS))


@pytest.mark.peer
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_embeddings_agree_with_live_llamacpp(tmp_path, case):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from pyggml.testing.llamacpp import llamacpp_embeddings

    path = write_case(case, tmp_path)
    _, rows = llamacpp_embeddings(path, TEXTS, case.pooling, n_ctx=N_CTX)
    check_rows(case, np.concatenate(rows) if case.pooling == "none" else np.stack(rows),
               pyggml_embeddings(case, path, TEXTS))


@pytest.mark.peer
def test_l2_normalized_embeddings_agree_with_llamacpp_normalize_true(tmp_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from pyggml.testing.llamacpp import llamacpp_embeddings

    path = write_case(BY_NAME["bert-q8_0-mean"], tmp_path)
    _, reference = llamacpp_embeddings(path, TEXTS, "mean", n_ctx=N_CTX, normalize=True)
    assert np.abs(load_model(path, n_ctx=N_CTX).embed(TEXTS) - np.stack(reference)).max() < 1e-4


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return load_model(write_bert(tmp_path_factory.mktemp("bert") / "bert.gguf", n_ctx=32, pooling="mean"), n_ctx=64,
                      n_batch=8)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load_model(write_llama(tmp_path_factory.mktemp("llama") / "llama.gguf", n_ctx=64), n_ctx=64, n_batch=8)


@pytest.mark.parametrize("which", ["bert", "llama"])
def test_pooled_rows_are_the_mean_first_and_last_of_the_token_rows(request, which):
    model = request.getfixturevalue(which)
    texts = [[1, 5, 9, 12, 7], [1, 30], [3]]
    tokens = model.embed(texts, pooling="none", normalize=-1)
    assert [t.shape for t in tokens] == [(5, model.arch.n_embd), (2, model.arch.n_embd), (1, model.arch.n_embd)]
    for pooling, pick in (("mean", lambda r: r.mean(0)), ("cls", lambda r: r[0]), ("last", lambda r: r[-1])):
        pooled = model.embed(texts, pooling=pooling, normalize=-1)
        np.testing.assert_allclose(pooled, np.stack([pick(r) for r in tokens]), rtol=1e-5, atol=1e-5)


def test_a_decoder_attends_causally_and_an_encoder_both_ways(bert, llama):
    for model, causal in ((bert, False), (llama, True)):
        short, longer = (model.embed([ids], pooling="none", normalize=-1)[0] for ids in ([1, 5, 9], [1, 5, 9, 12]))
        same = np.allclose(short, longer[:3], rtol=1e-5, atol=1e-5)
        assert same == causal  # a later token changes an encoder's earlier rows, never a decoder's


@pytest.mark.parametrize("which", ["bert", "llama"])
def test_texts_embedded_together_or_alone_and_in_any_batching_give_the_same_rows(request, which):
    model = request.getfixturevalue(which)
    texts = [[1, 5, 9, 12, 7, 8, 3], [1, 30], [1, 4, 4, 4], [2]]
    together = model.embed(texts, pooling="mean")
    alone = np.concatenate([model.embed([t], pooling="mean") for t in texts])
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-6)
    assert batches([len(t) for t in texts], 8) == [[0], [1, 2, 3]]  # two graphs: n_batch is 8


def test_inputs_can_be_a_string_strings_token_ids_or_token_id_lists(bert):
    ids = bert.tokenize("the a")
    one = bert.embed("the a")
    assert one.shape == (1, bert.arch.n_embd) and one.dtype == np.float32
    np.testing.assert_array_equal(bert.embed(ids), one)
    np.testing.assert_array_equal(bert.embed(np.array(ids)), one)
    np.testing.assert_allclose(bert.embed(["the a", ids]), np.concatenate([one, one]), rtol=1e-5, atol=1e-6)
    assert abs(np.linalg.norm(one) - 1) < 1e-6    # normalize=2 by default, as llama.cpp's --embd-normalize


def test_the_default_pooling_is_the_files_or_none_without_one(tmp_path, llama):
    nomic = load_model(write_nomic_bert(tmp_path / "nomic.gguf", pooling="last"), n_ctx=32)
    np.testing.assert_array_equal(nomic.embed([[1, 5, 9]]), nomic.embed([[1, 5, 9]], pooling="last"))
    rows = llama.embed([[1, 5, 9]])
    assert isinstance(rows, list) and rows[0].shape == (3, llama.arch.n_embd)


def common_embd_normalize(row: np.ndarray, norm: int) -> np.ndarray:
    """llama.cpp's common/common.cpp, element by element."""
    if norm == -1:
        total = 1.0
    elif norm == 0:
        total = max(abs(float(v)) for v in row) / 32760.0
    elif norm == 2:
        total = sum(float(v) * float(v) for v in row) ** 0.5
    else:
        total = sum(abs(float(v)) ** norm for v in row) ** (1.0 / norm)
    scale = 1.0 / total if total > 0 else 0.0
    return np.array([v * scale for v in row], np.float32)


@pytest.mark.parametrize("norm", [-1, 0, 1, 2, 3, 6])
def test_normalize_is_llamacpps_common_embd_normalize(norm):
    rows = np.random.default_rng(norm + 1).normal(0, 2, (3, 40)).astype(np.float32)
    rows[2] = 0
    got = normalize(rows, norm)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.stack([common_embd_normalize(r, norm) for r in rows]), rtol=1e-6, atol=1e-7)


def test_embedding_leaves_the_kv_cache_and_generation_alone(llama):
    prompt, more = [1, 5, 9, 12, 7, 8, 3, 4, 20, 21], [30, 31]
    llama.reset()
    llama.decode(prompt)
    expected = llama.decode(more, all_logits=True)
    llama.reset()
    llama.decode(prompt)
    cache = [np.array(tensor_get(t)) for t in llama.kv.k + llama.kv.v]
    llama.embed([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [3, 3]], pooling="mean")
    assert llama.n_past == len(prompt)
    assert all(np.array_equal(np.array(tensor_get(t)), c) for t, c in zip(llama.kv.k + llama.kv.v, cache, strict=True))
    np.testing.assert_array_equal(llama.decode(more, all_logits=True), expected)


def test_bad_inputs_raise_clear_errors(bert, llama):
    cases = [("", "text 0 is empty"), (["a", ""], "text 1 is empty"), ([], "must be a str"),
             ([[1, 2], []], "text 1 has no tokens"), ([[1, 10_000]], r"token id 10000, outside the vocabulary"),
             ([[1, 2], 3.5], "text 1 is neither"),
             ([list(range(1, 60))], r"59 tokens, more than the context of 32 \(the model's learned positions\)")]
    for texts, message in cases:
        with pytest.raises(ParameterError, match=message):
            bert.embed(texts)
    with pytest.raises(ParameterError, match=r"more than the context of 64 \(n_ctx\)"):
        llama.embed([[1] * 65])
    with pytest.raises(ParameterError, match="unknown pooling 'max'"):
        bert.embed("a", pooling="max")
    with pytest.raises(ParameterError, match=r'"rank" needs a reranker\'s classification head \(tensor '
                                             r"cls.output.weight\), which this Bert file does not have"):
        bert.embed("a", pooling="rank")
    for norm in (-2, 1.5, True):
        with pytest.raises(ParameterError, match="normalize must be an integer >= -1"):
            bert.embed("a", normalize=norm)
    with pytest.raises(GGMLError, match="embedding model without logits; use Model.embed"):
        bert.decode([1, 2])


def test_encoder_files_need_a_token_type_count(tmp_path):
    path = write_bert(tmp_path / "bert.gguf", drop=("tokenizer.ggml.token_type_count",))
    with pytest.raises(GGUFError, match="token_type_count"):
        load_model(path, n_ctx=32)


def test_a_decoder_split_across_backends_embeds_as_on_one(tmp_path):
    path = write_llama(tmp_path / "llama.gguf", n_layer=4, n_ctx=64)
    texts = [[1, 5, 9, 12], [1, 30, 31]]
    one = load_model(path, n_ctx=64).embed(texts, pooling="mean")
    split = load_model(path, n_ctx=64, backend="CPU,CPU")
    assert "layers 0..1" in split.runner.describe()
    np.testing.assert_allclose(split.embed(texts, pooling="mean"), one, rtol=1e-6, atol=1e-7)


def test_an_encoder_runs_on_one_backend(tmp_path):
    with pytest.raises(ParameterError, match="bert models run on one backend, not 2"):
        load_model(write_bert(tmp_path / "bert.gguf"), backend="CPU,CPU")


def _fused(bias: str):
    """Each layer's attn_q/k/v weights as one attn_qkv; their biases as attn_qkv.bias ("fused") or left apart
    ("separate", which llama.cpp concatenates)."""
    def change(tensors):
        for p in sorted({n[:n.index(".", 4) + 1] for n in tensors if n.startswith("blk.")}):
            parts = [tensors.pop(f"{p}attn_{x}.weight") for x in "qkv"]
            tensors[p + "attn_qkv.weight"] = np.concatenate(parts)
            if bias == "fused":
                tensors[p + "attn_qkv.bias"] = np.concatenate([tensors.pop(f"{p}attn_{x}.bias") for x in "qkv"])
        return tensors
    return change


@pytest.mark.parametrize("bias", ["fused", "separate"])
def test_fused_qkv_with_a_fused_or_separate_bias_embeds_as_separate_projections(tmp_path, bias):
    path = write_bert(tmp_path / "bert.gguf", pooling="mean")
    fused = rewrite(path, tmp_path / "fused.gguf", _fused(bias))
    texts = [[1, 5, 9, 12], [1, 30]]
    expected = load_model(path, n_ctx=64).embed(texts, pooling="none", normalize=-1)
    got = load_model(fused, n_ctx=64).embed(texts, pooling="none", normalize=-1)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.peer
@pytest.mark.parametrize("bias", ["fused", "separate"])
def test_fused_qkv_layouts_agree_with_live_llamacpp(tmp_path, bias):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from pyggml.testing.llamacpp import llamacpp_embeddings

    path = write_bert(tmp_path / "bert.gguf", vocab=bge_vocab(), n_vocab=30522, n_ctx=N_CTX, pooling="mean")
    fused = rewrite(path, tmp_path / "fused.gguf", _fused(bias))
    _, reference = llamacpp_embeddings(fused, TEXTS, "mean", n_ctx=N_CTX)
    check_rows(BY_NAME["bert-f32-mean"], np.stack(reference), load_model(fused, n_ctx=N_CTX).embed(TEXTS, normalize=-1))
