"""Phi-3, Phi-3.5, Phi-4 and Phi-4-mini (llama.cpp's llm_build_phi3): a llama-like decoder with the q/k/v
projections fused into `attn_qkv` (separate attn_q/k/v are read too, as llama.cpp's create_tensor_qkv does),
the FFN's gate and up fused into one `ffn_up` of 2·n_ff rows (SwiGLU, the first half gated), queries scaled by
1/sqrt(head_dim) before the product, RoPE NEOX over `rope.dimension_count` dimensions (partial rotary in
Phi-4-mini), LongRoPE's short or long factors chosen by the context with `rope.scaling.attn_factor`; the
file's sliding window is ignored (llama.cpp disables it for phi3), the output is tied when output.weight is
absent."""

from __future__ import annotations

from dataclasses import dataclass

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.models.arch.blocks import (ROPE_NEOX, Decoder, Rope, Step, attention, default_kq_scale, hparam, linear,
                                       rms_norm, split_qkv)


@dataclass
class Phi3Layer:
    attn_norm: Tensor
    wqkv: Tensor | None            # fused [n_embd, q + k + v], or None with wq, wk, wv
    bqkv: Tensor | None
    wq: Tensor | None
    wk: Tensor | None
    wv: Tensor | None
    bq: Tensor | None
    bk: Tensor | None
    bv: Tensor | None
    wo: Tensor
    ffn_norm: Tensor
    ffn_up: Tensor                 # [n_embd, 2·n_ff]: gate rows, then up rows
    ffn_down: Tensor


class Phi3(Decoder):
    def __init__(self, gguf, w):
        super().__init__(gguf, w)
        self.eps = hparam(gguf, "attention.layer_norm_rms_epsilon")
        self.rope = Rope.from_gguf(gguf, w, hparam(gguf, "rope.dimension_count", self.head_dim), ROPE_NEOX)
        self.layers = [self.new_layer(w, i) for i in range(self.n_layer)]

    def new_layer(self, w, i: int) -> Phi3Layer:
        e, kv, f, p = self.n_embd, self.n_embd_k_gqa, self.n_ff_arr[i], f"blk.{i}."
        qkv = e + 2 * kv
        wqkv = w.optional(p + "attn_qkv.weight", (e, qkv))
        bqkv = w.optional(p + "attn_qkv.bias", (qkv,)) if wqkv is not None else None
        separate = {name: w.get(f"{p}attn_{name}.weight", (e, n)) if wqkv is None else None
                    for name, n in (("q", e), ("k", kv), ("v", kv))}
        # a fused matrix may come with separate biases (llama.cpp adds them when all three are there)
        biases = {name: w.optional(f"{p}attn_{name}.bias", (n,)) if bqkv is None else None
                  for name, n in (("q", e), ("k", kv), ("v", kv))}
        return Phi3Layer(attn_norm=w.get(p + "attn_norm.weight", (e,)), wqkv=wqkv, bqkv=bqkv,
                         **{f"w{name}": t for name, t in separate.items()},
                         **{f"b{name}": t for name, t in biases.items()},
                         wo=w.get(p + "attn_output.weight", (e, e)), ffn_norm=w.get(p + "ffn_norm.weight", (e,)),
                         ffn_up=w.get(p + "ffn_up.weight", (e, 2 * f)), ffn_down=w.get(p + "ffn_down.weight", (f, e)))

    def qkv(self, step: Step, layer: Phi3Layer, cur: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v per head from the fused or the separate projections (llama.cpp's build_qkv)."""
        ctx, hd, n = step.ctx, self.head_dim, step.n_tokens
        if layer.wqkv is None:
            return tuple(ops.reshape_3d(ctx, linear(ctx, wt, cur, b), hd, heads, n)
                         for wt, b, heads in ((layer.wq, layer.bq, self.n_head), (layer.wk, layer.bk, self.n_head_kv),
                                              (layer.wv, layer.bv, self.n_head_kv)))
        qkv = linear(ctx, layer.wqkv, cur, layer.bqkv)
        if layer.bq is not None and layer.bk is not None and layer.bv is not None:
            qkv = ops.add(ctx, qkv, ops.concat(ctx, ops.concat(ctx, layer.bq, layer.bk, 0), layer.bv, 0))
        return tuple(split_qkv(ctx, qkv, hd, self.n_head, self.n_head_kv, n))

    def layer_rope(self, il: int) -> Rope:
        return self.rope

    def build(self, step: Step, kv) -> Tensor:
        ctx, eps = step.ctx, self.eps
        x = ops.get_rows(ctx, self.tok_embd, step.tokens)
        for il, layer in enumerate(self.layers):
            q, k, v = self.qkv(step, layer, rms_norm(ctx, x, layer.attn_norm, eps))
            q, k = self.rope.apply(step, q), self.rope.apply(step, k)
            q = ops.scale(ctx, q, default_kq_scale(self.head_dim))
            cur = ops.mul_mat(ctx, layer.wo, attention(step, kv, il, q, k, v, 1.0))
            if il == self.n_layer - 1:
                cur, x = step.select_outputs(cur, x)
            ffn_inp = ops.add(ctx, cur, x)
            cur = ops.swiglu(ctx, ops.mul_mat(ctx, layer.ffn_up, rms_norm(ctx, ffn_inp, layer.ffn_norm, eps)))
            x = ops.add(ctx, ffn_inp, ops.mul_mat(ctx, layer.ffn_down, cur))
        return ops.mul_mat(ctx, self.output, rms_norm(ctx, x, self.output_norm, eps))
