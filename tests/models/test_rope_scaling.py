"""RoPE parameters, sliding-window layers and per-layer sizes read from a file as llama.cpp reads them
(llama-model.cpp load_hparams, llama-context.cpp, load_swa_pattern); the logits these give are checked
against llama.cpp in test_llamacpp_parity.py (llama31-*, qwen2-*-yarn)."""

import math

import numpy as np
import pytest

from pyggml.errors import GGUFError
from pyggml.models.arch.blocks import ROPE_NORMAL, Decoder, Rope, hparam_per_layer, swa_layers
from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.testing.synthetic import llama3_rope_freqs, write_llama

from tests.support.tiny_models import write_gemma3


class Tensors:
    """Stands in for Weights: the named tensors (any object) or None."""

    def __init__(self, **named):
        self.named = named

    def optional(self, name, ne=None):
        return self.named.get(name.removesuffix(".weight"))


def rope_of(tmp_path, w=None, **kw) -> Rope:
    w = Tensors() if w is None else w
    with GGUFFile.open(write_llama(tmp_path / "m.gguf", n_ctx=128, **kw)) as f:
        return Rope.from_gguf(f, w, 16, ROPE_NORMAL)


def test_linear_by_default_and_no_scaling_without_a_factor(tmp_path):
    assert rope_of(tmp_path).freq_scale == 1.0
    r = rope_of(tmp_path, rope_scaling={"factor": 4.0})
    assert (r.freq_scale, r.ext_factor, r.attn_factor, r.n_ctx_orig) == (0.25, 0.0, 1.0, 128)


def test_type_none_never_scales(tmp_path):
    assert rope_of(tmp_path, rope_scaling={"type": "none", "factor": 4.0}).freq_scale == 1.0


def test_yarn_sets_ext_factor_and_cancels_the_kernels_magnitude(tmp_path):
    r = rope_of(tmp_path, rope_scaling={"type": "yarn", "factor": 8.0, "original_context_length": 32,
                                        "attn_factor": 0.5})
    # llama.cpp: get_mscale(8) / (1 + 0.1 ln 8) * rope.scaling.attn_factor
    assert (r.freq_scale, r.ext_factor, r.n_ctx_orig, r.beta_fast, r.beta_slow) == (0.125, 1.0, 32, 32.0, 1.0)
    assert r.attn_factor == pytest.approx((0.1 * math.log(8) + 1) / (1 + 0.1 * math.log(8)) * 0.5)


def test_an_unknown_scaling_type_is_refused(tmp_path):
    with pytest.raises(GGUFError, match="rope.scaling.type.*'ntk'"):
        rope_of(tmp_path, rope_scaling={"type": "ntk"})


def test_llama3_freq_factors_win_and_longrope_chooses_by_the_padded_context(tmp_path):
    freqs, long, short = object(), object(), object()
    r = rope_of(tmp_path, Tensors(rope_freqs=freqs, rope_factors_long=long, rope_factors_short=short))
    assert r.factors_for(4096) is freqs
    r = rope_of(tmp_path, Tensors(rope_factors_long=long, rope_factors_short=short),
                rope_scaling={"type": "longrope", "original_context_length": 512})
    assert (r.factors_for(300), r.factors_for(512), r.factors_for(513)) == (short, short, long)
    # llama.cpp compares its context rounded up to 256 cells: a context of 64 counts as 256 > 200
    r = rope_of(tmp_path, Tensors(rope_factors_long=long, rope_factors_short=short),
                rope_scaling={"type": "longrope", "original_context_length": 200})
    assert r.factors_for(64) is long


def test_llama3_rope_freqs_as_the_converter_writes_them():
    f = llama3_rope_freqs(64, 500000.0, n_ctx_orig=256)
    wavelen = 2 * np.pi * 500000.0 ** (np.arange(0, 64, 2) / 64)
    assert np.all(f[wavelen < 64] == 1) and np.all(f[wavelen > 256] == 8)
    between = f[(wavelen >= 64) & (wavelen <= 256)]
    assert between.size and np.all((between > 1) & (between < 8))


@pytest.mark.parametrize("pattern, want", [
    (None, [True] * 5 + [False] + [True]),            # gemma3's default period 6
    (3, [True, True, False, True, True, False, True]),
    ([True, False, True, False, False, True, True], [True, False, True, False, False, True, True]),
])
def test_sliding_window_layers_from_the_pattern_key(tmp_path, pattern, want):
    path = write_gemma3(tmp_path / "g.gguf", n_layer=7, swa_pattern=pattern)
    with GGUFFile.open(path) as f:
        assert swa_layers(f, 7, 6) == want


def test_dense_first_pattern_and_period_zero(tmp_path):
    with GGUFFile.open(write_gemma3(tmp_path / "g.gguf", n_layer=5, swa_pattern=0)) as f:
        assert swa_layers(f, 5, 4) == [True] * 5
    with GGUFFile.open(write_gemma3(tmp_path / "h.gguf", n_layer=5)) as f:
        assert swa_layers(f, 5, 2, dense_first=True) == [False, True, False, True, False]


def test_per_layer_sizes_one_number_or_an_array(tmp_path):
    with GGUFFile.open(write_llama(tmp_path / "a.gguf", n_layer=3, n_ff=[64, 96, 32])) as f:
        assert hparam_per_layer(f, "feed_forward_length", 3) == [64, 96, 32]
        assert hparam_per_layer(f, "attention.head_count", 3) == [4, 4, 4]
        with pytest.raises(GGUFError, match="expected 2 integers"):
            hparam_per_layer(f, "feed_forward_length", 2)


def test_per_layer_arrays_load_and_differing_head_counts_are_refused(tmp_path):
    from pyggml.models import load_model

    model = load_model(write_llama(tmp_path / "ff.gguf", n_layer=2, n_ff=[64, 96]), n_ctx=16)
    assert model.arch.n_ff_arr == [64, 96] and model.decode([1, 5, 6]).shape == (64,)
    path = write_llama(tmp_path / "heads.gguf", n_layer=2, drop={"llama.attention.head_count_kv"})
    with GGUFFile.open(path) as f:
        assert hparam_per_layer(f, "attention.head_count_kv", 2, 4) == [4, 4]   # the default: head_count
        with pytest.raises(GGUFError, match="head_count_kv' differs between layers"):
            Decoder.uniform(f, "attention.head_count_kv", [4, 2])
