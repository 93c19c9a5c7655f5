"""Every architecture names its graph's intermediates as llama.cpp's graph callback does (cb(t, name, il):
"Qcur-0", "attn_norm-0", "ffn_out-0", "l_out-0", "result_norm", "result_output"), so that a dump of a step's
graph lines up with llama.cpp's GGML_SCHED debug names."""

import re
from functools import partial

import pytest

from pyggml.models import load_model
from pyggml.models.arch import ARCHITECTURES
from pyggml.models.llm.embed import NoCache
from pyggml.models.arch.blocks import Step
from pyggml.testing.synthetic import write_bert, write_nomic_bert, write_qwen2vl, write_starcoder2

from tests.support.parity_cases import CASES, write_case

WRITERS = {"bert": write_bert, "nomic-bert": write_nomic_bert, "starcoder2": partial(write_starcoder2, fused_qkv=True),
           "qwen2vl": write_qwen2vl}
DECODER_CASE = {"llama": "llama-f32-spm", "qwen2": "qwen2-f32-bpe", "qwen3": "qwen3-f32-bpe",
                "smollm3": "smollm3-f32-spm", "granite": "granite-f32-bpe", "granitemoe": "granitemoe-f32-shared",
                "gemma2": "gemma2-f32-spm", "gemma3": "gemma3-f32-spm", "phi3": "phi3-f32-longrope-short",
                "gpt2": "gpt2-f32-bpe-tied", "qwen3moe": "qwen3moe-f32-bpe", "gpt-oss": "gpt-oss-f32-bpe",
                "olmo2": "olmo2-f32-spm", "qwen2moe": "qwen2moe-f32-bpe"}
LAYER_NAMES = ("Qcur", "Kcur", "Vcur", "kq", "kq_soft_max", "kqv_out", "l_out")
CB_NAME = re.compile(r"^[A-Za-z_]+(?:-(\d+))?$")


def _named_nodes(model, n_tokens=5):
    """The names of one step's graph nodes (a decoder's step over the KV cache, an encoder's over its texts)."""
    if model.arch.encoder:
        step = Step.new(n_tokens, n_tokens, n_tokens, n_ctx=model.n_ctx)
        step.graph.build_forward_expand(model.arch.build(step, NoCache()))
    else:
        step, _ = model._build(n_tokens, 1, 32)
    return [t.name for t in step.graph.nodes]


def _load(arch, tmp_path):
    if arch in WRITERS:
        return load_model(WRITERS[arch](tmp_path / f"{arch}.gguf"), n_ctx=32)
    case = next(c for c in CASES if c.name == DECODER_CASE[arch])
    return load_model(write_case(case, tmp_path), n_ctx=32, n_batch=8)


def test_every_architecture_has_a_case():
    assert set(DECODER_CASE) | set(WRITERS) == set(ARCHITECTURES)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_graph_nodes_are_named_as_llamacpp_names_them(tmp_path, arch):
    model = _load(arch, tmp_path)
    names = _named_nodes(model)
    n_layer = model.arch.n_layer
    ffn = ("ffn_moe_logits", "ffn_moe_topk", "ffn_moe_weights", "ffn_moe_weighted", "ffn_moe_out") \
        if getattr(model.arch, "n_expert", 0) else ("ffn_out",)   # a layer of experts' branch, or a dense FFN's
    for il in range(n_layer):
        missing = [n for n in LAYER_NAMES + ffn if f"{n}-{il}" not in names]
        if model.arch.encoder and il == n_layer - 1:  # llama.cpp renames the last layer's output result_embd
            missing.remove("l_out")
        assert not missing, f"{arch}: layer {il} has no node named {missing}"
    last = ("result_embd",) if model.arch.encoder else ("result_norm", "result_output")
    assert set(last) <= set(names) and names[-1] == last[-1]
    for name in names:
        # unnamed nodes get the graph's node_<i>, views ggml's "<source> (view)", as in ggml
        if not name.startswith("node_") and not name.endswith(")"):
            match = CB_NAME.match(name)
            assert match, f"{arch}: node {name!r} is not named name or name-<layer>"
            assert match[1] is None or int(match[1]) < n_layer, f"{arch}: {name!r} names no layer"
