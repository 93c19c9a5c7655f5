"""OLMo 2 and OLMo 3 (llama.cpp's llm_build_olmo2, src/models/olmo2.cpp).

No norm before attention or the FFN: RMS norms of the whole q and k projections ([n_embd] and
[n_head_kv * head_dim] wide, not per head), then `post_attention_norm` and `post_ffw_norm` on each branch's
output before it joins the residual stream; SwiGLU; rope NeoX; a separate output matrix. OLMo 3 adds a
sliding window (`attention.sliding_window`, pattern 4 or the file's bools): its local layers rotate without
the file's scaling (YaRN on the global layers only).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.models.arch.blocks import (ROPE_NEOX, Decoder, Rope, Step, attention, default_kq_scale, hparam, rms_norm,
                                       swa_layers)

SWA_PATTERN = 4   # llama.cpp's load_swa_pattern(ml, 4): every 4th layer global


@dataclass
class Olmo2Layer:
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    q_norm: Tensor
    k_norm: Tensor
    post_attn_norm: Tensor
    ffn_gate: Tensor
    ffn_up: Tensor
    ffn_down: Tensor
    post_ffn_norm: Tensor


class Olmo2(Decoder):
    def __init__(self, gguf, w):
        super().__init__(gguf, w)
        self.eps = hparam(gguf, "attention.layer_norm_rms_epsilon")
        self.n_swa = hparam(gguf, "attention.sliding_window", 0)
        self.swa = swa_layers(gguf, self.n_layer, SWA_PATTERN) if self.n_swa > 0 else [False] * self.n_layer
        self.rope = Rope.from_gguf(gguf, w, hparam(gguf, "rope.dimension_count", self.head_dim), ROPE_NEOX)
        self.rope_local = dataclasses.replace(self.rope, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0)
        self.kq_scale = default_kq_scale(self.head_dim)
        self.output = w.get("output.weight", (self.n_embd, self.n_vocab))
        e = self.n_embd
        self.layers = [Olmo2Layer(
            **self.attention_projections(w, i), **self.ffn_projections(w, i),
            q_norm=w.get(f"blk.{i}.attn_q_norm.weight", (self.head_dim * self.n_head,)),
            k_norm=w.get(f"blk.{i}.attn_k_norm.weight", (self.n_embd_k_gqa,)),
            post_attn_norm=w.get(f"blk.{i}.post_attention_norm.weight", (e,)),
            post_ffn_norm=w.get(f"blk.{i}.post_ffw_norm.weight", (e,))) for i in range(self.n_layer)]

    def layer_rope(self, il: int) -> Rope:
        return self.rope_local if self.swa[il] else self.rope

    def build(self, step: Step, kv) -> Tensor:
        ctx, eps, n, hd = step.ctx, self.eps, step.n_tokens, self.head_dim
        x = ops.get_rows(ctx, self.tok_embd, step.tokens)
        for il, layer in enumerate(self.layers):
            rope = self.layer_rope(il)
            q = rms_norm(ctx, ops.mul_mat(ctx, layer.wq, x), layer.q_norm, eps)
            k = rms_norm(ctx, ops.mul_mat(ctx, layer.wk, x), layer.k_norm, eps)
            q = rope.apply(step, ops.reshape_3d(ctx, q, hd, self.n_head, n))
            k = rope.apply(step, ops.reshape_3d(ctx, k, hd, self.n_head_kv, n))
            v = ops.reshape_3d(ctx, ops.mul_mat(ctx, layer.wv, x), hd, self.n_head_kv, n)
            cur = attention(step, kv, il, q, k, v, self.kq_scale, self.n_swa if self.swa[il] else None)
            cur = ops.mul_mat(ctx, layer.wo, cur)
            if il == self.n_layer - 1:
                cur, x = step.select_outputs(cur, x)
            ffn_inp = ops.add(ctx, rms_norm(ctx, cur, layer.post_attn_norm, eps), x)
            gated = ops.swiglu_split(ctx, ops.mul_mat(ctx, layer.ffn_gate, ffn_inp),
                                     ops.mul_mat(ctx, layer.ffn_up, ffn_inp))
            cur = rms_norm(ctx, ops.mul_mat(ctx, layer.ffn_down, gated), layer.post_ffn_norm, eps)
            x = ops.add(ctx, cur, ffn_inp)
        return ops.mul_mat(ctx, self.output, rms_norm(ctx, x, self.output_norm, eps))
