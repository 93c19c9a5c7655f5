"""Nomic Embed (llama.cpp's `nomic-bert`, built by llm_build_bert): the BERT encoder with RoPE (NeoX mode)
instead of learned positions, a fused QKV projection and a SwiGLU FFN (`ffn_gate`, `ffn_up`, `ffn_down`);
as in llama.cpp the FFN takes no biases, even where the file has them."""

from __future__ import annotations

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.models.arch.bert import Bert, BertLayer
from pyggml.models.arch.blocks import ROPE_NEOX, Rope, Step, hparam


class NomicBert(Bert):
    def init_positions(self, gguf, w) -> None:
        self.rope = Rope.from_gguf(gguf, w, hparam(gguf, "rope.dimension_count", self.head_dim), ROPE_NEOX)

    def gate_weight(self, w, prefix: str, n_ff: int) -> Tensor | None:
        return w.get(prefix + "ffn_gate.weight", (self.n_embd, n_ff))

    def add_positions(self, step: Step, x: Tensor) -> Tensor:
        return x

    def rope_qk(self, step: Step, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return self.rope.apply(step, q), self.rope.apply(step, k)

    def ffn(self, step: Step, layer: BertLayer, cur: Tensor) -> Tensor:
        ctx = step.ctx
        gated = ops.swiglu_split(ctx, ops.mul_mat(ctx, layer.ffn_gate, cur), ops.mul_mat(ctx, layer.ffn_up, cur))
        return ops.mul_mat(ctx, layer.ffn_down, gated)
