"""Qwen 3 (llama.cpp's llm_build_qwen3): qwen2's layout with RMS norms of each head's q and k before RoPE,
a head size (`attention.key_length`) independent of n_embd / n_head, and no output bias. Qwen3-Reranker files
add `cls.output.weight` (the "yes" and "no" rows of the output head; arch/classifier.py)."""

from __future__ import annotations

from pyggml.models.arch.blocks import ROPE_NEOX
from pyggml.models.arch.llama import Llama


class Qwen3(Llama):
    ROPE_MODE = ROPE_NEOX
    ATTN_OUT_BIAS = FFN_BIASES = False
    QK_NORM = True
    CLASSIFIER = dict(dense=False, softmax=True)
