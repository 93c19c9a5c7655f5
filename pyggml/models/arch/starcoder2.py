"""StarCoder 2 (llama.cpp's llm_build_starcoder2, src/models/starcoder2.cpp; StarCoder2 3B/7B/15B, Granite Code
20B/34B): LayerNorms with biases, GQA with NeoX RoPE, q/k/v projections (separate or fused) with optional
biases, a required attention output bias, a GELU FFN without a gate whose up and down biases are required;
the output tied to the token embeddings when the file has no output.weight."""

from __future__ import annotations

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.models.arch.blocks import (ROPE_NEOX, Decoder, Rope, Step, attention, default_kq_scale, hparam,
                                       layer_norm)
from pyggml.models.arch.layers import Layer, build_ffn, build_qkv, cb, declare_qkv, lora_mm


class StarCoder2(Decoder):
    def read_hparams(self, gguf) -> None:
        super().read_hparams(gguf)
        self.eps = hparam(gguf, "attention.layer_norm_epsilon")

    def declare(self, gguf, w) -> None:
        super().declare(gguf, w)
        self.output_norm_b = w.get("output_norm.bias", (self.n_embd,))
        self.rope = Rope.from_gguf(gguf, w, hparam(gguf, "rope.dimension_count", self.head_dim), ROPE_NEOX)
        self.layers = [self.declare_layer(w, il) for il in range(self.n_layer)]

    def declare_layer(self, w, il: int) -> Layer:
        e, f, p = self.n_embd, self.n_ff_arr[il], f"blk.{il}."
        vector = {name: w.get(f"{p}{name}", (n,)) for name, n in (
            ("attn_norm.weight", e), ("attn_norm.bias", e), ("attn_output.bias", e), ("ffn_norm.weight", e),
            ("ffn_norm.bias", e), ("ffn_up.bias", f), ("ffn_down.bias", e))}
        return Layer(attn_norm=vector["attn_norm.weight"], attn_norm_b=vector["attn_norm.bias"],
                     **declare_qkv(w, il, e, e, self.n_embd_k_gqa),
                     wo=w.get(p + "attn_output.weight", (e, e)), bo=vector["attn_output.bias"],
                     ffn_norm=vector["ffn_norm.weight"], ffn_norm_b=vector["ffn_norm.bias"],
                     ffn_gate=None, ffn_gate_b=None, ffn_up=w.get(p + "ffn_up.weight", (e, f)),
                     ffn_up_b=vector["ffn_up.bias"], ffn_down=w.get(p + "ffn_down.weight", (f, e)),
                     ffn_down_b=vector["ffn_down.bias"])

    def layer_rope(self, il: int) -> Rope:
        return self.rope

    def build(self, step: Step, kv) -> Tensor:
        ctx, eps = step.ctx, self.eps
        x = cb(ops.get_rows(ctx, self.tok_embd, step.tokens), "inp_embd")
        for il, layer in enumerate(self.layers):
            cur = cb(layer_norm(ctx, x, layer.attn_norm, layer.attn_norm_b, eps), "attn_norm", il)
            q, k, v = build_qkv(step, layer, cur, self.head_dim, self.n_head, self.n_head_kv, il)
            q, k = self.rope_qk(step, il, q, k)
            cur = attention(step, kv, il, cb(q, "Qcur", il), cb(k, "Kcur", il), v, default_kq_scale(self.head_dim))
            cur = cb(lora_mm(step, layer.wo, cur, layer.bo), "attn_out", il)
            if il == self.n_layer - 1:
                cur, x = step.select_outputs(cur, x)
            ffn_inp = cb(ops.add(ctx, cur, x), "ffn_inp", il)
            cur = cb(layer_norm(ctx, ffn_inp, layer.ffn_norm, layer.ffn_norm_b, eps), "ffn_norm", il)
            cur = cb(build_ffn(step, layer, cur, il, act="gelu"), "ffn_out", il)
            x = cb(ops.add(ctx, cur, ffn_inp), "l_out", il)
        x = cb(layer_norm(ctx, x, self.output_norm, self.output_norm_b, eps), "result_norm")
        return cb(lora_mm(step, self.output, x), "result_output")
