"""OpenAI gpt-oss (llama.cpp's llm_build_openai_moe, src/models/openai-moe.cpp; gpt-oss-20b/120b).

The llama layout with: biases on q, k, v (optional) and the attention output (required); attention sinks
(`attn_sinks.weight`, one logit per head that joins each softmax's denominator); sliding-window attention on
alternate layers (pattern 2: even layers local, window `attention.sliding_window`, RoPE base
`rope.freq_base_swa` if the file has one); RoPE NeoX with the file's scaling (YaRN in the released models) on
every layer; the pre-FFN norm named `post_attention_norm`; every FFN a layer of experts
`expert_feed_forward_length` wide with a biased router and per-expert biases, routed by a softmax over the
chosen experts' logits (top-k first), activated by SwiGLU-OAI (alpha 1.702, clamp 7); a separate output matrix.
"""

from __future__ import annotations

from pyggml.core import Tensor
from pyggml.models.arch.blocks import ROPE_NEOX, Rope, Step, attention, hparam, hparam_per_layer, swa_layers
from pyggml.models.arch.layers import Layer
from pyggml.models.arch.llama import Llama
from pyggml.models.arch.moe import Experts

SWA_PATTERN = 2   # llama.cpp's load_swa_pattern(ml, 2): layer il uses the window unless il % 2 == 1


class GptOss(Llama):
    ROPE_MODE = ROPE_NEOX
    ATTN_OUT_BIAS = FFN_BIASES = False   # its attn_output.bias is required (declare_layer)
    FFN_NORM = "post_attention_norm"
    MOE_ONLY = True
    OUTPUT = "required"

    def read_hparams(self, gguf) -> None:
        super().read_hparams(gguf)
        self.n_ff_exp = hparam_per_layer(gguf, "expert_feed_forward_length", self.n_layer)[0]  # required
        self.n_swa = hparam(gguf, "attention.sliding_window")
        self.swa = swa_layers(gguf, self.n_layer, SWA_PATTERN)
        self.kq_scale = 1.0 / self.n_rot ** 0.5

    def declare(self, gguf, w) -> None:
        super().declare(gguf, w)
        self.rope_swa = Rope.from_gguf(gguf, w, self.n_rot, ROPE_NEOX,
                                       freq_base=hparam(gguf, "rope.freq_base_swa", self.rope.freq_base))

    def declare_layer(self, w, il: int) -> Layer:
        layer = super().declare_layer(w, il)
        layer.bo = w.get(f"blk.{il}.attn_output.bias", (self.n_embd,))
        layer.sinks = w.get(f"blk.{il}.attn_sinks.weight", (self.n_head,))
        return layer

    def experts(self, w, il: int) -> Experts:
        return Experts.load(w, il, self.n_embd, self.n_ff_exp, self.n_expert, self.n_expert_used, biases=True,
                            gating="softmax_weight", activation="swiglu_oai")

    def layer_rope(self, il: int) -> Rope:
        return self.rope_swa if self.swa[il] else self.rope

    def attend(self, step: Step, kv, il: int, layer, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return attention(step, kv, il, q, k, v, self.kq_scale, self.n_swa if self.swa[il] else None,
                         sinks=layer.sinks)
