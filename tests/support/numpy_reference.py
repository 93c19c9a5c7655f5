"""Independent float64 NumPy forward passes of gemma3, llama and gpt2 over a whole token sequence.

Written from the architectures' papers and llama.cpp's documented conventions (GGUF weights are
[n_in, n_out] in ggml order, i.e. NumPy (out, in); RoPE "normal" rotates adjacent pairs, "neox" the
two halves), without the KV cache, graphs or kernels of pyggml: what the models are checked against.
"""

from __future__ import annotations

import math

import numpy as np
from gguf.quants import dequantize

from pyggml.models.gguf.gguf_file import GGUFFile


def load_arrays(path) -> tuple[dict, dict]:
    """(metadata, {name: float64 array in NumPy order}) of a GGUF file."""
    with GGUFFile.open(path) as f:
        arrays = {}
        for info in f.tensors:
            raw = np.frombuffer(f.tensor_bytes(info), dtype=np.uint8)
            shape = tuple(reversed(info.ne[:info.n_dims]))
            arrays[info.name] = dequantize(raw.reshape(shape[:-1] + (-1,)), info.type).astype(np.float64).reshape(shape)
        return dict(f.metadata), arrays


def assert_logits_match(path, reference) -> None:
    """pyggml's logits of 20 random tokens decoded in batches of 8 (later batches read the earlier ones' K and V
    from the cache) equal `reference(meta, arrays, tokens)`'s within 1e-4 of their range (KV F32)."""
    from pyggml.core import GGMLType
    from pyggml.models import load_model

    tokens = np.random.default_rng(1).integers(3, 60, 20)
    meta, arrays = load_arrays(path)
    expected = reference(meta, arrays, tokens)
    got = load_model(path, n_ctx=32, n_batch=8, kv_type=GGMLType.F32).decode(tokens.tolist(), all_logits=True)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1 + np.exp(-x))


def rope(x, positions, base, neox):
    """x: [T, heads, d]; rotate every dimension pair by position * base^(-2i/d)."""
    d = x.shape[-1]
    theta = positions[:, None, None] * base ** (-np.arange(0, d, 2) / d)[None, None, :]
    cos, sin = np.cos(theta), np.sin(theta)
    if neox:
        a, b = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def attend(q, k, v, scale, window=None):
    """Causal multi-head attention; q [T, H, d], k/v [T, H_kv, d] shared by H/H_kv query heads each."""
    n = q.shape[0]
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("thd,shd->hts", q, k) * scale
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    hidden = (j > i) | ((i - j >= window) if window else False)
    s = np.where(hidden, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v).reshape(n, -1)


def gemma3_logits(meta, w, tokens):
    a = "gemma3"
    n_head, n_kv = meta[f"{a}.attention.head_count"], meta[f"{a}.attention.head_count_kv"]
    hd, eps = meta[f"{a}.attention.key_length"], meta[f"{a}.attention.layer_norm_rms_epsilon"]
    window = meta.get(f"{a}.attention.sliding_window")
    pos = np.arange(len(tokens), dtype=np.float64)
    x = w["token_embd.weight"][tokens] * math.sqrt(meta[f"{a}.embedding_length"])
    for il in range(meta[f"{a}.block_count"]):
        p = f"blk.{il}."
        local = bool(window) and il % 6 < 5
        base = 10000.0 if local else meta[f"{a}.rope.freq_base"]
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = (h @ w[p + "attn_q.weight"].T).reshape(len(tokens), n_head, hd)
        k = (h @ w[p + "attn_k.weight"].T).reshape(len(tokens), n_kv, hd)
        v = (h @ w[p + "attn_v.weight"].T).reshape(len(tokens), n_kv, hd)
        q = rope(rms_norm(q, w[p + "attn_q_norm.weight"], eps), pos, base, neox=True)
        k = rope(rms_norm(k, w[p + "attn_k_norm.weight"], eps), pos, base, neox=True)
        att = attend(q, k, v, 1 / math.sqrt(hd), window if local else None) @ w[p + "attn_output.weight"].T
        x = x + rms_norm(att, w[p + "post_attention_norm.weight"], eps)
        h = rms_norm(x, w[p + "ffn_norm.weight"], eps)
        ff = gelu_tanh(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)
        x = x + rms_norm(ff @ w[p + "ffn_down.weight"].T, w[p + "post_ffw_norm.weight"], eps)
    out = w.get("output.weight", w["token_embd.weight"])
    return rms_norm(x, w["output_norm.weight"], eps) @ out.T


def llama_logits(meta, w, tokens):
    a = meta["general.architecture"]
    n_head = meta[f"{a}.attention.head_count"]
    n_kv = meta.get(f"{a}.attention.head_count_kv", n_head)
    hd = meta[f"{a}.embedding_length"] // n_head
    eps = meta[f"{a}.attention.layer_norm_rms_epsilon"]
    base = meta.get(f"{a}.rope.freq_base", 10000.0)
    neox = a == "qwen2"
    pos = np.arange(len(tokens), dtype=np.float64)
    x = w["token_embd.weight"][tokens]
    for il in range(meta[f"{a}.block_count"]):
        p = f"blk.{il}."

        def proj(name, h, p=p):
            return h @ w[p + name + ".weight"].T + w.get(p + name + ".bias", 0.0)

        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = rope(proj("attn_q", h).reshape(len(tokens), n_head, hd), pos, base, neox)
        k = rope(proj("attn_k", h).reshape(len(tokens), n_kv, hd), pos, base, neox)
        v = proj("attn_v", h).reshape(len(tokens), n_kv, hd)
        x = x + proj("attn_output", attend(q, k, v, 1 / math.sqrt(hd)))
        h = rms_norm(x, w[p + "ffn_norm.weight"], eps)
        x = x + (silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    out = w.get("output.weight", w["token_embd.weight"])
    return rms_norm(x, w["output_norm.weight"], eps) @ out.T


def gpt2_logits(meta, w, tokens):
    n_head = meta["gpt2.attention.head_count"]
    e = meta["gpt2.embedding_length"]
    eps = meta["gpt2.attention.layer_norm_epsilon"]
    n = len(tokens)
    x = w["token_embd.weight"][tokens] + w["position_embd.weight"][:n]
    for il in range(meta["gpt2.block_count"]):
        p = f"blk.{il}."
        h = layer_norm(x, w[p + "attn_norm.weight"], w[p + "attn_norm.bias"], eps)
        qkv = h @ w[p + "attn_qkv.weight"].T + w[p + "attn_qkv.bias"]
        q, k, v = (qkv[:, i * e:(i + 1) * e].reshape(n, n_head, e // n_head) for i in range(3))
        x = x + attend(q, k, v, 1 / math.sqrt(e // n_head)) @ w[p + "attn_output.weight"].T + w[p + "attn_output.bias"]
        h = layer_norm(x, w[p + "ffn_norm.weight"], w[p + "ffn_norm.bias"], eps)
        h = gelu_tanh(h @ w[p + "ffn_up.weight"].T + w[p + "ffn_up.bias"])
        x = x + h @ w[p + "ffn_down.weight"].T + w[p + "ffn_down.bias"]
    x = layer_norm(x, w["output_norm.weight"], w["output_norm.bias"], eps)
    return x @ w.get("output.weight", w["token_embd.weight"]).T
