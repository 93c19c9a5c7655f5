"""Gemma 3 (llama.cpp's llm_build_gemma3, iSWA variant): Gemma 2's graph with RMS norms of each head's q
and k before RoPE and no attention soft-cap; sliding-window attention (5 layers of every 6 unless the file
says otherwise) only when the file gives a window, with its own RoPE base (default 10000) and no scaling;
the final soft-cap only when the file gives one; output tied unless the file has output.weight."""

from __future__ import annotations

from pyggml.models.arch.blocks import hparam, swa_layers
from pyggml.models.arch.gemma2 import Gemma2

SWA_PATTERN = 6           # by default layer il uses the sliding window unless il % 6 == 5 (llama.cpp's)


class Gemma3(Gemma2):
    N_LAYER_27B = 62
    OUTPUT = "optional"   # output.weight when the file has one
    QK_NORM = True
    SWA_FREQ_BASE, SWA_FREQ_SCALE = 10000.0, 1.0   # the local layers rotate without the file's scaling

    def read_swa(self, gguf) -> None:
        self.n_swa = hparam(gguf, "attention.sliding_window", 0)
        self.swa = swa_layers(gguf, self.n_layer, SWA_PATTERN) if self.n_swa > 0 else [False] * self.n_layer
        self.attn_softcap = 0.0
        self.final_softcap = hparam(gguf, "final_logit_softcapping", 0.0)
