"""Model.embed's "rank" pooling (pyggml/models/arch/classifier.py): a reranker's scores are its head applied to
the row llama.cpp's build_pooling takes (bert: tanh(cls · first row + b), then cls.output; qwen3: the softmax
of cls.output · last row), against NumPy over pyggml's own pooled rows; agreement with llama.cpp is in
test_embed (the rank cases of embedding_cases). Errors: a head of the wrong shape, labels that are not
strings, a head the architecture's loader does not take."""

import numpy as np
import pytest
from gguf import GGUFReader

from pyggml.errors import GGUFError, ParameterError
from pyggml.models import load_model
from pyggml.testing.synthetic import write_bert, write_nomic_bert, write_qwen3

from tests.support.gguf_rewrite import rewrite

TEXTS = [[1, 7, 9, 4], [1, 30, 31], [1, 5, 6, 8, 12, 40]]


def tensors(path) -> dict:
    return {t.name: np.array(t.data, np.float64) for t in GGUFReader(str(path)).tensors}


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("labels", [(), ("a", "b", "c")])
def test_bert_scores_are_the_head_over_each_texts_first_row(tmp_path, labels):
    path = write_bert(tmp_path / "r.gguf", pooling="rank", classifier=labels)
    model, t = load_model(path, n_ctx=64), tensors(path)
    first = model.embed(TEXTS, pooling="cls", normalize=-1).astype(np.float64)
    expected = np.tanh(first @ t["cls.weight"].T + t["cls.bias"]) @ t["cls.output.weight"].T + t["cls.output.bias"]
    got = model.embed(TEXTS)                                   # the file's pooling_type: rank
    assert got.shape == (len(TEXTS), max(len(labels), 1)) and model.arch.classifier.labels == list(labels)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(model.embed(TEXTS, normalize=2), got)   # scores are never normalized


def test_bert_scores_over_the_mean_when_the_file_says_so(tmp_path):
    path = write_bert(tmp_path / "r.gguf", pooling="rank", classifier=(), keys={"classifier__pooling_type": 1})
    model, t = load_model(path, n_ctx=64), tensors(path)
    mean = model.embed(TEXTS, pooling="mean", normalize=-1).astype(np.float64)
    expected = np.tanh(mean @ t["cls.weight"].T + t["cls.bias"]) @ t["cls.output.weight"].T + t["cls.output.bias"]
    np.testing.assert_allclose(model.embed(TEXTS), expected, rtol=1e-5, atol=1e-5)


def test_qwen3_reranker_scores_are_the_yes_no_softmax_of_each_texts_last_row(tmp_path):
    path = write_qwen3(tmp_path / "r.gguf", classifier=("yes", "no"))
    model, t = load_model(path, n_ctx=64), tensors(path)
    last = model.embed(TEXTS, pooling="last", normalize=-1).astype(np.float64)
    got = model.embed(TEXTS)
    np.testing.assert_allclose(got, softmax(last @ t["cls.output.weight"].T), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-6)
    # the head adds no weights to generation: its logits come from the (tied) output head as before
    assert model.decode([1, 7, 9], all_logits=True).shape == (3, model.n_vocab)


@pytest.mark.parametrize("name, size, want", [("cls.output.weight", [64, 2], [64, 3]),
                                               ("cls.weight", [64, 63], [64, 64]),
                                               ("cls.output.bias", [2], [3])])
def test_a_head_of_the_wrong_shape_is_named(tmp_path, name, size, want):
    path = write_bert(tmp_path / "r.gguf", pooling="rank", classifier=("a", "b", "c"))
    bad = rewrite(path, tmp_path / "bad.gguf", lambda t: {**t, name: t[name][:-1]})
    with pytest.raises(GGUFError, match=rf"tensor '{name}' has shape \[{', '.join(map(str, size))}\], "
                                        rf"expected \[{', '.join(map(str, want))}\]"):
        load_model(bad)


def test_labels_must_be_strings(tmp_path):
    path = write_qwen3(tmp_path / "r.gguf", classifier=(), keys={"classifier__output_labels": [1, 2]})
    with pytest.raises(GGUFError, match=r"'qwen3.classifier.output_labels' is \[1, 2\]; expected a list of strings"):
        load_model(path)


def test_a_head_the_loader_does_not_take_refuses_the_file(tmp_path):
    """llama.cpp's nomic-bert loader creates no cls tensors, and qwen3's no cls.weight or biases."""
    with pytest.raises(GGUFError, match=r"does not use .*cls.output.weight"):
        load_model(write_nomic_bert(tmp_path / "n.gguf", classifier=()))
    qwen3 = write_qwen3(tmp_path / "q.gguf", classifier=("yes", "no"))
    with_bias = rewrite(qwen3, tmp_path / "b.gguf", lambda t: {**t, "cls.output.bias": np.zeros(2, np.float32)})
    with pytest.raises(GGUFError, match=r"does not use .*cls.output.bias"):
        load_model(with_bias)


def test_rank_without_a_head_is_refused(tmp_path):
    model = load_model(write_qwen3(tmp_path / "q.gguf"), n_ctx=64)
    with pytest.raises(ParameterError, match=r'"rank" needs .*cls.output.weight.*which this Qwen3 file'):
        model.embed(TEXTS, pooling="rank")
