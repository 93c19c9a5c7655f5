"""OLMo 2 / OLMo 3 (pyggml.models.arch.olmo2) against an independent float64 NumPy pass; its agreement with
llama.cpp (including OLMo 3's YaRN on the global layers only) is checked in test_llamacpp_parity.py."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from pyggml.errors import GGUFError
from pyggml.models import load_model
from pyggml.testing.synthetic import write_olmo2

from tests.support import numpy_reference as ref
from tests.support.numpy_olmo2 import olmo2_logits

WRITERS = {
    "olmo2": lambda p: write_olmo2(p),
    "olmo2-q8_0": lambda p: write_olmo2(p, qtype=Q.Q8_0, seed=1),
    "olmo3-window": lambda p: write_olmo2(p, n_layer=5, sliding_window=6, seed=2),
}


@pytest.mark.parametrize("case", sorted(WRITERS))
def test_all_logits_match_numpy_across_batches(tmp_path, case, monkeypatch):
    """20 tokens in batches of 8; with the window of 6, layers 0-2 and 4 see only the last 6 keys. Quantized
    weights are multiplied the float way (not interleaved for the integer products, which round activations)."""
    monkeypatch.setattr("pyggml.backend.cpu.interleave.has_int8_products", lambda: False)
    ref.assert_logits_match(WRITERS[case](tmp_path / f"{case}.gguf"), olmo2_logits)


def test_the_window_and_the_post_norms_change_the_logits(tmp_path):
    """The NumPy pass is not blind to what OLMo adds: without the window, or with a pre-norm layout, it differs."""
    meta, arrays = ref.load_arrays(WRITERS["olmo3-window"](tmp_path / "m.gguf"))
    tokens = np.arange(3, 23)
    windowed = olmo2_logits(meta, arrays, tokens)
    assert not np.allclose(windowed, olmo2_logits({**meta, "olmo2.attention.sliding_window": 0}, arrays, tokens))


@pytest.mark.parametrize("name", ["blk.0.attn_k_norm.weight", "blk.1.post_ffw_norm.weight", "output.weight"])
def test_a_missing_tensor_is_named(tmp_path, name):
    with pytest.raises(GGUFError, match=f"tensor '{name}' is missing"):
        load_model(write_olmo2(tmp_path / "m.gguf", drop=(name,)))
