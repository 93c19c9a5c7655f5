"""Qwen 3 (llama.cpp's llm_build_qwen3): qwen2's layout with RMS norms of each head's q and k before RoPE,
a head size (`attention.key_length`) independent of n_embd / n_head, and no q/k/v biases. Qwen3-Reranker files
add `cls.output.weight` (the "yes" and "no" rows of the output head; arch/classifier.py)."""

from __future__ import annotations

from dataclasses import dataclass

from pyggml.core import Tensor
from pyggml.models.arch.blocks import Step, rms_norm
from pyggml.models.arch.classifier import Classifier
from pyggml.models.arch.llama import Llama, LlamaLayer


@dataclass
class Qwen3Layer(LlamaLayer):
    q_norm: Tensor
    k_norm: Tensor


class Qwen3(Llama):
    def __init__(self, gguf, w):
        super().__init__(gguf, w)
        if gguf.architecture == "qwen3":  # qwen3moe's loader takes no classifier
            self.classifier = Classifier.load(gguf, w, self.n_embd, dense=False, softmax=True)

    def new_layer(self, w, i: int) -> Qwen3Layer:
        hd = (self.head_dim,)
        return Qwen3Layer(**vars(super().new_layer(w, i)), q_norm=w.get(f"blk.{i}.attn_q_norm.weight", hd),
                          k_norm=w.get(f"blk.{i}.attn_k_norm.weight", hd))

    def rope_qk(self, step: Step, il: int, layer, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        ctx = step.ctx
        return super().rope_qk(step, il, layer, rms_norm(ctx, q, layer.q_norm, self.eps),
                               rms_norm(ctx, k, layer.k_norm, self.eps))
