"""GPT-2 (llama.cpp's llm_build_gpt2): learned positions, layer norms with bias, fused QKV, GELU MLP.

The LayerNorm decoders built like it subclass it (starcoder2): class attributes for what llama.cpp's loaders
switch (`QKV_FUSED`, `ROPE_MODE`) and the graph hooks `embed` and `layer_rope`.
"""

from __future__ import annotations

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.models.arch.blocks import Decoder, Rope, Step, attention, default_kq_scale, hparam, layer_norm
from pyggml.models.arch.layers import Layer, build_ffn, build_qkv, cb, declare_ffn, declare_qkv, lora_mm


class GPT2(Decoder):
    QKV_FUSED = "required"  # declare_qkv's `fused`: gpt2's loader takes only attn_qkv and its bias
    ROPE_MODE = None        # None: learned absolute positions (position_embd) added to the input, no RoPE

    def read_hparams(self, gguf) -> None:
        super().read_hparams(gguf)
        self.eps = hparam(gguf, "attention.layer_norm_epsilon")

    def declare(self, gguf, w) -> None:
        super().declare(gguf, w)
        if self.ROPE_MODE is None:
            self.pos_embd = w.get("position_embd.weight", (self.n_embd, self.n_ctx_train))
        else:
            self.rope = Rope.from_gguf(gguf, w, hparam(gguf, "rope.dimension_count", self.head_dim), self.ROPE_MODE)
        self.output_norm_b = w.get("output_norm.bias", (self.n_embd,))
        self.layers = [self.declare_layer(w, il) for il in range(self.n_layer)]

    def declare_layer(self, w, il: int) -> Layer:
        """Layer il: every norm, the attention output and the FFN's up and down each with a required bias."""
        e, f, p = self.n_embd, self.n_ff_arr[il], f"blk.{il}."
        ffn = declare_ffn(w, il, e, f, gate=False) | dict(ffn_up_b=w.get(p + "ffn_up.bias", (f,)),
                                                         ffn_down_b=w.get(p + "ffn_down.bias", (e,)))
        return Layer(attn_norm=w.get(p + "attn_norm.weight", (e,)), attn_norm_b=w.get(p + "attn_norm.bias", (e,)),
                     **declare_qkv(w, il, e, e, self.n_embd_k_gqa, fused=self.QKV_FUSED),
                     wo=w.get(p + "attn_output.weight", (e, e)), bo=w.get(p + "attn_output.bias", (e,)),
                     ffn_norm=w.get(p + "ffn_norm.weight", (e,)), ffn_norm_b=w.get(p + "ffn_norm.bias", (e,)), **ffn)

    def embed(self, step: Step) -> Tensor:
        """The token embeddings plus, without RoPE, the learned embeddings of their positions ("inpL")."""
        ctx = step.ctx
        x = cb(ops.get_rows(ctx, self.tok_embd, step.tokens), "inp_embd")
        if self.ROPE_MODE is not None:
            return x
        return cb(ops.add(ctx, x, ops.get_rows(ctx, self.pos_embd, step.positions)), "inpL")

    def build(self, step: Step, kv) -> Tensor:
        ctx, eps, hd = step.ctx, self.eps, self.head_dim
        x = self.embed(step)
        for il, layer in enumerate(self.layers):
            cur = cb(layer_norm(ctx, x, layer.attn_norm, layer.attn_norm_b, eps), "attn_norm", il)
            q, k, v = build_qkv(step, layer, cur, hd, self.n_head, self.n_head_kv, il)
            q, k = self.rope_qk(step, il, q, k)
            cur = attention(step, kv, il, cb(q, "Qcur", il), cb(k, "Kcur", il), v, default_kq_scale(hd))
            cur = cb(lora_mm(step, layer.wo, cur, layer.bo), "attn_out", il)
            if il == self.n_layer - 1:
                cur, x = step.select_outputs(cur, x)
            ffn_inp = cb(ops.add(ctx, cur, x), "ffn_inp", il)
            cur = cb(layer_norm(ctx, ffn_inp, layer.ffn_norm, layer.ffn_norm_b, eps), "ffn_norm", il)
            cur = cb(build_ffn(step, layer, cur, il, act="gelu"), "ffn_out", il)
            x = cb(ops.add(ctx, cur, ffn_inp), "l_out", il)
        x = cb(layer_norm(ctx, x, self.output_norm, self.output_norm_b, eps), "result_norm")
        return cb(lora_mm(step, self.output, x), "result_output")
