"""Qwen 2 MoE (llama.cpp's llm_build_qwen2moe; Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): qwen2's attention (q/k/v
biases, rope NeoX) with every FFN a layer of experts (softmax, weights not normalised,
`expert_feed_forward_length` wide, else feed_forward_length / expert_used_count) plus a shared expert
(`expert_shared_feed_forward_length` wide, else feed_forward_length) scaled by sigmoid(ffn_gate_inp_shexp · x);
a separate output matrix, no output bias."""

from __future__ import annotations

from pyggml.models.arch.blocks import hparam, hparam_per_layer
from pyggml.models.arch.llama import Qwen2
from pyggml.models.arch.moe import Experts, SharedExpert


class Qwen2MoE(Qwen2):
    MOE_ONLY = True
    OUTPUT = "required"
    OUTPUT_BIAS = False

    def read_hparams(self, gguf) -> None:
        super().read_hparams(gguf)
        self.n_ff_exp = hparam_per_layer(gguf, "expert_feed_forward_length", self.n_layer, 0)[0]
        self.n_ff_shexp = hparam(gguf, "expert_shared_feed_forward_length", 0)

    def experts(self, w, il: int) -> Experts:
        experts = Experts.load(w, il, self.n_embd, self.n_ff_exp or self.n_ff // self.n_expert_used, self.n_expert,
                               self.n_expert_used, gating="softmax", norm_w=False)
        experts.shared = SharedExpert.load(w, il, self.n_embd, self.n_ff_shexp or self.n_ff, gated=True)
        return experts
