"""SmolLM3 (llama.cpp's llm_build_smollm3): the llama layout with no RoPE on every 4th layer (NoPE:
layer il rotates unless (il + 1) % 4 == 0) and no attention output or FFN biases."""

from __future__ import annotations

from pyggml.models.arch.blocks import Rope
from pyggml.models.arch.llama import Llama

NO_ROPE_LAYER_STEP = 4  # llama.cpp's n_no_rope_layer_step for smollm3 (not a key of the file)


class SmolLM3(Llama):
    ATTN_OUT_BIAS = FFN_BIASES = False

    def layer_rope(self, il: int) -> Rope | None:
        return None if (il + 1) % NO_ROPE_LAYER_STEP == 0 else self.rope
