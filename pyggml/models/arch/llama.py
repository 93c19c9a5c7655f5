"""Llama-family decoders (llama.cpp's llm_build_llama / llm_build_qwen2): RMS norms, GQA, RoPE, SwiGLU.

Covers the llama layout (Llama, Mistral, and Mixtral: a file with `expert_count` > 0 has mixture-of-experts
FFNs, routed by softmax over the experts with the chosen weights normalised) and qwen2's: qwen2 adds biases to
q, k, v (any present bias is used), rotates in NeoX mode and may add `output.bias` to the logits; llama uses
the normal mode. Llama and granite files may also give the attention output's bias and the dense FFN's gate,
up and down biases (llama.cpp loads all of these as optional tensors; the other architectures' loaders take
no attention output or FFN bias, so their files holding one are refused). The architectures that
differ from it in a few places (qwen3, qwen3moe, qwen2moe, smollm3, granite, granitemoe, gpt-oss) subclass it
and override the hooks: `new_layer`, `experts`, `rope_qk`, `attend`, `embed`, `residual` and `logits`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.errors import GGUFError
from pyggml.models.arch.blocks import (ROPE_NEOX, ROPE_NORMAL, Decoder, Rope, Step, attention, default_kq_scale,
                                       hparam, linear, rms_norm)
from pyggml.models.arch.moe import Experts, expert_counts, moe_ffn

FFN_BIAS_ARCHS = ("llama", "granite", "granitemoe")  # whose loaders take ffn_{gate,up,down}.bias (dense layers)
ATTN_OUT_BIAS_ARCHS = ("llama", "granite", "granitemoe")  # and attn_output.bias (gpt-oss requires its own)
ROPE_MODES = {"llama": ROPE_NORMAL, "qwen2": ROPE_NEOX, "qwen3": ROPE_NEOX, "smollm3": ROPE_NORMAL,
              "granite": ROPE_NORMAL, "qwen3moe": ROPE_NEOX, "gpt-oss": ROPE_NEOX, "qwen2moe": ROPE_NEOX,
              "granitemoe": ROPE_NORMAL}


@dataclass
class LlamaLayer:
    attn_norm: Tensor
    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    bq: Tensor | None
    bk: Tensor | None
    bv: Tensor | None
    bo: Tensor | None
    ffn_norm: Tensor
    ffn_gate: Tensor | None   # the dense FFN, or None in a layer of experts
    ffn_up: Tensor | None
    ffn_down: Tensor | None
    moe: Experts | None
    ffn_gate_b: Tensor | None
    ffn_up_b: Tensor | None
    ffn_down_b: Tensor | None


class Llama(Decoder):
    takes_embeddings = True   # image rows through Step.input_embeddings
    FFN_NORM = "ffn_norm"     # the norm before the FFN (gpt-oss calls it post_attention_norm)
    MOE_ONLY = False          # whether the architecture needs expert_count > 0 (qwen3moe, gpt-oss)

    def __init__(self, gguf, w):
        super().__init__(gguf, w)
        self.eps = hparam(gguf, "attention.layer_norm_rms_epsilon")
        self.rope = Rope.from_gguf(gguf, w, hparam(gguf, "rope.dimension_count", self.head_dim),
                                   ROPE_MODES[gguf.architecture])
        self.kq_scale = default_kq_scale(self.head_dim)
        self.n_expert, self.n_expert_used = expert_counts(gguf, self.n_layer)
        self.ffn_biases = gguf.architecture in FFN_BIAS_ARCHS
        self.attn_out_bias = gguf.architecture in ATTN_OUT_BIAS_ARCHS
        # qwen2's logits bias (llama.cpp's output_b)
        self.output_b = w.optional("output.bias", (self.n_vocab,)) if gguf.architecture == "qwen2" else None
        if self.MOE_ONLY and not self.n_expert:
            raise GGUFError(f"{gguf.path}: {gguf.architecture} needs metadata key '{gguf.architecture}.expert_count' "
                            f"> 0 (its FFNs are experts)")
        self.layers = [self.new_layer(w, i) for i in range(self.n_layer)]

    def new_layer(self, w, i: int) -> LlamaLayer:
        e, q, kv, p = self.n_embd, self.head_dim * self.n_head, self.n_embd_k_gqa, f"blk.{i}."
        no_biases = dict(ffn_gate_b=None, ffn_up_b=None, ffn_down_b=None)
        if self.n_expert:
            ffn = dict(ffn_gate=None, ffn_up=None, ffn_down=None, moe=self.experts(w, i), **no_biases)
        else:
            ffn = dict(**self.ffn_projections(w, i), moe=None, **(self.ffn_bias_vectors(w, i) if self.ffn_biases
                                                                   else no_biases))
        return LlamaLayer(attn_norm=w.get(p + "attn_norm.weight", (e,)), **self.attention_projections(w, i),
                          ffn_norm=w.get(p + self.FFN_NORM + ".weight", (e,)), **ffn,
                          bq=w.optional(p + "attn_q.bias", (q,)), bk=w.optional(p + "attn_k.bias", (kv,)),
                          bv=w.optional(p + "attn_v.bias", (kv,)),
                          bo=w.optional(p + "attn_output.bias", (e,)) if self.attn_out_bias else None)

    def ffn_bias_vectors(self, w, i: int) -> dict:
        """Layer i's optional dense-FFN biases (llama, granite)."""
        f, p = self.n_ff_arr[i], f"blk.{i}."
        return dict(ffn_gate_b=w.optional(p + "ffn_gate.bias", (f,)), ffn_up_b=w.optional(p + "ffn_up.bias", (f,)),
                    ffn_down_b=w.optional(p + "ffn_down.bias", (self.n_embd,)))

    def experts(self, w, i: int) -> Experts:
        """Layer i's experts (llama, granite: n_ff wide, ffn_gate_exps optional, softmax, weights normalised)."""
        return Experts.load(w, i, self.n_embd, self.n_ff_arr[i], self.n_expert, self.n_expert_used,
                            gate_required=False, gating="softmax", norm_w=True)

    def layer_rope(self, il: int) -> Rope:
        return self.rope

    def embed(self, step: Step) -> Tensor:
        return step.input_embeddings(self.tok_embd)

    def rope_qk(self, step: Step, il: int, layer, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return self.rope.apply(step, q), self.rope.apply(step, k)

    def residual(self, step: Step, branch: Tensor) -> Tensor:
        """A branch's output before it is added to the residual stream."""
        return branch

    def attend(self, step: Step, kv, il: int, layer, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return attention(step, kv, il, q, k, v, self.kq_scale)

    def ffn(self, step: Step, layer, cur: Tensor) -> Tensor:
        ctx = step.ctx
        if layer.moe is not None:
            return moe_ffn(ctx, layer.moe, cur)
        gated = ops.swiglu_split(ctx, linear(ctx, layer.ffn_gate, cur, layer.ffn_gate_b),
                                 linear(ctx, layer.ffn_up, cur, layer.ffn_up_b))
        return linear(ctx, layer.ffn_down, gated, layer.ffn_down_b)

    def logits(self, step: Step, x: Tensor) -> Tensor:
        return linear(step.ctx, self.output, rms_norm(step.ctx, x, self.output_norm, self.eps), self.output_b)

    def build(self, step: Step, kv) -> Tensor:
        ctx, eps, n, hd = step.ctx, self.eps, step.n_tokens, self.head_dim
        x = self.embed(step)
        for il, layer in enumerate(self.layers):
            cur = rms_norm(ctx, x, layer.attn_norm, eps)
            q = ops.reshape_3d(ctx, linear(ctx, layer.wq, cur, layer.bq), hd, self.n_head, n)
            k = ops.reshape_3d(ctx, linear(ctx, layer.wk, cur, layer.bk), hd, self.n_head_kv, n)
            v = ops.reshape_3d(ctx, linear(ctx, layer.wv, cur, layer.bv), hd, self.n_head_kv, n)
            q, k = self.rope_qk(step, il, layer, q, k)
            cur = self.attend(step, kv, il, layer, q, k, v)
            cur = linear(ctx, layer.wo, cur, layer.bo)
            if il == self.n_layer - 1:
                cur, x = step.select_outputs(cur, x)
            ffn_inp = ops.add(ctx, self.residual(step, cur), x)
            cur = self.ffn(step, layer, rms_norm(ctx, ffn_inp, layer.ffn_norm, eps))
            x = ops.add(ctx, self.residual(step, cur), ffn_inp)
        return self.logits(step, x)
