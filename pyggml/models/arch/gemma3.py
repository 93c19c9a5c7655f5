"""Gemma 3 (llama.cpp's llm_build_gemma3, iSWA variant): Gemma 2's graph with RMS norms of each head's q
and k before RoPE and no attention soft-cap; sliding-window attention (5 layers of every 6 unless the file
says otherwise) only when the file gives a window, with its own RoPE base (default 10000) and no scaling;
the final soft-cap only when the file gives one; output tied unless the file has output.weight."""

from __future__ import annotations

from dataclasses import dataclass

from pyggml.core import Tensor
from pyggml.models.arch.blocks import ROPE_NEOX, Decoder, Rope, Step, hparam, rms_norm, swa_layers
from pyggml.models.arch.gemma2 import Gemma2, Gemma2Layer

SWA_PATTERN = 6           # by default layer il uses the sliding window unless il % 6 == 5 (llama.cpp's)
SWA_FREQ_BASE = 10000.0   # the local layers' RoPE base unless `rope.freq_base_swa` says


@dataclass
class Gemma3Layer(Gemma2Layer):
    q_norm: Tensor
    k_norm: Tensor


class Gemma3(Gemma2):
    N_LAYER_27B = 62
    output_matrix = Decoder.output_matrix   # output.weight when the file has one

    def read_hparams(self, gguf, w) -> None:
        self.n_swa = hparam(gguf, "attention.sliding_window", 0)
        self.swa = swa_layers(gguf, self.n_layer, SWA_PATTERN) if self.n_swa > 0 else [False] * self.n_layer
        self.rope_local = Rope.from_gguf(gguf, w, self.n_rot, ROPE_NEOX,
                                         hparam(gguf, "rope.freq_base_swa", SWA_FREQ_BASE), 1.0)
        self.attn_softcap = 0.0
        self.final_softcap = hparam(gguf, "final_logit_softcapping", 0.0)

    def new_layer(self, w, i: int) -> Gemma3Layer:
        hd = (self.head_dim,)
        return Gemma3Layer(**vars(super().new_layer(w, i)), q_norm=w.get(f"blk.{i}.attn_q_norm.weight", hd),
                           k_norm=w.get(f"blk.{i}.attn_k_norm.weight", hd))

    def norm_qk(self, step: Step, layer, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return rms_norm(step.ctx, q, layer.q_norm, self.eps), rms_norm(step.ctx, k, layer.k_norm, self.eps)
