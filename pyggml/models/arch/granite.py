"""IBM Granite 3.x (llama.cpp's llm_build_granite): the llama layout with four scales from the file:
`embedding_scale` on the token embeddings, `attention.scale` as the softmax scale, `residual_scale` on each
branch before it joins the residual stream, logits divided by `logit_scale` (required); optional FFN biases
(read by Llama).
A file with `expert_count` > 0 has experts instead (softmax, weights normalised); `granitemoe` files may add a
shared expert (`expert_shared_feed_forward_length` wide) to them."""

from __future__ import annotations

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.models.arch.blocks import Rope, Step, hparam
from pyggml.models.arch.layers import cb
from pyggml.models.arch.llama import Llama
from pyggml.models.arch.moe import Experts, SharedExpert


class Granite(Llama):
    def read_hparams(self, gguf) -> None:
        super().read_hparams(gguf)
        self.embedding_scale = hparam(gguf, "embedding_scale", 0.0)
        self.residual_scale = hparam(gguf, "residual_scale", 0.0)
        self.logit_scale = hparam(gguf, "logit_scale")
        self.kq_scale = hparam(gguf, "attention.scale", 0.0) or self.kq_scale
        # rope.scaling.finetuned false: no layer rotates (llama.cpp's rope_pattern)
        self.has_rope = gguf.get("granite.rope.scaling.finetuned", True)

    def embed(self, step: Step) -> Tensor:
        x = super().embed(step)
        return ops.scale(step.ctx, x, self.embedding_scale) if self.embedding_scale else x

    def layer_rope(self, il: int) -> Rope | None:
        return self.rope if self.has_rope else None

    def residual(self, step: Step, branch: Tensor) -> Tensor:
        return ops.scale(step.ctx, branch, self.residual_scale) if self.residual_scale else branch

    def logits(self, step: Step, x: Tensor) -> Tensor:
        return cb(ops.scale(step.ctx, super().logits(step, x), 1.0 / self.logit_scale), "result_output")


class GraniteMoE(Granite):
    def read_hparams(self, gguf) -> None:
        super().read_hparams(gguf)
        self.n_ff_shexp = hparam(gguf, "expert_shared_feed_forward_length", 0)

    def experts(self, w, il: int) -> Experts:
        experts = super().experts(w, il)
        if self.n_ff_shexp:
            experts.shared = SharedExpert.load(w, il, self.n_embd, self.n_ff_shexp)
        return experts
