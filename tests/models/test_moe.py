"""The mixture-of-experts FFN (pyggml.models.arch.moe) and the MoE architectures (llama and granite with
experts, granitemoe, qwen2moe, qwen3moe, gpt-oss) against independent float64 NumPy passes
(tests/support/numpy_moe.py); their agreement with llama.cpp is checked in test_llamacpp_parity.py."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import pyggml as gg
from pyggml.core import GGMLType
from pyggml.errors import GGUFError
from pyggml.models import load_model
from pyggml.models.arch.moe import Experts, moe_ffn
from pyggml.testing.synthetic import write_gpt_oss, write_granite, write_mixtral, write_qwen2moe, write_qwen3moe

from tests.support import numpy_reference as ref
from tests.support.numpy_moe import experts_ffn, moe_logits, route
from tests.support.opcheck import OpCase, check, values

N_EMBD, N_FF, N_EXPERT, N_TOKENS = 32, 24, 6, 9


def moe_case(n_used, gating="softmax", norm_w=False, w_scale=0.0, activation="silu", gate=True, biases=False):
    """moe_ffn on inputs uniform in [-1, 1] (opcheck fills them), against experts_ffn on the same values."""
    named = {}

    def build(ctx):
        def new(name, *ne):
            named[name] = ctx.new_tensor(GGMLType.F32, ne, name=name)
            return named[name]

        bias = (lambda name, *ne: new(name + ".bias", *ne)) if biases else (lambda *_: None)
        ex = Experts(gate_inp=new("ffn_gate_inp.weight", N_EMBD, N_EXPERT),
                     up=new("ffn_up_exps.weight", N_EMBD, N_FF, N_EXPERT),
                     gate=new("ffn_gate_exps.weight", N_EMBD, N_FF, N_EXPERT) if gate else None,
                     down=new("ffn_down_exps.weight", N_FF, N_EMBD, N_EXPERT), n_used=n_used, gating=gating,
                     norm_w=norm_w, w_scale=w_scale, activation=activation,
                     gate_inp_b=bias("ffn_gate_inp", N_EXPERT), up_b=bias("ffn_up_exps", N_FF, N_EXPERT),
                     gate_b=bias("ffn_gate_exps", N_FF, N_EXPERT), down_b=bias("ffn_down_exps", N_EMBD, N_EXPERT))
        return moe_ffn(ctx, ex, new("x", N_EMBD, N_TOKENS))

    def reference(out):
        arrays = {name: values(t).reshape(t.ne[:t.n_dims][::-1]) for name, t in named.items()}
        got = experts_ffn(arrays.pop("x"), arrays, "", n_used, gating, norm_w, activation, w_scale)
        return got.reshape(values(out).shape)

    return OpCase(f"moe_{gating}_{n_used}", build, 1e-10, reference)


@pytest.mark.parametrize("case", [
    moe_case(2, norm_w=True),                                   # Mixtral, qwen3moe
    moe_case(3, "sigmoid", norm_w=True, w_scale=2.5),           # DeepSeek-V3-style scores and scale
    moe_case(4, "softmax_weight", activation="swiglu_oai", biases=True),   # gpt-oss
    moe_case(1),                                                # one expert: the sum is a copy
    moe_case(2, gate=False),                                    # llama without ffn_gate_exps: silu(up)
], ids=lambda c: c.name)
def test_moe_ffn_matches_numpy(case):
    check(case)


def test_routing_normalises_weights_and_softmax_weight_only_sees_the_chosen():
    logits = np.array([[2.0, 1.0, 0.0, -1.0]])
    ids, w = route(logits, 2, "softmax", norm_w=True)
    assert ids.tolist() == [[0, 1]] and np.isclose(w.sum(), 1) and np.isclose(w[0, 0] / w[0, 1], np.e)
    ids, w = route(logits, 2, "softmax_weight", norm_w=False)
    assert np.allclose(w, [[1 / (1 + np.exp(-1)), 1 / (1 + np.e)]])


WRITERS = {
    "mixtral": write_mixtral,
    "mixtral-q8_0": lambda p: write_mixtral(p, qtype={"ffn_gate_inp": None, "*": Q.Q8_0}, seed=1),
    "qwen3moe": lambda p: write_qwen3moe(p, seed=2),
    "qwen2moe": lambda p: write_qwen2moe(p, seed=5),
    "granitemoe-shared": lambda p: write_granite(p, arch="granitemoe", n_expert=8, n_expert_used=2, n_ff=64,
                                                 n_ff_shexp=96, output_std=1.0, seed=6),
    "gpt-oss": lambda p: write_gpt_oss(p, rope_scaling={"type": "none"}, seed=3),
    "gpt-oss-mxfp4": lambda p: write_gpt_oss(p, rope_scaling={"type": "none"}, seed=4,
                                             qtype={"_exps": Q.MXFP4, "ffn_gate_inp": None, "*": Q.Q8_0}),
}


@pytest.mark.parametrize("case", sorted(WRITERS))
def test_all_logits_match_numpy_across_batches(tmp_path, case, monkeypatch):
    """20 tokens in batches of 8 (later batches read the earlier ones' K and V from the cache); gpt-oss's
    window of 8 hides the oldest keys from its even layers. Quantized weights are multiplied the float way."""
    monkeypatch.setattr("pyggml.backend.cpu.interleave.has_int8_products", lambda: False)
    ref.assert_logits_match(WRITERS[case](tmp_path / f"{case}.gguf"), moe_logits)


def test_f32_weights_expand_the_experts(tmp_path, monkeypatch):
    """weights="f32" holds the 3-D expert stacks as float32 values too; mul_mat_id reads them there (against the
    float products on the file's blocks, not the integer ones, which round the activations to Q8_0)."""
    monkeypatch.setattr("pyggml.backend.cpu.interleave.has_int8_products", lambda: False)
    path = WRITERS["mixtral-q8_0"](tmp_path / "m.gguf")
    tokens = np.random.default_rng(4).integers(3, 60, 10).tolist()
    expanded = load_model(path, n_ctx=16, n_batch=4, weights="f32")
    assert expanded.weights.tensors["blk.0.ffn_up_exps.weight"].buffer.buft.name == "CPU_F32"
    plain = load_model(path, n_ctx=16, n_batch=4)
    expected = expanded.decode(tokens, all_logits=True)
    np.testing.assert_allclose(plain.decode(tokens, all_logits=True), expected, rtol=0,
                               atol=1e-5 * np.abs(expected).max())


def test_layers_split_across_torch_cpu_and_cpu_match_one_backend(tmp_path, monkeypatch):
    """The torch backend's mul_mat_id, add_id, argsort, SwiGLU-OAI and softmax with sinks in a model: gpt-oss's
    first two layers on TORCH_CPU, the others on the CPU, give the CPU's logits (its float products: the torch
    backend's are float, the integer ones round the activations to Q8_0)."""
    pytest.importorskip("torch")
    monkeypatch.setattr("pyggml.backend.cpu.interleave.has_int8_products", lambda: False)
    import pyggml.backend.torch  # noqa: F401 - registers TORCH_CPU

    path = WRITERS["gpt-oss-mxfp4"](tmp_path / "m.gguf")
    tokens = np.random.default_rng(5).integers(3, 60, 12).tolist()
    expected = load_model(path, n_ctx=16, n_batch=8, kv_type=GGMLType.F32).decode(tokens, all_logits=True)
    split = load_model(path, backend=[gg.backend.init_by_name("TORCH_CPU"), "CPU"], n_ctx=16, n_batch=8,
                       kv_type=GGMLType.F32)
    assert [name for name, _ in split.runner.placement] == ["TORCH_CPU", "CPU"]
    got = split.decode(tokens, all_logits=True)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("drop, message", [
    (("qwen3moe.expert_count", "qwen3moe.expert_used_count"), "qwen3moe needs metadata key 'qwen3moe.expert_count'"),
    (("qwen3moe.expert_count",), "expert_used_count' .* disagree"),
    (("blk.1.ffn_down_exps.weight",), "tensor 'blk.1.ffn_down_exps.weight' is missing"),
])
def test_qwen3moe_without_its_experts_is_refused(tmp_path, drop, message):
    with pytest.raises(GGUFError, match=message):
        load_model(write_qwen3moe(tmp_path / "m.gguf", drop=drop))


def test_more_experts_used_than_there_are_is_refused(tmp_path):
    with pytest.raises(GGUFError, match="a layer routes to 1..expert_count experts"):
        load_model(write_mixtral(tmp_path / "m.gguf", n_expert=2, n_expert_used=3))


def test_a_per_layer_expert_used_count_must_be_one_value(tmp_path):
    load_model(write_mixtral(tmp_path / "same.gguf", n_expert_used=[2, 2]))
    with pytest.raises(GGUFError, match="expert_used_count' differs between layers"):
        load_model(write_mixtral(tmp_path / "m.gguf", n_expert_used=[2, 1]))


@pytest.mark.parametrize("name", ["blk.0.attn_sinks.weight", "blk.1.attn_output.bias", "blk.0.ffn_up_exps.bias",
                                  "output.weight"])
def test_gpt_oss_needs_its_sinks_biases_and_output(tmp_path, name):
    with pytest.raises(GGUFError, match=f"tensor '{name}' is missing"):
        load_model(write_gpt_oss(tmp_path / "m.gguf", drop=(name,)))
