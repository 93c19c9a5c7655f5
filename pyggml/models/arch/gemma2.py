"""Gemma 2 (llama.cpp's llm_build_gemma2): embeddings scaled by sqrt(n_embd), pre- and post-norms around
attention and the GeGLU FFN, sliding-window attention on every other layer (llama.cpp's default window 4096
unless the file says), attention logits and final logits soft-capped (`attn_logit_softcapping`, default 50;
`final_logit_softcapping`, default 30), output tied to the token embeddings.

Gemma 3 (gemma3.py) is this graph with q/k norms and without the attention cap; it overrides
`read_swa`, sets `QK_NORM` and reads output.weight when the file has one.
"""

from __future__ import annotations

import math

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.models.arch.blocks import ROPE_NEOX, Decoder, Rope, Step, attention, hparam, rms_norm, soft_cap, swa_layers
from pyggml.models.arch.layers import Layer, build_ffn, build_qkv, cb, declare_ffn, declare_qkv, lora_mm

SWA_PATTERN = 2            # layer il uses the sliding window unless il % 2 == 1 (llama.cpp's default for gemma2)
SLIDING_WINDOW = 4096      # the window unless `attention.sliding_window` says
ATTN_SOFTCAP, FINAL_SOFTCAP = 50.0, 30.0


class Gemma2(Decoder):
    takes_embeddings = True   # image rows through Step.input_embeddings
    N_LAYER_27B = 46  # gemma_pytorch: the 27B model scales queries by 1/sqrt(n_embd / n_head), not 1/sqrt(head_dim)
    OUTPUT = "tied"   # llama.cpp's gemma2 creates no output.weight
    QK_NORM = False   # RMS norms of each head's q and k before RoPE (gemma3)
    SWA_FREQ_BASE = None    # the local layers' RoPE base unless `rope.freq_base_swa` says (None: the global one)
    SWA_FREQ_SCALE = None   # and scale (None: the file's)

    def read_hparams(self, gguf) -> None:
        super().read_hparams(gguf)
        self.eps = hparam(gguf, "attention.layer_norm_rms_epsilon")
        self.n_rot = hparam(gguf, "rope.dimension_count", self.head_dim)
        self.read_swa(gguf)
        n_q = self.n_embd / self.n_head if self.n_layer == self.N_LAYER_27B else self.head_dim
        self.attn_scale = 1.0 / math.sqrt(n_q)

    def read_swa(self, gguf) -> None:
        """The sliding window and its layers, the soft-caps."""
        self.n_swa = hparam(gguf, "attention.sliding_window", SLIDING_WINDOW)
        self.swa = swa_layers(gguf, self.n_layer, SWA_PATTERN)
        self.attn_softcap = hparam(gguf, "attn_logit_softcapping", ATTN_SOFTCAP)
        self.final_softcap = hparam(gguf, "final_logit_softcapping", FINAL_SOFTCAP)

    def declare(self, gguf, w) -> None:
        super().declare(gguf, w)
        self.rope_global = Rope.from_gguf(gguf, w, self.n_rot, ROPE_NEOX)
        self.rope_local = Rope.from_gguf(gguf, w, self.n_rot, ROPE_NEOX, hparam(
            gguf, "rope.freq_base_swa", self.SWA_FREQ_BASE or self.rope_global.freq_base), self.SWA_FREQ_SCALE)
        self.layers = [self.declare_layer(w, il) for il in range(self.n_layer)]

    def declare_layer(self, w, il: int) -> Layer:
        e, p, hd = (self.n_embd,), f"blk.{il}.", (self.head_dim,)
        layer = Layer(attn_norm=w.get(p + "attn_norm.weight", e),
                      **declare_qkv(w, il, self.n_embd, self.head_dim * self.n_head, self.n_embd_k_gqa),
                      wo=w.get(p + "attn_output.weight", (self.head_dim * self.n_head, self.n_embd)),
                      post_attn_norm=w.get(p + "post_attention_norm.weight", e),
                      ffn_norm=w.get(p + "ffn_norm.weight", e),
                      **declare_ffn(w, il, self.n_embd, self.n_ff_arr[il]),
                      post_ffn_norm=w.get(p + "post_ffw_norm.weight", e))
        if self.QK_NORM:
            layer.q_norm, layer.k_norm = w.get(p + "attn_q_norm.weight", hd), w.get(p + "attn_k_norm.weight", hd)
        return layer

    def norm_qk(self, step: Step, il: int, layer, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        if not self.QK_NORM:
            return q, k
        return (cb(rms_norm(step.ctx, q, layer.q_norm, self.eps), "Qcur_normed", il),
                cb(rms_norm(step.ctx, k, layer.k_norm, self.eps), "Kcur_normed", il))

    def layer_rope(self, il: int) -> Rope:
        return self.rope_local if self.swa[il] else self.rope_global

    def build(self, step: Step, kv) -> Tensor:
        ctx, eps = step.ctx, self.eps
        x = step.input_embeddings(self.tok_embd)  # token rows scaled by sqrt(n_embd); given embeddings are not
        x = cb(ops.scale(ctx, x, math.sqrt(self.n_embd)) if step.embd is None else x, "inp_scaled")
        for il, layer in enumerate(self.layers):
            cur = cb(rms_norm(ctx, x, layer.attn_norm, eps), "attn_norm", il)
            q, k, v = build_qkv(step, layer, cur, self.head_dim, self.n_head, self.n_head_kv, il)
            q, k = self.rope_qk(step, il, *self.norm_qk(step, il, layer, q, k))
            q = cb(ops.scale(ctx, cb(q, "Qcur", il), self.attn_scale), "Qcur_scaled", il)
            cur = attention(step, kv, il, q, cb(k, "Kcur", il), v, 1.0, self.n_swa if self.swa[il] else None,
                            softcap=self.attn_softcap)
            cur = lora_mm(step, layer.wo, cur)
            if il == self.n_layer - 1:
                cur, x = step.select_outputs(cur, x)
            cur = cb(rms_norm(ctx, cur, layer.post_attn_norm, eps), "attn_post_norm", il)
            sa_out = cb(ops.add(ctx, cur, x), "sa_out", il)
            cur = cb(rms_norm(ctx, sa_out, layer.ffn_norm, eps), "ffn_norm", il)
            cur = cb(build_ffn(step, layer, cur, il, act="gelu"), "ffn_out", il)
            cur = cb(rms_norm(ctx, cur, layer.post_ffn_norm, eps), "ffn_post_norm", il)
            x = cb(ops.add(ctx, cur, sa_out), "l_out", il)
        x = cb(rms_norm(ctx, x, self.output_norm, eps), "result_norm")
        logits = lora_mm(step, self.output, x)
        return cb(soft_cap(ctx, logits, self.final_softcap) if self.final_softcap else logits, "result_output")
