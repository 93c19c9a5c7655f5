"""Nomic Embed (llama.cpp's `nomic-bert`, built by llm_build_bert): the BERT encoder with RoPE (NeoX mode)
instead of learned positions, a fused QKV projection and a SwiGLU FFN (`ffn_gate`, `ffn_up`, `ffn_down`);
as in llama.cpp the FFN takes no biases, even where the file has them."""

from __future__ import annotations

from pyggml.models.arch.bert import Bert


class NomicBert(Bert):
    POSITIONS = "rope"
    FFN_GATE = True
    CLASSIFIER = None   # nomic-bert's loader takes no classifier
