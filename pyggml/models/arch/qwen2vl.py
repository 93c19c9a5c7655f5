"""Qwen2-VL / Qwen2.5-VL's language model (llama.cpp's llm_build_qwen2vl, GGUF arch `qwen2vl`): qwen2's layout
(q/k/v biases, an optional logits bias) with M-RoPE: each token has four positions (time, height, width, extra;
Step.positions holds the four streams one after another) and `rope.dimension_sections` says how many dim pairs
each stream rotates (ggml's rope_multi, mode MROPE). A text token's four positions are equal; an image's rows
share the time and carry their row and column (pyggml.models.llm.mrope).
"""

from __future__ import annotations

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.core.ops.attention import RopeType
from pyggml.errors import GGUFError
from pyggml.models.arch.blocks import Step
from pyggml.models.arch.llama import Qwen2


class Qwen2VL(Qwen2):
    ROPE_MODE = RopeType.MROPE
    n_pos_per_token = 4
    shiftable = False  # a cached key's rotation is by four positions: llama.cpp shifts none with M-RoPE

    def read_hparams(self, gguf) -> None:
        super().read_hparams(gguf)
        key = f"{gguf.architecture}.rope.dimension_sections"
        value = gguf.get(key)
        sections = [int(v) for v in (value.tolist() if hasattr(value, "tolist") else value or [])]
        if len(sections) < 4 or min(sections) < 0 or not any(sections[:3]) or sum(sections[:4]) > self.n_rot // 2:
            raise GGUFError(f"{gguf.path}: metadata key '{key}' must hold 4 counts >= 0 of dim pairs (at most "
                            f"{self.n_rot // 2} in all), got {value!r}")
        self.sections = sections[:4]

    def rope_qk(self, step: Step, il: int, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        r = self.rope
        return tuple(ops.rope_multi(step.ctx, x, step.positions, None, r.n_dims, self.sections, r.mode, r.n_ctx_orig,
                                    r.freq_base, r.freq_scale, r.ext_factor, r.attn_factor, r.beta_fast, r.beta_slow)
                     for x in (q, k))
