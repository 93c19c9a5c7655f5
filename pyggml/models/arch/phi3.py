"""Phi-3, Phi-3.5, Phi-4 and Phi-4-mini (llama.cpp's llm_build_phi3): a llama-like decoder with the q/k/v
projections fused into `attn_qkv` (separate attn_q/k/v are read too, as llama.cpp's create_tensor_qkv does),
the FFN's gate and up fused into one `ffn_up` of 2·n_ff rows (SwiGLU, the first half gated), queries scaled by
1/sqrt(head_dim) before the product, RoPE NEOX over `rope.dimension_count` dimensions (partial rotary in
Phi-4-mini), LongRoPE's short or long factors chosen by the context with `rope.scaling.attn_factor`; the
file's sliding window is ignored (llama.cpp disables it for phi3), the output is tied when output.weight is
absent."""

from __future__ import annotations

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.models.arch.blocks import ROPE_NEOX, Decoder, Rope, Step, attention, default_kq_scale, hparam, rms_norm
from pyggml.models.arch.layers import Layer, build_qkv, cb, declare_qkv, lora_mm


class Phi3(Decoder):
    def read_hparams(self, gguf) -> None:
        super().read_hparams(gguf)
        self.eps = hparam(gguf, "attention.layer_norm_rms_epsilon")
        self.n_rot = hparam(gguf, "rope.dimension_count", self.head_dim)

    def declare(self, gguf, w) -> None:
        super().declare(gguf, w)
        self.rope = Rope.from_gguf(gguf, w, self.n_rot, ROPE_NEOX)
        self.layers = [self.declare_layer(w, il) for il in range(self.n_layer)]

    def declare_layer(self, w, il: int) -> Layer:
        e, f, p = self.n_embd, self.n_ff_arr[il], f"blk.{il}."
        return Layer(attn_norm=w.get(p + "attn_norm.weight", (e,)), **declare_qkv(w, il, e, e, self.n_embd_k_gqa),
                     wo=w.get(p + "attn_output.weight", (e, e)), ffn_norm=w.get(p + "ffn_norm.weight", (e,)),
                     ffn_up=w.get(p + "ffn_up.weight", (e, 2 * f)), ffn_down=w.get(p + "ffn_down.weight", (f, e)))

    def layer_rope(self, il: int) -> Rope:
        return self.rope

    def build(self, step: Step, kv) -> Tensor:
        ctx, eps = step.ctx, self.eps
        x = cb(ops.get_rows(ctx, self.tok_embd, step.tokens), "inp_embd")
        for il, layer in enumerate(self.layers):
            cur = cb(rms_norm(ctx, x, layer.attn_norm, eps), "attn_norm", il)
            q, k, v = build_qkv(step, layer, cur, self.head_dim, self.n_head, self.n_head_kv, il)
            q, k = self.rope_qk(step, il, q, k)
            q = cb(ops.scale(ctx, cb(q, "Qcur", il), default_kq_scale(self.head_dim)), "Qcur_scaled", il)
            cur = attention(step, kv, il, q, cb(k, "Kcur", il), v, 1.0)
            cur = cb(lora_mm(step, layer.wo, cur), "attn_out", il)
            if il == self.n_layer - 1:
                cur, x = step.select_outputs(cur, x)
            ffn_inp = cb(ops.add(ctx, cur, x), "ffn_inp", il)
            cur = cb(rms_norm(ctx, ffn_inp, layer.ffn_norm, eps), "ffn_norm", il)
            cur = cb(ops.swiglu(ctx, cb(lora_mm(step, layer.ffn_up, cur), "ffn_up", il)), "ffn_swiglu", il)
            cur = cb(lora_mm(step, layer.ffn_down, cur), "ffn_out", il)
            x = cb(ops.add(ctx, ffn_inp, cur), "l_out", il)
        x = cb(rms_norm(ctx, x, self.output_norm, eps), "result_norm")
        return cb(lora_mm(step, self.output, x), "result_output")
