"""llama, qwen2 and gpt2 graphs against independent NumPy forward passes, on small random GGUF files."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from pyggml.backend.cpu.interleave import has_int8_products
from pyggml.core import GGMLType
from pyggml.errors import AllocationError
from pyggml.models import load_model

from tests.support import numpy_reference as ref
from tests.support.tiny_models import write_gpt2, write_llama

Q4_K_M = {"attn_v": GGMLQuantizationType.Q6_K, "ffn_down": GGMLQuantizationType.Q6_K,  # llama.cpp's mix
          "output": GGMLQuantizationType.Q6_K, "*": GGMLQuantizationType.Q4_K}
CASES = {
    "llama": (lambda p: write_llama(p, "llama"), ref.llama_logits),
    "llama-tied-mqa": (lambda p: write_llama(p, "llama", tied=True, n_head_kv=1), ref.llama_logits),
    "qwen2": (lambda p: write_llama(p, "qwen2"), ref.llama_logits),
    "llama-q8_0": (lambda p: write_llama(p, "llama", qtype=GGMLQuantizationType.Q8_0), ref.llama_logits),
    "llama-q4_k_m": (lambda p: write_llama(p, "llama", n_embd=256, n_ff=512, qtype=Q4_K_M), ref.llama_logits),
    "gpt2": (lambda p: write_gpt2(p), ref.gpt2_logits),
    "gpt2-untied": (lambda p: write_gpt2(p, tied=False), ref.gpt2_logits),
    "gpt2-q8_0": (lambda p: write_gpt2(p, qtype=GGMLQuantizationType.Q8_0), ref.gpt2_logits),
}


def _model_and_reference(tmp_path, case, tokens, **kw):
    write, logits_of = CASES[case]
    path = write(tmp_path / f"{case}.gguf")
    meta, arrays = ref.load_arrays(path)
    return load_model(path, **kw), logits_of(meta, arrays, np.asarray(tokens))


@pytest.fixture
def float_products(monkeypatch):
    """Quantized weights multiplied the float way (as on a CPU without VNNI: nothing interleaved)."""
    monkeypatch.setattr("pyggml.backend.cpu.interleave.has_int8_products", lambda: False)


@pytest.mark.parametrize("case", sorted(CASES))
def test_all_logits_match_numpy_across_batches(tmp_path, case, float_products):
    """20 tokens in batches of 8: later batches read earlier ones from the (F32) KV cache."""
    tokens = np.random.default_rng(1).integers(3, 60, 20).tolist()
    model, expected = _model_and_reference(tmp_path, case, tokens, n_ctx=32, n_batch=8, kv_type=GGMLType.F32)
    got = model.decode(tokens, all_logits=True)
    # GELU goes through an F16 table
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-3 * np.abs(expected).max())


@pytest.mark.skipif(not has_int8_products(), reason="weights are interleaved only where int8 products run")
@pytest.mark.parametrize("case, kld", [("llama-q8_0", 1e-3), ("gpt2-q8_0", 1e-3), ("llama-q4_k_m", 2e-3)])
def test_integer_products_stay_within_the_error_of_quantized_activations(tmp_path, case, kld):
    """With the weights interleaved and the activations rounded to Q8_0 (Q8_K for the K-quants), as ggml's CPU
    computes these types, the logits differ from the float64 reference by the activations' rounding alone: NMSE
    within test-backend-ops' 5e-4 for a quantized product, a small mean KL divergence (Q8_K's one scale per 256
    values rounds more coarsely than Q8_0's per 32: 1.2e-3 here against 1e-3), the same top token."""
    tokens = np.random.default_rng(1).integers(3, 60, 20).tolist()
    model, expected = _model_and_reference(tmp_path, case, tokens, n_ctx=32, n_batch=8, kv_type=GGMLType.F32)
    assert any(t.buffer.buft.name == "CPU_INTERLEAVED" for t in model.weights.tensors.values())
    got = model.decode(tokens, all_logits=True)
    assert ((got - expected) ** 2).sum() / (expected ** 2).sum() < 5e-4
    log_p, log_q = (z - z.max(-1, keepdims=True) for z in (expected, got))
    log_p, log_q = (z - np.log(np.exp(z).sum(-1, keepdims=True)) for z in (log_p, log_q))
    assert (np.exp(log_p) * (log_p - log_q)).sum(-1).mean() < kld
    assert (got.argmax(-1) == expected.argmax(-1)).mean() >= 0.95


@pytest.mark.parametrize("case", ["llama", "gpt2"])
@pytest.mark.parametrize("weights", ["f32", "quantized"])
def test_token_by_token_decode_matches_numpy_with_f16_cache(tmp_path, case, weights):
    tokens = np.random.default_rng(2).integers(3, 60, 12).tolist()
    model, expected = _model_and_reference(tmp_path, case, tokens, n_ctx=16, n_batch=4, weights=weights,
                                           kv_type=GGMLType.F16)
    got = np.stack([model.decode([t]) for t in tokens])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-2 * np.abs(expected).max())
    assert model.n_past == len(tokens)


@pytest.mark.parametrize("case", ["llama-q8_0", "gpt2-q8_0"])
def test_f32_weights_give_the_logits_of_the_file_bytes(tmp_path, case, float_products):
    """CPU_F32 holds the values the file's bytes dequantize to: embedding rows are identical, and the products
    (BLAS on float32 values against the compiled kernels on the blocks) differ by float32 summation order only.
    GPT-2's GELU reads an F16 table: an input that the two orders round to neighbouring halves moves that
    activation by one F16 step (5e-5 of the logits' range was seen), so its bound is wider than llama's."""
    tokens = np.random.default_rng(4).integers(3, 60, 10).tolist()
    expanded, _ = _model_and_reference(tmp_path, case, tokens, n_ctx=32, n_batch=4, weights="f32")
    assert any(t.buffer.buft.name == "CPU_F32" for t in expanded.weights.tensors.values())
    plain = load_model(tmp_path / f"{case}.gguf", n_ctx=32, n_batch=4, weights="quantized")
    expected = expanded.decode(tokens, all_logits=True)
    bound = (2e-4 if case.startswith("gpt2") else 1e-5) * np.abs(expected).max()
    np.testing.assert_allclose(plain.decode(tokens, all_logits=True), expected, rtol=0, atol=bound)


@pytest.mark.parametrize("kv_type", [GGMLType.F32, GGMLType.F16], ids=["F32", "F16"])
def test_steps_of_one_shape_reuse_a_graph_and_match_fresh_graphs(tmp_path, kv_type):
    """Positions, masks and the KV cells written are inputs, so steps of one shape share a graph and plan:
    the logits equal those of a model that builds and plans every step. Only a shape not among the last two
    builds: the one-token graph is kept while the next prompt's runs, and serves the tokens after it."""
    tokens = np.random.default_rng(3).integers(3, 60, 14).tolist()
    reused, _ = _model_and_reference(tmp_path, "llama", tokens, n_ctx=32, n_batch=4, kv_type=kv_type)
    fresh = load_model(tmp_path / "llama.gguf", n_ctx=32, n_batch=4, kv_type=kv_type)
    fresh.reuse_graphs = False
    built = []
    build = reused._build
    reused._build = lambda *shape: built.append(shape) or build(*shape)
    for model in (reused, fresh):
        logits = [model.decode(tokens[:6], all_logits=True)] + [model.decode([t])[None] for t in tokens[6:]]
        model.reset()
        logits += [model.decode(tokens[:5])[None]]       # a new sequence over the old cells
        model.results = np.concatenate(logits)
    np.testing.assert_array_equal(reused.results, fresh.results)
    assert built == [(4, 4, 32), (2, 2, 32), (1, 1, 32), (4, 1, 32)]


def test_greedy_generation_follows_the_reference_argmax(tmp_path):
    """Each generated token is the NumPy model's argmax given the prompt and the tokens before it."""
    prompt = [1, 5, 9, 13]
    model, _ = _model_and_reference(tmp_path, "llama", prompt, n_ctx=32, kv_type=GGMLType.F32)
    out = list(model.generate_tokens(prompt, n=8))
    meta, arrays = ref.load_arrays(tmp_path / "llama.gguf")
    full = ref.llama_logits(meta, arrays, np.array(prompt + out))
    assert out == [int(np.argmax(full[len(prompt) - 1 + i])) for i in range(len(out))]


def test_generation_stops_when_the_context_is_full(tmp_path):
    model, _ = _model_and_reference(tmp_path, "llama", [1], n_ctx=8, n_batch=4)
    out = list(model.generate_tokens([1, 5, 9, 13], n=20))
    assert len(out) == 5 and model.n_past == 8  # 4 prompt cells + 4 fed-back tokens; the 5th needs no cell
    with pytest.raises(AllocationError, match="KV cache full"):
        model.decode(list(range(3, 12)))
