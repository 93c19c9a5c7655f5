"""The optional tensors llama.cpp's loaders take for the llama layout: llama's and granite's dense-FFN and
attention output biases, the q/k/v biases, qwen2's output.bias. Their effect on the logits is proven against
llama.cpp by the parity cases (llama-f32-biases, llama-k-quants-biases, granite-f32-ffn-biases,
qwen2-f32-output-bias); here, a bias of the wrong shape is named, and one the architecture's loader does not
take refuses the file."""

import numpy as np
import pytest

from pyggml.errors import GGUFError
from pyggml.models import load_model
from pyggml.testing.synthetic import write_granite, write_llama, write_qwen3

from tests.support.gguf_rewrite import rewrite

ALL_BIASES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _shortened(name: str):
    return lambda tensors: {**tensors, name: tensors[name][:-1]}


@pytest.mark.parametrize("arch, name, size", [
    ("llama", "blk.1.ffn_up.bias", 96),
    ("llama", "blk.0.ffn_down.bias", 64),
    ("llama", "blk.1.attn_output.bias", 64),
    ("llama", "blk.0.attn_k.bias", 32),
    ("granite", "blk.0.ffn_gate.bias", 96),
    ("qwen2", "output.bias", 64),
])
def test_a_bias_of_the_wrong_shape_is_named(tmp_path, arch, name, size):
    biases = ("output",) if name == "output.bias" else ALL_BIASES if arch == "llama" else ("ffn_gate",)
    writer = write_granite if arch == "granite" else write_llama
    path = writer(tmp_path / "m.gguf", **({} if arch == "granite" else {"arch": arch}), biases=biases)
    assert load_model(path) is not None
    bad = rewrite(path, tmp_path / "bad.gguf", _shortened(name))
    with pytest.raises(GGUFError, match=rf"tensor '{name}' has shape \[{size - 1}\], expected \[{size}\]"):
        load_model(bad)


@pytest.mark.parametrize("write, biases, refused", [
    (lambda p, **kw: write_llama(p, "qwen2", **kw), ("ffn_up",), "blk.0.ffn_up.bias"),   # qwen2's FFN has none
    (write_qwen3, ("ffn_down",), "blk.0.ffn_down.bias"),
    (lambda p, **kw: write_llama(p, "llama", **kw), ("output",), "output.bias"),         # only qwen2's logits
    (write_qwen3, ("output",), "output.bias"),
    (lambda p, **kw: write_llama(p, "llama", n_expert=4, n_expert_used=2, **kw), ("ffn_gate",),
     "blk.0.ffn_gate.bias"),                                                              # not in a layer of experts
    (lambda p, **kw: write_llama(p, "qwen2", **kw), ("attn_output",), "blk.0.attn_output.bias"),
    (write_qwen3, ("attn_output",), "blk.0.attn_output.bias"),
    (lambda p, **kw: write_llama(p, "smollm3", **kw), ("attn_output",), "blk.0.attn_output.bias"),
])
def test_a_bias_the_loader_does_not_take_refuses_the_file(tmp_path, write, biases, refused):
    path = write(tmp_path / "m.gguf", biases=biases)
    with pytest.raises(GGUFError, match=rf"does not use \(llama.cpp refuses such a file too\): .*{refused}"):
        load_model(path)


def test_the_biases_are_added_where_llamacpp_adds_them(tmp_path):
    """Zero biases give the logits of the file without them; an output.bias of c adds c to every logit."""
    path = write_llama(tmp_path / "b.gguf", "qwen2", biases=("output",))
    plain = rewrite(path, tmp_path / "plain.gguf", lambda t: {k: v for k, v in t.items() if k != "output.bias"})
    zeros = rewrite(path, tmp_path / "z.gguf", lambda t: {**t, "output.bias": np.zeros_like(t["output.bias"])})
    shifted = rewrite(zeros, tmp_path / "s.gguf", lambda t: {**t, "output.bias": t["output.bias"] + 0.5})
    tokens = [1, 5, 9, 14]
    expected = load_model(plain).decode(tokens, all_logits=True)
    np.testing.assert_allclose(load_model(zeros).decode(tokens, all_logits=True), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(load_model(shifted).decode(tokens, all_logits=True), expected + 0.5, atol=1e-5)
