"""The KV cache's masks and bounds."""

import numpy as np

from pyggml.backend import init_by_name
from pyggml.models.llm.kv_cache import KVCache, causal_mask, hadamard, rotation_order
from pyggml.models.llm.kv_cells import KVCells


def test_causal_mask_lets_each_query_see_itself_and_earlier_cells():
    m = causal_mask(pos0=2, n_tokens=3)
    assert m.shape == (3, 5) and m.dtype == np.float32
    assert (m == 0).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert np.all(np.isneginf(m[m != 0]))


def test_sliding_window_hides_cells_window_or_more_positions_back():
    m = causal_mask(pos0=4, n_tokens=2, window=3)
    assert (m == 0).tolist() == [[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]]


def test_cache_is_zeroed_and_sized():
    kv = KVCache(init_by_name("CPU"), n_layer=2, n_head_kv=2, n_embd_k=8, n_embd_v=8, size=16)
    assert kv.nbytes >= 2 * 2 * 8 * 16 * 2
    assert not kv.k[0].numpy().any()


def test_one_sequence_in_the_unified_cells_has_the_causal_mask():
    cells = KVCells(16, 2)
    cells.apply(np.arange(7), range(7), [(1,)] * 7)
    for window in (None, 3):
        got = cells.mask(np.arange(4, 7), np.ones(3, dtype=int), 16, window)
        np.testing.assert_array_equal(got, causal_mask(4, 3, window, 16))


def _kld(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(p || q) of the softmaxes, nats, averaged over rows."""
    p = np.exp(p_logits - p_logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    log_q = q_logits - q_logits.max(-1, keepdims=True)
    log_q -= np.log(np.exp(log_q).sum(-1, keepdims=True))
    return float(np.mean(np.sum(p * (np.log(p) - log_q), -1)))


def test_quantized_caches_take_llama_cpps_share_of_f16_memory():
    def nbytes(type_):
        return KVCache(init_by_name("CPU"), n_layer=2, n_head_kv=2, n_embd_k=128, n_embd_v=128, size=256,
                       type_=type_, flash_attn=True).nbytes

    f16 = nbytes("F16")
    assert round(nbytes("Q8_0") / f16, 2) == 0.53 and round(nbytes("Q4_0") / f16, 2) == 0.28


def test_a_quantized_v_needs_flash_attention():
    import pytest

    from pyggml.errors import ParameterError

    with pytest.raises(ParameterError, match="flash attention"):
        KVCache(init_by_name("CPU"), n_layer=1, n_head_kv=1, n_embd_k=64, n_embd_v=64, size=32, type_v="Q8_0")
    with pytest.raises(ParameterError, match="Q5_1"):
        KVCache(init_by_name("CPU"), n_layer=1, n_head_kv=1, n_embd_k=64, n_embd_v=64, size=32, type_="Q5_1")


def test_quantized_kv_caches_stay_close_to_the_f16_run(tmp_path):
    """Q8_0 and Q4_0 K/V (flash attention) against the F16 cache: the same prompt's logits, KLD ordered as
    llama.cpp's (q8_0 well below q4_0), and F16 through flash attention equal to F16 without it."""
    from pyggml.models import load_model
    from pyggml.testing.synthetic import write_llama

    path = write_llama(tmp_path / "m.gguf", n_embd=128, n_head=2, n_head_kv=1, n_layer=2, n_vocab=64)
    prompt = list(range(1, 40))

    def logits(**kv):
        model = load_model(str(path), n_ctx=64, **kv)
        rows = [model.decode(prompt[:30])]
        rows += [model.decode([t]) for t in prompt[30:]]
        return np.stack([np.asarray(r).reshape(-1) for r in rows]), model

    f16, plain = logits()
    assert not plain.kv.flash_attn
    f16_flash, flash = logits(flash_attn=True)
    assert flash.kv.flash_attn
    q8, model_q8 = logits(kv_type="Q8_0")
    q4, _ = logits(kv_type_k="Q4_0", kv_type_v="Q4_0")
    assert model_q8.kv.flash_attn and model_q8.kv.k[0].type.name == "Q8_0"
    assert np.allclose(f16, f16_flash, atol=1e-4) or _kld(f16, f16_flash) < 1e-7
    kld_q8, kld_q4 = _kld(f16, q8), _kld(f16, q4)
    assert kld_q8 < 1e-3 and kld_q8 < kld_q4 < 5e-2


def test_hadamard_matrices_are_orthonormal_and_their_own_inverse():
    for n in (64, 128, 256):
        h = hadamard(n)
        assert h.dtype == np.float32 and np.allclose(h @ h, np.eye(n), atol=1e-6)
        assert np.array_equal(np.abs(h), np.full((n, n), np.float32(1 / np.sqrt(np.float32(n)))))
        assert np.array_equal(h, h.T) and np.all(h[0] > 0)


def test_rotations_as_llama_cpp_picks_them():
    """K: the largest power of two from 64 dividing the head size; V: 64; none for a float type or a head size
    64 does not divide."""
    assert rotation_order("Q8_0", 64, largest=True) == 64
    assert rotation_order("Q4_0", 128, largest=True) == 128 and rotation_order("Q4_0", 128, largest=False) == 64
    assert rotation_order("Q4_0", 192, largest=True) == 64 and rotation_order("Q4_0", 256, largest=True) == 256
    assert rotation_order("F16", 128, largest=True) == 0 and rotation_order("Q8_0", 96, largest=True) == 0
    cache = KVCache(init_by_name("CPU"), n_layer=1, n_head_kv=1, n_embd_k=128, n_embd_v=128, size=32,
                    type_="Q4_0", type_v="F16", flash_attn=True)
    assert list(cache.k_rot.ne[:2]) == [128, 128] and cache.v_rot is None


def test_quantized_caches_match_llama_cpps_run_of_the_same_setting(tmp_path):
    """Each K/V setting's logits against llama.cpp's with the same cache types (committed: make_kv_quant_refs):
    far closer to llama.cpp's run than either is to the F16 cache's, which holds only if the cache is rotated as
    llama.cpp rotates it (unrotated: Q4_0 K and V 2.0e-2, Q8_0 6.9e-5; rotated 8.1e-5 and 1.6e-5). The rest is
    llama.cpp's queries rounded to Q8_0 for the quantized dot products, where pyggml keeps them in float32."""
    import hashlib

    from pyggml.models import load_model
    from pyggml.testing.agreement import agreement
    from tests.models.data.make_kv_quant_refs import N_CTX, OUT, SETTINGS, prompt, write_model

    refs = np.load(OUT)
    path = write_model(tmp_path / "kv.gguf")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(refs["model_sha256"])
    bounds = {"F16_F16": 1e-8, "Q8_0_Q8_0": 4e-5, "Q4_0_Q4_0": 5e-4, "Q4_0_F16": 5e-4}
    for type_k, type_v in SETTINGS:
        model = load_model(str(path), n_ctx=N_CTX, n_batch=N_CTX, kv_type_k=type_k, kv_type_v=type_v,
                           flash_attn=True)
        name = f"{type_k}_{type_v}"
        got = agreement(refs[name], np.asarray(model.decode(prompt().tolist(), all_logits=True), np.float32))
        assert got["kld_mean"] < bounds[name], (name, got)


def test_a_rotated_quantized_k_moves_as_a_plain_one(tmp_path):
    """A K-shift of a rotated Q8_0 K (rotated back, roped, rotated again) gives the logits of a fresh run at the
    new positions, within Q8_0's own rounding (one layer: its keys depend on the token and position alone; F16
    2.2e-8, Q8_0 1.2e-5)."""
    from pyggml.models import load_model
    from pyggml.testing.agreement import agreement
    from pyggml.testing.synthetic import write_llama

    path = write_llama(tmp_path / "m.gguf", n_embd=128, n_head=2, n_head_kv=1, n_layer=1, n_vocab=64, seed=5)
    ids = list(range(3, 43))
    model = load_model(str(path), n_ctx=64, kv_type="Q8_0")
    assert model.kv.k_rot is not None
    model.decode(ids[:30])
    model.seq_rm(0, 1, 11)                 # drop positions 1..10, move 11..29 back by 10
    model.seq_add(0, 11, 30, -10)
    shifted = np.stack([model.decode([t]) for t in ids[30:]])
    fresh = load_model(str(path), n_ctx=64, kv_type="Q8_0")
    fresh.decode(ids[:1] + ids[11:30])
    plain = np.stack([fresh.decode([t]) for t in ids[30:]])
    assert agreement(plain, shifted)["kld_mean"] < 1e-4
