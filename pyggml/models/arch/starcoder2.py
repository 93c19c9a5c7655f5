"""StarCoder 2 (llama.cpp's llm_build_starcoder2, src/models/starcoder2.cpp; StarCoder2 3B/7B/15B, Granite Code
20B/34B): GPT-2's graph with NeoX RoPE in place of learned positions, GQA, and q/k/v projections separate or
fused, with optional biases. Like GPT-2: LayerNorms with biases, a required attention output bias, a GELU FFN
without a gate whose up and down biases are required, the output tied to the token embeddings when the file
has no output.weight."""

from __future__ import annotations

from pyggml.models.arch.blocks import ROPE_NEOX, Rope
from pyggml.models.arch.gpt2 import GPT2


class StarCoder2(GPT2):
    QKV_FUSED = "optional"
    ROPE_MODE = ROPE_NEOX

    def layer_rope(self, il: int) -> Rope:
        return self.rope
