"""An independent float64 NumPy forward pass of OLMo 2 / OLMo 3 (no pre-norms, q/k norms over the whole
projection, norms on each branch's output, the window on 3 of every 4 layers when the file has one)."""

from __future__ import annotations

import math

import numpy as np

from tests.support.numpy_reference import attend, rms_norm, rope, silu


def olmo2_logits(meta, w, tokens):
    a = "olmo2"
    if meta.get(f"{a}.rope.scaling.type", "none") != "none":
        raise ValueError("the NumPy reference rotates without RoPE scaling")
    n_head, n_kv = meta[f"{a}.attention.head_count"], meta[f"{a}.attention.head_count_kv"]
    e = meta[f"{a}.embedding_length"]
    hd, eps, base = e // n_head, meta[f"{a}.attention.layer_norm_rms_epsilon"], meta[f"{a}.rope.freq_base"]
    window = meta.get(f"{a}.attention.sliding_window")
    n, pos = len(tokens), np.arange(len(tokens), dtype=np.float64)
    x = w["token_embd.weight"][tokens]
    for il in range(meta[f"{a}.block_count"]):
        p = f"blk.{il}."
        q = rms_norm(x @ w[p + "attn_q.weight"].T, w[p + "attn_q_norm.weight"], eps).reshape(n, n_head, hd)
        k = rms_norm(x @ w[p + "attn_k.weight"].T, w[p + "attn_k_norm.weight"], eps).reshape(n, n_kv, hd)
        v = (x @ w[p + "attn_v.weight"].T).reshape(n, n_kv, hd)
        local = bool(window) and (il + 1) % 4 != 0
        att = attend(rope(q, pos, base, neox=True), rope(k, pos, base, neox=True), v, 1 / math.sqrt(hd),
                     window if local else None)
        x = x + rms_norm(att @ w[p + "attn_output.weight"].T, w[p + "post_attention_norm.weight"], eps)
        ff = (silu(x @ w[p + "ffn_gate.weight"].T) * (x @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        x = x + rms_norm(ff, w[p + "post_ffw_norm.weight"], eps)
    return rms_norm(x, w["output_norm.weight"], eps) @ w["output.weight"].T
