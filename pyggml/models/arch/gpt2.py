"""GPT-2 (llama.cpp's llm_build_gpt2): learned positions, layer norms with bias, fused QKV, GELU MLP."""

from __future__ import annotations

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.models.arch.blocks import Decoder, Step, attention, default_kq_scale, hparam, layer_norm
from pyggml.models.arch.layers import Layer, build_ffn, build_qkv, cb, declare_ffn, declare_qkv, lora_mm


class GPT2(Decoder):
    shiftable = False  # learned absolute positions are added to the input: cached keys cannot be moved

    def read_hparams(self, gguf) -> None:
        super().read_hparams(gguf)
        self.eps = hparam(gguf, "attention.layer_norm_epsilon")

    def declare(self, gguf, w) -> None:
        super().declare(gguf, w)
        e = (self.n_embd,)
        self.pos_embd = w.get("position_embd.weight", (self.n_embd, self.n_ctx_train))
        self.output_norm_b = w.get("output_norm.bias", e)
        self.layers = [Layer(
            attn_norm=w.get(f"blk.{il}.attn_norm.weight", e), attn_norm_b=w.get(f"blk.{il}.attn_norm.bias", e),
            **declare_qkv(w, il, self.n_embd, self.n_embd, self.n_embd, fused="required"),
            wo=w.get(f"blk.{il}.attn_output.weight", (self.n_embd, self.n_embd)),
            bo=w.get(f"blk.{il}.attn_output.bias", e),
            ffn_norm=w.get(f"blk.{il}.ffn_norm.weight", e), ffn_norm_b=w.get(f"blk.{il}.ffn_norm.bias", e),
            **self.required_biases(declare_ffn(w, il, self.n_embd, self.n_ff, gate=False), w, il))
            for il in range(self.n_layer)]

    def required_biases(self, ffn: dict, w, il: int) -> dict:
        """GPT-2's up and down biases are required."""
        return ffn | dict(ffn_up_b=w.get(f"blk.{il}.ffn_up.bias", (self.n_ff,)),
                          ffn_down_b=w.get(f"blk.{il}.ffn_down.bias", (self.n_embd,)))

    def build(self, step: Step, kv) -> Tensor:
        ctx, eps, hd = step.ctx, self.eps, self.head_dim
        x = cb(ops.add(ctx, cb(ops.get_rows(ctx, self.tok_embd, step.tokens), "inp_embd"),
                       ops.get_rows(ctx, self.pos_embd, step.positions)), "inpL")
        for il, layer in enumerate(self.layers):
            cur = cb(layer_norm(ctx, x, layer.attn_norm, layer.attn_norm_b, eps), "attn_norm", il)
            q, k, v = build_qkv(step, layer, cur, hd, self.n_head, self.n_head, il)
            cur = lora_mm(step, layer.wo, attention(step, kv, il, q, k, v, default_kq_scale(hd)), layer.bo)
            cur = cb(cur, "attn_out", il)
            if il == self.n_layer - 1:
                cur, x = step.select_outputs(cur, x)
            ffn_inp = cb(ops.add(ctx, cur, x), "ffn_inp", il)
            cur = cb(layer_norm(ctx, ffn_inp, layer.ffn_norm, layer.ffn_norm_b, eps), "ffn_norm", il)
            cur = cb(build_ffn(step, layer, cur, il, act="gelu"), "ffn_out", il)
            x = cb(ops.add(ctx, cur, ffn_inp), "l_out", il)
        x = cb(layer_norm(ctx, x, self.output_norm, self.output_norm_b, eps), "result_norm")
        return cb(lora_mm(step, self.output, x), "result_output")
