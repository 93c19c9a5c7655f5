"""Independent float64 NumPy forward passes of the mixture-of-experts decoders: llama and granite with experts
(Mixtral), granitemoe and qwen2moe (shared experts), qwen3moe and gpt-oss, over the whole sequence.

Written from the models' published descriptions and llama.cpp's conventions (router softmax over all experts
or, for gpt-oss, over the chosen experts' logits; top-k by score; weights normalised to sum 1 where the model
does; SwiGLU-OAI; attention sinks as one more logit in each softmax's denominator), with explicit loops over
tokens and experts rather than gathered products: what pyggml's graphs (mul_mat_id, add_id, argsort_top_k)
are checked against. RoPE here has no scaling: the files the tests write for it have none (YaRN is checked
against llama.cpp in test_llamacpp_parity.py).
"""

from __future__ import annotations

import math

import numpy as np

from tests.support.numpy_reference import rms_norm, rope, silu


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def route(logits, n_used: int, gating: str, norm_w: bool, w_scale: float = 0.0):
    """(expert ids [T, n_used], their weights [T, n_used]) for router logits [T, n_expert]."""
    scores = {"softmax": softmax, "sigmoid": lambda z: 1 / (1 + np.exp(-z)), "softmax_weight": lambda z: z}
    probs = scores[gating](logits)
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :n_used]
    weights = np.take_along_axis(probs, ids, axis=-1)
    if gating == "softmax_weight":
        weights = softmax(weights)
    if norm_w:
        weights = weights / np.maximum(weights.sum(-1, keepdims=True), 6.103515625e-5)
    if w_scale not in (0.0, 1.0):
        weights = weights * w_scale
    return ids, weights


def swiglu_oai(gate, up, alpha=1.702, limit=7.0):
    gate, up = np.minimum(gate, limit), np.clip(up, -limit, limit)
    return gate / (1 + np.exp(-alpha * gate)) * (up + 1)


def experts_ffn(x, w: dict, p: str, n_used: int, gating: str, norm_w: bool, activation: str = "silu",
                w_scale: float = 0.0):
    """x [T, n_embd] through layer p's experts; `w` holds the GGUF's arrays by name (NumPy order; experts
    [n_expert, n_out, n_in], their biases [n_expert, n_out])."""
    def bias(name, shape):
        return w.get(p + name + ".bias", np.zeros(shape))

    gate_inp = w[p + "ffn_gate_inp.weight"]
    ids, weights = route(x @ gate_inp.T + bias("ffn_gate_inp", gate_inp.shape[0]), n_used, gating, norm_w, w_scale)
    up_w, down_w, gate_w = w[p + "ffn_up_exps.weight"], w[p + "ffn_down_exps.weight"], w.get(p + "ffn_gate_exps.weight")
    up_b, down_b = bias("ffn_up_exps", up_w.shape[:2]), bias("ffn_down_exps", down_w.shape[:2])
    gate_b = bias("ffn_gate_exps", up_w.shape[:2])
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, weight in zip(ids[t], weights[t], strict=True):
            up = up_w[e] @ x[t] + up_b[e]
            if activation == "swiglu_oai":
                act = swiglu_oai(gate_w[e] @ x[t] + gate_b[e], up)
            else:
                act = silu(gate_w[e] @ x[t] + gate_b[e]) * up if gate_w is not None else silu(up)
            out[t] += weight * (down_w[e] @ act + down_b[e])
    if p + "ffn_up_shexp.weight" in w:
        shared = silu(x @ w[p + "ffn_gate_shexp.weight"].T) * (x @ w[p + "ffn_up_shexp.weight"].T)
        shared = shared @ w[p + "ffn_down_shexp.weight"].T
        if p + "ffn_gate_inp_shexp.weight" in w:
            shared *= 1 / (1 + np.exp(-(x @ w[p + "ffn_gate_inp_shexp.weight"])))[:, None]
        out += shared
    return out


def attend_with_sinks(q, k, v, scale, window=None, sinks=None):
    """Causal attention, q [T, H, d], k/v [T, H_kv, d]; with a sliding window only the last `window` keys;
    `sinks` [H]: a logit per head that joins the softmax's denominator."""
    n, group = q.shape[0], q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("thd,shd->hts", q, k) * scale
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    s = np.where((j > i) | ((i - j >= window) if window else False), -np.inf, s)
    sink = np.full((q.shape[1], 1, 1), -np.inf) if sinks is None else sinks[:, None, None]
    m = np.maximum(s.max(-1, keepdims=True), sink)
    e = np.exp(s - m)
    p = e / (e.sum(-1, keepdims=True) + np.exp(sink - m))
    return np.einsum("hts,shd->thd", p, v).reshape(n, -1)


ROUTING = {"llama": dict(gating="softmax", norm_w=True), "qwen3moe": dict(gating="softmax", norm_w=True),
           "granite": dict(gating="softmax", norm_w=True), "granitemoe": dict(gating="softmax", norm_w=True),
           "qwen2moe": dict(gating="softmax", norm_w=False),
           "gpt-oss": dict(gating="softmax_weight", norm_w=False, activation="swiglu_oai")}


def moe_logits(meta, w, tokens):
    """Logits [T, n_vocab] of a file of one of ROUTING's architectures for `tokens` from position 0 (granite's
    embedding, attention, residual and logit scales where the file has them)."""
    a = meta["general.architecture"]
    if meta.get(f"{a}.rope.scaling.type", "none") != "none":
        raise ValueError("the NumPy reference rotates without RoPE scaling")
    n_head, n_kv = meta[f"{a}.attention.head_count"], meta[f"{a}.attention.head_count_kv"]
    hd = meta.get(f"{a}.attention.key_length", meta[f"{a}.embedding_length"] // n_head)
    eps, base = meta[f"{a}.attention.layer_norm_rms_epsilon"], meta[f"{a}.rope.freq_base"]
    n_used, window = meta[f"{a}.expert_used_count"], meta.get(f"{a}.attention.sliding_window")
    n, pos = len(tokens), np.arange(len(tokens), dtype=np.float64)
    residual = meta.get(f"{a}.residual_scale", 1.0)
    kq_scale = meta.get(f"{a}.attention.scale", 1 / math.sqrt(hd))
    x = w["token_embd.weight"][tokens] * meta.get(f"{a}.embedding_scale", 1.0)
    for il in range(meta[f"{a}.block_count"]):
        p = f"blk.{il}."

        def proj(name, h, p=p):
            return h @ w[p + name + ".weight"].T + w.get(p + name + ".bias", 0.0)

        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q, k = proj("attn_q", h).reshape(n, n_head, hd), proj("attn_k", h).reshape(n, n_kv, hd)
        if a == "qwen3moe":
            q, k = rms_norm(q, w[p + "attn_q_norm.weight"], eps), rms_norm(k, w[p + "attn_k_norm.weight"], eps)
        neox = a in ("qwen2moe", "qwen3moe", "gpt-oss")
        q, k = rope(q, pos, base, neox), rope(k, pos, base, neox)
        local = a == "gpt-oss" and il % 2 == 0
        att = attend_with_sinks(q, k, proj("attn_v", h).reshape(n, n_kv, hd), kq_scale, window if local else None,
                                w.get(p + "attn_sinks.weight"))
        x = x + residual * proj("attn_output", att)
        h = rms_norm(x, w[p + ("post_attention_norm" if a == "gpt-oss" else "ffn_norm") + ".weight"], eps)
        x = x + residual * experts_ffn(h, w, p, n_used, **ROUTING[a])
    logits = rms_norm(x, w["output_norm.weight"], eps) @ w.get("output.weight", w["token_embd.weight"]).T
    return logits / meta.get(f"{a}.logit_scale", 1.0)
