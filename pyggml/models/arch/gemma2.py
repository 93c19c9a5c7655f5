"""Gemma 2 (llama.cpp's llm_build_gemma2): embeddings scaled by sqrt(n_embd), pre- and post-norms around
attention and the GeGLU FFN, sliding-window attention on every other layer (llama.cpp's default window 4096
unless the file says), attention logits and final logits soft-capped (`attn_logit_softcapping`, default 50;
`final_logit_softcapping`, default 30), output tied to the token embeddings.

Gemma 3 (gemma3.py) is this graph with q/k norms and without the attention cap; it overrides `read_hparams`,
`new_layer` and `norm_qk`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.models.arch.blocks import ROPE_NEOX, Decoder, Rope, Step, attention, hparam, rms_norm, soft_cap, swa_layers

SWA_PATTERN = 2            # layer il uses the sliding window unless il % 2 == 1 (llama.cpp's default for gemma2)
SLIDING_WINDOW = 4096      # the window unless `attention.sliding_window` says
ATTN_SOFTCAP, FINAL_SOFTCAP = 50.0, 30.0


@dataclass
class Gemma2Layer:
    attn_norm: Tensor
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    post_attn_norm: Tensor
    ffn_norm: Tensor
    ffn_gate: Tensor
    ffn_up: Tensor
    ffn_down: Tensor
    post_ffn_norm: Tensor


class Gemma2(Decoder):
    takes_embeddings = True   # image rows through Step.input_embeddings
    N_LAYER_27B = 46  # gemma_pytorch: the 27B model scales queries by 1/sqrt(n_embd / n_head), not 1/sqrt(head_dim)

    def __init__(self, gguf, w):
        super().__init__(gguf, w)
        self.eps = hparam(gguf, "attention.layer_norm_rms_epsilon")
        self.n_rot = hparam(gguf, "rope.dimension_count", self.head_dim)
        self.rope_global = Rope.from_gguf(gguf, w, self.n_rot, ROPE_NEOX)
        self.read_hparams(gguf, w)
        n_q = self.n_embd / self.n_head if self.n_layer == self.N_LAYER_27B else self.head_dim
        self.attn_scale = 1.0 / math.sqrt(n_q)
        self.layers = [self.new_layer(w, i) for i in range(self.n_layer)]

    def read_hparams(self, gguf, w) -> None:
        """The sliding window and its layers, the local layers' RoPE (base `rope.freq_base_swa`, else the global
        one, at the file's scale), the soft-caps."""
        self.n_swa = hparam(gguf, "attention.sliding_window", SLIDING_WINDOW)
        self.swa = swa_layers(gguf, self.n_layer, SWA_PATTERN)
        self.rope_local = Rope.from_gguf(gguf, w, self.n_rot, ROPE_NEOX,
                                         hparam(gguf, "rope.freq_base_swa", self.rope_global.freq_base))
        self.attn_softcap = hparam(gguf, "attn_logit_softcapping", ATTN_SOFTCAP)
        self.final_softcap = hparam(gguf, "final_logit_softcapping", FINAL_SOFTCAP)

    def output_matrix(self, w) -> Tensor:
        return self.tok_embd  # always tied: llama.cpp's gemma2 creates no output.weight

    def new_layer(self, w, i: int) -> Gemma2Layer:
        e = (self.n_embd,)
        return Gemma2Layer(**self.projections(w, i), post_attn_norm=w.get(f"blk.{i}.post_attention_norm.weight", e),
                           post_ffn_norm=w.get(f"blk.{i}.post_ffw_norm.weight", e))

    def norm_qk(self, step: Step, layer, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q and k before RoPE (Gemma 3 normalizes each head)."""
        return q, k

    def layer_rope(self, il: int) -> Rope:
        return self.rope_local if self.swa[il] else self.rope_global

    def build(self, step: Step, kv) -> Tensor:
        ctx, eps, n = step.ctx, self.eps, step.n_tokens
        x = step.input_embeddings(self.tok_embd)  # token rows scaled by sqrt(n_embd); given embeddings are not
        x = ops.scale(ctx, x, math.sqrt(self.n_embd)) if step.embd is None else x
        for il, layer in enumerate(self.layers):
            swa, rope = self.swa[il], self.layer_rope(il)
            cur = rms_norm(ctx, x, layer.attn_norm, eps)
            q = ops.reshape_3d(ctx, ops.mul_mat(ctx, layer.wq, cur), self.head_dim, self.n_head, n)
            k = ops.reshape_3d(ctx, ops.mul_mat(ctx, layer.wk, cur), self.head_dim, self.n_head_kv, n)
            v = ops.reshape_3d(ctx, ops.mul_mat(ctx, layer.wv, cur), self.head_dim, self.n_head_kv, n)
            q, k = self.norm_qk(step, layer, q, k)
            q, k = rope.apply(step, q), rope.apply(step, k)
            q = ops.scale(ctx, q, self.attn_scale)
            cur = attention(step, kv, il, q, k, v, 1.0, self.n_swa if swa else None,
                            softcap=self.attn_softcap)
            cur = ops.mul_mat(ctx, layer.wo, cur)
            if il == self.n_layer - 1:
                cur, x = step.select_outputs(cur, x)
            sa_out = ops.add(ctx, rms_norm(ctx, cur, layer.post_attn_norm, eps), x)
            cur = rms_norm(ctx, sa_out, layer.ffn_norm, eps)
            gated = ops.geglu_split(ctx, ops.mul_mat(ctx, layer.ffn_gate, cur), ops.mul_mat(ctx, layer.ffn_up, cur))
            cur = rms_norm(ctx, ops.mul_mat(ctx, layer.ffn_down, gated), layer.post_ffn_norm, eps)
            x = ops.add(ctx, cur, sa_out)
        logits = ops.mul_mat(ctx, self.output, rms_norm(ctx, x, self.output_norm, eps))
        return soft_cap(ctx, logits, self.final_softcap) if self.final_softcap else logits
