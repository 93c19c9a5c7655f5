"""Llama-family decoders (llama.cpp's llm_build_llama / llm_build_qwen2): RMS norms, GQA, RoPE, SwiGLU.

Covers the llama layout (Llama, Mistral, and Mixtral: a file with `expert_count` > 0 has mixture-of-experts
FFNs, routed by softmax over the experts with the chosen weights normalised) and qwen2's (`Qwen2`): NeoX
RoPE and an optional `output.bias` added to the logits. Q, K and V are separate or one fused `attn_qkv`, each
with an optional bias (any present bias is used). Llama and granite files may also give the attention output's
bias and the dense FFN's gate, up and down biases (llama.cpp loads all of these as optional tensors; the other
architectures' loaders take no attention output or FFN bias, so their files holding one are refused).

The architectures that differ from it in a few places (qwen3, qwen3moe, qwen2moe, smollm3, granite,
granitemoe, gpt-oss) subclass it: class attributes for what llama.cpp's loaders and builders switch
(`ROPE_MODE`, `ATTN_OUT_BIAS`, `FFN_BIASES`, `OUTPUT_BIAS`, `QK_NORM`, `FFN_NORM`, `MOE_ONLY`, `OUTPUT`,
`CLASSIFIER`), `read_hparams` / `declare_layer` / `experts` for what they read, and the graph hooks `embed`,
`norm_qk`, `layer_rope`, `attend`, `residual` and `logits`.
"""

from __future__ import annotations

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.errors import GGUFError
from pyggml.models.arch.blocks import (ROPE_NEOX, ROPE_NORMAL, Decoder, Rope, Step, attention, default_kq_scale,
                                       hparam, rms_norm)
from pyggml.models.arch.classifier import Classifier
from pyggml.models.arch.layers import Layer, build_ffn, build_qkv, cb, declare_ffn, declare_qkv, lora_mm
from pyggml.models.arch.moe import Experts, expert_counts, moe_ffn


class Llama(Decoder):
    ROPE_MODE = ROPE_NORMAL
    ATTN_OUT_BIAS = True      # the loader takes attn_output.bias (llama, granite)
    FFN_BIASES = True         # and ffn_{gate,up,down}.bias in dense layers
    OUTPUT_BIAS = False       # output.bias added to the logits (qwen2)
    QK_NORM = False           # RMS norms of each head's q and k before RoPE (qwen3)
    takes_embeddings = True   # image rows through Step.input_embeddings
    FFN_NORM = "ffn_norm"     # the norm before the FFN (gpt-oss calls it post_attention_norm)
    MOE_ONLY = False          # whether the architecture needs expert_count > 0 (qwen3moe, gpt-oss)
    CLASSIFIER = None         # Classifier.load's arguments when the loader takes a reranker's head (qwen3)

    def read_hparams(self, gguf) -> None:
        super().read_hparams(gguf)
        self.eps = hparam(gguf, "attention.layer_norm_rms_epsilon")
        self.n_rot = hparam(gguf, "rope.dimension_count", self.head_dim)
        self.kq_scale = default_kq_scale(self.head_dim)
        self.n_expert, self.n_expert_used = expert_counts(gguf, self.n_layer)
        if self.MOE_ONLY and not self.n_expert:
            raise GGUFError(f"{gguf.path}: {gguf.architecture} needs metadata key '{gguf.architecture}.expert_count' "
                            f"> 0 (its FFNs are experts)")

    def declare(self, gguf, w) -> None:
        super().declare(gguf, w)
        self.rope = Rope.from_gguf(gguf, w, self.n_rot, self.ROPE_MODE)
        self.output_b = w.optional("output.bias", (self.n_vocab,)) if self.OUTPUT_BIAS else None
        self.layers = [self.declare_layer(w, il) for il in range(self.n_layer)]
        if self.CLASSIFIER:
            self.classifier = Classifier.load(gguf, w, self.n_embd, **self.CLASSIFIER)

    def declare_layer(self, w, il: int) -> Layer:
        e, p = self.n_embd, f"blk.{il}."
        layer = Layer(attn_norm=w.get(p + "attn_norm.weight", (e,)),
                      **declare_qkv(w, il, e, self.head_dim * self.n_head, self.n_embd_k_gqa),
                      wo=w.get(p + "attn_output.weight", (self.head_dim * self.n_head, e)),
                      bo=w.optional(p + "attn_output.bias", (e,)) if self.ATTN_OUT_BIAS else None,
                      ffn_norm=w.get(p + self.FFN_NORM + ".weight", (e,)), moe=None)
        if self.QK_NORM:
            layer.q_norm = w.get(p + "attn_q_norm.weight", (self.head_dim,))
            layer.k_norm = w.get(p + "attn_k_norm.weight", (self.head_dim,))
        if self.n_expert:
            layer.moe = self.experts(w, il)
        else:
            vars(layer).update(declare_ffn(w, il, e, self.n_ff_arr[il], biases=self.FFN_BIASES))
        return layer

    def experts(self, w, il: int) -> Experts:
        """Layer il's experts (llama, granite: n_ff wide, ffn_gate_exps optional, softmax, weights normalised)."""
        return Experts.load(w, il, self.n_embd, self.n_ff_arr[il], self.n_expert, self.n_expert_used,
                            gate_required=False, gating="softmax", norm_w=True)

    def layer_rope(self, il: int) -> Rope | None:
        return self.rope

    def embed(self, step: Step) -> Tensor:
        return cb(step.input_embeddings(self.tok_embd), "inp_embd")

    def norm_qk(self, step: Step, il: int, layer, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        if not self.QK_NORM:
            return q, k
        ctx = step.ctx
        return (cb(rms_norm(ctx, q, layer.q_norm, self.eps), "Qcur_normed", il),
                cb(rms_norm(ctx, k, layer.k_norm, self.eps), "Kcur_normed", il))

    def residual(self, step: Step, branch: Tensor) -> Tensor:
        """A branch's output before it is added to the residual stream."""
        return branch

    def attend(self, step: Step, kv, il: int, layer, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return attention(step, kv, il, q, k, v, self.kq_scale)

    def ffn(self, step: Step, il: int, layer, cur: Tensor) -> Tensor:
        """The FFN branch: "ffn_moe_out" in a layer of experts, else "ffn_out" (llama.cpp's names)."""
        if layer.moe is not None:
            return cb(moe_ffn(step.ctx, layer.moe, cur, il), "ffn_moe_out", il)
        return cb(build_ffn(step, layer, cur, il), "ffn_out", il)

    def logits(self, step: Step, x: Tensor) -> Tensor:
        x = cb(rms_norm(step.ctx, x, self.output_norm, self.eps), "result_norm")
        return cb(lora_mm(step, self.output, x, self.output_b), "result_output")

    def build(self, step: Step, kv) -> Tensor:
        ctx, eps, hd = step.ctx, self.eps, self.head_dim
        x = self.embed(step)
        for il, layer in enumerate(self.layers):
            cur = cb(rms_norm(ctx, x, layer.attn_norm, eps), "attn_norm", il)
            q, k, v = build_qkv(step, layer, cur, hd, self.n_head, self.n_head_kv, il)
            q, k = self.rope_qk(step, il, *self.norm_qk(step, il, layer, q, k))
            cur = self.attend(step, kv, il, layer, cb(q, "Qcur", il), cb(k, "Kcur", il), v)
            cur = cb(lora_mm(step, layer.wo, cur, layer.bo), "attn_out", il)
            if il == self.n_layer - 1:
                cur, x = step.select_outputs(cur, x)
            ffn_inp = cb(ops.add(ctx, self.residual(step, cur), x), "ffn_inp", il)
            cur = cb(rms_norm(ctx, ffn_inp, layer.ffn_norm, eps), "ffn_norm", il)
            cur = self.ffn(step, il, layer, cur)
            x = cb(ops.add(ctx, self.residual(step, cur), ffn_inp), "l_out", il)
        return self.logits(step, x)


class Qwen2(Llama):
    """qwen2 (llama.cpp's llm_build_qwen2): NeoX RoPE, q/k/v biases, an optional logits bias; no attention
    output or FFN biases."""

    ROPE_MODE = ROPE_NEOX
    ATTN_OUT_BIAS = FFN_BIASES = False
    OUTPUT_BIAS = True
