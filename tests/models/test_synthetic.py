"""pyggml.testing.synthetic: random blocks of the types gguf cannot write, type mappings, vocabularies and
F32 copies."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from tests.support.parity_cases import plain

from pyggml.errors import GGMLError
from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.testing.synthetic import q4_k_m_mix, random_weight, write_f32_copy

from tests.support.tiny_models import gemma3_vocab, write_llama


@pytest.mark.parametrize("qtype", [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS, Q.Q4_0, Q.Q8_0])
def test_random_blocks_have_the_asked_spread_and_mean_zero(qtype):
    raw, raw_type = random_weight(np.random.default_rng(0), 96, 512, qtype, 0.05)
    values = dequantize(raw, raw_type)
    assert raw_type == qtype and values.shape == (96, 512)
    assert abs(values.mean()) < 0.005 and 0.04 < values.std() < 0.065   # scales jittered by 0.5..1.5 per block
    assert len(np.unique(values)) > 100                                  # not a constant pattern


def test_rows_that_are_not_whole_blocks_are_refused():
    with pytest.raises(GGMLError, match="not whole Q4_K blocks"):
        random_weight(np.random.default_rng(0), 4, 128, Q.Q4_K, 0.1)


def test_a_type_mapping_picks_each_tensors_type_and_falls_back_to_f32_for_short_rows(tmp_path):
    path = write_llama(tmp_path / "m.gguf", n_embd=256, n_head=4, n_head_kv=2, n_ff=96,
                       qtype={"ffn_down": Q.Q8_0, "attn": Q.Q4_K, "*": Q.Q6_K})
    with GGUFFile.open(path) as f:
        types = {t.name: t.type.name for t in f.tensors}
    assert types["blk.0.attn_q.weight"] == "Q4_K" and types["blk.0.ffn_up.weight"] == "Q6_K"
    assert types["blk.0.ffn_down.weight"] == "Q8_0"   # rows of 96: whole Q8_0 blocks of 32
    assert types["output.weight"] == "Q6_K" and types["blk.0.attn_norm.weight"] == "F32"


def test_f32_copy_holds_the_dequantized_values_and_the_same_keys(tmp_path):
    src = write_llama(tmp_path / "q.gguf", n_vocab=300, qtype={"ffn": Q.Q4_1, "*": Q.Q8_0}, vocab=gemma3_vocab())
    write_f32_copy(src, tmp_path / "f32.gguf")
    with GGUFFile.open(src) as q, GGUFFile.open(tmp_path / "f32.gguf") as f:
        assert {k: plain(v) for k, v in q.metadata.items() if k != "general.file_type"} == \
               {k: plain(v) for k, v in f.metadata.items() if k != "general.file_type"}
        assert len(f.metadata["tokenizer.ggml.tokens"]) == 300
        for a, b in zip(q.tensors, f.tensors, strict=True):
            assert (a.name, a.ne) == (b.name, b.ne) and b.type.name == "F32"
            raw = np.frombuffer(q.tensor_bytes(a), np.uint8).reshape(a.ne[1] if a.n_dims > 1 else 1, -1)
            expected = dequantize(raw, a.type).ravel()
            np.testing.assert_array_equal(np.frombuffer(f.tensor_bytes(b), np.float32), expected)


def test_a_real_vocabulary_is_truncated_or_padded_to_n_vocab():
    vocab = gemma3_vocab()
    assert vocab.n_tokens == 2048 and vocab.keys["tokenizer.ggml.tokens"][0][248] == "<0x0A>"
    small, big = vocab.resized(300), vocab.resized(3000)
    assert small.n_tokens == 300 and len(small.keys["tokenizer.ggml.scores"][0]) == 300
    tokens = vocab.keys["tokenizer.ggml.tokens"][0]
    assert big.n_tokens == 3000 and big.keys["tokenizer.ggml.tokens"][0][:2048] == tokens
    assert set(big.keys["tokenizer.ggml.token_type"][0][2048:]) == {1}


@pytest.mark.parametrize("tied", [False, True])
def test_the_q4_k_m_mix_types_each_tensor_as_llama_cpp_does(tmp_path, tied):
    path = write_llama(tmp_path / "m.gguf", n_embd=256, n_ff=512, tied=tied, qtype=q4_k_m_mix(tied))
    types = {t.name: Q(int(t.type)).name for t in GGUFFile.open(path).tensors}
    assert types["blk.0.attn_v.weight"] == types["blk.1.ffn_down.weight"] == "Q6_K"
    assert types["blk.0.attn_output.weight"] == types["blk.0.ffn_up.weight"] == types["blk.1.attn_q.weight"] == "Q4_K"
    assert types["token_embd.weight"] == ("Q6_K" if tied else "Q4_K") and types.get("output.weight", "Q6_K") == "Q6_K"


def test_large_matrices_are_drawn_in_slabs_as_one_draw_and_k_quants_scaled_from_a_sample(monkeypatch):
    """A Q4_0 matrix is drawn and quantized a slab of rows at a time: the same bytes as in one draw. A K-quant one
    is scaled from its first CALIBRATION_BLOCKS blocks: the asked spread still, and nearly the whole one's scale."""
    from gguf.quants import quantize

    from pyggml.testing import synthetic

    monkeypatch.setattr(synthetic, "SLAB_VALUES", 3 * 512)
    slabs, _ = random_weight(np.random.default_rng(1), 64, 512, Q.Q4_0, 0.05)
    whole = quantize(np.random.default_rng(1).normal(0, 0.05, (64, 512)).astype(np.float32), Q.Q4_0)
    assert np.array_equal(slabs, whole)
    monkeypatch.setattr(synthetic, "CALIBRATION_BLOCKS", 64)
    sampled, _ = random_weight(np.random.default_rng(2), 256, 1024, Q.Q4_K, 0.05)
    monkeypatch.setattr(synthetic, "CALIBRATION_BLOCKS", 1 << 30)
    all_blocks, _ = random_weight(np.random.default_rng(2), 256, 1024, Q.Q4_K, 0.05)
    values, reference = dequantize(sampled, Q.Q4_K), dequantize(all_blocks, Q.Q4_K)
    assert abs(values.mean()) < 0.005 and 0.04 < values.std() < 0.065
    assert abs(values.std() / reference.std() - 1) < 0.05
