"""Qwen 3 MoE (llama.cpp's llm_build_qwen3moe; Qwen3-30B-A3B, Qwen3-Coder-30B): qwen3's attention (per-head q/k
norms, head size from `attention.key_length`) with every FFN a layer of experts: softmax over `expert_count`
experts, the `expert_used_count` best with their weights normalised to sum 1, each `expert_feed_forward_length`
wide (else feed_forward_length / expert_used_count); no shared expert, no classifier."""

from __future__ import annotations

from pyggml.models.arch.blocks import hparam_per_layer
from pyggml.models.arch.moe import Experts
from pyggml.models.arch.qwen3 import Qwen3


class Qwen3MoE(Qwen3):
    MOE_ONLY = True
    CLASSIFIER = None

    def read_hparams(self, gguf) -> None:
        super().read_hparams(gguf)
        # llama.cpp sizes every layer's experts by the first layer's value
        self.n_ff_exp = hparam_per_layer(gguf, "expert_feed_forward_length", self.n_layer, 0)[0]

    def experts(self, w, il: int) -> Experts:
        n_ff = self.n_ff_exp or self.n_ff // self.n_expert_used
        return Experts.load(w, il, self.n_embd, n_ff, self.n_expert, self.n_expert_used, gating="softmax",
                            norm_w=True)
