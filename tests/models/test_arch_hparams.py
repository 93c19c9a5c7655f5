"""Gemma 2's and Phi-3's hyperparameters and tensors read as llama.cpp reads them (src/models/gemma2.cpp,
phi3.cpp); the logits they give are checked against llama.cpp in test_llamacpp_parity.py (gemma2-*, phi3-*)."""

import math

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from pyggml.errors import GGUFError
from pyggml.models import load_model

from tests.support.tiny_models import write_gemma2, write_gemma3, write_phi3


def test_gemma2_defaults_when_the_file_has_no_keys(tmp_path):
    path = write_gemma2(tmp_path / "g.gguf", sliding_window=None, attn_softcap=None, final_softcap=None)
    a = load_model(path, n_ctx=16).arch
    assert (a.n_swa, a.attn_softcap, a.final_softcap, a.swa) == (4096, 50.0, 30.0, [True, False, True, False])
    assert a.rope_local.freq_base == a.rope_global.freq_base == 10000.0
    assert a.output is a.tok_embd and a.attn_scale == pytest.approx(1 / math.sqrt(32))


def with_tensor(src, dst, name: str, values: np.ndarray):
    """dst: src's keys and tensors and one more F32 tensor."""
    reader = GGUFReader(str(src))
    w = GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for key, f in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            w.add_key_value(key, f.contents(), f.types[0], f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.add_tensor(name, values.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_gemma2_is_always_tied_and_refuses_an_output_matrix(tmp_path):
    """llama.cpp's gemma2 creates no output.weight (it refuses a file with one); gemma3 uses one if present."""
    for arch, write in (("gemma2", write_gemma2), ("gemma3", write_gemma3)):
        path = with_tensor(write(tmp_path / f"{arch}.gguf"), tmp_path / f"{arch}-untied.gguf", "output.weight",
                           np.zeros((64, 64)))
        if arch == "gemma2":
            with pytest.raises(GGUFError, match="1 tensor.*'gemma2' does not use.*: output.weight"):
                load_model(path, n_ctx=16)
        else:
            a = load_model(path, n_ctx=16).arch
            assert a.output is not a.tok_embd and a.output.name == "output.weight"


def test_gemma2_keys_from_the_file(tmp_path):
    path = write_gemma2(tmp_path / "g.gguf", sliding_window=8, attn_softcap=2.0, final_softcap=5.0,
                        swa_pattern=[False, True, True, False], freq_base_swa=20000.0)
    a = load_model(path, n_ctx=16).arch
    assert (a.n_swa, a.attn_softcap, a.final_softcap, a.swa) == (8, 2.0, 5.0, [False, True, True, False])
    assert (a.rope_local.freq_base, a.rope_global.freq_base) == (20000.0, 10000.0)


def test_gemma3_keeps_its_own_defaults(tmp_path):
    a = load_model(write_gemma3(tmp_path / "g.gguf", n_layer=7), n_ctx=16).arch
    assert (a.n_swa, a.attn_softcap, a.final_softcap) == (16, 0.0, 0.0)
    assert a.swa == [True] * 5 + [False, True]
    assert (a.rope_local.freq_base, a.rope_local.freq_scale, a.rope_global.freq_base) == (10000.0, 1.0, 1e6)


def test_phi3_longrope_factors_by_the_padded_context_and_the_files_attn_factor(tmp_path):
    path = write_phi3(tmp_path / "p.gguf", n_ctx=1024, n_ctx_orig=256)
    rope = load_model(path, n_ctx=256).arch.rope
    assert rope.factors_for(256) is rope.short_factors and rope.factors_for(257) is rope.long_factors
    assert rope.attn_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(256)))
    assert (rope.freq_scale, rope.ext_factor, rope.n_ctx_orig) == (1.0, 0.0, 256)


def test_phi3_partial_rotary_tied_output_and_ignored_window(tmp_path):
    path = write_phi3(tmp_path / "p.gguf", n_embd=192, n_head=6, n_head_kv=2, rope_dims=24, tied=True,
                      sliding_window=2047)
    a = load_model(path, n_ctx=16).arch
    assert (a.rope.n_dims, a.head_dim, a.n_head_kv) == (24, 32, 2) and a.output is a.tok_embd


def test_phi3_separate_qkv_give_the_fused_logits(tmp_path):
    """llama.cpp takes attn_q/k/v where a file has no attn_qkv; the same rows give the same logits."""
    tokens = [1, 5, 9, 13, 20, 7]
    fused = load_model(write_phi3(tmp_path / "f.gguf", n_ctx=1024, n_ctx_orig=256), n_ctx=16, kv_type="F32")
    split = load_model(write_phi3(tmp_path / "s.gguf", n_ctx=1024, n_ctx_orig=256, fused_qkv=False), n_ctx=16,
                       kv_type="F32")
    assert split.arch.layers[0].wqkv is None and fused.arch.layers[0].wq is None
    expected = fused.decode(tokens, all_logits=True)
    np.testing.assert_allclose(split.decode(tokens, all_logits=True), expected, rtol=0,
                               atol=1e-5 * np.abs(expected).max())

