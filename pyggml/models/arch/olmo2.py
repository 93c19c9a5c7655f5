"""OLMo 2 and OLMo 3 (llama.cpp's llm_build_olmo2, src/models/olmo2.cpp).

No norm before attention or the FFN: RMS norms of the whole q and k projections ([n_embd] and
[n_head_kv * head_dim] wide, not per head), then `post_attention_norm` and `post_ffw_norm` on each branch's
output before it joins the residual stream; SwiGLU; rope NeoX; a separate output matrix. OLMo 3 adds a
sliding window (`attention.sliding_window`, pattern 4 or the file's bools): its local layers rotate without
the file's scaling (YaRN on the global layers only).
"""

from __future__ import annotations

import dataclasses

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.models.arch.blocks import (ROPE_NEOX, Decoder, Rope, Step, attention, default_kq_scale, hparam, rms_norm,
                                       swa_layers)
from pyggml.models.arch.layers import Layer, build_ffn, build_qkv, cb, declare_ffn, declare_qkv, lora_mm

SWA_PATTERN = 4   # llama.cpp's load_swa_pattern(ml, 4): every 4th layer global


class Olmo2(Decoder):
    OUTPUT = "required"

    def read_hparams(self, gguf) -> None:
        super().read_hparams(gguf)
        self.eps = hparam(gguf, "attention.layer_norm_rms_epsilon")
        self.n_swa = hparam(gguf, "attention.sliding_window", 0)
        self.swa = swa_layers(gguf, self.n_layer, SWA_PATTERN) if self.n_swa > 0 else [False] * self.n_layer
        self.n_rot = hparam(gguf, "rope.dimension_count", self.head_dim)
        self.kq_scale = default_kq_scale(self.head_dim)

    def declare(self, gguf, w) -> None:
        super().declare(gguf, w)
        self.rope = Rope.from_gguf(gguf, w, self.n_rot, ROPE_NEOX)
        self.rope_local = dataclasses.replace(self.rope, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0)
        self.layers = [self.declare_layer(w, il) for il in range(self.n_layer)]

    def declare_layer(self, w, il: int) -> Layer:
        e, n_q, p = self.n_embd, self.head_dim * self.n_head, f"blk.{il}."
        return Layer(**declare_qkv(w, il, e, n_q, self.n_embd_k_gqa), wo=w.get(p + "attn_output.weight", (n_q, e)),
                     q_norm=w.get(p + "attn_q_norm.weight", (n_q,)),
                     k_norm=w.get(p + "attn_k_norm.weight", (self.n_embd_k_gqa,)),
                     post_attn_norm=w.get(p + "post_attention_norm.weight", (e,)),
                     **declare_ffn(w, il, e, self.n_ff_arr[il]), post_ffn_norm=w.get(p + "post_ffw_norm.weight", (e,)))

    def layer_rope(self, il: int) -> Rope:
        return self.rope_local if self.swa[il] else self.rope

    def norm_qk(self, step: Step, il: int, layer, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """RMS norms of the whole q and k projections, then one head per row."""
        ctx, hd, n = step.ctx, self.head_dim, step.n_tokens
        q = cb(rms_norm(ctx, q, layer.q_norm, self.eps), "Qcur_normed", il)
        k = cb(rms_norm(ctx, k, layer.k_norm, self.eps), "Kcur_normed", il)
        return ops.reshape_3d(ctx, q, hd, self.n_head, n), ops.reshape_3d(ctx, k, hd, self.n_head_kv, n)

    def build(self, step: Step, kv) -> Tensor:
        ctx, eps, n, hd = step.ctx, self.eps, step.n_tokens, self.head_dim
        x = cb(ops.get_rows(ctx, self.tok_embd, step.tokens), "inp_embd")
        for il, layer in enumerate(self.layers):
            q, k, v = build_qkv(step, layer, x, hd, self.n_head, self.n_head_kv, il, reshape=False)
            q, k = self.rope_qk(step, il, *self.norm_qk(step, il, layer, q, k))
            v = ops.reshape_3d(ctx, v, hd, self.n_head_kv, n)
            cur = attention(step, kv, il, cb(q, "Qcur", il), cb(k, "Kcur", il), v, self.kq_scale,
                            self.n_swa if self.swa[il] else None)
            cur = lora_mm(step, layer.wo, cur)
            if il == self.n_layer - 1:
                cur, x = step.select_outputs(cur, x)
            cur = cb(rms_norm(ctx, cur, layer.post_attn_norm, eps), "attn_post_norm", il)
            ffn_inp = cb(ops.add(ctx, cur, x), "ffn_inp", il)
            cur = cb(build_ffn(step, layer, ffn_inp, il), "ffn_out", il)
            cur = cb(rms_norm(ctx, cur, layer.post_ffn_norm, eps), "ffn_post_norm", il)
            x = cb(ops.add(ctx, cur, ffn_inp), "l_out", il)
        x = cb(rms_norm(ctx, x, self.output_norm, eps), "result_norm")
        return cb(lora_mm(step, self.output, x), "result_output")
