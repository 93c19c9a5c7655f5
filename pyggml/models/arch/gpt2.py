"""GPT-2 (llama.cpp's llm_build_gpt2): learned positions, layer norms with bias, fused QKV, GELU MLP."""

from __future__ import annotations

from dataclasses import dataclass

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.models.arch.blocks import (Decoder, Step, attention, default_kq_scale, hparam, layer_norm, linear,
                                       split_qkv)


@dataclass
class GPT2Layer:
    attn_norm: Tensor
    attn_norm_b: Tensor
    wqkv: Tensor
    bqkv: Tensor
    wo: Tensor
    bo: Tensor
    ffn_norm: Tensor
    ffn_norm_b: Tensor
    ffn_up: Tensor
    ffn_up_b: Tensor
    ffn_down: Tensor
    ffn_down_b: Tensor


class GPT2(Decoder):
    shiftable = False  # learned absolute positions are added to the input: cached keys cannot be moved

    def __init__(self, gguf, w):
        super().__init__(gguf, w)
        self.eps = hparam(gguf, "attention.layer_norm_epsilon")
        e, f = self.n_embd, self.n_ff
        self.pos_embd = w.get("position_embd.weight", (e, self.n_ctx_train))
        self.output_norm_b = w.get("output_norm.bias", (e,))
        self.layers = [GPT2Layer(
            attn_norm=w.get(f"blk.{i}.attn_norm.weight", (e,)),
            attn_norm_b=w.get(f"blk.{i}.attn_norm.bias", (e,)),
            wqkv=w.get(f"blk.{i}.attn_qkv.weight", (e, 3 * e)),
            bqkv=w.get(f"blk.{i}.attn_qkv.bias", (3 * e,)),
            wo=w.get(f"blk.{i}.attn_output.weight", (e, e)),
            bo=w.get(f"blk.{i}.attn_output.bias", (e,)),
            ffn_norm=w.get(f"blk.{i}.ffn_norm.weight", (e,)),
            ffn_norm_b=w.get(f"blk.{i}.ffn_norm.bias", (e,)),
            ffn_up=w.get(f"blk.{i}.ffn_up.weight", (e, f)),
            ffn_up_b=w.get(f"blk.{i}.ffn_up.bias", (f,)),
            ffn_down=w.get(f"blk.{i}.ffn_down.weight", (f, e)),
            ffn_down_b=w.get(f"blk.{i}.ffn_down.bias", (e,)),
        ) for i in range(self.n_layer)]

    def build(self, step: Step, kv) -> Tensor:
        ctx, eps, n, hd = step.ctx, self.eps, step.n_tokens, self.head_dim
        x = ops.add(ctx, ops.get_rows(ctx, self.tok_embd, step.tokens),
                    ops.get_rows(ctx, self.pos_embd, step.positions))
        for il, layer in enumerate(self.layers):
            qkv = linear(ctx, layer.wqkv, layer_norm(ctx, x, layer.attn_norm, layer.attn_norm_b, eps), layer.bqkv)
            q, k, v = split_qkv(ctx, qkv, hd, self.n_head, self.n_head, n)
            cur = linear(ctx, layer.wo, attention(step, kv, il, q, k, v, default_kq_scale(hd)), layer.bo)
            if il == self.n_layer - 1:
                cur, x = step.select_outputs(cur, x)
            ffn_inp = ops.add(ctx, cur, x)
            cur = layer_norm(ctx, ffn_inp, layer.ffn_norm, layer.ffn_norm_b, eps)
            cur = ops.gelu(ctx, linear(ctx, layer.ffn_up, cur, layer.ffn_up_b))
            x = ops.add(ctx, linear(ctx, layer.ffn_down, cur, layer.ffn_down_b), ffn_inp)
        x = layer_norm(ctx, x, self.output_norm, self.output_norm_b, eps)
        return ops.mul_mat(ctx, self.output, x)
