"""Gemma 3 (llama.cpp's llm_build_gemma3, iSWA variant): q/k RMS norms, pre- and post-norms, GeGLU,
embeddings scaled by sqrt(n_embd), sliding-window attention (5 layers of every 6 unless the file says
otherwise) with its own RoPE base, and tied output."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.models.arch.blocks import ROPE_NEOX, Decoder, Rope, Step, attention, hparam, rms_norm, swa_layers

SWA_PATTERN = 6           # by default layer il uses the sliding window unless il % 6 == 5 (llama.cpp's)
SWA_FREQ_BASE = 10000.0   # the local layers' RoPE base unless `rope.freq_base_swa` says


@dataclass
class Gemma3Layer:
    attn_norm: Tensor
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    q_norm: Tensor
    k_norm: Tensor
    post_attn_norm: Tensor
    ffn_norm: Tensor
    ffn_gate: Tensor
    ffn_up: Tensor
    ffn_down: Tensor
    post_ffn_norm: Tensor


class Gemma3(Decoder):
    def __init__(self, gguf, w):
        super().__init__(gguf, w)
        self.eps = hparam(gguf, "attention.layer_norm_rms_epsilon")
        self.n_swa = hparam(gguf, "attention.sliding_window", 0)
        self.swa = swa_layers(gguf, self.n_layer, SWA_PATTERN) if self.n_swa > 0 else [False] * self.n_layer
        n_rot = hparam(gguf, "rope.dimension_count", self.head_dim)
        self.rope_global = Rope.from_gguf(gguf, w, n_rot, ROPE_NEOX)
        self.rope_local = Rope.from_gguf(gguf, w, n_rot, ROPE_NEOX, hparam(gguf, "rope.freq_base_swa", SWA_FREQ_BASE),
                                         1.0)
        # gemma_pytorch: query_pre_attn_scalar = head_dim except for the 27B model (62 layers)
        self.attn_scale = 1.0 / math.sqrt(self.n_embd / self.n_head if self.n_layer == 62 else self.head_dim)
        self.softcap = gguf.get("gemma3.final_logit_softcapping")
        e, hd = self.n_embd, self.head_dim
        self.layers = [Gemma3Layer(
            **self.projections(w, i),
            q_norm=w.get(f"blk.{i}.attn_q_norm.weight", (hd,)),
            k_norm=w.get(f"blk.{i}.attn_k_norm.weight", (hd,)),
            post_attn_norm=w.get(f"blk.{i}.post_attention_norm.weight", (e,)),
            post_ffn_norm=w.get(f"blk.{i}.post_ffw_norm.weight", (e,)),
        ) for i in range(self.n_layer)]

    def layer_rope(self, il: int) -> Rope:
        return self.rope_local if self.swa[il] else self.rope_global

    def build(self, step: Step, kv) -> Tensor:
        ctx, eps, n = step.ctx, self.eps, step.n_tokens
        x = ops.scale(ctx, ops.get_rows(ctx, self.tok_embd, step.tokens), math.sqrt(self.n_embd))
        for il, layer in enumerate(self.layers):
            swa, rope = self.swa[il], self.layer_rope(il)
            cur = rms_norm(ctx, x, layer.attn_norm, eps)
            q = ops.reshape_3d(ctx, ops.mul_mat(ctx, layer.wq, cur), self.head_dim, self.n_head, n)
            k = ops.reshape_3d(ctx, ops.mul_mat(ctx, layer.wk, cur), self.head_dim, self.n_head_kv, n)
            v = ops.reshape_3d(ctx, ops.mul_mat(ctx, layer.wv, cur), self.head_dim, self.n_head_kv, n)
            q = rope.apply(step, rms_norm(ctx, q, layer.q_norm, eps))
            k = rope.apply(step, rms_norm(ctx, k, layer.k_norm, eps))
            q = ops.scale(ctx, q, self.attn_scale)
            cur = attention(step, kv, il, q, k, v, 1.0, self.n_swa if swa else None)
            cur = ops.mul_mat(ctx, layer.wo, cur)
            if il == self.n_layer - 1:
                cur, x = step.select_outputs(cur, x)
            sa_out = ops.add(ctx, rms_norm(ctx, cur, layer.post_attn_norm, eps), x)
            cur = rms_norm(ctx, sa_out, layer.ffn_norm, eps)
            gated = ops.geglu_split(ctx, ops.mul_mat(ctx, layer.ffn_gate, cur), ops.mul_mat(ctx, layer.ffn_up, cur))
            cur = rms_norm(ctx, ops.mul_mat(ctx, layer.ffn_down, gated), layer.post_ffn_norm, eps)
            x = ops.add(ctx, cur, sa_out)
        logits = ops.mul_mat(ctx, self.output, rms_norm(ctx, x, self.output_norm, eps))
        if self.softcap:
            logits = ops.scale(ctx, ops.tanh(ctx, ops.scale(ctx, logits, 1.0 / self.softcap)), self.softcap)
        return logits
