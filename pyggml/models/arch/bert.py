"""BERT encoders (llama.cpp's llm_build_bert for `bert`): bge, MiniLM and other sentence-embedding models.

Token, token-type (row 0, "sentence A", as llama.cpp) and learned position embeddings, a LayerNorm over
them, then per layer: attention over the whole text (no causal mask, no KV cache), the residual and a
post-LayerNorm, a GELU FFN, the residual and another post-LayerNorm; every norm and projection has a bias.
The result is the last layer's output for every token (llama.cpp's t_embd); pyggml.models.llm.embed pools it
(rerankers: with their `cls` / `cls.output` head, arch/classifier.py).
Q, K and V are three matrices or one fused `attn_qkv` (llama.cpp's create_tensor_qkv takes either).
`nomic-bert` changes the positions and the FFN through the hooks `add_positions`, `rope_qk` and `ffn`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.core import types as T
from pyggml.errors import GGUFError
from pyggml.models.arch.blocks import Decoder, Step, attention, default_kq_scale, hparam, layer_norm, linear
from pyggml.models.arch.classifier import Classifier


@dataclass
class BertLayer:
    wqkv: Tensor | None          # fused [n_embd, n_q + 2 n_kv], or
    wq: Tensor | None            # separate projections
    wk: Tensor | None
    wv: Tensor | None
    bqkv: Tensor | None
    bq: Tensor | None
    bk: Tensor | None
    bv: Tensor | None
    wo: Tensor
    bo: Tensor | None
    attn_out_norm: Tensor
    attn_out_norm_b: Tensor
    ffn_up: Tensor
    ffn_up_b: Tensor | None
    ffn_gate: Tensor | None
    ffn_down: Tensor
    ffn_down_b: Tensor | None
    layer_out_norm: Tensor
    layer_out_norm_b: Tensor


class Bert(Decoder):
    encoder = True

    def __init__(self, gguf, w):
        super().__init__(gguf, w)
        e = self.n_embd
        self.eps = hparam(gguf, "attention.layer_norm_epsilon")
        n_types = gguf.get("tokenizer.ggml.token_type_count", 0)
        if not isinstance(n_types, int) or n_types <= 0:  # llama.cpp refuses these files too
            raise GGUFError(f"{gguf.path}: {gguf.architecture} needs 'tokenizer.ggml.token_type_count' > 0, "
                            f"got {n_types!r}")
        self.type_embd = w.optional("token_types.weight", (e, n_types))
        self.tok_norm = w.get("token_embd_norm.weight", (e,))
        self.tok_norm_b = w.get("token_embd_norm.bias", (e,))
        self.kq_scale = default_kq_scale(self.head_dim)
        self.init_positions(gguf, w)
        self.layers = [self.new_layer(w, i) for i in range(self.n_layer)]
        if gguf.architecture == "bert":  # nomic-bert's loader takes no classifier
            self.classifier = Classifier.load(gguf, w, e, dense=True, softmax=False)

    def init_positions(self, gguf, w) -> None:
        self.pos_embd = w.get("position_embd.weight", (self.n_embd, self.n_ctx_train))

    def new_layer(self, w, i: int) -> BertLayer:
        e, q, kv, f, p = self.n_embd, self.head_dim * self.n_head, self.n_embd_k_gqa, self.n_ff_arr[i], f"blk.{i}."
        wqkv = w.optional(p + "attn_qkv.weight", (e, q + 2 * kv))
        bqkv = w.optional(p + "attn_qkv.bias", (q + 2 * kv,)) if wqkv is not None else None
        return BertLayer(
            wqkv=wqkv, bqkv=bqkv,
            wq=None if wqkv is not None else w.get(p + "attn_q.weight", (e, q)),
            wk=None if wqkv is not None else w.get(p + "attn_k.weight", (e, kv)),
            wv=None if wqkv is not None else w.get(p + "attn_v.weight", (e, kv)),
            bq=None if bqkv is not None else w.optional(p + "attn_q.bias", (q,)),
            bk=None if bqkv is not None else w.optional(p + "attn_k.bias", (kv,)),
            bv=None if bqkv is not None else w.optional(p + "attn_v.bias", (kv,)),
            wo=w.get(p + "attn_output.weight", (q, e)), bo=w.optional(p + "attn_output.bias", (e,)),
            attn_out_norm=w.get(p + "attn_output_norm.weight", (e,)),
            attn_out_norm_b=w.get(p + "attn_output_norm.bias", (e,)),
            ffn_up=w.get(p + "ffn_up.weight", (e, f)), ffn_up_b=w.optional(p + "ffn_up.bias", (f,)),
            ffn_gate=self.gate_weight(w, p, f),
            ffn_down=w.get(p + "ffn_down.weight", (f, e)), ffn_down_b=w.optional(p + "ffn_down.bias", (e,)),
            layer_out_norm=w.get(p + "layer_output_norm.weight", (e,)),
            layer_out_norm_b=w.get(p + "layer_output_norm.bias", (e,)))

    def gate_weight(self, w, prefix: str, n_ff: int) -> Tensor | None:
        return None  # bert's FFN has no gate

    def add_positions(self, step: Step, x: Tensor) -> Tensor:
        return ops.add(step.ctx, ops.get_rows(step.ctx, self.pos_embd, step.positions), x)

    def rope_qk(self, step: Step, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def ffn(self, step: Step, layer: BertLayer, cur: Tensor) -> Tensor:
        ctx = step.ctx
        return linear(ctx, layer.ffn_down, ops.gelu(ctx, linear(ctx, layer.ffn_up, cur, layer.ffn_up_b)),
                      layer.ffn_down_b)

    def qkv(self, step: Step, layer: BertLayer, cur: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V as [head_dim, heads, n_tokens] (llama.cpp's build_qkv): views of the fused product, its bias
        the fused one or, when only the three separate biases exist, their concatenation; or three products."""
        ctx, n, hd, n_q, n_kv = step.ctx, step.n_tokens, self.head_dim, self.n_head, self.n_head_kv
        if layer.wqkv is None:
            return tuple(ops.reshape_3d(ctx, linear(ctx, wt, cur, b), hd, heads, n)
                         for wt, b, heads in ((layer.wq, layer.bq, n_q), (layer.wk, layer.bk, n_kv),
                                              (layer.wv, layer.bv, n_kv)))
        bias = layer.bqkv
        if bias is None and None not in (layer.bq, layer.bk, layer.bv):
            bias = ops.concat(ctx, ops.concat(ctx, layer.bq, layer.bk, 0), layer.bv, 0)
        qkv = linear(ctx, layer.wqkv, cur, bias)
        row = T.row_size(qkv.type, hd)
        return (ops.view_3d(ctx, qkv, hd, n_q, n, row, qkv.nb[1], 0),
                ops.view_3d(ctx, qkv, hd, n_kv, n, row, qkv.nb[1], row * n_q),
                ops.view_3d(ctx, qkv, hd, n_kv, n, row, qkv.nb[1], row * (n_q + n_kv)))

    def build(self, step: Step, kv) -> Tensor:
        """The last layer's output [n_embd, n_tokens]; `kv` is pyggml.models.llm.embed's NoCache (no cells: each
        step attends to its own tokens, which the step's mask keeps within their text)."""
        ctx, eps = step.ctx, self.eps
        x = ops.get_rows(ctx, self.tok_embd, step.tokens)
        if self.type_embd is not None:
            x = ops.add(ctx, x, ops.view_1d(ctx, self.type_embd, self.n_embd, 0))
        x = layer_norm(ctx, self.add_positions(step, x), self.tok_norm, self.tok_norm_b, eps)
        for il, layer in enumerate(self.layers):
            q, k, v = self.qkv(step, layer, x)
            q, k = self.rope_qk(step, q, k)
            cur = linear(ctx, layer.wo, attention(step, kv, il, q, k, v, self.kq_scale), layer.bo)
            ffn_inp = layer_norm(ctx, ops.add(ctx, cur, x), layer.attn_out_norm, layer.attn_out_norm_b, eps)
            cur = ops.add(ctx, self.ffn(step, layer, ffn_inp), ffn_inp)
            x = layer_norm(ctx, cur, layer.layer_out_norm, layer.layer_out_norm_b, eps)
        return x
