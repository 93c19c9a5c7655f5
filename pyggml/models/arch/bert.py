"""BERT encoders (llama.cpp's llm_build_bert for `bert`): bge, MiniLM and other sentence-embedding models.

Token, token-type (row 0, "sentence A", as llama.cpp) and learned position embeddings, a LayerNorm over
them, then per layer: attention over the whole text (no causal mask, no KV cache), the residual and a
post-LayerNorm, a GELU FFN, the residual and another post-LayerNorm; every norm and projection has a bias.
The result is the last layer's output for every token (llama.cpp's t_embd); pyggml.models.llm.embed pools it
(rerankers: with their `cls` / `cls.output` head, arch/classifier.py).
Q, K and V are three matrices or one fused `attn_qkv` (llama.cpp's create_tensor_qkv takes either).
`nomic-bert` changes the positions, the FFN and the head through `POSITIONS`, `FFN_GATE` and `CLASSIFIER`.
"""

from __future__ import annotations

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.errors import GGUFError
from pyggml.models.arch.blocks import ROPE_NEOX, Decoder, Rope, Step, attention, default_kq_scale, hparam, layer_norm
from pyggml.models.arch.classifier import Classifier
from pyggml.models.arch.layers import Layer, build_ffn, build_qkv, cb, declare_ffn, declare_qkv, lora_mm


class Bert(Decoder):
    encoder = True
    shiftable = False       # no KV cache: nothing cached to move
    POSITIONS = "learned"   # position_embd added to the input, or "rope" (NeoX on q and k: nomic-bert)
    FFN_GATE = False        # a SwiGLU FFN without biases (nomic-bert) instead of a GELU one with them
    CLASSIFIER = dict(dense=True, softmax=False)   # Classifier.load's arguments (None: the loader takes none)

    def read_hparams(self, gguf) -> None:
        super().read_hparams(gguf)
        self.eps = hparam(gguf, "attention.layer_norm_epsilon")
        self.n_types = gguf.get("tokenizer.ggml.token_type_count", 0)
        if not isinstance(self.n_types, int) or self.n_types <= 0:  # llama.cpp refuses these files too
            raise GGUFError(f"{gguf.path}: {gguf.architecture} needs 'tokenizer.ggml.token_type_count' > 0, "
                            f"got {self.n_types!r}")
        self.kq_scale = default_kq_scale(self.head_dim)
        self.n_rot = hparam(gguf, "rope.dimension_count", self.head_dim)

    def declare(self, gguf, w) -> None:
        super().declare(gguf, w)
        e = self.n_embd
        self.type_embd = w.optional("token_types.weight", (e, self.n_types))
        self.tok_norm = w.get("token_embd_norm.weight", (e,))
        self.tok_norm_b = w.get("token_embd_norm.bias", (e,))
        if self.POSITIONS == "rope":
            self.pos_embd, self.rope = None, Rope.from_gguf(gguf, w, self.n_rot, ROPE_NEOX)
        else:
            self.pos_embd, self.rope = w.get("position_embd.weight", (e, self.n_ctx_train)), None
        self.layers = [self.declare_layer(w, il) for il in range(self.n_layer)]
        if self.CLASSIFIER:
            self.classifier = Classifier.load(gguf, w, e, **self.CLASSIFIER)

    def declare_layer(self, w, il: int) -> Layer:
        e, q, p = self.n_embd, self.head_dim * self.n_head, f"blk.{il}."
        ffn = declare_ffn(w, il, e, self.n_ff_arr[il], gate=self.FFN_GATE, biases=True)
        if self.FFN_GATE:  # as llama.cpp, nomic-bert's loader takes the FFN biases and its graph adds none
            ffn |= dict(ffn_gate_b=None, ffn_up_b=None, ffn_down_b=None)
        return Layer(**declare_qkv(w, il, e, q, self.n_embd_k_gqa),
                     wo=w.get(p + "attn_output.weight", (q, e)), bo=w.optional(p + "attn_output.bias", (e,)),
                     attn_out_norm=w.get(p + "attn_output_norm.weight", (e,)),
                     attn_out_norm_b=w.get(p + "attn_output_norm.bias", (e,)),
                     **ffn,
                     layer_out_norm=w.get(p + "layer_output_norm.weight", (e,)),
                     layer_out_norm_b=w.get(p + "layer_output_norm.bias", (e,)))

    def layer_rope(self, il: int) -> Rope | None:
        return self.rope

    def build(self, step: Step, kv) -> Tensor:
        """The last layer's output [n_embd, n_tokens]; `kv` is pyggml.models.llm.embed's NoCache (no cells: each
        step attends to its own tokens, which the step's mask keeps within their text)."""
        ctx, eps = step.ctx, self.eps
        x = cb(ops.get_rows(ctx, self.tok_embd, step.tokens), "inp_embd")
        if self.type_embd is not None:
            x = ops.add(ctx, x, ops.view_1d(ctx, self.type_embd, self.n_embd, 0))
        if self.pos_embd is not None:
            x = ops.add(ctx, ops.get_rows(ctx, self.pos_embd, step.positions), x)
        x = cb(layer_norm(ctx, x, self.tok_norm, self.tok_norm_b, eps), "inp_norm")
        for il, layer in enumerate(self.layers):
            q, k, v = build_qkv(step, layer, x, self.head_dim, self.n_head, self.n_head_kv, il, views=True)
            q, k = self.rope_qk(step, il, q, k)
            cur = attention(step, kv, il, cb(q, "Qcur", il), cb(k, "Kcur", il), v, self.kq_scale)
            cur = cb(lora_mm(step, layer.wo, cur, layer.bo), "attn_out", il)
            cur = cb(ops.add(ctx, cur, x), "ffn_inp", il)
            ffn_inp = cb(layer_norm(ctx, cur, layer.attn_out_norm, layer.attn_out_norm_b, eps), "attn_out_norm", il)
            cur = cb(build_ffn(step, layer, ffn_inp, il, act="silu" if self.FFN_GATE else "gelu"), "ffn_out", il)
            cur = ops.add(ctx, cur, ffn_inp)
            x = cb(layer_norm(ctx, cur, layer.layer_out_norm, layer.layer_out_norm_b, eps), "l_out", il)
        return cb(x, "result_embd")
