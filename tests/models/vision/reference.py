"""A float64 NumPy SigLIP encoder with the idefics3 and gemma3 projectors, and Qwen2.5-VL's vision transformer,
written from the models' definitions (HF transformers' SiglipVisionTransformer, Idefics3Connector.pixel_shuffle,
Gemma3MultiModalProjector, Qwen2_5_VisionTransformerPretrainedModel), not from pyggml's graph: the independent
yardstick for the encoders' unit tests."""

from __future__ import annotations

import math

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def read_mmproj(path) -> tuple[dict, dict]:
    """(metadata, {tensor name: float64 array in NumPy's (reversed ggml) shape})."""
    reader = GGUFReader(str(path))
    meta = {name: f.contents() for name, f in reader.fields.items()}
    tensors = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64).reshape(tuple(reversed(t.shape.tolist())))
               for t in reader.tensors}
    return meta, tensors


def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def encode(meta: dict, t: dict, pixels: np.ndarray) -> np.ndarray:
    """[n_tokens, n_out] embeddings of normalised pixels [3, size, size]."""
    v = "clip.vision."
    patch, n_head = meta[v + "patch_size"], meta[v + "attention.head_count"]
    eps = meta[v + "attention.layer_norm_epsilon"]
    s, n_layer = meta[v + "projector.scale_factor"], meta[v + "block_count"]
    kernel = t["v.patch_embd.weight"]                                   # [e, 3, p, p]
    e, side = kernel.shape[0], pixels.shape[1] // patch
    blocks = pixels.reshape(3, side, patch, side, patch).transpose(1, 3, 0, 2, 4).reshape(side * side, -1)
    x = blocks @ kernel.reshape(e, -1).T + t["v.patch_embd.bias"] + t["v.position_embd.weight"]
    hd = e // n_head
    for i in range(n_layer):
        p = f"v.blk.{i}."
        h = _layer_norm(x, t[p + "ln1.weight"], t[p + "ln1.bias"], eps)
        q, k, vv = (h @ t[p + n + ".weight"].T + t[p + n + ".bias"] for n in ("attn_q", "attn_k", "attn_v"))
        q, k, vv = (a.reshape(-1, n_head, hd).transpose(1, 0, 2) for a in (q, k, vv))
        att = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        out = (att @ vv).transpose(1, 0, 2).reshape(-1, e)
        x = x + out @ t[p + "attn_out.weight"].T + t[p + "attn_out.bias"]
        h = _layer_norm(x, t[p + "ln2.weight"], t[p + "ln2.bias"], eps)
        h = _gelu(h @ t[p + "ffn_up.weight"].T + t[p + "ffn_up.bias"])
        x = x + h @ t[p + "ffn_down.weight"].T + t[p + "ffn_down.bias"]
    x = _layer_norm(x, t["v.post_ln.weight"], t["v.post_ln.bias"], eps).reshape(side // s, s, side // s, s, e)
    if meta["clip.projector_type"] == "idefics3":
        merged = x.transpose(0, 2, 1, 3, 4).reshape((side // s) ** 2, s * s * e)
        return merged @ t["mm.model.fc.weight"].T
    pooled = x.mean(axis=(1, 3)).reshape(-1, e)
    normed = pooled / np.sqrt((pooled ** 2).mean(-1, keepdims=True) + eps) * t["mm.soft_emb_norm.weight"]
    return normed @ t["mm.input_projection.weight"]


def _rms_norm(x, w, eps):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w


def _rotate_2d(x, rows, cols):
    """HF Qwen2.5-VL's vision rotary embedding: of each head's d dims, pairs (i, i + d/2); the first d/4 pairs
    turn by the patch's row, the next d/4 by its column, at frequencies 10000^(-j / (d/4))."""
    d = x.shape[-1]
    inv_freq = 10000.0 ** (-np.arange(d // 4) / (d // 4))
    angles = np.concatenate([rows[:, None] * inv_freq, cols[:, None] * inv_freq], axis=1)[:, None, :]
    a, b = x[..., :d // 2], x[..., d // 2:]
    return np.concatenate([a * np.cos(angles) - b * np.sin(angles), a * np.sin(angles) + b * np.cos(angles)], -1)


def encode_qwen25vl(meta: dict, t: dict, pixels: np.ndarray, window_pixels: int = 112) -> np.ndarray:
    """[n_tokens, n_out] embeddings (tokens row by row) of normalised pixels [3, height, width], written from HF
    transformers' Qwen2_5_VisionTransformerPretrainedModel: patches in 2 x 2 blocks, window attention masks instead
    of its reordering (attention does not depend on the order), the merger's MLP."""
    v = "clip.vision."
    patch, n_head = meta[v + "patch_size"], meta[v + "attention.head_count"]
    eps = meta[v + "attention.layer_norm_epsilon"]
    n_wa, n_layer = meta[v + "n_wa_pattern"], meta[v + "block_count"]
    kernels = [t[name] for name in ("v.patch_embd.weight", "v.patch_embd.weight.1")]  # both frames: the image
    e, ph, pw = kernels[0].shape[0], pixels.shape[1] // patch, pixels.shape[2] // patch
    blocks = pixels.reshape(3, ph // 2, 2, patch, pw // 2, 2, patch).transpose(1, 4, 2, 5, 0, 3, 6)
    blocks = blocks.reshape(ph * pw, -1).astype(np.float16).astype(np.float64)  # ggml's conv: im2col in F16
    x = sum(blocks @ k.reshape(e, -1).astype(np.float16).astype(np.float64).T for k in kernels)  # block order
    by, bx, dy, dx = (a.reshape(-1) for a in np.meshgrid(np.arange(ph // 2), np.arange(pw // 2), [0, 1], [0, 1],
                                                          indexing="ij"))
    rows, cols = 2 * by + dy, 2 * bx + dx
    gw = window_pixels // patch // 2
    window = (by // gw) * pw + bx // gw
    same_window = window[:, None] == window[None, :]
    hd = e // n_head
    for i in range(n_layer):
        p = f"v.blk.{i}."
        h = _rms_norm(x, t[p + "ln1.weight"], eps)
        q, k, vv = (h @ t[p + n + ".weight"].T + t[p + n + ".bias"] for n in ("attn_q", "attn_k", "attn_v"))
        q, k = (_rotate_2d(a.reshape(-1, n_head, hd), rows, cols) for a in (q, k))
        q, k, vv = (a.reshape(-1, n_head, hd).transpose(1, 0, 2) for a in (q, k, vv))
        att = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        if (i + 1) % n_wa:
            att = np.where(same_window, att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        out = (att @ vv).transpose(1, 0, 2).reshape(-1, e)
        x = x + out @ t[p + "attn_out.weight"].T + t[p + "attn_out.bias"]
        h = _rms_norm(x, t[p + "ln2.weight"], eps)
        gate = h @ t[p + "ffn_gate.weight"].T + t[p + "ffn_gate.bias"]
        up = h @ t[p + "ffn_up.weight"].T + t[p + "ffn_up.bias"]
        x = x + (gate / (1 + np.exp(-gate)) * up) @ t[p + "ffn_down.weight"].T + t[p + "ffn_down.bias"]
    x = _rms_norm(x, t["v.post_ln.weight"], eps).reshape(-1, 4 * e)
    return _gelu(x @ t["mm.0.weight"].T + t["mm.0.bias"]) @ t["mm.2.weight"].T + t["mm.2.bias"]
