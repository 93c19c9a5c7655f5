"""Llama-family decoders (llama.cpp's llm_build_llama / llm_build_qwen2): RMS norms, GQA, RoPE, SwiGLU.

Covers the llama layout (Llama, Mistral) and qwen2's: qwen2 adds biases to q, k, v (any present bias is
used) and rotates in NeoX mode; llama uses the normal mode. The architectures that differ from it in a
few places (qwen3, smollm3, granite) subclass it and override the hooks: `new_layer`, `rope_qk`, `embed`,
`residual` and `logits`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.models.arch.blocks import (ROPE_NEOX, ROPE_NORMAL, Decoder, Rope, Step, attention, default_kq_scale,
                                       hparam, linear, rms_norm)

ROPE_MODES = {"llama": ROPE_NORMAL, "qwen2": ROPE_NEOX, "qwen3": ROPE_NEOX, "smollm3": ROPE_NORMAL,
              "granite": ROPE_NORMAL}


@dataclass
class LlamaLayer:
    attn_norm: Tensor
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    bq: Tensor | None
    bk: Tensor | None
    bv: Tensor | None
    bo: Tensor | None
    ffn_norm: Tensor
    ffn_gate: Tensor
    ffn_up: Tensor
    ffn_down: Tensor


class Llama(Decoder):
    def __init__(self, gguf, w):
        super().__init__(gguf, w)
        self.eps = hparam(gguf, "attention.layer_norm_rms_epsilon")
        self.rope = Rope.from_gguf(gguf, w, hparam(gguf, "rope.dimension_count", self.head_dim),
                                   ROPE_MODES[gguf.architecture])
        self.kq_scale = default_kq_scale(self.head_dim)
        self.layers = [self.new_layer(w, i) for i in range(self.n_layer)]

    def new_layer(self, w, i: int) -> LlamaLayer:
        e, q, kv = self.n_embd, self.head_dim * self.n_head, self.n_embd_k_gqa
        return LlamaLayer(**self.projections(w, i), bq=w.optional(f"blk.{i}.attn_q.bias", (q,)),
                          bk=w.optional(f"blk.{i}.attn_k.bias", (kv,)), bv=w.optional(f"blk.{i}.attn_v.bias", (kv,)),
                          bo=w.optional(f"blk.{i}.attn_output.bias", (e,)))

    def layer_rope(self, il: int) -> Rope:
        return self.rope

    def embed(self, step: Step) -> Tensor:
        return ops.get_rows(step.ctx, self.tok_embd, step.tokens)

    def rope_qk(self, step: Step, il: int, layer, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return self.rope.apply(step, q), self.rope.apply(step, k)

    def residual(self, step: Step, branch: Tensor) -> Tensor:
        """A branch's output before it is added to the residual stream."""
        return branch

    def ffn(self, step: Step, layer, cur: Tensor) -> Tensor:
        ctx = step.ctx
        gated = ops.swiglu_split(ctx, ops.mul_mat(ctx, layer.ffn_gate, cur), ops.mul_mat(ctx, layer.ffn_up, cur))
        return ops.mul_mat(ctx, layer.ffn_down, gated)

    def logits(self, step: Step, x: Tensor) -> Tensor:
        return ops.mul_mat(step.ctx, self.output, rms_norm(step.ctx, x, self.output_norm, self.eps))

    def build(self, step: Step, kv) -> Tensor:
        ctx, eps, n, hd = step.ctx, self.eps, step.n_tokens, self.head_dim
        x = self.embed(step)
        for il, layer in enumerate(self.layers):
            cur = rms_norm(ctx, x, layer.attn_norm, eps)
            q = ops.reshape_3d(ctx, linear(ctx, layer.wq, cur, layer.bq), hd, self.n_head, n)
            k = ops.reshape_3d(ctx, linear(ctx, layer.wk, cur, layer.bk), hd, self.n_head_kv, n)
            v = ops.reshape_3d(ctx, linear(ctx, layer.wv, cur, layer.bv), hd, self.n_head_kv, n)
            q, k = self.rope_qk(step, il, layer, q, k)
            cur = attention(step, kv, il, q, k, v, self.kq_scale)
            cur = linear(ctx, layer.wo, cur, layer.bo)
            if il == self.n_layer - 1:
                cur, x = step.select_outputs(cur, x)
            ffn_inp = ops.add(ctx, self.residual(step, cur), x)
            cur = self.ffn(step, layer, rms_norm(ctx, ffn_inp, layer.ffn_norm, eps))
            x = ops.add(ctx, self.residual(step, cur), ffn_inp)
        return self.logits(step, x)
